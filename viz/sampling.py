"""Next-token probability bars: the model's distribution and the one actually sampled from."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._common import (
    FONT,
    GRID_GREY,
    PRESENTATION_FONT_PX,
    TRANSPARENT,
    esc,
    hover_label,
    probability_text,
    short_token,
    text_width_em,
)
from .payload import FigureSpec

RAW_COLOUR = "#9db4d3"
ADJ_COLOUR = "#2f6db5"
CHOSEN_COLOUR = "#e4572e"  # the one highlight colour: the sampled token's bars, in either distribution
CHOSEN_RAW_COLOUR = CHOSEN_COLOUR  # kept for callers of the old name
MAX_HEIGHT_PX = 360
# the legend's names for the two series (the hover names them in full)
LEGEND = {"model probability": "model", "after temperature / top-k / top-p": "after sampling settings"}
LEGEND_ROOM_EM = 22  # the legend is on one line while its two names fit in this many em (the chart's plot area)
DEFAULT_TITLE = "Next-token probabilities"


def _check_probs(name: str, probs: np.ndarray, n: int) -> np.ndarray:
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 1:
        raise ValueError(f"{name} must be 1-D (vocabulary,), got shape {probs.shape}")
    if probs.shape[0] != n:
        raise ValueError(f"{name} has {probs.shape[0]} entries but {n} token pieces were given")
    return probs


def first_ranked(key: np.ndarray, tie: np.ndarray, k: int) -> np.ndarray:
    """The first k indices of `np.lexsort((-tie, -key))` (largest key first, ties by the larger tie, then
    by index), without sorting a whole vocabulary: only the entries at or above the k-th largest key are
    sorted, and they keep their index order, as the stable lexsort of them all does."""
    if k >= len(key):
        return np.lexsort((-tie, -key))[:k]
    kth = np.partition(-key, k - 1)[k - 1]
    near = np.flatnonzero(-key <= kth)  # ascending: ties keep the order the full sort gives them
    if len(near) < k:  # NaNs among the first k: the full sort places them
        return np.lexsort((-tie, -key))[:k]
    return near[np.lexsort((-tie[near], -key[near]))][:k]


def bar_layout(*, font: float, title_font: float, height: int, margin: dict, title: str, x_title: str, x_max: float,
               rows: list, ticktext: list[str], presentation: bool, legend: bool, meta: dict) -> dict:
    """The layout of a horizontal bar chart of token probabilities (one row per token, most likely
    on top, a legend above the bars): the next-token chart and the before / after comparisons."""
    return {
        "template": "none",
        "font": {**FONT, "size": font},
        "paper_bgcolor": TRANSPARENT,
        "plot_bgcolor": TRANSPARENT,
        "barmode": "group",
        "bargap": 0.25,
        "height": height,
        "margin": margin,
        "title": {"text": title, "x": 0.01, "xanchor": "left", "y": 1, "yanchor": "top", "yref": "container",
                  "pad": {"t": 8}, "font": {"size": title_font}},
        "xaxis": {"title": {"text": x_title, "standoff": 4}, "tickfont": {"size": font}, "range": [0, x_max * 1.05],
                  "showgrid": True, "gridcolor": GRID_GREY, "zeroline": False},
        "yaxis": {"tickmode": "array", "tickvals": rows, "ticktext": ticktext, "tickfont": {"size": font},
                  "autorange": "reversed", "showgrid": False, "ticks": ""},
        "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "xanchor": "left",
                   "font": {"size": font - 1}, "traceorder": "normal"},
        "hoverlabel": hover_label(18 if presentation else 12),
        "showlegend": legend,
        "hovermode": "closest",
        "meta": meta,
    }


def probabilities(
    pieces: Sequence[str],
    probs: np.ndarray,
    *,
    adjusted: np.ndarray | None = None,
    chosen: int | None = None,
    top: int = 15,
    title: str | None = None,
    presentation: bool = False,
    typed: bool = False,
    max_height_px: int = MAX_HEIGHT_PX,
) -> FigureSpec:
    """Horizontal bars of the `top` most likely next tokens (ranked by `adjusted` when given).

    probs: the model's softmax over the vocabulary. adjusted: the distribution after temperature /
    top-k / top-p, drawn next to it. chosen: vocabulary id of the sampled token; its bars take the
    one highlight colour (`CHOSEN_COLOUR`) and its label is marked "◀ chosen"; it is added as an
    extra row when outside the top. typed: the token at `chosen` was typed in the prompt, not
    sampled: its label reads "◀ typed" instead. pieces: display strings (whitespace already made visible by the
    caller). title: the chart's title, e.g. which step or token the distribution belongs to (plain
    text, escaped; default "Next-token probabilities"). presentation: large fonts (≥ 16 px).
    The chart is at most `max_height_px` tall: rows that would not fit at a legible size are left
    out (the chosen row always stays).
    """
    n = len(pieces)  # a whole vocabulary (GPT-2: 50,257): only the rows drawn are read
    probs = _check_probs("probs", probs, n)
    if adjusted is not None:  # without it the chart has one series, the model's own
        adjusted = _check_probs("adjusted", adjusted, n)
    if chosen is not None and not 0 <= int(chosen) < n:
        raise ValueError(f"chosen token id {chosen} is outside the vocabulary of {n} pieces")
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    font = PRESENTATION_FONT_PX if presentation else 11
    title_font = 20 if presentation else 13
    series = 2 if adjusted is not None else 1  # bars a row: the model's, and the adjusted one beside it
    pitch = max(font * 1.3, (9 if series == 1 else 8) * series + 6)  # px a row needs
    # the legend's two entries (short names: LEGEND) stay on one line, also at large fonts in the page's right
    # column, so that a projector's short chart still lists five candidates
    legend_em = sum(2.6 + 0.55 * len(name) for name in LEGEND.values())  # swatch, gap and name of each entry
    legend_px = font * 1.6 * (1 if legend_em <= LEGEND_ROOM_EM else 2) if series == 2 else 0
    margin = {"t": int(title_font * 1.6 + legend_px + 10), "b": int(font * 1.4 * 2 + 12)}
    rows_fit = max(1, int((max_height_px - margin["t"] - margin["b"]) // pitch))  # what the height limit leaves
    rank_by = adjusted if adjusted is not None else probs  # rows in the order of what is sampled from
    order = [int(i) for i in first_ranked(rank_by, probs, top)]  # ties: by model probability
    if chosen is not None and int(chosen) not in order[:rows_fit]:  # ranked below what fits: it takes the last row
        order = order[: rows_fit - 1] + [int(chosen)]
    order = order[:rows_fit]
    ids = np.array(order)  # vocabulary ids of the rows, top row first
    rows = np.arange(len(ids), dtype=np.int32)
    is_chosen = ids == (-1 if chosen is None else int(chosen))  # (rows,); -1 is no id: nothing chosen
    shown = {int(i): str(pieces[i]) for i in ids}  # the rows drawn, as strings
    labels = [short_token(shown[i], 16) for i in ids]
    mark = "◀ typed" if typed else "◀ chosen"
    ticktext = [f"<b>{lab}  {mark}</b>" if c else lab for lab, c in zip(labels, is_chosen, strict=True)]
    hover_names = [f'"{esc(shown[i])}" (id {i})' for i in ids]
    # the widest label sets the left margin; the chosen row's mark takes 6.5 em more
    label_em = max(text_width_em(shown[i][:16]) + (6.5 if c else 0) for i, c in zip(ids, is_chosen, strict=True))

    def bars(values: np.ndarray, name: str, colour: str) -> dict:
        colours = [CHOSEN_COLOUR if c else colour for c in is_chosen]  # the chosen token stands out in both
        return {
            "type": "bar",
            "orientation": "h",
            "name": name,
            "x": values[ids].astype(np.float32),  # only the drawn rows leave the server, not the vocabulary
            "y": rows,
            "marker": {"color": colours},
            "hovertext": hover_names,
            "customdata": [probability_text(values[i]) for i in ids],  # 4.9e-4, never 0.0000
            "hovertemplate": f"%{{hovertext}}<br>{name}: %{{customdata}}<extra></extra>",
        }

    data = [bars(probs, "model probability", RAW_COLOUR)]
    if adjusted is not None:
        data.append(bars(adjusted, "after temperature / top-k / top-p", ADJ_COLOUR))
        # plotly.js draws a legend swatch in a bar trace's first colour, which may be the highlight:
        # the legend comes from two empty marker traces in the series colours instead
        for trace in data[:2]:
            trace["showlegend"] = False
        data += [{"type": "scatter", "mode": "markers", "x": [None], "y": [None], "name": LEGEND[trace["name"]],
                  "marker": {"color": colour, "symbol": "square", "size": 10}, "hoverinfo": "skip"}
                 for trace, colour in zip(data[:2], (RAW_COLOUR, ADJ_COLOUR), strict=True)]
    height = min(max_height_px, int(margin["t"] + margin["b"] + pitch * len(ids) + 8))
    margin.update(l=int(min(300, max(60, label_em * font + 14))), r=20)  # labels' room, capped for long pieces
    # the axis ends past the longest bar of either series (never at 0: a row of zeros still gets an axis)
    layout = bar_layout(font=font, title_font=title_font, height=height, margin=margin,
                        title=esc(title) if title else DEFAULT_TITLE, x_title="probability",  # "" also gets the default
                        x_max=max(1e-9, float(rank_by[ids].max()), float(probs[ids].max())), rows=rows.tolist(),
                        ticktext=ticktext, presentation=presentation, legend=adjusted is not None,
                        meta={"viz": "probabilities", "ids": [int(i) for i in ids],
                              "chosen": None if chosen is None else int(chosen)})
    return FigureSpec(data, layout)
