"""How attention values are coloured: the colour modes for weights and the shared colour axis.

Weights are drawn on `SEQUENTIAL` (0..1 as they are, each query row divided by its largest weight,
or log10 of the weight), scores before softmax on `DIVERGING`, symmetric around 0 (see viz._common).
"value" draws value-weighted attention instead of the weights: ‖a_ij · v_j W_O‖, how far key j moves
the output of query i (Kobayashi et al., 2020), on `SEQUENTIAL` from 0 to the largest shown.
"""

from __future__ import annotations

import numpy as np

from ._common import DIVERGING, MILLI, SEQUENTIAL, colorscale, nice_ticks, tick_label
from .attention_layout import Fonts

COLOUR_MODES = ("linear", "row", "log", "value")  # how weights are coloured; see attention_view
LOG_FLOOR = -3.0  # colour="log": log10(weight) clipped to [LOG_FLOOR, 0]


def check_colour(colour: str) -> None:
    if colour not in COLOUR_MODES:
        raise ValueError(f"colour must be one of {', '.join(map(repr, COLOUR_MODES))}, got {colour!r}")


def colour_values(values: np.ndarray, masked: np.ndarray, colour: str) -> np.ndarray:
    """Weights (N, T, T) as coloured: as they are ("linear"), each query row divided by its largest
    unmasked weight ("row"; a row of zeros stays 0), or log10(weight) clipped to [LOG_FLOOR, 0]
    ("log"). "value": the values given (value-weighted norms) as they are. Masked cells come back NaN."""
    vals = np.where(masked, np.nan, values)
    if colour == "row":
        with np.errstate(invalid="ignore"):
            peak = np.max(np.where(masked, -np.inf, values), axis=-1, keepdims=True)
        peak = np.where(np.isfinite(peak) & (peak > 0), peak, 1.0)
        return np.clip(vals / peak, 0.0, 1.0)
    if colour == "log":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.clip(np.log10(np.clip(vals, 0.0, None)), LOG_FLOOR, 0.0)
    return vals


def value_name(kind: str, colour: str) -> str:
    if kind == "scores":
        return "score"
    return {"linear": "weight", "row": "weight ÷ row max", "log": "log₁₀ weight", "value": "‖a·v W_O‖"}[colour]


def bar_ticks(lo: float, hi: float, most: int, bar_px: float, font_px: float) -> np.ndarray:
    """Round tick values for a colour bar `bar_px` long: at most `most`, and no more than fit without
    overlapping at `font_px` (a label's line and a gap between neighbours); the two ends at the least."""
    for n in range(most, 1, -1):
        ticks = nice_ticks(lo, hi, n)
        if len(ticks) <= 2 or bar_px / (len(ticks) - 1) >= font_px * 1.6:
            return ticks
    return np.array([lo, hi])


def colour_axis(q: np.ndarray, masked: np.ndarray, kind: str, colour: str, show_scale: bool, fonts: Fonts,
                 x: float, below: float | None = None, bar_px: float = 1e9) -> dict:
    """The shared colour axis; its bar stands right of the panels at paper x = `x`, or, when
    `below` is given, lies under them with its top at paper y = `below` (narrow figures). bar_px: the
    bar's length in px, which sets how many ticks it can label without overlap."""
    # q holds milli-units (value x 1000, what the heatmaps carry), so bounds are divided back to real units
    if kind == "scores":
        # scores are signed: a diverging scale symmetric about 0, so white means exactly 0
        vals = q[~masked]
        bound = float(np.abs(vals).max()) / MILLI if vals.size else 1.0
        bound = bound or 1.0  # all-zero scores would give an empty range
        lo, hi, scale = -bound, bound, DIVERGING
    elif colour == "log":  # log10 of a weight lies in (-inf, 0]; the floor clips what is too faint to matter
        lo, hi, scale = LOG_FLOOR, 0.0, SEQUENTIAL
    elif colour == "value":  # norms have no natural top, so the largest drawn one sets it (1 when none is)
        vals = q[~masked & np.isfinite(q)]
        lo, hi, scale = 0.0, (float(vals.max()) / MILLI if vals.size else 0.0) or 1.0, SEQUENTIAL
    else:  # weights, plain or divided by their row's max: both lie in [0, 1]
        lo, hi, scale = 0.0, 1.0, SEQUENTIAL
    # a horizontal bar's labels sit side by side: they need their width apart, not their height
    label_px = fonts.colorbar * (1.0 if below is None else 0.6 * max(len(tick_label(v)) for v in (lo, hi, (lo + hi) / 4)))
    ticks = bar_ticks(lo, hi, 4 if colour == "log" else 5, bar_px, label_px)
    return {
        "cmin": lo * MILLI,
        "cmax": hi * MILLI,
        "colorscale": colorscale(scale),
        "showscale": show_scale,
        "colorbar": {
            "title": {"text": value_name(kind, colour), "side": "right", "font": {"size": fonts.axis_title}},
            "tickmode": "array",
            "tickvals": (ticks * MILLI).tolist(),
            "ticktext": [tick_label(v) for v in ticks],
            "tickfont": {"size": fonts.colorbar},
            "thickness": fonts.cb_thick,
            "len": 1.0,
            "x": x,
            "xanchor": "left",
            "outlinewidth": 0,
            # a narrow figure lays the bar flat under the panels: these override the vertical bar's keys
            **({"orientation": "h", "x": 0.0, "y": below, "yanchor": "top", "len": min(1.0, x), "lenmode": "fraction",
                "title": {"text": value_name(kind, colour), "side": "right", "font": {"size": fonts.axis_title}}}
               if below is not None else {}),
        },
    }
