"""Prompt A against prompt B (or normal against ablated): two distributions, and attention B − A.

* `compare_distributions`: two next-token distributions as grouped bars over the union of their
  top candidates, each label giving the rank change.
* `attention_difference`: one layer's attention of prompt B minus prompt A, one panel per head,
  on the diverging scale (red = B attends more, blue = A attends more), drawn by viz.panels.

Token pieces, labels and titles from a caller are escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ._common import (
    DIFF_FLOOR,
    MILLI,
    PRESENTATION_FONT_PX,
    check_figure_size,
    check_flag,
    esc,
    nice_ticks,
    probability_text,
    short_token,
    text_width_em,
    tick_label,
    title_text,
)
from .attention import GRID_LABEL_LIMIT, future_mask
from .panels import check_square, check_tokens, masked_cells, panels_figure
from .payload import FigureSpec
from .sampling import ADJ_COLOUR, MAX_HEIGHT_PX, RAW_COLOUR, bar_layout

# ----------------------------------------------------------------------------- two distributions


def _ranks(probs: np.ndarray) -> np.ndarray:
    """1-based rank of every token (highest probability = 1; ties: lower id first)."""
    order = np.argsort(-probs, kind="stable")
    ranks = np.empty(probs.shape[0], dtype=np.int64)
    ranks[order] = np.arange(1, probs.shape[0] + 1)
    return ranks


def compare_distributions(
    pieces: Sequence[str],
    before: np.ndarray,
    after: np.ndarray,
    *,
    labels: tuple[str, str] = ("normal", "ablated"),
    top: int = 10,
    title: str | None = None,
    presentation: bool = False,
) -> FigureSpec:
    """Two next-token distributions over one vocabulary as grouped horizontal bars.

    The rows are the union of both top-`top` lists: `before`'s top in its order, then the tokens
    only in `after`'s top (by `after`); when that does not fit in `MAX_HEIGHT_PX` (≤ 360 px) at a
    legible size, both tops are cut shorter alike. `before` is drawn light (`RAW_COLOUR`), `after`
    strong (`ADJ_COLOUR`), named by `labels` in the legend (e.g. ("prompt A", "prompt B")). Each row
    label is the token piece and its rank under each distribution, "tom  1→3". Hover: both
    probabilities, ranks and the difference. title: plain text (escaped). presentation: fonts ≥ 16 px.
    layout.meta holds the ids shown and their ranks. Raises ValueError for inconsistent shapes.
    """
    check_flag("presentation", presentation)
    pieces = [str(p) for p in pieces]
    n = len(pieces)
    arrays = []  # both distributions, checked alike: (V,) each, one entry per token piece
    for name, probs in (("before", before), ("after", after)):
        probs = np.asarray(probs, dtype=np.float64)
        if probs.ndim != 1:
            raise ValueError(f"{name} must be 1-D (vocabulary,), got shape {probs.shape}")
        if probs.shape[0] != n:
            raise ValueError(f"{name} has {probs.shape[0]} entries but {n} token pieces were given")
        if n == 0:
            raise ValueError(f"{name} is empty")
        arrays.append(probs)
    before, after = arrays
    # a two-letter string has length 2 too, so strings are refused before the length is read
    if isinstance(labels, str) or len(labels) != 2:
        raise ValueError(f"labels must be two names (before, after), got {labels!r}")
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
        raise ValueError(f"top must be a whole number ≥ 1, got {top!r}")
    name_a, name_b = (esc(lab) for lab in labels)
    font = PRESENTATION_FONT_PX if presentation else 11
    title_font = 20 if presentation else 13
    pitch = max(font * 1.3, 8 * 2 + 6)  # px a row needs: its label's line, or two 8 px bars and a gap
    # top: the title and the legend's line; bottom: the tick labels and the axis title
    margin = {"t": int(title_font * 1.6 + font * 1.6 + 10), "b": int(font * 1.4 * 2 + 12)}
    rows_fit = max(1, int((MAX_HEIGHT_PX - margin["t"] - margin["b"]) // pitch))
    rank_a, rank_b = _ranks(before), _ranks(after)
    order_a, order_b = np.argsort(rank_a), np.argsort(rank_b)  # ids by rank
    # the longest tops (k ≤ top, the same k for both) whose union fits: before's top in its order, then
    # the tokens only after's top adds
    for k in range(min(int(top), n), 0, -1):
        head_a = [int(i) for i in order_a[:k]]
        seen = set(head_a)
        ids = head_a + [int(i) for i in order_b[:k] if int(i) not in seen]
        if len(ids) <= rows_fit:  # the first (longest) k that fits; when the tops differ the union is longer
            break
    ids = ids[:rows_fit]  # only when even the top 1 of each does not fit (never at 360 px)
    rows = np.arange(len(ids), dtype=np.int32)
    labels_y = [f"{short_token(pieces[i], 14)}  {rank_a[i]}→{rank_b[i]}" for i in ids]
    hover = [f"'{esc(pieces[i])}' (id {i})<br>{name_a}: {probability_text(before[i])} (rank {rank_a[i]})<br>"
             f"{name_b}: {probability_text(after[i])} (rank {rank_b[i]})<br>{name_b} − {name_a}: "
             f"{'+' if after[i] >= before[i] else '−'}{probability_text(abs(after[i] - before[i]))}" for i in ids]
    # the widest "piece  rank→rank" label sets the left margin
    label_em = max(text_width_em(pieces[i][:14]) + text_width_em(f"  {rank_a[i]}→{rank_b[i]}") for i in ids)
    idx = np.array(ids, dtype=np.int64)  # vocabulary ids of the rows, top row first

    def bars(values: np.ndarray, name: str, colour: str) -> dict:
        # float32 is plenty for a bar's length, at half float64's bytes in the figure sent to the page
        return {"type": "bar", "orientation": "h", "name": name, "x": values[idx].astype(np.float32), "y": rows,
                "marker": {"color": colour}, "hovertext": hover, "hovertemplate": "%{hovertext}<extra></extra>"}

    data = [bars(before, name_a, RAW_COLOUR), bars(after, name_b, ADJ_COLOUR)]
    height = min(MAX_HEIGHT_PX, int(margin["t"] + margin["b"] + pitch * len(ids) + 8))
    margin.update(l=int(min(320, max(60, label_em * font + 14))), r=20)  # room for labels, capped on long pieces
    peak = max(1e-9, float(before[idx].max()), float(after[idx].max()))  # the axis end; never 0
    layout = bar_layout(font=font, title_font=title_font, height=height, margin=margin,
                        title=title_text(title, f"Next-token probabilities: {name_a} vs {name_b}"),
                        x_title=f"probability (labels: rank {name_a}→{name_b})", x_max=peak, rows=rows.tolist(),
                        ticktext=labels_y, presentation=presentation, legend=True,
                        meta={"viz": "compare_distributions", "ids": ids,
                              "ranks_before": [int(rank_a[i]) for i in ids],
                              "ranks_after": [int(rank_b[i]) for i in ids], "labels": [name_a, name_b]})
    return FigureSpec(data, layout)


# ----------------------------------------------------------------------------- attention B − A


def attention_difference(
    diff: np.ndarray,
    tokens: Sequence[str],
    *,
    layer: int,
    causal: bool,
    width_px: int | None = None,
    max_height_px: int | None = None,
    presentation: bool = False,
    title: str | None = None,
    panel_notes: Mapping[int, str] | None = None,
) -> FigureSpec:
    """One layer's attention weights of prompt B minus prompt A, one panel per head.

    diff: (H, T, T) = B − A over the positions both prompts share; tokens: T labels (the caller
    joins differing tokens, e.g. "he→she"). Drawn like `attention_grid` (rows = queries, position 0
    on top; the same panel layout, tick labels and wire format), on the `DIVERGING` scale shared by
    every head and symmetric around 0: ±max(|diff|, `DIFF_FLOOR`), colour bar "B − A". causal: the
    future positions (upper triangle) are masked and hatched; non-finite cells are masked too.
    panel_notes: head → plain text appended to its panel title ("head 2 · largest change …").
    Hover: "layer 0, head 2 / query "he→she" (5) → key "anna" (0) / B − A = +0.410".
    width_px (default 1200), max_height_px, presentation as in `attention_view`; title: plain text.
    Raises ValueError for inconsistent shapes or a bad layer.
    """
    check_flag("causal", causal)
    check_flag("presentation", presentation)
    diff = np.asarray(diff, dtype=np.float64)
    if diff.ndim != 3:
        raise ValueError(f"diff must be 3-D (heads, T, T), got shape {diff.shape}")
    t = check_square(diff.shape, "diff")  # T, the positions both prompts share
    if diff.shape[0] < 1:
        raise ValueError("diff has no heads")
    tokens = check_tokens(tokens, t)
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or layer < 0:
        raise ValueError(f"layer must be a whole number ≥ 0, got {layer!r}")
    width_px = 1200 if width_px is None else width_px  # as attention_grid's default: the grids line up
    check_figure_size("width_px", width_px, 120)
    check_figure_size("max_height_px", max_height_px, 120)
    notes = dict(panel_notes or {})
    n_heads = diff.shape[0]
    # a note for a head that is not drawn would be lost without a word, so it is refused
    bad = [h for h in notes if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or not 0 <= h < n_heads]
    if bad:
        raise ValueError(f"panel_notes names heads {bad} but there are {n_heads} heads")
    # (H, T, T): the future (when causal) and any non-finite cell, hatched
    masked = np.broadcast_to(masked_cells(diff, future_mask(t) if causal else None), diff.shape)
    vals = np.abs(diff[~masked])
    # one range for every head, symmetric around 0, at least ±DIFF_FLOOR so noise stays pale
    lim = max(float(vals.max()) if vals.size else 0.0, DIFF_FLOOR)
    titles = [f"head {h}" + (f" · {esc(notes[h])}" if h in notes else "") for h in range(n_heads)]  # notes are escaped
    default = f"Layer {int(layer)}: attention weights, prompt B − prompt A"
    # kind="scores" gives the diverging scale and signed values; the labels are corrected below
    fig = panels_figure(
        diff, masked, tokens, ncols=None, panels=[(int(layer), h) for h in range(n_heads)], panel_titles=titles,
        row_titles=None, kind="scores", title=title_text(title, default), width_px=width_px,
        max_height_px=max_height_px, focus=GRID_LABEL_LIMIT, presentation=presentation,
    )
    # drawn as scores; from here relabelled as a difference: its range, the bar's title and signed ticks
    # ("+0.4"), the hover's "B − A = +0.410"
    # shallow copies at each level changed, so the figure panels_figure returned is never edited in place
    layout = dict(fig.layout)
    ticks = nice_ticks(-lim, lim, 5)
    colorbar = dict(layout["coloraxis"]["colorbar"])
    colorbar["title"] = {**colorbar["title"], "text": "B − A"}
    colorbar.update(tickvals=(ticks * MILLI).tolist(), ticktext=[("+" if v > 0 else "") + tick_label(v) for v in ticks])
    layout["coloraxis"] = {**layout["coloraxis"], "cmin": -lim * MILLI, "cmax": lim * MILLI, "colorbar": colorbar}
    template = dict(layout["template"])
    heatmap = dict(template["data"]["heatmap"][0])
    heatmap["hovertemplate"] = "%{meta}<br>query %{y} → key %{x}<br>B − A = %{z:+05,d}<extra></extra>"
    template["data"] = {**template["data"], "heatmap": [heatmap]}
    layout["template"] = template
    layout["meta"] = {**layout["meta"], "kind": "difference", "difference": "B − A", "range": lim}
    return FigureSpec(fig.data, layout)
