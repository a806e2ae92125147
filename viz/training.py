"""Training curves: train and validation loss against the step, as a `FigureSpec`.

The training film (viz.film) shares its step markers: `FRAME_LINE`, the solid line at the frame
shown, and `PHASE_LINE`, the dotted lines at the steps where a head's score changed most."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from ._common import (
    FONT, GRID_GREY, PRESENTATION_FONT_PX, TEXT_GREY, TRANSPARENT, empty_note, esc, hover_label, text_width_em,
)
from .payload import FigureSpec

TRAIN_COLOUR = "#2f6db5"
VAL_COLOUR = "#e4572e"
# the frame of a training film being shown: a solid mid-grey line (reads on light and dark pages)
FRAME_LINE = {"color": TEXT_GREY, "width": 2}
# a phase change (the step where a head's score moved most): a dotted mid-grey line
PHASE_LINE = {"color": TEXT_GREY, "width": 1, "dash": "dot"}
ASSUMED_PLOT_PX = 560  # width a step axis is assumed to get when keeping phase labels apart (callers may say)
LABEL_GAP_PX = 6  # the least room between a phase label and another label or line
LABEL_PAD_PX = 4  # a label's width beyond its characters
CHAR_EM = 0.62  # a label character's width, in font sizes (the app's sans-serif: digits and capitals)
LINE_EM = 1.3  # a label line's height, in font sizes
LOG_RATIO = 30  # a loss whose highest value is more than this many times its lowest gets a log axis
_HEAD_NAME = re.compile(r"L(\d+)H(\d+)")


def _check_step(name: str, value) -> int | float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value):
        raise ValueError(f"{name} must be a step number, got {value!r}")
    return int(value) if float(value).is_integer() else float(value)


def _grouped(labels: list[str]) -> list[str]:
    """The lines of one phase label: head names "L1H2" grouped by layer ("L1: H0, H2"; one head: "L1H2"),
    other labels as they are."""
    heads: dict[int, list[int]] = {}
    other = []
    for label in labels:
        m = _HEAD_NAME.fullmatch(label)
        if m:
            heads.setdefault(int(m[1]), []).append(int(m[2]))
        elif label not in other:
            other.append(label)
    lines = [f"L{layer}H{hs[0]}" if len(set(hs)) == 1 else f"L{layer}: " + ", ".join(f"H{h}" for h in sorted(set(hs)))
             for layer, hs in sorted(heads.items())]
    return lines + other


def phase_labels(phases: Sequence[tuple[float, str]], span: float, char_px: float,
                 plot_px: float = ASSUMED_PLOT_PX) -> list[dict]:
    """Where the labels of phase lines go on a `plot_px`-wide step axis spanning `span` steps, so that none
    overlaps another and no phase line crosses one.

    Phases (step, label), in step order, whose labels would touch are one cluster: its label (its heads
    grouped by layer, one line per layer) sits just right of its last line, and the next cluster's first
    line lies past the label's end. The last label, when it would run past the plot's right edge, sits
    left of its cluster's first line instead (the cluster before joining it while that gap is too
    narrow), on a row below a label it would meet; one that fits on neither side (one cluster spanning
    the whole axis: a narrow plot, many heads) ends at the plot's right edge, where its own lines may
    cross it. Returns per cluster: steps (its lines), lines (its text), x (the step
    the label is anchored to; None at the edge), side ("left": the label starts at x, "right": it ends
    there, "edge"), left and right (its extent in px from the axis start), row (0 = the top).
    """
    def px(step: float) -> float:  # a run of one step: every line at the axis start
        return step / span * plot_px if span > 0 else 0.0

    def width(lines: list[str]) -> float:  # px: a label of several lines is as wide as its longest
        return max(len(t) for t in lines) * char_px + LABEL_PAD_PX

    clusters: list[dict] = []
    for step, label in phases:
        last = clusters[-1] if clusters else None
        # a line that would fall under the label before it joins that label's cluster
        if last is not None and px(step) < px(last["steps"][-1]) + LABEL_GAP_PX + width(_grouped(last["labels"])):
            last["steps"].append(step)
            last["labels"].append(label)
        else:
            clusters.append({"steps": [step], "labels": [label]})
    # Only the last cluster can lack room on its right (each other one has its label's width before the
    # next line). It then goes left of its first line; where that gap is too narrow too, the cluster
    # before it joins it, until the gap is wide enough (or none is left).
    last = clusters[-1] if clusters else None
    while (last is not None and px(last["steps"][-1]) + LABEL_GAP_PX / 2 + width(_grouped(last["labels"])) > plot_px
           and len(clusters) > 1
           and px(last["steps"][0]) - px(clusters[-2]["steps"][-1]) < LABEL_GAP_PX + width(_grouped(last["labels"]))):
        before = clusters.pop(-2)
        last["steps"], last["labels"] = before["steps"] + last["steps"], before["labels"] + last["labels"]
    placed: list[dict] = []
    for c in clusters:
        lines = _grouped(c["labels"])
        w = width(lines)
        # px where a label would start right of the last line, or end left of the first one
        start, end = px(c["steps"][-1]) + LABEL_GAP_PX / 2, px(c["steps"][0]) - LABEL_GAP_PX / 2
        if start + w <= plot_px:  # as a rule: right of its last line, reading on from it
            item = dict(steps=c["steps"], lines=lines, x=c["steps"][-1], side="left", left=start, right=start + w)
        elif end - w >= 0:  # the last cluster, near the right edge: ending at its first line
            item = dict(steps=c["steps"], lines=lines, x=c["steps"][0], side="right", left=end - w, right=end)
        else:  # one cluster spanning the whole axis (a narrow plot, many heads): against the plot's right edge
            item = dict(steps=c["steps"], lines=lines, x=None, side="edge", left=plot_px - w, right=plot_px)
        # a row below every earlier label this one would meet (only the last, left of its lines, can meet one)
        taken = {p["row"] + k for p in placed for k in range(len(p["lines"]))
                 if p["left"] < item["right"] and item["left"] < p["right"]}
        row = 0  # the highest rows free for all its lines
        while any(r in taken for r in range(row, row + len(lines))):
            row += 1
        item["row"] = row
        placed.append(item)
    return placed


def _series(name: str, x: np.ndarray | None, y: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    x = np.zeros(0) if x is None else np.asarray(x)
    y = np.zeros(0) if y is None else np.asarray(y, dtype=np.float32)
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError(f"{name} steps and losses must be 1-D, got shapes {x.shape} and {y.shape}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{name} loss has {y.shape[0]} values but {x.shape[0]} steps were given")
    return x.astype(np.int64 if np.issubdtype(x.dtype, np.integer) else np.float32), y


def loss_curve(
    steps: np.ndarray,
    train: np.ndarray,
    val_steps: np.ndarray | None = None,
    val: np.ndarray | None = None,
    total_steps: int | None = None,
    kept_step: int | None = None,
    *,
    marker_step: int | None = None,
    phase_steps: Sequence[tuple[int, str]] = (),
    presentation: bool = False,
    plot_px: float = ASSUMED_PLOT_PX,
    log_y: bool | None = None, names: tuple[str, str] = ("train", "validation"),
) -> FigureSpec:
    """Train (line) and validation (line + markers) cross-entropy loss against the training step.

    With no points yet the axes are drawn with a "waiting for first step" note; a single point is
    drawn as a marker. `total_steps`: the x axis spans the whole run (0 … total_steps) from the
    first update instead of growing with it. The y axis runs from 0 to just above the highest loss
    so far (the first steps', as a rule), so it stays still while the loss falls. `kept_step`: a
    dotted line at the step whose weights the model kept (the best validation loss).

    log_y: a log-scale loss axis, titled "loss (log scale)"; None (the default) chooses it when the
    highest loss is more than LOG_RATIO times the lowest (a linear axis would squeeze the rest of the
    run into its bottom few pixels). Its bottom is the power of ten below the lowest loss, so it moves
    only when the loss falls past one.

    Training film (keyword-only): `marker_step` draws a solid vertical line (`FRAME_LINE`) at the
    frame shown; `phase_steps`, (step, label) pairs such as (340, "L1H2"), draw a dotted vertical
    line (`PHASE_LINE`) at each step and their labels (escaped) at the top of the plot, placed by
    `phase_labels` for a plot `plot_px` wide so that none overlaps another or is crossed by a line.
    presentation: large fonts (tick labels ≥ 16 px). names: the two lines' names (legend and hover).
    """
    steps, train = _series("train", steps, train)
    if (val_steps is None) != (val is None):  # steps without losses (or the reverse) cannot be drawn
        raise ValueError("give both val_steps and val, or neither")
    val_steps, val = _series("validation", val_steps, val)  # None becomes an empty series, drawn as nothing
    data = _loss_traces(steps, train, val_steps, val, names)
    if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, (int, np.integer))
                                    or total_steps < 1):
        raise ValueError(f"total_steps must be a whole number >= 1, got {total_steps!r}")
    marker_step = _check_step("marker_step", marker_step)
    phases = _checked_phases(phase_steps)
    top, log_y, log_bottom = _loss_range(np.concatenate([train, val]), log_y)  # one range for both curves
    if isinstance(plot_px, bool) or not isinstance(plot_px, (int, float, np.integer, np.floating)) \
            or not math.isfinite(plot_px) or plot_px < 50:  # it lays out the legend row and the phase labels
        raise ValueError(f"plot_px must be a width in pixels ≥ 50, got {plot_px!r}")
    tick = PRESENTATION_FONT_PX if presentation else 11
    title_px = 20 if presentation else 13
    label_px = 15 if presentation else 11
    axis_font = {"size": tick}
    layout = {
        "template": "none",
        "paper_bgcolor": TRANSPARENT,
        "plot_bgcolor": TRANSPARENT,
        "font": {**FONT, "size": tick},
        "height": 340 if presentation else 280,
        "margin": ({"l": 70, "r": 20, "t": 50, "b": 56} if presentation else {"l": 55, "r": 15, "t": 36, "b": 42}),
        "title": {"text": "Loss (cross-entropy, nats)", "x": 0.01, "xanchor": "left", "font": {"size": title_px}},
        "xaxis": {"title": {"text": "step"}, "showgrid": True, "gridcolor": GRID_GREY, "zeroline": False,
                  "rangemode": "tozero", "tickfont": axis_font},
        "yaxis": {"title": {"text": "loss (log scale)" if log_y else "loss"}, "showgrid": True,
                  "gridcolor": GRID_GREY, "zeroline": False, "tickfont": axis_font,
                  **({"type": "log", "exponentformat": "power",  # 10⁻⁴, not plotly's SI "100µ"
                      "range": [log_bottom, math.log10(top)]}
                     if log_y else {"range": [0, top]})},  # linear: from 0, the fall a share of the start
        "legend": {"orientation": "h", "x": 1, "y": 1.0, "xanchor": "right", "yanchor": "bottom",
                   "font": {"size": tick}},
        "showlegend": True,
        "hovermode": "x",  # one hover for the step under the pointer, naming both curves there
        "hoverlabel": hover_label(18 if presentation else 12),
        "uirevision": "loss",  # each new point redraws the figure; the reader's zoom survives it
    }
    if total_steps is not None:  # the whole run from the first step: the curve grows into a still axis
        layout["xaxis"]["range"] = [0, int(total_steps)]
    _legend_row(layout, names, tick, title_px, plot_px)
    shapes, annotations = _kept_marks(kept_step, label_px)  # empty lists without a kept step
    if phases:  # labels are placed on the axis as drawn: the whole run, else up to the furthest step or phase
        span = float(total_steps) if total_steps is not None else max(
            [float(steps.max()) if steps.size else 0.0, float(val_steps.max()) if val_steps.size else 0.0,
             *(p[0] for p in phases)])
        phase_shapes, phase_notes = _phase_marks(phases, span, label_px, plot_px)
        shapes += phase_shapes
        annotations += phase_notes
    if marker_step is not None:  # the training film's frame
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": marker_step, "x1": marker_step,
                       "y0": 0, "y1": 1, "line": FRAME_LINE})
    if shapes:  # only set when there is something to draw
        layout["shapes"] = shapes
    if annotations:
        layout["annotations"] = annotations
    if not steps.size and not val_steps.size:  # nothing yet: still axes under a note, not plotly's empty default
        layout["xaxis"].setdefault("range", [0, 1])  # the run's length where it is known
        layout["yaxis"]["range"] = [0, 1]
        layout["annotations"] = [empty_note("waiting for first step")]
    meta = {"viz": "loss", "marker_step": marker_step, "phase_steps": [[s_, lab] for s_, lab in phases],
            "log_y": log_y}
    layout["meta"] = meta
    return FigureSpec(data, layout)

def _legend_row(layout: dict, names: tuple[str, str], tick: float, title_px: float, plot_px: float) -> None:
    """The legend sits at the top right, the title at the top left: long names (a series film's) that would
    run into the title on a narrow plot get a row of their own under it."""
    legend_px = sum(text_width_em(n) + 4 for n in names) * tick
    if legend_px + text_width_em(layout["title"]["text"]) * title_px > plot_px:
        layout["margin"]["t"] += math.ceil(tick * 1.6)
        layout["title"].update(y=1, yref="container", yanchor="top", pad={"t": 6})


def _loss_traces(steps: np.ndarray, train: np.ndarray, val_steps: np.ndarray, val: np.ndarray,
                 names: tuple[str, str] = ("train", "validation")) -> list[dict]:
    """The train line (a marker while there is one point) and the validation line with markers."""
    data = []
    first, second = (str(n) for n in names)
    hover = [n if "loss" in n else f"{n} loss" for n in (first, second)]
    if steps.size:
        data.append({"type": "scatter", "name": first, "x": steps, "y": train,
                     "mode": "lines" if steps.size > 1 else "markers",
                     "line": {"color": TRAIN_COLOUR, "width": 1.5}, "marker": {"color": TRAIN_COLOUR, "size": 6},
                     "hovertemplate": f"step %{{x}}: {hover[0]} %{{y:.4f}}<extra></extra>"})
    if val_steps.size:
        data.append({"type": "scatter", "name": second, "x": val_steps, "y": val, "mode": "lines+markers",
                     "line": {"color": VAL_COLOUR, "width": 1.5}, "marker": {"color": VAL_COLOUR, "size": 5},
                     "hovertemplate": f"step %{{x}}: {hover[1]} %{{y:.4f}}<extra></extra>"})
    return data


def _loss_range(losses: np.ndarray, log_y: bool | None) -> tuple[float, bool, int | None]:
    """(top of the y axis, whether it is a log axis, its bottom power of ten) for these losses."""
    losses = losses[np.isfinite(losses)]
    top = float(losses.max()) * 1.05 if losses.size and losses.max() > 0 else 1.0
    positive = losses[losses > 0]
    if log_y is None:
        log_y = bool(positive.size) and float(positive.max()) > LOG_RATIO * float(positive.min())
    log_y = bool(log_y) and positive.size > 0  # a log axis needs a positive loss
    return top, log_y, math.floor(math.log10(float(positive.min()))) if log_y else None


def _checked_phases(phase_steps: Sequence[tuple[int, str]]) -> list[tuple[int | float, str]]:
    """(step, label) pairs checked, labels as text, in step order."""
    phases = []
    for item in phase_steps:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError(f"phase_steps must hold (step, label) pairs, got {item!r}")
        phases.append((_check_step("phase step", item[0]), str(item[1])))
    phases.sort(key=lambda p: p[0])
    return phases


def _kept_marks(kept_step: int | None, label_px: float) -> tuple[list[dict], list[dict]]:
    """(shapes, annotations): a dotted line and "kept: step N" at the step whose weights were kept."""
    if kept_step is None:
        return [], []
    return ([{"type": "line", "xref": "x", "yref": "paper", "x0": kept_step, "x1": kept_step,
              "y0": 0, "y1": 1, "line": {"color": VAL_COLOUR, "width": 1, "dash": "dot"}}],
            [{"x": kept_step, "y": 1, "xref": "x", "yref": "paper", "yanchor": "bottom",
              "text": f"kept: step {int(kept_step)}", "showarrow": False,
              "font": {"size": label_px, "color": VAL_COLOUR}}])


def _phase_marks(phases: list[tuple[int | float, str]], span: float, label_px: float,
                 plot_px: float) -> tuple[list[dict], list[dict]]:
    """(shapes, annotations): a dotted line at each phase change and its label, placed by `phase_labels`."""
    shapes, annotations = [], []
    for step, _ in phases:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": step, "x1": step, "y0": 0, "y1": 1,
                       "line": PHASE_LINE})
    for item in phase_labels(phases, span, CHAR_EM * label_px, plot_px):
        side = item["side"]
        edge = side == "edge"
        annotations.append({"x": 1 if edge else item["x"], "y": 1, "xref": "paper" if edge else "x",
                            "yref": "paper", "xanchor": "right" if edge else side,
                            "yanchor": "top", "align": "left" if side == "left" else "right",
                            "xshift": {"left": LABEL_GAP_PX / 2, "right": -LABEL_GAP_PX / 2}.get(side, 0),
                            "yshift": -2 - item["row"] * label_px * LINE_EM,
                            "text": "<br>".join(esc(t) for t in item["lines"]), "showarrow": False,
                            "font": {"size": label_px, "color": TEXT_GREY}})
    return shapes, annotations
