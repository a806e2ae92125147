"""What model.inside returns: one attention cell worked through (`CellWork`) and one head as matrices
(`HeadWork`), as float64 numpy copies of the model's own numbers (see model/inside.py for how they are
computed and checked).

Both are plain data, in the order the arithmetic runs: residual -> norm -> projections -> (q/k norm) ->
rotary -> dot products -> scale -> (soft-cap) -> mask -> softmax -> (intervention) -> weighted values -> W_O
-> (the norm of the attention's output) -> the residual; a step in brackets is present in some models only.
They are copies in float64 so a page can show and export them without holding tensors, and so sums a
reader redoes by hand (Σ_d products = dot) come out as the model's within float32 rounding, not worse.
Each number comes from model/attention.py's `attend` (`AttentionWork`), the computation the
forward itself ran; what an intervention changed comes from the plan (model/interventions.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class QKNormStep:
    """The q/k norm (ModelConfig.qk_norm) of one query or key vector, worked through: with p the head's
    projection (q_proj or k_proj), normed = ((p − mean) / rms × (offset + weight) + bias) × gain.

    over: "head" (the norm reads this head's hs numbers alone) or "whole" (it reads all heads of the
    position at once, `width` = heads × hs numbers: mean and rms are theirs, so the other heads' numbers
    change this head's). kind: "rmsnorm" (mean and bias None) or "layernorm". rms = √(mean((x − mean)²) +
    eps) over those `width` numbers. weight (hs,): the stored weight at this head's dimensions (None: a
    parameter-free norm, nanochat); offset: 1 where the model stores w − 1 and multiplies by 1 + w (Gemma),
    else 0; bias (hs,) or None; gain: the factor after the norm (ModelConfig.qk_gain, 1 but for nanochat).
    """

    over: str
    width: int
    kind: str
    eps: float
    mean: float | None
    rms: float
    weight: np.ndarray | None
    offset: float
    bias: np.ndarray | None
    gain: float


@dataclass
class CellWork:
    """One attention cell (layer, head, query i, key j) worked through; arrays are float64 numpy
    copies of the model's own (float32) numbers. C = d_model, hs = head_dim, T = tokens.

    kv_head: the key/value head read (grouped-query attention). norm: "pre" (attention reads norm1(x)),
    "post" or "none" (it reads x); norm_kind; parallel: GPT-NeoX's parallel residual. x_i, x_j (C,): the
    layer's residual input at i and j; xn_i, xn_j (C,): what the attention reads ("sandwich" reads norm1(x),
    "post_branch" x itself). q_proj (hs,) = W_Q x̂_i + b_Q, k_proj (hs,) = W_K x̂_j + b_K: the projections;
    qk_norm: "none", "head" or "whole"; q_norm, k_norm: that norm worked through (`QKNormStep`; None
    without one). q_raw, k_raw (hs,): after the q/k norm (the projections themselves without one), before
    the rotary step; q, k after it (equal where the layer does not rotate); rotary: whether this layer
    rotates; rope_base: its base (None when it does not), rope_local: the local layers' own base (Gemma 3),
    rope_scaling: its change of frequencies (ModelConfig.rope_scaling; () for none); rotary_dims of the hs
    dimensions turn; rope_cos_i/sin_i, rope_cos_j/sin_j (rotary_dims/2,): the rotation of positions i and
    j (None without rotary).
    products (hs,) = q[d] * k[d]; dot = Σ_d products; scale = 1/√scale_dim (scale_dim: head_dim, or the
    model's query_scale_dim, Gemma's query_pre_attn_scalar), or 1 for unscaled models (scale_kind "none",
    scale_dim None); score = dot × scale, the cell's scaled score (before the cap and the mask); softcap:
    c or None; capped = c · tanh(score / c) (score itself without a soft-cap).
    allowed (T,): the keys the mask lets query i see (j ≤ i, inside a local window); masked: j is
    not allowed (its score is -inf, its weight 0). scores_row (T,): s_i (capped), -inf where masked;
    row_max = max_j s_ij; exp_row (T,) = exp(s_ij - row_max) (0 where masked); exp_sum = Σ_j
    exp_row; softmax_row (T,) = exp_row / exp_sum; weight = softmax_row[j].
    used_row (T,): the row that multiplied V (softmax_row unless row_source says otherwise:
    `LayerPlan.row_source`, the word of an ablation mode that replaces weights ("uniform"), "edit:
    uniform" or "edit: key k"); used_weight = used_row[j].
    v (T, hs): v_j = W_V x̂_j + b_V of every key; weighted (hs,) = Σ_j used_row[j] v_j.
    ablation: None, or this head's ablation mode (model.interventions.ABLATION_MODES); head_value (hs,):
    what the head passed on (weighted, 0 when zeroed, its mean over the text's positions when
    mean-ablated).
    w_o (C, hs): the head's columns of W_O (None without an output projection: the value sits in the
    head's own dimensions). head_out (C,): the head's addition to the residual of token i; out_bias:
    b_O or None; heads_out (H, C): every head's addition at i; attn_out (C,) = Σ_h heads_out + b_O;
    attn_normed (C,): post_norm1(attn_out), what joins the residual in a "sandwich" or "post_branch" block
    (None in the others, where attn_out joins it as it is); residual_after (C,) = x_i + attn_normed, or
    x_i + attn_out: the stream after the attention's addition, as `Block.rest` computes it (a "post" block
    then normalises it; a parallel block adds the MLP beside it).
    """

    layer: int
    head: int
    query: int
    key: int
    kv_head: int  # several query heads may read one key/value head (grouped-query attention)
    n_heads: int
    kv_heads: int
    head_dim: int
    norm: str  # what the attention reads: norm1(x) ("pre", "sandwich") or x itself ("post", "none", "post_branch")
    norm_kind: str  # "layernorm" or "rmsnorm": whether the norm also subtracted a mean
    parallel: bool  # the MLP reads the same input as attention, so residual_after is not yet the block's output
    x_i: np.ndarray  # (C,)
    x_j: np.ndarray  # (C,)
    xn_i: np.ndarray  # (C,)
    xn_j: np.ndarray  # (C,)
    q_proj: np.ndarray  # (hs,): the projection, before any q/k norm
    k_proj: np.ndarray  # (hs,)
    qk_norm: str
    q_norm: QKNormStep | None
    k_norm: QKNormStep | None
    q_raw: np.ndarray  # (hs,): before the rotary step, so a page can show what the rotation did
    k_raw: np.ndarray  # (hs,)
    q: np.ndarray  # (hs,): what the dot product uses
    k: np.ndarray  # (hs,)
    rotary: bool
    rope_base: float | None  # layers may differ: a local base, or none at all (a layer without rotary)
    rope_local: bool
    rope_scaling: tuple
    rotary_dims: int  # the first rotary_dims of hs turn, in pairs; the rest pass through unchanged
    rotary_fraction: float
    rope_cos_i: np.ndarray | None  # (rotary_dims/2,): one angle per turning pair
    rope_sin_i: np.ndarray | None
    rope_cos_j: np.ndarray | None
    rope_sin_j: np.ndarray | None
    products: np.ndarray  # (hs,): kept per dimension so a page can show which dimensions make the score
    dot: float
    scale: float
    scale_kind: str
    scale_dim: int | None  # the number under the root: head_dim unless the model names its own
    score: float
    softcap: float | None
    capped: float
    allowed: np.ndarray  # (T,) bool
    masked: bool
    scores_row: np.ndarray  # (T,): the whole row, since the softmax of one cell depends on all of it
    row_max: float  # subtracted before exp, as softmax does, so no exp overflows
    exp_row: np.ndarray  # (T,)
    exp_sum: float  # the softmax's denominator
    softmax_row: np.ndarray  # (T,): the model's own weights
    weight: float
    used_row: np.ndarray  # (T,): what V was multiplied with; another row only where the plan replaced it
    used_weight: float
    row_source: str
    v: np.ndarray  # (T, hs): every key's value, since the weighted sum runs over the whole row
    weighted: np.ndarray  # (hs,)
    ablation: str | None
    head_value: np.ndarray  # (hs,): differs from weighted only when the head's output is ablated
    w_o: np.ndarray | None  # (C, hs)
    head_out: np.ndarray  # (C,)
    out_bias: np.ndarray | None  # (C,): added once to the sum of the heads, so it belongs to none of them
    heads_out: np.ndarray  # (H, C)
    attn_out: np.ndarray  # (C,)
    attn_normed: np.ndarray | None  # (C,): only where a norm sits on the attention's output
    residual_after: np.ndarray  # (C,)


@dataclass
class HeadWork:
    """One head of one layer as matrices (T tokens, hs = head_dim); float64 copies of the model's numbers.

    q_proj, k_proj (T, hs): the projections; q_raw, k_raw (T, hs): after the q/k norm (the projections
    without one), before the rotary step; q, k (T, hs): after it (what the dot products use); v (T, hs).
    kv_head: the key/value head read (grouped-query attention). raw (T, T) = q kᵀ; scaled = raw × scale;
    capped = softcap · tanh(scaled / softcap) (scaled itself for softcap None); masked = capped with -inf
    where the mask forbids (allowed (T, T) is False);
    weights = softmax(masked) row by row; used (T, T): the rows that multiplied V (weights unless
    the head is made uniform or a row is edited; `edited_rows` lists the edited queries).
    value_norms (T,) = ‖v_j W_Oᵀ‖ (‖v_j‖ without an output projection); value_weighted (T, T) =
    ‖a_ij v_j W_O‖ = used_ij × value_norms[j], what key j moves query i's output by (0 for a
    zeroed head; for a mean-ablated head every row is the mean over queries of that).
    """

    layer: int
    head: int
    kv_head: int
    scale: float
    scale_kind: str
    rotary: bool  # without rotary, q_raw equals q and k_raw equals k
    ablation: str | None  # None, or the mode that ablates this head (then `used` or `value_weighted` differ)
    edited_rows: list[int]  # queries whose row of `used` an attention edit replaced
    q_proj: np.ndarray  # (T, hs)
    k_proj: np.ndarray  # (T, hs)
    q_raw: np.ndarray  # (T, hs)
    k_raw: np.ndarray  # (T, hs)
    q: np.ndarray  # (T, hs)
    k: np.ndarray  # (T, hs): the key/value head's (kv_head), shared with its group's query heads
    v: np.ndarray  # (T, hs)
    raw: np.ndarray  # (T, T): query rows, key columns, as every attention matrix here
    scaled: np.ndarray  # (T, T)
    softcap: float | None
    capped: np.ndarray  # (T, T)
    allowed: np.ndarray  # (T, T) bool: the mask is the layer's, the same for all its heads
    masked: np.ndarray  # (T, T)
    weights: np.ndarray  # (T, T)
    used: np.ndarray  # (T, T)
    value_norms: np.ndarray  # (T,): one per key: how far its value can move an output at all
    value_weighted: np.ndarray  # (T, T)
