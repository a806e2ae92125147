"""The engine's forward as it was before the imported families' options: a frozen copy, kept as the
reference that the current engine must equal bit for bit with every option at its default
(tests/engine/test_families_builtin.py). Both run in the same process, on the same thread count and CPU, so
torch.equal compares the arithmetic, not the machine. Not used by the app.

A small decoder-only (GPT-style) transformer that can report exactly what it attended to.

Two attention paths share one set of weights:
* the fused path (`F.scaled_dot_product_attention`) when no attention is requested;
* the explicit path (scores -> mask -> softmax -> weighted sum) when it is, which returns the
  post-softmax weights it multiplied V with and the pre-softmax scores it computed.
Tests hold the two equal, so the picture in the app is the computation the model ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.config import ModelConfig
from model.interventions import Intervention, LayerPlan


@dataclass
class LayerCache:
    """Keys and values of one layer, shape (B, H, T_cached, head_dim)."""

    k: torch.Tensor
    v: torch.Tensor


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

    logits: (B, T, V). attentions / scores: one (B, H, Tq, Tk) tensor per layer when
    return_attention=True, else None. Masked entries are exactly 0 in `attentions` and
    -inf in `scores`. cache: the key/value cache including this call's tokens, when a
    cache was passed in (use `KVCache([])` to start one). residuals: with
    return_residuals=True, n_layers + 1 tensors (B, T, C): the residual stream after the
    embedding (index 0) and after block l (index l + 1); read them with `logit_lens`.
    """

    logits: torch.Tensor
    attentions: tuple[torch.Tensor, ...] | None = None
    scores: tuple[torch.Tensor, ...] | None = None
    cache: KVCache | None = None
    residuals: tuple[torch.Tensor, ...] | None = None


def sinusoidal_table(n_positions: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(pos / base^(2i/d))."""
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = pos / base ** (two_i / d_model)
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.float()


def rope_angles(n_positions: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Rotation angle pos * base^(-2i/head_dim) for each position and dimension pair: (P, head_dim/2)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return (torch.arange(n_positions, dtype=torch.float64).unsqueeze(1) * inv_freq).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs (x[2i], x[2i+1]) of the last dim by the given angles.

    x: (B, H, T, hd); cos/sin: (T, hd/2).
    """
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


def causal_mask(t_query: int, t_key: int, device: torch.device | None = None) -> torch.Tensor:
    """Boolean (Tq, Tk) mask, True where attention is NOT allowed (key after query).

    Queries are the last Tq positions of the Tk keys, as in incremental decoding.
    """
    # With a cache the Tq new queries sit after Tk - Tq cached keys, so query row i is at
    # absolute position i + offset; without a cache offset is 0 and this is the usual triangle.
    offset = t_key - t_query
    q = torch.arange(t_query, device=device).unsqueeze(1) + offset  # (Tq, 1)
    k = torch.arange(t_key, device=device).unsqueeze(0)  # (1, Tk)
    return k > q  # (Tq, Tk)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias) if cfg.attn_out_proj else None
        self.dropout = cfg.dropout

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        past: LayerCache | None,
        want_cache: bool,
        want_attention: bool,
        plan: LayerPlan | None = None,
    ) -> tuple[torch.Tensor, LayerCache | None, torch.Tensor | None, torch.Tensor | None]:
        B, T, C = x.shape
        # one matmul for all three projections, then split heads: each of q, k, v is (B, H, T, hs)
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if rope is not None:
            # rotate before caching: cached keys keep the rotation of their own positions
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if past is not None:  # keys/values of earlier tokens: (B, H, T_past + T, hs)
            k = torch.cat((past.k, k), dim=2)
            v = torch.cat((past.v, v), dim=2)
        new_cache = LayerCache(k, v) if want_cache else None
        t_key = k.shape[2]
        causal = self.cfg.mask == "causal"
        drop = self.dropout if self.training else 0.0

        if not want_attention and plan is None:
            # Fused path: torch's kernel never materialises the weights, so it is faster and
            # leaner, but there is nothing to show. The mask is chosen to match `causal_mask`:
            if not causal or T == 1:
                # bidirectional masks nothing; a single causal query is the last position and
                # may see every key, so it needs no mask either
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)
            elif t_key == T:
                # no cache: the plain lower triangle
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
            else:
                # several new queries after cached keys: is_causal would align the triangle to
                # the top-left corner (wrong here), so pass the offset mask explicitly
                allowed = ~causal_mask(T, t_key, x.device)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=drop)
            weights = scores = None
        else:
            # Explicit path, for when the caller wants to see attention: the same maths written
            # out, returning exactly the weights that multiply V.
            # scaled dot products (Vaswani et al. 2017, eq. 1): (B, H, T, T_key); rows are queries
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            if causal:
                scores = scores.masked_fill(causal_mask(T, t_key, x.device), float("-inf"))
            weights = torch.softmax(scores, dim=-1)  # exp(-inf) = 0: masked weights are exactly zero
            if plan is not None:
                weights = self._edit_weights(weights, plan, T, t_key, causal)
            y = F.dropout(weights, drop, training=True) @ v if drop else weights @ v
            if plan is not None:
                y = self._ablate_outputs(y, plan)

        y = y.transpose(1, 2).reshape(B, T, C)  # heads side by side again: (B, T, C)
        if self.proj is not None:
            y = self.proj(y)
        return y, new_cache, weights, scores

    def _edit_weights(
        self, weights: torch.Tensor, plan: LayerPlan, T: int, t_key: int, causal: bool
    ) -> torch.Tensor:
        """Rows replaced by the intervention: uniform-ablated heads and edited (head, query) rows."""
        H = self.n_heads
        uniform_heads = plan.ablate if plan.mode == "uniform" else ()
        if not uniform_heads and not plan.edits:
            return weights
        allowed = (
            ~causal_mask(T, t_key, weights.device)
            if causal
            else torch.ones(T, t_key, dtype=torch.bool, device=weights.device)
        )
        uniform = allowed.to(weights.dtype) / allowed.sum(-1, keepdim=True).to(weights.dtype)  # (T, Tk)
        new = torch.zeros(H, T, t_key, dtype=weights.dtype, device=weights.device)
        replace = torch.zeros(H, T, 1, dtype=torch.bool, device=weights.device)
        for h in uniform_heads:
            new[h] = uniform
            replace[h] = True
        for h, row, key in plan.edits:
            if key is None:
                new[h, row] = uniform[row]
            else:
                new[h, row] = 0.0
                new[h, row, key] = 1.0
            replace[h, row] = True
        return torch.where(replace, new, weights)  # (B, H, T, Tk), broadcast over the batch

    @staticmethod
    def _ablate_outputs(y: torch.Tensor, plan: LayerPlan) -> torch.Tensor:
        """Zero- or mean-ablate heads' outputs y: (B, H, T, hs), before heads are concatenated."""
        if plan.mode not in ("zero", "mean") or not plan.ablate:
            return y
        H = y.shape[1]
        mask = torch.zeros(1, H, 1, 1, dtype=torch.bool, device=y.device)
        mask[0, list(plan.ablate)] = True
        if plan.mode == "zero":
            return torch.where(mask, torch.zeros((), dtype=y.dtype, device=y.device), y)
        return torch.where(mask, y.mean(dim=2, keepdim=True), y)  # mean over this text's positions


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, f = cfg.d_model, cfg.ff_dim
        self.swiglu = cfg.activation == "swiglu"
        self.up = nn.Linear(d, 2 * f if self.swiglu else f, bias=cfg.bias)
        self.down = nn.Linear(f, d, bias=cfg.bias)
        self.act = nn.ReLU() if cfg.activation == "relu" else nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.swiglu:
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        else:
            h = self.act(h)
        return self.down(h)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_mode = cfg.norm
        make_norm = (lambda: nn.LayerNorm(cfg.d_model, bias=cfg.bias)) if cfg.norm != "none" else nn.Identity
        self.norm1 = make_norm()
        self.attn = SelfAttention(cfg)
        self.ffn = FeedForward(cfg) if cfg.ff_dim > 0 else None
        self.norm2 = make_norm() if self.ffn is not None else nn.Identity()
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, rope, past, want_cache, want_attention, plan=None):
        if self.norm_mode == "post":
            a, cache, w, s = self.attn(x, rope, past, want_cache, want_attention, plan)
            x = self.norm1(x + self.drop(a))
            if self.ffn is not None:
                x = self.norm2(x + self.drop(self.ffn(x)))
        else:  # pre-norm, or no norm at all (Identity)
            a, cache, w, s = self.attn(self.norm1(x), rope, past, want_cache, want_attention, plan)
            x = x + self.drop(a)
            if self.ffn is not None:
                x = x + self.drop(self.ffn(self.norm2(x)))
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
            angles = rope_angles(cfg.block_size, cfg.head_dim, cfg.pe_base)
            self.register_buffer("rope_cos", angles.cos(), persistent=False)
            self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias) if cfg.norm == "pre" else nn.Identity()
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
    ) -> ForwardOutput:
        """ids: (B, T) token ids. With `cache`, ids are the tokens after the cached ones.

        intervention: heads to ablate / attention rows to edit (see model.interventions); the
        layers it touches run the explicit attention path. None or an empty one: the normal
        forward, bit for bit. return_residuals: also return the residual stream after the
        embedding and after each block (for `logit_lens`).
        """
        if ids.dim() != 2:
            raise ValueError(f"ids must have shape (batch, time), got {tuple(ids.shape)}")
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

        want_cache = cache is not None
        layers, atts, scs = [], [], []
        residuals = [x]
        for i, block in enumerate(self.blocks):
            past = cache.layers[i] if cache is not None and cache.layers else None
            x, layer_cache, w, s = block(x, rope, past, want_cache, return_attention, plans[i])
            residuals.append(x)
            layers.append(layer_cache)
            atts.append(w)
            scs.append(s)
        logits = self.read_out(x)
        return ForwardOutput(
            logits=logits,
            attentions=tuple(atts) if return_attention else None,
            scores=tuple(scs) if return_attention else None,
            cache=KVCache(layers) if want_cache else None,
            residuals=tuple(residuals) if return_residuals else None,
        )

    def read_out(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm then output head: the model's logits for residual stream x (B, T, C)."""
        return self.head(self.norm_f(x))

    def positional_table(self) -> tuple[str, torch.Tensor | None]:
        """The positional information the model actually uses, for display.

        sinusoidal/learned: the (block_size, d_model) table added to the embeddings.
        rope: the (block_size, head_dim/2) rotation angles in radians. none: None.
        """
        pe = self.cfg.pos_encoding
        if pe == "learned":
            return pe, self.pos_emb.weight.detach().clone()
        if pe == "sinusoidal":
            return pe, self.pe_table.clone()
        if pe == "rope":
            return pe, rope_angles(self.cfg.block_size, self.cfg.head_dim, self.cfg.pe_base)
        return pe, None


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
