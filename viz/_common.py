"""Shared helpers for the viz package: escaping, quantisation, tick thinning, layout pieces."""

from __future__ import annotations

import html
import math

import numpy as np

# Values are sent as integers in units of 1/1000 ("milli-units"). plotly.js hovertemplates
# cannot divide, so the figure swaps the number separators (decimal ",", thousands ".") and
# formats z with d3 "05,d": 231 -> "0.231", 1000 -> "1.000", -12345 -> "-12.345".
# Only figures whose other numbers are all integers or custom tick text may use this trick.
MILLI = 1000
MILLI_FORMAT = "%{z:05,d}"
MILLI_SEPARATORS = ",."
MILLI_LIMIT = 999_999  # |value| < 1000: beyond that "1.234.567" would read wrongly

FONT = {"family": "Arial, sans-serif", "size": 11}
GREY = "#d4d4d4"  # masked / missing cells show the plot background through NaN gaps
TOKEN_TICK_CHARS = 12  # longer tokens are shortened in tick labels (hover keeps the full text)


def esc(text: str) -> str:
    """Escape &, < and > so Plotly shows a user/token string literally (it does not decode &quot;)."""
    return html.escape(str(text), quote=False)


def short_token(token: str, limit: int = TOKEN_TICK_CHARS) -> str:
    """Escaped tick text for a token, shortened with an ellipsis when longer than `limit`."""
    token = str(token)
    return esc(token if len(token) <= limit else token[: limit - 1] + "…")


def to_milli(values: np.ndarray) -> np.ndarray:
    """Round finite values to integer milli-units (float64, NaN kept), clipped to ±MILLI_LIMIT."""
    q = np.rint(np.asarray(values, dtype=np.float64) * MILLI)
    return np.clip(q, -MILLI_LIMIT, MILLI_LIMIT)


def narrow_int(q: np.ndarray) -> np.ndarray:
    """Smallest integer dtype (u1, u2, i1, i2, i4) holding the integer-valued float array `q`."""
    lo, hi = (float(q.min()), float(q.max())) if q.size else (0.0, 0.0)
    for dtype in (np.uint8, np.uint16, np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return q.astype(dtype)
    raise ValueError(f"values {lo}..{hi} do not fit in int32")


def encoded_milli(q: np.ndarray) -> np.ndarray:
    """Milli-unit array ready for Plotly: narrowest int dtype, or float32 when it holds NaN."""
    return q.astype(np.float32) if np.isnan(q).any() else narrow_int(q)


def tick_step(n: int, panel_px: float, label_px: float = 12.0) -> int:
    """Stride between tick labels so that n labels fit in panel_px pixels."""
    fit = max(2, int(panel_px // label_px))
    return max(1, math.ceil(n / fit))


def nice_ticks(lo: float, hi: float, n: int = 5) -> np.ndarray:
    """Round tick values covering [lo, hi] (about n of them)."""
    if not math.isfinite(lo) or not math.isfinite(hi) or hi <= lo:
        return np.array([lo]) if math.isfinite(lo) else np.array([0.0])
    raw = (hi - lo) / max(1, n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks = np.arange(start, hi + step * 1e-6, step)
    return np.round(ticks, 10)


def tick_label(v: float) -> str:
    """Compact text for a colour-bar tick (plain '.' decimal; custom tick text is not reformatted)."""
    return f"{v:g}"


def empty_note(text: str) -> dict:
    """A centred paper-coordinates annotation (already-escaped text)."""
    return {"text": text, "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper", "showarrow": False,
            "font": {"size": 13, "color": "#555"}}
