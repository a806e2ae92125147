"""What the page needs to link the text with the attention picture without asking the server.

Clicking a token in the Explore page outlines its query row in every panel and shades the text
by how much that query attends to each earlier token. Both happen in the page (a click must
answer in well under 150 ms), from numbers the attention figure carries in ``layout.meta.shade``:
one layer's weights, every head, as bytes.

Encoding: for each head h and query i, the weights of keys 0..i (the causal row, i + 1 values)
are divided by the row's largest weight (``rowmax[h][i]``, sent as a number), rounded to 1/255
and stored as one unsigned byte each, rows one after the other (lower triangle, row-major),
heads one after the other, base64. Scaling per row keeps a flat row (all weights near 1/T) as
precise as a peaked one. A bidirectional model sends every key of every row instead
(``square``). `decode_shade` is the inverse the page implements.
"""

from __future__ import annotations

import base64

import numpy as np

SHADE_LEVELS = 255


def shade_payload(weights: np.ndarray, layer: int, head: int | None, *, causal: bool = True) -> dict:
    """The shading data of one layer: weights (H, T, T), rows = queries, each row summing to 1.

    head: the head the page shades by (None = the mean of the layer's heads).
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 3 or w.shape[1] != w.shape[2] or w.shape[1] == 0:
        raise ValueError(f"weights must be (heads, T, T) with T ≥ 1, got shape {w.shape}")
    n_heads, t = w.shape[0], w.shape[1]
    if head is not None and not 0 <= head < n_heads:
        raise ValueError(f"head {head} out of range: the layer has {n_heads} heads")
    w = np.clip(np.nan_to_num(w, nan=0.0), 0.0, 1.0)
    rowmax = w.max(axis=2)  # (H, T)
    q = np.rint(w / np.where(rowmax > 0, rowmax, 1.0)[:, :, None] * SHADE_LEVELS).astype(np.uint8)
    if causal:
        rows, cols = np.tril_indices(t)
        data = q[:, rows, cols]  # (H, T(T+1)/2), row-major lower triangle
    else:
        data = q.reshape(n_heads, t * t)
    return {"layer": int(layer), "head": None if head is None else int(head), "heads": int(n_heads), "T": int(t),
            "square": not causal, "levels": SHADE_LEVELS, "rowmax": np.round(rowmax, 6).tolist(),
            "data": base64.b64encode(data.tobytes()).decode("ascii")}


def decode_shade(payload: dict) -> np.ndarray:
    """(H, T, T) weights back from `shade_payload` (the masked cells 0), as the page reads them."""
    h, t = payload["heads"], payload["T"]
    raw = np.frombuffer(base64.b64decode(payload["data"]), dtype=np.uint8).astype(np.float64) / payload["levels"]
    scale = np.asarray(payload["rowmax"], dtype=np.float64)[:, :, None]  # (H, T, 1)
    if payload["square"]:
        return raw.reshape(h, t, t) * scale
    out = np.zeros((h, t, t))
    rows, cols = np.tril_indices(t)
    out[:, rows, cols] = raw.reshape(h, -1)
    return out * scale


def shading(payload: dict, query: int) -> np.ndarray:
    """How the page shades the text for `query`: the query's row of the chosen head (or the mean
    over heads), the weight itself as the strength of the shade (1 = full colour)."""
    w = decode_shade(payload)[:, query, :]
    row = w[payload["head"]] if payload["head"] is not None else w.mean(axis=0)
    return np.minimum(row, 1.0)
