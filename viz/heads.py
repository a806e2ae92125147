"""What each head does: one small layer × head map per head score, and the change of every score.

* `role_overview`: one small layer × head map per head score (previous-token, induction, …), each
  cell showing its value; cells at or above the role's threshold are outlined, the selected head
  is outlined in magenta (`ROW_OUTLINE`) and ablated heads carry a "✕". A click on a cell names
  its head: every cell carries customdata [layer, head] and ``layout.meta.pick == "head"``.
* `score_changes`: the same maps for the change of every score between two prompts (B − A).

The logit lens is drawn by viz.lens, the A/B comparisons of distributions and attention by
viz.compare. Colours follow viz._common: scores in [0, 1] on `SEQUENTIAL` (Viridis), signed changes
on `DIVERGING`. The figures are `FigureSpec`s with transparent backgrounds and mid-grey text;
presentation=True gives tick labels of at least `PRESENTATION_FONT_PX`. Every string that comes
from a caller (role names, titles) is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ._common import (
    DIFF_FLOOR,
    DIVERGING,
    EXPORT_BAR_PX,
    MARK_INSET,
    MARK_LINES,
    PRESENTATION_FONT_PX,
    ROW_OUTLINE,
    SEQUENTIAL,
    TEXT_GREY,
    TRANSPARENT,
    check_flag,
    check_width,
    colorscale,
    esc,
    hover_label,
    layout_frame,
    text_width_em,
    title_text,
    wrap_parts,
    wrapped,
)
from .payload import FigureSpec

MARKED_COLOUR = "#e4572e"  # the "✕" on an ablated head (the app's one highlight colour)
NAN_TEXT = "–"
_SELECT_INSET = 0.47  # half-size of the selected head's outline, in cells (the role mark: MARK_INSET)
ROLE_MAPS_WRAP_PX = 700  # role maps laid out narrower than this wrap to 3 (or, under 480 px, 2) columns
# From this many heads (layers × heads: 80 × 64 is 5,120) the maps are compact, so that every head of every
# score fits on about a screen: colours only (the hover and a click give each head), cells down to
# COMPACT_CELL_PX, the panels side by side, a label every few rows and columns, no per-cell marks.
COMPACT_HEADS = 1024
COMPACT_CELL_PX = 4


def _number(value: float, threshold: float | None = None, *, signed: bool = False) -> str:
    """`value` with 2 decimals, or more when 2 would make it look equal to `threshold` but it is not."""
    digits = 2
    if threshold is not None:
        while digits < 6 and value != threshold and round(value, digits) == round(threshold, digits):
            digits += 1
    rounded = round(value, digits) + 0.0  # no "-0.00"
    return f"{rounded:+.{digits}f}" if signed else f"{rounded:.{digits}f}"


# ----------------------------------------------------------------------------- score maps


@dataclass(frozen=True)
class _Panel:
    """One small layer × head map: values, what each cell shows and says, colours, outlined cells."""

    key: str
    title: str  # escaped
    z: np.ndarray  # (L, H) float64, NaN = undefined
    text: list[list[str]]  # cell text ("" where NaN: the dash is an annotation, see _score_maps)
    hover: list[list[str]]
    zmin: float
    zmax: float
    scale: tuple | str
    outlined: list[tuple[int, int]]
    short_title: str | None = None  # used when `title` is wider than the panel


@dataclass(frozen=True)
class _MapFonts:
    tick: float
    cell: float
    title: float
    sub: float
    panel_title: float
    hover: float
    cell_h: float  # px per layer row
    gap: float  # px between panel columns


_MAP_NORMAL = _MapFonts(tick=11, cell=11, title=13, sub=11, panel_title=11, hover=12, cell_h=34, gap=14)
_MAP_PRESENTING = _MapFonts(tick=PRESENTATION_FONT_PX, cell=PRESENTATION_FONT_PX, title=20, sub=PRESENTATION_FONT_PX,
                            panel_title=17, hover=18, cell_h=46, gap=20)


def _check_roles(scores: Mapping[str, np.ndarray], roles: Sequence, what: str = "scores") -> tuple[list, int, int]:
    """The roles (each with .key, .name, .formula, .threshold) and the common (L, H) of their scores."""
    roles = list(roles)
    if not roles:
        raise ValueError("roles is empty: nothing to draw")
    shape = None
    for role in roles:
        key = role.key
        if key not in scores:
            raise ValueError(f"{what} has no {key!r} (role {role.name!r}); it has {sorted(map(str, scores))}")
        arr = np.asarray(scores[key], dtype=np.float64)
        if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
            raise ValueError(f"{what}[{key!r}] must be 2-D (layers, heads), got shape {arr.shape}")
        if shape is None:  # the first role's scores set the (L, H) the others must have
            shape = arr.shape
        elif arr.shape != shape:
            raise ValueError(f"{what}[{key!r}] has shape {arr.shape} but the other scores have {shape}")
        thr = role.threshold
        if thr is not None and (isinstance(thr, bool) or not isinstance(thr, (int, float, np.integer, np.floating))
                                or not math.isfinite(thr)):
            raise ValueError(f"role {key!r}: threshold must be a finite number or None, got {thr!r}")
    return roles, int(shape[0]), int(shape[1])


def _check_head(name: str, pair: object, n_layers: int, n_heads: int) -> tuple[int, int]:
    """`pair` as a (layer, head) inside the model, else ValueError."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise ValueError(f"{name} must be a (layer, head) pair, got {pair!r}")
    layer, head = pair
    for what, value, count in (("layer", layer, n_layers), ("head", head, n_heads)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < count:
            raise ValueError(f"{name} {what} must be a whole number in 0..{count - 1}, got {value!r}")
    return int(layer), int(head)


def _columns(n: int, n_heads: int, fonts: _MapFonts, width_px: int | None, left: float, cell_em: float,
             compact: bool = False) -> int:
    """Panels per row: all of them when laid out ≥ `ROLE_MAPS_WRAP_PX` wide (or width unknown), else 3 (2
    under 480 px); fewer while a cell would be too narrow for its text (`cell_em` em). Only counts
    that fill the rows evenly are tried (5 panels: 5, 3, 2 or 1 a row, never 4 + 1)."""
    laid = width_px or 1000
    most = n if width_px is None or width_px >= ROLE_MAPS_WRAP_PX else (3 if width_px >= 480 else 2)
    need = COMPACT_CELL_PX if compact else cell_em * fonts.cell + 8
    options = sorted({math.ceil(n / rows) for rows in range(1, n + 1)}, reverse=True)
    for cols in (c for c in options if c <= most):
        panel = (laid - left - 12 - (cols - 1) * fonts.gap) / cols
        if panel / n_heads >= need:
            return cols
    return 1


def _score_maps(
    panels: list[_Panel],
    n_layers: int,
    n_heads: int,
    *,
    title: str,
    legend: list[str],
    selected: tuple[int, int] | None,
    marked: list[tuple[int, int]],
    marked_label: str,
    presentation: bool,
    width_px: int | None,
    viz_name: str,
    cell_em: float,
) -> FigureSpec:
    """The figure shared by `role_overview` and `score_changes`: one heatmap per panel, side by
    side (wrapping on narrow layouts), layer 0 at the top; marks drawn as shapes and annotations.
    legend: the note parts under the title (escaped), wrapped to the width laid out for."""
    fonts = _MAP_PRESENTING if presentation else _MAP_NORMAL
    n = len(panels)
    compact = n_layers * n_heads >= COMPACT_HEADS
    left = math.ceil(text_width_em(f"L{n_layers - 1}") * fonts.tick + 14)  # the widest layer label, "L11"
    ncols = _columns(n, n_heads, fonts, width_px, left, cell_em, compact)
    nrows = math.ceil(n / ncols)
    laid = width_px or 1000
    legend = wrap_parts(legend, fonts.sub, laid - 20)
    title = wrapped(title, (laid - 20) / fonts.title)  # whole on a phone: it says what the maps show
    margin = _margin(left, fonts, title, legend)
    title_px = fonts.panel_title * 1.5 + 4  # a panel's title, above it
    plot_w = max(1.0, laid - margin["l"] - margin["r"])
    panel_w = (plot_w - (ncols - 1) * fonts.gap) / ncols
    # a compact map's rows are about as tall as its cells are wide (never under COMPACT_CELL_PX)
    cell_h = max(COMPACT_CELL_PX, min(fonts.cell_h, panel_w / n_heads)) if compact else fonts.cell_h
    panel_h = n_layers * cell_h
    tick_px = fonts.tick * 1.4 + 8  # head labels under a panel
    row_h = title_px + panel_h + tick_px  # px; positions below are fractions of the plot area (paper units)
    plot_h = nrows * row_h
    height = math.ceil(margin["t"] + plot_h + margin["b"])
    customdata = [[[li, h] for h in range(n_heads)] for li in range(n_layers)]  # (L, H, 2): what a click picks
    # else (12 heads on a phone, or a compact map) colours only; the hover gives each number
    numbers = not compact and panel_w / n_heads >= cell_em * fonts.cell + 4
    # a label every `step` heads (layers) where one per cell would overlap: as wide as "H63" plus a gap
    steps = (math.ceil(n_heads / max(1.0, panel_w / (text_width_em(f"H{n_heads - 1}") * fonts.tick + 6))),
             math.ceil(fonts.tick * 1.3 / cell_h))
    layout: dict = {
        **layout_frame(font_px=fonts.tick, height=height, margin=margin, title=title, title_px=fonts.title,
                       subtitle=legend or None, subtitle_px=fonts.sub),
        "hoverlabel": hover_label(fonts.hover),
        "hovermode": "closest",
        "showlegend": False,
        "uirevision": viz_name,
        "meta": {"viz": viz_name, "pick": "head", "layers": n_layers, "heads": n_heads, "panels": [],
                 "selected": None if selected is None else list(selected),
                 "marked": [list(p) for p in marked], "outline": [dict(line) for line in ROW_OUTLINE]},
    }
    data: list[dict] = []
    shapes: list[dict] = []
    annotations: list[dict] = []
    for k, panel in enumerate(panels):  # panels fill the rows left to right, top row first
        row, col = divmod(k, ncols)
        suffix = "" if k == 0 else str(k + 1)  # plotly's axis names: x / y, then x2 / y2, …
        xref, yref = f"x{suffix}", f"y{suffix}"
        x0 = col * (panel_w + fonts.gap) / plot_w
        x1 = min(1.0, x0 + panel_w / plot_w)  # rounding must not push the last column past the paper
        top = 1 - (row * row_h + title_px) / plot_h
        bottom = top - panel_h / plot_h
        layout[f"xaxis{suffix}"], layout[f"yaxis{suffix}"] = _panel_axes(
            (x0, x1), (bottom, top), xref, yref, n_layers, n_heads, tick_px=fonts.tick, first_column=col == 0,
            steps=steps)
        layout["meta"]["panels"].append({"key": panel.key, "xaxis": xref, "yaxis": yref})
        shown_title = panel.title
        # a title wider than its panel (a phone) gives way to the role's bare name
        if panel.short_title is not None and text_width_em(panel.title) * fonts.panel_title > panel_w:
            shown_title = panel.short_title
        annotations.append({"text": shown_title, "xref": "paper", "yref": "paper", "x": round((x0 + x1) / 2, 5),
                            "y": round(top, 5), "xanchor": "center", "yanchor": "bottom", "yshift": 3,
                            "showarrow": False, "font": {"size": fonts.panel_title}})
        data.append(_panel_trace(panel, fonts, customdata, xref, yref, numbers, gap=0 if compact else 2))
        panel_shapes, panel_notes = _panel_marks(panel, xref, yref, fonts, marked, marked_label, selected, compact)
        shapes += panel_shapes
        annotations += panel_notes
    layout.update(annotations=annotations, **({"shapes": shapes} if shapes else {}))
    return FigureSpec(data, layout)


def _margin(left: int, fonts: _MapFonts, title: str, legend: str) -> dict:
    """The maps' margins: room for the layer labels, the (wrapped) title and legend, and the export buttons."""
    return {"l": left, "r": 12, "b": EXPORT_BAR_PX,  # room for the page's PNG / SVG buttons (assets/explore.js)
            "t": math.ceil(8 + fonts.title * 1.25 * (title.count("<br>") + 1)
                           + (fonts.sub * (1.6 + 1.3 * (legend.count("<br>") + 1)) if legend else 0) + 6)}


def _panel_axes(xs: tuple[float, float], ys: tuple[float, float], xref: str, yref: str, n_layers: int,
                n_heads: int, tick_px: float, first_column: bool, steps: tuple[int, int] = (1, 1)) -> tuple[dict, dict]:
    """A panel's x axis (heads) and y axis (layers, layer 0 at the top) over paper domains xs and ys, labelled
    every steps[0] heads and steps[1] layers."""
    (x0, x1), (bottom, top) = xs, ys
    heads, layers = range(0, n_heads, max(1, steps[0])), range(0, n_layers, max(1, steps[1]))
    xaxis = {
        "domain": [round(x0, 5), round(x1, 5)], "anchor": yref, "range": [-0.5, n_heads - 0.5],
        "tickmode": "array", "tickvals": list(heads), "ticktext": [f"H{h}" for h in heads],
        "tickfont": {"size": tick_px}, "showgrid": False, "zeroline": False, "ticks": "", "fixedrange": True,
    }
    yaxis = {
        "domain": [round(max(0.0, bottom), 5), round(top, 5)], "anchor": xref, "range": [n_layers - 0.5, -0.5],
        "tickmode": "array", "tickvals": list(layers),
        "ticktext": [f"L{li}" for li in layers], "tickfont": {"size": tick_px},
        "showticklabels": first_column, "showgrid": False, "zeroline": False, "ticks": "", "fixedrange": True,
    }
    return xaxis, yaxis


def _panel_trace(panel: _Panel, fonts: _MapFonts, customdata: list, xref: str, yref: str,
                 numbers: bool = True, gap: int = 2) -> dict:
    """A panel's heatmap: its values coloured, each cell's text (numbers: where it fits) and hover, [layer,
    head] as customdata."""
    trace = {
        "type": "heatmap", "z": panel.z, "x0": 0, "dx": 1, "y0": 0, "dy": 1, "zmin": panel.zmin,
        "zmax": panel.zmax, "colorscale": colorscale(panel.scale), "showscale": False, "xgap": gap, "ygap": gap,
        "text": panel.text, "texttemplate": "%{text}" if numbers else "", "textfont": {"size": fonts.cell},
        "hovertext": panel.hover, "hovertemplate": "%{hovertext}<extra></extra>", "customdata": customdata,
        "meta": panel.key, "name": panel.key,
    }
    if xref != "x":
        trace["xaxis"], trace["yaxis"] = xref, yref
    return trace


def _panel_marks(panel: _Panel, xref: str, yref: str, fonts: _MapFonts, marked: list[tuple[int, int]],
                 marked_label: str, selected: tuple[int, int] | None,
                 compact: bool = False) -> tuple[list[dict], list[dict]]:
    """A panel's marks as (shapes, annotations): a dash where a score is undefined, the role's outline,
    a "✕" on each marked head and the selected head's outline (a compact map: the last two alone; its cells
    are too small for a dash or an outline, and thousands of them would slow the page)."""
    shapes: list[dict] = []
    annotations: list[dict] = []
    for li, h in [] if compact else zip(*np.nonzero(np.isnan(panel.z))):  # undefined: a grey dash (cell text would be white)
        annotations.append({"text": NAN_TEXT, "xref": xref, "yref": yref, "x": int(h), "y": int(li),
                            "showarrow": False, "font": {"size": fonts.cell, "color": TEXT_GREY}})
    for li, h in [] if compact else panel.outlined:
        for line in MARK_LINES:
            shapes.append({"type": "rect", "xref": xref, "yref": yref, "x0": h - MARK_INSET,
                           "x1": h + MARK_INSET, "y0": li - MARK_INSET, "y1": li + MARK_INSET,
                           "line": dict(line), "fillcolor": TRANSPARENT, "layer": "above"})
    for li, h in marked:
        annotations.append({"text": "<b>✕</b>", "xref": xref, "yref": yref, "x": h - 0.46, "y": li - 0.44,
                            "xanchor": "left", "yanchor": "top", "showarrow": False, "borderpad": 0,
                            "bgcolor": "rgba(255,255,255,0.85)",
                            "font": {"size": round(fonts.cell * 1.05), "color": MARKED_COLOUR},
                            "hovertext": esc(marked_label)})
    if selected is not None:
        li, h = selected
        for line in ROW_OUTLINE:
            shapes.append({"type": "rect", "xref": xref, "yref": yref, "x0": h - _SELECT_INSET,
                           "x1": h + _SELECT_INSET, "y0": li - _SELECT_INSET, "y1": li + _SELECT_INSET,
                           "line": dict(line), "fillcolor": TRANSPARENT, "layer": "above"})
    return shapes, annotations


def _mark_hover(li: int, h: int, selected: tuple[int, int] | None, marked: set, marked_label: str) -> str:
    """Extra hover lines for a selected or marked (ablated) head."""
    extra = ""
    if (li, h) in marked:
        extra += f"<br>✕ {esc(marked_label)}"
    if selected == (li, h):
        extra += "<br>selected"
    return extra


def role_overview(
    scores: Mapping[str, np.ndarray],
    roles: Sequence,
    *,
    selected: tuple[int, int] | None = None,
    marked: Iterable[tuple[int, int]] = (),
    marked_label: str = "ablated",
    presentation: bool = False,
    width_px: int | None = None,
    title: str | None = None,
) -> FigureSpec:
    """Every head score as a small layer × head map, side by side: what each head does on this text.

    scores: key → (L, H) array (NaN = undefined for this text, shown "–"). roles: objects with
    .key (into scores), .name (shown), .formula (text, in the hover) and .threshold (a head plays
    the role when its score is ≥ threshold; None = a measure without a role, e.g. entropy in bits),
    one panel each, in this order. Scores with a threshold are coloured on Viridis over [0, 1];
    one without gets its own range [0, largest value]. Every cell shows its value (2 decimals);
    cells ≥ threshold have bold text and a bright outline (`MARK_LINES`). Layer 0 is the top row.
    selected: (layer, head) outlined in magenta (`ROW_OUTLINE`) in every panel. marked: heads
    drawn with a "✕" in every panel (e.g. the ablated ones; `marked_label` names them in the hover).
    width_px: the width laid out for (None: wide); under `ROLE_MAPS_WRAP_PX` the panels wrap to 3 or 2 columns.
    title: plain text (escaped). presentation: large fonts (tick labels ≥ 16 px), taller cells.

    Hover: "layer 1, head 0 · previous-token 0.92 ≥ 0.5: previous-token head", the formula below.
    Every cell carries customdata [layer, head]; layout.meta has {"pick": "head", "layers": L,
    "heads": H} and each panel's role key and axes, so a page can turn a click into a head.
    Raises ValueError for missing or inconsistent scores, or a selected / marked head out of range.
    """
    check_flag("presentation", presentation)
    check_width(width_px)
    roles, n_layers, n_heads = _check_roles(scores, roles)
    if selected is not None:
        selected = _check_head("selected", selected, n_layers, n_heads)
    marked_list = sorted({_check_head("marked", p, n_layers, n_heads) for p in marked})  # duplicates once
    marked_set = set(marked_list)  # for the per-cell look-ups in the hover
    panels = []
    for role in roles:
        z = np.asarray(scores[role.key], dtype=np.float64)  # (L, H)
        thr = None if role.threshold is None else float(role.threshold)
        name = esc(role.name)  # names and formulas go into HTML text, so escaped once per role
        formula = esc(role.formula)
        finite = z[np.isfinite(z)]
        # a measure without a threshold (entropy in bits) has no natural top: 0 … its largest; a role's score 0 … 1
        if thr is None:
            zmin, zmax = 0.0, (float(finite.max()) if finite.size and finite.max() > 0 else 1.0)
        else:
            zmin, zmax = 0.0, 1.0
        text, hover, outlined = [], [], []
        for li in range(n_layers):
            text_row, hover_row = [], []
            for h in range(n_heads):
                v = float(z[li, h])
                where = f"layer {li}, head {h} · "
                if not math.isfinite(v):  # undefined on this text: no number (a grey dash goes over the cell)
                    text_row.append("")
                    line = f"{where}{name}: undefined for this text"
                elif thr is None:
                    text_row.append(_number(v))
                    line = f"{where}{name} {_number(v)}"
                else:  # a role: bold and outlined where the head plays it; never "0.50" for 0.4996 beside "≥ 0.5"
                    shown = _number(v, thr)
                    if v >= thr:
                        outlined.append((li, h))
                        text_row.append(f"<b>{shown}</b>")
                        line = f"{where}{name} {shown} ≥ {thr:g}: {name} head"
                    else:
                        text_row.append(shown)
                        line = f"{where}{name} {shown} &lt; {thr:g}"
                hover_row.append(f"{line}<br>{formula}{_mark_hover(li, h, selected, marked_set, marked_label)}")
            text.append(text_row)
            hover.append(hover_row)
        panel_title = name if thr is None else f"{name} ≥ {thr:g}"  # the threshold in the title: what "outlined" means
        panels.append(_Panel(role.key, panel_title, z, text=text, hover=hover, zmin=zmin, zmax=zmax, scale=SEQUENTIAL,
                             outlined=outlined, short_title=name))
    legend = []  # a line for each kind of mark this figure draws, none for those it does not
    if n_layers * n_heads >= COMPACT_HEADS:
        legend.append("colours only: hover a cell for its head and score, click it to open the head")
    elif any(r.threshold is not None for r in roles):
        legend.append("outlined: score ≥ threshold: the head plays that role")
    unranged = [esc(r.name) for r in roles if r.threshold is None]
    if unranged:
        legend.append(f"{', '.join(unranged)}: no threshold, own colour range")
    if marked_list:
        legend.append(f"✕ = {esc(marked_label)}")
    if selected is not None:
        legend.append("magenta = selected head")
    return _score_maps(
        panels, n_layers, n_heads, title=title_text(title, "What each head does: one score per layer × head"),
        legend=legend, selected=selected, marked=marked_list, marked_label=marked_label,
        presentation=presentation, width_px=width_px, viz_name="role_overview", cell_em=2.6,
    )


def score_changes(
    scores_a: Mapping[str, np.ndarray],
    scores_b: Mapping[str, np.ndarray],
    roles: Sequence,
    *,
    presentation: bool = False,
    width_px: int | None = None,
    title: str | None = None,
) -> FigureSpec:
    """How every head score changes from prompt A to prompt B: `role_overview`'s maps of B − A.

    scores_a, scores_b: key → (L, H) arrays of the same shape; roles as in `role_overview`.
    Colours: `DIVERGING`, symmetric around 0 (red = higher on B); the scores with a threshold share
    one range (±their largest change, at least ±0.05), each one without gets its own. Cell text:
    the signed change ("+0.31"; "–" where either prompt leaves the score undefined). Cells where
    the head crosses the threshold (plays the role on one prompt only) are outlined.
    Hover: "layer 1, head 0 · induction: A 0.12 → B 0.55 (+0.43)". customdata and layout.meta as
    in `role_overview`. Raises ValueError for missing or inconsistent scores.
    """
    check_flag("presentation", presentation)
    check_width(width_px)
    roles, n_layers, n_heads = _check_roles(scores_a, roles, "scores_a")
    _, layers_b, heads_b = _check_roles(scores_b, roles, "scores_b")
    if (layers_b, heads_b) != (n_layers, n_heads):  # a difference needs the two prompts on one model
        raise ValueError(f"scores_b are ({layers_b}, {heads_b}) (layers, heads) "
                         f"but scores_a are ({n_layers}, {n_heads})")
    diffs = {r.key: np.asarray(scores_b[r.key], np.float64) - np.asarray(scores_a[r.key], np.float64) for r in roles}

    def bound(keys: list[str]) -> float:  # the largest finite |change| among these scores, never under DIFF_FLOOR
        vals = np.concatenate([np.abs(diffs[k][np.isfinite(diffs[k])]) for k in keys] or [np.zeros(0)])
        return max(float(vals.max()) if vals.size else 0.0, DIFF_FLOOR)

    # the role scores (all 0 … 1) share one range so their changes compare; a measure without a threshold has its own
    shared = bound([r.key for r in roles if r.threshold is not None])
    panels = []
    for role in roles:
        a = np.asarray(scores_a[role.key], np.float64)
        b = np.asarray(scores_b[role.key], np.float64)
        d = diffs[role.key]
        thr = None if role.threshold is None else float(role.threshold)
        lim = shared if thr is not None else bound([role.key])  # the colour range: ±lim
        name = esc(role.name)
        text, hover, outlined = [], [], []
        for li in range(n_layers):
            text_row, hover_row = [], []
            for h in range(n_heads):
                va, vb, dv = float(a[li, h]), float(b[li, h]), float(d[li, h])
                sa = _number(va) if math.isfinite(va) else NAN_TEXT
                sb = _number(vb) if math.isfinite(vb) else NAN_TEXT
                change = _number(dv, signed=True) if math.isfinite(dv) else NAN_TEXT
                line = f"layer {li}, head {h} · {name}: A {sa} → B {sb} ({change})"
                if thr is not None:  # outlined where the head gains or loses the role (undefined: not playing it)
                    plays_a, plays_b = math.isfinite(va) and va >= thr, math.isfinite(vb) and vb >= thr
                    if plays_a != plays_b:
                        outlined.append((li, h))
                        line += f"<br>{'becomes' if plays_b else 'stops being'} a {name} head (threshold {thr:g})"
                text_row.append(change if math.isfinite(dv) else "")  # undefined: blank, the dash is drawn over it
                hover_row.append(line)
            text.append(text_row)
            hover.append(hover_row)
        panels.append(_Panel(role.key, f"{name}: B − A", d, text=text, hover=hover, zmin=-lim, zmax=lim,
                             scale=DIVERGING, outlined=outlined, short_title=name))
    legend = ["red = higher on B, blue = higher on A"]
    if any(r.threshold is not None for r in roles):
        legend.append("outlined: the head crosses the threshold (gains or loses the role)")
    return _score_maps(
        panels, n_layers, n_heads, title=title_text(title, "Head scores: prompt B − prompt A"),
        legend=legend, selected=None, marked=[], marked_label="", presentation=presentation,
        width_px=width_px, viz_name="score_changes", cell_em=3.1,
    )
