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

The figures are drawn by viz.panels (`panels_figure`), laid out by viz.attention_layout, coloured
by viz.attention_colour and sent as tiles that leave the masked triangle out (viz.attention_tiles).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ._common import check_figure_size, esc, message_figure
from .attention_colour import check_colour
from .layer_heads import LINES_VIEW, layer_heads
from .overview import THUMBNAILS_VIEW, head_thumbnails
from .panels import check_kind, check_square, check_tokens, masked_cells, panels_figure
from .payload import FigureSpec

# the view names a UI offers; see attention_view
ATTENTION_VIEWS = ("weights", "scores", "all layers", LINES_VIEW, THUMBNAILS_VIEW)
OVERVIEW_MAX_T = 48
OVERVIEW_MAX_PANELS = 16  # the all-layers view draws at most this many panels (4 × 4); past it, the head-roles map
HEAD_LABEL_LIMIT = 64  # one head: every token labelled up to this length; past it, open on the last ones
GRID_LABEL_LIMIT = 32  # a grid of panels: the same, for each panel


def future_mask(t: int) -> np.ndarray:
    """(t, t) bool mask, True above the diagonal (key after query = future position)."""
    return np.triu(np.ones((t, t), dtype=bool), 1)


# ----------------------------------------------------------------------------- public API


def _checked(attn, tokens: Sequence[str], kind: str, dims: str) -> tuple[np.ndarray, int, list[str]]:
    """Validate a public call: the kind, an array of shape `dims` (e.g. "(heads, T, T)") with square
    last two axes, and one token label per position. Returns (array as float64, T, labels)."""
    check_kind(kind)
    arr = np.asarray(attn, dtype=np.float64)
    ndim = dims.count(",") + 1
    if arr.ndim != ndim:
        raise ValueError(f"attention must be {ndim}-D {dims}, got shape {arr.shape}")
    t = check_square(arr.shape)
    return arr, t, check_tokens(tokens, t)


def _what(kind: str, colour: str = "linear") -> str:
    if kind == "weights" and colour == "value":
        return "value-weighted ‖a_ij · v_j W_O‖"
    return "weights" if kind == "weights" else "scores (before softmax)"


def _check_common(colour: str, query: int | None, t: int, width_px: int, max_height_px: int | None) -> None:
    check_colour(colour)
    if query is not None:
        _index("query", query, t, "the text has")
    check_figure_size("width_px", width_px, 120)
    check_figure_size("max_height_px", max_height_px, 120)


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
    (about T ≤ 12 at 1000 px), else fewer (see `pick_columns`). Every position is labelled up to
    `GRID_LABEL_LIMIT`; past it the figure opens on the last GRID_LABEL_LIMIT positions.
    colour ("linear" | "row" | "log", weights only), presentation (large fonts) and query (outline
    that query row in every panel) as in `attention_view`. badges: head → plain text (escaped)
    added to that head's panel title, "head 2 · previous-token". title_prefix: plain text (escaped)
    before the title, as in `attention_view` (the same in `attention_head` and `attention_overview`).
    """
    attn, t, tokens = _checked(attn, tokens, kind, "(heads, T, T)")
    _check_common(colour, query, t, width_px, max_height_px)
    masked = np.broadcast_to(masked_cells(attn, mask), attn.shape)
    n_heads = attn.shape[0]
    heads = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad or not heads:
        raise ValueError(f"heads {bad or heads} out of range: this layer has {n_heads} heads")
    what = "attention " + _what(kind, colour)
    if len(heads) < n_heads:  # a page of the layer's heads: the title says which
        what += f": {_runs(heads)} of {n_heads}"
    badges = _check_badges(badges)
    return panels_figure(
        attn[heads], masked[heads], tokens, ncols=ncols, panels=[(int(layer), h) for h in heads],
        panel_titles=[f"head {h}" + _badge_text(badges.get(h)) for h in heads], row_titles=None, kind=kind,
        title=f"Layer {layer} {what}", width_px=width_px, max_height_px=max_height_px, focus=GRID_LABEL_LIMIT,
        colour=colour, presentation=presentation, query=query, title_prefix=_prefix_text(title_prefix),
    )


def _runs(heads: Sequence[int]) -> str:
    """Head numbers as the title names them: "heads 6–11", "heads 0, 2, 5", "head 3"."""
    if len(heads) == 1:
        return f"head {heads[0]}"
    if list(heads) == list(range(heads[0], heads[0] + len(heads))):
        return f"heads {heads[0]}–{heads[-1]}"
    return "heads " + ", ".join(str(h) for h in heads)


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
    masked = masked_cells(attn2d, mask)
    return panels_figure(
        attn2d[None], masked[None], tokens, ncols=1, panels=[(int(layer), int(head))], panel_titles=[""],
        row_titles=None, kind=kind,
        title=f"Layer {layer}, head {head}: attention {_what(kind, colour)}" + _badge_text(badge), width_px=width_px,
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
    masked = np.broadcast_to(masked_cells(attn, mask), attn.shape).reshape(flat.shape)
    titles = [f"head {h}" if layer == 0 else "" for layer in range(n_layers) for h in range(n_heads)]
    rows = [f"layer {layer}<br>query" for layer in range(n_layers)]
    panels = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    return panels_figure(
        flat, masked, tokens, ncols=n_heads, panels=panels, panel_titles=titles, row_titles=rows, kind=kind,
        title=f"Attention {_what(kind, colour)}: every layer (rows) × head (columns)", width_px=width_px,
        max_height_px=max_height_px, focus=None, colour=colour, presentation=presentation, query=query,
        title_prefix=_prefix_text(title_prefix),
    )


def overview_refusal(n_layers: int, n_heads: int, t: int, max_tokens: int = OVERVIEW_MAX_T) -> str | None:
    """Why the all-layers view draws no panels for this model and text (the sentence its figure shows), or
    None when it draws them: more than `OVERVIEW_MAX_PANELS` heads in all, or more than `max_tokens` tokens."""
    if n_layers * n_heads > OVERVIEW_MAX_PANELS:
        return (f"{n_layers} layers × {n_heads} heads are too many panels to read at once. The Head roles map "
                "below the text shows every head: click a cell to see that head here.")
    if t > max_tokens:
        return (f"The overview draws {n_layers}×{n_heads} panels; it needs ≤ {max_tokens} tokens "
                f"(there are {t}). Pick a layer instead.")
    return None


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
    heads: Sequence[int] | None = None,
    value_weighted: Sequence[np.ndarray | None] | None = None,
) -> FigureSpec:
    """The attention figure for one of the `ATTENTION_VIEWS`, chosen the way the app's Explore tab does.

    weights, scores: (L, H, T, T) post-softmax weights and pre-softmax scores of every layer (one
    array, or a sequence of L arrays of shape (H, T, T));
    scores may be None unless view == "scores". tokens: the T display strings. head None means
    all heads of `layer`. causal: mask the future positions (`future_mask`); masked cells are hatched.

    * "all layers": `attention_overview` of every layer's weights, or, when T exceeds
      `overview_max_tokens` or the model has more than `OVERVIEW_MAX_PANELS` heads in all, a
      `message_figure` asking for a single layer (or pointing to the head-roles map);
    * "weights" / "scores": `attention_grid` of the layer (head None; `heads`: only these of its
      heads, a page of a layer with many, titled "heads 6–11 of 12") or `attention_head` of one
      head, for that kind.
    * "heads as lines" (`LINES_VIEW`): `layer_heads`, every head of the layer as coloured lines from
      the token `query` (None: the last) to the keys it attends to; `head` is drawn thicker;
    * "head thumbnails" (`THUMBNAILS_VIEW`): `head_thumbnails`, every layer × head as a small pattern,
      (layer, head) outlined (the whole layer for head None), whatever the text's length.
    These two draw the weights whatever `colour` says, and ignore badges and `heads`.

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
    value_weighted: with colour "value", one (H, T, T) array per layer (None for a layer not drawn) of
    ‖a_ij · v_j W_O‖, drawn instead of the weights (the weights views; "scores" ignores it).

    Raises ValueError for an unknown view, colour, a layer, head or query out of range, or
    inconsistent shapes.
    """
    if view not in ATTENTION_VIEWS:
        raise ValueError(f"view must be one of {', '.join(map(repr, ATTENTION_VIEWS))}, got {view!r}")
    check_colour(colour)
    # Per-layer (H, T, T) arrays are used as they are: stacking them would copy every layer for
    # a picture of one (only the all-layers overview needs the stack).
    weights = _layers(weights, "weights")
    t = check_square((len(weights), *weights[0].shape), "weights")  # T, the tokens; each layer is (H, T, T)
    n_layers, n_heads = len(weights), weights[0].shape[0]
    if scores is not None:  # only the "scores" view draws them, but given ones must match the weights
        scores = _layers(scores, "scores")
        if len(scores) != n_layers or any(s.shape != w.shape for s, w in zip(scores, weights)):
            raise ValueError(f"scores have shape {_shape(np.asarray(scores))} but weights have shape "
                             f"{_shape(np.asarray(weights))}")
    elif view == "scores":  # the one view that cannot fall back on the weights
        raise ValueError("view 'scores' needs the attention scores, but scores is None")
    tokens = check_tokens(tokens, t)
    layer = _index("layer", layer, n_layers, "the model has")
    if head is not None:  # None is a choice (every head of the layer), not an index to check
        head = _index("head", head, n_heads, "each layer has")
    # bool is refused apart: True is an int to Python and would pass as a limit of 1 token
    if isinstance(overview_max_tokens, bool) or not isinstance(overview_max_tokens, (int, np.integer)) \
            or overview_max_tokens < 1:
        raise ValueError(f"overview_max_tokens must be a positive whole number, got {overview_max_tokens!r}")
    mask = future_mask(t) if causal else None  # (T, T) True = a future key; None: nothing hatched
    # what every matrix view below takes alike, passed on unchanged
    style = {"max_height_px": max_height_px, "presentation": presentation, "query": query,
             "title_prefix": title_prefix}
    badges = _check_badges(badges)

    # the two views below draw weights only: colour, badges and `heads` do not apply to them
    if view == LINES_VIEW:
        return layer_heads(weights[layer], tokens, layer, query=query, head=head, causal=causal,
                           width_px=width_px or 720, max_height_px=max_height_px, presentation=presentation,
                           title_prefix=title_prefix)
    if view == THUMBNAILS_VIEW:
        return head_thumbnails(weights, tokens, causal=causal, selected=(layer, head), width_px=width_px or 1200,
                               max_height_px=max_height_px, presentation=presentation, title_prefix=title_prefix)
    if view == "all layers":
        refused = overview_refusal(n_layers, n_heads, t, int(overview_max_tokens))
        if refused is not None:  # too many panels to read: a sentence that says what to open instead
            message = message_figure(refused, presentation=presentation, width_px=width_px)
            # a film frame's "Step n of m · " still leads, so the reader knows which frame refused
            return message if title_prefix is None else _prefixed(message, str(title_prefix))
        if colour == "value":  # every layer's ‖a·v W_O‖ drawn in place of its weights
            weights = _value_weighted(value_weighted, weights, range(n_layers))
        return attention_overview(np.stack(weights), tokens, mask=mask, width_px=width_px or 1200,
                                  max_tokens=int(overview_max_tokens), colour=colour, **style)
    # one layer from here on: a grid of its heads, or one head
    kind = "scores" if view == "scores" else "weights"
    mats = scores if kind == "scores" else weights  # L arrays of (H, T, T)
    if colour == "value" and kind == "weights":  # only the layer drawn needs (and is checked for) its norms
        mats = _value_weighted(value_weighted, weights, [layer])
    if kind == "scores":  # signed, unbounded: the row / log / value colourings are defined for weights only
        colour = "linear"
    if head is None:  # the layer's (H, T, T), one panel per head (or per head of `heads`)
        return attention_grid(mats[layer], tokens, layer, kind=kind, mask=mask, width_px=width_px or 1200,
                              colour=colour, badges=badges, heads=heads, **style)
    # one head's (T, T), drawn narrower by default: a single square needs less width than a grid
    return attention_head(mats[layer][head], tokens, layer, head, kind=kind, mask=mask, width_px=width_px or 720,
                          colour=colour, badge=badges.get(head), **style)


def _value_weighted(value_weighted, weights: list[np.ndarray], layers) -> list[np.ndarray | None]:
    """The value-weighted norms of the layers drawn, checked against the weights' shapes."""
    if value_weighted is None or len(value_weighted) != len(weights):
        raise ValueError("colour 'value' needs value_weighted: one (heads, T, T) array per layer")
    out = list(value_weighted)
    # only the layers drawn are checked and converted: the others may be None (never computed)
    for layer in layers:
        if out[layer] is None or np.shape(out[layer]) != weights[layer].shape:
            raise ValueError(f"value_weighted of layer {layer} must have the weights' shape {_shape(weights[layer])}")
        out[layer] = np.asarray(out[layer], dtype=np.float64)
    return out


def _prefixed(fig: FigureSpec, prefix: str) -> FigureSpec:
    """A message figure with `prefix` (plain text, escaped) put before its text."""
    note = fig.layout["annotations"][0]
    note["text"] = esc(prefix) + note["text"]
    return fig
