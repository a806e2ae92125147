"""What each head does: head-score maps, the logit lens, and before/after comparisons.

* `role_overview`: one small layer × head map per head score (previous-token, induction, …), each
  cell showing its value; cells at or above the role's threshold are outlined, the selected head
  is outlined in magenta (`ROW_OUTLINE`) and ablated heads carry a "✕". A click on a cell names
  its head: every cell carries customdata [layer, head] and ``layout.meta.pick == "head"``.
* `score_changes`: the same maps for the change of every score between two prompts (B − A).
* `logit_lens`: the top next-token candidates read out after every layer, the model's own final
  choice in bold and outlined, so a learner sees in which layer the answer appears.
* `compare_distributions`: two next-token distributions (normal vs ablated, prompt A vs B) as
  grouped bars over the union of their top candidates, each label giving the rank change.
* `attention_difference`: one layer's attention of prompt B minus prompt A, one panel per head,
  on the diverging scale (red = B attends more, blue = A attends more).

Colours follow viz._common: scores in [0, 1] and probabilities on `SEQUENTIAL` (Viridis), signed
changes on `DIVERGING`. The figures are `FigureSpec`s with transparent backgrounds and mid-grey
text; presentation=True gives tick labels of at least `PRESENTATION_FONT_PX`. Every string that
comes from a caller (token pieces, role names, labels, titles) is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ._common import (
    DIVERGING,
    FONT,
    MILLI,
    PRESENTATION_FONT_PX,
    ROW_OUTLINE,
    SEQUENTIAL,
    TEXT_GREY,
    TRANSPARENT,
    colorscale,
    esc,
    hover_label,
    nice_ticks,
    short_token,
    text_width_em,
    tick_label,
    title_y,
    wrapped,
)
from .attention import (
    GRID_LABEL_LIMIT,
    _attention_figure,
    _check_size,
    _check_square,
    _check_tokens,
    _masks,
    causal_mask,
)
from .payload import FigureSpec
from .sampling import ADJ_COLOUR, MAX_HEIGHT_PX, RAW_COLOUR, bar_layout

EXPORT_BAR_PX = 30  # bottom margin of the overview figures: the page's PNG / SVG buttons sit there

# A cell that reaches its role's threshold (or the model's final token in the logit lens): a thin
# white line on a black one, inset in the cell. It reads on every Viridis and diverging colour and
# on light and dark pages, and stays apart from the selected head's magenta outline (ROW_OUTLINE).
MARK_LINES: tuple[dict, ...] = ({"color": "#000000", "width": 3}, {"color": "#ffffff", "width": 1.5})
MARKED_COLOUR = "#e4572e"  # the "✕" on an ablated head (the app's one highlight colour)
NAN_TEXT = "–"
_MARK_INSET = 0.36  # half-size of the threshold outline, in cells (the selected outline: _SELECT_INSET)
_SELECT_INSET = 0.47
DIFF_FLOOR = 0.05  # attention_difference: the colour range is at least ±this, so noise stays pale
NARROW_PX = 700  # role maps laid out narrower than this wrap to 3 (or, under 480 px, 2) columns


def _check_flag(name: str, value: object) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def _check_width(width_px: int | None) -> None:
    if width_px is not None:
        _check_size("width_px", width_px, 120)


def _title_text(title: str | None, default: str) -> str:
    """The escaped caller title, or the (already safe) default."""
    return default if title is None else esc(title)


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
        if shape is None:
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


def _columns(n: int, n_heads: int, fonts: _MapFonts, width_px: int | None, left: float, cell_em: float) -> int:
    """Panels per row: all of them when laid out ≥ `NARROW_PX` wide (or width unknown), else 3 (2
    under 480 px); fewer while a cell would be too narrow for its text (`cell_em` em). Only counts
    that fill the rows evenly are tried (5 panels: 5, 3, 2 or 1 a row, never 4 + 1)."""
    laid = width_px or 1000
    most = n if width_px is None or width_px >= NARROW_PX else (3 if width_px >= 480 else 2)
    need = cell_em * fonts.cell + 8
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
    left = math.ceil(text_width_em(f"L{n_layers - 1}") * fonts.tick + 14)
    ncols = _columns(n, n_heads, fonts, width_px, left, cell_em)
    nrows = math.ceil(n / ncols)
    laid = width_px or 1000
    legend = _wrap(legend, fonts.sub, laid - 20)
    title = wrapped(title, (laid - 20) / fonts.title)  # whole on a phone: it says what the maps show
    margin = {"l": left, "r": 12, "b": EXPORT_BAR_PX,  # room for the page's PNG / SVG buttons (assets/explore.js)
              "t": math.ceil(8 + fonts.title * 1.25 * (title.count("<br>") + 1)
                             + (fonts.sub * (1.6 + 1.3 * (legend.count("<br>") + 1)) if legend else 0) + 6)}
    title_px = fonts.panel_title * 1.5 + 4  # a panel's title, above it
    panel_h = n_layers * fonts.cell_h
    tick_px = fonts.tick * 1.4 + 8  # head labels under a panel
    row_h = title_px + panel_h + tick_px
    plot_h = nrows * row_h
    plot_w = max(1.0, laid - margin["l"] - margin["r"])
    panel_w = (plot_w - (ncols - 1) * fonts.gap) / ncols
    height = math.ceil(margin["t"] + plot_h + margin["b"])
    customdata = [[[li, h] for h in range(n_heads)] for li in range(n_layers)]
    layout: dict = {
        "template": "none",
        "font": {**FONT, "size": fonts.tick},
        "paper_bgcolor": TRANSPARENT,
        "plot_bgcolor": TRANSPARENT,
        "height": height,
        "margin": margin,
        "title": {"text": title, "x": 0.01, "xanchor": "left", "y": title_y(height, fonts.title, title),
                  "yanchor": "top", "yref": "container", "font": {"size": fonts.title}},
        "hoverlabel": hover_label(fonts.hover),
        "hovermode": "closest",
        "showlegend": False,
        "uirevision": viz_name,
        "meta": {"viz": viz_name, "pick": "head", "layers": n_layers, "heads": n_heads, "panels": [],
                 "selected": None if selected is None else list(selected),
                 "marked": [list(p) for p in marked], "outline": [dict(line) for line in ROW_OUTLINE]},
    }
    if legend:
        layout["title"]["subtitle"] = {"text": legend, "font": {"size": fonts.sub}}
    data: list[dict] = []
    shapes: list[dict] = []
    annotations: list[dict] = []
    for k, panel in enumerate(panels):
        row, col = divmod(k, ncols)
        suffix = "" if k == 0 else str(k + 1)
        xref, yref = f"x{suffix}", f"y{suffix}"
        x0 = col * (panel_w + fonts.gap) / plot_w
        x1 = min(1.0, x0 + panel_w / plot_w)
        top = 1 - (row * row_h + title_px) / plot_h
        bottom = top - panel_h / plot_h
        layout[f"xaxis{suffix}"] = {
            "domain": [round(x0, 5), round(x1, 5)], "anchor": yref, "range": [-0.5, n_heads - 0.5],
            "tickmode": "array", "tickvals": list(range(n_heads)), "ticktext": [f"H{h}" for h in range(n_heads)],
            "tickfont": {"size": fonts.tick}, "showgrid": False, "zeroline": False, "ticks": "", "fixedrange": True,
        }
        layout[f"yaxis{suffix}"] = {
            "domain": [round(max(0.0, bottom), 5), round(top, 5)], "anchor": xref, "range": [n_layers - 0.5, -0.5],
            "tickmode": "array", "tickvals": list(range(n_layers)),
            "ticktext": [f"L{li}" for li in range(n_layers)], "tickfont": {"size": fonts.tick},
            "showticklabels": col == 0, "showgrid": False, "zeroline": False, "ticks": "", "fixedrange": True,
        }
        layout["meta"]["panels"].append({"key": panel.key, "xaxis": xref, "yaxis": yref})
        shown_title = panel.title
        if panel.short_title is not None and text_width_em(panel.title) * fonts.panel_title > panel_w:
            shown_title = panel.short_title
        annotations.append({"text": shown_title, "xref": "paper", "yref": "paper", "x": round((x0 + x1) / 2, 5),
                            "y": round(top, 5), "xanchor": "center", "yanchor": "bottom", "yshift": 3,
                            "showarrow": False, "font": {"size": fonts.panel_title}})
        trace = {
            "type": "heatmap", "z": panel.z, "x0": 0, "dx": 1, "y0": 0, "dy": 1, "zmin": panel.zmin,
            "zmax": panel.zmax, "colorscale": colorscale(panel.scale), "showscale": False, "xgap": 2, "ygap": 2,
            "text": panel.text, "texttemplate": "%{text}", "textfont": {"size": fonts.cell},
            "hovertext": panel.hover, "hovertemplate": "%{hovertext}<extra></extra>", "customdata": customdata,
            "meta": panel.key, "name": panel.key,
        }
        if xref != "x":
            trace["xaxis"], trace["yaxis"] = xref, yref
        data.append(trace)
        for li, h in zip(*np.nonzero(np.isnan(panel.z))):  # undefined: a grey dash (cell text would be white)
            annotations.append({"text": NAN_TEXT, "xref": xref, "yref": yref, "x": int(h), "y": int(li),
                                "showarrow": False, "font": {"size": fonts.cell, "color": TEXT_GREY}})
        for li, h in panel.outlined:
            for line in MARK_LINES:
                shapes.append({"type": "rect", "xref": xref, "yref": yref, "x0": h - _MARK_INSET,
                               "x1": h + _MARK_INSET, "y0": li - _MARK_INSET, "y1": li + _MARK_INSET,
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
    if shapes:
        layout["shapes"] = shapes
    layout["annotations"] = annotations
    return FigureSpec(data, layout)


def _mark_hover(li: int, h: int, selected: tuple[int, int] | None, marked: set, marked_label: str) -> str:
    """Extra hover lines for a selected or marked (ablated) head."""
    extra = ""
    if (li, h) in marked:
        extra += f"<br>✕ {esc(marked_label)}"
    if selected == (li, h):
        extra += "<br>selected"
    return extra


def _wrap(parts: list[str], font_px: float, width_px: float, sep: str = " · ") -> str:
    """Join (escaped) note parts with `sep`, starting a new line ("<br>") where a line would be
    wider than `width_px` at `font_px`."""
    lines: list[str] = []
    for part in parts:
        part = wrapped(part, width_px / font_px)  # a part longer than a line is broken too
        if lines and "<br>" not in part and text_width_em(lines[-1] + sep + part) * font_px <= width_px:
            lines[-1] += sep + part
        else:
            lines.append(part)
    return "<br>".join(lines)


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
    width_px: the width laid out for (None: wide); under `NARROW_PX` the panels wrap to 3 or 2 columns.
    title: plain text (escaped). presentation: large fonts (tick labels ≥ 16 px), taller cells.

    Hover: "layer 1, head 0 · previous-token 0.92 ≥ 0.5: previous-token head", the formula below.
    Every cell carries customdata [layer, head]; layout.meta has {"pick": "head", "layers": L,
    "heads": H} and each panel's role key and axes, so a page can turn a click into a head.
    Raises ValueError for missing or inconsistent scores, or a selected / marked head out of range.
    """
    _check_flag("presentation", presentation)
    _check_width(width_px)
    roles, n_layers, n_heads = _check_roles(scores, roles)
    if selected is not None:
        selected = _check_head("selected", selected, n_layers, n_heads)
    marked_list = sorted({_check_head("marked", p, n_layers, n_heads) for p in marked})
    marked_set = set(marked_list)
    panels = []
    for role in roles:
        z = np.asarray(scores[role.key], dtype=np.float64)
        thr = None if role.threshold is None else float(role.threshold)
        name = esc(role.name)
        formula = esc(role.formula)
        finite = z[np.isfinite(z)]
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
                if not math.isfinite(v):
                    text_row.append("")
                    line = f"{where}{name}: undefined for this text"
                elif thr is None:
                    text_row.append(_number(v))
                    line = f"{where}{name} {_number(v)}"
                else:
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
        panel_title = name if thr is None else f"{name} ≥ {thr:g}"
        panels.append(_Panel(role.key, panel_title, z, text, hover, zmin, zmax, SEQUENTIAL, outlined, name))
    legend = []
    if any(r.threshold is not None for r in roles):
        legend.append("outlined: score ≥ threshold: the head plays that role")
    unranged = [esc(r.name) for r in roles if r.threshold is None]
    if unranged:
        legend.append(f"{', '.join(unranged)}: no threshold, own colour range")
    if marked_list:
        legend.append(f"✕ = {esc(marked_label)}")
    if selected is not None:
        legend.append("magenta = selected head")
    return _score_maps(
        panels, n_layers, n_heads, title=_title_text(title, "What each head does: one score per layer × head"),
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
    _check_flag("presentation", presentation)
    _check_width(width_px)
    roles, n_layers, n_heads = _check_roles(scores_a, roles, "scores_a")
    _, layers_b, heads_b = _check_roles(scores_b, roles, "scores_b")
    if (layers_b, heads_b) != (n_layers, n_heads):
        raise ValueError(f"scores_b are ({layers_b}, {heads_b}) (layers, heads) "
                         f"but scores_a are ({n_layers}, {n_heads})")
    diffs = {r.key: np.asarray(scores_b[r.key], np.float64) - np.asarray(scores_a[r.key], np.float64) for r in roles}

    def bound(keys: list[str]) -> float:
        vals = np.concatenate([np.abs(diffs[k][np.isfinite(diffs[k])]) for k in keys] or [np.zeros(0)])
        return max(float(vals.max()) if vals.size else 0.0, DIFF_FLOOR)

    shared = bound([r.key for r in roles if r.threshold is not None])
    panels = []
    for role in roles:
        a = np.asarray(scores_a[role.key], np.float64)
        b = np.asarray(scores_b[role.key], np.float64)
        d = diffs[role.key]
        thr = None if role.threshold is None else float(role.threshold)
        lim = shared if thr is not None else bound([role.key])
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
                if thr is not None:
                    plays_a, plays_b = math.isfinite(va) and va >= thr, math.isfinite(vb) and vb >= thr
                    if plays_a != plays_b:
                        outlined.append((li, h))
                        line += f"<br>{'becomes' if plays_b else 'stops being'} a {name} head (threshold {thr:g})"
                text_row.append(change if math.isfinite(dv) else "")
                hover_row.append(line)
            text.append(text_row)
            hover.append(hover_row)
        panels.append(_Panel(role.key, f"{name}: B − A", d, text, hover, -lim, lim, DIVERGING, outlined, name))
    legend = ["red = higher on B, blue = higher on A"]
    if any(r.threshold is not None for r in roles):
        legend.append("outlined: the head crosses the threshold (gains or loses the role)")
    return _score_maps(
        panels, n_layers, n_heads, title=_title_text(title, "Head scores: prompt B − prompt A"),
        legend=legend, selected=None, marked=[], marked_label="", presentation=presentation,
        width_px=width_px, viz_name="score_changes", cell_em=3.1,
    )


# ----------------------------------------------------------------------------- logit lens


def logit_lens(
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
    _check_flag("presentation", presentation)
    _check_width(width_px)
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[0] < 1 or probs.shape[1] < 1:
        raise ValueError(f"probs must be 2-D (rows, vocabulary) with at least one of each, got shape {probs.shape}")
    n_rows, vocab = probs.shape
    pieces = [str(p) for p in pieces]
    if len(pieces) != vocab:
        raise ValueError(f"probs cover a vocabulary of {vocab} but {len(pieces)} token pieces were given")
    if row_labels is None:
        row_labels = ["embedding"] + [f"after layer {r - 1}" for r in range(1, n_rows)]
        if n_rows > 1:
            row_labels[-1] += " (output)"
    row_labels = [str(r) for r in row_labels]
    if len(row_labels) != n_rows:
        raise ValueError(f"probs have {n_rows} rows but {len(row_labels)} row labels were given")
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
        raise ValueError(f"top must be a whole number ≥ 1, got {top!r}")
    top = min(int(top), vocab)
    if not np.isfinite(probs).all():
        raise ValueError("probs must be finite")
    if final is None:
        final = int(np.argmax(probs[-1]))
    elif isinstance(final, bool) or not isinstance(final, (int, np.integer)) or not 0 <= final < vocab:
        raise ValueError(f"final token id {final!r} is outside the vocabulary of {vocab} pieces")
    final = int(final)

    tick = PRESENTATION_FONT_PX if presentation else 11
    title_px = 20 if presentation else 13
    cell_h = 38 if presentation else 26
    order = np.argsort(-probs, axis=1, kind="stable")[:, :top]  # (R, top), ties: lower id first
    values = np.take_along_axis(probs, order, axis=1)
    laid = width_px or 720
    left = math.ceil(max(text_width_em(r) for r in row_labels) * tick + 14)
    right = math.ceil(14 + (18 if presentation else 12) + 6 + 3 * tick + (17 if presentation else 11) * 1.4 + 10)
    cell_px = (laid - left - right) / top
    limit = max(4, min(16, int((cell_px - 8) / (0.6 * tick))))
    safe_labels = [esc(r) for r in row_labels]
    text, hover, outlined = [], [], []
    for r in range(n_rows):
        text_row, hover_row = [], []
        for k in range(top):
            tok = int(order[r, k])
            piece = short_token(pieces[tok], limit)
            if tok == final:
                outlined.append((r, k))
                piece = f"<b>{piece}</b>"
            text_row.append(piece)
            hover_row.append(f"{safe_labels[r]} · rank {k + 1}: '{esc(pieces[tok])}' {values[r, k]:.3f}"
                             + (" · the model's final top token" if tok == final else ""))
        text.append(text_row)
        hover.append(hover_row)
    first = next((r for r in range(n_rows) if final in order[r]), None)
    sub_px = PRESENTATION_FONT_PX if presentation else 11
    note = _wrap([f"bold, outlined = the model's final top token '{esc(pieces[final])}'",
                  f"first in the top {top}: {safe_labels[first]}" if first is not None
                  else f"in no row's top {top}"], sub_px, laid - 20, "; ")
    margin = {"l": left, "r": right, "b": EXPORT_BAR_PX,
              "t": math.ceil(8 + title_px * 1.25 + sub_px * (1.6 + 1.3 * (note.count("<br>") + 1)) + 6
                             + tick * 1.4 + 6)}
    height = math.ceil(margin["t"] + margin["b"] + n_rows * cell_h)
    ticks = nice_ticks(0.0, 1.0, 5)
    trace = {
        "type": "heatmap", "z": values, "x0": 1, "dx": 1, "y0": 0, "dy": 1, "zmin": 0.0, "zmax": 1.0,
        "colorscale": SEQUENTIAL, "xgap": 2, "ygap": 2, "text": text, "texttemplate": "%{text}",
        "textfont": {"size": tick}, "hovertext": hover, "hovertemplate": "%{hovertext}<extra></extra>",
        "colorbar": {"title": {"text": "probability", "side": "right", "font": {"size": tick}},
                     "tickmode": "array", "tickvals": ticks.tolist(), "ticktext": [tick_label(v) for v in ticks],
                     "tickfont": {"size": tick}, "thickness": 18 if presentation else 12, "outlinewidth": 0,
                     "len": 1.0},
    }
    shapes = [{"type": "rect", "xref": "x", "yref": "y", "x0": k + 1 - _MARK_INSET - 0.1,
               "x1": k + 1 + _MARK_INSET + 0.1, "y0": r - _MARK_INSET, "y1": r + _MARK_INSET, "line": dict(line),
               "fillcolor": TRANSPARENT, "layer": "above"} for r, k in outlined for line in MARK_LINES]
    layout = {
        "template": "none",
        "font": {**FONT, "size": tick},
        "paper_bgcolor": TRANSPARENT,
        "plot_bgcolor": TRANSPARENT,
        "height": height,
        "margin": margin,
        "title": {"text": _title_text(title, "Logit lens: the next-token guess after every layer"), "x": 0.01,
                  "xanchor": "left", "y": 1 - 8 / height, "yanchor": "top", "yref": "container",
                  "font": {"size": title_px}, "subtitle": {"text": note, "font": {"size": sub_px}}},
        "xaxis": {"side": "top", "range": [0.5, top + 0.5], "tickmode": "array", "tickvals": list(range(1, top + 1)),
                  "ticktext": [f"rank {k}" for k in range(1, top + 1)], "tickfont": {"size": tick},
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
    if shapes:
        layout["shapes"] = shapes
    return FigureSpec([trace], layout)


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
    _check_flag("presentation", presentation)
    pieces = [str(p) for p in pieces]
    n = len(pieces)
    arrays = []
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
    if isinstance(labels, str) or len(labels) != 2:
        raise ValueError(f"labels must be two names (before, after), got {labels!r}")
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
        raise ValueError(f"top must be a whole number ≥ 1, got {top!r}")
    name_a, name_b = (esc(lab) for lab in labels)
    font = PRESENTATION_FONT_PX if presentation else 11
    title_font = 20 if presentation else 13
    pitch = max(font * 1.3, 8 * 2 + 6)
    margin = {"t": int(title_font * 1.6 + font * 1.6 + 10), "b": int(font * 1.4 * 2 + 12)}
    rows_fit = max(1, int((MAX_HEIGHT_PX - margin["t"] - margin["b"]) // pitch))
    rank_a, rank_b = _ranks(before), _ranks(after)
    order_a, order_b = np.argsort(rank_a), np.argsort(rank_b)  # ids by rank
    for k in range(min(int(top), n), 0, -1):
        head_a = [int(i) for i in order_a[:k]]
        seen = set(head_a)
        ids = head_a + [int(i) for i in order_b[:k] if int(i) not in seen]
        if len(ids) <= rows_fit:
            break
    ids = ids[:rows_fit]  # only when even the top 1 of each does not fit (never at 360 px)
    rows = np.arange(len(ids), dtype=np.int32)
    labels_y = [f"{short_token(pieces[i], 14)}  {rank_a[i]}→{rank_b[i]}" for i in ids]
    hover = [f"'{esc(pieces[i])}' (id {i})<br>{name_a}: {before[i]:.4f} (rank {rank_a[i]})<br>"
             f"{name_b}: {after[i]:.4f} (rank {rank_b[i]})<br>{name_b} − {name_a}: {after[i] - before[i]:+.4f}"
             for i in ids]
    label_em = max(text_width_em(pieces[i][:14]) + text_width_em(f"  {rank_a[i]}→{rank_b[i]}") for i in ids)
    idx = np.array(ids, dtype=np.int64)

    def bars(values: np.ndarray, name: str, colour: str) -> dict:
        return {"type": "bar", "orientation": "h", "name": name, "x": values[idx].astype(np.float32), "y": rows,
                "marker": {"color": colour}, "hovertext": hover, "hovertemplate": "%{hovertext}<extra></extra>"}

    data = [bars(before, name_a, RAW_COLOUR), bars(after, name_b, ADJ_COLOUR)]
    height = min(MAX_HEIGHT_PX, int(margin["t"] + margin["b"] + pitch * len(ids) + 8))
    margin.update(l=int(min(320, max(60, label_em * font + 14))), r=20)
    peak = max(1e-9, float(before[idx].max()), float(after[idx].max()))
    layout = bar_layout(font=font, title_font=title_font, height=height, margin=margin,
                        title=_title_text(title, f"Next-token probabilities: {name_a} vs {name_b}"),
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
    _check_flag("causal", causal)
    _check_flag("presentation", presentation)
    diff = np.asarray(diff, dtype=np.float64)
    if diff.ndim != 3:
        raise ValueError(f"diff must be 3-D (heads, T, T), got shape {diff.shape}")
    t = _check_square(diff.shape, "diff")
    if diff.shape[0] < 1:
        raise ValueError("diff has no heads")
    tokens = _check_tokens(tokens, t)
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or layer < 0:
        raise ValueError(f"layer must be a whole number ≥ 0, got {layer!r}")
    width_px = 1200 if width_px is None else width_px
    _check_size("width_px", width_px, 120)
    _check_size("max_height_px", max_height_px, 120)
    notes = dict(panel_notes or {})
    n_heads = diff.shape[0]
    bad = [h for h in notes if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or not 0 <= h < n_heads]
    if bad:
        raise ValueError(f"panel_notes names heads {bad} but there are {n_heads} heads")
    masked = np.broadcast_to(_masks(diff, causal_mask(t) if causal else None), diff.shape)
    vals = np.abs(diff[~masked])
    lim = max(float(vals.max()) if vals.size else 0.0, DIFF_FLOOR)
    titles = [f"head {h}" + (f" · {esc(notes[h])}" if h in notes else "") for h in range(n_heads)]
    default = f"Layer {int(layer)}: attention weights, prompt B − prompt A"
    fig = _attention_figure(
        diff, masked, tokens, ncols=None, panels=[(int(layer), h) for h in range(n_heads)], panel_titles=titles,
        row_titles=None, kind="scores", title=_title_text(title, default), width_px=width_px,
        max_height_px=max_height_px, focus=GRID_LABEL_LIMIT, presentation=presentation,
    )
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
