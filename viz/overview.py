"""Every head of a model at a glance: one small attention pattern (a thumbnail) per layer × head.

`head_thumbnails` lays the heads out as a grid, layers down and heads across; each thumbnail is that
head's weights on the text (query rows down, key columns across) on the weights' colour scale (dark
purple 0 → yellow 1), masked cells light grey. The whole grid is one heatmap of one byte a cell, so
16 layers × 32 heads stay within the figure budget (`THUMB_CELLS`): where a text is longer than a
thumbnail's share of cells, each thumbnail cell is the largest weight of a block of the text's
(`layout.meta.edges` names the blocks, and a note under the grid says so). A cell holds round(250 × weight):
``layout.meta.unit`` is 1/250, `MASKED` a masked cell and `GAP` the space between thumbnails.

Hovering a thumbnail names its head and the mean weight its queries put on the previous token, the
first token and themselves; a click opens it (each thumbnail's invisible marker carries customdata
``[layer, head, ...]``, as the head-role map's cells do, so the page's click handling is the same).
The head selected in the page is outlined in magenta (`ROW_OUTLINE`), or its whole layer when no
single head is selected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ._common import (
    layout_frame,
    EXPORT_BAR_PX,
    FONT,
    ROW_OUTLINE,
    TRANSPARENT,
    esc,
    hover_label,
    text_width_em,
    title_y,
    wrap_parts,
    wrapped,
)
from .attention_layout import NORMAL_FONTS, PRESENTING_FONTS
from .layer_heads import check_pixels
from .payload import FigureSpec

THUMBNAILS_VIEW = "head thumbnails"  # the name of this view among viz.ATTENTION_VIEWS
THUMB_CELLS = 90_000  # cells of all thumbnails together (one byte each, about 120 KB as base64)
SCALE = 250  # a cell holds round(SCALE × weight)
MASKED, GAP = 253, 255  # cell values of a masked (future) cell and of the space between thumbnails
_VIRIDIS = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b",
            "#fde725")
_MASKED_COLOUR = "rgba(128,128,128,0.22)"
_MAX_ASPECT = 2.0  # a thumbnail is at most twice as wide as it is high


def thumbnail_colorscale() -> list[list]:
    """Viridis (`SEQUENTIAL`, plotly's own ten colours) over 0..SCALE, light grey for MASKED, nothing
    (transparent) for GAP."""
    stops = [[round(i / (len(_VIRIDIS) - 1) * SCALE / 255, 6), c] for i, c in enumerate(_VIRIDIS)]
    return stops + [[251 / 255, _MASKED_COLOUR], [MASKED / 255, _MASKED_COLOUR], [254 / 255, TRANSPARENT],
                    [1.0, TRANSPARENT]]


def _stack(weights) -> list[np.ndarray]:
    layers = [np.asarray(a) for a in weights]
    if not layers or any(a.ndim != 3 or a.shape != layers[0].shape for a in layers):
        raise ValueError("weights must be 4-D (layers, heads, T, T) or equal (heads, T, T) arrays, got shapes "
                         f"{[tuple(a.shape) for a in layers]}")
    t = layers[0].shape[-1]
    if layers[0].shape[-2] != t or t == 0:
        raise ValueError(f"each head's weights must be square (T, T) with T ≥ 1, got {layers[0].shape[-2:]}")
    return layers


def cells_for(n_layers: int, n_heads: int, t: int) -> tuple[int, int]:
    """(cells a thumbnail's side, gap cells between thumbnails) for this many heads and tokens."""
    side = max(1, int(math.sqrt(THUMB_CELLS / (n_layers * n_heads))))
    gap = 1 if side >= 6 else 0
    return max(1, min(t, side - gap)), gap


def pooled(w: np.ndarray, edges: np.ndarray, causal: bool) -> np.ndarray:
    """(H, S, S) cells of one layer's (H, T, T) weights: each the largest weight of its block of
    queries × keys (edges: S + 1 block boundaries), as round(SCALE × weight); MASKED where every cell
    of the block is masked."""
    t = w.shape[-1]
    w = np.asarray(w, dtype=np.float32)
    if causal:
        w = np.where(np.tril(np.ones((t, t), dtype=bool))[None], w, np.nan)
    with np.errstate(invalid="ignore"):
        blocks = np.fmax.reduceat(np.fmax.reduceat(w, edges[:-1], axis=1), edges[:-1], axis=2)
    out = np.clip(np.rint(blocks * SCALE), 0, SCALE)
    return np.where(np.isnan(blocks), MASKED, out).astype(np.uint8)


def _means(w: np.ndarray) -> np.ndarray:
    """(H, 3): the mean weight queries 1..T−1 put on the previous token, the first token and themselves."""
    t = w.shape[-1]
    if t < 2:
        return np.full((w.shape[0], 3), np.nan)
    q = np.arange(1, t)
    return np.stack([w[:, q, q - 1].mean(-1), w[:, q, 0].mean(-1), w[:, q, q].mean(-1)], axis=-1)


def _check(tokens: Sequence[str], t: int, selected, n_layers: int, n_heads: int) -> None:
    if len(list(tokens)) != t:
        raise ValueError(f"weights are {t}×{t} but {len(list(tokens))} tokens were given")
    if selected is not None:
        layer, head = selected
        if not (isinstance(layer, (int, np.integer)) and 0 <= layer < n_layers) or not (
                head is None or isinstance(head, (int, np.integer)) and 0 <= head < n_heads):
            raise ValueError(f"selected must be a (layer, head) of this model, got {selected!r}")


def _mosaic(layers: list[np.ndarray], edges: np.ndarray, gap: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Every head's cells laid out layers down and heads across, `gap` cells of GAP between them; and each
    head's three mean weights (`_means`), (L, H, 3)."""
    n_layers, n_heads, side = len(layers), layers[0].shape[0], len(edges) - 1
    stride = side + gap
    mosaic = np.full((n_layers * stride - gap, n_heads * stride - gap), GAP, dtype=np.uint8)
    means = np.empty((n_layers, n_heads, 3))
    for li, w in enumerate(layers):
        cells = pooled(w, edges, causal)
        means[li] = _means(np.asarray(w, dtype=np.float64))
        for h in range(n_heads):
            mosaic[li * stride: li * stride + side, h * stride: h * stride + side] = cells[h]
    return mosaic, means


def head_thumbnails(
    weights: np.ndarray | Sequence[np.ndarray],
    tokens: Sequence[str],
    *,
    causal: bool = True,
    selected: tuple[int, int | None] | None = None,
    width_px: int = 1000,
    max_height_px: int | None = None,
    presentation: bool = False,
    title_prefix: str | None = None,
) -> FigureSpec:
    """Every layer × head as a small attention pattern; a click on one names its head.

    weights: (L, H, T, T) post-softmax weights, or L arrays (H, T, T). tokens: the T tokens (for the
    count; thumbnails are too small to label). causal: the future is masked. selected: (layer, head)
    outlined, or (layer, None) for the whole layer. width_px, max_height_px: the size laid out for.
    presentation: large fonts. title_prefix: plain text before the title (escaped).
    """
    layers = _stack(weights)
    n_layers, (n_heads, t, _) = len(layers), layers[0].shape
    _check(tokens, t, selected, n_layers, n_heads)
    check_pixels(width_px, max_height_px)
    fonts = PRESENTING_FONTS if presentation else NORMAL_FONTS
    # a thumbnail is side × side cells whatever T is: a long text is pooled into blocks of tokens, so the
    # whole model stays one small image
    side, gap = cells_for(n_layers, n_heads, t)
    edges = np.linspace(0, t, side + 1).round().astype(np.int64)  # S + 1 block boundaries over the T tokens
    stride = side + gap  # cells from one thumbnail's start to the next
    # one uint8 image (L·stride − gap, H·stride − gap) drawn as a single heatmap, not L × H traces
    mosaic, means = _mosaic(layers, edges, gap, causal)

    geo = _geometry(n_layers, n_heads, pooled_cells=side < t, side=side, t=t, fonts=fonts, width_px=width_px,
                    max_height_px=max_height_px, title_prefix=title_prefix)
    centres = np.arange(n_heads) * stride + (side - 1) / 2  # each head's thumbnail centre, in cells
    rows = np.arange(n_layers) * stride + (side - 1) / 2
    # the image itself takes no hover: a heatmap's hover would name a cell, not a head
    heat = {"type": "heatmap", "z": mosaic, "x0": 0, "dx": 1, "y0": 0, "dy": 1, "zmin": 0, "zmax": 255,
            "zsmooth": False, "colorscale": thumbnail_colorscale(), "showscale": False, "hoverinfo": "skip"}
    # per head: layer, head and its three mean weights; NaN (a one-token text) becomes null, which JSON can hold
    custom = [[li, h, *[None if not np.isfinite(v) else round(float(v), 3) for v in means[li, h]]]
              for li in range(n_layers) for h in range(n_heads)]
    # one invisible square marker over each thumbnail carries the hover and the click that opens the head
    picks = {"type": "scatter", "mode": "markers", "x": np.tile(centres, n_layers).astype(np.float32),
             "y": np.repeat(rows, n_heads).astype(np.float32), "customdata": custom, "showlegend": False,
             "hovertemplate": "layer %{customdata[0]}, head %{customdata[1]}<br>mean weight on the previous token "
                              "%{customdata[2]:.2f}, the first token %{customdata[3]:.2f}, itself "
                              "%{customdata[4]:.2f}<br>click to open this head<extra></extra>",
             "marker": {"symbol": "square", "size": max(4, round(geo["thumb"])), "opacity": 0}}
    step_x = max(1, math.ceil(fonts.tick_min * 1.9 / geo["cell_w"]))  # head numbers that do not touch
    step_y = max(1, math.ceil(fonts.tick_min * 1.4 / geo["cell_h"]))  # and layer numbers likewise
    axis = {"showgrid": False, "zeroline": False, "ticks": "", "fixedrange": True, "tickmode": "array",
            "tickfont": {"size": geo["font"]}}
    layout = {
        **layout_frame(font_px=fonts.axis_title, height=geo["height"], margin=geo["margin"], title=geo["title"],
                       title_px=fonts.title),
        **({"annotations": [{"text": geo["note"], "x": 1, "xref": "paper", "xanchor": "right", "y": 0, "yref": "paper",
                             "yanchor": "top", "yshift": -6, "align": "right", "showarrow": False,
                             "font": {"size": fonts.sub}}]} if geo["note"] else {}),
        "xaxis": {**axis, "side": "top", "range": [-0.5, mosaic.shape[1] - 0.5], "domain": [0, geo["x_frac"]],
                  "tickvals": centres[::step_x].tolist(), "ticktext": [str(h) for h in range(0, n_heads, step_x)]},
        "yaxis": {**axis, "range": [mosaic.shape[0] - 0.5, -0.5], "tickvals": rows[::step_y].tolist(),
                  "ticktext": [str(li) for li in range(0, n_layers, step_y)]},
        "hovermode": "closest",
        "hoverdistance": -1,  # no cut-off: the nearest thumbnail answers wherever the pointer is, as small as they are
        "modebar": {"remove": ["zoom2d", "pan2d", "select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d",
                               "resetScale2d"]},
        "hoverlabel": hover_label(fonts.hover),
        "showlegend": False,
        "meta": {"viz": "head_thumbnails", "pick": "head", "T": t, "layers": n_layers, "heads": n_heads,
                 "cells": side, "gap": gap, "edges": edges.tolist(), "unit": 1 / SCALE, "masked": MASKED,
                 "gap_value": GAP, "selected": list(selected) if selected is not None else None},
    }
    if selected is not None:
        layer, head = selected
        # head None outlines the whole row of the layer; the outline sits in the gap around the thumbnail(s)
        x0, x1 = (-0.5, mosaic.shape[1] - 0.5) if head is None else (head * stride - 0.5, head * stride + side - 0.5)
        y0, y1 = layer * stride - 0.5, layer * stride + side - 0.5
        pad = gap / 2
        layout["shapes"] = [{"type": "rect", "xref": "x", "yref": "y", "x0": x0 - pad, "x1": x1 + pad, "y0": y0 - pad,
                             "y1": y1 + pad, "line": dict(line), "fillcolor": TRANSPARENT, "layer": "above"}
                            for line in ROW_OUTLINE]
    return FigureSpec((heat, picks), layout)


def _geometry(n_layers: int, n_heads: int, pooled_cells: bool, side: int, t: int, fonts, width_px: int,
              max_height_px: int | None, title_prefix: str | None) -> dict:
    """Margins, the thumbnails' size in px, the height and the title of the thumbnails figure: the title
    (and, where the text is pooled, a line saying so), the head numbers above the grid, the layer
    numbers left of it; thumbnails as large as the figure allows, at most `_MAX_ASPECT` times as wide
    as high."""
    title = (esc(title_prefix) if title_prefix else "") + (
        f"All {n_layers} × {n_heads} heads: layers down, heads across")
    title = wrapped(title, (width_px - 20) / fonts.title)
    # a note under the grid, right of where the page's PNG / SVG buttons show
    note = wrap_parts([f"the text's {t} tokens in {side} blocks: each cell the largest weight of its block"],
                      fonts.sub, width_px - 130) if pooled_cells else ""
    font = fonts.tick_min + 1 if fonts.tick_min < 16 else fonts.tick_min
    top = (8 + fonts.title * 1.25 * (title.count("<br>") + 1)
           + 8 + font * 1.3 + 4)
    note_h = 6 + (note.count("<br>") + 1) * fonts.sub * 1.3 + 6 if note else 0
    margin = {"l": math.ceil(text_width_em(str(n_layers - 1)) * font + 12), "r": 10, "t": math.ceil(top),
              "b": math.ceil(max(EXPORT_BAR_PX, note_h))}  # the page's PNG / SVG buttons show under the grid
    plot_w = width_px - margin["l"] - margin["r"]
    cell_w = plot_w / n_heads
    cell_h = min(cell_w, 90.0)
    if max_height_px is not None:
        cell_h = min(cell_h, (max_height_px - margin["t"] - margin["b"]) / n_layers)
    cell_h = max(cell_h, 8.0)
    cell_w = min(cell_w, cell_h * _MAX_ASPECT)
    height = int(margin["t"] + margin["b"] + cell_h * n_layers)
    return {"title": title, "note": note, "margin": margin, "height": height, "font": font,
            "cell_w": cell_w, "cell_h": cell_h, "thumb": min(cell_w, cell_h) * side / (side + 1),
            "x_frac": round(min(1.0, cell_w * n_heads / plot_w), 5)}
