"""The Circuits view's figures, numpy in, `FigureSpec` out: direct logit attribution and head composition
(here), one head's OV and QK circuits (viz.circuits_heads), attribution patching beside exact patching
(viz.circuits_atp). The helpers the three share are here too.

* `dla_map`: each head's direct contribution to a logit (difference) as a layer × head heatmap, with each
  layer's MLP as a column of its own beside it, on one `DIVERGING` scale symmetric around 0 (red adds to the
  answer, blue takes away); the embedding's terms, the remainder and the sum against the actual logit
  difference are written under the title. Head cells carry [layer, head] (``layout.meta.pick == "head"``).
* `composition_map`: one kind of composition score (Q, K or V) between every earlier head (rows) and every
  head of a later layer (columns), the layers blocked by lines, on `SEQUENTIAL` from 0; the strongest pairs
  outlined. Each cell carries its pair [earlier layer, head, later layer, head] as customdata (``layout.meta``
  "pick" "pair"): row i is head i % H of layer i // H, column j head j % H of layer 1 + j // H. Too narrow for
  a cell per pair (a phone, many heads), it maps pairs of layers instead, each cell the strongest pair of heads
  between them (``layout.meta.blocks``), which is what its customdata names.

Every caller string is escaped; backgrounds are transparent and text mid grey (viz._common);
presentation=True gives tick labels of at least `PRESENTATION_FONT_PX`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ._common import (
    DIVERGING, EXPORT_BAR_PX, MARK_INSET, MARK_LINES, PRESENTATION_FONT_PX, ROW_OUTLINE, SEQUENTIAL, TRANSPARENT,
    check_flag, check_width, colorscale, esc, hover_label, layout_frame, message_figure, nice_ticks, text_width_em,
    tick_label, tick_step, title_text, wrap_parts, wrapped,
)
from .payload import FigureSpec

SELECT_INSET = 0.47
MIN_PAIR_CELL_PX = 3.0  # a composition map's pair cell narrower than this (a phone): it maps pairs of layers
DLA_MLP_GAP_PX = 16  # between the heads and the MLP column


@dataclass(frozen=True)
class CircuitFonts:
    tick: float
    title: float
    sub: float
    hover: float
    cell_h: float  # px per row of a layer × head map


NORMAL = CircuitFonts(tick=11, title=13, sub=11, hover=12, cell_h=30)
PRESENTING = CircuitFonts(tick=PRESENTATION_FONT_PX, title=20, sub=PRESENTATION_FONT_PX, hover=18, cell_h=42)


def fonts_for(presentation: bool) -> CircuitFonts:
    check_flag("presentation", presentation)
    return PRESENTING if presentation else NORMAL


def signed(value: float, digits: int = 2) -> str:
    """A signed number for a cell or a note ("+1.23", "−0.40"; "0.00" for what rounds to zero)."""
    rounded = round(float(value), digits) + 0.0
    if rounded == 0:
        return f"{0:.{digits}f}"
    return f"{rounded:+.{digits}f}".replace("-", "−")


def head_frame(title: str, parts: list[str], fonts: CircuitFonts, laid: float, plot_h: float, left: float, right: float,
               top_extra: float = 0.0) -> dict:
    """A figure's layout frame: the (escaped) title and the note parts wrapped to the width laid out for, the
    margins around a plot `plot_h` high (`top_extra`: axis labels above the plot), the hover style."""
    title = wrapped(title, (laid - 20) / fonts.title)
    legend = wrap_parts(parts, fonts.sub, laid - 20) if parts else ""
    top = math.ceil(8 + fonts.title * 1.25 * (title.count("<br>") + 1) + top_extra
                    + (fonts.sub * (1.6 + 1.3 * (legend.count("<br>") + 1)) if legend else 0) + 6)
    margin = {"l": math.ceil(left), "r": math.ceil(right), "t": top, "b": EXPORT_BAR_PX}
    frame = layout_frame(font_px=fonts.tick, height=math.ceil(top + plot_h + EXPORT_BAR_PX), margin=margin,
                         title=title, title_px=fonts.title, subtitle=legend or None, subtitle_px=fonts.sub)
    return {**frame, "hoverlabel": hover_label(fonts.hover), "hovermode": "closest"}


def label_stride(labels: Sequence[str], span_px: float, fonts: CircuitFonts) -> int:
    """Every how many labels to write so that those written, side by side, fit `span_px` unrotated."""
    widest = max(text_width_em(t) for t in labels) * fonts.tick + 6
    return max(1, math.ceil(len(labels) * widest / max(1.0, span_px)))


def digits_for(lim: float) -> int:
    """Decimals that give the largest of a map's values two significant digits (2 to 4)."""
    if not math.isfinite(lim) or lim <= 0:
        return 2
    return int(min(4, max(2, 1 - math.floor(math.log10(lim)))))


def outline(r: float, c: float, lines: Sequence[dict], inset: float, xref: str = "x", yref: str = "y") -> list[dict]:
    """Rectangles around cell (r, c), one per line (drawn in order: the wider first)."""
    return [{"type": "rect", "xref": xref, "yref": yref, "x0": c - inset, "x1": c + inset, "y0": r - inset,
             "y1": r + inset, "line": dict(line), "fillcolor": TRANSPARENT, "layer": "above"} for line in lines]


def diverging_bar(lim: float, fonts: CircuitFonts, title: str, presentation: bool) -> dict:
    """A colour bar for ±lim with round ticks."""
    ticks = nice_ticks(-lim, lim, 5)
    return {"title": {"text": esc(title), "side": "right", "font": {"size": fonts.tick}}, "tickmode": "array",
            "tickvals": ticks.tolist(), "ticktext": [tick_label(v) for v in ticks], "tickfont": {"size": fonts.tick},
            "thickness": 18 if presentation else 12, "outlinewidth": 0, "len": 1.0}


def check_array(name: str, value, ndim: int) -> np.ndarray:
    a = np.asarray(value, dtype=np.float64)
    if a.ndim != ndim or 0 in a.shape:
        raise ValueError(f"{name} must be a non-empty {ndim}-D array, got shape {a.shape}")
    if np.isinf(a).any():
        raise ValueError(f"{name} must be finite (NaN marks a value not computed)")
    return a


def check_pair(name: str, pair, limits: Sequence[int]) -> tuple[int, ...]:
    if not isinstance(pair, (tuple, list)) or len(pair) != len(limits):
        raise ValueError(f"{name} must be {len(limits)} whole numbers, got {pair!r}")
    for value, top in zip(pair, limits):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < top:
            raise ValueError(f"{name} must be whole numbers in range, got {pair!r}")
    return tuple(int(v) for v in pair)


# ------------------------------------------------------------------------------ direct logit attribution


def dla_map(heads, mlps, *, embedding: Mapping[str, float], remainder: float, actual: float,
            label: str = "logit difference", selected: tuple[int, int] | None = None, title: str | None = None,
            presentation: bool = False, width_px: int | None = None) -> FigureSpec:
    """Direct logit attribution as a layer × head heatmap with an MLP column (see the module docstring).

    heads (L, H), mlps (L,) (NaN for a layer without an MLP): each part's direct term; embedding: the
    embedding's terms by name; remainder: what no part accounts for (biases, soft-cap); actual: the logit
    (difference) the model reads out; label: what is attributed (plain text). selected: a head outlined."""
    fonts = fonts_for(presentation)
    check_width(width_px)
    heads, mlps = check_array("heads", heads, 2), check_array("mlps", mlps, 1)
    L, H = heads.shape
    if mlps.shape != (L,):
        raise ValueError(f"mlps must have one value per layer ({L}), got shape {mlps.shape}")
    selected = None if selected is None else check_pair("selected", selected, (L, H))
    laid = width_px or 720
    left = math.ceil(text_width_em(f"L{L - 1}") * fonts.tick + 14)
    right = math.ceil(14 + (18 if presentation else 12) + 6 + 4 * fonts.tick + 10)
    plot_w = max(120.0, laid - left - right)
    cell_w = (plot_w - DLA_MLP_GAP_PX) / (H + 1.4)  # the MLP column is a little wider than a head's
    split = (H * cell_w) / plot_w
    both = np.concatenate([heads.ravel(), mlps])
    lim = float(np.nanmax(np.abs(both))) if np.isfinite(both).any() else 0.0
    lim = lim or 1.0
    stride = label_stride([f"H{h}" for h in range(H)], H * cell_w, fonts)  # the heads whose number fits
    digits = digits_for(lim)
    numbers = cell_w >= text_width_em("−0." + "0" * digits) * fonts.tick + 6
    head_text = [[signed(v, digits) if numbers and np.isfinite(v) else "" for v in row] for row in heads]
    head_hover = [[f"L{li}H{h}: {signed(heads[li, h], 4)} to {esc(label)} directly<br>click: open in Explore"
                   for h in range(H)] for li in range(L)]
    mlp_hover = [[f"MLP of layer {li}: " + (f"{signed(v, 4)} to {esc(label)} directly" if np.isfinite(v)
                                              else "this layer has no MLP")] for li, v in enumerate(mlps)]
    common = {"type": "heatmap", "zmin": -lim, "zmax": lim, "colorscale": colorscale(DIVERGING), "xgap": 2,
              "ygap": 2, "hovertemplate": "%{hovertext}<extra></extra>", "hoverongaps": False,
              "textfont": {"size": fonts.tick}, "texttemplate": "%{text}"}
    data = [{**common, "z": heads.astype(np.float32), "x0": 0, "dx": 1, "y0": 0, "dy": 1, "text": head_text,
             "hovertext": head_hover, "customdata": [[[li, h] for h in range(H)] for li in range(L)],
             "colorbar": diverging_bar(lim, fonts, "direct effect", presentation), "name": "heads"},
            {**common, "z": mlps[:, None].astype(np.float32), "x0": 0, "dx": 1, "y0": 0, "dy": 1,
             "text": [[signed(v, digits) if numbers and np.isfinite(v) else ""] for v in mlps], "hovertext": mlp_hover,
             "showscale": False, "xaxis": "x2", "yaxis": "y", "name": "mlps"}]
    parts = [f"{esc(k)} {signed(v)}" for k, v in _embedding_names(embedding)]
    total = float(np.nansum(both) + sum(embedding.values()))
    parts += [f"remainder (biases, cap) {signed(remainder)}",
              f"parts {signed(total)} + remainder = {signed(total + remainder)}, actual {signed(actual)}",
              "direct effect only: what later layers make of a head is not counted"]
    default = f"Direct logit attribution to {esc(label)}: each head and MLP"
    row_h = max(fonts.cell_h, 150 / L)  # a map of few layers keeps a readable colour bar
    layout = head_frame(title_text(title, default), parts, fonts, laid, L * row_h, left, right,
                        top_extra=fonts.tick * 1.4 + 8)
    axis = {"side": "top", "tickfont": {"size": fonts.tick}, "showgrid": False, "zeroline": False, "ticks": "",
            "fixedrange": True, "tickmode": "array"}
    layout.update({
        "xaxis": {**axis, "domain": [0.0, round(split, 5)], "range": [-0.5, H - 0.5],
                  "tickvals": list(range(0, H, stride)), "ticktext": [f"H{h}" for h in range(0, H, stride)]},
        "xaxis2": {**axis, "domain": [round(split + DLA_MLP_GAP_PX / plot_w, 5), 1.0], "range": [-0.5, 0.5],
                   "anchor": "y", "tickvals": [0], "ticktext": ["MLP"]},
        "yaxis": {"range": [L - 0.5, -0.5], "tickmode": "array", "tickvals": list(range(L)),
                  "ticktext": [f"L{li}" for li in range(L)], "tickfont": {"size": fonts.tick}, "showgrid": False,
                  "zeroline": False, "ticks": "", "fixedrange": True},
        "uirevision": "dla_map",
        "meta": {"viz": "dla_map", "pick": "head", "layers": L, "heads": H, "range": lim,
                 "selected": None if selected is None else list(selected)},
    })
    if selected is not None:
        layout["shapes"] = outline(selected[0], selected[1], ROW_OUTLINE, SELECT_INSET)
    return FigureSpec(data, layout)


def _embedding_names(embedding: Mapping[str, float]) -> list[tuple[str, float]]:
    return [("embedding" if k == "embedding" else f"{k} embedding", float(v)) for k, v in embedding.items()]


# ------------------------------------------------------------------------------ head composition


COMPOSITION_NAMES = {"q": "Q-composition", "k": "K-composition", "v": "V-composition"}
COMPOSITION_READS = {"q": "what the later head's queries read", "k": "what the later head's keys read",
                     "v": "what the later head's values read"}


def composition_matrix(scores: np.ndarray) -> np.ndarray:
    """(L, H, L, H) scores as the map's matrix ((L − 1)·H, (L − 1)·H): rows the heads of layers 0..L−2, columns
    the heads of layers 1..L−1."""
    L, H = scores.shape[:2]
    return scores[: L - 1, :, 1:, :].reshape((L - 1) * H, (L - 1) * H)


def pair_indices(L: int, H: int) -> np.ndarray:
    """Each cell's [earlier layer, earlier head, later layer, later head] ((L − 1)·H, (L − 1)·H, 4): what a
    click on the cell opens (sent as a typed array, a few bytes a cell)."""
    n = (L - 1) * H
    rows, cols = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return np.stack([rows // H, rows % H, 1 + cols // H, cols % H], axis=-1)


def layer_blocks(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(L, H, L, H) scores as the strongest pair between each two layers: its score ((L − 1), (L − 1): rows the
    layers 0..L−2, columns 1..L−1; NaN where the later layer is not after the earlier one or nothing was
    computed) and the pair, [layer, head, layer, head] ((L − 1), (L − 1), 4; head 0 where the cell is blank)."""
    L = scores.shape[0]
    best = np.full((L - 1, L - 1), np.nan)
    where = np.zeros((L - 1, L - 1, 4), dtype=np.int64)
    for a in range(L - 1):
        for b in range(1, L):
            where[a, b - 1] = (a, 0, b, 0)
            block = scores[a, :, b, :]
            if b > a and np.isfinite(block).any():
                i, j = np.unravel_index(np.nanargmax(block), block.shape)
                best[a, b - 1], where[a, b - 1] = block[i, j], (a, i, b, j)
    return best, where


def composition_map(scores, *, kind: str, top: Sequence[tuple[int, int, int, int]] = (),
                    selected: tuple[int, int, int, int] | None = None, title: str | None = None,
                    presentation: bool = False, width_px: int | None = None,
                    max_height_px: int | None = None) -> FigureSpec:
    """One kind of composition score as an earlier head × later head map (see the module docstring).

    scores: (L, H, L, H), NaN where the later layer is not after the earlier one (or not computed); kind:
    "q", "k" or "v". top: (earlier layer, head, later layer, head) pairs outlined; selected: one outlined in
    magenta. max_height_px: the tallest the figure may be (the map shrinks to fit). Where a pair's cell would
    be narrower than `MIN_PAIR_CELL_PX` (many heads on a phone), each cell is a pair of layers instead, showing
    the strongest pair of heads between them (``layout.meta.blocks``); a click opens that pair."""
    fonts = fonts_for(presentation)
    check_width(width_px)
    if max_height_px is not None and (isinstance(max_height_px, bool) or not isinstance(max_height_px, int)
                                      or max_height_px < 200):
        raise ValueError(f"max_height_px must be a whole number of pixels ≥ 200, got {max_height_px!r}")
    if kind not in COMPOSITION_NAMES:
        raise ValueError(f"kind must be one of {', '.join(COMPOSITION_NAMES)}, got {kind!r}")
    scores = check_array("scores", scores, 4)
    L, H = scores.shape[:2]
    if scores.shape != (L, H, L, H):
        raise ValueError(f"scores must be (L, H, L, H), got shape {scores.shape}")
    if L < 2:
        return message_figure("This model has one layer: no head has an earlier head to compose with.",
                              presentation=presentation, width_px=width_px)
    top = [check_pair("top", p, (L, H, L, H)) for p in top]
    selected = None if selected is None else check_pair("selected", selected, (L, H, L, H))
    laid = width_px or 720
    right = math.ceil(14 + (18 if presentation else 12) + 6 + 4 * fonts.tick + 10)

    def side_for(labels: list[str]) -> tuple[int, float]:
        left = math.ceil(max(text_width_em(t) for t in labels) * fonts.tick + 14 + fonts.tick * 1.8)  # and title
        side = max(60.0, laid - left - right)
        if max_height_px is not None:
            side = max(60.0, min(side, max_height_px - 200))
        return left, side

    n = (L - 1) * H
    every = H <= 4 and n <= 24  # few heads: each one labelled; else the layers, at their blocks' middles
    left, side = side_for([f"L{li}H{h}" if every else f"L{li}" for li in range(L) for h in range(H)])
    blocks = L > 2 and side / n < MIN_PAIR_CELL_PX
    if blocks:
        left, side = side_for([f"L{li}" for li in range(L)])
    z, row_names, col_names, shown, where, parts = _pair_grid(scores, kind, blocks)
    n = z.shape[0]
    finite = z[np.isfinite(z)]
    hi = float(finite.max()) if finite.size else 1.0
    hi = hi or 1.0
    ticks = nice_ticks(0.0, hi, 5)
    trace = {"type": "heatmap", "z": z.astype(np.float32), "x": col_names, "y": row_names, "zmin": 0.0, "zmax": hi,
             "colorscale": colorscale(SEQUENTIAL), "hoverongaps": False, **shown,
             "colorbar": {"title": {"text": "score", "side": "right", "font": {"size": fonts.tick}},
                          "tickmode": "array", "tickvals": ticks.tolist(), "ticktext": [tick_label(v) for v in ticks],
                          "tickfont": {"size": fonts.tick}, "thickness": 18 if presentation else 12,
                          "outlinewidth": 0, "len": 1.0}}
    default = f"{COMPOSITION_NAMES[kind]} between heads of different layers"
    layout = head_frame(title_text(title, default), parts, fonts, laid, side, left, right,
                        top_extra=fonts.tick * 2.9 + 12)  # the later heads' labels, and the axis's title above
    if blocks:
        axes = (_layer_axis(col_names, fonts, side, top=True), _layer_axis(row_names, fonts, side, top=False))
    else:
        axes = (_block_axis(col_names, L, H, 1, every, fonts, side, top=True),
                _block_axis(row_names, L, H, 0, every, fonts, side, top=False))
    layout.update({"xaxis": axes[0], "yaxis": axes[1], "uirevision": f"composition_{kind}",
                   "meta": {"viz": "composition_map", "kind": kind, "pick": "pair", "layers": L, "heads": H,
                            "blocks": blocks, "top": [list(p) for p in top],
                            "selected": None if selected is None else list(selected)}})
    shapes = [] if blocks else [_block_line(b * H - 0.5, n, vertical) for b in range(1, L - 1)
                                for vertical in (True, False)]
    cell = side / n
    for r, c in dict.fromkeys(where(p) for p in top):  # in block mode two top pairs can share a cell
        shapes += outline(r, c, MARK_LINES, max(MARK_INSET, 1.5 / max(cell, 1)))
    if selected is not None:
        shapes += outline(*where(selected), ROW_OUTLINE, max(SELECT_INSET, 2.5 / max(cell, 1)))
    layout["shapes"] = shapes
    return FigureSpec([trace], layout)


def _pair_grid(scores: np.ndarray, kind: str, blocks: bool) -> tuple:
    """A composition map's cells: (z, row names, column names, the trace's customdata and hover keys, a pair's
    (row, column), the legend's parts), a cell per pair of heads or, with `blocks`, per pair of layers."""
    L, H = scores.shape[:2]
    if not blocks:
        n = (L - 1) * H
        shown = {"customdata": pair_indices(L, H),
                 "hovertemplate": "%{y} → %{x}<br>" + COMPOSITION_NAMES[kind] + " %{z:.3f}<br>click: open both heads"
                                  "<extra></extra>"}
        parts = [f"the earlier head (row) writes {COMPOSITION_READS[kind]} (column)",
                 "‖W_OV·W‖ / (‖W_OV‖·‖W‖); blank = not a later layer", "outlined = strongest pairs"]
        return (composition_matrix(scores), [f"L{i // H}H{i % H}" for i in range(n)],
                [f"L{1 + j // H}H{j % H}" for j in range(n)], shown,
                lambda p: (p[0] * H + p[1], (p[2] - 1) * H + p[3]), parts)
    z, pairs = layer_blocks(scores)
    n = L - 1
    hover = [[f"L{a}H{pairs[a, c, 1]} → L{c + 1}H{pairs[a, c, 3]}, the strongest pair of L{a} → L{c + 1}<br>"
              f"{COMPOSITION_NAMES[kind]} {z[a, c]:.3f}<br>click: open both heads" for c in range(n)] for a in range(n)]
    shown = {"customdata": pairs, "hovertext": hover, "hovertemplate": "%{hovertext}<extra></extra>", "xgap": 1,
             "ygap": 1}
    parts = [f"each cell: the strongest of the {H} × {H} head pairs of two layers (too narrow here for a cell per "
             "pair)", f"the earlier layer's head (row) writes {COMPOSITION_READS[kind]} (column)",
             "‖W_OV·W‖ / (‖W_OV‖·‖W‖)", "outlined = strongest pairs"]
    return (z, [f"L{a}" for a in range(n)], [f"L{b}" for b in range(1, L)], shown, lambda p: (p[0], p[2] - 1),
            parts)


def _layer_axis(names: list[str], fonts: CircuitFonts, side: float, top: bool) -> dict:
    """A composition map's axis in block mode: one category per layer, labelled as often as they fit."""
    step = tick_step(len(names), side, fonts.tick * (3.2 if top else 1.4))
    return _category_axis(len(names), names[::step], names[::step], fonts, top, "layer")


def _block_axis(names: list[str], L: int, H: int, first: int, every: bool, fonts: CircuitFonts, side: float,
                top: bool) -> dict:
    """A composition map's axis: heads as categories, labelled one by one or by layer at each block's middle."""
    if every:
        return _category_axis(len(names), list(names), names, fonts, top, "head")
    # a category axis takes its ticks by name: each block's middle head
    step = tick_step(L - 1, side, fonts.tick * (3.2 if top else 1.4))
    blocks = range(0, L - 1, step)
    return _category_axis(len(names), [names[b * H + H // 2] for b in blocks], [f"L{b + first}" for b in blocks],
                          fonts, top, "head")


def _category_axis(n: int, vals: list[str], text: list[str], fonts: CircuitFonts, top: bool, what: str) -> dict:
    """The later (top, x) or earlier (y, square cells) axis of a composition map, `n` categories."""
    axis = {"type": "category", "range": [-0.5, n - 0.5] if top else [n - 0.5, -0.5], "tickmode": "array",
            "tickvals": vals, "ticktext": text, "tickfont": {"size": fonts.tick}, "showgrid": False,
            "zeroline": False, "ticks": "", "fixedrange": True,
            "title": {"text": f"later {what}" if top else f"earlier {what}", "font": {"size": fonts.tick}}}
    if top:
        axis.update(side="top", constrain="domain")
    else:
        axis.update(scaleanchor="x", scaleratio=1, constrain="domain")
    return axis


def _block_line(at: float, n: int, vertical: bool) -> dict:
    """A thin grey line between two layers' blocks of heads."""
    if vertical:
        ends = {"x0": at, "x1": at, "y0": -0.5, "y1": n - 0.5}
    else:
        ends = {"y0": at, "y1": at, "x0": -0.5, "x1": n - 0.5}
    return {"type": "line", "xref": "x", "yref": "y", **ends, "line": {"color": "rgba(128,128,128,0.6)", "width": 1},
            "layer": "above"}
