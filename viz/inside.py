"""Inside one attention cell: the arithmetic of a head, drawn from the numbers the lab hands over.

Every figure here takes numbers already computed by the model's own weights (lab.inside) and only
draws them; none computes a number it shows. Each number carries its formula in its label or hover,
as the Learn tab writes them (q_i, k_j, s_ij, a_ij, ...):

* `vector_rows`: a few vectors of one length as rows of coloured cells (x_i after the norm, q_i, k_j,
  v_j, Σ_j a_ij v_j ...), signed values on `DIVERGING` (red positive, blue negative, white zero);
* `dot_products`: the products q_i[d]·k_j[d] sorted by how much each adds, and their sum;
* `softmax_row`: the whole query row through the softmax, one bar per key, the clicked share outlined;
  keys after the query are masked (s = −∞, so e^s = 0);
* `head_additions`: what every head of the layer adds to the residual stream of the query token;
* `head_matrices`: the head as matrices (Q, K, V and QKᵀ raw, scaled and masked: capped first where the
  model soft-caps its scores), where a click on an entry picks a cell (layout.meta.panels says what each
  panel's rows and columns are).

Figures are `FigureSpec`s on transparent backgrounds with grey text (viz._common); the outline of
what is selected is the app's magenta `ROW_OUTLINE`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ._common import (
    DIVERGING, GRID_GREY, PRESENTATION_FONT_PX, ROW_OUTLINE, SEQUENTIAL, TRANSPARENT, colorscale, esc,
    hatch_image, hover_label, layout_frame, short_token, wrapped,
)
from .payload import FigureSpec

POSITIVE = "#d6604d"  # a positive bar: the red of DIVERGING
NEGATIVE = "#4393c3"  # a negative bar: its blue
OTHER = "#9a9a9a"  # the bar that sums what is left out
SELECTED = ROW_OUTLINE[1]["color"]  # the selected cell / head: the app's magenta outline
CELL_TEXT_MAX = 16  # vectors up to this many dimensions print their numbers in the cells
MIN_GAP_COLUMN_PX = 4  # vector columns narrower than this are drawn without a gap between them


def _fonts(presentation: bool) -> tuple[int, int]:
    """(tick / text font, title font) in px."""
    return (PRESENTATION_FONT_PX, 20) if presentation else (11, 14)


def _vector(name: str, v) -> np.ndarray:
    arr = np.asarray(v, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D vector, got shape {arr.shape}")
    return arr


def _layout(title: str, subtitle: str, height: int, presentation: bool, width_px: int | None, meta: dict,
            margin: dict) -> dict:
    """What every figure here shares: fonts, a transparent page, the title and a subtitle, hover style."""
    tick, title_px = _fonts(presentation)
    width = width_px or 720
    title = wrapped(title, (width - 20) / title_px)
    subtitle = wrapped(subtitle, (width - 20) / tick) if subtitle else ""
    # plotly.js: a line of the title 1.3 em apart, the subtitle 1.6 em of its own font under the title's box
    top = 10 + (title.count("<br>") + 1) * 1.3 * title_px
    if subtitle:
        top += (subtitle.count("<br>") + 1.6) * 1.3 * tick
    margin = {**margin, "t": margin.get("t", 0) + math.ceil(top + 6)}
    height = height + margin["t"] + margin["b"]
    return {**layout_frame(font_px=tick, height=height, margin=margin, title=title, title_px=title_px,
                           subtitle=subtitle or None, subtitle_px=tick),
            "hoverlabel": hover_label(18 if presentation else 12), "meta": meta}


def thinned_ticks(n: int, room_px: float, font_px: float, keep: Sequence[int] = ()) -> list[int]:
    """Which of n evenly spaced labels (room_px for all of them) to draw so that none overlaps another at
    font_px: every one while they fit, else every k-th, always the last and the positions in `keep` (a
    kept one takes the place of its neighbours)."""
    step = max(1, math.ceil(font_px * 1.3 / max(room_px / max(n, 1), 1e-9)))
    ticks = set(range((n - 1) % step, n, step))
    for k in keep:
        ticks = {t for t in ticks if abs(t - k) >= step} | {int(k)}
    return sorted(ticks)


def _two_lines(label: str) -> str:
    """A row label broken in two ("\n"): before its bracket, else at the space nearest its middle."""
    if " (" in label:
        return label.replace(" (", "\n(", 1)
    spaces = [i for i, c in enumerate(label) if c == " "]
    if not spaces:
        return label
    cut = min(spaces, key=lambda i: abs(i - len(label) / 2))
    return label[:cut] + "\n" + label[cut + 1:]


def _bound(values: np.ndarray) -> float:
    finite = np.abs(values[np.isfinite(values)])
    return float(finite.max()) if finite.size and finite.max() > 0 else 1.0


# ----------------------------------------------------------------------------- vectors


def vector_rows(rows: Sequence[tuple[str, Sequence[float]]], *, title: str, subtitle: str = "",
                presentation: bool = False, width_px: int | None = None) -> FigureSpec:
    """Vectors of one length as rows of cells: rows = [(label, vector)], labels, title and subtitle
    plain text (escaped) such as "q_i = W_Q · x_i". Red positive, blue negative, white zero, one symmetric scale for all rows;
    up to `CELL_TEXT_MAX` dimensions each cell prints its number, and hover always gives it."""
    if not rows:
        raise ValueError("vector_rows needs at least one (label, vector) row")
    vecs = [_vector(f"row {label!r}", v) for label, v in rows]
    n = vecs[0].size  # the dimensions; rows of different lengths could not share the dimension axis
    if any(v.size != n for v in vecs):
        raise ValueError(f"every row must have the same length, got {[v.size for v in vecs]}")
    tick, _ = _fonts(presentation)
    room = int((width_px or 720) * 0.45)  # the row labels' column at most; a longer label takes two lines
    texts = [label if len(label) * 0.6 * tick + 12 <= room else _two_lines(label) for label, _ in rows]
    labels = [esc(label).replace("\n", "<br>") for label in texts]
    z = np.stack(vecs)  # (rows, n)
    bound = _bound(z)  # one symmetric range for all rows: one colour is one number in every row
    # the longest label line sets the left margin (0.6 em a character), capped at `room`
    left = min(int(max(len(part) for label in texts for part in label.split("\n")) * 0.6 * tick) + 12, room)
    cell_h = 34 if presentation else 26
    if any("\n" in label for label in texts):  # a row labelled on two lines: room for both
        cell_h = max(cell_h, math.ceil(2.7 * tick))
    # a 1-px gap between columns only where a column is wide enough to keep its colour beside it: GPT-2's 768
    # dimensions in a half-page figure are under 1 px each, and gaps would leave nothing to see
    column_px = ((width_px or 720) - left - 10) / n
    # (rows, n) hover texts, one per cell: the number is always readable there, even past CELL_TEXT_MAX
    hover = [[f"{esc(rows[r][0])}<br>dimension {d}: {z[r, d]:.4f}" for d in range(n)] for r in range(len(rows))]
    trace = {"type": "heatmap", "z": z, "x0": 0, "dx": 1, "y0": 0, "dy": 1, "zmin": -bound, "zmax": bound,
             "colorscale": colorscale(DIVERGING), "showscale": False, "xgap": 1 if column_px >= MIN_GAP_COLUMN_PX else 0,
             "ygap": 3,
             "hovertext": hover, "hovertemplate": "%{hovertext}<extra></extra>"}
    if n <= CELL_TEXT_MAX:  # numbers in the cells only while they are wide enough to hold them
        trace.update(text=[[f"{x:.2f}" for x in row] for row in z], texttemplate="%{text}",
                     textfont={"size": tick - 1 if not presentation else tick})
    layout = _layout(esc(title), esc(subtitle), cell_h * len(rows), presentation, width_px,
                     {"viz": "inside_vectors", "rows": [esc(label) for label, _ in rows]},
                     {"l": left, "r": 10, "b": 28 + tick})
    layout["xaxis"] = {"title": {"text": "dimension", "standoff": 2}, "showgrid": False, "zeroline": False,
                       "ticks": "", "range": [-0.5, n - 0.5], "fixedrange": True}
    # the first row on top, as the rows read in the text; fixedrange: nothing here is worth zooming into
    layout["yaxis"] = {"tickmode": "array", "tickvals": list(range(len(rows))), "ticktext": labels,
                       "autorange": "reversed", "showgrid": False, "zeroline": False, "ticks": "", "fixedrange": True}
    return FigureSpec([trace], layout)


# ----------------------------------------------------------------------------- q · k


def dot_products(q: Sequence[float], k: Sequence[float], *, products: Sequence[float], total: float,
                 scale: float, score: float, top: int = 12, softcap: float | None = None,
                 capped: float | None = None, presentation: bool = False, width_px: int | None = None) -> FigureSpec:
    """The dot product q_i · k_j as its per-dimension products q_i[d]·k_j[d] (given, as the lab
    computed them), largest contribution first; past `top` the rest is one grey bar "other n
    dimensions". total: their sum; scale: what the sum is multiplied by (1/√d, d the head width or the
    model's own constant; or 1); score: s_ij = total × scale. softcap c and capped = c · tanh(score / c):
    the soft-cap of a model that has one (Gemma 2), said after the score (both None without one).
    Bars: red adds, blue takes away; text "q[d] × k[d] = product"."""
    q, k, p = _vector("q", q), _vector("k", k), _vector("products", products)
    if not q.size == k.size == p.size:
        raise ValueError(f"q, k and products must have one length, got {q.size}, {k.size}, {p.size}")
    if (softcap is None) != (capped is None) or (softcap is not None and not (
            math.isfinite(softcap) and softcap > 0 and math.isfinite(capped))):
        raise ValueError(f"softcap and capped go together, a positive cap and a number, got {softcap!r}, {capped!r}")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be a whole number ≥ 1, got {top!r}")
    tick, _ = _fonts(presentation)
    # largest contribution first, whichever its sign; stable: equal ones keep dimension order
    order = np.argsort(-np.abs(p), kind="stable")
    shown, rest = order[:top], order[top:]  # dimension indices drawn one by one, and those summed into one bar
    labels = [f"d={d}: {q[d]:.3f} × {k[d]:.3f}" for d in shown]
    values = [float(p[d]) for d in shown]
    text = [f"{p[d]:+.4f}" for d in shown]
    hover = [f"dimension {d}<br>q_i[{d}] = {q[d]:.4f}<br>k_j[{d}] = {k[d]:.4f}<br>"
             f"q_i[{d}] · k_j[{d}] = {p[d]:+.4f}" for d in shown]
    colours = [POSITIVE if v >= 0 else NEGATIVE for v in values]
    if rest.size:  # the dimensions left out still count: one grey bar of their sum, so the bars add up to total
        other = float(p[rest].sum())
        labels.append(f"the other {rest.size} added up")
        values.append(other)
        text.append(f"{other:+.4f}")
        hover.append(f"the {rest.size} dimensions not drawn, added up: {other:+.4f}")
        colours.append(OTHER)
    bar_h = 30 if presentation else 22
    trace = {"type": "bar", "orientation": "h", "x": values, "y": list(range(len(values))),
             "marker": {"color": colours}, "text": text, "textposition": "outside", "cliponaxis": False,
             "textfont": {"size": tick}, "hovertext": hover, "hovertemplate": "%{hovertext}<extra></extra>"}
    # the scale as the learner knows it: 1/√d_head (1 where the model does not scale)
    scale_text = "1" if scale == 1 else f"1/√{round(1 / scale ** 2)}" if scale > 0 else f"{scale:g}"
    title = f"3 · The dot product: q_i · k_j = Σ_d q_i[d] · k_j[d] = {total:.4f}"
    subtitle = (f"{q.size} products, largest first · score s_ij = (q_i · k_j) × {scale_text} = "
                f"{total:.4f} × {scale:.4f} = {score:.4f}")
    if softcap is not None:  # the cap comes before the mask and the softmax: the row's scores are capped ones
        subtitle += f" · capped: {softcap:g} · tanh({score:.4f} / {softcap:g}) = {capped:.4f}"
    layout = _layout(title, subtitle, bar_h * len(values), presentation, width_px,
                     {"viz": "inside_products", "order": [int(d) for d in shown], "total": total, "score": score,
                      "capped": capped},
                     {"l": int(max(len(x) for x in labels) * 0.58 * tick) + 10, "r": 12, "b": 30 + tick})
    bound = max(abs(v) for v in values) or 1.0  # all-zero products would give an empty axis
    # the bars' numbers sit outside their ends: the range leaves each the room it needs within the figure
    plot_px = max(60.0, (width_px or 720) - layout["margin"]["l"] - layout["margin"]["r"])
    text_px = max(len(x) for x in text) * 0.6 * tick + 8
    both = min(values) < 0  # an axis from 0 while nothing takes away, else one symmetric around 0
    # enlarge the range so the bars use what the numbers leave: one number's room per side that has bars;
    # never less than 35 % of the plot for the bars, however long the numbers
    reach = bound / max(0.35, 1 - (2 if both else 1) * text_px / plot_px)
    layout["xaxis"] = {"title": {"text": "q_i[d] · k_j[d]", "standoff": 2}, "range": [-reach, reach]
                       if both else [0, reach], "gridcolor": GRID_GREY, "zeroline": True,
                       "zerolinecolor": "#808080", "fixedrange": True}
    layout["yaxis"] = {"tickmode": "array", "tickvals": list(range(len(values))), "ticktext": labels,
                       "autorange": "reversed", "showgrid": False, "ticks": "", "fixedrange": True}
    return FigureSpec([trace], layout)


# ----------------------------------------------------------------------------- the row's softmax


def softmax_row(scores: Sequence[float], exps: Sequence[float], weights: Sequence[float], tokens: Sequence[str], *,
                query: int, key: int, total: float, used: Sequence[float] | None = None,
                presentation: bool = False, width_px: int | None = None) -> FigureSpec:
    """Query row `query` through the softmax, one bar per key position: the bar is the share
    a_ij = e^(s_ij − m) / Σ_j′ e^(s_ij′ − m) (the lab's numbers: scores s (−inf where masked),
    exps e^(s − m) and their sum `total`, weights a). The clicked `key` is outlined in magenta;
    masked keys (j > i, or outside a local window) read "masked: s = −∞, e^s = 0". used: the row the
    model actually used when a head tool replaced it (an edited or flattened row), drawn instead of
    the softmax, each hover naming both."""
    s, e, a = _vector("scores", scores), _vector("exps", exps), _vector("weights", weights)
    tokens = [str(t) for t in tokens]
    if not s.size == e.size == a.size == len(tokens):
        raise ValueError(f"scores, exps, weights and tokens must have one length, got {s.size}, {e.size}, "
                         f"{a.size}, {len(tokens)}")
    t = s.size  # the keys of the row: every position, masked ones included
    for name, value in (("query", query), ("key", key)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < t:
            raise ValueError(f"{name} {value!r} out of range: the row has {t} keys")
    # the bars show what the model multiplied V by: the softmax's row, or the row a head tool put in its place
    shown = a if used is None else _vector("used", used)
    if shown.size != t:
        raise ValueError(f"used has {shown.size} entries but the row has {t}")
    tick, _ = _fonts(presentation)
    masked = ~np.isfinite(s)  # (T,) bool: the mask wrote −inf there
    names = [f'"{esc(tok)}" ({j})' for j, tok in enumerate(tokens)]
    hover = []
    for j in range(t):
        if masked[j]:  # no score to work through: say why the share is 0
            hover.append(f"key {names[j]}<br>masked: s = −∞, e^s = 0, share 0")
            continue
        line = (f"key {names[j]}<br>score s = {s[j]:.4f}<br>e^(s − m) = {e[j]:.4f}<br>"
                f"share a = {e[j]:.4f} / {total:.4f} = {a[j]:.4f}")
        if used is not None:  # the softmax's share next to the one the model used
            line += f"<br>used instead: {shown[j]:.4f}"
        hover.append(line)
    room_px = (width_px or 720) - 54 - tick  # the plot's width (margins as below)
    every = t <= 24 and room_px / t >= 3.3 * tick  # a number over every bar only where it fits over its bar
    # no number over a masked key (its "−∞" mark stands there); the clicked key's number is always shown
    text = ["" if masked[j] else f"{shown[j]:.3f}" if every or j == key else "" for j in range(t)]
    width = [3 if j == key else 0 for j in range(t)]  # only the clicked key's bar is outlined
    # the colour repeats the height on the weights' 0 … 1 scale, as in the attention maps
    bars = {"type": "bar", "x": list(range(t)), "y": [0.0 if masked[j] else float(shown[j]) for j in range(t)],
            "marker": {"color": [float(v) for v in shown], "cmin": 0.0, "cmax": 1.0,
                       "colorscale": SEQUENTIAL, "line": {"color": SELECTED, "width": width}},
            "text": text, "textposition": "outside", "cliponaxis": False, "textfont": {"size": tick},
            "constraintext": "none",  # the clicked share's number whole over a bar narrower than it
            "hovertext": hover, "hovertemplate": "%{hovertext}<extra></extra>"}
    # "−∞" over each masked key: a bar of height 0 would read as a share that is merely small
    marks = {"type": "scatter", "mode": "text", "x": [j for j in range(t) if masked[j]],
             "y": [0.0] * int(masked.sum()), "text": ["−∞" for _ in range(int(masked.sum()))],
             "textposition": "top center", "textfont": {"size": tick}, "hoverinfo": "skip"}
    m = float(np.max(s[~masked])) if (~masked).any() else 0.0  # the max the softmax subtracts (none: all masked)
    what = "a_ij = e^(s_ij − m) / Σ_j′ e^(s_ij′ − m)" if used is None else "the row the model used (replaced)"
    title = f'4 · The row of {names[query]} through the softmax: {what}'
    subtitle = (f"m = max s = {m:.4f} · Σ e^(s − m) = {total:.4f} · outlined: a_{query},{key} = {shown[key]:.4f} "
                f"on {names[key]}" + (" · keys after the query are masked (−∞ → weight 0)" if masked.any() else ""))
    layout = _layout(title, subtitle, 220 if presentation else 180, presentation, width_px,
                     {"viz": "inside_softmax", "query": query, "key": key, "shares": [float(v) for v in shown]},
                     {"l": 44 + tick, "r": 10, "b": 16 + int(min(12, max(len(x) for x in tokens)) * 0.6 * tick)})
    layout.update(showlegend=False, bargap=0.2)
    # a label for every key that fits, the clicked key and the query always among them
    shown_ticks = thinned_ticks(t, (width_px or 720) - layout["margin"]["l"] - layout["margin"]["r"], tick,
                                keep=(key, query))
    # labels stand upright past 8 keys, where side by side they would run into each other
    layout["xaxis"] = {"tickmode": "array", "tickvals": shown_ticks,
                       "ticktext": [short_token(tokens[j], 10) for j in shown_ticks], "tickangle": -90 if t > 8 else 0,
                       "title": {"text": "key j", "standoff": 2}, "fixedrange": True, "showgrid": False}
    # past 1: room above a share of 1 for the number written over its bar
    layout["yaxis"] = {"title": {"text": "share a_ij", "standoff": 2}, "range": [0, 1.12], "gridcolor": GRID_GREY,
                       "fixedrange": True}
    return FigureSpec([bars, marks], layout)


# ----------------------------------------------------------------------------- the layer's heads


def head_additions(norms: Sequence[float], *, head: int, layer: int, token: str, bias: float | None = None,
                   presentation: bool = False, width_px: int | None = None) -> FigureSpec:
    """How much each head of `layer` adds to the residual stream of `token`: one bar per head,
    ‖o_h‖ with o_h = (Σ_j a_ij v_j) W_O[h] (the lab's norms), the head worked through (`head`)
    outlined. bias: the norm of the output projection's bias, which belongs to no single head (a bar
    of its own, grey)."""
    n = _vector("norms", norms)
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < n.size:
        raise ValueError(f"head {head!r} out of range: the layer has {n.size} heads")
    tick, _ = _fonts(presentation)
    labels = [f"head {h}" for h in range(n.size)]
    values = [float(v) for v in n]
    colours = [SELECTED if h == head else "#8c8cc8" for h in range(n.size)]
    hover = [f"head {h}: ‖o_{h}‖ = ‖(Σ_j a_ij v_j) W_O[{h}]‖ = {v:.4f}" for h, v in enumerate(values)]
    if bias is not None:
        labels.append("bias b_O")
        values.append(float(bias))
        colours.append(OTHER)
        hover.append(f"the output projection's bias (no single head's): ‖b_O‖ = {float(bias):.4f}")
    bar_h = 30 if presentation else 22
    trace = {"type": "bar", "orientation": "h", "x": values, "y": list(range(len(values))),
             "marker": {"color": colours}, "text": [f"{v:.3f}" for v in values], "textposition": "auto",
             "textfont": {"size": tick}, "hovertext": hover, "hovertemplate": "%{hovertext}<extra></extra>"}
    title = f'6 · What each head of layer {layer} adds to the residual stream of "{esc(token)}"'
    subtitle = f"‖o_h‖, the length of head h's output through its slice of W_O; head {head} (magenta) is the one above"
    layout = _layout(title, subtitle, bar_h * len(values), presentation, width_px,
                     {"viz": "inside_heads", "head": head}, {"l": int(tick * 5) + 8, "r": 12, "b": 28 + tick})
    layout["xaxis"] = {"title": {"text": "‖o_h‖", "standoff": 2}, "rangemode": "tozero", "gridcolor": GRID_GREY,
                       "fixedrange": True}
    layout["yaxis"] = {"tickmode": "array", "tickvals": list(range(len(values))), "ticktext": labels,
                       "autorange": "reversed", "showgrid": False, "ticks": "", "fixedrange": True}
    return FigureSpec([trace], layout)


# ----------------------------------------------------------------------------- the head as matrices

MATRIX_PANELS = (  # (what, title, rows, columns): the order the panels are drawn in, two rows of three
    ("Q", "Q = X W_Q (query i × dim)", "query", "dim"),
    ("K", "K = X W_K (key j × dim)", "key", "dim"),
    ("V", "V = X W_V (key j × dim)", "key", "dim"),
    ("raw", "Q Kᵀ (query i × key j)", "query", "key"),
    ("scaled", "Q Kᵀ × scale", "query", "key"),
    ("masked", "masked: −∞ where j > i", "query", "key"),
)


def head_matrices(q: np.ndarray, k: np.ndarray, v: np.ndarray, raw: np.ndarray, scaled: np.ndarray,
                  masked: np.ndarray, tokens: Sequence[str], *, layer: int, head: int, query: int, key: int,
                  scale: float, softcap: float | None = None, presentation: bool = False,
                  width_px: int | None = None) -> FigureSpec:
    """The whole head as matrices, six panels: Q, K, V (tokens × head dimensions) and QKᵀ before
    and after scaling and after the mask (T × T; masked entries −inf, hatched). Each panel has its
    own symmetric scale (red positive, blue negative, white zero; hover gives every number). The
    selected cell (query, key) is outlined in the score panels, its query row in Q and key row in K
    and V. layout.meta.panels names each panel's axes and what its rows / columns are, so a click
    on an entry can select a cell (a Q row picks the query, a K or V row the key). softcap: the cap of a
    model that squashes its scores (c · tanh(s / c)) before the mask; `masked` then holds capped scores."""
    mats = {name: np.asarray(m, dtype=np.float64) for name, m in
            (("Q", q), ("K", k), ("V", v), ("raw", raw), ("scaled", scaled), ("masked", masked))}
    t = len(tokens)  # T; every matrix's rows are the tokens, so their count is checked against it
    for name in ("Q", "K", "V"):
        if mats[name].ndim != 2 or mats[name].shape[0] != t:
            raise ValueError(f"{name} must be (T, d_head) with T = {t} tokens, got shape {mats[name].shape}")
    for name in ("raw", "scaled", "masked"):
        if mats[name].shape != (t, t):
            raise ValueError(f"{name} must be ({t}, {t}), got shape {mats[name].shape}")
    if not (0 <= query < t and 0 <= key < t):
        raise ValueError(f"cell ({query}, {key}) out of range for {t} tokens")
    tick, _ = _fonts(presentation)
    width = width_px or 900
    ncols = 1 if width < 560 else 3  # a phone: the six panels in one column, else two rows of three
    nrows = math.ceil(len(MATRIX_PANELS) / ncols)
    gap_x = 0.06 if ncols > 1 else 0.0
    panel_h = min(300, max(140, (width - 120) / ncols * 0.8))  # near square, kept between 140 and 300 px
    gap_px = 3.4 * tick  # room for a panel's dimension ticks and the next panel's title
    plot_h = nrows * panel_h + (nrows - 1) * gap_px
    layout = _layout(f"Layer {layer}, head {head} as matrices", "click an entry to work through its cell · "
                     "hatched = masked", plot_h, presentation, width_px,
                     {"viz": "inside_matrices", "layer": layer, "head": head, "query": query, "key": key,
                      "panels": []}, {"l": int(tick * 5) + 12, "r": 10, "b": 24, "t": int(tick * 1.8)})
    layout.update(annotations=[], shapes=[], images=[])  # filled panel by panel below
    labels = [f'"{esc(tok)}" ({i})' for i, tok in enumerate(tokens)]
    rows_shown = thinned_ticks(t, panel_h, tick - 1, keep=(query, key))  # token rows whose labels fit
    data = []
    for n, (what, name, rows, cols) in enumerate(MATRIX_PANELS):
        r, c = divmod(n, ncols)
        sfx = "" if n == 0 else str(n + 1)  # plotly's axis names: x / y, then x2 / y2, …
        # the panel's box in paper units (0 … 1 of the plot area), top row first
        x0 = c * (1 + gap_x) / ncols
        x1 = x0 + (1 - gap_x * (ncols - 1)) / ncols
        y1 = 1 - r * (panel_h + gap_px) / plot_h
        y0 = y1 - panel_h / plot_h
        z = mats[what]  # (T, d_head) for Q, K, V; (T, T) for the scores
        data.append(_matrix_trace(z, what, rows, labels, sfx, scale, softcap))
        # key columns are categories named by their tokens (hover reads them); only dimensions are numbered
        layout[f"xaxis{sfx}"] = {"domain": [round(x0, 4), round(min(1.0, x1), 4)], "anchor": f"y{sfx}",
                                 "showgrid": False, "zeroline": False, "ticks": "", "fixedrange": True,
                                 "range": [-0.5, z.shape[1] - 0.5], "tickfont": {"size": tick - 1},
                                 "showticklabels": cols == "dim",
                                 **({"type": "category", "categoryarray": labels} if cols == "key" else {})}
        layout[f"yaxis{sfx}"] = {"domain": [round(max(0.0, y0), 4), round(y1, 4)], "anchor": f"x{sfx}",
                                 "showgrid": False, "zeroline": False, "ticks": "", "fixedrange": True,
                                 # tokens named on the left column only (every panel has the same rows);
                                 # past 24 tokens their positions, which fit where the names would not
                                 "range": [t - 0.5, -0.5], "tickmode": "array", "tickvals": rows_shown,
                                 "type": "category", "categoryarray": labels,
                                 "ticktext": [short_token(tokens[i], 8) if t <= 24 else i for i in rows_shown],
                                 "tickfont": {"size": tick - 1}, "showticklabels": c == 0}
        name = _panel_title(what, name, scale, softcap)
        layout["annotations"].append({"text": name, "x": round((x0 + x1) / 2, 4), "y": round(y1, 4), "xref": "paper",
                                      "yref": "paper", "yanchor": "bottom", "showarrow": False,
                                      "font": {"size": tick}})
        if not np.isfinite(z).all():  # the hatch behind a panel with masked entries shows through their gaps
            layout["images"].append({"source": hatch_image(panel_h), "xref": f"x{sfx} domain", "yref": f"y{sfx} domain",
                                     "x": 0, "y": 1, "sizex": 1, "sizey": 1, "xanchor": "left", "yanchor": "top",
                                     "sizing": "stretch", "layer": "below"})
        # the selected cell: its query's row in Q, its key's row in K and V, the one (query, key) cell in the scores
        row = query if rows == "query" else key
        span = (key - 0.5, key + 0.5) if cols == "key" else (-0.5, z.shape[1] - 0.5)  # one cell, or the whole row
        for line in ROW_OUTLINE:  # magenta over a wider black line, so the outline shows on any cell colour
            layout["shapes"].append({"type": "rect", "xref": f"x{sfx}", "yref": f"y{sfx}", "x0": span[0],
                                     "x1": span[1], "y0": row - 0.5, "y1": row + 0.5, "line": dict(line),
                                     "fillcolor": TRANSPARENT, "layer": "above"})
        layout["meta"]["panels"].append({"xaxis": f"x{sfx}", "yaxis": f"y{sfx}", "what": what, "rows": rows,
                                         "cols": cols})
    return FigureSpec(data, layout)


def _panel_title(what: str, name: str, scale: float, softcap: float | None) -> str:
    """A panel's title: the scale written out on the scaled scores, the cap on the masked ones."""
    if what == "scaled":  # the factor the scores were multiplied by, written out
        return f"Q Kᵀ × {scale:.4f}" + ("" if scale == 1 else f" (1/√{round(1 / scale ** 2)})")
    if what == "masked" and softcap is not None:
        return f"{softcap:g}·tanh(· / {softcap:g}), then −∞ where masked"
    return name


def _matrix_trace(z: np.ndarray, what: str, rows: str, labels: list[str], sfx: str, scale: float,
                  softcap: float | None = None) -> dict:
    """One panel's heatmap: symmetric scale around 0, masked entries left blank (the hatch shows). Rows
    (and key columns) are named by their token labels, so the hover reads them without a text per cell."""
    bound = _bound(z)
    formula = {"Q": "q_i[d]", "K": "k_j[d]", "V": "v_j[d]", "raw": "q_i · k_j",
               "scaled": f"(q_i · k_j) × {scale:.4f}",
               "masked": "s_ij" if softcap is None
               else f"s_ij = {softcap:g}·tanh((q_i · k_j) × {scale:.4f} / {softcap:g})"}[what]
    matrix = what in ("Q", "K", "V")
    where = f"{rows} %{{y}}, dim %{{x}}" if matrix else "query %{y} → key %{x}"
    return {"type": "heatmap", "z": np.where(np.isfinite(z), z, np.nan), "xaxis": f"x{sfx}", "yaxis": f"y{sfx}",
            "y": labels, "x": list(range(z.shape[1])) if matrix else labels,
            "zmin": -bound, "zmax": bound, "colorscale": colorscale(DIVERGING), "showscale": False,
            "hoverongaps": False, "hovertemplate": f"{where}<br>{formula} = %{{z:.4f}}<extra></extra>"}
