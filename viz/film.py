"""The training film's score curves: one head score of every layer × head against the training step.

`score_curves` draws one line per head, coloured by layer (one hue family per layer, the heads of a
layer told apart by lightness and dash), so a learner can watch a head's score rise as it learns
its job. The frame shown and the phase changes use the same markers as the loss curve
(viz.training: `FRAME_LINE`, `PHASE_LINE`). Layers and heads are numbered from 0, as in the Explore
tab's attention figures ("L1 H2" is layer 1, head 2 there too).

The scores travel as float64 typed arrays, so the figure JSON holds exactly the numbers given
(its size on the wire: bench/RESULTS.md).
"""

from __future__ import annotations

import colorsys
import math
import re
import textwrap
from collections.abc import Sequence

import numpy as np

from ._common import FONT, GRID_GREY, PRESENTATION_FONT_PX, TEXT_GREY, TRANSPARENT, empty_note, esc, hover_label
from .payload import FigureSpec
from .training import FRAME_LINE

# One hue per layer (degrees): blue, orange, green, purple, teal, brown-gold, red, olive; layers past
# the eighth reuse them. Magenta is left out: it is the selected query row's outline (ROW_OUTLINE).
LAYER_HUES = (212, 28, 135, 272, 180, 45, 0, 80)
HEAD_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
PHASE_SYMBOL = "diamond"
THRESHOLD_LINE = {"color": TEXT_GREY, "width": 1.5, "dash": "dash"}
_UNIT_PAD = 0.03  # a [0, 1] score axis runs from -0.03 to 1.03, so lines at 0 and 1 are not clipped
_ENTRY_PX, _ENTRY_PX_PRESENTING = 40, 56  # legend text width ("L0 H0")
_CHAR_EM = 0.6  # a subtitle character's width, in font sizes (the app's sans-serif, with room to spare)
_LAID_OUT_PX = 720  # the width the legend's rows are counted for


def head_colour(layer: int, head: int, n_heads: int) -> str:
    """The line colour of (layer, head): the layer's hue, the head's lightness (dark → light).

    Lightness stays within 38–68 % so every line reads on a light and on a dark page.
    """
    hue = LAYER_HUES[layer % len(LAYER_HUES)] / 360
    light = 0.38 + (0.30 * head / (n_heads - 1) if n_heads > 1 else 0.12)
    r, g, b = colorsys.hls_to_rgb(hue, light, 0.72)
    return "#{:02x}{:02x}{:02x}".format(*(round(c * 255) for c in (r, g, b)))


def head_name(layer: int, head: int) -> str:
    """Legend name of a head: "L1 H2"."""
    return f"L{layer} H{head}"


def _check_int(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value < high:
        raise ValueError(f"{name} must be a whole number in {low}..{high - 1}, got {value!r}")
    return int(value)


def _step_value(name: str, value) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value):
        raise ValueError(f"{name} must be a step number, got {value!r}")
    return int(value) if float(value).is_integer() else float(value)


def _score_at(steps: np.ndarray, series: np.ndarray, step: float) -> float:
    """The head's score at `step`: the frame's value, or interpolated between the nearest frames."""
    hit = np.nonzero(steps == step)[0]
    if hit.size:
        return float(series[hit[0]])
    ok = np.isfinite(series)
    if ok.sum() == 0 or step < steps[ok][0] or step > steps[ok][-1]:
        return math.nan
    return float(np.interp(step, steps[ok].astype(np.float64), series[ok]))


def score_curves(
    steps: np.ndarray,
    scores: np.ndarray,
    *,
    score: str,
    formula: str,
    threshold: float | None,
    marker_step: int | None = None,
    phases: Sequence[tuple[int, int, int]] = (),
    highlight: tuple[int, int] | None = None,
    presentation: bool = False,
    height_px: int = 320,
    total_steps: int | None = None,
    width_px: int | None = None,
) -> FigureSpec:
    """One head score of every head against the training step: one line per (layer, head).

    steps: (F,) the frames' training steps, increasing. scores: (F, L, H) the score of each head at
    each frame; NaN (undefined, e.g. induction on a text with no repeat) leaves a gap in the line.
    score: the score's name, e.g. "induction" or "entropy (bits)" (the y axis title and the hover);
    a name containing "entropy" gets an axis in bits from 0; otherwise scores within [0, 1] get a
    0 … 1 axis, others an axis from min(0, lowest) to the highest. formula: the definition, shown as
    the subtitle (plain text or Unicode, escaped, wrapped). threshold: a dashed horizontal line
    labelled "threshold 0.5" (None: no line). marker_step: a solid vertical line at the frame
    shown (`viz.training.FRAME_LINE`). phases: (layer, head, step) triples, drawn as a diamond in
    the head's colour on its curve at that step (the frame's value there, or interpolated between
    frames). highlight: (layer, head) drawn thicker, the other lines faded. presentation: large
    fonts (tick labels ≥ 16 px). height_px: the figure's height. total_steps: the x axis spans
    0 … total_steps (a run still training) instead of 0 … steps[-1]. width_px: the width the figure
    gets, if known (a phone's): the formula is wrapped to fit it.

    Hover reads "layer 1 · head 2 · step 340 · induction 0.62". layout.meta carries the heads'
    order, names and colours, the marker step and the phases (for a page or a test).
    Raises ValueError for inconsistent shapes or out-of-range layer, head or step arguments.
    """
    steps, scores = _checked_series(steps, scores)
    threshold = _checked_options(height_px, total_steps, threshold)
    _, n_layers, n_heads = scores.shape  # (F frames, L, H)
    steps = steps.astype(np.int64) if np.issubdtype(steps.dtype, np.integer) else steps.astype(np.float64)
    highlight, marker_step, checked_phases = _checked_marks(highlight, marker_step, phases, n_layers, n_heads)

    name = str(score)
    bits = "entropy" in name.lower()  # measured in bits from 0: its own axis (see _y_range) and title
    tick = PRESENTATION_FONT_PX if presentation else 11
    title_px = 20 if presentation else 13
    sub_px = PRESENTATION_FONT_PX if presentation else 11
    label = esc(name)  # the score's name goes into HTML (title, hover), so it is escaped once here
    colours = {(li, h): head_colour(li, h, n_heads) for li in range(n_layers) for h in range(n_heads)}

    data = _head_lines(steps, scores, highlight, colours, label)
    if checked_phases:  # the diamonds after the lines, so they are drawn over them
        data.append(_phase_trace(checked_phases, steps, scores, colours, label, presentation))
    y_range = _y_range(scores, bits, threshold)
    # to the run's end while it trains, else to the last frame; to 1 with no frame past 0 (never an empty range)
    last = float(steps[-1]) if steps.size else 0.0
    x_end = int(total_steps) if total_steps is not None else (steps[-1].item() if steps.size and last > 0 else 1)
    shapes, annotations = _marks(threshold, marker_step, bool(steps.size), tick)
    sub_lines = _formula_lines(formula, presentation, width_px, sub_px)  # wrapped to the width when it is known
    subtitle = "<br>".join(esc(line) for line in sub_lines)
    margin, axis_px = _margins(presentation, title_px, sub_px, len(sub_lines), len(data), tick)
    plot_px = max(40, height_px - margin["t"] - margin["b"])  # the legend's place below the axis is a fraction of it
    y_title = name if bits and "bit" in name.lower() else (f"{name} (bits)" if bits else name)  # "(bits)" unless said
    axis_common = {"showgrid": True, "gridcolor": GRID_GREY, "zeroline": False, "tickfont": {"size": tick},
                   "title": {"font": {"size": tick + 1}, "standoff": 4}}
    layout = {
        "template": "none",
        "paper_bgcolor": TRANSPARENT,
        "plot_bgcolor": TRANSPARENT,
        "font": {**FONT, "size": tick},
        "height": int(height_px),
        "margin": margin,
        "title": {"text": f"Head scores over training: {label}", "x": 0.01, "xanchor": "left",
                  "y": 1 - 8 / height_px, "yanchor": "top", "yref": "container", "font": {"size": title_px},
                  "subtitle": {"text": subtitle, "font": {"size": sub_px}}},
        "xaxis": {**axis_common, "title": {**axis_common["title"], "text": "step"}, "range": [0, x_end]},
        "yaxis": {**axis_common, "title": {**axis_common["title"], "text": esc(y_title)}, "range": y_range},
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": round(-axis_px / plot_px, 4),
                   "yanchor": "top", "font": {"size": tick},
                   "entrywidth": _ENTRY_PX_PRESENTING if presentation else _ENTRY_PX, "traceorder": "normal"},
        "showlegend": True,
        "hovermode": "closest",
        "hoverlabel": hover_label(18 if presentation else 12),
        "uirevision": "scores",  # a redraw for the next frame keeps the reader's zoom and hidden legend entries
        "meta": {  # heads in the order of the lines (layer by layer): these lists line up with `data`
            "viz": "score_curves",
            "score": name,
            "heads": [[li, h] for li in range(n_layers) for h in range(n_heads)],
            "names": [head_name(li, h) for li in range(n_layers) for h in range(n_heads)],
            "colours": [colours[li, h] for li in range(n_layers) for h in range(n_heads)],
            "threshold": threshold,
            "marker_step": marker_step,
            "phases": [list(p) for p in checked_phases],
            "highlight": None if highlight is None else list(highlight),
        },
    }
    if shapes:  # only when there is something to draw: an empty list would travel with every frame
        layout["shapes"] = shapes
    if annotations:
        layout["annotations"] = annotations
    return FigureSpec(data, layout)


def _checked_series(steps, scores) -> tuple[np.ndarray, np.ndarray]:
    """steps (F,) increasing numbers and scores (F, L, H) as float64, checked against each other."""
    steps = np.asarray(steps)
    scores = np.asarray(scores, dtype=np.float64)
    if steps.ndim != 1:
        raise ValueError(f"steps must be 1-D (frames,), got shape {steps.shape}")
    if scores.ndim != 3:
        raise ValueError(f"scores must be (frames, layers, heads), got shape {scores.shape}")
    if scores.shape[0] != steps.shape[0]:
        raise ValueError(f"scores have {scores.shape[0]} frames but {steps.shape[0]} steps were given")
    if steps.size and not np.issubdtype(steps.dtype, np.number):
        raise ValueError(f"steps must be numbers, got dtype {steps.dtype}")
    if steps.size > 1 and np.any(np.diff(steps.astype(np.float64)) <= 0):
        raise ValueError("steps must be increasing")
    if scores.shape[1] < 1 or scores.shape[2] < 1:
        raise ValueError(f"scores need at least one layer and one head, got shape {scores.shape}")
    return steps, scores


def _checked_options(height_px, total_steps, threshold) -> float | None:
    """The figure's height, the run's length and the threshold checked; the threshold as a float (or None)."""
    if isinstance(height_px, bool) or not isinstance(height_px, (int, np.integer)) or height_px < 120:
        raise ValueError(f"height_px must be a whole number of pixels ≥ 120, got {height_px!r}")
    if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, (int, np.integer))
                                    or total_steps < 1):
        raise ValueError(f"total_steps must be a whole number >= 1, got {total_steps!r}")
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)) \
                or not math.isfinite(threshold):
            raise ValueError(f"threshold must be a finite number or None, got {threshold!r}")
        threshold = float(threshold)
    return threshold


def _checked_marks(highlight, marker_step, phases, n_layers: int, n_heads: int
                   ) -> tuple[tuple[int, int] | None, int | float | None, list[tuple[int, int, int | float]]]:
    """The highlighted head, the frame's step and the (layer, head, step) phase changes, checked."""
    if highlight is not None:
        if not isinstance(highlight, (tuple, list)) or len(highlight) != 2:
            raise ValueError(f"highlight must be a (layer, head) pair, got {highlight!r}")
        highlight = (_check_int("highlight layer", highlight[0], 0, n_layers),
                     _check_int("highlight head", highlight[1], 0, n_heads))
    marker_step = None if marker_step is None else _step_value("marker_step", marker_step)
    checked_phases = []
    for item in phases:
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise ValueError(f"phases must hold (layer, head, step) triples, got {item!r}")
        checked_phases.append((_check_int("phase layer", item[0], 0, n_layers),
                               _check_int("phase head", item[1], 0, n_heads), _step_value("phase step", item[2])))
    return highlight, marker_step, checked_phases


def _head_lines(steps: np.ndarray, scores: np.ndarray, highlight: tuple[int, int] | None, colours: dict,
                label: str) -> list[dict]:
    """One line per (layer, head) in its colour and dash; the highlighted head thicker, the others faded."""
    n_frames, n_layers, n_heads = scores.shape
    data = []
    for li in range(n_layers):
        for h in range(n_heads):
            faded = highlight is not None and highlight != (li, h)
            strong = highlight == (li, h)
            data.append({
                "type": "scatter",
                "name": head_name(li, h),
                "x": steps,
                "y": np.ascontiguousarray(scores[:, li, h]),
                # a single frame, or a value between two gaps, shows as a dot
                "mode": "lines+markers" if n_frames == 1 else "lines",
                "connectgaps": False,
                "line": {"color": colours[li, h], "width": 3.5 if strong else 1.8,
                         "dash": HEAD_DASHES[h % len(HEAD_DASHES)]},
                "marker": {"color": colours[li, h], "size": 6},
                "opacity": 0.45 if faded else 1.0,
                "hovertemplate": f"layer {li} · head {h} · step %{{x}} · {label} %{{y:.2f}}<extra></extra>",
            })
    return data


def _phase_trace(checked_phases: list, steps: np.ndarray, scores: np.ndarray, colours: dict, label: str,
                 presentation: bool) -> dict:
    """The phase changes as diamonds in their heads' colours, on each curve at its step."""
    px, py, pc, ptext = [], [], [], []
    for li, h, step in checked_phases:
        value = _score_at(steps, scores[:, li, h], step)
        px.append(step)
        py.append(None if math.isnan(value) else value)
        pc.append(colours[li, h])
        ptext.append(f"layer {li} · head {h} · phase change around step {step}"
                     + ("" if math.isnan(value) else f" · {label} {value:.2f}"))
    return {
        "type": "scatter", "name": "phase", "mode": "markers", "x": px, "y": py,
        "marker": {"symbol": PHASE_SYMBOL, "size": 15 if presentation else 12, "color": pc,
                   "line": {"color": TEXT_GREY, "width": 1.5}},
        "hovertext": ptext, "hovertemplate": "%{hovertext}<extra></extra>", "cliponaxis": False,
    }


def _y_range(scores: np.ndarray, bits: bool, threshold: float | None) -> list[float]:
    """Entropy from 0 (bits); scores within [0, 1] on a fixed 0 … 1 axis; others from min(0, lowest) up."""
    finite = scores[np.isfinite(scores)]
    if bits:
        top = max(float(finite.max()) if finite.size else 0.0, threshold or 0.0)
        y_range = [0.0, top * 1.05 if top > 0 else 1.0]
    elif finite.size == 0 or (finite.min() >= 0 and finite.max() <= 1):
        y_range = [-_UNIT_PAD, 1 + _UNIT_PAD]
    else:
        lo = min(0.0, float(finite.min()), threshold if threshold is not None else 0.0)
        hi = max(float(finite.max()), threshold if threshold is not None else lo)
        pad = (hi - lo) * 0.04 or 1.0
        y_range = [lo - (pad if lo < 0 else 0), hi + pad]
    return y_range


def _marks(threshold: float | None, marker_step: int | float | None, has_frames: bool,
           tick: float) -> tuple[list[dict], list[dict]]:
    """(shapes, annotations): the threshold line and its label, the frame's line, the "no frames" note."""
    shapes, annotations = [], []
    if threshold is not None:
        shapes.append({"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": threshold,
                       "y1": threshold, "line": THRESHOLD_LINE, "layer": "below"})
        annotations.append({"x": 1, "y": threshold, "xref": "paper", "yref": "y", "xanchor": "right",
                            "yanchor": "bottom", "text": f"threshold {threshold:g}", "showarrow": False,
                            "font": {"size": tick, "color": TEXT_GREY}})
    if marker_step is not None:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": marker_step, "x1": marker_step,
                       "y0": 0, "y1": 1, "line": FRAME_LINE})
    if not has_frames:
        annotations.append(empty_note("no frames recorded yet"))
    return shapes, annotations


def _formula_lines(formula: str, presentation: bool, width_px: int | None, sub_px: float) -> list[str]:
    """The formula (plain text) wrapped to the width the figure gets, a comparison kept on one line."""
    wrap = 70 if presentation else 110
    if width_px is not None:
        if isinstance(width_px, bool) or not isinstance(width_px, (int, np.integer)) or width_px < 120:
            raise ValueError(f"width_px must be a whole number of pixels ≥ 120, got {width_px!r}")
        wrap = max(20, min(wrap, int((width_px - 30) / (sub_px * _CHAR_EM))))
    # "j < i−1" stays on one line: the spaces around a comparison do not break
    return textwrap.wrap(re.sub(r" ([<>≤≥=≠]) ", "\u00a0\\1\u00a0", str(formula)), wrap) or [""]


def _margins(presentation: bool, title_px: float, sub_px: float, n_sub_lines: int, n_items: int,
             tick: float) -> tuple[dict, int]:
    """The margins (the title and formula above, the axis and the legend below) and the axis' own height."""
    margin = {"l": 70 if presentation else 55, "r": 20 if presentation else 15,
              "t": math.ceil(8 + title_px * 1.25 + sub_px * (1.6 + 1.3 * n_sub_lines) + 4)}
    # the legend goes under the x axis; room for it is kept in the bottom margin for a figure
    # `_LAID_OUT_PX` wide (narrower pages: plotly pushes the margin further)
    item_px = 40 + (_ENTRY_PX_PRESENTING if presentation else _ENTRY_PX)
    per_row = max(1, int((_LAID_OUT_PX - margin["l"] - margin["r"]) // item_px))
    legend_px = math.ceil(n_items / per_row) * tick * 1.7 + 4
    axis_px = math.ceil(tick * 1.3 + (tick + 1) * 1.3 + 16)  # tick labels, the axis title, gaps
    margin["b"] = math.ceil(axis_px + legend_px)
    return margin, axis_px
