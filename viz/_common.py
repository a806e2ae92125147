"""Shared helpers for the viz package: escaping, quantisation, tick thinning, layout pieces, the
colour language every figure speaks (`DIVERGING`, `SEQUENTIAL`, `COLOUR_KEY`), and `message_figure`,
the figure any view shows in place of a plot it cannot draw."""

from __future__ import annotations

import html
import math
import unicodedata
from urllib.parse import quote

import numpy as np

from .payload import FigureSpec

# Values are sent as integers in units of 1/1000 ("milli-units"). plotly.js hovertemplates
# cannot divide, so the figure swaps the number separators (decimal ",", thousands ".") and
# formats z with d3 "05,d": 231 -> "0.231", 1000 -> "1.000", -12345 -> "-12.345".
# Only figures whose other numbers are all integers or custom tick text may use this trick.
MILLI = 1000
MILLI_FORMAT = "%{z:05,d}"
MILLI_SEPARATORS = ",."
MILLI_LIMIT = 999_999  # |value| < 1000: beyond that "1.234.567" would read wrongly

# ----------------------------------------------------------------------------- colour language
# One convention for every signed quantity (attention scores, positional-encoding values, cosine
# similarity): RED = POSITIVE, BLUE = NEGATIVE, near-white = zero. ColorBrewer's RdBu (11 classes)
# ordered blue → red, so it needs no `reversescale`; plotly's own "RdBu" is avoided on purpose (its
# midpoint is grey, and plotly.js and plotly.py order it differently).
DIVERGING: tuple[tuple[float, str], ...] = (
    (0.0, "#053061"), (0.1, "#2166ac"), (0.2, "#4393c3"), (0.3, "#92c5de"), (0.4, "#d1e5f0"),
    (0.5, "#f7f7f7"),
    (0.6, "#fddbc7"), (0.7, "#f4a582"), (0.8, "#d6604d"), (0.9, "#b2182b"), (1.0, "#67001f"),
)
# Weights (0..1) and other non-negative magnitudes: one sequential scale, dark purple (0) → yellow (1).
SEQUENTIAL = "Viridis"
# Cyclic quantities (RoPE rotation angles): a full turn brings the colour back. matplotlib's
# "twilight" in ten even stops, written out because plotly.js knows no cyclic scale by name.
_TWILIGHT = ("#e2d9e2", "#9ebbc9", "#6785be", "#5e43a5", "#421257",
             "#471340", "#8e2c50", "#ba6657", "#ceac94", "#e2d9e2")
CYCLIC: tuple[tuple[float, str], ...] = tuple((i / (len(_TWILIGHT) - 1), c) for i, c in enumerate(_TWILIGHT))
MASKED_HINT = "hatched = masked (future position)"
COLOUR_KEY = ("Colours: red = positive, blue = negative, white = zero (attention scores, positional "
              "values, cosine similarity); dark purple → yellow = attention weight 0 → 1; "
              "hatched = masked (future position).")

# Figures are drawn on a transparent background so they sit on a light or a dark page; their text
# is a mid grey readable on both (about 4:1 contrast on white and on gradio's dark blocks). A page
# may sharpen it in dark mode with `.dark .js-plotly-plot .main-svg text:not(.nums):not(.name)
# {fill: #d1d5db !important}` (plotly sets fill inline; .nums/.name are the hover label's own text).
TRANSPARENT = "rgba(0,0,0,0)"
TEXT_GREY = "#808080"
GRID_GREY = "rgba(128,128,128,0.25)"
FONT = {"family": "Arial, sans-serif", "size": 11, "color": TEXT_GREY}
# Hover labels: dark box, white text, whatever the page's mode or the hovered colour (plotly's
# default takes the cell's colour, which a dark-mode rule recolouring all text would make unreadable).
HOVER_BG = "#1f2430"


def hover_label(size: float) -> dict:
    """layout.hoverlabel for a figure whose hover text is `size` px."""
    return {"bgcolor": HOVER_BG, "bordercolor": TEXT_GREY, "font": {"size": size, "color": "#ffffff"}}


PRESENTATION_FONT_PX = 16  # the smallest tick label in presentation mode (projecting in class)
READABLE_TICK_PX = 9  # the smallest token tick label on a screen: below it, fewer tokens are labelled
GREY = "#d4d4d4"  # kept for callers of the old name; masked cells are hatched now (see hatch_image)
TOKEN_TICK_CHARS = 12  # longer tokens are shortened in tick labels (hover keeps the full text)

# The outline of a selected query row: a 2 px magenta line on a black one, drawn in that order.
# Magenta is neither a Viridis nor a diverging colour, and the black edge keeps it apart from the
# reds and yellows; it reads on the hatch and on light and dark pages. layout.meta carries it too.
ROW_OUTLINE: tuple[dict, ...] = ({"color": "#000000", "width": 4}, {"color": "#ff2d95", "width": 2})


def colorscale(scale) -> list | str:
    """A colour-scale constant as plotly takes it (a list of [stop, colour] pairs, or a name)."""
    return scale if isinstance(scale, str) else [[stop, colour] for stop, colour in scale]


def hatch_image(size_px: float) -> str:
    """An inline SVG (data: URI, nothing fetched) of grey diagonal stripes, `size_px` square.

    Drawn behind an attention panel (layout image, layer "below", sizing "stretch") it shows
    through the NaN gaps of the masked cells: stripes, which no colour-scale value can produce,
    and semi-transparent grey, so they read on light and dark pages alike.
    """
    n = max(16, int(round(size_px)))
    svg = (f"<svg xmlns='http://www.w3.org/2000/svg' width='{n}' height='{n}'><pattern id='h' width='7' height='7' "
           "patternUnits='userSpaceOnUse' patternTransform='rotate(45)' fill='grey'><path d='M0 0h7v7H0z' "
           f"fill-opacity='.14'/><path d='M0 0h2.2v7H0z' fill-opacity='.6'/></pattern><rect width='{n}' height='{n}' "
           "fill='url(#h)'/></svg>")
    return "data:image/svg+xml," + quote(svg, safe="/:='()")


def text_width_em(text: str) -> float:
    """Rough rendered width of `text` in em (Arial-like: 0.6 em a character, 1 em for wide ones)."""
    return sum(1.0 if unicodedata.east_asian_width(c) in "WF" else 0.6 for c in str(text))


def _line_em(text: str) -> float:
    """Width of a line of (escaped) text in em as browsers draw the figures' sans-serif font (Arial,
    or DejaVu / Liberation Sans where Arial is missing): `text_width_em` is meant to over-estimate,
    by about a tenth."""
    return 0.92 * text_width_em(html.unescape(text))


def wrapped(title: str, width_em: float) -> str:
    """An (escaped) title broken into lines of at most `width_em` em, after its " · " or ": "
    separators (or spaces, for a part longer than a line), so a narrow figure shows it whole."""
    if _line_em(title) <= width_em:
        return title
    words, lines = [], [""]
    for part in title.replace(" · ", " · \n").replace(": ", ": \n").split("\n"):
        words.extend([part] if _line_em(part) <= width_em else [w + " " for w in part.split(" ")])
    for word in words:
        if lines[-1] and _line_em((lines[-1] + word).rstrip()) > width_em:
            lines.append("")
        lines[-1] += word
    return "<br>".join(line.rstrip() for line in lines)


def title_y(height: float, font_px: float, title: str) -> float:
    """layout.title.y (container, yanchor "top") that puts the top of `title` 8 px below the
    figure's top: plotly.js centres a title of several lines on where it would put the first, so
    each further line lifts it by half a line (1.3 em)."""
    return 1 - (8 + title.count("<br>") * 1.3 * font_px / 2) / height


def layout_frame(*, height: int, margin: dict, font_px: float = FONT["size"], title: str | None = None,
                 title_px: float = 13, subtitle: str | None = None, subtitle_px: float = 11) -> dict:
    """The start of a figure's layout that the builders share: plotly's bare template (no grid or
    background of its own), the grey house font at `font_px`, a transparent page so the figure sits
    on light and dark pages, the size, and an (escaped, already wrapped) `title` at the top left,
    8 px under the figure's top however many lines it has. `subtitle` goes under the title; the
    title is left out where `title` is None (a message figure). Builders add their axes, hover
    style and meta after it; the keys keep one order, so a figure's JSON does not depend on who
    built the frame."""
    frame = {"template": "none", "font": {**FONT, "size": font_px}, "paper_bgcolor": TRANSPARENT,
             "plot_bgcolor": TRANSPARENT, "height": height, "margin": margin}
    if title is not None:
        frame["title"] = {"text": title, "x": 0.01, "xanchor": "left", "y": title_y(height, title_px, title),
                          "yanchor": "top", "yref": "container", "font": {"size": title_px}}
        if subtitle is not None:
            frame["title"]["subtitle"] = {"text": subtitle, "font": {"size": subtitle_px}}
    return frame


def probability_text(p: float) -> str:
    """A probability in words, readable at every size: three decimals from 0.01 up ("0.873"), four below
    ("0.0049"), and a power of ten below 0.001 ("4.9e-4" for 1/2048, never "0.000"); exactly 0 is "0"."""
    p = float(p)
    if not math.isfinite(p):
        return str(p)
    if p == 0:
        return "0"
    if abs(p) >= 0.01:
        return f"{p:.3f}"
    if abs(p) >= 0.001:
        return f"{p:.4f}"
    mantissa, exponent = f"{p:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def esc(text: str) -> str:
    """Escape &, < and > so Plotly shows a user/token string literally (it does not decode &quot;)."""
    return html.escape(str(text), quote=False)


def short_token(token: str, limit: int = TOKEN_TICK_CHARS) -> str:
    """Escaped tick text for a token, shortened with an ellipsis when longer than `limit`."""
    token = str(token)
    return esc(token if len(token) <= limit else token[: limit - 1] + "…")


def to_milli(values: np.ndarray) -> np.ndarray:
    """Round finite values to integer milli-units (float64, NaN kept), clipped to ±MILLI_LIMIT."""
    q = np.rint(np.asarray(values, dtype=np.float64) * MILLI)
    return np.clip(q, -MILLI_LIMIT, MILLI_LIMIT)


def narrow_int(q: np.ndarray) -> np.ndarray:
    """Smallest integer dtype (u1, u2, i1, i2, i4) holding the integer-valued float array `q`."""
    lo, hi = (float(q.min()), float(q.max())) if q.size else (0.0, 0.0)
    for dtype in (np.uint8, np.uint16, np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return q.astype(dtype)
    raise ValueError(f"values {lo}..{hi} do not fit in int32")


def encoded_milli(q: np.ndarray) -> np.ndarray:
    """Milli-unit array ready for Plotly: narrowest int dtype, or float32 when it holds NaN."""
    return q.astype(np.float32) if np.isnan(q).any() else narrow_int(q)


def tick_step(n: int, panel_px: float, label_px: float = 12.0) -> int:
    """Stride between tick labels so that n labels fit in panel_px pixels."""
    fit = max(2, int(panel_px // label_px))
    return max(1, math.ceil(n / fit))


def nice_ticks(lo: float, hi: float, n: int = 5) -> np.ndarray:
    """Round tick values covering [lo, hi] (about n of them)."""
    if not math.isfinite(lo) or not math.isfinite(hi) or hi <= lo:
        return np.array([lo]) if math.isfinite(lo) else np.array([0.0])
    raw = (hi - lo) / max(1, n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks = np.arange(start, hi + step * 1e-6, step)
    return np.round(ticks, 10)


def tick_label(v: float) -> str:
    """Compact text for a colour-bar tick (plain '.' decimal; custom tick text is not reformatted)."""
    return f"{v:g}"


def empty_note(text: str) -> dict:
    """A centred paper-coordinates annotation (already-escaped text)."""
    return {"text": text, "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper", "showarrow": False,
            "font": {"size": 13, "color": TEXT_GREY}}


# ----------------------------------------------------------------------------- pieces the head figures share
# (the head-role maps in viz.heads, the logit lens in viz.lens, the A/B comparisons in viz.compare)

EXPORT_BAR_PX = 30  # bottom margin of the overview figures: the page's PNG / SVG buttons sit there
# A cell that reaches its role's threshold (or the model's final token in the logit lens): a thin
# white line on a black one, inset in the cell. It reads on every Viridis and diverging colour and
# on light and dark pages, and stays apart from the selected head's magenta outline (ROW_OUTLINE).
MARK_LINES: tuple[dict, ...] = ({"color": "#000000", "width": 3}, {"color": "#ffffff", "width": 1.5})
MARK_INSET = 0.36  # half-size of that outline, in cells
DIFF_FLOOR = 0.05  # a B − A colour range is at least ±this, so noise stays pale


def check_figure_size(name: str, value: object, least: int) -> None:
    """A size in pixels: a whole number ≥ `least` (max_height_px may also be None)."""
    if value is None and name == "max_height_px":
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name} must be a whole number of pixels ≥ {least}, got {value!r}")


def check_flag(name: str, value: object) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def check_width(width_px: int | None) -> None:
    if width_px is not None:
        check_figure_size("width_px", width_px, 120)


def title_text(title: str | None, default: str) -> str:
    """The escaped caller title, or the (already safe) default."""
    return default if title is None else esc(title)


def wrap_parts(parts: list[str], font_px: float, width_px: float, sep: str = " · ") -> str:
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


# ----------------------------------------------------------------------------- a figure that is only words


def message_figure(text: str, *, presentation: bool = False, width_px: int | None = None) -> FigureSpec:
    """An empty figure carrying a short message (lines separated by newlines; text is escaped); given the
    figure's width (`width_px`), each line is broken to it, so that a long message is never cut at an edge."""
    font = 20 if presentation else empty_note("")["font"]["size"]
    room_em = (max(200, width_px) - 48) / font if width_px else math.inf
    note = "<br>".join(wrapped(esc(line), room_em) for line in text.split("\n"))
    annotation = empty_note(note)
    if presentation:
        annotation["font"] = {**annotation["font"], "size": font}
    lines = note.count("<br>") + 1
    layout = {
        **layout_frame(height=max(260 if presentation else 220, int(lines * font * 1.4) + 60),
                       margin={"l": 20, "r": 20, "t": 20, "b": 20}),
        "xaxis": {"visible": False},
        "yaxis": {"visible": False},
        "annotations": [annotation],
    }
    return FigureSpec((), layout)
