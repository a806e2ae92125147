"""Training curves: train and validation loss against the step, as a `FigureSpec`.

The training film (viz.film) shares its step markers: `FRAME_LINE`, the solid line at the frame
shown, and `PHASE_LINE`, the dotted lines at the steps where a head's score changed most."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._common import FONT, GRID_GREY, PRESENTATION_FONT_PX, TEXT_GREY, TRANSPARENT, empty_note, esc, hover_label
from .payload import FigureSpec

TRAIN_COLOUR = "#2f6db5"
VAL_COLOUR = "#e4572e"
# the frame of a training film being shown: a solid mid-grey line (reads on light and dark pages)
FRAME_LINE = {"color": TEXT_GREY, "width": 2}
# a phase change (the step where a head's score moved most): a dotted mid-grey line
PHASE_LINE = {"color": TEXT_GREY, "width": 1, "dash": "dot"}
_ASSUMED_PLOT_PX = 600  # width a step axis is assumed to get when keeping phase labels apart


def _check_step(name: str, value) -> int | float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value):
        raise ValueError(f"{name} must be a step number, got {value!r}")
    return int(value) if float(value).is_integer() else float(value)


def phase_rows(steps: list[float], span: float, label_px: list[float], plot_px: float = _ASSUMED_PLOT_PX) -> list[int]:
    """A text row (0, 1, 2, …) for each label at `steps` so that labels closer than their width
    on a `plot_px`-wide axis spanning `span` steps go on different rows (greedy, in step order)."""
    ends: list[float] = []  # per row: the x (in px) where its last label ends
    rows = []
    for step, width in zip(steps, label_px, strict=True):
        x = step / span * plot_px if span > 0 else 0.0
        row = next((r for r, end in enumerate(ends) if x >= end + 4), len(ends))
        if row == len(ends):
            ends.append(0.0)
        ends[row] = x + width
        rows.append(row)
    return rows


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
) -> FigureSpec:
    """Train (line) and validation (line + markers) cross-entropy loss against the training step.

    With no points yet the axes are drawn with a "waiting for first step" note; a single point is
    drawn as a marker. `total_steps`: the x axis spans the whole run (0 … total_steps) from the
    first update instead of growing with it. The y axis runs from 0 to just above the highest loss
    so far (the first steps', as a rule), so it stays still while the loss falls. `kept_step`: a
    dotted line at the step whose weights the model kept (the best validation loss).

    Training film (keyword-only): `marker_step` draws a solid vertical line (`FRAME_LINE`) at the
    frame shown; `phase_steps`, (step, label) pairs such as (340, "L1H2"), draw a dotted vertical
    line (`PHASE_LINE`) at each step, its short label (escaped) at the top of the plot, labels that
    would overlap put on rows below. presentation: large fonts (tick labels ≥ 16 px).
    """
    steps, train = _series("train", steps, train)
    if (val_steps is None) != (val is None):
        raise ValueError("give both val_steps and val, or neither")
    val_steps, val = _series("validation", val_steps, val)
    data = []
    if steps.size:
        data.append({"type": "scatter", "name": "train", "x": steps, "y": train,
                     "mode": "lines" if steps.size > 1 else "markers",
                     "line": {"color": TRAIN_COLOUR, "width": 1.5}, "marker": {"color": TRAIN_COLOUR, "size": 6},
                     "hovertemplate": "step %{x}: train loss %{y:.4f}<extra></extra>"})
    if val_steps.size:
        data.append({"type": "scatter", "name": "validation", "x": val_steps, "y": val, "mode": "lines+markers",
                     "line": {"color": VAL_COLOUR, "width": 1.5}, "marker": {"color": VAL_COLOUR, "size": 5},
                     "hovertemplate": "step %{x}: validation loss %{y:.4f}<extra></extra>"})
    if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, (int, np.integer))
                                    or total_steps < 1):
        raise ValueError(f"total_steps must be a whole number >= 1, got {total_steps!r}")
    marker_step = _check_step("marker_step", marker_step)
    phases = []
    for item in phase_steps:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError(f"phase_steps must hold (step, label) pairs, got {item!r}")
        phases.append((_check_step("phase step", item[0]), str(item[1])))
    phases.sort(key=lambda p: p[0])
    losses = np.concatenate([train, val])
    losses = losses[np.isfinite(losses)]
    top = float(losses.max()) * 1.05 if losses.size and losses.max() > 0 else 1.0
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
        "yaxis": {"title": {"text": "loss"}, "showgrid": True, "gridcolor": GRID_GREY, "zeroline": False,
                  "range": [0, top], "tickfont": axis_font},
        "legend": {"orientation": "h", "x": 1, "y": 1.0, "xanchor": "right", "yanchor": "bottom",
                   "font": {"size": tick}},
        "showlegend": True,
        "hovermode": "x",
        "hoverlabel": hover_label(18 if presentation else 12),
        "uirevision": "loss",
    }
    if total_steps is not None:
        layout["xaxis"]["range"] = [0, int(total_steps)]
    shapes, annotations = [], []
    if kept_step is not None:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": kept_step, "x1": kept_step,
                       "y0": 0, "y1": 1, "line": {"color": VAL_COLOUR, "width": 1, "dash": "dot"}})
        annotations.append({"x": kept_step, "y": 1, "xref": "x", "yref": "paper", "yanchor": "bottom",
                            "text": f"kept: step {int(kept_step)}", "showarrow": False,
                            "font": {"size": label_px, "color": VAL_COLOUR}})
    if phases:
        span = float(total_steps) if total_steps is not None else max(
            [float(steps.max()) if steps.size else 0.0, float(val_steps.max()) if val_steps.size else 0.0,
             *(p[0] for p in phases)])
        rows = phase_rows([p[0] for p in phases], span, [len(p[1]) * 0.6 * label_px + 6 for p in phases])
        for (step, label), row in zip(phases, rows, strict=True):
            shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": step, "x1": step, "y0": 0, "y1": 1,
                           "line": PHASE_LINE})
            annotations.append({"x": step, "y": 1, "xref": "x", "yref": "paper", "xanchor": "left",
                                "yanchor": "top", "xshift": 2, "yshift": -2 - row * label_px * 1.3,
                                "text": esc(label), "showarrow": False,
                                "font": {"size": label_px, "color": TEXT_GREY}})
    if marker_step is not None:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": marker_step, "x1": marker_step,
                       "y0": 0, "y1": 1, "line": FRAME_LINE})
    if shapes:
        layout["shapes"] = shapes
    if annotations:
        layout["annotations"] = annotations
    if not steps.size and not val_steps.size:
        layout["xaxis"].setdefault("range", [0, 1])
        layout["yaxis"]["range"] = [0, 1]
        layout["annotations"] = [empty_note("waiting for first step")]
    meta = {"viz": "loss", "marker_step": marker_step, "phase_steps": [[s_, lab] for s_, lab in phases]}
    layout["meta"] = meta
    return FigureSpec(data, layout)
