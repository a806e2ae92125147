"""Training curves: train and validation loss against the step, as a `FigureSpec`."""

from __future__ import annotations

import numpy as np

from ._common import FONT, GRID_GREY, TRANSPARENT, empty_note
from .payload import FigureSpec

TRAIN_COLOUR = "#2f6db5"
VAL_COLOUR = "#e4572e"


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
) -> FigureSpec:
    """Train (line) and validation (line + markers) cross-entropy loss against the training step.

    With no points yet the axes are drawn with a "waiting for first step" note; a single point is
    drawn as a marker. `total_steps`: the x axis spans the whole run (0 … total_steps) from the
    first update instead of growing with it. The y axis runs from 0 to just above the highest loss
    so far (the first steps', as a rule), so it stays still while the loss falls. `kept_step`: a
    dotted line at the step whose weights the model kept (the best validation loss).
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
    losses = np.concatenate([train, val])
    losses = losses[np.isfinite(losses)]
    top = float(losses.max()) * 1.05 if losses.size and losses.max() > 0 else 1.0
    layout = {
        "template": "none",
        "paper_bgcolor": TRANSPARENT,
        "plot_bgcolor": TRANSPARENT,
        "font": FONT,
        "height": 280,
        "margin": {"l": 55, "r": 15, "t": 36, "b": 42},
        "title": {"text": "Loss (cross-entropy, nats)", "x": 0.01, "xanchor": "left", "font": {"size": 13}},
        "xaxis": {"title": {"text": "step"}, "showgrid": True, "gridcolor": GRID_GREY, "zeroline": False,
                  "rangemode": "tozero"},
        "yaxis": {"title": {"text": "loss"}, "showgrid": True, "gridcolor": GRID_GREY, "zeroline": False,
                  "range": [0, top]},
        "legend": {"orientation": "h", "x": 1, "y": 1.0, "xanchor": "right", "yanchor": "bottom"},
        "showlegend": True,
        "hovermode": "x",
        "uirevision": "loss",
    }
    if total_steps is not None:
        layout["xaxis"]["range"] = [0, int(total_steps)]
    if kept_step is not None:
        layout["shapes"] = [{"type": "line", "xref": "x", "yref": "paper", "x0": kept_step, "x1": kept_step,
                             "y0": 0, "y1": 1, "line": {"color": VAL_COLOUR, "width": 1, "dash": "dot"}}]
        layout["annotations"] = [{"x": kept_step, "y": 1, "xref": "x", "yref": "paper", "yanchor": "bottom",
                                  "text": f"kept: step {int(kept_step)}", "showarrow": False,
                                  "font": {"size": 11, "color": VAL_COLOUR}}]
    if not steps.size and not val_steps.size:
        layout["xaxis"].setdefault("range", [0, 1])
        layout["yaxis"]["range"] = [0, 1]
        layout["annotations"] = [empty_note("waiting for first step")]
    return FigureSpec(data, layout)
