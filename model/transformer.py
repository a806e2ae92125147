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

from .attention import LayerCache, SelfAttention, rope_angles, soft_cap
from .config import ModelConfig
from .norms import make_norm
from .interventions import Intervention, LayerPlan
from .patching import Activations, Patch, make_taps


@dataclass
class KVCache:
    """Per-layer keys and values of the tokens seen so far; `KVCache([])` is an empty cache.

    embeds (B, T_cached, C): for a model with a smear (ModelConfig.smear_width), each cached token's normed
    embedding before its smear, which the next token's smear reads; None for every other model. A step
    of a smear model after a cache without them is refused (`upto` cuts both together)."""

    layers: list[LayerCache]
    embeds: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if not self.layers else self.layers[0].k.shape[2]

    def upto(self, n: int) -> "KVCache":
        """The cache of the first n tokens (views, nothing copied): what a step at position n reads."""
        return KVCache([LayerCache(c.k[:, :, :n], c.v[:, :, :n]) for c in self.layers],
                       None if self.embeds is None else self.embeds[:, :n])


@dataclass
class ForwardOutput:
    """What one forward pass returns; the type is the same whatever was asked for.

    logits: (B, T, V); (B, 1, V), the last position's, with logits="last". attentions /
    scores: one (B, H, Tq, Tk) tensor per layer when return_attention=True, else None.
    Masked entries are exactly 0 in `attentions` and -inf in `scores`. cache: the key/value
    cache including this call's tokens, when a cache was passed in (use `KVCache([])` to
    start one). residuals: with return_residuals=True, n_layers + 1 tensors (B, T, C): the
    residual stream after the embedding (index 0) and after block l (index l + 1); read them
    with `logit_lens`. With a backout_layer (nanochat) the last is after the backout, what the
    final norm reads, so the lens's last row is the logits.
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
        self.gated = cfg.gated
        # gated (swiglu, geglu): `up` holds the gate's rows, then the value's (Shazeer 2020, as in Llama)
        self.up = nn.Linear(d, 2 * f if self.gated else f, bias=cfg.part_bias("mlp"))
        self.down = nn.Linear(f, d, bias=cfg.part_bias("mlp"))
        self.kind = cfg.activation
        self.act = nn.GELU(approximate=cfg.gelu_approximate)  # gelu's, and geglu's gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)  # (B, T, f), or (B, T, 2f): gate then value
        if self.gated:
            gate, value = h.chunk(2, dim=-1)
            h = (F.silu(gate) if self.kind == "swiglu" else self.act(gate)) * value
        elif self.kind == "relu":
            h = F.relu(h)
        elif self.kind == "relu2":  # nanochat's squared ReLU
            h = F.relu(h).square()
        else:
            h = self.act(h)
        return self.down(h)


class Block(nn.Module):
    """One layer: attention, then the MLP, each a branch added to the residual stream x.

    Where the norms sit (ModelConfig.norm): "pre" normalises what each branch reads (GPT-2, Llama);
    "post" normalises the stream after each addition (Vaswani et al.); "sandwich" normalises what each
    branch reads and what it writes (Gemma 2/3); "post_branch" only what it writes (OLMo 2).
    """

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.norm_mode = cfg.norm
        self.parallel = cfg.parallel_residual
        self.layer = layer
        if cfg.x0_mix:  # nanochat: the block reads resid_lambda * x + x0_lambda * x0 (learned scalars)
            self.resid_lambda = nn.Parameter(torch.ones(1))
            self.x0_lambda = nn.Parameter(torch.zeros(1))
        self.x0_mix = cfg.x0_mix
        ffn = cfg.ff_dim > 0
        reads = cfg.norm in ("pre", "post", "sandwich")  # norm1/norm2: before a branch (after one, for "post")
        writes = cfg.norm in ("sandwich", "post_branch")  # post_norm1/2: on a branch's output
        self.norm1 = make_norm(cfg) if reads else nn.Identity()
        self.attn = SelfAttention(cfg, layer)
        self.ffn = FeedForward(cfg) if ffn else None
        self.norm2 = make_norm(cfg) if reads and ffn else nn.Identity()
        if writes:
            self.post_norm1 = make_norm(cfg)
            self.post_norm2 = make_norm(cfg) if ffn else nn.Identity()
        self.drop = nn.Dropout(cfg.dropout)

    def stream_in(self, x: torch.Tensor, x0: torch.Tensor | None = None) -> torch.Tensor:
        """The stream the block works on: x itself, or with x0_mix resid_lambda * x + x0_lambda * x0, x0 the
        stream after the embedding (nanochat). Such a block refuses without x0: a rebuild from the
        residual stream x alone would not be the model's numbers."""
        if not self.x0_mix:
            return x
        if x0 is None:
            raise ValueError(f"block {self.layer} reads resid_lambda * x + x0_lambda * x0, a mix of the residual "
                             "stream with the embedding (nanochat's x0 lambdas), so it cannot be rebuilt from the "
                             "residual stream alone")
        return self.resid_lambda * x + self.x0_lambda * x0

    def attn_input(self, x: torch.Tensor, x0: torch.Tensor | None = None) -> torch.Tensor:
        """What the attention reads from the residual stream x: x itself in a post-norm block (x0: see
        `stream_in`; its result is what `rest` takes as x)."""
        return self._reads(self.stream_in(x, x0))

    def _reads(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.norm_mode in ("post", "post_branch") else self.norm1(x)

    def forward(self, x, rope, past, want_cache, want_attention, plan=None, tap=None, x0=None, ve=None):
        x = self.stream_in(x, x0)
        a, cache, w, s = self.attn(self._reads(x), rope, past, want_cache, want_attention, plan, tap, ve)
        return self.rest(x, a, tap), cache, w, s

    def rest(self, x: torch.Tensor, a: torch.Tensor, tap=None) -> torch.Tensor:
        """The block after its attention: x the residual input, a the attention's output (after the
        output projection). Returns the residual output, as the forward computes it."""
        # a patched or recorded forward sees each branch's output through its tap (model.patching)
        attn_out, mlp_out = (tap.attn, tap.mlp) if tap is not None else (lambda t: t,) * 2
        if self.parallel:
            # GPT-NeoX's parallel residual: both branches read the same x (Wang & Komatsuzaki's GPT-J)
            m = self.drop(mlp_out(self.ffn(self.norm2(x)))) if self.ffn is not None else 0.0
            return m + self.drop(attn_out(a)) + x
        if self.norm_mode == "post":  # each addition is normalised before the next reads it
            x = self.norm1(x + self.drop(attn_out(a)))
            return self.norm2(x + self.drop(mlp_out(self.ffn(x)))) if self.ffn is not None else x
        if self.norm_mode in ("sandwich", "post_branch"):  # each branch's output normalised, then added
            x = x + self.drop(attn_out(self.post_norm1(a)))
            if self.ffn is not None:
                x = x + self.drop(mlp_out(self.post_norm2(self.ffn(self.norm2(x)))))
            return x
        # pre-norm, or no norm at all (Identity): the residual stream itself is never normalised
        x = x + self.drop(attn_out(a))
        return x + self.drop(mlp_out(self.ffn(self.norm2(x)))) if self.ffn is not None else x


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
        self.make_rope_tables()
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))
        # nanochat's options (ModelConfig): a norm of the embedding, the smear, value embeddings, the backout
        self.embed_norm = make_norm(cfg) if cfg.embed_norm else None
        if cfg.smear_width:
            self.smear_gate = nn.Linear(cfg.smear_width, 1, bias=False)
            self.smear_lambda = nn.Parameter(torch.zeros(1))
        if cfg.value_embed_layers:
            self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(cfg.vocab_size, cfg.kv_heads * cfg.head_dim)
                                               for i in sorted(cfg.value_embed_layers)})
        if cfg.backout_layer is not None:
            self.backout_lambda = nn.Parameter(torch.zeros(1))
        self.norm_f = make_norm(cfg) if cfg.has_final_norm else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=cfg.head_bias)
        if cfg.tie_weights:
            self.head.weight = self.tok_emb.weight
        if cfg.init == "gpt2":
            self.apply(self._init_gpt2)
            for name, p in self.named_parameters():
                if name.endswith(("attn.proj.weight", "ffn.down.weight")):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    def make_rope_tables(self) -> None:
        """The rotary cos/sin tables (block_size, rope_dim/2), computed (also after a load onto the meta
        device): `rope_cos`/`rope_sin` for the layers turning with pe_base, and `rope_local_cos`/`_sin`
        for the windowed layers of a model with its own local base (Gemma 3)."""
        cfg = self.cfg
        if cfg.pos_encoding != "rope":
            return
        tables = [("rope", cfg.pe_base, cfg.rope_scaling)]
        if cfg.local_rope_base is not None:
            tables.append(("rope_local", cfg.local_rope_base, ()))
        for name, base, scaling in tables:
            angles = rope_angles(cfg.block_size, cfg.rope_dim, base, cfg.rope_precision, scaling)  # (P, rd/2)
            # LongRoPE also lengthens every rotated q and k by its attention factor: cos and sin carry it
            gain = float(scaling[1]) if scaling and scaling[0] == "longrope" else 1.0
            cos, sin = (angles.cos(), angles.sin()) if gain == 1.0 else (angles.cos() * gain, angles.sin() * gain)
            self.register_buffer(f"{name}_cos", cos, persistent=False)
            self.register_buffer(f"{name}_sin", sin, persistent=False)

    def rope_at(self, layer: int, positions) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(cos, sin) of layer `layer`'s rotary at `positions` (a slice or a list), each (R, rd/2); None for
        a layer that does not rotate (no rotary, or one of rope_off_layers)."""
        if self.cfg.rope_base(layer) is None:
            return None
        local = self.cfg.local_rope_base is not None and self.cfg.window(layer)
        cos, sin = (self.rope_local_cos, self.rope_local_sin) if local else (self.rope_cos, self.rope_sin)
        dtype = self.tok_emb.weight.dtype  # 16-bit weights turn by tables rounded to them, as transformers
        return cos[positions].to(dtype), sin[positions].to(dtype)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The residual stream before the first block: token embeddings (times embed_scale) plus the
        learned or sinusoidal positions (rotary adds nothing here), normed with embed_norm. ids (.., T),
        positions (T,) -> (.., T, C). A smear model refuses: each token's stream holds a share of the one
        before it, which the tokens at `positions` alone do not give (the forward's `smear` adds it)."""
        if self.cfg.smear_width:
            raise ValueError("this model adds a share of the previous token's embedding to each token (nanochat's "
                             "smear), so the stream of chosen positions cannot be rebuilt from their tokens alone")
        return self._embed(ids, positions)

    def smear(self, x: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
        """nanochat's smear of normed embeddings x (B, T, C): x_t + smear_lambda * sigmoid(x_t[:w] . gate) *
        x_(t-1), each x_(t-1) as it was before its own smear. prev (B, 1, C): the embedding of the token
        before x[:, 0] (from a cache); None: x[:, 0] starts the text and is left as it is."""
        gate = self.smear_lambda * torch.sigmoid(self.smear_gate(x[..., : self.cfg.smear_width]))  # (B, T, 1)
        if prev is None:
            return torch.cat([x[:, :1], x[:, 1:] + gate[:, 1:] * x[:, :-1]], dim=1)
        return x + gate * torch.cat([prev, x[:, :-1]], dim=1)

    def _stream_start(self, ids: torch.Tensor, start: int, cache: KVCache | None):
        """(the residual stream after the embedding (B, T, C), the embeddings a smear model's cache keeps)."""
        x = self.drop(self._embed(ids, torch.arange(start, start + ids.shape[1], device=ids.device)))
        if not self.cfg.smear_width:
            return x, None
        prev = None
        if start:  # the token before this call's first is in the cache: its embedding before its smear
            if cache.embeds is None or cache.embeds.shape[1] != start:
                raise ValueError("this model adds a share of the previous token's embedding to each token "
                                 "(nanochat's smear), and the cache does not hold its tokens' embeddings "
                                 "(cut a cache with KVCache.upto)")
            prev = cache.embeds[:, -1:]
        embeds = None if cache is None else (torch.cat([cache.embeds, x], dim=1) if start else x)
        return self.smear(x, prev), embeds

    def _embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(ids)
        if self.cfg.embed_scale != 1.0:  # Gemma: sqrt(d_model), rounded to the embedding's dtype first
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        pe = self.cfg.pos_encoding
        if pe == "learned":
            x = x + self.pos_emb(positions)
        elif pe == "sinusoidal":
            x = x + self.pe_table[positions]  # (T, C) broadcast over the batch
        return x if self.embed_norm is None else self.embed_norm(x)

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

        x, embeds = self._stream_start(ids, start, cache)  # (B, T, C)
        # RoPE adds nothing to x: each attention layer rotates its queries and keys by its own table
        # None: nothing patched or recorded; a patch with a `base` skips the blocks it leaves unchanged,
        # unless later blocks read earlier streams (the x0 mix, the backout): then every block runs
        plain = not (return_attention or return_residuals or cache is not None or any(plans))
        taps = make_taps(self.cfg, patch, record, B, T, ids.device, start, plain)
        cfg = self.cfg
        skip = 0 if taps is None or cfg.x0_mix or cfg.backout_layer is not None else taps.skip
        if taps is not None:
            x = taps.resid(skip, taps.start if skip else x)
        x0 = x if cfg.x0_mix else None  # the stream after the embedding, which x0_mix blocks read again
        last, backout, kept = cfg.n_layers - 1, cfg.backout_layer, None

        want_cache = cache is not None
        layers, atts, scs = [], [], []
        residuals = [x]
        for i, block in enumerate(self.blocks):
            if i < skip:  # the patch changes nothing before block `skip`
                continue
            past = cache.layers[i] if cache is not None and cache.layers else None
            rope = self.rope_at(i, slice(start, start + T))
            ve = self.value_embeds[str(i)](ids) if i in cfg.value_embed_layers else None  # (B, T, Hkv * hs)
            x, layer_cache, w, s = block(x, rope, past, want_cache, return_attention, plans[i],
                                        None if taps is None else taps.layers[i], x0, ve)
            if i == last and backout is not None:  # the stream after block `backout` taken away: the read-out's
                x = x - self.backout_lambda * (x if backout == last else kept)
            if taps is not None:
                x = taps.resid(i + 1, x)
            if i == backout:
                kept = x
            residuals.append(x)
            layers.append(layer_cache)
            atts.append(w)
            scs.append(s)
        return ForwardOutput(
            logits=self.read_out(x if logits == "all" else x[:, -1:]),  # (B, T, V) or (B, 1, V)
            attentions=tuple(map(readable, atts)) if return_attention else None,
            scores=tuple(map(readable, scs)) if return_attention else None,
            cache=KVCache(layers, embeds) if want_cache else None,
            residuals=tuple(residuals) if return_residuals else None,
            activations=taps.activations() if record else None,
        )

    def read_out(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm then output head (then the logits' soft-cap, Gemma 2): the model's logits for
        residual stream x (B, T, C)."""
        return readable(soft_cap(self.head(self.norm_f(x)), self.cfg.logit_softcap))

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
            cfg = self.cfg
            return pe, rope_angles(cfg.block_size, cfg.rope_dim, cfg.pe_base, cfg.rope_precision, cfg.rope_scaling)
        return pe, None


def readable(t: torch.Tensor) -> torch.Tensor:
    """What the forward hands its readers: 16-bit numbers (weights kept as stored) as float32, which numpy
    and every tool read; float32 and float64 as they are."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def read_out_rows(model: DecoderLM, rows: torch.Tensor) -> torch.Tensor:
    """The model's final norm and output head on a few residual streams: rows (n, C) -> logits (n, V).

    The product of `DecoderLM.read_out`, written (V, C) @ (C, n): for a handful of rows a CPU's
    float32 matmul runs this shape about twice as fast as the forward's (n, C) @ (C, V), over
    GPT-2's 50,257 x 768 head (bench/RESULTS.md, issue 28). The same sums, rounded in another
    order: within about 1e-6 of `read_out`'s.
    """
    logits = (model.head.weight @ model.norm_f(rows).T).T  # (n, V)
    logits = logits if model.head.bias is None else logits + model.head.bias
    return readable(soft_cap(logits, model.cfg.logit_softcap))


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
