"""Many heads at once: a layer's heads as coloured lines on the tokens (viz.layer_heads) and every
layer × head as thumbnails (viz.overview), read back from the JSON the browser gets.

The lines figure carries the selected token's weights exactly (float32, one row per key, one column per
head), draws a line for every weight of at least LINE_FLOOR at its opacity level in its head's own hue;
the thumbnails hold round(250 × weight) per cell (the largest weight of each block where the text is
pooled) and a click target per head; 16 layers × 32 heads fit a projector's figure and the payload.
"""

from __future__ import annotations

import colorsys
import re

import numpy as np
import pytest

import viz
from tests.support.figures import sent, softmax_attention
from viz import decode_array, payload_bytes
from viz.layer_heads import ALL_LINES, OPACITY_LEVELS, LINE_FLOOR
from viz.overview import GAP, MASKED, SCALE

PAYLOAD_LIMIT = 150_000  # bytes a figure may put on the wire (viz.attention_tiles: the 150 KB target)
PROJECTOR = dict(width_px=716, max_height_px=355)  # the Explore figure at 1280×720 (lab.display)


def tokens(t: int) -> list[str]:
    return [f"w{i}" for i in range(t)]


def rgba(colour: str) -> tuple[tuple[int, int, int], float]:
    r, g, b, a = re.fullmatch(r"rgba\((\d+),(\d+),(\d+),([\d.]+)\)", colour).groups()
    return (int(r), int(g), int(b)), float(a)


def line_traces(fig: dict) -> list[dict]:
    """The traces of lines (not the legend's entries, the query's dot or the keys' hover)."""
    return [tr for tr in fig["data"] if "legendgroup" in tr and not tr.get("showlegend") and "y" in tr
            and tr.get("mode") is None]


def segments(trace: dict) -> list[tuple[int, int]]:
    """(query, key) of every line of a trace: y runs query, key, gap."""
    y = decode_array(trace["y"]).astype(np.float64)
    x = decode_array(trace["x"])
    assert np.isnan(y[2::3]).all() and (x[0::3] == 0).all() and (x[1::3] == 1).all()
    return list(zip(y[0::3].astype(int).tolist(), y[1::3].astype(int).tolist()))


@pytest.mark.parametrize("query", [None, 0, 9, 16])
def test_the_keys_hover_carries_every_heads_weight_exactly(query):
    w, _ = softmax_attention(12, 17, seed=4)
    w = w.astype(np.float32)
    fig = sent(viz.layer_heads(w, tokens(17), 3, query=query))
    q = 16 if query is None else query
    (hover,) = [tr for tr in fig["data"] if "customdata" in tr]
    assert decode_array(hover["y"]).tolist() == list(range(q + 1))
    np.testing.assert_array_equal(decode_array(hover["customdata"]), w[:, q, : q + 1].T)  # bit for bit
    assert hover["text"] == tokens(17)[: q + 1]
    assert fig["layout"]["meta"]["query"] == q and fig["layout"]["meta"]["layer"] == 3
    assert "%{customdata[11]:.3f}" in hover["hovertemplate"] and f"({q})" in hover["hovertemplate"]


def test_every_line_is_a_weight_drawn_in_its_heads_colour_at_its_opacity():
    w, _ = softmax_attention(6, 12, seed=1, scale=2.0)
    q = 10
    fig = sent(viz.layer_heads(w, tokens(12), 0, query=q))
    hues = [tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in fig["layout"]["meta"]["colours"]]
    drawn = {}
    for tr in line_traces(fig):
        if tr.get("opacity") == 0:
            continue  # "every token": hidden until its button
        h = int(tr["legendgroup"][1:])
        rgb, alpha = rgba(tr["line"]["color"])
        assert rgb == hues[h]
        for qq, k in segments(tr):
            assert qq == q and (h, k) not in drawn
            drawn[h, k] = alpha
    expected = {(h, k): round(min(max(round(w[h, q, k] * OPACITY_LEVELS), 1), OPACITY_LEVELS) / OPACITY_LEVELS, 6)
                for h in range(6) for k in range(q + 1) if w[h, q, k] >= LINE_FLOOR}
    assert {key: round(a, 6) for key, a in drawn.items()} == expected
    assert all(abs(a - w[h, q, k]) <= 0.5 / OPACITY_LEVELS + 1e-9 for (h, k), a in drawn.items())  # opacity = weight


def test_every_token_draws_the_strongest_lines_behind_its_button():
    w, _ = softmax_attention(4, 30, seed=2, scale=4.0)
    fig = sent(viz.layer_heads(w, tokens(30), 1))
    hidden = [i for i, tr in enumerate(fig["data"]) if tr.get("opacity") == 0]
    shown = [i for i, tr in enumerate(fig["data"]) if i not in hidden and tr.get("legendgroup")
             and not tr.get("showlegend") and tr.get("mode") is None]
    allowed = np.tril(np.ones((30, 30), dtype=bool))
    strong = np.sort(w[:, allowed][w[:, allowed] >= LINE_FLOOR])
    floor = strong[-ALL_LINES] if len(strong) > ALL_LINES else LINE_FLOOR
    drawn = {(int(fig["data"][i]["legendgroup"][1:]), qq, k) for i in hidden for qq, k in segments(fig["data"][i])}
    assert drawn == set(zip(*(a.tolist() for a in np.nonzero((w >= floor) & allowed))))
    assert len(drawn) <= ALL_LINES
    mine, every = fig["layout"]["updatemenus"][0]["buttons"]
    query_dot = len(fig["data"]) - 2
    assert mine["args"] == [{"opacity": [1] * (len(shown) + 1) + [0] * len(hidden)}, shown + [query_dot] + hidden]
    assert every["args"] == [{"opacity": [0] * (len(shown) + 1) + [1] * len(hidden)}, shown + [query_dot] + hidden]
    text = [re.sub(r"<[^>]*>", "", b["label"]) for b in (mine, every)]
    assert text[0] == "from “w29” (29)" and text[1].startswith("from every token")


@pytest.mark.parametrize("n_heads", [2, 12, 32])
def test_a_hue_per_head_named_in_the_legend(n_heads):
    w, _ = softmax_attention(n_heads, 5)
    fig = sent(viz.layer_heads(w, tokens(5), 0))
    legend = [tr for tr in fig["data"] if tr.get("showlegend")]
    assert [tr["name"] for tr in legend] == [str(h) for h in range(n_heads)]
    assert [tr["legendgroup"] for tr in legend] == [f"h{h}" for h in range(n_heads)]
    rgbs = [rgba(tr["line"]["color"])[0] for tr in legend]
    assert rgbs == viz.head_colours(n_heads)
    hues = sorted(colorsys.rgb_to_hls(*(c / 255 for c in rgb))[0] * 360 for rgb in rgbs)
    gaps = np.diff(hues + [hues[0] + 360])
    assert gaps.min() >= 360 / n_heads * 0.8  # evenly round the wheel: one hue each
    assert fig["layout"]["legend"]["title"]["text"] == "head"


def test_tokens_are_escaped_and_the_query_stands_out():
    toks = ["<b>x</b>", "a&b", "plain", "last"]
    w, _ = softmax_attention(2, 4)
    fig = sent(viz.layer_heads(w, toks, 0, query=2, title_prefix="<i>edit</i> · "))
    left, right = fig["layout"]["yaxis"], fig["layout"]["yaxis2"]
    assert right["ticktext"] == ["&lt;b&gt;x&lt;/b&gt;", "a&amp;b", "plain", "last"]
    assert left["ticktext"][2].endswith("<b>plain</b></span>") and "#ff2d95" in left["ticktext"][2]
    assert left["ticktext"][0] == "&lt;b&gt;x&lt;/b&gt;"
    assert fig["layout"]["title"]["text"].startswith("&lt;i&gt;edit&lt;/i&gt; · Layer 0")
    assert right["overlaying"] == "y" and right["matches"] == "y"
    assert fig["layout"]["meta"]["pick"] == "none"  # a click on the lines view opens no head


@pytest.mark.parametrize("presentation, least", [(False, viz.READABLE_TICK_PX), (True, 16)])
@pytest.mark.parametrize("n_heads", [12, 32])
def test_a_long_text_fits_the_projector_opening_on_the_rows_up_to_the_query(presentation, least, n_heads):
    w, _ = softmax_attention(n_heads, 120, seed=3)
    fig = sent(viz.layer_heads(w, tokens(120), 5, query=80, presentation=presentation, **PROJECTOR))
    lay = fig["layout"]
    assert lay["height"] <= PROJECTOR["max_height_px"]
    lo, hi = lay["meta"]["rows"]
    assert lo <= 80 <= hi and hi - lo + 1 >= 8
    assert lay["yaxis"]["range"] == [hi + 0.5, lo - 0.5]
    pitch = (lay["height"] - lay["margin"]["t"] - lay["margin"]["b"]) / (hi - lo + 1)
    assert lay["meta"]["label_px"] >= least and pitch >= lay["meta"]["label_px"] * 1.2 - 1e-9
    assert f"rows {lo}–{hi} of 120" in lay["annotations"][0]["text"]
    assert payload_bytes(viz.layer_heads(w, tokens(120), 5, query=80, **PROJECTOR)) <= PAYLOAD_LIMIT


def test_a_short_text_shows_every_row_without_a_note():
    w, _ = softmax_attention(12, 20, seed=5)
    fig = sent(viz.layer_heads(w, tokens(20), 0, **PROJECTOR))
    assert fig["layout"]["meta"]["rows"] == [0, 19] and "annotations" not in fig["layout"]
    assert fig["layout"]["legend"]["orientation"] == "v"  # beside the keys: no rows of height lost
    assert fig["layout"]["height"] <= PROJECTOR["max_height_px"]


@pytest.mark.parametrize("bad, message", [
    (dict(weights=np.zeros((2, 3))), "3-D"),
    (dict(query=5), "query must be a whole number in 0..3"),
    (dict(query=True), "query must be a whole number"),
    (dict(head=2), "head must be a whole number in 0..1"),
    (dict(weights=np.full((2, 4, 4), 2.0)), "in [0, 1]"),
    (dict(weights=np.full((2, 4, 4), np.nan)), "finite"),
    (dict(width_px=50), "width_px"),
])
def test_bad_input_is_refused_by_name(bad, message):
    w, _ = softmax_attention(2, 4)
    args = dict(weights=w, query=None, head=None, width_px=720)
    args.update(bad)
    with pytest.raises(ValueError, match=re.escape(message)):
        viz.layer_heads(args.pop("weights"), tokens(4), 0, **args)


# ------------------------------------------------------------------------------- thumbnails


def mosaic(fig: dict) -> np.ndarray:
    heat = [tr for tr in fig["data"] if tr["type"] == "heatmap"]
    assert len(heat) == 1 and heat[0]["hoverinfo"] == "skip"
    return decode_array(heat[0]["z"])


def block(z: np.ndarray, meta: dict, layer: int, head: int) -> np.ndarray:
    stride = meta["cells"] + meta["gap"]
    return z[layer * stride: layer * stride + meta["cells"], head * stride: head * stride + meta["cells"]]


def test_each_thumbnail_holds_its_heads_weights():
    layers = [softmax_attention(4, 9, seed=s)[0] for s in range(3)]
    fig = sent(viz.head_thumbnails(layers, tokens(9)))
    meta, z = fig["layout"]["meta"], mosaic(fig)
    assert meta["cells"] == 9 and meta["edges"] == list(range(10)) and meta["unit"] == 1 / SCALE
    assert z.dtype == np.uint8
    masked = np.triu(np.ones((9, 9), dtype=bool), 1)
    for li, w in enumerate(layers):
        for h in range(4):
            cells = block(z, meta, li, h)
            assert (cells[masked] == MASKED).all()
            np.testing.assert_array_equal(cells[~masked], np.rint(w[h][~masked] * SCALE))
    gaps = np.ones(z.shape, dtype=bool)
    for li in range(3):
        for h in range(4):
            block(gaps, meta, li, h)[...] = False
    assert (z[gaps] == GAP).all() and meta["gap"] == 1


def test_a_long_text_is_pooled_to_the_largest_weight_of_each_block():
    t = 100
    layers = [softmax_attention(32, t, seed=s, scale=5.0)[0] for s in range(16)]
    fig = sent(viz.head_thumbnails(layers, tokens(t), **PROJECTOR))
    meta, z = fig["layout"]["meta"], mosaic(fig)
    edges = meta["edges"]
    assert meta["cells"] < t and edges[0] == 0 and edges[-1] == t and len(edges) == meta["cells"] + 1
    for li, h in ((0, 0), (7, 19), (15, 31)):
        cells = block(z, meta, li, h)
        w = np.where(np.tril(np.ones((t, t), dtype=bool)), layers[li][h], np.nan)
        for i in range(meta["cells"]):
            for j in range(meta["cells"]):
                part = w[edges[i]:edges[i + 1], edges[j]:edges[j + 1]]
                want = MASKED if np.isnan(part).all() else np.rint(np.nanmax(part) * SCALE)
                assert cells[i, j] == want, (li, h, i, j)
    assert "largest weight of its block" in fig["layout"]["annotations"][0]["text"]


@pytest.mark.parametrize("size", [PROJECTOR, dict(width_px=764, max_height_px=515), dict(width_px=326,
                                                                                          max_height_px=784)])
@pytest.mark.parametrize("presentation", [False, True])
def test_16_by_32_thumbnails_fit_and_stay_under_the_payload_limit(size, presentation):
    layers = [softmax_attention(32, 64, seed=s)[0] for s in range(16)]
    spec = viz.head_thumbnails(layers, tokens(64), presentation=presentation, **size)
    fig = sent(spec)
    lay = fig["layout"]
    assert payload_bytes(spec) <= PAYLOAD_LIMIT
    assert lay["height"] <= size["max_height_px"]
    plot_w = size["width_px"] - lay["margin"]["l"] - lay["margin"]["r"]
    thumb_w = plot_w * lay["xaxis"]["domain"][1] / 32
    thumb_h = (lay["height"] - lay["margin"]["t"] - lay["margin"]["b"]) / 16
    assert min(thumb_w, thumb_h) >= (8 if size["width_px"] < 480 else 12)  # a pattern, not a dot
    assert thumb_w <= 2 * thumb_h + 1e-6
    labelled = 8 if size["width_px"] >= 480 else 4  # head and layer numbers that do not touch
    assert len(lay["xaxis"]["ticktext"]) >= labelled and len(lay["yaxis"]["ticktext"]) >= labelled


def test_a_click_on_a_thumbnail_names_its_head_and_the_hover_its_numbers():
    layers = [softmax_attention(3, 6, seed=s)[0] for s in range(2)]
    fig = sent(viz.head_thumbnails(layers, tokens(6), selected=(1, 2)))
    (picks,) = [tr for tr in fig["data"] if tr["type"] == "scatter"]
    meta = fig["layout"]["meta"]
    stride = meta["cells"] + meta["gap"]
    xs, ys = decode_array(picks["x"]), decode_array(picks["y"])
    q = np.arange(1, 6)
    for n, (li, h, prev, first, itself) in enumerate(picks["customdata"]):
        assert (xs[n], ys[n]) == (h * stride + (meta["cells"] - 1) / 2, li * stride + (meta["cells"] - 1) / 2)
        w = layers[li][h]
        assert (prev, first, itself) == tuple(round(float(v), 3) for v in
                                              (w[q, q - 1].mean(), w[q, 0].mean(), w[q, q].mean()))
    assert [c[:2] for c in picks["customdata"]] == [[li, h] for li in range(2) for h in range(3)]
    assert meta["pick"] == "head" and "click to open" in picks["hovertemplate"]
    outline = fig["layout"]["shapes"]
    assert [s["line"]["color"] for s in outline] == ["#000000", "#ff2d95"]
    assert outline[0]["x0"] < 2 * stride < 2 * stride + meta["cells"] - 1 < outline[0]["x1"]
    assert outline[0]["y0"] < stride < outline[0]["y1"] < 2 * stride


def test_the_thumbnails_refuse_what_is_not_a_model_of_heads():
    w, _ = softmax_attention(2, 4)
    with pytest.raises(ValueError, match="4-D"):
        viz.head_thumbnails([w, w[:1]], tokens(4))
    with pytest.raises(ValueError, match="2 tokens were given"):
        viz.head_thumbnails([w], tokens(2))
    with pytest.raises(ValueError, match="selected"):
        viz.head_thumbnails([w], tokens(4), selected=(1, 0))


def test_the_explore_views_draw_these_figures():
    stack = np.stack([softmax_attention(12, 7, seed=s)[0] for s in range(12)])
    common = dict(causal=True, overview_max_tokens=48, **PROJECTOR)
    lines = viz.attention_view(stack, None, tokens(7), layer=4, head=3, view=viz.LINES_VIEW, query=2, **common)
    assert sent(lines) == sent(viz.layer_heads(stack[4], tokens(7), 4, query=2, head=3, **PROJECTOR))
    thumbs = viz.attention_view(stack, None, tokens(7), layer=4, head=None, view=viz.THUMBNAILS_VIEW, **common)
    assert sent(thumbs) == sent(viz.head_thumbnails(stack, tokens(7), selected=(4, None), **PROJECTOR))
    assert {viz.LINES_VIEW, viz.THUMBNAILS_VIEW} <= set(viz.ATTENTION_VIEWS)
