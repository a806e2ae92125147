"""What model.inside returns: one attention cell worked through (`CellWork`) and one head as matrices
(`HeadWork`), as float64 numpy copies of the model's own numbers (see model/inside.py for how they are
computed and checked).

Both are plain data, in the order the arithmetic runs: residual -> norm -> projections -> rotary ->
dot products -> scale -> mask -> softmax -> (intervention) -> weighted values -> W_O. They are copies
in float64 so a page can show and export them without holding tensors, and so sums a reader redoes
by hand (Σ_d products = dot) come out as the model's within float32 rounding, not worse.
Each number comes from model/attention.py's `attend` (`AttentionWork`), the computation the
forward itself ran; what an intervention changed comes from the plan (model/interventions.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class CellWork:
    """One attention cell (layer, head, query i, key j) worked through; arrays are float64 numpy
    copies of the model's own (float32) numbers. C = d_model, hs = head_dim, T = tokens.

    kv_head: the key/value head read (grouped-query attention). norm: "pre" (attention reads norm1(x)),
    "post" or "none" (it reads x); norm_kind; parallel: GPT-NeoX's parallel residual. x_i, x_j (C,): the
    layer's residual input at i and j; xn_i, xn_j (C,): what the attention reads. q_raw (hs,) = W_Q x̂_i
    + b_Q, k_raw (hs,) = W_K x̂_j + b_K before the rotary step; q, k after it (equal without rotary);
    rotary_dims of the hs dimensions turn; rope_cos_i/sin_i, rope_cos_j/sin_j (rotary_dims/2,): the
    rotation of positions i and j (None without rotary).
    products (hs,) = q[d] * k[d]; dot = Σ_d products; scale: 1/√hs, or 1 for unscaled models
    (scale_kind "none"); score = dot × scale, the cell's scaled score (before the mask).
    allowed (T,): the keys the mask lets query i see (j ≤ i, inside a local window); masked: j is
    not allowed (its score is -inf, its weight 0). scores_row (T,): s_i, -inf where masked;
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
    residual_after (C,) = x_i + attn_out (post-norm then normalises; parallel adds the MLP too).
    """

    layer: int
    head: int
    query: int
    key: int
    kv_head: int  # several query heads may read one key/value head (grouped-query attention)
    n_heads: int
    kv_heads: int
    head_dim: int
    norm: str  # decides what the attention reads: norm1(x) ("pre") or x itself ("post", "none")
    norm_kind: str
    parallel: bool
    x_i: np.ndarray  # (C,)
    x_j: np.ndarray  # (C,)
    xn_i: np.ndarray  # (C,)
    xn_j: np.ndarray  # (C,)
    q_raw: np.ndarray  # (hs,): before the rotary step, so a page can show what the rotation did
    k_raw: np.ndarray  # (hs,)
    q: np.ndarray  # (hs,): what the dot product uses
    k: np.ndarray  # (hs,)
    rotary: bool
    rotary_dims: int
    rotary_fraction: float
    rope_cos_i: np.ndarray | None
    rope_sin_i: np.ndarray | None
    rope_cos_j: np.ndarray | None
    rope_sin_j: np.ndarray | None
    products: np.ndarray
    dot: float
    scale: float
    scale_kind: str
    score: float
    allowed: np.ndarray
    masked: bool
    scores_row: np.ndarray  # (T,): the whole row, since the softmax of one cell depends on all of it
    row_max: float  # subtracted before exp, as softmax does, so no exp overflows
    exp_row: np.ndarray  # (T,)
    exp_sum: float
    softmax_row: np.ndarray  # (T,): the model's own weights
    weight: float
    used_row: np.ndarray  # (T,): what V was multiplied with; another row only where the plan replaced it
    used_weight: float
    row_source: str
    v: np.ndarray  # (T, hs)
    weighted: np.ndarray  # (hs,)
    ablation: str | None
    head_value: np.ndarray  # (hs,): differs from weighted only when the head's output is ablated
    w_o: np.ndarray | None  # (C, hs)
    head_out: np.ndarray  # (C,)
    out_bias: np.ndarray | None  # (C,): added once to the sum of the heads, so it belongs to none of them
    heads_out: np.ndarray  # (H, C)
    attn_out: np.ndarray  # (C,)
    residual_after: np.ndarray  # (C,)


@dataclass
class HeadWork:
    """One head of one layer as matrices (T tokens, hs = head_dim); float64 copies of the model's numbers.

    q_raw, k_raw (T, hs): before the rotary step; q, k (T, hs): after it (what the dot products
    use); v (T, hs). kv_head: the key/value head read (grouped-query attention). raw (T, T) = q kᵀ;
    scaled = raw × scale; masked = scaled with -inf where the mask forbids (allowed (T, T) is False);
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
    rotary: bool
    ablation: str | None
    edited_rows: list[int]
    q_raw: np.ndarray  # (T, hs)
    k_raw: np.ndarray  # (T, hs)
    q: np.ndarray  # (T, hs)
    k: np.ndarray  # (T, hs): the key/value head's (kv_head), shared with its group's query heads
    v: np.ndarray  # (T, hs)
    raw: np.ndarray  # (T, T): query rows, key columns, as every attention matrix here
    scaled: np.ndarray  # (T, T)
    allowed: np.ndarray  # (T, T) bool: the mask is the layer's, the same for all its heads
    masked: np.ndarray  # (T, T)
    weights: np.ndarray  # (T, T)
    used: np.ndarray  # (T, T)
    value_norms: np.ndarray  # (T,): one per key: how far its value can move an output at all
    value_weighted: np.ndarray  # (T, T)
