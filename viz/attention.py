"""Attention heatmaps: one layer's heads, one head enlarged, or every layer × head.

`attention_view` picks one of these for a view name from `ATTENTION_VIEWS` (what the app's radio
offers), so the choice lives here rather than in the UI code. The figures are `FigureSpec`s.

Conventions shared by all three figures
* rows are query positions (position 0 on top), columns are key positions;
* the axes are category axes whose categories are unique position labels ``"tok" (i)``, so hover can
  name the tokens and repeated tokens never merge; ticks are placed by integer position
  (tickvals) with the (escaped, possibly thinned) tokens as tick text;
* values travel as integer milli-units (see ``viz._common``): hover reads ``0.231`` for weights;
* masked cells (NaN / -inf input, or ``mask`` True) are left out or sent as NaN, so they show the
  grey plot background and do not hover.

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
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from ._common import (
    FONT,
    GREY,
    MILLI,
    MILLI_FORMAT,
    MILLI_SEPARATORS,
    encoded_milli,
    esc,
    nice_ticks,
    short_token,
    tick_label,
    tick_step,
    to_milli,
)
from .payload import FigureSpec
from .positional import message_figure

KINDS = ("weights", "scores")
ATTENTION_VIEWS = ("weights", "scores", "all layers")  # the view names a UI offers; see attention_view
OVERVIEW_MAX_T = 48
MASKED_HINT = "grey = masked (future position)"
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


def _tiles(q: np.ndarray, masked: np.ndarray, xref: str, yref: str, budget: int) -> list[dict]:
    """Heatmap trace dicts (one per rectangle) for one panel of milli-unit values.

    In the browser a trace costs far more than its bytes (plotly.js draws each one separately), so
    the panel uses the fewest rectangles whose data fits in `budget` bytes (a whole panel is one
    trace when it fits); when nothing fits, the cheapest by bytes plus a per-trace cost.
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
        trace: dict = {"type": "heatmap", "z": encoded_milli(q[r0:r1, c0:c1])}
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


# ----------------------------------------------------------------------------- figure builder


def _colour_axis(q: np.ndarray, masked: np.ndarray, kind: str, show_scale: bool) -> dict:
    if kind == "weights":
        lo, hi, scale, title = 0.0, 1.0, "Viridis", "weight"
    else:
        vals = q[~masked]
        bound = float(np.abs(vals).max()) / MILLI if vals.size else 1.0
        bound = bound or 1.0
        lo, hi, scale, title = -bound, bound, "RdBu", "score"
    ticks = nice_ticks(lo, hi)
    axis = {
        "cmin": lo * MILLI,
        "cmax": hi * MILLI,
        "colorscale": scale,
        "reversescale": kind == "scores",
        "showscale": show_scale,
        "colorbar": {
            "title": {"text": title, "side": "right"},
            "tickmode": "array",
            "tickvals": (ticks * MILLI).tolist(),
            "ticktext": [tick_label(v) for v in ticks],
            "thickness": 12,
            "len": 1.0,
            "outlinewidth": 0,
        },
    }
    return axis


def _attention_figure(
    values: np.ndarray,
    masked: np.ndarray,
    tokens: list[str],
    *,
    ncols: int,
    panel_titles: list[str],
    row_titles: list[str] | None,
    kind: str,
    title: str,
    width_px: int,
    show_scale: bool = True,
) -> FigureSpec:
    """Figure with one panel per values[k] (N, T, T) laid out in a grid of `ncols` columns."""
    n, t = values.shape[0], values.shape[-1]
    q = to_milli(np.where(masked, np.nan, values))
    if kind == "weights":
        _check_weight_range(q)
        q = np.clip(q, 0, MILLI)
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    margin = {"l": 80 if row_titles is None else 96, "r": 70 if show_scale else 20, "t": 58, "b": 78}
    gap = 0.035 if ncols > 1 else 0.0
    plot_w = width_px - margin["l"] - margin["r"]
    panel_frac = (1 - gap * (ncols - 1)) / ncols
    panel_px = plot_w * panel_frac
    vgap_px = 26
    height = int(margin["t"] + margin["b"] + nrows * panel_px + (nrows - 1) * vgap_px)
    plot_h = height - margin["t"] - margin["b"]
    row_frac, vgap = panel_px / plot_h, vgap_px / plot_h

    labels = [f'"{esc(tok)}" ({i})' for i, tok in enumerate(tokens)]
    step = tick_step(t, panel_px, 12.0 if t > 8 else 20.0)
    tickvals = list(range(0, t, step))
    ticktext = [short_token(tokens[i]) for i in tickvals]
    small = {"size": 10 if t <= 32 else 9}

    layout: dict = {
        "template": {
            "data": {
                "heatmap": [
                    {
                        "type": "heatmap",
                        "coloraxis": "coloraxis",
                        "hoverongaps": False,
                        "hovertemplate": f"query %{{y}} → key %{{x}}: {MILLI_FORMAT}<extra></extra>",
                    }
                ]
            }
        },
        "separators": MILLI_SEPARATORS,
        "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 14}},
        "font": FONT,
        "height": height,
        "margin": margin,
        "plot_bgcolor": GREY,
        "paper_bgcolor": "white",
        "coloraxis": _colour_axis(q, masked, kind, show_scale),
        "hoverlabel": {"font": {"family": FONT["family"], "size": 12}},
        "uirevision": "attention",
        "meta": {"viz": "attention", "kind": kind, "unit": 1 / MILLI, "T": t, "panels": n},
        "annotations": [],
    }
    data: list[dict] = []
    for k in range(n):
        row, col = divmod(k, ncols)
        suffix = "" if k == 0 else str(k + 1)
        xref, yref = f"x{suffix}", f"y{suffix}"
        x0 = col * (panel_frac + gap)
        y1 = 1 - row * (row_frac + vgap)
        bottom = row == nrows - 1 or k + ncols >= n
        xaxis: dict = {
            "type": "category",
            "domain": [x0, x0 + panel_frac],
            "anchor": yref,
            "tickmode": "array",
            "tickvals": tickvals,
            "ticktext": ticktext,
            "showticklabels": bottom,
            "tickfont": small,
            "showgrid": False,
            "zeroline": False,
            "ticks": "",
        }
        yaxis: dict = {
            "type": "category",
            "domain": [max(0.0, y1 - row_frac), y1],
            "anchor": xref,
            "tickmode": "array",
            "tickvals": tickvals,
            "ticktext": ticktext,
            "showticklabels": col == 0,
            "tickfont": small,
            "showgrid": False,
            "zeroline": False,
            "ticks": "",
            # square cells whatever width the page gives the figure
            "scaleanchor": xref,
            "constrain": "domain",
        }
        xaxis["constrain"] = "domain"
        if k == 0:
            xaxis.update(categoryorder="array", categoryarray=labels, range=[-0.5, t - 0.5])
            yaxis.update(categoryorder="array", categoryarray=labels, range=[t - 0.5, -0.5])
        else:
            xaxis["matches"], yaxis["matches"] = "x", "y"
        if bottom and k == (nrows - 1) * ncols:
            xaxis["title"] = {"text": "key position (attended to)", "standoff": 4, "font": {"size": 11}}
        if col == 0:
            ytitle = row_titles[row] if row_titles else "query position"
            yaxis["title"] = {"text": ytitle, "standoff": 4, "font": {"size": 11}}
        layout[f"xaxis{suffix}"] = xaxis
        layout[f"yaxis{suffix}"] = yaxis
        if panel_titles[k]:
            layout["annotations"].append(
                {
                    "text": panel_titles[k],
                    "x": x0 + panel_frac / 2,
                    "y": y1,
                    "xref": "paper",
                    "yref": "paper",
                    "xanchor": "center",
                    "yanchor": "bottom",
                    "showarrow": False,
                    "font": {"size": 11},
                }
            )
        data.extend(_tiles(q[k], masked[k], xref, yref, ATTENTION_BUDGET // n))
    if masked.any():
        layout["annotations"].append(
            {"text": MASKED_HINT, "x": 1, "y": 1, "xref": "paper", "yref": "paper", "xanchor": "right",
             "yanchor": "bottom", "yshift": 22, "showarrow": False, "font": {"size": 10, "color": "#666"}}
        )
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


def attention_grid(
    attn: np.ndarray,
    tokens: Sequence[str],
    layer: int,
    *,
    heads: Sequence[int] | None = None,
    kind: str = "weights",
    mask: np.ndarray | None = None,
    width_px: int = 1000,
) -> FigureSpec:
    """One layer's heads as a grid of heatmaps (up to 4 columns) with one shared colour scale.

    attn: (H, T, T) post-softmax weights (kind="weights", colour scale fixed 0–1) or pre-softmax
    scores (kind="scores", symmetric scale around 0). Masked cells: NaN/-inf, or `mask` True
    ((T, T) or (H, T, T)). heads: which heads to show (default all). width_px: the width the
    figure is laid out for (square panels, thinned tick labels).
    """
    attn, t, tokens = _checked(attn, tokens, kind, "(heads, T, T)")
    masked = np.broadcast_to(_masks(attn, mask), attn.shape)
    n_heads = attn.shape[0]
    heads = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad or not heads:
        raise ValueError(f"heads {bad or heads} out of range: this layer has {n_heads} heads")
    what = "attention " + _what(kind)
    return _attention_figure(attn[heads], masked[heads], tokens, ncols=4, panel_titles=[f"head {h}" for h in heads],
                             row_titles=None, kind=kind, title=f"Layer {layer} {what}", width_px=width_px)


def attention_head(
    attn2d: np.ndarray,
    tokens: Sequence[str],
    layer: int,
    head: int,
    kind: str = "weights",
    *,
    mask: np.ndarray | None = None,
    width_px: int = 720,
) -> FigureSpec:
    """A single head, large, with colour bar; same conventions as `attention_grid`."""
    attn2d, t, tokens = _checked(attn2d, tokens, kind, "(T, T)")
    masked = _masks(attn2d, mask)
    return _attention_figure(attn2d[None], masked[None], tokens, ncols=1, panel_titles=[""], row_titles=None,
                             kind=kind, title=f"Layer {layer}, head {head}: attention {_what(kind)}", width_px=width_px)


def attention_overview(
    attn: np.ndarray,
    tokens: Sequence[str],
    *,
    kind: str = "weights",
    mask: np.ndarray | None = None,
    width_px: int = 1000,
    max_tokens: int = OVERVIEW_MAX_T,
) -> FigureSpec:
    """Every layer × head as small multiples (rows = layers), for prompts of at most `max_tokens` tokens.

    attn: (L, H, T, T). The panels get small quickly, so longer prompts raise ValueError.
    """
    attn, t, tokens = _checked(attn, tokens, kind, "(layers, heads, T, T)")
    if t > max_tokens:
        raise ValueError(
            f"the all-layers overview needs T ≤ {max_tokens} tokens but T = {t}; "
            "pick one layer (attention_grid) instead"
        )
    n_layers, n_heads = attn.shape[:2]
    flat = attn.reshape(n_layers * n_heads, t, t)
    masked = np.broadcast_to(_masks(attn, mask), attn.shape).reshape(flat.shape)
    titles = [f"head {h}" if layer == 0 else "" for layer in range(n_layers) for h in range(n_heads)]
    rows = [f"layer {layer}<br>query" for layer in range(n_layers)]
    return _attention_figure(flat, masked, tokens, ncols=n_heads, panel_titles=titles, row_titles=rows, kind=kind,
                             title=f"Attention {_what(kind)}: every layer (rows) × head (columns)", width_px=width_px)


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
    width_px: int = 1200,
) -> FigureSpec | go.Figure:
    """The attention figure for one of the `ATTENTION_VIEWS`, chosen the way the app's Explore tab does.

    weights, scores: (L, H, T, T) post-softmax weights and pre-softmax scores of every layer (one
    array, or a sequence of L arrays of shape (H, T, T));
    scores may be None unless view == "scores". tokens: the T display strings. head None means
    all heads of `layer`. causal: mask the future positions (`causal_mask`).

    * "all layers": `attention_overview` of every layer's weights, or, when T exceeds
      `overview_max_tokens`, a `message_figure` (a `go.Figure`) asking for a single layer;
    * "weights" / "scores": `attention_grid` of the layer (head None, laid out for `width_px`)
      or `attention_head` of one head, for that kind.

    Raises ValueError for an unknown view, a layer or head out of range, or inconsistent shapes.
    """
    if view not in ATTENTION_VIEWS:
        raise ValueError(f"view must be one of {', '.join(map(repr, ATTENTION_VIEWS))}, got {view!r}")
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

    if view == "all layers":
        if t > overview_max_tokens:
            return message_figure(
                f"The overview draws {n_layers}×{n_heads} panels; it needs ≤ {overview_max_tokens} tokens "
                f"(there are {t}). Pick a layer instead."
            )
        return attention_overview(np.stack(weights), tokens, mask=mask, width_px=width_px, max_tokens=int(overview_max_tokens))
    kind = "scores" if view == "scores" else "weights"
    mats = scores if kind == "scores" else weights
    if head is None:
        return attention_grid(mats[layer], tokens, layer, kind=kind, mask=mask, width_px=width_px)
    return attention_head(mats[layer][head], tokens, layer, head, kind=kind, mask=mask)
