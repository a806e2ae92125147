"""Readable at every length, one colour language, dark mode, presentation, hover and the query outline.

What a learner sees is checked from the JSON the browser receives: tick labels, the ranges a figure
opens on, the colours a value maps to, the hatch behind masked cells, the outline of a query row,
font sizes and the laid-out panel sizes (the figures set their height; the width they are laid out
for is the `width_px` passed in).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import viz
from tests.support.figures import axis, softmax_attention
from viz import (
    COLOUR_KEY,
    COLOUR_MODES,
    DIVERGING,
    SEQUENTIAL,
    attention_grid,
    attention_head,
    attention_overview,
    attention_panels,
    attention_view,
    future_mask,
    message_figure,
    no_positional_encoding,
    payload_bytes,
    plot_json,
    positional_similarity,
    positional_table,
    probabilities,
)

STEP = 0.0005 + 1e-9
WORDS = "the cat sat on the mat and the dog ran to tom he said that".split()


def tokens(t: int) -> list[str]:
    return [WORDS[i % len(WORDS)] for i in range(t)]


def layout_of(fig) -> dict:
    return json.loads(plot_json(fig))["layout"]


def panel_axes(layout: dict) -> list[tuple[str, str]]:
    return [(p["xaxis"], p["yaxis"]) for p in layout["meta"]["panels"]]


def axis_key(ref: str) -> str:
    """"x2" -> "xaxis2", "y" -> "yaxis"."""
    return f"{ref[0]}axis{ref[1:]}"


def panel_px(layout: dict, width_px: int, k: int = 0) -> tuple[float, float]:
    """(width, height) in px of panel k as laid out for `width_px`."""
    m = layout["margin"]
    xref, yref = panel_axes(layout)[k]
    xd, yd = layout[axis_key(xref)]["domain"], layout[axis_key(yref)]["domain"]
    return (xd[1] - xd[0]) * (width_px - m["l"] - m["r"]), (yd[1] - yd[0]) * (layout["height"] - m["t"] - m["b"])


def hex_rgb(colour: str) -> np.ndarray:
    colour = colour.lstrip("#")
    return np.array([int(colour[i : i + 2], 16) for i in (0, 2, 4)], dtype=float)


def colour_of(value: float, cmin: float, cmax: float, scale) -> np.ndarray:
    """The RGB plotly.js paints `value` with on a [[stop, "#rrggbb"], ...] colour scale (linear between stops)."""
    frac = min(1.0, max(0.0, (value - cmin) / (cmax - cmin)))
    stops = [(float(s), hex_rgb(c)) for s, c in scale]
    for (s0, c0), (s1, c1) in zip(stops, stops[1:], strict=False):
        if s0 <= frac <= s1:
            return c0 + (c1 - c0) * (frac - s0) / (s1 - s0)
    raise AssertionError(frac)


def assert_readable_labels(layout: dict, toks: list[str], least: float = viz.READABLE_TICK_PX) -> int:
    """Every labelled axis shows a subset of the tokens at a readable size: every k-th position, always the
    newest, each label the token at its position (the others are named on hover). Returns k."""
    t, strides = len(toks), set()
    for key, ax in layout.items():
        if not (key.startswith(("xaxis", "yaxis")) and isinstance(ax, dict)) or key == "xaxis" and "tickvals" not in ax:
            continue
        ax = axis(layout, key)
        vals = list(ax["tickvals"])
        assert ax["tickfont"]["size"] >= least, (key, ax["tickfont"]["size"])
        step = vals[1] - vals[0] if len(vals) > 1 else 1
        assert vals == list(range((t - 1) % step, t, step)) and vals[-1] == t - 1, (key, vals)
        assert ax["ticktext"] == [toks[i] for i in vals], key
        strides.add(step)
    assert len(strides) == 1, strides  # the panels share one labelling
    return strides.pop()


def assert_labels_fit(layout: dict, width_px: int, t: int, shown: int | None = None) -> None:
    """Tick labels do not overlap: one label pitch (cell size × stride) holds font × 1.25 px."""
    shown = t if shown is None else shown
    cell = panel_px(layout, width_px)[0] / shown
    ax = axis(layout, "yaxis")
    stride = ax["tickvals"][1] - ax["tickvals"][0] if len(ax["tickvals"]) > 1 else 1
    assert ax["tickfont"]["size"] * 1.25 <= cell * stride + 1e-6, (ax["tickfont"]["size"], cell, stride)


# ----------------------------------------------------------------------------- one colour language


def test_diverging_scale_is_blue_negative_white_zero_red_positive():
    blue, mid, red = hex_rgb(DIVERGING[0][1]), hex_rgb(DIVERGING[5][1]), hex_rgb(DIVERGING[-1][1])
    assert DIVERGING[0][0] == 0.0 and DIVERGING[5][0] == 0.5 and DIVERGING[-1][0] == 1.0
    assert blue[2] > blue[0] + 50 and red[0] > red[2] + 50
    assert mid.min() >= 240  # near-white, not plotly RdBu's grey
    assert SEQUENTIAL == "Viridis"
    assert "red = positive" in COLOUR_KEY and "blue = negative" in COLOUR_KEY and "hatched" in COLOUR_KEY


def test_scores_positive_paint_red_negative_blue_zero_white():
    t = 6
    scores = np.zeros((1, t, t))
    scores[0, 3, 1], scores[0, 4, 2] = 2.0, -2.0
    lay = layout_of(attention_grid(scores, tokens(t), 0, kind="scores", mask=future_mask(t)))
    ca = lay["coloraxis"]
    assert "reversescale" not in ca or ca["reversescale"] is False
    assert ca["colorscale"] == [list(p) for p in DIVERGING]
    pos, neg, zero = (colour_of(v * 1000, ca["cmin"], ca["cmax"], ca["colorscale"]) for v in (2.0, -2.0, 0.0))
    assert pos[0] > pos[2] + 50 and neg[2] > neg[0] + 50 and zero.min() >= 240
    assert ca["colorbar"]["title"]["text"] == "score"


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_positional_figures_use_the_same_diverging_scale(kind):
    table = np.linspace(-1, 1, 24).reshape(6, 4)
    for fig in (positional_table(table, kind), positional_similarity(table, kind)):
        lay = json.loads(fig.to_json())["layout"]
        ca = lay["coloraxis"]
        assert ca["colorscale"] == [list(p) for p in DIVERGING] and not ca.get("reversescale")
        red = colour_of(ca["cmax"], ca["cmin"], ca["cmax"], ca["colorscale"])
        assert red[0] > red[2] + 50  # the largest positive value is red


def test_weights_keep_the_sequential_scale():
    t = 5
    lay = layout_of(attention_grid(softmax_attention(2, t)[0], tokens(t), 0, mask=future_mask(t)))
    assert lay["coloraxis"]["colorscale"] == "Viridis"
    assert (lay["coloraxis"]["cmin"], lay["coloraxis"]["cmax"]) == (0, 1000)


@pytest.mark.parametrize("build", ["grid", "head", "overview", "scores"])
def test_masked_cells_show_a_hatch_behind_every_panel(build):
    t = 7
    w, s = softmax_attention(3, t)
    mask = future_mask(t)
    fig = {
        "grid": lambda: attention_grid(w, tokens(t), 0, mask=mask),
        "head": lambda: attention_head(w[1], tokens(t), 0, 1, mask=mask),
        "overview": lambda: attention_overview(np.stack([w, w]), tokens(t), mask=mask),
        "scores": lambda: attention_grid(s, tokens(t), 0, kind="scores"),
    }[build]()
    lay = layout_of(fig)
    refs = panel_axes(lay)
    images = lay["images"]
    assert [(im["xref"], im["yref"]) for im in images] == [(f"{x} domain", f"{y} domain") for x, y in refs]
    hatch = lay["template"]["layout"]["imagedefaults"]
    assert hatch["source"].startswith("data:image/svg+xml,") and "pattern" in hatch["source"]
    assert "href" not in hatch["source"]  # inline: nothing fetched
    assert (hatch["layer"], hatch["sizing"], hatch["sizex"], hatch["sizey"]) == ("below", "stretch", 1, 1)
    # masked cells are gaps (NaN) that do not hover, on a transparent plot: the hatch shows through
    assert np.isnan(attention_panels(fig)[:, mask]).all()
    assert lay["template"]["data"]["heatmap"][0]["hoverongaps"] is False
    assert lay["plot_bgcolor"] == lay["paper_bgcolor"] == "rgba(0,0,0,0)"
    assert "hatched = masked (future position)" in lay["title"]["subtitle"]["text"]


def test_nothing_masked_no_hatch_no_hint():
    t = 5
    lay = layout_of(attention_grid(np.full((2, t, t), 1 / t), tokens(t), 0))
    assert "images" not in lay and "subtitle" not in lay["title"]


# ----------------------------------------------------------------------------- dark mode


def test_every_figure_has_a_transparent_background_and_grey_text():
    t = 6
    w, s = softmax_attention(2, t)
    table = np.linspace(-1, 1, 24).reshape(6, 4)
    figures = [
        attention_view(w[None], s[None], tokens(t), layer=0, head=None, view="weights", causal=True,
                       overview_max_tokens=48),
        attention_view(w[None], s[None], tokens(t), layer=0, head=1, view="scores", causal=True,
                       overview_max_tokens=48),
        attention_view(w[None], s[None], tokens(t), layer=0, head=None, view="all layers", causal=True,
                       overview_max_tokens=2),  # the message figure
        positional_table(table, "learned"), positional_similarity(table), positional_table(table, "rope"),
        no_positional_encoding(), message_figure("hello"),
        probabilities(["a", "b"], np.array([0.4, 0.6]), chosen=1),
    ]
    for fig in figures:
        lay = layout_of(fig)
        assert lay["paper_bgcolor"] == "rgba(0,0,0,0)", lay.get("title")
        assert lay["plot_bgcolor"] == "rgba(0,0,0,0)"
        assert lay["font"]["color"] == viz._common.TEXT_GREY


# ----------------------------------------------------------------------------- labels at every length


@pytest.mark.parametrize(("width_px", "every"), [(720, 2), (1000, 1), (1200, 1)])
def test_single_head_labels_every_token_up_to_64(width_px, every):
    """Every token while its cell holds a readable label; on a narrower figure every other one, still readable."""
    t = 64
    toks = [f"w{i}" for i in range(t)]
    fig = attention_head(softmax_attention(1, t)[0][0], toks, 0, 0, mask=future_mask(t), width_px=width_px)
    lay = layout_of(fig)
    assert assert_readable_labels(lay, toks) == every
    assert lay["xaxis"]["range"] == [-0.5, t - 0.5] and lay["yaxis"]["range"] == [t - 0.5, -0.5]
    assert_labels_fit(lay, width_px, t)
    w, h = panel_px(lay, width_px)
    assert w == pytest.approx(h, abs=1.5)  # square cells


def test_single_head_at_64_through_attention_view_default_width():
    t = 64
    w, s = softmax_attention(2, t)
    lay = layout_of(attention_view(w[None], s[None], tokens(t), layer=0, head=1, view="weights", causal=True,
                                   overview_max_tokens=48))
    assert assert_readable_labels(lay, tokens(t)) == 2  # 720 px: 8.9 px cells, a readable label every other one
    assert_labels_fit(lay, 720, t)


@pytest.mark.parametrize(("t", "width_px"), [(32, 1000), (32, 1200), (20, 1000), (12, 1000)])
def test_grid_labels_every_token_up_to_32(t, width_px):
    toks = tokens(t)
    lay = layout_of(attention_grid(softmax_attention(4, t)[0], toks, 0, mask=future_mask(t), width_px=width_px))
    for name in ("xaxis", "yaxis"):
        assert axis(lay, name)["tickvals"] == list(range(t)) and axis(lay, name)["ticktext"] == toks
    assert_labels_fit(lay, width_px, t)
    # 4 columns while short texts fit at full size, 2 above
    ncols = len({tuple(lay[axis_key(x)]["domain"]) for x, _ in panel_axes(lay)})
    assert ncols == (4 if t <= 12 else 2), ncols


def test_grid_at_32_through_attention_view():
    t = 32
    w, s = softmax_attention(4, t)
    lay = layout_of(attention_view(w[None], s[None], tokens(t), layer=0, head=None, view="scores", causal=True,
                                   overview_max_tokens=48))
    assert axis(lay, "xaxis")["tickvals"] == list(range(t))
    assert_labels_fit(lay, 1200, t)


@pytest.mark.parametrize(("head", "shown"), [(0, 64), (None, 32)])
def test_long_text_opens_on_the_last_positions_with_everything_sent(head, shown):
    t = 120
    w, s = softmax_attention(2, t)
    toks = [f"w{i}" for i in range(t)]
    fig = attention_view(w[None], s[None], toks, layer=0, head=head, view="weights", causal=True,
                         overview_max_tokens=48)
    lay = layout_of(fig)
    first = t - shown
    assert lay["xaxis"]["range"] == [first - 0.5, t - 0.5]
    assert lay["yaxis"]["range"] == [t - 0.5, first - 0.5]  # position 0 would be on top, as ever
    assert lay["meta"]["offset"] == first and lay["meta"]["T"] == t
    # labels for the whole text and every value are sent: panning and double-click (autorange) show the rest
    assert assert_readable_labels(lay, toks) == (2 if head is not None else 1)
    assert len(lay["xaxis"]["categoryarray"]) == t
    seen = attention_panels(fig)
    expect = w if head is None else w[[head]]
    assert seen.shape == expect.shape and np.abs(np.nan_to_num(seen) - expect).max() <= STEP
    assert f"showing the last {shown} of {t} positions; drag to pan, double-click for all" in lay["title"]["subtitle"]["text"]
    assert_labels_fit(lay, 720 if head is not None else 1200, t, shown)


@pytest.mark.parametrize("presentation", [False, True])
@pytest.mark.parametrize(("view", "layers", "t", "head", "width", "max_h"), [
    ("all layers", 3, 13, None, 716, 355),  # the Explore page at 1280×720: every layer × head
    ("all layers", 4, 48, None, 1200, 860),  # the longest text the overview draws, on a large screen
    ("weights", 4, 58, 3, 716, 355),  # one head at 58 tokens on a projector
    ("weights", 2, 40, None, 716, 420),  # a frame of the training film: one layer's heads
])
def test_small_cells_label_fewer_tokens_at_a_readable_size(view, layers, t, head, width, max_h, presentation):
    """Where cells are too small for every label, the figure labels every k-th token (always the newest) at a
    readable size (9 px, 16 px with large fonts) rather than shrinking the labels; the labels never overlap."""
    w, s = softmax_attention(4, t)
    toks = [f"t{i}" for i in range(t)]
    lay = layout_of(attention_view(np.stack([w] * layers), np.stack([s] * layers), toks, layer=layers - 1, head=head,
                                   view=view, causal=True, overview_max_tokens=48, width_px=width, max_height_px=max_h,
                                   presentation=presentation, title_prefix="Step 3 of 9 · " if max_h == 420 else None))
    every = assert_readable_labels(lay, toks, 16 if presentation else viz.READABLE_TICK_PX)
    assert every > 1  # these cells are small: a readable label for each token would not fit
    assert lay["meta"]["label_px"] == axis(lay, "yaxis")["tickfont"]["size"] and lay["meta"]["label_step"] == every
    shown = t if view == "all layers" else min(t, viz.HEAD_LABEL_LIMIT if head is not None else viz.GRID_LABEL_LIMIT)
    assert_labels_fit(lay, width, t, shown)
    # within its height, unless large fonts kept the panels at their readable size (tests/viz/test_viz_gpt2_sizes.py)
    assert lay["height"] <= max_h or (presentation and lay["meta"]["raised"])


@pytest.mark.parametrize("prefix", [None, "L1H0 ablated (mean) · "])
def test_a_title_wider_than_a_phone_breaks_into_lines_and_keeps_every_word(prefix):
    """The title is the only place that says which head and score are shown: on a phone it wraps, whole."""
    t = 13
    w, s = softmax_attention(4, t)
    kw = dict(layer=0, head=0, view="weights", causal=True, overview_max_tokens=48, badges={0: "pronoun → name 0.76"},
              title_prefix=prefix)
    wide = layout_of(attention_view(w[None], s[None], tokens(t), width_px=720, **kw))
    phone = layout_of(attention_view(w[None], s[None], tokens(t), width_px=326, max_height_px=386, **kw))
    whole = (prefix or "") + "Layer 0, head 0: attention weights · pronoun → name 0.76"
    assert wide["title"]["text"] == whole
    lines = phone["title"]["text"].split("<br>")
    assert len(lines) >= 2 and " ".join(lines) == whole
    assert phone["title"]["y"] < wide["title"]["y"]  # plotly.js centres the lines on the first: it sits lower
    extra = phone["title"]["font"]["size"] * 1.25 * (len(lines) - 1)
    assert phone["margin"]["t"] >= wide["margin"]["t"] + extra - 1  # room above the panels for every line
    assert phone["height"] <= 386


def test_short_text_shows_everything_without_a_focus_note():
    t = 64
    w, _ = softmax_attention(1, t)
    lay = layout_of(attention_head(w[0], tokens(t), 0, 0, mask=future_mask(t)))
    assert lay["meta"]["offset"] == 0 and "showing the last" not in lay["title"]["subtitle"]["text"]


# ----------------------------------------------------------------------------- colour modes


def slow_colour(w: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    out = np.full(w.shape, np.nan)
    for h in range(w.shape[0]):
        for i in range(w.shape[1]):
            row = [w[h, i, j] for j in range(w.shape[2]) if not mask[i, j]]
            peak = max(row) if row else 0.0
            for j in range(w.shape[2]):
                if mask[i, j]:
                    continue
                if mode == "row":
                    out[h, i, j] = w[h, i, j] / peak if peak > 0 else 0.0
                else:
                    out[h, i, j] = max(-3.0, math.log10(w[h, i, j])) if w[h, i, j] > 0 else -3.0
    return out


@pytest.mark.parametrize("mode", ["row", "log"])
def test_row_and_log_colours_match_a_slow_loop(mode):
    t = 40
    w, _ = softmax_attention(3, t, seed=3, scale=4.0)
    w[1, 10, :5] = 0.0  # exact zeros: log floor
    mask = future_mask(t)
    fig = attention_grid(w, tokens(t), 0, mask=mask, colour=mode)
    seen = attention_panels(fig)
    expect = slow_colour(w, mask, mode)
    assert np.array_equal(np.isnan(seen), np.isnan(expect))
    assert np.nanmax(np.abs(seen - expect)) <= STEP
    lay = layout_of(fig)
    ca = lay["coloraxis"]
    if mode == "row":
        assert (ca["cmin"], ca["cmax"]) == (0, 1000) and ca["colorbar"]["title"]["text"] == "weight ÷ row max"
        assert np.allclose(np.nanmax(seen, axis=-1), 1.0)  # every row's strongest key is full colour
    else:
        assert (ca["cmin"], ca["cmax"]) == (-3000, 0) and ca["colorbar"]["title"]["text"] == "log₁₀ weight"
        assert ca["colorbar"]["ticktext"] == ["-3", "-2", "-1", "0"]
    assert lay["meta"]["colour"] == mode
    assert lay["template"]["data"]["heatmap"][0]["hovertemplate"].count(ca["colorbar"]["title"]["text"]) == 1


def test_colour_modes_exported_scores_ignore_them_bad_mode_refused():
    assert COLOUR_MODES == ("linear", "row", "log", "value")
    t = 6
    w, s = softmax_attention(2, t)
    common = dict(layer=0, head=None, causal=True, overview_max_tokens=48)
    plain = attention_view(w[None], s[None], tokens(t), view="scores", **common)
    logged = attention_view(w[None], s[None], tokens(t), view="scores", colour="log", **common)
    assert plot_json(plain) == plot_json(logged)
    with pytest.raises(ValueError, match="colour must be one of 'linear', 'row', 'log', 'value', got 'rainbow'"):
        attention_view(w[None], s[None], tokens(t), view="weights", colour="rainbow", **common)


# ----------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(("t", "heads", "head", "max_h", "width"),
                         [(64, 4, None, 600, 1200), (32, 4, None, 500, 900), (120, 4, 2, 400, 720),
                          (8, 6, None, 300, 1200), (64, 1, 0, 360, 390), (20, 4, None, 900, 390)])
def test_never_taller_than_max_height_and_panels_stay_square(t, heads, head, max_h, width):
    w, s = softmax_attention(heads, t)
    lay = layout_of(attention_view(w[None], s[None], tokens(t), layer=0, head=head, view="weights", causal=True,
                                   overview_max_tokens=48, max_height_px=max_h, width_px=width))
    assert lay["height"] <= max_h
    for k in range(len(lay["meta"]["panels"])):
        pw, ph = panel_px(lay, width, k)
        assert pw == pytest.approx(ph, abs=1.5) and pw >= 24
    assert_labels_fit(lay, width, t, min(t, 64 if head is not None else 32))
    assert "width" not in lay  # the page stretches the figure to its container


def test_overview_follows_max_height_and_names_every_panel():
    t = 10
    w, _ = softmax_attention(4, t)
    stack = np.stack([w, w[::-1], w])
    lay = layout_of(attention_view(stack, None, tokens(t), layer=0, head=None, view="all layers", causal=True,
                                   overview_max_tokens=48, max_height_px=700, query=4))
    assert lay["height"] <= 700
    assert [(p["layer"], p["head"]) for p in lay["meta"]["panels"]] == [(l, h) for l in range(3) for h in range(4)]


# ----------------------------------------------------------------------------- presentation


def test_presentation_fonts_are_large_everywhere():
    t = 24
    w, s = softmax_attention(4, t)
    table = np.linspace(-1, 1, 48).reshape(12, 4)
    attn = [attention_view(w[None], s[None], tokens(t), layer=0, head=h, view=v, causal=True, overview_max_tokens=48,
                           presentation=True, max_height_px=700)
            for v in ("weights", "scores", "all layers") for h in (None, 1)]
    normal = layout_of(attention_view(w[None], s[None], tokens(t), layer=0, head=None, view="weights", causal=True,
                                      overview_max_tokens=48))
    for fig in attn:
        lay = layout_of(fig)
        for name in ("xaxis", "yaxis"):
            assert axis(lay, name)["tickfont"]["size"] >= 16
        assert lay["title"]["font"]["size"] > normal["title"]["font"]["size"]
        assert lay["hoverlabel"]["font"]["size"] >= 16
        assert lay["coloraxis"]["colorbar"]["tickfont"]["size"] >= 16
        assert lay["margin"]["l"] > normal["margin"]["l"]
        assert_labels_fit(lay, 1200, t)  # thinned for the larger font where needed
        assert lay["height"] <= 700
    others = [positional_table(table, "sinusoidal", presentation=True),
              positional_similarity(table, presentation=True),
              probabilities([f"p{i}" for i in range(20)], np.full(20, 0.05), chosen=3, presentation=True)]
    for fig in others:
        lay = layout_of(fig)
        assert lay["xaxis"]["tickfont"]["size"] >= 16 and lay["yaxis"]["tickfont"]["size"] >= 16
    assert layout_of(message_figure("hi", presentation=True))["annotations"][0]["font"]["size"] >= 16


# ----------------------------------------------------------------------------- hover, outline, meta


def test_hover_names_layer_head_query_and_key():
    t = 14
    w, s = softmax_attention(4, t)
    toks = tokens(t)
    fig = attention_view(np.stack([w, w]), np.stack([s, s]), toks, layer=1, head=None, view="weights",
                         causal=True, overview_max_tokens=48)
    spec = json.loads(plot_json(fig))
    template = spec["layout"]["template"]["data"]["heatmap"][0]["hovertemplate"]
    assert template == "%{meta}<br>query %{y} → key %{x}<br>weight %{z:05,d}<extra></extra>"
    names = {tr.get("xaxis", "x"): tr["meta"] for tr in spec["data"]}
    assert names == {"x": "layer 1, head 0", "x2": "layer 1, head 1", "x3": "layer 1, head 2", "x4": "layer 1, head 3"}
    cats = spec["layout"]["xaxis"]["categoryarray"]
    assert cats[12] == '"he" (12)' and cats[11] == '"tom" (11)'


def test_query_row_outlined_in_every_panel_and_meta_for_the_page():
    t = 9
    w, s = softmax_attention(3, t)
    for head, n in ((None, 3), (2, 1)):
        lay = layout_of(attention_view(np.stack([w]), np.stack([s]), tokens(t), layer=0, head=head, view="weights",
                                       causal=True, overview_max_tokens=48, query=5))
        shapes = lay["shapes"]
        defaults = lay["template"]["layout"]["shapedefaults"]
        assert defaults["type"] == "rect" and (defaults["x0"], defaults["x1"]) == (-0.5, t - 0.5)
        refs = panel_axes(lay)
        assert len(refs) == n and len(shapes) == 2 * n
        for k, (x, y) in enumerate(refs):
            pair = shapes[2 * k : 2 * k + 2]
            assert all((sh["xref"], sh["yref"], sh["y0"], sh["y1"]) == (x, y, 4.5, 5.5) for sh in pair)
            assert [sh["line"] for sh in pair] == lay["meta"]["outline"]
        assert lay["meta"]["outline"][-1]["width"] == 2
        assert lay["meta"]["query"] == 5 and lay["meta"]["T"] == t and lay["meta"]["offset"] == 0
        assert lay["meta"]["viz"] == "attention"
        heads = [p["head"] for p in lay["meta"]["panels"]]
        assert heads == ([0, 1, 2] if head is None else [2]) and {p["layer"] for p in lay["meta"]["panels"]} == {0}
        assert [p["xaxis"] for p in lay["meta"]["panels"]] == (["x", "x2", "x3"] if head is None else ["x"])
    unmarked = layout_of(attention_grid(w, tokens(t), 0, mask=future_mask(t)))
    assert "shapes" not in unmarked and unmarked["meta"]["query"] is None
    with pytest.raises(ValueError, match="query 9 out of range"):
        attention_grid(w, tokens(t), 0, query=9)


# ----------------------------------------------------------------------------- probabilities


def test_probabilities_title_highlight_and_compact_height():
    pieces = [f"p{i}" for i in range(60)]
    rng = np.random.default_rng(2)
    probs = rng.random(60) ** 3
    probs /= probs.sum()
    adjusted = np.where(probs >= np.sort(probs)[-8], probs, 0)
    adjusted /= adjusted.sum()
    chosen = int(np.argsort(probs)[0])  # outside every top: added as an extra row
    for presentation in (False, True):
        fig = probabilities(pieces, probs, adjusted=adjusted, chosen=chosen, top=10, title="step 3 <after \"he\">",
                            presentation=presentation)
        spec = json.loads(plot_json(fig))
        lay = spec["layout"]
        assert lay["title"]["text"] == "step 3 &lt;after \"he\"&gt;"
        assert lay["height"] <= 360
        raw, adj = spec["data"][:2]
        ids = lay["meta"]["ids"]
        assert ids[-1] == chosen and len(ids) <= 11
        for bars in (raw, adj):
            colours = bars["marker"]["color"]
            assert colours[-1] == viz.sampling.CHOSEN_COLOUR and colours.count(viz.sampling.CHOSEN_COLOUR) == 1
        # rows never closer than their labels
        pitch = (lay["height"] - lay["margin"]["t"] - lay["margin"]["b"]) / len(ids)
        assert lay["yaxis"]["tickfont"]["size"] * 1.25 <= pitch
    assert layout_of(probabilities(["a"], np.ones(1)))["title"]["text"] == "Next-token probabilities"


# ----------------------------------------------------------------------------- payload


def test_payload_stays_within_15_percent_of_before():
    """Sizes of a 4-head causal grid before this change (measured on the same inputs) + 15 %."""
    before = {64: 96_682, 256: 474_709}
    for t, size in before.items():
        w, _ = softmax_attention(4, t, seed=0)
        toks = [f"tok{i % 37}" for i in range(t)]
        fig = attention_grid(w, toks, 1, mask=future_mask(t))
        assert payload_bytes(fig) <= size * 1.15, (t, payload_bytes(fig))
