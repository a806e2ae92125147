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
from .patching import LayerTap


@dataclass
class LayerCache:
    """Keys and values of one layer, shape (B, H, T_cached, head_dim)."""

    k: torch.Tensor
    v: torch.Tensor


def rope_angles(n_positions: int, head_dim: int, base: float = 10000.0, precision: str = "float64") -> torch.Tensor:
    """Rotation angle pos * base^(-2i/head_dim) for each position and dimension pair: (P, head_dim/2).

    With a rotary fraction below 1 pass the rotated dimensions (ModelConfig.rope_dim) as head_dim:
    the frequencies are spread over the rotated part only, as in GPT-NeoX. precision "float32":
    the same formula in float32, operation for operation as transformers computes it."""
    if precision == "float32":
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        return torch.arange(n_positions).float().unsqueeze(1) * inv_freq  # (P, head_dim/2)
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return (torch.arange(n_positions, dtype=torch.float64).unsqueeze(1) * inv_freq).float()


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

    q_raw (.., H, R, hs), k_raw (.., Hkv, R, hs): the queries' own projections before the rotary step;
    q (.., H, R, hs) after it; k, v (.., Hkv, Tk, hs): every key and value read (rotated keys, cached
    ones first), grouped as the cache keeps them. raw (.., H, R, Tk) = q kᵀ; `scaled` = raw × scale;
    scores: scaled with -inf where the mask forbids; allowed (R, Tk): the keys each query may read;
    weights: softmax(scores) row by row; used: the rows that multiplied V (weights unless the plan
    replaced some); values (.., H, R, hs): what each head passed on (after the plan's ablation).
    """

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

    @property
    def scaled(self) -> torch.Tensor:
        """raw × scale, before the mask: recomputed on demand (the same product `scores` was made from,
        so the same bits), which spares the forward holding a third (.., H, R, Tk) tensor."""
        return self.raw * self.scale

    def one(self, index: int = 0) -> "AttentionWork":
        """The work of one sequence of the batch: every tensor loses its batch dimension, except `allowed`,
        which never had one (one mask serves the whole batch)."""
        return replace(self, **{f.name: getattr(self, f.name)[index] for f in fields(self)
                                if f.name not in ("allowed", "scale")})


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


def attend(attn: "SelfAttention", q_raw: torch.Tensor, k_raw: torch.Tensor, v_raw: torch.Tensor,
           rope: tuple[torch.Tensor, torch.Tensor] | None = None, past: LayerCache | None = None,
           rows: Sequence[int] | None = None, plan: LayerPlan | None = None, dropout: float = 0.0) -> AttentionWork:
    """Layer `attn`'s attention written out, from the heads' projections (`SelfAttention.split_heads`).

    rows None: the R queries are the last R of the keys (past's, then their own), as in the forward.
    rows (R positions): the queries sit at these positions of a text whose every key and value `past`
    holds (a rebuild from a whole text's cache); then the rows' own keys are only reported (k_raw).
    plan: the layer's intervention (None: the model's own attention). dropout: the probability to drop
    weights with (the forward in training; 0 elsewhere)."""
    q, k, v = rotate_and_join(q_raw, k_raw, v_raw, rope, past, every_key=rows is not None)
    R, t_key, H = q.shape[-2], k.shape[-2], q.shape[-3]
    v_all = per_query_head(v, H)
    # scaled dot products (Vaswani et al. 2017, eq. 1): (.., H, R, Tk); rows are queries
    raw = q @ per_query_head(k, H).transpose(-2, -1)
    scores = raw * attn.score_scale  # a new tensor: `raw` stays as it was, for the reader
    if attn.causal:
        # the forward's queries are the last R positions (causal_mask aligns them after the cache);
        # a rebuild's are any rows of the whole text's (Tk, Tk) mask
        forbidden = (causal_mask(R, t_key, q.device, attn.window) if rows is None
                     else causal_mask(t_key, t_key, q.device, attn.window)[list(rows)])  # (R, Tk)
        scores.masked_fill_(forbidden, float("-inf"))
        allowed = ~forbidden
    else:  # bidirectional: every key, so no -inf is written at all
        allowed = torch.ones(R, t_key, dtype=torch.bool, device=q.device)
    weights = torch.softmax(scores, dim=-1)  # exp(-inf) = 0: masked weights are exactly zero
    # an intervention first replaces rows of weights (uniform heads, edited rows), then what heads pass on
    used = weights if plan is None else plan.apply_to_weights(weights, allowed)
    values = F.dropout(used, dropout, training=True) @ v_all if dropout else used @ v_all  # (.., H, R, hs)
    if plan is not None:
        values = plan.apply_to_outputs(values)
    return AttentionWork(q_raw, k_raw, q, k, v, raw, scores, allowed, weights, used, values, attn.score_scale)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.head_dim, self.kv_heads = cfg.n_heads, cfg.head_dim, cfg.kv_heads
        # queries of every head, then keys and values of every key/value head, in one matrix
        self.qkv = nn.Linear(cfg.d_model, (cfg.n_heads + 2 * cfg.kv_heads) * cfg.head_dim, bias=cfg.part_bias("qkv"))
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.part_bias("attn_out")) if cfg.attn_out_proj else None
        self.dropout = cfg.dropout
        self.causal = cfg.mask == "causal"
        self.window = cfg.window(layer)  # 0: every earlier key; w: the last w keys only
        # None keeps torch's and the written-out path's 1/sqrt(hs); GPT-Neo does not scale
        self.scale = None if cfg.attn_scale == "inverse_sqrt" else 1.0
        # the multiplier `attend` applies to q kᵀ (the same number torch's kernel uses by default)
        self.score_scale = 1.0 / math.sqrt(self.head_dim) if self.scale is None else self.scale

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> q (B, H, T, hs), k and v (B, Hkv, T, hs): the projections, before the rotary step."""
        B, T, _ = x.shape
        H, Hkv, hs = self.n_heads, self.kv_heads, self.head_dim
        if Hkv == H:
            # one matmul for all three projections, then split heads: each of q, k, v is (B, H, T, hs)
            q, k, v = self.qkv(x).view(B, T, 3, H, hs).permute(2, 0, 3, 1, 4)
            return q, k, v
        # grouped-query attention: fewer key/value heads; the cache keeps them grouped
        q, k, v = self.qkv(x).split((H * hs, Hkv * hs, Hkv * hs), dim=-1)
        q = q.view(B, T, H, hs).transpose(1, 2)  # (B, H, T, hs)
        k = k.view(B, T, Hkv, hs).transpose(1, 2)  # (B, Hkv, T, hs)
        v = v.view(B, T, Hkv, hs).transpose(1, 2)  # (B, Hkv, T, hs)
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        past: LayerCache | None,
        want_cache: bool,
        want_attention: bool,
        plan: LayerPlan | None = None,
        tap: LayerTap | None = None,
    ) -> tuple[torch.Tensor, LayerCache | None, torch.Tensor | None, torch.Tensor | None]:
        B, T, C = x.shape
        q, k, v = self.split_heads(x)
        drop = self.dropout if self.training else 0.0
        if want_attention or plan is not None:
            # the caller wants to see attention, or changes it: the written-out maths, returning exactly
            # the weights that multiply V and the scaled, masked scores they came from
            work = attend(self, q, k, v, rope, past, plan=plan, dropout=drop)
            k, v, y, weights, scores = work.k, work.v, work.values, work.used, work.scores
        else:
            q, k, v = rotate_and_join(q, k, v, rope, past)
            y = self._fused(q, k, v, drop)
            weights = scores = None
        new_cache = LayerCache(k.contiguous(), v.contiguous()) if want_cache else None  # not views of q, k, v together

        if tap is not None:  # a patched or recorded forward (model.patching): each head's output
            y = tap.head(y)  # (B, H, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)  # heads side by side again: (B, T, C)
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
