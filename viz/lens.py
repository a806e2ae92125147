"""The logit lens: the top next-token candidates read out after every layer.

`lens_grid` draws one row per read-out (the embedding, then after each block; the last row is the
model's own output) and one column per rank; the model's final choice is bold and outlined, so a
learner sees in which layer the answer appears. Probabilities are on `SEQUENTIAL` (Viridis);
token pieces and labels are escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ._common import (
    EXPORT_BAR_PX,
    MARK_INSET,
    MARK_LINES,
    PRESENTATION_FONT_PX,
    SEQUENTIAL,
    TRANSPARENT,
    check_flag,
    check_width,
    esc,
    hover_label,
    layout_frame,
    nice_ticks,
    probability_text,
    short_token,
    text_width_em,
    tick_label,
    title_text,
    wrap_parts,
    wrapped,
)
from .payload import FigureSpec


def lens_grid(
    probs: np.ndarray,
    pieces: Sequence[str],
    *,
    top: int = 5,
    row_labels: Sequence[str] | None = None,
    final: int | None = None,
    presentation: bool = False,
    width_px: int | None = None,
    title: str | None = None,
) -> FigureSpec:
    """The logit lens: the `top` next-token candidates read out after every layer, one row each.

    probs: (R, V) next-token distributions; row r is read out after layer r − 1 (row 0 after the
    embedding, the last row is the model's own output). pieces: the V display strings. row_labels:
    R strings (default "embedding", "after layer 0", …, the last marked "(output)"). The rows run
    downwards as the prediction forms (embedding at the top); columns are ranks 1..top; a cell's
    colour is its probability (Viridis on [0, 1]) and its text the token piece (shortened, escaped).
    final: the vocabulary id the model itself ranks first (default: the last row's argmax); every
    cell holding it is bold and outlined, so a learner sees in which layer the answer appears.
    width_px: the width laid out for (long pieces are shortened to fit their cell; default 720).
    Hover: "after layer 1 · rank 2: 'tom' 0.213". layout.meta holds the ids shown per row.
    Raises ValueError for inconsistent shapes or an out-of-range `final` or `top`.
    """
    check_flag("presentation", presentation)
    check_width(width_px)
    probs, pieces, row_labels, top, final = _checked(probs, pieces, row_labels, top, final)
    n_rows = probs.shape[0]  # R read-outs: the embedding, then one after each block

    tick = PRESENTATION_FONT_PX if presentation else 11
    title_px = 20 if presentation else 13
    cell_h = 38 if presentation else 26
    order = np.argsort(-probs, axis=1, kind="stable")[:, :top]  # (R, top), ties: lower id first
    values = np.take_along_axis(probs, order, axis=1)  # (R, top), largest first
    laid = width_px or 720
    left = math.ceil(max(text_width_em(r) for r in row_labels) * tick + 14)  # the widest row label
    # the colour bar at the right: gap, bar, tick labels and its title
    right = math.ceil(14 + (18 if presentation else 12) + 6 + 3 * tick + (17 if presentation else 11) * 1.4 + 10)
    cell_px = (laid - left - right) / top  # one column per rank shares what the margins leave
    limit = max(4, min(16, int((cell_px - 8) / (0.6 * tick))))  # a piece cut to what its cell holds
    safe_labels = [esc(r) for r in row_labels]
    text, hover, outlined = _cells(order, values, pieces, final, limit, safe_labels)
    first = next((r for r in range(n_rows) if final in order[r]), None)  # where the answer appears; None: nowhere
    sub_px = PRESENTATION_FONT_PX if presentation else 11
    # the subtitle says what the outline marks, and where the answer first appears (or that it never does)
    note = wrap_parts([f"bold, outlined = the model's final top token '{esc(pieces[final])}'",
                       f"first in the top {top}: {safe_labels[first]}" if first is not None
                       else f"in no row's top {top}"], sub_px, laid - 20, "; ")
    heading = wrapped(title_text(title, "Logit lens: the next-token guess after every layer"), (laid - 20) / title_px)
    # top: the (wrapped) title, the (wrapped) note, then the rank labels over the columns
    margin = {"l": left, "r": right, "b": EXPORT_BAR_PX,
              "t": math.ceil(8 + title_px * (1.25 + 1.3 * heading.count("<br>"))
                             + sub_px * (1.6 + 1.3 * (note.count("<br>") + 1)) + 6 + tick * 1.4 + 6)}
    height = math.ceil(margin["t"] + margin["b"] + n_rows * cell_h)
    ticks = nice_ticks(0.0, 1.0, 5)
    # columns start at x = 1 so the axis reads in ranks; rows at y = 0, the embedding on top (reversed axis below)
    trace = {
        "type": "heatmap", "z": values, "x0": 1, "dx": 1, "y0": 0, "dy": 1, "zmin": 0.0, "zmax": 1.0,
        "colorscale": SEQUENTIAL, "xgap": 2, "ygap": 2, "text": text, "texttemplate": "%{text}",
        "textfont": {"size": tick}, "hovertext": hover, "hovertemplate": "%{hovertext}<extra></extra>",
        "colorbar": {"title": {"text": "probability", "side": "right", "font": {"size": tick}},
                     "tickmode": "array", "tickvals": ticks.tolist(), "ticktext": [tick_label(v) for v in ticks],
                     "tickfont": {"size": tick}, "thickness": 18 if presentation else 12, "outlinewidth": 0,
                     "len": 1.0},
    }
    # an outline just inside each cell holding the final token, a little wider than tall, like the cells
    shapes = [{"type": "rect", "xref": "x", "yref": "y", "x0": k + 1 - MARK_INSET - 0.1,
               "x1": k + 1 + MARK_INSET + 0.1, "y0": r - MARK_INSET, "y1": r + MARK_INSET, "line": dict(line),
               "fillcolor": TRANSPARENT, "layer": "above"} for r, k in outlined for line in MARK_LINES]
    layout = {
        **layout_frame(font_px=tick, height=height, margin=margin, title=heading, title_px=title_px, subtitle=note,
                       subtitle_px=sub_px),
        "xaxis": {"side": "top", "range": [0.5, top + 0.5], "tickmode": "array", "tickvals": list(range(1, top + 1)),
                  # "rank 3" where it fits over its column, else "#3" (a phone)
                  "ticktext": [f"rank {k}" if cell_px >= 0.6 * tick * len(f"rank {top}") + 10 else f"#{k}"
                               for k in range(1, top + 1)], "tickfont": {"size": tick},
                  "showgrid": False, "zeroline": False, "ticks": "", "fixedrange": True},
        "yaxis": {"range": [n_rows - 0.5, -0.5], "tickmode": "array", "tickvals": list(range(n_rows)),
                  "ticktext": safe_labels, "tickfont": {"size": tick}, "showgrid": False, "zeroline": False,
                  "ticks": "", "fixedrange": True},
        "hoverlabel": hover_label(18 if presentation else 12),
        "hovermode": "closest",
        "uirevision": "logit_lens",
        "meta": {"viz": "logit_lens", "ids": order.tolist(), "final": final, "first_row": first,
                 "rows": safe_labels},
    }
    if shapes:  # none when the final token is in no row's top (it always is in the last row's, unless `final` is given)
        layout["shapes"] = shapes
    return FigureSpec([trace], layout)


def _checked(probs, pieces: Sequence[str], row_labels: Sequence[str] | None, top, final
             ) -> tuple[np.ndarray, list[str], list[str], int, int]:
    """`lens_grid`'s input checked: probs as float64, the pieces and row labels as strings (the
    default labels filled in), `top` capped at the vocabulary, `final` (default: the last row's argmax)."""
    probs = np.asarray(probs, dtype=np.float64)
    # (R, V) with R, V ≥ 1: an empty array would leave no cell to draw and argmax nothing to find
    if probs.ndim != 2 or probs.shape[0] < 1 or probs.shape[1] < 1:
        raise ValueError(f"probs must be 2-D (rows, vocabulary) with at least one of each, got shape {probs.shape}")
    n_rows, vocab = probs.shape
    pieces = [str(p) for p in pieces]
    if len(pieces) != vocab:
        raise ValueError(f"probs cover a vocabulary of {vocab} but {len(pieces)} token pieces were given")
    if row_labels is None:  # the residual stream: the embedding, after each layer, the last one the output
        row_labels = ["embedding"] + [f"after layer {r - 1}" for r in range(1, n_rows)]
        if n_rows > 1:
            row_labels[-1] += " (output)"
    row_labels = [str(r) for r in row_labels]
    if len(row_labels) != n_rows:
        raise ValueError(f"probs have {n_rows} rows but {len(row_labels)} row labels were given")
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
        raise ValueError(f"top must be a whole number ≥ 1, got {top!r}")
    top = min(int(top), vocab)  # a toy vocabulary may be smaller than the columns asked for
    if not np.isfinite(probs).all():  # NaN would sort unpredictably and colour nothing
        raise ValueError("probs must be finite")
    if final is None:  # the answer to look for: the output row's top token
        final = int(np.argmax(probs[-1]))
    # a given id must name a piece; a bool is refused though Python counts it as an int
    elif isinstance(final, bool) or not isinstance(final, (int, np.integer)) or not 0 <= final < vocab:
        raise ValueError(f"final token id {final!r} is outside the vocabulary of {vocab} pieces")
    final = int(final)
    return probs, pieces, row_labels, top, final


def _cells(order: np.ndarray, values: np.ndarray, pieces: list[str], final: int, limit: int,
           safe_labels: list[str]) -> tuple[list[list[str]], list[list[str]], list[tuple[int, int]]]:
    """Each cell's text (the piece, bold where it is `final`) and hover, and the (row, rank) cells to outline."""
    n_rows, top = order.shape
    text, hover, outlined = [], [], []
    for r in range(n_rows):
        text_row, hover_row = [], []
        for k in range(top):
            tok = int(order[r, k])  # the vocabulary id at rank k + 1 of row r
            piece = short_token(pieces[tok], limit)  # the hover keeps the whole piece
            if tok == final:
                outlined.append((r, k))
                piece = f"<b>{piece}</b>"
            text_row.append(piece)
            hover_row.append(f"{safe_labels[r]} · rank {k + 1}: '{esc(pieces[tok])}' {probability_text(values[r, k])}"
                             + (" · the model's final top token" if tok == final else ""))
        text.append(text_row)
        hover.append(hover_row)
    return text, hover, outlined
