"""viz.inside (one attention cell worked through) and the value-weighted colour of the attention views:
each figure shows the numbers it is given, with their formulas, in the app's colour language."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.figures import sent, softmax_attention
from viz import attention_panels, attention_view, decode_array
from viz.inside import dot_products, head_additions, head_matrices, softmax_row, vector_rows

TOKENS = ["tom", "met", "lisa", ".", "he"]


def arr(x) -> np.ndarray:
    return decode_array(x) if isinstance(x, dict) else np.asarray(x, dtype=float)


def test_dot_products_are_sorted_by_contribution_and_the_rest_is_summed():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=20), rng.normal(size=20)
    p = q * k
    fig = sent(dot_products(q, k, products=p, total=float(p.sum()), scale=0.25, score=float(p.sum()) * 0.25, top=5))
    bars = fig["data"][0]
    x = arr(bars["x"])
    order = np.argsort(-np.abs(p), kind="stable")
    assert np.allclose(x[:5], p[order[:5]])  # the five largest contributions, largest first
    assert x[5] == pytest.approx(p[order[5:]].sum())  # and the other 15 as one bar
    assert fig["layout"]["meta"]["order"] == order[:5].tolist()
    ticks = fig["layout"]["yaxis"]["ticktext"]
    d = int(order[0])
    assert ticks[0] == f"d={d}: {q[d]:.3f} × {k[d]:.3f}" and ticks[-1] == "the other 15 added up"
    title = fig["layout"]["title"]
    assert f"= {p.sum():.4f}" in title["text"] and "1/√16" in title["subtitle"]["text"]
    assert f"{p.sum() * 0.25:.4f}" in title["subtitle"]["text"]
    with pytest.raises(ValueError, match="one length"):
        dot_products(q, k[:3], products=p, total=0.0, scale=1.0, score=0.0)


def test_softmax_row_outlines_the_clicked_share_and_marks_masked_keys():
    w, s = softmax_attention(1, 5, seed=3)
    i, j = 3, 1
    m = s[0, i, : i + 1].max()
    e = np.where(np.isfinite(s[0, i]), np.exp(s[0, i] - m), 0.0)
    fig = sent(softmax_row(s[0, i], e, w[0, i], TOKENS, query=i, key=j, total=float(e.sum())))
    bars, marks = fig["data"]
    assert np.allclose(arr(bars["y"]), w[0, i])
    widths = bars["marker"]["line"]["width"]
    assert widths[j] > 0 and sum(widths) == widths[j]  # only the clicked key is outlined
    assert bars["text"][j] == f"{w[0, i, j]:.3f}"
    assert list(arr(marks["x"])) == [4] and marks["text"] == ["−∞"]  # the key after the query: masked
    assert "masked: s = −∞" in bars["hovertext"][4]
    assert f"share a = {e[j]:.4f} / {e.sum():.4f} = {w[0, i, j]:.4f}" in bars["hovertext"][j]
    assert fig["layout"]["meta"]["shares"][j] == pytest.approx(w[0, i, j])
    assert 'The row of "." (3) through the softmax' in fig["layout"]["title"]["text"]
    with pytest.raises(ValueError, match="out of range"):
        softmax_row(s[0, i], e, w[0, i], TOKENS, query=i, key=9, total=1.0)


def test_a_replaced_row_is_drawn_as_used_and_both_are_named():
    w, s = softmax_attention(1, 5, seed=4)
    e = np.where(np.isfinite(s[0, 4]), np.exp(s[0, 4] - s[0, 4].max()), 0.0)
    used = np.full(5, 0.2)
    fig = sent(softmax_row(s[0, 4], e, w[0, 4], TOKENS, query=4, key=0, total=float(e.sum()), used=used))
    assert np.allclose(arr(fig["data"][0]["y"]), used)
    assert "used instead: 0.2000" in fig["data"][0]["hovertext"][0]
    assert "replaced" in fig["layout"]["title"]["text"]


def test_vectors_print_their_numbers_and_share_one_symmetric_scale():
    rows = [("q_i = W_Q · x̂_i", [0.5, -2.0, 1.0]), ("k_j = W_K · x̂_j", [1.5, 0.0, -0.25])]
    fig = sent(vector_rows(rows, title="2 · <b>q</b> and k"))
    trace = fig["data"][0]
    assert trace["zmin"] == -2.0 and trace["zmax"] == 2.0 and trace["colorscale"][0][1] == "#053061"
    assert trace["text"][0] == ["0.50", "-2.00", "1.00"]
    assert "q_i = W_Q · x̂_i<br>dimension 1: -2.0000" == trace["hovertext"][0][1]
    assert "2 · &lt;b&gt;q&lt;/b&gt; and k" in fig["layout"]["title"]["text"]  # plain text, shown as typed
    wide = sent(vector_rows([("x", np.arange(64.0))], title="x"))
    assert "text" not in wide["data"][0]  # too many dimensions for numbers in the cells: hover gives them
    with pytest.raises(ValueError, match="same length"):
        vector_rows([("a", [1.0]), ("b", [1.0, 2.0])], title="t")


def test_head_additions_outline_the_head_and_keep_the_bias_apart():
    fig = sent(head_additions([1.1, 0.4, 0.9], head=2, layer=1, token="he", bias=0.1))
    bars = fig["data"][0]
    assert np.allclose(arr(bars["x"]), [1.1, 0.4, 0.9, 0.1])
    assert fig["layout"]["yaxis"]["ticktext"] == ["head 0", "head 1", "head 2", "bias b_O"]
    colours = bars["marker"]["color"]
    assert colours[2] != colours[0] == colours[1] and colours[3] not in (colours[0], colours[2])


def test_head_matrices_name_what_each_panel_is_for_a_click():
    t, d = 5, 3
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(t, d)), rng.normal(size=(t, d)), rng.normal(size=(t, d))
    raw = q @ k.T
    scaled = raw / np.sqrt(d)
    masked = np.where(np.tril(np.ones((t, t), bool)), scaled, -np.inf)
    fig = sent(head_matrices(q, k, v, raw, scaled, masked, TOKENS, layer=1, head=0, query=4, key=2,
                             scale=1 / np.sqrt(d)))
    meta = fig["layout"]["meta"]
    assert [p["what"] for p in meta["panels"]] == ["Q", "K", "V", "raw", "scaled", "masked"]
    assert [(p["rows"], p["cols"]) for p in meta["panels"]][:4] == [("query", "dim"), ("key", "dim"), ("key", "dim"),
                                                                    ("query", "key")]
    assert (meta["layer"], meta["head"], meta["query"], meta["key"]) == (1, 0, 4, 2)
    for trace, m in zip(fig["data"], (q, k, v, raw, scaled, masked)):
        z = arr(trace["z"])
        assert np.allclose(np.where(np.isfinite(m), m, np.nan), z, equal_nan=True)
    assert fig["data"][5]["y"][4] == '"he" (4)' and "query %{y} → key %{x}<br>s_ij" in fig["data"][5]["hovertemplate"]
    assert fig["data"][0]["x"] == [0, 1, 2] and "dim %{x}<br>q_i[d]" in fig["data"][0]["hovertemplate"]
    assert len(fig["layout"]["images"]) == 1  # the hatch behind the masked panel only


def test_value_weighted_colour_draws_the_norms_given_from_zero_to_the_largest():
    w, s = softmax_attention(2, 5, seed=2)
    norms = w * np.array([2.0, 5.0])[:, None, None]  # any non-negative numbers beyond 1
    common = dict(layer=0, causal=True, overview_max_tokens=48)
    fig = attention_view(w[None], s[None], TOKENS, head=None, view="weights", colour="value",
                         value_weighted=[norms], **common)
    seen = attention_panels(fig)
    assert np.allclose(np.nan_to_num(seen), np.round(norms, 3), atol=1e-9)
    lay = sent(fig)["layout"]
    assert lay["coloraxis"]["cmin"] == 0 and lay["coloraxis"]["cmax"] == pytest.approx(np.round(norms.max(), 3) * 1000)
    assert lay["coloraxis"]["colorbar"]["title"]["text"] == "‖a·v W_O‖"
    assert "value-weighted ‖a_ij · v_j W_O‖" in lay["title"]["text"]
    scores = attention_view(w[None], s[None], TOKENS, head=0, view="scores", colour="value", **common)
    assert "scores" in sent(scores)["layout"]["title"]["text"]  # the scores view has no colour modes
    with pytest.raises(ValueError, match="needs value_weighted"):
        attention_view(w[None], s[None], TOKENS, head=0, view="weights", colour="value", **common)
