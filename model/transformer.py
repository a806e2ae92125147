"""A small decoder-only (GPT-style) transformer that can report exactly what it attended to.

The attention layer, its mask and rotary helpers live in model/attention.py: the fused kernel when no
attention is requested, and the written-out computation (`attend`: scores -> mask -> softmax ->
weighted sum) when it is, which returns the post-softmax weights it multiplied V with and the
pre-softmax scores it computed. Tests hold the two equal, so the picture in the app is the
computation the model ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import LayerCache, SelfAttention, rope_angles
from .config import ModelConfig
from .interventions import Intervention, LayerPlan
from .patching import Activations, Patch, make_taps


@dataclass
class KVCache:
    """Per-layer keys and values of the tokens seen so far; `KVCache([])` is an empty cache."""

    layers: list[LayerCache]

    @property
    def length(self) -> int:
        return 0 if not self.layers else self.layers[0].k.shape[2]


@dataclass
class ForwardOutput:
    """What one forward pass returns; the type is the same whatever was asked for.

    logits: (B, T, V); (B, 1, V), the last position's, with logits="last". attentions /
    scores: one (B, H, Tq, Tk) tensor per layer when return_attention=True, else None.
    Masked entries are exactly 0 in `attentions` and -inf in `scores`. cache: the key/value
    cache including this call's tokens, when a cache was passed in (use `KVCache([])` to
    start one). residuals: with return_residuals=True, n_layers + 1 tensors (B, T, C): the
    residual stream after the embedding (index 0) and after block l (index l + 1); read them
    with `logit_lens`.
    """

    logits: torch.Tensor
    attentions: tuple[torch.Tensor, ...] | None = None
    scores: tuple[torch.Tensor, ...] | None = None
    cache: KVCache | None = None
    residuals: tuple[torch.Tensor, ...] | None = None
    activations: Activations | None = None  # with record=True: every head, branch and residual (model.patching)


def sinusoidal_table(n_positions: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(pos / base^(2i/d))."""
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = pos / base ** (two_i / d_model)
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.float()


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, f = cfg.d_model, cfg.ff_dim
        self.swiglu = cfg.activation == "swiglu"
        # swiglu: `up` holds the gate's rows, then the value's (Shazeer 2020, as in Llama)
        self.up = nn.Linear(d, 2 * f if self.swiglu else f, bias=cfg.part_bias("mlp"))
        self.down = nn.Linear(f, d, bias=cfg.part_bias("mlp"))
        self.act = nn.ReLU() if cfg.activation == "relu" else nn.GELU(approximate=cfg.gelu_approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.swiglu:
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        else:
            h = self.act(h)
        return self.down(h)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich 2019): LayerNorm without the mean or bias."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)  # (B, T, 1)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The configured normalisation over d_model (LayerNorm or RMSNorm)."""
    if cfg.norm_kind == "rmsnorm":
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.part_bias("norm"))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.norm_mode = cfg.norm
        self.parallel = cfg.parallel_residual
        norm = (lambda: make_norm(cfg)) if cfg.norm != "none" else nn.Identity
        self.norm1 = norm()
        self.attn = SelfAttention(cfg, layer)
        self.ffn = FeedForward(cfg) if cfg.ff_dim > 0 else None
        self.norm2 = norm() if self.ffn is not None else nn.Identity()
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, rope, past, want_cache, want_attention, plan=None, tap=None):
        # a patched or recorded forward sees each branch's output through its tap (model.patching)
        attn_out, mlp_out = (tap.attn, tap.mlp) if tap is not None else (lambda t: t,) * 2
        if self.parallel:
            # GPT-NeoX's parallel residual: both branches read the same x (Wang & Komatsuzaki's GPT-J)
            a, cache, w, s = self.attn(self.norm1(x), rope, past, want_cache, want_attention, plan, tap)
            m = self.drop(mlp_out(self.ffn(self.norm2(x)))) if self.ffn is not None else 0.0
            return m + self.drop(attn_out(a)) + x, cache, w, s
        if self.norm_mode == "post":
            a, cache, w, s = self.attn(x, rope, past, want_cache, want_attention, plan, tap)
            x = self.norm1(x + self.drop(attn_out(a)))
            if self.ffn is not None:
                x = self.norm2(x + self.drop(mlp_out(self.ffn(x))))
        else:  # pre-norm, or no norm at all (Identity)
            a, cache, w, s = self.attn(self.norm1(x), rope, past, want_cache, want_attention, plan, tap)
            x = x + self.drop(attn_out(a))
            if self.ffn is not None:
                x = x + self.drop(mlp_out(self.ffn(self.norm2(x))))
        return x, cache, w, s


class DecoderLM(nn.Module):
    """Token embedding + positions -> N blocks of masked self-attention -> linear head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.pos_encoding == "learned":
            self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        if cfg.pos_encoding == "sinusoidal":
            self.register_buffer(
                "pe_table", sinusoidal_table(cfg.block_size, cfg.d_model, cfg.pe_base), persistent=False
            )
        if cfg.pos_encoding == "rope":
            angles = rope_angles(cfg.block_size, cfg.rope_dim, cfg.pe_base, cfg.rope_precision)  # (P, rope_dim/2)
            self.register_buffer("rope_cos", angles.cos(), persistent=False)
            self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))
        self.norm_f = make_norm(cfg) if cfg.norm == "pre" else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=cfg.head_bias)
        if cfg.tie_weights:
            self.head.weight = self.tok_emb.weight
        if cfg.init == "gpt2":
            self.apply(self._init_gpt2)
            for name, p in self.named_parameters():
                if name.endswith(("attn.proj.weight", "ffn.down.weight")):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_gpt2(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        ids: torch.Tensor,
        return_attention: bool = False,
        cache: KVCache | None = None,
        intervention: Intervention | None = None,
        return_residuals: bool = False,
        logits: str = "all",
        patch: Patch | None = None,
        record: bool = False,
    ) -> ForwardOutput:
        """ids: (B, T) token ids. With `cache`, ids are the tokens after the cached ones.

        intervention: heads to ablate / attention rows to edit (see model.interventions); the
        layers it touches run the explicit attention path. None or an empty one: the normal
        forward, bit for bit. return_residuals: also return the residual stream after the
        embedding and after each block (for `logit_lens`). logits: "all" reads out every
        position (B, T, V); "last" only the last one (B, 1, V), for a caller that wants the
        next token alone: the head is the largest product of a forward over a short text
        (GPT-2's 50,257 x 768 per position).
        patch: activations of another run to substitute (model.patching; None or an empty one: the
        normal forward, bit for bit). record: also return them all in `activations`.
        """
        if ids.dim() != 2:
            raise ValueError(f"ids must have shape (batch, time), got {tuple(ids.shape)}")
        if logits not in ("all", "last"):
            raise ValueError(f'logits must be "all" or "last", got {logits!r}')
        B, T = ids.shape
        # With a cache, the new tokens come right after the cached ones: their positions start
        # at cache.length, so learned, sinusoidal and RoPE positions all continue where the
        # cache ends instead of restarting at 0.
        start = cache.length if cache is not None else 0
        if cache is not None and cache.length and self.cfg.mask != "causal":
            raise ValueError("a key/value cache is only valid for the causal mask")
        if start + T > self.cfg.block_size:
            raise ValueError(
                f"{start + T} positions exceed the context of {self.cfg.block_size}; crop the input"
            )
        if T == 0:
            raise ValueError("ids must contain at least one token")
        plans: list[LayerPlan | None] = [None] * self.cfg.n_layers
        if intervention is not None:
            if not isinstance(intervention, Intervention):
                raise ValueError(f"intervention must be an Intervention, got {type(intervention).__name__}")
            if not intervention.is_empty:
                plans = intervention.layer_plans(self.cfg, start + T, start)

        x = self.tok_emb(ids)  # (B, T, C)
        pe = self.cfg.pos_encoding
        if pe == "learned":
            x = x + self.pos_emb(torch.arange(start, start + T, device=ids.device))
        elif pe == "sinusoidal":
            x = x + self.pe_table[start : start + T]  # (T, C) broadcast over the batch
        # RoPE adds nothing here: each attention layer rotates its queries and keys instead
        rope = (self.rope_cos[start : start + T], self.rope_sin[start : start + T]) if pe == "rope" else None
        x = self.drop(x)
        # None: nothing patched or recorded; a patch with a `base` skips the blocks it leaves unchanged
        plain = not (return_attention or return_residuals or cache is not None or any(plans))
        taps = make_taps(self.cfg, patch, record, B, T, ids.device, start, plain)
        skip = 0 if taps is None else taps.skip
        if taps is not None:
            x = taps.resid(skip, taps.start if skip else x)

        want_cache = cache is not None
        layers, atts, scs = [], [], []
        residuals = [x]
        for i, block in enumerate(self.blocks):
            if i < skip:  # the patch changes nothing before block `skip`
                continue
            past = cache.layers[i] if cache is not None and cache.layers else None
            x, layer_cache, w, s = block(x, rope, past, want_cache, return_attention, plans[i],
                                        None if taps is None else taps.layers[i])
            if taps is not None:
                x = taps.resid(i + 1, x)
            residuals.append(x)
            layers.append(layer_cache)
            atts.append(w)
            scs.append(s)
        return ForwardOutput(
            logits=self.read_out(x if logits == "all" else x[:, -1:]),  # (B, T, V) or (B, 1, V)
            attentions=tuple(atts) if return_attention else None,
            scores=tuple(scs) if return_attention else None,
            cache=KVCache(layers) if want_cache else None,
            residuals=tuple(residuals) if return_residuals else None,
            activations=taps.activations() if record else None,
        )

    def read_out(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm then output head: the model's logits for residual stream x (B, T, C)."""
        return self.head(self.norm_f(x))

    def positional_table(self) -> tuple[str, torch.Tensor | None]:
        """The positional information the model actually uses, for display.

        sinusoidal/learned: the (block_size, d_model) table added to the embeddings.
        rope: the (block_size, rope_dim/2) rotation angles in radians. none: None.
        """
        pe = self.cfg.pos_encoding
        if pe == "learned":
            return pe, self.pos_emb.weight.detach().clone()
        if pe == "sinusoidal":
            return pe, self.pe_table.clone()
        if pe == "rope":
            return pe, rope_angles(self.cfg.block_size, self.cfg.rope_dim, self.cfg.pe_base, self.cfg.rope_precision)
        return pe, None


def read_out_rows(model: DecoderLM, rows: torch.Tensor) -> torch.Tensor:
    """The model's final norm and output head on a few residual streams: rows (n, C) -> logits (n, V).

    The product of `DecoderLM.read_out`, written (V, C) @ (C, n): for a handful of rows a CPU's
    float32 matmul runs this shape about twice as fast as the forward's (n, C) @ (C, V), over
    GPT-2's 50,257 x 768 head (bench/RESULTS.md, issue 28). The same sums, rounded in another
    order: within about 1e-6 of `read_out`'s.
    """
    logits = (model.head.weight @ model.norm_f(rows).T).T  # (n, V)
    return logits if model.head.bias is None else logits + model.head.bias


def logit_lens(model: DecoderLM, residuals: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> torch.Tensor:
    """Logits read out of each residual stream: (len(residuals), B, T, V).

    Each residual goes through the model's own final norm and output head, one at a time
    (the same call on the same shape as the forward, so the last one equals the model's
    logits exactly). With `ForwardOutput.residuals` (n_layers + 1 entries) index 0 is the
    embedding and index l + 1 is after block l; pass `residuals[1:]` for one row per layer.
    Under norm="post" and "none" the final norm is the identity (post-norm blocks already end
    in a norm), so the lens is the head alone.
    """
    if len(residuals) == 0:
        raise ValueError("logit_lens needs at least one residual stream")
    return torch.stack([model.read_out(r) for r in residuals])
