"""Next-token probability bars: the model's distribution and the one actually sampled from."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._common import FONT, esc, short_token
from .payload import FigureSpec

RAW_COLOUR = "#9db4d3"
ADJ_COLOUR = "#2f6db5"
CHOSEN_COLOUR = "#e4572e"
CHOSEN_RAW_COLOUR = "#f2a58f"  # lighter orange: the chosen token's bar in the model distribution


def _check_probs(name: str, probs: np.ndarray, n: int) -> np.ndarray:
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 1:
        raise ValueError(f"{name} must be 1-D (vocabulary,), got shape {probs.shape}")
    if probs.shape[0] != n:
        raise ValueError(f"{name} has {probs.shape[0]} entries but {n} token pieces were given")
    return probs


def probabilities(
    pieces: Sequence[str],
    probs: np.ndarray,
    *,
    adjusted: np.ndarray | None = None,
    chosen: int | None = None,
    top: int = 15,
) -> FigureSpec:
    """Horizontal bars of the `top` most likely next tokens (ranked by `adjusted` when given).

    probs: the model's softmax over the vocabulary. adjusted: the distribution after temperature /
    top-k / top-p, drawn next to it. chosen: vocabulary id of the sampled token; its bars are
    orange and its label marked "◀ chosen"; it is added as an extra row when outside the top.
    pieces: display strings (whitespace already made visible by the caller).
    """
    pieces = [str(p) for p in pieces]
    n = len(pieces)
    probs = _check_probs("probs", probs, n)
    if adjusted is not None:
        adjusted = _check_probs("adjusted", adjusted, n)
    if chosen is not None and not 0 <= int(chosen) < n:
        raise ValueError(f"chosen token id {chosen} is outside the vocabulary of {n} pieces")
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    rank_by = adjusted if adjusted is not None else probs
    order = [int(i) for i in np.lexsort((-probs, -rank_by))[:top]]  # ties: by model probability
    if chosen is not None and int(chosen) not in order:
        order.append(int(chosen))
    ids = np.array(order)
    rows = np.arange(len(ids), dtype=np.int32)
    is_chosen = ids == (-1 if chosen is None else int(chosen))
    labels = [short_token(pieces[i], 16) for i in ids]
    ticktext = [f"<b>{lab}  ◀ chosen</b>" if c else lab for lab, c in zip(labels, is_chosen, strict=True)]
    hover_names = [f'"{esc(pieces[i])}" (id {i})' for i in ids]

    def bars(values: np.ndarray, name: str, colour: str, chosen_colour: str) -> dict:
        colours = [chosen_colour if c else colour for c in is_chosen]
        return {
            "type": "bar",
            "orientation": "h",
            "name": name,
            "x": values[ids].astype(np.float32),
            "y": rows,
            "marker": {"color": colours},
            "hovertext": hover_names,
            "hovertemplate": f"%{{hovertext}}<br>{name}: %{{x:.4f}}<extra></extra>",
        }

    data = [bars(probs, "model probability", RAW_COLOUR, CHOSEN_RAW_COLOUR if adjusted is not None else CHOSEN_COLOUR)]
    if adjusted is not None:
        data.append(bars(adjusted, "after temperature / top-k / top-p", ADJ_COLOUR, CHOSEN_COLOUR))
    height = 90 + 22 * len(ids) * (2 if adjusted is not None else 1) ** 0.5
    layout = {
        "template": "none",
        "font": FONT,
        "barmode": "group",
        "bargap": 0.25,
        "height": int(height),
        "margin": {"l": 150, "r": 20, "t": 40, "b": 40},
        "title": {"text": "Next-token probabilities", "x": 0.01, "xanchor": "left", "font": {"size": 13}},
        "xaxis": {"title": {"text": "probability"}, "range": [0, max(1e-9, float(rank_by[ids].max()),
                                                                     float(probs[ids].max())) * 1.05],
                  "showgrid": True, "gridcolor": "#eee", "zeroline": False},
        "yaxis": {"tickmode": "array", "tickvals": rows.tolist(), "ticktext": ticktext,
                  "autorange": "reversed", "showgrid": False, "ticks": ""},
        "legend": {"orientation": "h", "x": 1, "y": 1.0, "yanchor": "bottom", "xanchor": "right",
                   "font": {"size": 10}, "traceorder": "normal"},
        "showlegend": adjusted is not None,
        "hovermode": "closest",
    }
    return FigureSpec(data, layout)
