"""Masked self-attention in one place: the layer the blocks use, its mask and rotary helpers, and the one
written-out computation that every reader of attention calls.

Two ways to run the same weights:
* the fused kernel (`F.scaled_dot_product_attention`) when nobody needs to see attention: it never
  materialises the (T, T) weights, so it is faster and leaner;
* `attend`, the maths written out (scores -> scale -> mask -> softmax -> intervention -> weighted sum ->
  intervention), when attention is recorded or intervened on. It returns every intermediate
  (`AttentionWork`), so the forward (model/transformer.py) and the rebuild of one cell (model/inside.py)
  read the same numbers from the same code; tests hold it equal to the fused kernel.
An intervention's effect is the plan's own (`LayerPlan.apply_to_weights` / `apply_to_outputs`, in
model/interventions.py). The hand-written training step (model/fastpath.py) is the one named exception.

Shapes: B batch, H query heads, Hkv key/value heads (fewer under grouped-query attention), R queries
computed in this call, Tk keys they may read (cached ones included), hs = head_dim. Leading batch
dimensions are optional for `attend`: heads are always dimension -3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig
from .interventions import LayerPlan
from .norms import make_norm
from .patching import LayerTap


@dataclass
class LayerCache:
    """Keys and values of one layer, shape (B, H, T_cached, head_dim)."""

    k: torch.Tensor
    v: torch.Tensor


def rope_angles(n_positions: int, head_dim: int, base: float = 10000.0, precision: str = "float64",
                scaling: tuple = ()) -> torch.Tensor:
    """Rotation angle pos * base^(-2i/head_dim) for each position and dimension pair: (P, head_dim/2).

    With a rotary fraction below 1 pass the rotated dimensions (ModelConfig.rope_dim) as head_dim:
    the frequencies are spread over the rotated part only, as in GPT-NeoX. precision "float32":
    the same formula in float32, operation for operation as transformers computes it. scaling: a
    change of the inverse frequencies (ModelConfig.rope_scaling), made before they meet the positions."""
    if precision == "float32":
        powers = base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        if scaling and scaling[0] == "longrope":  # each pair's factor joins the denominator, as transformers
            inv_freq = 1.0 / (torch.tensor(scaling[2:], dtype=torch.float32) * powers)
        else:
            inv_freq = scaled_frequencies(1.0 / powers, scaling)
        return torch.arange(n_positions).float().unsqueeze(1) * inv_freq
    inv_freq = scaled_frequencies(base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim), scaling)
    return (torch.arange(n_positions, dtype=torch.float64).unsqueeze(1) * inv_freq).float()


def scaled_frequencies(inv_freq: torch.Tensor, scaling: tuple) -> torch.Tensor:
    """The inverse frequencies (rd/2,) after a rope scaling, in their own dtype.

    ("linear", f): all slowed f times (positions read as if f times closer). ("llama3", f, low, high, n0):
    Llama 3.1's rule by wavelength 2π/inv_freq against the original context n0: longer than n0/low, slowed
    f times; shorter than n0/high, kept; between, a blend whose share of the kept frequency grows
    linearly with n0/wavelength from low to high. The same formula at every position: exact at any length."""
    if not scaling:
        return inv_freq
    kind, factor = scaling[0], float(scaling[1])
    if kind == "linear":
        return inv_freq / factor
    if kind == "longrope":  # pair i slowed by its own factor (the first number is the attention factor)
        return inv_freq / torch.tensor(scaling[2:], dtype=inv_freq.dtype)
    low, high, n0 = (float(v) for v in scaling[2:])
    wavelength = 2 * math.pi / inv_freq
    slowed = torch.where(wavelength > n0 / low, inv_freq / factor, inv_freq)
    blend = (n0 / wavelength - low) / (high - low)  # 0 at wavelength n0/low, 1 at n0/high
    mixed = (1 - blend) * slowed / factor + blend * slowed
    between = ~(wavelength < n0 / high) & ~(wavelength > n0 / low)
    return torch.where(between, mixed, slowed)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs (x[2i], x[2i+1]) of the first 2 * cos.shape[-1] dims of the last
    dim by the given angles; the dimensions after them pass through unrotated (partial rotary).

    x: (B, H, T, hd); cos/sin: (T, rd/2) with rd <= hd.
    """
    rd = 2 * cos.shape[-1]
    if rd < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)  # (B, H, T, hd)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


def causal_mask(t_query: int, t_key: int, device: torch.device | None = None, window: int = 0) -> torch.Tensor:
    """Boolean (Tq, Tk) mask, True where attention is NOT allowed (key after query).

    Queries are the last Tq positions of the Tk keys, as in incremental decoding. window > 0 also
    masks keys `window` or more positions before the query (a local layer sees its last `window`
    keys, its own included, as GPT-Neo's local attention does).
    """
    # With a cache the Tq new queries sit after Tk - Tq cached keys, so query row i is at
    # absolute position i + offset; without a cache offset is 0 and this is the usual triangle.
    offset = t_key - t_query
    q = torch.arange(t_query, device=device).unsqueeze(1) + offset  # (Tq, 1)
    k = torch.arange(t_key, device=device).unsqueeze(0)  # (1, Tk)
    if window:
        return (k > q) | (k <= q - window)  # (Tq, Tk)
    return k > q  # (Tq, Tk)


@dataclass
class AttentionWork:
    """Every number of one attention layer's written-out computation (`attend`), in the model's dtype.

    q_proj (.., H, R, hs), k_proj (.., Hkv, R, hs): the queries' own projections; q_raw, k_raw: the same
    after the q/k norm (ModelConfig.qk_norm, times qk_gain; the projections themselves without one), before the rotary
    step; q (.., H, R, hs) after it; k, v (.., Hkv, Tk, hs): every key and value read (rotated keys, cached
    ones first), grouped as the cache keeps them. raw (.., H, R, Tk) = q kᵀ; `scaled` = raw × scale;
    `capped`: softcap × tanh(scaled / softcap) (scaled itself without a soft-cap);
    scores: capped with -inf where the mask forbids; allowed (R, Tk): the keys each query may read;
    weights: softmax(scores) row by row; used: the rows that multiplied V (weights unless the plan
    replaced some); values (.., H, R, hs): what each head passed on (after the plan's ablation).
    """

    q_proj: torch.Tensor
    k_proj: torch.Tensor
    q_raw: torch.Tensor
    k_raw: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    raw: torch.Tensor
    scores: torch.Tensor
    allowed: torch.Tensor
    weights: torch.Tensor
    used: torch.Tensor
    values: torch.Tensor
    scale: float
    softcap: float | None = None

    @property
    def scaled(self) -> torch.Tensor:
        """raw × scale, before the mask: recomputed on demand (the same product `scores` was made from,
        so the same bits), which spares the forward holding a third (.., H, R, Tk) tensor."""
        return self.raw * self.scale

    @property
    def capped(self) -> torch.Tensor:
        """The scaled scores after the soft-cap (Gemma 2), before the mask; `scaled` without one."""
        return soft_cap(self.scaled, self.softcap)

    def one(self, index: int = 0) -> "AttentionWork":
        """The work of one sequence of the batch: every tensor loses its batch dimension, except `allowed`,
        which never had one (one mask serves the whole batch)."""
        return replace(self, **{f.name: getattr(self, f.name)[index] for f in fields(self)
                                if f.name not in ("allowed", "scale", "softcap")})


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap × tanh(x / cap): x nearly unchanged where small, squashed smoothly into (-cap, cap); x itself
    for no cap. Gemma 2 caps attention scores (before the mask) and the final logits this way."""
    return x if cap is None else torch.tanh(x / cap) * cap


def rotate_and_join(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                    past: LayerCache | None, every_key: bool = False) -> tuple[torch.Tensor, ...]:
    """The queries, and every key and value they read: q (.., H, R, hs), k and v (.., Hkv, Tk, hs).

    rope (cos, sin), each (R, rd/2): the angles of the queries' own positions. past: keys and values
    of earlier tokens, after their rotary step; every_key: past already holds every key and value,
    these rows' own included (a whole text's cache), so the rows' own keys are not appended."""
    if rope is not None:
        # rotate before caching: cached keys keep the rotation of their own positions
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    if past is None:
        return q, k, v
    if every_key:
        return q, past.k, past.v
    # keys/values of earlier tokens first: (.., Hkv, T_past + R, hs)
    return q, torch.cat((past.k, k), dim=-2), torch.cat((past.v, v), dim=-2)


def per_query_head(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Keys or values (.., Hkv, Tk, hs) as one per query head (.., H, Tk, hs): query head h reads
    key/value head h // (H / Hkv), so each group's is repeated; without grouping, t itself."""
    group = n_heads // t.shape[-3]
    return t if group == 1 else t.repeat_interleave(group, dim=-3)


def attend(attn: "SelfAttention", q_proj: torch.Tensor, k_proj: torch.Tensor, v_raw: torch.Tensor,
           rope: tuple[torch.Tensor, torch.Tensor] | None = None, past: LayerCache | None = None,
           rows: Sequence[int] | None = None, plan: LayerPlan | None = None, dropout: float = 0.0) -> AttentionWork:
    """Layer `attn`'s attention written out, from the heads' projections (`SelfAttention.split_heads`):
    the q/k norm, the rotary step, scores, scale, soft-cap, mask, softmax, intervention, values.

    rows None: the R queries are the last R of the keys (past's, then their own), as in the forward.
    rows (R positions): the queries sit at these positions of a text whose every key and value `past`
    holds (a rebuild from a whole text's cache); then the rows' own keys are only reported (k_raw).
    plan: the layer's intervention (None: the model's own attention). dropout: the probability to drop
    weights with (the forward in training; 0 elsewhere)."""
    q_raw, k_raw = attn.normalise_qk(q_proj, k_proj)
    q, k, v = rotate_and_join(q_raw, k_raw, v_raw, rope, past, every_key=rows is not None)
    R, t_key, H = q.shape[-2], k.shape[-2], q.shape[-3]
    v_all = per_query_head(v, H)
    # scaled dot products (Vaswani et al. 2017, eq. 1): (.., H, R, Tk); rows are queries
    raw = q @ per_query_head(k, H).transpose(-2, -1)
    scores = raw * attn.score_scale  # a new tensor: `raw` stays as it was, for the reader
    if attn.softcap is not None:  # squashed into (-cap, cap) before the mask (Gemma 2)
        scores = soft_cap(scores, attn.softcap)
    if attn.causal:
        # the forward's queries are the last R positions (causal_mask aligns them after the cache);
        # a rebuild's are any rows of the whole text's (Tk, Tk) mask
        forbidden = (causal_mask(R, t_key, q.device, attn.window) if rows is None
                     else causal_mask(t_key, t_key, q.device, attn.window)[list(rows)])  # (R, Tk)
        scores.masked_fill_(forbidden, float("-inf"))
        allowed = ~forbidden
    else:  # bidirectional: every key, so no -inf is written at all
        allowed = torch.ones(R, t_key, dtype=torch.bool, device=q.device)
    # exp(-inf) = 0: masked weights are exactly zero; 16-bit weights take their softmax in float32, as
    # transformers does, and round the result back
    half = scores.dtype in (torch.bfloat16, torch.float16)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype) if half else torch.softmax(scores, -1)
    # an intervention first replaces rows of weights (uniform heads, edited rows), then what heads pass on
    used = weights if plan is None else plan.apply_to_weights(weights, allowed)
    values = F.dropout(used, dropout, training=True) @ v_all if dropout else used @ v_all  # (.., H, R, hs)
    if plan is not None:
        values = plan.apply_to_outputs(values)
    return AttentionWork(q_proj, k_proj, q_raw, k_raw, q, k, v, raw, scores, allowed, weights, used, values,
                         attn.score_scale, attn.softcap)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.head_dim, self.kv_heads = cfg.n_heads, cfg.head_dim, cfg.kv_heads
        # queries of every head, then keys and values of every key/value head, in one matrix
        self.qkv = nn.Linear(cfg.d_model, (cfg.n_heads + 2 * cfg.kv_heads) * cfg.head_dim, bias=cfg.part_bias("qkv"))
        # the heads side by side (attn_dim: d_model unless the heads are wider or narrower) back to d_model
        self.proj = nn.Linear(cfg.attn_dim, cfg.d_model, bias=cfg.part_bias("attn_out")) if cfg.attn_out_proj else None
        # RMSNorm of queries and keys before the rotary step: per head (hs wide, one weight for every
        # head) or over all heads of a position (H*hs and Hkv*hs wide)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm != "none":
            per_head = cfg.qk_norm == "head"
            self.q_norm = make_norm(cfg, cfg.head_dim if per_head else cfg.attn_dim)
            self.k_norm = make_norm(cfg, cfg.head_dim if per_head else cfg.kv_heads * cfg.head_dim)
        self.qk_gain = cfg.qk_gain  # queries and keys times this after their norm (nanochat: 1.2)
        # a value embedding of each token mixed into the values, gated per key/value head from the first
        # value_gate_width channels of the block's normed input (nanochat's alternating layers)
        self.value_embed = layer in cfg.value_embed_layers
        if self.value_embed:
            self.ve_gate = nn.Linear(cfg.value_gate_width, cfg.kv_heads, bias=False)
            self.gate_width, self.gate_scale = cfg.value_gate_width, cfg.value_gate_scale
        self.layer = layer
        self.dropout = cfg.dropout
        self.causal = cfg.mask == "causal"
        self.window = cfg.window(layer)  # 0: every earlier key; w: the last w keys only
        self.softcap = cfg.attn_softcap
        # the multiplier `attend` applies to q kᵀ: 1/sqrt(hs) (Vaswani et al.), 1/sqrt(query_scale_dim)
        # (Gemma's query_pre_attn_scalar), or 1 (GPT-Neo does not scale)
        if cfg.attn_scale == "none":
            self.score_scale = 1.0
        else:
            self.score_scale = 1.0 / math.sqrt(cfg.query_scale_dim or self.head_dim)
        # what the fused kernel is told: None keeps torch's default, which is 1/sqrt(hs)
        self.scale = None if cfg.attn_scale == "inverse_sqrt" and cfg.query_scale_dim is None else self.score_scale

    def split_heads(self, x: torch.Tensor, ve: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """x (B, T, C) -> q (B, H, T, hs), k and v (B, Hkv, T, hs): the projections, before the q/k norm
        and the rotary step. ve (B, T, Hkv * hs): the tokens' value embeddings, which a layer of
        value_embed_layers adds to its values (gated); such a layer refuses to run without them."""
        B, T, _ = x.shape
        H, Hkv, hs = self.n_heads, self.kv_heads, self.head_dim
        if Hkv == H:
            # one matmul for all three projections, then split heads: each of q, k, v is (B, H, T, hs)
            q, k, v = self.qkv(x).view(B, T, 3, H, hs).permute(2, 0, 3, 1, 4)
        else:  # grouped-query attention: fewer key/value heads; the cache keeps them grouped
            q, k, v = self.qkv(x).split((H * hs, Hkv * hs, Hkv * hs), dim=-1)
            q = q.view(B, T, H, hs).transpose(1, 2)  # (B, H, T, hs)
            k = k.view(B, T, Hkv, hs).transpose(1, 2)  # (B, Hkv, T, hs)
            v = v.view(B, T, Hkv, hs).transpose(1, 2)  # (B, Hkv, T, hs)
        if self.value_embed:
            if ve is None:
                raise ValueError(f"layer {self.layer} adds a value embedding of each token to its values "
                                 "(nanochat's value embeddings), which needs the token ids; it cannot be rebuilt "
                                 "from the residual stream alone")
            gate = self.gate_scale * torch.sigmoid(self.ve_gate(x[..., : self.gate_width]))  # (B, T, Hkv)
            v = v + (gate.unsqueeze(-1) * ve.view(B, T, Hkv, hs)).transpose(1, 2)  # (B, Hkv, T, hs)
        return q, k, v

    def normalise_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries (.., H, R, hs) and keys (.., Hkv, R, hs) after the q/k norm; themselves without one."""
        if self.qk_norm == "none":
            q_n, k_n = q, k
        elif self.qk_norm == "head":  # each head's vector on its own: the norm reads the last dimension
            q_n, k_n = self.q_norm(q), self.k_norm(k)
        else:
            q_n, k_n = _over_heads(self.q_norm, q), _over_heads(self.k_norm, k)
        if self.qk_gain != 1.0:  # nanochat: both times 1.2 after a parameter-free norm
            q_n, k_n = q_n * self.qk_gain, k_n * self.qk_gain
        return q_n, k_n

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        past: LayerCache | None,
        want_cache: bool,
        want_attention: bool,
        plan: LayerPlan | None = None,
        tap: LayerTap | None = None,
        ve: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, LayerCache | None, torch.Tensor | None, torch.Tensor | None]:
        B, T, C = x.shape
        q, k, v = self.split_heads(x, ve)
        drop = self.dropout if self.training else 0.0
        if want_attention or plan is not None or self.softcap is not None:
            # the caller wants to see attention, or changes it (or the kernel cannot soft-cap): the
            # written-out maths, returning exactly the weights that multiply V and the scores they came from
            work = attend(self, q, k, v, rope, past, plan=plan, dropout=drop)
            k, v, y, weights, scores = work.k, work.v, work.values, work.used, work.scores
        else:
            q, k, v = rotate_and_join(*self.normalise_qk(q, k), v, rope, past)
            y = self._fused(q, k, v, drop)
            weights = scores = None
        new_cache = LayerCache(k.contiguous(), v.contiguous()) if want_cache else None  # not views of q, k, v together

        if tap is not None:  # a patched or recorded forward (model.patching): each head's output
            y = tap.head(y)  # (B, H, T, hs)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # heads side by side: (B, T, attn_dim)
        if self.proj is not None:
            y = self.proj(y)
        return y, new_cache, weights, scores

    def _fused(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, drop: float) -> torch.Tensor:
        """torch's kernel on q (B, H, T, hs) and every key and value (B, Hkv, Tk, hs): the heads' outputs
        (B, H, T, hs). It never materialises the weights, so there is nothing to show; the mask is chosen
        to match `causal_mask`."""
        T, t_key = q.shape[2], k.shape[2]
        k, v = per_query_head(k, self.n_heads), per_query_head(v, self.n_heads)
        scale = {} if self.scale is None else {"scale": self.scale}
        if self.window and t_key > 1:
            # a local layer: its band of allowed keys is passed to the kernel explicitly
            allowed = ~causal_mask(T, t_key, q.device, self.window)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=drop, **scale)
        if not self.causal or T == 1:
            # bidirectional masks nothing; a single causal query is the last position and
            # may see every key, so it needs no mask either
            return F.scaled_dot_product_attention(q, k, v, dropout_p=drop, **scale)
        if t_key == T:
            # no cache: the plain lower triangle
            return F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True, **scale)
        # several new queries after cached keys: is_causal would align the triangle to
        # the top-left corner (wrong here), so pass the offset mask explicitly
        allowed = ~causal_mask(T, t_key, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=drop, **scale)


def _over_heads(norm: nn.Module, t: torch.Tensor) -> torch.Tensor:
    """`norm` over all heads of a position at once (OLMo 2): t (.., heads, R, hs) is laid out as the
    projection was, (.., R, heads * hs), normalised, and split into heads again."""
    *lead, heads, R, hs = t.shape
    joined = t.transpose(-3, -2).reshape(*lead, R, heads * hs)
    return norm(joined).reshape(*lead, R, heads, hs).transpose(-3, -2)
