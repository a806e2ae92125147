"""Attention heatmaps: one layer's heads, one head enlarged, or every layer × head.

`attention_view` picks one of these for a view name from `ATTENTION_VIEWS` (what the app's radio
offers), so the choice lives here rather than in the UI code. The figures are `FigureSpec`s.

Conventions shared by all three figures
* rows are query positions (position 0 on top), columns are key positions;
* the axes are category axes whose categories are unique position labels ``"tok" (i)``, so hover can
  name the tokens and repeated tokens never merge; ticks are placed by integer position
  (tickvals) with the (escaped, possibly thinned) tokens as tick text;
* values travel as integer milli-units (see ``viz._common``); hover names layer, head, query and
  key and reads ``0.231`` for weights (each trace carries its "layer l, head h" as trace meta);
* masked cells (NaN / -inf input, or ``mask`` True) are left out or sent as NaN, so they show the
  hatch drawn behind every panel (a layout image) and do not hover;
* colours follow ``viz._common``: weights on `SEQUENTIAL`, scores on `DIVERGING` (red = positive);
  the background is transparent so the figures sit on light and dark pages;
* every token is labelled up to `HEAD_LABEL_LIMIT` positions (one head) or `GRID_LABEL_LIMIT`
  (several panels); longer texts open on the last positions (all data and labels are sent, so
  panning and double-click show the rest), and the tick font is sized to the laid-out cells. Where a
  cell is too small for a readable label (`READABLE_TICK_PX`, 16 px with large fonts), every k-th
  token is labelled instead, always the newest (hover names every cell);
* ``layout.meta`` holds what a page script needs to outline a query row itself: T, the first
  position shown (offset), and each panel's axes, layer and head.

Payload. A causal map is sent as rectangular tiles: each band of B query rows becomes one
integer tile for the keys left of its diagonal block (u1 when every value ≤ 0.255, else u2) and
one float32 tile, NaN above the diagonal, for the diagonal block; fully masked tiles are not sent.
B is picked per head from {8, 16, 32, 64, T} by estimated size, and each tile overlaps its
right/lower neighbour by one cell (same values) so the separately drawn images show no seams.
Measured sizes and timings live in bench/RESULTS.md, not here. Pass the mask
(``mask=causal_mask(T)``) or NaN/-inf: the model's exact zeros alone count as data, so the whole
square grid is sent instead of the tiles.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ._common import (
    DIVERGING,
    FONT,
    MASKED_HINT,
    MILLI,
    MILLI_FORMAT,
    MILLI_SEPARATORS,
    PRESENTATION_FONT_PX,
    READABLE_TICK_PX,
    ROW_OUTLINE,
    SEQUENTIAL,
    TOKEN_TICK_CHARS,
    TRANSPARENT,
    colorscale,
    encoded_milli,
    esc,
    hatch_image,
    hover_label,
    nice_ticks,
    short_token,
    text_width_em,
    tick_label,
    title_y,
    to_milli,
    wrapped,
)
from .payload import FigureSpec
from .positional import message_figure

KINDS = ("weights", "scores")
ATTENTION_VIEWS = ("weights", "scores", "all layers")  # the view names a UI offers; see attention_view
OVERVIEW_MAX_T = 48
COLOUR_MODES = ("linear", "row", "log")  # how weights are coloured; see attention_view
HEAD_LABEL_LIMIT = 64  # one head: every token labelled up to this length; past it, open on the last ones
GRID_LABEL_LIMIT = 32  # a grid of panels: the same, for each panel
LOG_FLOOR = -3.0  # colour="log": log10(weight) clipped to [LOG_FLOOR, 0]
_TILE_SIZES = (8, 16, 32, 64)
ATTENTION_BUDGET = 135_000  # bytes of cell data per figure, leaving room for the layout within a 150 KB target
# what one extra tile costs, in bytes-equivalent: its own JSON plus the browser's per-trace render work
_TRACE_OVERHEAD = 700


def causal_mask(t: int) -> np.ndarray:
    """(t, t) bool mask, True above the diagonal (key after query = future position)."""
    return np.triu(np.ones((t, t), dtype=bool), 1)


# ----------------------------------------------------------------------------- validation


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be 'weights' or 'scores', got {kind!r}")


def _check_square(shape: tuple[int, ...], what: str = "attention") -> int:
    tq, tk = shape[-2], shape[-1]
    if tq != tk:
        raise ValueError(f"{what} is {tq}×{tk} (query × key) but must be square")
    if tq == 0:
        raise ValueError(f"{what} is empty (0×0)")
    return tq


def _check_tokens(tokens: Sequence[str], t: int) -> list[str]:
    tokens = [str(tok) for tok in tokens]
    if len(tokens) != t:
        raise ValueError(f"attention is {t}×{t} but {len(tokens)} token labels were given")
    return tokens


def _masks(values: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Boolean masked-cell array shaped like `values`: non-finite input or `mask` True."""
    masked = ~np.isfinite(values)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        t = values.shape[-1]
        if mask.shape[-2:] != (t, t) or (mask.ndim > 2 and mask.shape != values.shape):
            shape = "×".join(map(str, mask.shape))
            raise ValueError(f"mask is {shape} but attention is {t}×{t}")
        masked = masked | mask
    return masked


def _check_weight_range(q: np.ndarray) -> None:
    finite = q[np.isfinite(q)]
    if finite.size and (finite.min() < -1 or finite.max() > MILLI + 1):
        lo, hi = finite.min() / MILLI, finite.max() / MILLI
        raise ValueError(
            f"attention weights must lie in [0, 1] but range {lo:.3g}..{hi:.3g}; "
            "pass kind='scores' for pre-softmax scores"
        )


# ----------------------------------------------------------------------------- tiling


def _runs(masked: np.ndarray, b: int) -> list[tuple[int, int, int, int, bool]]:
    """Rectangles (r0, r1, c0, c1, mixed) covering every unmasked cell of a (T, T) mask.

    The grid is cut into b×b tiles; fully masked tiles are dropped, consecutive tiles of the same
    kind in a band are merged, and identical runs in consecutive bands are merged vertically.
    `mixed` rectangles hold some masked cells (sent as float32 NaN); the others hold none.
    """
    t = masked.shape[0]
    edges = np.arange(0, t, b)
    counts = np.add.reduceat(np.add.reduceat(masked.astype(np.int32), edges, 0), edges, 1)
    sizes = np.minimum(edges + b, t) - edges
    full = np.outer(sizes, sizes)
    kinds = np.where(counts == 0, 0, np.where(counts == full, 2, 1))  # 0 clean, 1 mixed, 2 masked
    done: list[list[int]] = []
    open_runs: dict[tuple[int, int, int], list[int]] = {}
    for bi, r0 in enumerate(edges):
        r1 = min(r0 + b, t)
        band: list[tuple[int, int, int]] = []
        for ci, kind in enumerate(kinds[bi]):
            if kind == 2:
                continue
            c0, c1 = int(edges[ci]), int(min(edges[ci] + b, t))
            if band and band[-1][2] == kind and band[-1][1] == c0:
                band[-1] = (band[-1][0], c1, kind)
            else:
                band.append((c0, c1, int(kind)))
        next_open: dict[tuple[int, int, int], list[int]] = {}
        for key in band:
            run = open_runs.pop(key, None)
            if run is not None and run[1] == r0:
                run[1] = r1
            else:
                run = [int(r0), int(r1), key[0], key[1], key[2]]
                done.append(run)
            next_open[key] = run
        open_runs = next_open
    return [(r0, r1, c0, c1, bool(kind)) for r0, r1, c0, c1, kind in done]


def _extend(masked: np.ndarray, run: tuple[int, int, int, int, bool]) -> tuple[int, int, int, int]:
    """Grow a rectangle by one cell right and down where that stays valid.

    Each tile is drawn as a separately positioned image at fractional pixel offsets, so abutting
    tiles leave a faint background-coloured seam. Overlapping the neighbour by one cell (same
    values) hides it. A clean tile only grows over unmasked cells; a mixed one over any cell
    row/column that holds at least one unmasked cell.
    """
    r0, r1, c0, c1, mixed = run
    t = masked.shape[0]

    def ok(region: np.ndarray) -> bool:
        return region.size > 0 and (not region.all() if mixed else not region.any())

    if c1 < t and ok(masked[r0:r1, c1]):
        c1 += 1
    if r1 < t and ok(masked[r1, c0:c1]):
        r1 += 1
    return r0, r1, c0, c1


def _run_cost(q: np.ndarray, masked: np.ndarray, run: tuple[int, int, int, int, bool]) -> int:
    r0, r1, c0, c1 = _extend(masked, run)
    width = 4 if run[4] else encoded_milli(q[r0:r1, c0:c1]).itemsize
    return math.ceil((r1 - r0) * (c1 - c0) * width / 3) * 4 + _TRACE_OVERHEAD


def _tiles(q: np.ndarray, masked: np.ndarray, xref: str, yref: str, budget: int, name: str) -> list[dict]:
    """Heatmap trace dicts (one per rectangle) for one panel of milli-unit values.

    In the browser a trace costs far more than its bytes (plotly.js draws each one separately), so
    the panel uses the fewest rectangles whose data fits in `budget` bytes (a whole panel is one
    trace when it fits); when nothing fits, the cheapest by bytes plus a per-trace cost. `name`
    ("layer 1, head 3") becomes each trace's meta, which the shared hovertemplate shows.
    """
    t = q.shape[0]
    options = [_runs(masked, b) for b in sorted({b for b in _TILE_SIZES if b < t} | {t}, reverse=True)]
    costs = [sum(_run_cost(q, masked, r) - _TRACE_OVERHEAD for r in runs) for runs in options]
    fitting = [i for i, c in enumerate(costs) if c <= budget]
    if fitting:
        best = options[min(fitting, key=lambda i: (len(options[i]), costs[i]))]
    else:
        best = options[min(range(len(options)), key=lambda i: costs[i] + _TRACE_OVERHEAD * len(options[i]))]
    q = np.where(masked, np.nan, q)
    traces = []
    for run in best:
        r0, r1, c0, c1 = _extend(masked, run)
        trace: dict = {"type": "heatmap", "z": encoded_milli(q[r0:r1, c0:c1]), "meta": name}
        if c0:
            trace["x0"] = c0
        if r0:
            trace["y0"] = r0
        if xref != "x":
            trace["xaxis"] = xref
        if yref != "y":
            trace["yaxis"] = yref
        traces.append(trace)
    return traces


# ----------------------------------------------------------------------------- colour


def _check_colour(colour: str) -> None:
    if colour not in COLOUR_MODES:
        raise ValueError(f"colour must be one of {', '.join(map(repr, COLOUR_MODES))}, got {colour!r}")


def _colour_values(values: np.ndarray, masked: np.ndarray, colour: str) -> np.ndarray:
    """Weights (N, T, T) as coloured: as they are ("linear"), each query row divided by its largest
    unmasked weight ("row"; a row of zeros stays 0), or log10(weight) clipped to [LOG_FLOOR, 0]
    ("log"). Masked cells come back NaN."""
    vals = np.where(masked, np.nan, values)
    if colour == "row":
        with np.errstate(invalid="ignore"):
            peak = np.max(np.where(masked, -np.inf, values), axis=-1, keepdims=True)
        peak = np.where(np.isfinite(peak) & (peak > 0), peak, 1.0)
        return np.clip(vals / peak, 0.0, 1.0)
    if colour == "log":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.clip(np.log10(np.clip(vals, 0.0, None)), LOG_FLOOR, 0.0)
    return vals


def _value_name(kind: str, colour: str) -> str:
    if kind == "scores":
        return "score"
    return {"linear": "weight", "row": "weight ÷ row max", "log": "log₁₀ weight"}[colour]


def _colour_axis(q: np.ndarray, masked: np.ndarray, kind: str, colour: str, show_scale: bool, fonts: _Fonts,
                 x: float, below: float | None = None) -> dict:
    """The shared colour axis; its bar stands right of the panels at paper x = `x`, or, when
    `below` is given, lies under them with its top at paper y = `below` (narrow figures)."""
    if kind == "scores":
        vals = q[~masked]
        bound = float(np.abs(vals).max()) / MILLI if vals.size else 1.0
        bound = bound or 1.0
        lo, hi, scale = -bound, bound, DIVERGING
    elif colour == "log":
        lo, hi, scale = LOG_FLOOR, 0.0, SEQUENTIAL
    else:
        lo, hi, scale = 0.0, 1.0, SEQUENTIAL
    ticks = nice_ticks(lo, hi, 4 if colour == "log" else 5)
    return {
        "cmin": lo * MILLI,
        "cmax": hi * MILLI,
        "colorscale": colorscale(scale),
        "showscale": show_scale,
        "colorbar": {
            "title": {"text": _value_name(kind, colour), "side": "right", "font": {"size": fonts.axis_title}},
            "tickmode": "array",
            "tickvals": (ticks * MILLI).tolist(),
            "ticktext": [tick_label(v) for v in ticks],
            "tickfont": {"size": fonts.colorbar},
            "thickness": fonts.cb_thick,
            "len": 1.0,
            "x": x,
            "xanchor": "left",
            "outlinewidth": 0,
            **({"orientation": "h", "x": 0.0, "y": below, "yanchor": "top", "len": min(1.0, x), "lenmode": "fraction",
                "title": {"text": _value_name(kind, colour), "side": "right", "font": {"size": fonts.axis_title}}}
               if below is not None else {}),
        },
    }


# ----------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class _Fonts:
    tick_min: float  # below this the labels are thinned instead of shrunk
    tick_max: float
    title: float
    sub: float
    axis_title: float
    panel_title: float
    hover: float
    colorbar: float
    cb_thick: int
    gap: float  # px between panel columns
    goal_cell: float  # px per cell a grid tries to give every token label


_NORMAL = _Fonts(tick_min=READABLE_TICK_PX, tick_max=12, title=14, sub=11, axis_title=11, panel_title=11, hover=12,
                 colorbar=10, cb_thick=12, gap=12, goal_cell=16)
_PRESENTING = _Fonts(tick_min=PRESENTATION_FONT_PX, tick_max=20, title=22, sub=16, axis_title=17, panel_title=17,
                     hover=18, colorbar=16, cb_thick=18, gap=18, goal_cell=PRESENTATION_FONT_PX * 1.25)
_LINE = 1.25  # label pitch / font size: labels closer than this overlap
SCALE_BELOW_PX = 480  # figures laid out narrower than this (phones) put the colour bar under the panels
_MIN_PANEL_PX = 24


@dataclass(frozen=True)
class _Labels:
    font: float
    step: int
    rotate: bool


@dataclass(frozen=True)
class _Geometry:
    ncols: int
    nrows: int
    panel: float
    height: int
    margin: dict
    hgap: float
    vgap: float
    labels: _Labels


def _below_y(geo: "_Geometry", labels: "_Labels", fonts: _Fonts, plot_h: float) -> float:
    """Paper y of a colour bar laid under the panels: below the key labels and the axis title."""
    label_em = (geo.margin["b"] - (fonts.cb_thick + fonts.colorbar * 1.5 + fonts.axis_title * 1.5 + 14)) / plot_h
    return round(-label_em, 4)


def _labels_for(cell: float, fonts: _Fonts, label_em: float) -> _Labels:
    """Tick font and stride for cells `cell` px apart: the largest font up to tick_max whose labels
    do not overlap, every label while that font is ≥ tick_min, else tick_min and every step-th."""
    font = min(fonts.tick_max, math.floor(cell / _LINE))
    if font >= fonts.tick_min:
        step = 1
    else:
        font = fonts.tick_min
        step = math.ceil(font * _LINE / cell)
    rotate = label_em * font + 4 > cell * step
    return _Labels(float(font), step, rotate)


def _geometry(n: int, ncols: int, visible: int, *, fonts: _Fonts, label_em: float, cb_em: float, width_px: int,
              max_height_px: int | None, show_scale: bool, sub_lines: int, panel_titles: bool,
              row_title_lines: int, title_lines: int = 1) -> _Geometry:
    """Margins, panel size and tick labels for n square panels in `ncols` columns, `visible`
    positions across each, laid out for `width_px` and (if given) at most `max_height_px` tall.
    Margins depend on the label font, which depends on the panel size: iterated to a fixed point,
    then the smaller font / larger stride of the last two rounds is kept so labels never overlap."""
    nrows = math.ceil(n / ncols)
    hgap = fonts.gap
    labels = _Labels(fonts.tick_max, 1, True)
    for _ in range(6):
        lab_w = label_em * labels.font
        xlab_h = lab_w if labels.rotate else labels.font * 1.3
        below = show_scale and width_px < SCALE_BELOW_PX  # a phone: the colour bar goes under the panels
        margin = {
            "l": math.ceil(lab_w + 6 + fonts.axis_title * 1.3 * row_title_lines + 10),
            "r": math.ceil(10 + fonts.cb_thick + 6 + cb_em * fonts.colorbar + fonts.axis_title * 1.4 + 10)
            if show_scale and not below else 14,
            # title 8 px from the top; plotly.js puts a subtitle 1.6 em below the title's box
            "t": math.ceil(8 + fonts.title * 1.25 * title_lines
                           + (fonts.sub * (1.6 + 1.3 * sub_lines) if sub_lines else 0) + 8
                           + (fonts.panel_title * 1.5 if panel_titles else 0)),
            "b": math.ceil(xlab_h + 6 + fonts.axis_title * 1.3 + 10
                           + (fonts.cb_thick + fonts.colorbar * 1.5 + fonts.axis_title * 1.5 + 14 if below else 0)),
        }
        vgap = (fonts.panel_title * 1.5 + 8) if panel_titles else 12
        panel = (width_px - margin["l"] - margin["r"] - (ncols - 1) * hgap) / ncols
        if max_height_px is not None:
            fit = (max_height_px - margin["t"] - margin["b"] - (nrows - 1) * vgap) / nrows
            panel = min(panel, fit)
        panel = max(float(_MIN_PANEL_PX), panel)
        new = _labels_for(panel / visible, fonts, label_em)
        if new == labels:
            break
        last, labels = labels, new
    else:
        labels = _Labels(min(last.font, labels.font), max(last.step, labels.step), last.rotate or labels.rotate)
    height = margin["t"] + margin["b"] + nrows * panel + (nrows - 1) * vgap
    if max_height_px is not None:
        height = min(height, max_height_px)
    return _Geometry(ncols, nrows, panel, int(math.floor(height)), margin, hgap, vgap, labels)


def _pick_columns(n: int, visible: int, fonts: _Fonts, max_height_px: int | None, **kw) -> _Geometry:
    """Columns for a grid of n panels: the most columns (up to 4, no emptier rows than needed)
    whose cells reach fonts.goal_cell px; if none does, the largest panels under a height limit,
    else 2 columns (T > 12 at the default width: labels stay legible). Without a height limit a
    single column is never chosen for several panels."""
    options = sorted({math.ceil(n / rows) for rows in range(1, n + 1) if math.ceil(n / rows) <= 4}, reverse=True)
    if max_height_px is None:  # no height limit: one column would only make the figure taller
        options = [c for c in options if c >= min(n, 2)]
    geoms = [_geometry(n, c, visible, fonts=fonts, max_height_px=max_height_px, **kw) for c in options]
    for g in geoms:
        if g.panel / visible >= fonts.goal_cell:
            return g
    if max_height_px is not None:
        return max(geoms, key=lambda g: (round(g.panel), g.ncols))
    return next(g for g in geoms if g.ncols <= 2)


# ----------------------------------------------------------------------------- figure builder


def _attention_figure(
    values: np.ndarray,
    masked: np.ndarray,
    tokens: list[str],
    *,
    ncols: int | None,
    panels: list[tuple[int, int]],
    panel_titles: list[str],
    row_titles: list[str] | None,
    kind: str,
    title: str,
    width_px: int,
    max_height_px: int | None,
    focus: int | None,
    colour: str = "linear",
    presentation: bool = False,
    query: int | None = None,
    show_scale: bool = True,
    title_prefix: str = "",
) -> FigureSpec:
    """Figure with one panel per values[k] (N, T, T); panels[k] = (layer, head) of that panel.

    ncols None picks the columns (`_pick_columns`). focus: label every position up to this many,
    and past it open on the last `focus` positions (None: always show all). title_prefix (escaped)
    goes before the title; a title wider than the figure is broken into lines (a phone)."""
    n, t = values.shape[0], values.shape[-1]
    if kind == "scores":
        colour = "linear"  # the colour modes are for weights; scores keep their symmetric scale
    if kind == "weights":
        _check_weight_range(to_milli(np.where(masked, np.nan, values)))
        q = to_milli(_colour_values(values, masked, colour))
        if colour != "log":
            q = np.clip(q, 0, MILLI)
    else:
        q = to_milli(np.where(masked, np.nan, values))
    fonts = _PRESENTING if presentation else _NORMAL
    visible = t if focus is None else min(t, focus)
    offset = t - visible

    ticktext = [short_token(tok) for tok in tokens]
    label_em = max(text_width_em(tok if len(tok) <= TOKEN_TICK_CHARS else tok[: TOKEN_TICK_CHARS - 1] + "…")
                   for tok in tokens)
    label_em = max(label_em, 1.2)
    subtitle = []
    if masked.any():
        subtitle.append(MASKED_HINT)
    if offset:
        subtitle.append(f"showing the last {visible} of {t} positions; drag to pan, double-click for all")
    sub_text = " · ".join(subtitle)
    if text_width_em(sub_text) * fonts.sub > width_px - 20:
        sub_text = "<br>".join(subtitle)
    sub_lines = sub_text.count("<br>") + 1 if sub_text else 0
    title = wrapped(title_prefix + title, (width_px - 20) / fonts.title)
    cb_em = 4.5 if colour == "log" or kind == "scores" else 4.0
    kw = dict(fonts=fonts, label_em=label_em, cb_em=cb_em, width_px=width_px, show_scale=show_scale,
              sub_lines=sub_lines, panel_titles=any(panel_titles),
              row_title_lines=2 if row_titles else 1, title_lines=title.count("<br>") + 1)
    if ncols is None:
        geo = _pick_columns(n, visible, max_height_px=max_height_px, **kw)
    else:
        geo = _geometry(n, max(1, min(ncols, n)), visible, max_height_px=max_height_px, **kw)
    margin, labels = geo.margin, geo.labels
    plot_w = max(1.0, width_px - margin["l"] - margin["r"])
    plot_h = max(1.0, geo.height - margin["t"] - margin["b"])
    col_frac, row_frac = geo.panel / plot_w, geo.panel / plot_h
    right_frac = min(1.0, (geo.ncols * geo.panel + (geo.ncols - 1) * geo.hgap) / plot_w)

    tickvals = np.arange((t - 1) % labels.step, t, labels.step)  # the newest position is always labelled
    labels_cat = [f'"{esc(tok)}" ({i})' for i, tok in enumerate(tokens)]
    tickfont = {"size": labels.font}
    # Axis settings every panel shares travel once, as template defaults for all x / y axes. The
    # categories stay on the first axes (the others match them): as template defaults plotly.js
    # fails to draw matched category axes.
    axis_common = {
        "type": "category",
        "tickmode": "array",
        "tickvals": tickvals.astype(np.uint8 if t <= 256 else np.uint16),  # a typed array: half the JSON
        "ticktext": [ticktext[i] for i in tickvals],
        "tickfont": tickfont,
        "showgrid": False,
        "zeroline": False,
        "ticks": "",
        "constrain": "domain",
        "title": {"standoff": 4},
        "showticklabels": False,
    }
    value = _value_name(kind, colour)
    hover = f"%{{meta}}<br>query %{{y}} → key %{{x}}<br>{value} {MILLI_FORMAT}<extra></extra>"
    title_layout = {"text": title, "x": 0.01, "xanchor": "left", "y": title_y(geo.height, fonts.title, title),
                    "yanchor": "top", "yref": "container", "font": {"size": fonts.title}}
    if sub_text:
        title_layout["subtitle"] = {"text": sub_text, "font": {"size": fonts.sub}}
    layout: dict = {
        "template": {
            "data": {"heatmap": [{"type": "heatmap", "coloraxis": "coloraxis", "hoverongaps": False,
                                  "hovertemplate": hover}]},
            "layout": {"xaxis": {**axis_common, "tickangle": -90 if labels.rotate else 0, "constraintoward": "left"},
                       "yaxis": axis_common,
                       # defaults sent once: the hatch behind masked cells (each panel's image only names
                       # its axes), the panel titles' style
                       "imagedefaults": {"source": hatch_image(geo.panel), "x": 0, "y": 1, "sizex": 1, "sizey": 1,
                                         "xanchor": "left", "yanchor": "top", "sizing": "stretch", "layer": "below"},
                       "annotationdefaults": {"xref": "paper", "yref": "paper", "xanchor": "center",
                                              "yanchor": "bottom", "yshift": 2, "showarrow": False,
                                              "font": {"size": fonts.panel_title}},
                       # the query-row outline: a whole row, two lines per panel (ROW_OUTLINE)
                       "shapedefaults": {"type": "rect", "x0": -0.5, "x1": t - 0.5, "fillcolor": TRANSPARENT,
                                         "layer": "above"}},
        },
        "separators": MILLI_SEPARATORS,
        "title": title_layout,
        "font": {**FONT, "size": fonts.axis_title},
        "height": geo.height,
        "margin": margin,
        "plot_bgcolor": TRANSPARENT,
        "paper_bgcolor": TRANSPARENT,
        "coloraxis": _colour_axis(q, masked, kind, colour, show_scale, fonts, round(right_frac + 8 / plot_w, 4),
                                  _below_y(geo, labels, fonts, plot_h) if show_scale and width_px < SCALE_BELOW_PX
                                  else None),
        "hoverlabel": hover_label(fonts.hover),
        "uirevision": "attention",
        "meta": {
            "viz": "attention", "kind": kind, "colour": colour, "unit": 1 / MILLI, "T": t, "offset": offset,
            "query": query, "outline": [dict(line) for line in ROW_OUTLINE], "panels": [],
            "label_px": labels.font, "label_step": labels.step,  # tick font and stride it was laid out with
        },
        "annotations": [],
        "images": [],
        "shapes": [],
    }
    data: list[dict] = []
    for k in range(n):
        row, col = divmod(k, geo.ncols)
        suffix = "" if k == 0 else str(k + 1)
        xref, yref = f"x{suffix}", f"y{suffix}"
        x0 = col * (geo.panel + geo.hgap) / plot_w
        y1 = 1 - row * (geo.panel + geo.vgap) / plot_h
        bottom = row == geo.nrows - 1 or k + geo.ncols >= n
        xaxis: dict = {"domain": [round(x0, 5), round(min(1.0, x0 + col_frac), 5)], "anchor": yref}
        # square cells whatever width the page gives the figure
        yaxis: dict = {"domain": [round(max(0.0, y1 - row_frac), 5), round(y1, 5)], "anchor": xref,
                       "scaleanchor": xref}
        if bottom:  # tick labels under the lowest panel of each column and left of each row only
            xaxis["showticklabels"] = True
        if col == 0:
            yaxis["showticklabels"] = True
        if k == 0:
            # (categoryorder defaults to "array" when a categoryarray is given)
            xaxis.update(categoryarray=labels_cat, range=[offset - 0.5, t - 0.5])
            yaxis.update(categoryarray=labels_cat, range=[t - 0.5, offset - 0.5])
        else:  # matched axes share the range (and its square cells: only the first y axis is anchored)
            xaxis["matches"], yaxis["matches"] = "x", "y"
            del yaxis["scaleanchor"]
        if bottom and k == (geo.nrows - 1) * geo.ncols:
            xaxis["title"] = {"text": "key position (attended to)"}
        if col == 0:
            yaxis["title"] = {"text": row_titles[row] if row_titles else "query position"}
        layout[f"xaxis{suffix}"] = xaxis
        layout[f"yaxis{suffix}"] = yaxis
        layer, head = panels[k]
        layout["meta"]["panels"].append({"xaxis": xref, "yaxis": yref, "layer": layer, "head": head})
        if panel_titles[k]:
            layout["annotations"].append({"text": panel_titles[k], "x": round(x0 + col_frac / 2, 5),
                                          "y": round(y1, 5)})
        if masked[k].any():
            layout["images"].append({"xref": f"{xref} domain", "yref": f"{yref} domain"})
        if query is not None:
            for line in ROW_OUTLINE:
                layout["shapes"].append({"xref": xref, "yref": yref, "y0": query - 0.5, "y1": query + 0.5,
                                         "line": dict(line)})
        data.extend(_tiles(q[k], masked[k], xref, yref, ATTENTION_BUDGET // n, f"layer {layer}, head {head}"))
    for key in ("annotations", "images", "shapes"):
        if not layout[key]:
            del layout[key]
    return FigureSpec(data, layout)


# ----------------------------------------------------------------------------- public API


def _checked(attn, tokens: Sequence[str], kind: str, dims: str) -> tuple[np.ndarray, int, list[str]]:
    """Validate a public call: the kind, an array of shape `dims` (e.g. "(heads, T, T)") with square
    last two axes, and one token label per position. Returns (array as float64, T, labels)."""
    _check_kind(kind)
    arr = np.asarray(attn, dtype=np.float64)
    ndim = dims.count(",") + 1
    if arr.ndim != ndim:
        raise ValueError(f"attention must be {ndim}-D {dims}, got shape {arr.shape}")
    t = _check_square(arr.shape)
    return arr, t, _check_tokens(tokens, t)


def _what(kind: str) -> str:
    return "weights" if kind == "weights" else "scores (before softmax)"


def _check_size(name: str, value: object, least: int) -> None:
    if value is None and name == "max_height_px":
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name} must be a whole number of pixels ≥ {least}, got {value!r}")


def _check_common(colour: str, query: int | None, t: int, width_px: int, max_height_px: int | None) -> None:
    _check_colour(colour)
    if query is not None:
        _index("query", query, t, "the text has")
    _check_size("width_px", width_px, 120)
    _check_size("max_height_px", max_height_px, 120)


def _check_badges(badges: Mapping[int, str] | None) -> dict[int, str]:
    """Head badges as a plain dict (empty for None), else ValueError."""
    if badges is None:
        return {}
    if not isinstance(badges, Mapping):
        raise ValueError(f"badges must map head numbers to text, got {type(badges).__name__}")
    if any(isinstance(h, bool) or not isinstance(h, (int, np.integer)) for h in badges):
        raise ValueError(f"badges must be keyed by head numbers, got keys {list(badges)!r}")
    return {int(h): str(text) for h, text in badges.items() if text is not None}


def _prefix_text(prefix: str | None) -> str:
    """A title prefix (plain text) as the title shows it: escaped, "" for None."""
    return "" if prefix is None else esc(prefix)


def _badge_text(badge: str | None) -> str:
    """" · <badge>" (escaped) for a title, or "" when there is none."""
    return f" · {esc(badge)}" if badge else ""


def attention_grid(
    attn: np.ndarray,
    tokens: Sequence[str],
    layer: int,
    *,
    heads: Sequence[int] | None = None,
    kind: str = "weights",
    mask: np.ndarray | None = None,
    width_px: int = 1000,
    max_height_px: int | None = None,
    colour: str = "linear",
    presentation: bool = False,
    query: int | None = None,
    ncols: int | None = None,
    badges: Mapping[int, str] | None = None,
    title_prefix: str | None = None,
) -> FigureSpec:
    """One layer's heads as a grid of square heatmaps with one shared colour scale.

    attn: (H, T, T) post-softmax weights (kind="weights", colour scale fixed 0–1) or pre-softmax
    scores (kind="scores", symmetric `DIVERGING` scale around 0, red = positive). Masked cells:
    NaN/-inf, or `mask` True ((T, T) or (H, T, T)); they show the hatch. heads: which heads to show
    (default all). width_px: the width the figure is laid out for; max_height_px: the figure is
    never taller (panels shrink, labels adapt). ncols None: 4 columns while every token label fits
    (about T ≤ 12 at 1000 px), else fewer (see `_pick_columns`). Every position is labelled up to
    `GRID_LABEL_LIMIT`; past it the figure opens on the last GRID_LABEL_LIMIT positions.
    colour ("linear" | "row" | "log", weights only), presentation (large fonts) and query (outline
    that query row in every panel) as in `attention_view`. badges: head → plain text (escaped)
    added to that head's panel title, "head 2 · previous-token". title_prefix: plain text (escaped)
    before the title, as in `attention_view` (the same in `attention_head` and `attention_overview`).
    """
    attn, t, tokens = _checked(attn, tokens, kind, "(heads, T, T)")
    _check_common(colour, query, t, width_px, max_height_px)
    masked = np.broadcast_to(_masks(attn, mask), attn.shape)
    n_heads = attn.shape[0]
    heads = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad or not heads:
        raise ValueError(f"heads {bad or heads} out of range: this layer has {n_heads} heads")
    what = "attention " + _what(kind)
    badges = _check_badges(badges)
    return _attention_figure(
        attn[heads], masked[heads], tokens, ncols=ncols, panels=[(int(layer), h) for h in heads],
        panel_titles=[f"head {h}" + _badge_text(badges.get(h)) for h in heads], row_titles=None, kind=kind,
        title=f"Layer {layer} {what}", width_px=width_px, max_height_px=max_height_px, focus=GRID_LABEL_LIMIT,
        colour=colour, presentation=presentation, query=query, title_prefix=_prefix_text(title_prefix),
    )


def attention_head(
    attn2d: np.ndarray,
    tokens: Sequence[str],
    layer: int,
    head: int,
    kind: str = "weights",
    *,
    mask: np.ndarray | None = None,
    width_px: int = 720,
    max_height_px: int | None = None,
    colour: str = "linear",
    presentation: bool = False,
    query: int | None = None,
    badge: str | None = None,
    title_prefix: str | None = None,
) -> FigureSpec:
    """A single head, large, with colour bar; same conventions as `attention_grid`, but every
    position is labelled up to `HEAD_LABEL_LIMIT` (past it: opens on the last ones). badge: plain
    text (escaped) appended to the title after " · ", e.g. the head's role."""
    attn2d, t, tokens = _checked(attn2d, tokens, kind, "(T, T)")
    _check_common(colour, query, t, width_px, max_height_px)
    masked = _masks(attn2d, mask)
    return _attention_figure(
        attn2d[None], masked[None], tokens, ncols=1, panels=[(int(layer), int(head))], panel_titles=[""],
        row_titles=None, kind=kind,
        title=f"Layer {layer}, head {head}: attention {_what(kind)}" + _badge_text(badge), width_px=width_px,
        max_height_px=max_height_px, focus=HEAD_LABEL_LIMIT, colour=colour, presentation=presentation, query=query,
        title_prefix=_prefix_text(title_prefix),
    )


def attention_overview(
    attn: np.ndarray,
    tokens: Sequence[str],
    *,
    kind: str = "weights",
    mask: np.ndarray | None = None,
    width_px: int = 1000,
    max_tokens: int = OVERVIEW_MAX_T,
    max_height_px: int | None = None,
    colour: str = "linear",
    presentation: bool = False,
    query: int | None = None,
    title_prefix: str | None = None,
) -> FigureSpec:
    """Every layer × head as small multiples (rows = layers), for prompts of at most `max_tokens` tokens.

    attn: (L, H, T, T). The panels get small quickly, so longer prompts raise ValueError. Tick
    labels are thinned to what the small panels hold.
    """
    attn, t, tokens = _checked(attn, tokens, kind, "(layers, heads, T, T)")
    if t > max_tokens:
        raise ValueError(
            f"the all-layers overview needs T ≤ {max_tokens} tokens but T = {t}; "
            "pick one layer (attention_grid) instead"
        )
    _check_common(colour, query, t, width_px, max_height_px)
    n_layers, n_heads = attn.shape[:2]
    flat = attn.reshape(n_layers * n_heads, t, t)
    masked = np.broadcast_to(_masks(attn, mask), attn.shape).reshape(flat.shape)
    titles = [f"head {h}" if layer == 0 else "" for layer in range(n_layers) for h in range(n_heads)]
    rows = [f"layer {layer}<br>query" for layer in range(n_layers)]
    panels = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    return _attention_figure(
        flat, masked, tokens, ncols=n_heads, panels=panels, panel_titles=titles, row_titles=rows, kind=kind,
        title=f"Attention {_what(kind)}: every layer (rows) × head (columns)", width_px=width_px,
        max_height_px=max_height_px, focus=None, colour=colour, presentation=presentation, query=query,
        title_prefix=_prefix_text(title_prefix),
    )


def _index(name: str, value: object, count: int, what: str) -> int:
    """`value` as an index in range(count), else ValueError naming the value and the count."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if not 0 <= value < count:
        last = f"0..{count - 1}" if count else "none"
        raise ValueError(f"{name} {value} out of range: {what} {count} {name}s ({last})")
    return int(value)


def _shape(arr: np.ndarray) -> str:
    return "(" + ", ".join(str(n) for n in arr.shape) + ")"


def _layers(stack, name: str) -> list[np.ndarray]:
    """A (L, H, T, T) array or a sequence of (H, T, T) arrays as a list of per-layer arrays."""
    layers = [np.asarray(a) for a in stack]
    if not layers or any(a.ndim != 3 or a.shape != layers[0].shape for a in layers):
        shapes = [_shape(a) for a in layers]
        raise ValueError(f"{name} must be 4-D (layers, heads, T, T) or equal (heads, T, T) arrays, got {shapes}")
    return layers


def attention_view(
    weights: np.ndarray | Sequence[np.ndarray],
    scores: np.ndarray | Sequence[np.ndarray] | None,
    tokens: Sequence[str],
    *,
    layer: int,
    head: int | None,
    view: str,
    causal: bool,
    overview_max_tokens: int,
    width_px: int | None = None,
    max_height_px: int | None = None,
    colour: str = "linear",
    presentation: bool = False,
    query: int | None = None,
    title_prefix: str | None = None,
    badges: Mapping[int, str] | None = None,
) -> FigureSpec:
    """The attention figure for one of the `ATTENTION_VIEWS`, chosen the way the app's Explore tab does.

    weights, scores: (L, H, T, T) post-softmax weights and pre-softmax scores of every layer (one
    array, or a sequence of L arrays of shape (H, T, T));
    scores may be None unless view == "scores". tokens: the T display strings. head None means
    all heads of `layer`. causal: mask the future positions (`causal_mask`); masked cells are hatched.

    * "all layers": `attention_overview` of every layer's weights, or, when T exceeds
      `overview_max_tokens`, a `message_figure` asking for a single layer;
    * "weights" / "scores": `attention_grid` of the layer (head None) or `attention_head` of one
      head, for that kind.

    width_px: the width laid out for (None: 1200 for a grid or the overview, 720 for one head; the
    page stretches it to its container). max_height_px: the figure is never taller; panels stay
    square and shrink to fit, and the tick labels adapt. colour (one of `COLOUR_MODES`; weights
    views only, the scores view ignores it): "linear" weights, "row" = each query row ÷ its row max,
    "log" = log10(weight) clipped to [-3, 0]. presentation: large fonts (tick labels ≥ 16 px) and
    a layout computed for them. query: outline that query row in every panel (layout.meta also
    carries T, offset and the panels' axes, layer and head so a page can draw it without a round trip).
    title_prefix: plain text put before the figure's title (escaped), e.g. "Step 340 of 2000 · " for
    a frame of the training film; the message figure gets it before its message.
    badges: head → plain text (escaped) naming what the head does, for the "weights" and "scores"
    views: a grid titles head h's panel "head h · <badge>", a single head gets " · <badge>" after
    its title. The "all layers" view ignores them.

    Raises ValueError for an unknown view, colour, a layer, head or query out of range, or
    inconsistent shapes.
    """
    if view not in ATTENTION_VIEWS:
        raise ValueError(f"view must be one of {', '.join(map(repr, ATTENTION_VIEWS))}, got {view!r}")
    _check_colour(colour)
    # Per-layer (H, T, T) arrays are used as they are: stacking them would copy every layer for
    # a picture of one (only the all-layers overview needs the stack).
    weights = _layers(weights, "weights")
    t = _check_square((len(weights), *weights[0].shape), "weights")
    n_layers, n_heads = len(weights), weights[0].shape[0]
    if scores is not None:
        scores = _layers(scores, "scores")
        if len(scores) != n_layers or any(s.shape != w.shape for s, w in zip(scores, weights)):
            raise ValueError(f"scores have shape {_shape(np.asarray(scores))} but weights have shape "
                             f"{_shape(np.asarray(weights))}")
    elif view == "scores":
        raise ValueError("view 'scores' needs the attention scores, but scores is None")
    tokens = _check_tokens(tokens, t)
    layer = _index("layer", layer, n_layers, "the model has")
    if head is not None:
        head = _index("head", head, n_heads, "each layer has")
    if isinstance(overview_max_tokens, bool) or not isinstance(overview_max_tokens, (int, np.integer)) \
            or overview_max_tokens < 1:
        raise ValueError(f"overview_max_tokens must be a positive whole number, got {overview_max_tokens!r}")
    mask = causal_mask(t) if causal else None
    style = {"max_height_px": max_height_px, "presentation": presentation, "query": query,
             "title_prefix": title_prefix}
    badges = _check_badges(badges)

    if view == "all layers":
        if t > overview_max_tokens:
            message = message_figure(
                f"The overview draws {n_layers}×{n_heads} panels; it needs ≤ {overview_max_tokens} tokens "
                f"(there are {t}). Pick a layer instead.", presentation=presentation,
            )
            return message if title_prefix is None else _prefixed(message, str(title_prefix))
        return attention_overview(np.stack(weights), tokens, mask=mask, width_px=width_px or 1200,
                                  max_tokens=int(overview_max_tokens), colour=colour, **style)
    kind = "scores" if view == "scores" else "weights"
    mats = scores if kind == "scores" else weights
    if kind == "scores":
        colour = "linear"
    if head is None:
        return attention_grid(mats[layer], tokens, layer, kind=kind, mask=mask, width_px=width_px or 1200,
                              colour=colour, badges=badges, **style)
    return attention_head(mats[layer][head], tokens, layer, head, kind=kind, mask=mask, width_px=width_px or 720,
                          colour=colour, badge=badges.get(head), **style)


def _prefixed(fig: FigureSpec, prefix: str) -> FigureSpec:
    """A message figure with `prefix` (plain text, escaped) put before its text."""
    note = fig.layout["annotations"][0]
    note["text"] = esc(prefix) + note["text"]
    return fig
