"""The attention-panels figure every attention view draws, and the checks on its input.

`panels_figure` turns N (T, T) maps into one figure of N square heatmap panels sharing one colour
axis (`attention_view`'s grid, single head and all-layers overview, and `attention_difference`).
The conventions it follows are listed in viz.attention.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

from ._common import (
    FONT,
    MASKED_HINT,
    MILLI,
    MILLI_FORMAT,
    MILLI_SEPARATORS,
    ROW_OUTLINE,
    TOKEN_TICK_CHARS,
    TRANSPARENT,
    esc,
    hatch_image,
    hover_label,
    short_token,
    text_width_em,
    title_y,
    to_milli,
    wrapped,
)
from .attention_colour import colour_axis, colour_values, value_name
from .attention_layout import (
    NORMAL_FONTS,
    PRESENTING_FONTS,
    SCALE_BELOW_PX,
    Fonts,
    Geometry,
    below_y,
    grid_geometry,
    pick_columns,
)
from .attention_tiles import ATTENTION_BUDGET, heatmap_tiles
from .payload import FigureSpec

ATTENTION_KINDS = ("weights", "scores")  # what is drawn or exported: the weights, or the scores before the softmax
KEY_TITLE = "key position (attended to)"  # the key axis's title (shortened where a panel is too small for it)


# ----------------------------------------------------------------------------- input checks


def check_kind(kind: str) -> None:
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"kind must be 'weights' or 'scores', got {kind!r}")


def check_square(shape: tuple[int, ...], what: str = "attention") -> int:
    tq, tk = shape[-2], shape[-1]
    if tq != tk:
        raise ValueError(f"{what} is {tq}×{tk} (query × key) but must be square")
    if tq == 0:
        raise ValueError(f"{what} is empty (0×0)")
    return tq


def check_tokens(tokens: Sequence[str], t: int) -> list[str]:
    tokens = [str(tok) for tok in tokens]
    if len(tokens) != t:
        raise ValueError(f"attention is {t}×{t} but {len(tokens)} token labels were given")
    return tokens


def masked_cells(values: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
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


def check_weight_range(q: np.ndarray) -> None:
    finite = q[np.isfinite(q)]
    if finite.size and (finite.min() < -1 or finite.max() > MILLI + 1):
        lo, hi = finite.min() / MILLI, finite.max() / MILLI
        raise ValueError(
            f"attention weights must lie in [0, 1] but range {lo:.3g}..{hi:.3g}; "
            "pass kind='scores' for pre-softmax scores"
        )


# ----------------------------------------------------------------------------- figure


def panels_figure(
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

    ncols None picks the columns (`pick_columns`). focus: label every position up to this many,
    and past it open on the last `focus` positions (None: always show all). title_prefix (escaped)
    goes before the title; a title wider than the figure is broken into lines (a phone)."""
    n, t = values.shape[0], values.shape[-1]  # N panels of (T, T)
    if kind == "scores":
        colour = "linear"  # the colour modes are for weights; scores keep their symmetric scale
    q = _milli_values(values, masked, kind, colour)  # (N, T, T) in milli-units: whole numbers travel smaller
    fonts = PRESENTING_FONTS if presentation else NORMAL_FONTS
    visible = t if focus is None else min(t, focus)
    offset = t - visible  # the first position in view

    # large fonts, a colour bar at the right: the hatch's legend goes under the bar, and the panels get the line
    hint_aside = bool(presentation and show_scale and width_px >= SCALE_BELOW_PX and masked.any())
    sub_text = _subtitle(bool(masked.any()) and not hint_aside, offset, visible, t, fonts.sub, width_px)
    title = wrapped(title_prefix + title, (width_px - 20) / fonts.title)
    fit = dict(fonts=fonts, width_px=width_px, max_height_px=max_height_px, show_scale=show_scale,
               cb_em=4.5 if colour in ("log", "value") or kind == "scores" else 4.0, row_titles=bool(row_titles))
    geo, panel_titles = _laid_out(n, visible, tokens, title, sub_text, panel_titles, ncols, fit)
    margin, labels = geo.margin, geo.labels
    plot_w, plot_h = max(1.0, width_px - margin["l"] - margin["r"]), max(1.0, geo.height - margin["t"] - margin["b"])
    right_frac = min(1.0, (geo.ncols * geo.panel + (geo.ncols - 1) * geo.hgap) / plot_w)  # the panels' right end

    value = value_name(kind, colour)
    hover = f"%{{meta}}<br>query %{{y}} → key %{{x}}<br>{value} {MILLI_FORMAT}<extra></extra>"
    title_layout = {"text": title, "x": 0.01, "xanchor": "left", "y": title_y(geo.height, fonts.title, title),
                    "yanchor": "top", "yref": "container", "font": {"size": fonts.title},
                    **({"subtitle": {"text": sub_text, "font": {"size": fonts.sub}}} if sub_text else {})}
    below = width_px < SCALE_BELOW_PX  # a phone: the colour bar lies under the panels
    layout: dict = {
        "template": _template(t, [short_token(tok) for tok in tokens], geo, fonts, hover),
        "separators": MILLI_SEPARATORS,  # with MILLI_FORMAT's padding, 412 milli-units print as "0.412"
        "title": title_layout,
        "font": {**FONT, "size": fonts.axis_title},
        "height": geo.height,
        "margin": margin,
        "plot_bgcolor": TRANSPARENT,
        "paper_bgcolor": TRANSPARENT,
        "coloraxis": colour_axis(q, masked, kind, colour, show_scale, fonts, x=round(right_frac + 8 / plot_w, 4),
                                 below=below_y(geo, labels, fonts, plot_h) if show_scale and below else None,
                                 bar_px=min(1.0, right_frac + 8 / plot_w) * plot_w if below
                                 else plot_h - (_hint_px(fonts) if hint_aside else 0)),
        "hoverlabel": hover_label(fonts.hover),
        "uirevision": "attention",
        "meta": _meta(kind, colour, t, offset, query, geo),
        "annotations": [],
        "images": [],
        "shapes": [],
    }
    if hint_aside:
        _hint_under_bar(layout, fonts, plot_h)
    labels_cat = [f'"{esc(tok)}" ({i})' for i, tok in enumerate(tokens)]  # the position keeps repeated tokens apart
    data: list[dict] = []
    for k in range(n):  # each panel gets an equal share of the byte budget: the figure stays bounded
        xref, yref = _add_panel(layout, k, n, geo, plot_wh=(plot_w, plot_h), t=t, offset=offset, labels_cat=labels_cat,
                                row_titles=row_titles, panel_title=panel_titles[k], any_masked=bool(masked[k].any()),
                                query=query, key_title=_key_title(geo, fonts))
        layer, head = panels[k]
        layout["meta"]["panels"].append({"xaxis": xref, "yaxis": yref, "layer": layer, "head": head})
        data.extend(heatmap_tiles(q[k], masked[k], xref, yref, ATTENTION_BUDGET // n, f"layer {layer}, head {head}"))
    for key in ("annotations", "images", "shapes"):  # no empty lists on the wire
        if not layout[key]:
            del layout[key]
    return FigureSpec(data, layout)


def _meta(kind: str, colour: str, t: int, offset: int, query: int | None, geo: Geometry) -> dict:
    """layout.meta: what the page reads to link the figure with the text (panels are added as drawn)."""
    return {"viz": "attention", "kind": kind, "colour": colour, "unit": 1 / MILLI, "T": t, "offset": offset,
            "query": query, "outline": [dict(line) for line in ROW_OUTLINE], "panels": [],
            "label_px": geo.labels.font, "label_step": geo.labels.step,  # tick font and stride laid out with
            "raised": geo.raised}  # taller than max_height_px: the panels kept their readable size (large fonts)


def _laid_out(n: int, visible: int, tokens: list[str], title: str, sub_text: str, panel_titles: list[str],
              ncols: int | None, fit: dict) -> tuple[Geometry, list[str]]:
    """The geometry and the panel titles that fit over its panels (two lines where a badge needs them)."""
    geo = _fit(n, visible, tokens, title, sub_text, ncols=ncols, panel_titles=any(panel_titles), **fit)
    titles, lines = _fitted_titles(panel_titles, geo.panel + geo.hgap, fit["fonts"].panel_title)
    if lines > 1:  # a badge on a line of its own under "head h": room for it above each panel
        geo = _fit(n, visible, tokens, title, sub_text, ncols=geo.ncols, panel_titles=lines, **fit)
        titles, _ = _fitted_titles(titles, geo.panel + geo.hgap, fit["fonts"].panel_title)
    return geo, titles


HINT_LINES = ("hatched =", "masked", "(future", "position)")  # MASKED_HINT, in the colour bar's column


def _hint_px(fonts: Fonts) -> float:
    return len(HINT_LINES) * fonts.colorbar * 1.3 + 10


def _hint_under_bar(layout: dict, fonts: Fonts, plot_h: float) -> None:
    """The hatch's legend (`HINT_LINES`) in the colour bar's column under a shortened bar, instead of a
    subtitle line above the panels."""
    bar = layout["coloraxis"]["colorbar"]
    bar.update(len=round(max(0.3, 1 - _hint_px(fonts) / plot_h), 4), lenmode="fraction", y=1, yanchor="top")
    layout["annotations"].append({"text": "<br>".join(HINT_LINES), "x": bar["x"], "y": 0, "xref": "paper",
                                  "yref": "paper", "xanchor": "left", "yanchor": "bottom", "yshift": 0,
                                  "align": "left", "showarrow": False, "font": {"size": fonts.colorbar}})


def _milli_values(values: np.ndarray, masked: np.ndarray, kind: str, colour: str) -> np.ndarray:
    """The values as they are coloured, in milli-units, NaN where masked (weights are checked to be in [0, 1])."""
    if kind != "weights" or colour == "value":  # scores and value-weighted norms are not weights in [0, 1]
        return to_milli(np.where(masked, np.nan, values))
    check_weight_range(to_milli(np.where(masked, np.nan, values)))
    q = to_milli(colour_values(values, masked, colour))
    return q if colour == "log" else np.clip(q, 0, MILLI)


def _fitted_titles(titles: list[str], room_px: float, font_px: float) -> tuple[list[str], int]:
    """Panel titles (escaped) that fit over a panel `room_px` wide: a title too wide goes on two lines at its
    " · " ("head 1" over "induction"), and a line still too wide is shortened with an ellipsis. Returns the
    titles and the most lines any takes."""
    chars = max(3, int((room_px - 4) / font_px / 0.6))
    out, lines = [], 1
    for text in titles:
        if "<br>" in text or text_width_em(html.unescape(text)) * font_px <= room_px - 4:
            out.append(text)
            lines = max(lines, text.count("<br>") + 1)
            continue
        parts = [html.unescape(part) for part in text.split(" · ")]
        parts = [esc(p if len(p) <= chars else p[: chars - 1] + "…") for p in parts]
        out.append("<br>".join(parts))
        lines = max(lines, len(parts))
    return out, lines


def _fit(n: int, visible: int, tokens: list[str], title: str, sub_text: str, *, fonts: Fonts, ncols: int | None,
         width_px: int, max_height_px: int | None, cb_em: float, show_scale: bool, panel_titles: bool | int,
         row_titles: bool) -> Geometry:
    """The layout of n panels showing `visible` positions, with room for the longest tick label, the
    (wrapped) title and subtitle; ncols None picks the columns."""
    label_em = max(text_width_em(tok if len(tok) <= TOKEN_TICK_CHARS else tok[: TOKEN_TICK_CHARS - 1] + "…")
                   for tok in tokens)
    label_em = max(label_em, 1.2)
    sub_lines = sub_text.count("<br>") + 1 if sub_text else 0
    kw = dict(fonts=fonts, label_em=label_em, cb_em=cb_em, width_px=width_px, show_scale=show_scale,
              sub_lines=sub_lines, panel_titles=int(panel_titles),
              row_title_lines=2 if row_titles else 1, title_lines=title.count("<br>") + 1)
    if ncols is None:
        return pick_columns(n, visible, max_height_px=max_height_px, **kw)
    return grid_geometry(n, max(1, min(ncols, n)), visible, max_height_px=max_height_px, **kw)


def _subtitle(any_masked: bool, offset: int, visible: int, t: int, font_px: float, width_px: int) -> str:
    """The hatch legend and the "showing the last …" note: one line, or two when one is too wide."""
    subtitle = []
    if any_masked:
        subtitle.append(MASKED_HINT)
    if offset:
        subtitle.append(f"showing the last {visible} of {t} positions; drag to pan, double-click for all")
    sub_text = " · ".join(subtitle)
    if text_width_em(sub_text) * font_px > width_px - 20:
        sub_text = "<br>".join(subtitle)
    return sub_text


def _template(t: int, ticktext: list[str], geo: Geometry, fonts: Fonts, hover: str) -> dict:
    """What every panel shares, sent once as template defaults: the heatmap trace style, the axes'
    ticks, the hatch image, the panel titles' style and the query-row outline."""
    labels = geo.labels
    tickvals = np.arange((t - 1) % labels.step, t, labels.step)  # the newest position is always labelled
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
    return {
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
    }


def _key_title(geo: Geometry, fonts: Fonts) -> str:
    """The key axis's title, centred under the first panel: shortened where a small panel (many heads,
    large fonts) leaves it too little room to the figure's left edge."""
    room = 2 * (geo.margin["l"] + geo.panel / 2)
    return KEY_TITLE if len(KEY_TITLE) * fonts.axis_title * 0.55 <= room else "key position"


def _add_panel(layout: dict, k: int, n: int, geo: Geometry, plot_wh: tuple[float, float], t: int, offset: int,
               labels_cat: list[str], row_titles: list[str] | None, panel_title: str, any_masked: bool,
               query: int | None, key_title: str) -> tuple[str, str]:
    """Panel k's axes, title, hatch and query-row outline added to `layout`; returns its (xaxis, yaxis) names."""
    plot_w, plot_h = plot_wh
    col_frac, row_frac = geo.panel / plot_w, geo.panel / plot_h
    row, col = divmod(k, geo.ncols)  # panels fill rows left to right, the first row on top
    suffix = "" if k == 0 else str(k + 1)  # plotly's axis names: x / y, then x2 / y2, …
    xref, yref = f"x{suffix}", f"y{suffix}"
    x0 = col * (geo.panel + geo.hgap) / plot_w  # the panel's left and top edges, in paper units
    y1 = 1 - row * (geo.panel + geo.vgap) / plot_h
    bottom = row == geo.nrows - 1 or k + geo.ncols >= n  # the last row, or nothing under it in a short last row
    xaxis: dict = {"domain": [round(x0, 5), round(min(1.0, x0 + col_frac), 5)], "anchor": yref}
    # square cells whatever width the page gives the figure
    yaxis: dict = {"domain": [round(max(0.0, y1 - row_frac), 5), round(y1, 5)], "anchor": xref,
                   "scaleanchor": xref}
    if bottom:  # tick labels under the lowest panel of each column and left of each row only
        xaxis["showticklabels"] = True
    if col == 0:
        yaxis["showticklabels"] = True
    # the first panel's axes hold the categories and the range; the others follow them, so a pan or zoom in
    # any panel moves all of them together
    if k == 0:
        # (categoryorder defaults to "array" when a categoryarray is given)
        xaxis.update(categoryarray=labels_cat, range=[offset - 0.5, t - 0.5])
        yaxis.update(categoryarray=labels_cat, range=[t - 0.5, offset - 0.5])
    else:  # matched axes share the range (and its square cells: only the first y axis is anchored)
        xaxis["matches"], yaxis["matches"] = "x", "y"
        del yaxis["scaleanchor"]
    if bottom and k == (geo.nrows - 1) * geo.ncols:  # the key axis is named once, under the last row's first panel
        xaxis["title"] = {"text": key_title}
    if col == 0:  # a row's own title where given (its layer, in the all-layers overview)
        yaxis["title"] = {"text": row_titles[row] if row_titles else "query position"}
    layout[f"xaxis{suffix}"] = xaxis
    layout[f"yaxis{suffix}"] = yaxis
    # only what differs from panel to panel: the template's *defaults hold the rest of these dicts
    if panel_title:
        layout["annotations"].append({"text": panel_title, "x": round(x0 + col_frac / 2, 5),
                                      "y": round(y1, 5)})
    if any_masked:
        layout["images"].append({"xref": f"{xref} domain", "yref": f"{yref} domain"})
    if query is not None:  # the selected query's row, outlined across the panel
        for line in ROW_OUTLINE:
            layout["shapes"].append({"xref": xref, "yref": yref, "y0": query - 0.5, "y1": query + 0.5,
                                     "line": dict(line)})
    return xref, yref
