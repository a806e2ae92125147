"""All heads of one layer at once, drawn on the tokens (the way BertViz's head view draws them).

`layer_heads` puts the text twice, queries in a column on the left and keys in a column on the right,
and draws one line from the query token to each key it attends to, in one colour per head
(`head_colours`); a line is as opaque as the weight it stands for, to the nearest 1/`OPACITY_LEVELS`. Lines of
a weight under `LINE_FLOOR` would be all but invisible and are left out.

* The lines start at one query token: the selected one (`query`), the last by default. A button in
  the figure shows instead the lines of every token, and another brings back the selected token's.
* The legend has one entry per head: a click hides or shows that head's lines, a double click shows it
  alone. Each head's lines are one trace per opacity level that occurs (``legendgroup`` "h<head>");
  the page keeps the heads the legend hid hidden when the figure is drawn again for another token of
  the same layer (assets/explore.js, from ``layout.meta``).
* Hovering a key names the query and the key and lists every head's weight on that key, in the
  heads' colours. These weights travel as float32, exactly the numbers the figure was given
  (``customdata`` of the hover trace, one row per key, one column per head).
* The button "from every token" draws the `ALL_LINES` strongest lines of all queries, and says how
  strong the weakest drawn is where that leaves lines of more than `LINE_FLOOR` out.
* Rows are laid out one token a line at a readable size (at least `READABLE_TICK_PX`, 16 px with
  large fonts); a text longer than the figure holds opens on the rows up to the query and is
  panned up and down (the subtitle says which rows are shown).

Colours never mean weights here (the opacity does); the figure is transparent and its text mid grey,
as every figure of viz (viz._common).
"""

from __future__ import annotations

import colorsys
import html
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
    short_token,
    text_width_em,
    title_y,
    wrap_parts,
    wrapped,
)
from .attention_layout import NORMAL_FONTS, PRESENTING_FONTS
from .panels import check_square, check_tokens
from .payload import FigureSpec

LINES_VIEW = "heads as lines"  # the name of this view among viz.ATTENTION_VIEWS
OPACITY_LEVELS = 10  # a line's opacity is its weight to the nearest 1/OPACITY_LEVELS
LINE_FLOOR = 0.05  # lines of a smaller weight are left out (they would round to opacity 0)
ALL_LINES = 2000  # "every token" draws at most this many lines, the strongest
HOVER_NUMBERS = 8192  # the keys' hover carries every head's weight on every key up to this many numbers
_LINE_PITCH = 1.5  # px between rows the figure aims for, in tick-font sizes
_LEAST_PITCH = 1.2  # and at least: one line of text a row
MIN_LINES_PX = 90  # the legend goes right of the keys where that leaves the lines this much width
_BOTTOM = EXPORT_BAR_PX  # px under the last row: the page's PNG / SVG buttons show there
_MODEBAR_PX = 130  # plotly's tool bar, top right: the buttons keep clear of it
# the tool bar keeps the image download, pan and reset: the rest would only hide the buttons
MODEBAR_REMOVE = ["zoom2d", "select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d"]
# The buttons: plotly draws the active one #F4FAFF whatever the layout says, so the other is a mid grey and
# both carry dark text of their own (a dark page's rule that lightens the figures' text leaves it alone).
_BUTTON_BG, _BUTTON_BORDER, _BUTTON_TEXT = "#9aa3b2", "#6b7688", "#111827"


def head_colours(n_heads: int) -> list[tuple[int, int, int]]:
    """One colour per head: hues evenly round the wheel, each at a lightness whose luminance reads on a
    white and on a dark page (a little lighter for odd heads, so neighbours differ in more than hue)."""
    out = []
    for h in range(n_heads):
        hue = (15 + 360 * h / max(1, n_heads)) % 360 / 360
        target = 0.19 if h % 2 == 0 else 0.3
        lo, hi = 0.2, 0.8
        for _ in range(30):  # the lightness whose relative luminance is `target`
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _luminance(colorsys.hls_to_rgb(hue, mid, 0.85)) < target else (lo, mid)
        r, g, b = colorsys.hls_to_rgb(hue, (lo + hi) / 2, 0.85)
        out.append((round(r * 255), round(g * 255), round(b * 255)))
    return out


def _luminance(rgb: tuple[float, float, float]) -> float:
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _rgba(rgb: tuple[int, int, int], alpha: float) -> str:
    return f"rgba({rgb[0]},{rgb[1]},{rgb[2]},{alpha:g})"


def line_level(weight: np.ndarray) -> np.ndarray:
    """The opacity level (1..OPACITY_LEVELS) a line of this weight is drawn at (0: not drawn, under LINE_FLOOR)."""
    w = np.asarray(weight, dtype=np.float64)
    return np.where(w >= LINE_FLOOR, np.clip(np.rint(w * OPACITY_LEVELS), 1, OPACITY_LEVELS), 0).astype(np.int64)


def _check(weights, tokens: Sequence[str], layer, query, head, causal) -> tuple[np.ndarray, list[str], int]:
    w = np.asarray(weights)
    if w.ndim != 3:
        raise ValueError(f"weights must be 3-D (heads, T, T), got shape {w.shape}")
    t = check_square(w.shape, "weights")
    tokens = check_tokens(tokens, t)
    for name, value, count in (("layer", layer, None), ("query", query, t), ("head", head, w.shape[0])):
        if value is None and name != "layer":  # no query: the last token; no head: none drawn bold
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0 \
                or (count is not None and value >= count):
            raise ValueError(f"{name} must be a whole number" + (f" in 0..{count - 1}" if count else " ≥ 0")
                             + f", got {value!r}")
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    w = w.astype(np.float32, copy=False)
    # only the keys a query sees are checked: a causal model's future cells are never drawn
    shown = w[:, np.tril(np.ones((t, t), dtype=bool))] if causal else w
    if not np.isfinite(shown).all() or shown.min() < -1e-6 or shown.max() > 1 + 1e-6:
        raise ValueError("weights must be attention weights: finite and in [0, 1] on the keys a query sees")
    return w, tokens, t


def _segments(qs: np.ndarray, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x, y of lines from (0, query) to (1, key), each followed by a gap: y NaN (float32) breaks the line,
    so x can be one byte a point (0, 1, 0)."""
    n = len(qs)
    x = np.tile(np.array([0, 1, 0], dtype=np.uint8), n)
    y = np.empty(3 * n, dtype=np.float32)
    y[0::3], y[1::3], y[2::3] = qs, ks, np.nan
    return x, y


def layer_heads(
    weights: np.ndarray,
    tokens: Sequence[str],
    layer: int,
    *,
    query: int | None = None,
    head: int | None = None,
    causal: bool = True,
    width_px: int = 720,
    max_height_px: int | None = None,
    presentation: bool = False,
    title_prefix: str | None = None,
) -> FigureSpec:
    """Every head of one layer as coloured lines between the tokens.

    weights: (H, T, T) post-softmax weights of the layer. query: the token whose lines are drawn
    (None: the last). head: one head drawn a little thicker (the Head menu's), None for none.
    causal: a query sees the keys up to itself only. width_px, max_height_px: the size laid out for
    (the figure is never taller than max_height_px; longer texts are panned). presentation: large
    fonts. title_prefix: plain text before the title (escaped). Raises ValueError for bad input.
    """
    w, tokens, t = _check(weights, tokens, layer, query, head, causal)
    check_pixels(width_px, max_height_px)
    n_heads = w.shape[0]  # w: (H, T, T)
    q = t - 1 if query is None else int(query)
    fonts = PRESENTING_FONTS if presentation else NORMAL_FONTS
    colours = head_colours(n_heads)

    keys = np.arange(q + 1 if causal else t)  # the keys the query may read: up to itself under the causal mask
    picked = w[:, q, keys]  # (H, keys): the selected token's weights
    allowed = np.tril(np.ones((t, t), dtype=bool)) if causal else np.ones((t, t), dtype=bool)
    every = np.where(allowed[None], w, 0.0)  # (H, T, T), 0 on masked cells: for "from every token"
    # a long text would draw far more lines than a page can take: keep the ALL_LINES strongest by raising the
    # floor to the weight of the last one kept (ties at that weight may add a few)
    strong = np.sort(every[every >= LINE_FLOOR])
    floor_all = float(strong[-ALL_LINES]) if len(strong) > ALL_LINES else LINE_FLOOR

    geo = _geometry(t, q, tokens, n_heads, fonts, width_px=width_px, max_height_px=max_height_px, floor_all=floor_all,
                    title_prefix=title_prefix, layer=layer)
    width = 3.0 if presentation else 2.0
    data: list[dict] = []
    for h in range(n_heads):  # the legend: one entry per head, the whole group follows it
        data.append({"x": [None], "y": [None], "name": str(h), "legendgroup": f"h{h}", "showlegend": True,
                     "line": {"color": _rgba(colours[h], 1), "width": width + 1}})
    # both sets of lines are sent: the query's shown (opacity 1), every token's hidden (0), and the two
    # buttons swap the opacities in the browser without asking the server again
    chosen = _add_lines(data, picked[:, None, :], np.array([q]), keys, colours, bold=width + 1.5, head=head, opacity=1)
    all_idx = _add_lines(data, np.where(every >= floor_all, every, 0), np.arange(t), np.arange(t), colours,
                         bold=None, head=None, opacity=0)
    chosen.append(len(data))  # the query's dot, where its lines start
    data.append({"mode": "markers", "x": [0], "y": [q], "cliponaxis": False,
                 "marker": {"size": _dot(fonts), "color": ROW_OUTLINE[1]["color"],
                            "line": {"color": ROW_OUTLINE[0]["color"], "width": 1.5}}})
    data.append(_key_hover(picked, keys, tokens, q, colours, geo, fonts))
    layout = {
        **layout_frame(font_px=fonts.axis_title, height=geo["height"], margin=geo["margin"], title=geo["title"],
                       title_px=fonts.title),
        # what every trace shares, sent once: a scatter of lines, out of the legend, not hovered
        "template": {"data": {"scatter": [{"type": "scatter", "mode": "lines", "showlegend": False,
                                           "hoverinfo": "skip", "connectgaps": False,
                                           "line": {"width": width}}]}},
        **({"annotations": [geo["note"]]} if geo["note"] else {}),
        "xaxis": {"range": [0, 1], "visible": False, "fixedrange": True},
        "yaxis": _token_axis(tokens, q, geo, fonts, "left"),
        # the keys' column: a second axis on the right that pans together with the queries' column
        "yaxis2": {**_token_axis(tokens, q, geo, fonts, "right"), "overlaying": "y", "matches": "y"},
        "showlegend": True,
        "legend": geo["legend"],
        "hovermode": "closest",
        "hoverlabel": {**hover_label(fonts.hover), "align": "left"},
        "dragmode": "pan",
        "modebar": {"remove": MODEBAR_REMOVE},
        "updatemenus": [_buttons(geo, fonts, chosen, all_idx)],
        "meta": {"viz": "layer_heads", "pick": "none", "T": t, "layer": int(layer), "query": q,
                 "heads": n_heads, "levels": OPACITY_LEVELS, "floor": LINE_FLOOR, "floor_all": floor_all,
                 "rows": geo["rows"], "label_px": geo["font"], "query_token": esc(tokens[q]),
                 "colours": ["#%02x%02x%02x" % c for c in colours]},
    }
    return FigureSpec([{"type": "scatter", **trace} for trace in data], layout)


def check_pixels(width_px, max_height_px) -> None:
    """The size a figure is laid out for: whole pixels, wide and high enough for a figure at all."""
    for name, value, least in (("width_px", width_px, 200), ("max_height_px", max_height_px, 160)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                  or value < least):
            raise ValueError(f"{name} must be a whole number of pixels ≥ {least}, got {value!r}")


def _add_lines(data: list[dict], w: np.ndarray, queries: np.ndarray, keys: np.ndarray, colours, bold: float | None,
               head: int | None, opacity: float) -> list[int]:
    """Append each head's lines (w: (H, queries, keys) weights, 0 where none is drawn) as one trace per
    opacity level that occurs; head `head` `bold` px wide. Returns the traces' indices in `data`."""
    added = []
    for h in range(w.shape[0]):
        levels = line_level(w[h])  # (queries, keys), 0 where no line is drawn
        # one trace per level, as a trace has one colour: grouping lines of equal opacity keeps the traces few
        for lev in np.unique(levels[levels > 0]):
            qs, ks = np.nonzero(levels == lev)
            x, y = _segments(queries[qs], keys[ks])
            added.append(len(data))
            data.append(_lines(x, y, h, int(lev), colours[h], bold if h == head else None, opacity))
    return added


def _buttons(geo: dict, fonts, chosen: list[int], all_idx: list[int]) -> dict:
    """The two buttons: the selected token's lines, or every token's (trace opacity 1 or 0)."""
    return {"type": "buttons", "direction": "right", "showactive": True, "active": 0, **geo["buttons"],
            "pad": {"l": 0, "r": 0, "t": 0, "b": 0}, "bgcolor": _BUTTON_BG, "bordercolor": _BUTTON_BORDER,
            "font": {"size": fonts.sub, "color": _BUTTON_TEXT},
            "buttons": [
                {"label": f"<span style='color:{_BUTTON_TEXT}'>{geo['labels'][0]}</span>", "method": "restyle",
                 "args": [{"opacity": [1] * len(chosen) + [0] * len(all_idx)}, chosen + all_idx]},
                {"label": f"<span style='color:{_BUTTON_TEXT}'>{geo['labels'][1]}</span>", "method": "restyle",
                 "args": [{"opacity": [0] * len(chosen) + [1] * len(all_idx)}, chosen + all_idx]},
            ]}


def _dot(fonts) -> int:
    """The size of the query's dot (px)."""
    return round(fonts.tick_max * 0.8)


def _lines(x, y, h: int, level: int, rgb, width: float | None, opacity: float) -> dict:
    """One head's lines of one opacity level (the template makes it a scatter of lines, `width` None: its width)."""
    return {"x": x, "y": y, "legendgroup": f"h{h}", **({} if opacity == 1 else {"opacity": opacity}),
            "line": {"color": _rgba(rgb, level / OPACITY_LEVELS), **({} if width is None else {"width": width})}}


def _key_hover(picked: np.ndarray, keys: np.ndarray, tokens: list[str], q: int, colours, geo: dict, fonts) -> dict:
    """Invisible markers on the key column: hovering one lists every head's weight on that key."""
    n_heads = picked.shape[0]
    shown = keys
    if n_heads * len(keys) > HOVER_NUMBERS:  # a long text: the keys drawn, and those of the rows opened on
        lo, hi = geo["rows"]
        shown = keys[(line_level(picked).max(axis=0) > 0) | ((keys >= lo) & (keys <= hi))]
    per_line = 4 if n_heads <= 16 else 6
    parts = [f"<span style='color:{_rgba(colours[h], 1)}'>■</span> {h} %{{customdata[{h}]:.3f}}"
             for h in range(n_heads)]
    rows = ["   ".join(parts[i:i + per_line]) for i in range(0, n_heads, per_line)]
    head = f"query “{esc(tokens[q])}” ({q}) → key “%{{text}}” (%{{y}})<br>weight in head:<br>"
    return {"mode": "markers", "yaxis": "y2", "x": np.ones(len(shown), dtype=np.uint8),
            "y": shown.astype(np.uint16 if len(tokens) > 255 else np.uint8), "text": [esc(tokens[k]) for k in shown],
            "customdata": np.ascontiguousarray(picked[:, shown].T, dtype=np.float32),
            "hovertemplate": head + "<br>".join(rows) + "<extra></extra>", "hoverinfo": "all",
            "cliponaxis": False, "marker": {"size": max(6, round(geo["pitch"])), "opacity": 0, "symbol": "square"}}


def _token_axis(tokens: list[str], q: int, geo: dict, fonts, side: str) -> dict:
    """A column of tokens: every position labelled, the query's (left) in bold and magenta."""
    text = [short_token(tok, geo["chars"]) for tok in tokens]
    if side == "left":
        text[q] = f"<span style='color:{ROW_OUTLINE[1]['color']}'><b>{text[q]}</b></span>"
    lo, hi = geo["rows"]
    return {"side": side, "range": [hi + 0.5, lo - 0.5], "tickmode": "array",
            "tickvals": np.arange(len(tokens), dtype=np.uint16 if len(tokens) > 255 else np.uint8),
            "ticktext": text, "tickfont": {"size": geo["font"]}, "showgrid": False, "zeroline": False,
            "ticklabelstandoff": geo["standoff"],
            "showline": False, "ticks": "", "fixedrange": geo["rows"] == (0, len(tokens) - 1)}


def _geometry(t: int, q: int, tokens: list[str], n_heads: int, fonts, width_px: int, max_height_px: int | None,
              floor_all: float, title_prefix: str | None, layer: int) -> dict:
    """Where everything goes, from the figure's top: the title, with the two buttons after it where they
    fit left of plotly's tool bar (else under it), a note when the rows are a window, the legend (a
    column right of the keys, scrolled where it is taller than the rows; rows of heads above the
    columns where the width would leave the lines less than `MIN_LINES_PX`), then the rows of tokens,
    one a line at the largest pitch that fits, labels of at least `READABLE_TICK_PX` (16 px with large
    fonts), else a window of rows up to the query: the rows of text matter more than seeing every
    legend entry at once."""
    title = (esc(title_prefix) if title_prefix else "") + f"Layer {layer}, all {n_heads} heads"
    title = wrapped(title, (width_px - 20) / fonts.title)
    title_lines = title.count("<br>") + 1
    bfont = fonts.sub
    # the second button names its floor where a busy text draws only its strongest lines (ALL_LINES)
    labels = (f"from “{short_token(tokens[q])}” ({q})",
              "from every token" + (f" (≥ {floor_all:.2f})" if floor_all > LINE_FLOOR else ""))
    buttons_w = sum(text_width_em(html.unescape(b)) for b in labels) * bfont + 2 * 14 + 4
    button_h = bfont * 1.3 + 16
    title_w = text_width_em(html.unescape(title)) * fonts.title  # a little more than drawn
    # the buttons right of a one-line title where both fit left of plotly's tool bar, else on a line under it
    beside = title_lines == 1 and 8 + title_w + 20 + buttons_w <= width_px - _MODEBAR_PX
    head_h = 8 + (max(fonts.title * 1.25, button_h) if beside else fonts.title * 1.25 * title_lines + 6 + button_h)
    buttons_top = 8 if beside else 8 + fonts.title * 1.25 * title_lines + 6
    lfont = fonts.sub
    entry = 40 + text_width_em(str(n_heads - 1)) * lfont + 6  # a legend item: its line and its number
    side_w = entry - 40 + 56  # a legend right of the keys: its width
    per_row = max(1, int((width_px - 16 - text_width_em("head ") * lfont - 8) // entry))
    row_h = math.ceil(n_heads / per_row) * lfont * 1.7 + 6
    chars = 12 if width_px >= 480 else 8  # tokens cut shorter on a phone
    standoff = _dot(fonts) // 2 + 3  # the labels clear the query's dot
    least = fonts.tick_min * _LEAST_PITCH
    font, rows = fonts.tick_max, (0, t - 1)  # start from the largest labels and every row
    for _ in range(5):  # the label font sets the margins, which set the rows' pitch, which sets the font
        label_w = max(text_width_em(html.unescape(short_token(tok, chars))) for tok in tokens) * font + 14 + standoff
        side = width_px - 2 * label_w - side_w >= MIN_LINES_PX  # a legend column beside, or rows of heads above
        # a window of rows says so, and how to see the rest; the note takes room in the header
        notes = wrap_parts([f"rows {rows[0]}–{rows[1]} of {t}: drag up or down for the others"], fonts.sub,
                           width_px - 20) if rows != (0, t - 1) else ""
        notes_h = (notes.count("<br>") + 1) * fonts.sub * 1.3 + 4 if notes else 0
        top = math.ceil(head_h + 6 + notes_h + (0 if side else row_h))
        if max_height_px is None:  # no limit: every row at the largest pitch, tall enough for a legend beside
            avail = t * fonts.tick_max * _LINE_PITCH
            if side:
                avail = max(avail, n_heads * lfont * 1.75 + lfont * 2)
        else:  # what the limit leaves under the header, never under three readable rows
            avail = max(max_height_px - top - _BOTTOM, 3 * least)
        pitch = min(fonts.tick_max * _LINE_PITCH, avail / t)  # px per row with every row shown
        if pitch < least:  # too many rows for the figure: open on the rows up to the query
            n_rows = max(3, int(avail // least))
            hi = min(t - 1, max(q, n_rows - 1))  # the window ends at the query (from row 0 when it is near the top)
            new_rows = (hi - n_rows + 1, hi)
            pitch = avail / n_rows
        else:  # every row fits at a readable size
            new_rows = (0, t - 1)
        new_font = max(fonts.tick_min, min(fonts.tick_max, math.floor(pitch / _LEAST_PITCH)))
        if new_font == font and new_rows == rows:  # settled: the margins were sized for this font
            break
        font, rows = new_font, new_rows
    margin = {"l": math.ceil(label_w), "r": math.ceil(label_w + (side_w if side else 0)), "t": top, "b": _BOTTOM}
    plot_h = (rows[1] - rows[0] + 1) * pitch
    height = int(margin["t"] + plot_h + margin["b"])
    plot_w = max(40.0, width_px - margin["l"] - margin["r"])

    def paper_y(px: float) -> float:  # px from the figure's top → paper y
        return round(1 + (margin["t"] - px) / plot_h, 5)

    left = round(-(margin["l"] - 8) / plot_w, 5)  # the figure's left edge (8 px in), in paper x: negative
    if side:  # a column right of the right-hand token labels
        legend = {"orientation": "v", "x": round(1 + (label_w + 12) / plot_w, 5), "xanchor": "left", "y": 1,
                  "yanchor": "top"}
    else:  # rows under the title (and the note), their title "head" to the left of them
        legend = {"orientation": "h", "x": left, "xanchor": "left", "y": paper_y(head_h + 6 + notes_h),
                  "yanchor": "top", "entrywidth": round(entry - 40), "entrywidthmode": "pixels"}
    legend.update({"font": {"size": lfont}, "bgcolor": TRANSPARENT, "itemwidth": 30, "traceorder": "normal",
                   "tracegroupgap": 0,
                   "title": {"text": "head", "font": {"size": lfont}, **({} if side else {"side": "left"})}})
    # after the title, or at the left edge on a line of their own
    buttons = {"x": round((8 + title_w + 20 - margin["l"]) / plot_w, 5) if beside else left, "xanchor": "left",
               "y": paper_y(buttons_top), "yanchor": "top"}
    note = None if not notes else {"text": notes, "x": left, "xanchor": "left", "xref": "paper", "yref": "paper",
                                   "y": paper_y(head_h + 4), "yanchor": "top", "align": "left", "showarrow": False,
                                   "font": {"size": fonts.sub}}
    return {"height": height, "margin": margin, "rows": rows, "pitch": pitch, "font": font, "chars": chars,
            "standoff": standoff,
            "title": title, "note": note, "legend": legend, "buttons": buttons, "labels": labels}
