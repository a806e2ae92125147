"""Tests for viz/: figure structure, the values a viewer sees, escaping, validation, payload size.

No browser here; the values are read back from the JSON that would be sent (typed arrays decoded),
so the checks see exactly what plotly.js gets.
"""

from __future__ import annotations

import json
import subprocess
import sys
import typing

import numpy as np
import plotly.graph_objects as go
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import viz
from viz import (
    ATTENTION_VIEWS,
    FigureSpec,
    attention_grid,
    attention_head,
    attention_overview,
    attention_panels,
    attention_view,
    decode_array,
    future_mask,
    loss_curve,
    message_figure,
    no_positional_encoding,
    payload_bytes,
    plot_json,
    positional_similarity,
    positional_table,
    probabilities,
)
from tests.support.figures import all_strings, assert_same_values, axis, sent, softmax_attention

STEP = 0.0005 + 1e-9  # milli-unit quantisation: half a step
HOSTILE = ["<img src=x onerror=alert(1)>", "<b>", "&amp;", 'say "hi"', "<br>"]
WORDS = ["the", "cat", "sat", "on", "the", "mat", "and", "the"]


def tokens(t: int) -> list[str]:
    return [WORDS[i % len(WORDS)] for i in range(t)]


def hover_text(fig, panel: int, i: int, j: int, toks: list[str]) -> str:
    """The hover label plotly.js shows for cell (query i, key j): template + trace meta + d3 "05,d" +
    swapped separators ("<br>" kept)."""
    spec = sent(fig)
    lay = spec["layout"]
    template = lay["template"]["data"]["heatmap"][0]["hovertemplate"]
    xref = "x" if panel == 0 else f"x{panel + 1}"
    meta = {tr.get("meta") for tr in spec["data"] if tr.get("xaxis", "x") == xref}
    assert len(meta) == 1, meta  # every tile of a panel carries the same name
    template = template.replace("%{meta}", meta.pop())
    assert lay["separators"] == ",."  # decimal ",", thousands "." (what makes 231 read 0.231)
    z = attention_panels(fig)[panel, i, j]
    milli = int(round(z * 1000))
    value = format(milli, "05,d").replace(",", ".")  # Python's "05,d" pads and groups like d3's
    cats = lay["xaxis"]["categoryarray"]
    return (
        template.replace("%{y}", cats[i]).replace("%{x}", cats[j]).replace("%{z:05,d}", value)
        .replace("<extra></extra>", "")
    )


# ----------------------------------------------------------------------------- attention


def test_grid_structure_values_and_mask():
    t = 6
    w, _ = softmax_attention(4, t)
    fig = attention_grid(w, tokens(t), 1, mask=future_mask(t))
    data, layout = sent(fig)["data"], sent(fig)["layout"]
    assert data and all(tr["type"] == "heatmap" for tr in data)
    assert {tr.get("xaxis", "x") for tr in data} == {"x", "x2", "x3", "x4"}
    seen = attention_panels(fig)
    assert seen.shape == (4, t, t)
    upper = future_mask(t)
    assert np.isnan(seen[:, upper]).all() and np.isfinite(seen[:, ~upper]).all()
    assert np.abs(seen[:, ~upper] - w[:, ~upper]).max() <= STEP
    # shared 0-1 colour scale in milli-units, labelled in weights
    ca = layout["coloraxis"]
    assert (ca["cmin"], ca["cmax"]) == (0, 1000)
    assert ca["colorbar"]["ticktext"] == ["0", "0.25", "0.5", "0.75", "1"]
    assert all("coloraxis" not in tr for tr in data)  # taken from the template
    heatmap_defaults = layout["template"]["data"]["heatmap"][0]
    assert heatmap_defaults["coloraxis"] == "coloraxis" and heatmap_defaults["hoverongaps"] is False
    assert layout["plot_bgcolor"] == "rgba(0,0,0,0)" and axis(layout, "xaxis")["showgrid"] is False


def test_grid_ticks_keep_repeated_tokens_distinct():
    t = 8
    toks = tokens(t)  # "the" three times
    layout = sent(attention_grid(softmax_attention(2, t)[0], toks, 0, mask=future_mask(t)))["layout"]
    for ax in (axis(layout, "xaxis"), axis(layout, "yaxis")):
        assert ax["tickvals"] == list(range(t))
        assert ax["ticktext"] == toks
        assert ax["type"] == "category"
        assert ax["categoryarray"] == [f'"{tok}" ({i})' for i, tok in enumerate(toks)]
        assert len(set(ax["categoryarray"])) == t
    assert layout["yaxis"]["range"] == [t - 0.5, -0.5]  # position 0 on top
    assert layout["xaxis2"]["matches"] == "x" and layout["yaxis2"]["matches"] == "y"


def test_grid_thins_ticks_only_when_the_panels_are_too_small():
    t = 32
    toks = [f"w{i}" for i in range(t)]
    small = sent(attention_grid(softmax_attention(4, t)[0], toks, 0, mask=future_mask(t), max_height_px=300))["layout"]
    xaxis = axis(small, "xaxis")
    vals, text = xaxis["tickvals"], xaxis["ticktext"]
    assert 4 <= len(vals) < t and vals[-1] == t - 1  # thinned, and the newest position keeps its label
    assert len(set(np.diff(vals))) == 1 and text == [toks[i] for i in vals]
    assert small["height"] <= 300


def test_hover_text_format():
    t = 5
    w = np.tril(np.ones((t, t)))
    w /= w.sum(1, keepdims=True)
    toks = ["how", "are", "you", "is", "it"]
    fig = attention_grid(w[None], toks, 0, mask=future_mask(t))
    assert hover_text(fig, 0, 3, 0, toks) == 'layer 0, head 0<br>query "is" (3) → key "how" (0)<br>weight 0.250'
    assert hover_text(fig, 0, 0, 0, toks) == 'layer 0, head 0<br>query "how" (0) → key "how" (0)<br>weight 1.000'
    assert hover_text(fig, 0, 2, 1, toks) == 'layer 0, head 0<br>query "you" (2) → key "are" (1)<br>weight 0.333'
    # every panel names its own layer and head (here heads 2 and 0 of layer 3)
    fig = attention_grid(np.stack([w, w, w]), toks, 3, heads=[2, 0], mask=future_mask(t))
    assert hover_text(fig, 0, 3, 0, toks).startswith("layer 3, head 2<br>")
    assert hover_text(fig, 1, 3, 0, toks).startswith("layer 3, head 0<br>")


def test_scores_mask_from_minus_inf_and_symmetric_scale():
    t = 7
    _, scores = softmax_attention(3, t, seed=1)
    fig = attention_grid(scores, tokens(t), 2, kind="scores")
    seen = attention_panels(fig)
    upper = future_mask(t)
    assert np.isnan(seen[:, upper]).all()
    assert np.abs(seen[:, ~upper] - scores[:, ~upper]).max() <= STEP
    layout = sent(fig)["layout"]
    ca = layout["coloraxis"]
    assert ca["cmin"] == -ca["cmax"] and ca["cmax"] >= 1000 * np.abs(scores[:, ~upper]).max() - 1
    assert "scores" in layout["title"]["text"]
    milli = int(round(seen[0, 3, 1] * 1000))
    assert hover_text(fig, 0, 3, 1, tokens(t)).endswith(format(milli, "05,d").replace(",", "."))
    assert format(-345, "05,d").replace(",", ".") == "-0.345"


def test_nan_input_and_unmasked_input():
    t = 6
    w, _ = softmax_attention(2, t)
    nan_w = np.where(future_mask(t), np.nan, w)
    seen = attention_panels(attention_grid(nan_w, tokens(t), 0))
    assert np.array_equal(np.isnan(seen[0]), future_mask(t))
    full = np.full((2, t, t), 1 / t)  # bidirectional: nothing masked
    seen = attention_panels(attention_grid(full, tokens(t), 0))
    assert np.isfinite(seen).all() and np.abs(seen - 1 / t).max() <= STEP


@settings(max_examples=30, deadline=None)
@given(
    t=st.integers(1, 40),
    heads=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    density=st.floats(0.0, 1.0),
    kind=st.sampled_from(["weights", "scores"]),
)
def test_any_mask_round_trips(t, heads, seed, density, kind):
    rng = np.random.default_rng(seed)
    values = rng.random((heads, t, t)) if kind == "weights" else rng.normal(size=(heads, t, t)) * 8
    mask = rng.random((heads, t, t)) < density
    fig = attention_grid(values, [f"t{i}" for i in range(t)], 0, kind=kind, mask=mask)
    seen = attention_panels(fig)  # also checks overlapping tiles agree
    assert np.array_equal(np.isnan(seen), mask)
    assert np.all(np.abs(seen[~mask] - values[~mask]) <= STEP)


def test_head_and_overview():
    t = 6
    w, _ = softmax_attention(3, t)
    head = attention_head(w[1], tokens(t), 2, 1, mask=future_mask(t))
    head_layout = sent(head)["layout"]
    assert head_layout["coloraxis"]["showscale"] is True
    assert "head 1" in head_layout["title"]["text"] and "Layer 2" in head_layout["title"]["text"]
    assert np.abs(np.nan_to_num(attention_panels(head)[0]) - w[1]).max() <= STEP
    stack = np.stack([w, w[::-1]])  # (L=2, H=3, T, T)
    over = attention_overview(stack, tokens(t), mask=future_mask(t))
    seen = attention_panels(over)
    assert seen.shape == (6, t, t)
    assert np.abs(np.nan_to_num(seen) - stack.reshape(6, t, t)).max() <= STEP
    assert {tr.get("xaxis", "x") for tr in sent(over)["data"]} == {"x"} | {f"x{k}" for k in range(2, 7)}


def test_hostile_tokens_are_escaped():
    t = len(HOSTILE)
    w = np.tril(np.ones((t, t)))
    w /= w.sum(1, keepdims=True)
    fig = attention_grid(w[None], HOSTILE, 0, mask=future_mask(t))
    layout = json.loads(plot_json(fig))["layout"]
    strings = all_strings(layout)
    for bad in ("<img", "<b>", "<br>"):
        assert not any(bad in s for s in strings if "<extra>" not in s), bad
    assert layout["xaxis"]["categoryarray"][0] == '"&lt;img src=x onerror=alert(1)&gt;" (0)'
    assert axis(layout, "xaxis")["ticktext"][0] == "&lt;img src=x …"  # long tokens are shortened in ticks only
    assert axis(layout, "xaxis")["ticktext"][1] == "&lt;b&gt;"
    assert layout["xaxis"]["categoryarray"][2] == '"&amp;amp;" (2)'
    assert axis(layout, "yaxis")["ticktext"][3] == 'say "hi"'


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: attention_grid(np.ones((2, 5, 5)), list("abcd"), 0), "attention is 5×5 but 4 token labels"),
        (lambda: attention_grid(np.ones((2, 5, 4)), list("abcde"), 0), "attention is 5×4"),
        (lambda: attention_grid(np.ones((5, 5)), list("abcde"), 0), "3-D"),
        (lambda: attention_grid(np.ones((1, 3, 3)), list("abc"), 0, kind="probs"), "kind must be"),
        (lambda: attention_grid(np.ones((1, 3, 3)) * 2, list("abc"), 0), "kind='scores'"),
        (
            lambda: attention_grid(np.ones((1, 3, 3)), list("abc"), 0, mask=np.ones((2, 2))),
            "mask is 2×2 but attention is 3×3",
        ),
        (lambda: attention_grid(np.ones((2, 3, 3)), list("abc"), 0, heads=[2]), "this layer has 2 heads"),
        (lambda: attention_head(np.ones((3, 3)), list("ab"), 0, 0), "attention is 3×3 but 2 token labels"),
        (lambda: attention_overview(np.ones((1, 1, 49, 49)), ["a"] * 49), "pick one layer"),
        (lambda: probabilities(["a", "b"], np.ones(3) / 3), "probs has 3 entries but 2 token pieces"),
        (lambda: probabilities(["a", "b"], np.ones(2) / 2, adjusted=np.ones(3)), "adjusted has 3 entries but 2"),
        (lambda: probabilities(["a", "b"], np.ones(2) / 2, chosen=5), "chosen token id 5"),
        (lambda: positional_table(np.ones(5), "learned"), "must be 2-D"),
        (lambda: positional_table(np.ones((4, 2)), "alibi"), "kind must be one of"),
        (lambda: loss_curve(np.arange(3), np.ones(2)), "train loss has 2 values but 3 steps"),
        (lambda: loss_curve(np.arange(3), np.ones(3), np.arange(2), np.ones(1)), "validation loss has 1 values but 2"),
    ],
)
def test_mismatches_raise(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("*", r"\*")):
        call()


def test_payload_under_150kb_at_t128():
    t = 128
    w, _ = softmax_attention(4, t, seed=0)
    toks = [f"tok{i % 37}" for i in range(t)]
    fig = attention_grid(w, toks, 0, mask=future_mask(t))
    size = payload_bytes(fig)
    assert size <= 150_000, size
    assert payload_bytes(fig, compact=False) > size  # plotly's "/" escaping costs extra
    spec = json.loads(plot_json(fig))
    assert {tr["z"]["dtype"] for tr in spec["data"]} <= {"u1", "u2", "f4"}
    assert np.abs(np.nan_to_num(attention_panels(fig)) - w).max() <= STEP


def test_payload_matches_gradio_serialisation():
    gr = pytest.importorskip("gradio")
    from ui.plots import to_plot

    t = 16
    fig = attention_grid(softmax_attention(4, t)[0], tokens(t), 0, mask=future_mask(t))
    plain = fig.to_plotly()  # the equivalent validated plotly figure
    assert payload_bytes(fig, compact=False) == len(json.dumps(gr.Plot().postprocess(plain).model_dump()))
    compact = gr.Plot().postprocess(to_plot(fig))
    assert payload_bytes(fig) == len(json.dumps(compact.model_dump()))
    # the fast JSON carries the same traces as plotly's own serialisation
    assert json.loads(compact.plot)["data"] == json.loads(plain.to_json())["data"]


def test_viz_imports_neither_gradio_nor_torch():
    code = "import sys, viz; print('gradio' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# ----------------------------------------------------------------------------- positional


def sinusoidal(p: int, d: int) -> np.ndarray:
    pos = np.arange(p)[:, None] / 10000 ** (np.arange(0, d, 2) / d)
    table = np.zeros((p, d))
    table[:, 0::2], table[:, 1::2] = np.sin(pos), np.cos(pos)
    return table


def test_positional_table_values():
    table = sinusoidal(16, 8)
    fig = sent(positional_table(table, "sinusoidal"))
    assert len(fig["data"]) == 1
    z = decode_array(fig["data"][0]["z"]) * 1e-3
    assert z.shape == (16, 8) and np.abs(z - table).max() <= STEP
    assert fig["layout"]["yaxis"]["autorange"] == "reversed"
    assert "%{z:05,d}" in fig["data"][0]["hovertemplate"] and fig["layout"]["separators"] == ",."


def test_positional_rope_angles_wrapped():
    angles = np.arange(12)[:, None] * (1 / 10000 ** (np.arange(0, 8, 2) / 8))
    fig = sent(positional_table(angles, "rope"))
    z = decode_array(fig["data"][0]["z"]) * 1e-3
    assert np.all(z > -np.pi - 1e-3) and np.all(z <= np.pi + 1e-3)
    assert np.abs(np.exp(1j * z) - np.exp(1j * angles)).max() < 2e-3
    title = fig["layout"]["title"]["text"]
    assert "rotation angle θᵢ·pos (rad)" in title and "wrapped" in title
    # a cyclic scale written out as stops (plotly.js knows none by name), ending on its first colour
    scale = fig["layout"]["coloraxis"]["colorscale"]
    assert isinstance(scale, list) and scale[0][0] == 0 and scale[-1][0] == 1 and scale[0][1] == scale[-1][1]


def test_positional_similarity():
    angles = np.arange(10)[:, None] * (1 / 10000 ** (np.arange(0, 8, 2) / 8))
    sim = decode_array(sent(positional_similarity(angles, "rope"))["data"][0]["z"]) * 1e-3
    assert sim.shape == (10, 10) and np.allclose(np.diag(sim), 1.0)
    assert np.allclose(sim[2, 5], sim[4, 7], atol=1e-3)  # RoPE: depends only on the offset
    learned = decode_array(sent(positional_similarity(np.eye(4)))["data"][0]["z"]) * 1e-3
    assert np.allclose(learned, np.eye(4))


def test_no_positional_encoding():
    fig = sent(no_positional_encoding())
    assert len(fig["data"]) == 0
    text = fig["layout"]["annotations"][0]["text"]
    assert "no positional encoding" in text and "permutation-invariant" in text


# ----------------------------------------------------------------------------- probabilities


def test_probabilities_bars_and_chosen():
    pieces = [f"p{i}" for i in range(50)]
    rng = np.random.default_rng(0)
    probs = rng.random(50)
    probs /= probs.sum()
    adjusted = np.where(probs >= np.sort(probs)[-5], probs, 0)
    adjusted /= adjusted.sum()
    chosen = int(np.argsort(-adjusted)[1])
    spec = sent(probabilities(pieces, probs, adjusted=adjusted, chosen=chosen, top=8))
    ticktext = spec["layout"]["yaxis"]["ticktext"]
    assert len(spec["data"]) == 4 and spec["layout"]["barmode"] == "group"
    raw, adj, *legend = spec["data"]
    # the legend shows the series colours (from two empty marker traces), never the highlight
    assert [tr["marker"]["color"] for tr in legend] == [viz.sampling.RAW_COLOUR, viz.sampling.ADJ_COLOUR]
    assert not raw["showlegend"] and not adj["showlegend"]
    ids = np.lexsort((-probs, -adjusted))[:8]  # ranked by adjusted, ties by the model's probability
    assert decode_array(raw["y"]).tolist() == list(range(8))
    assert np.allclose(decode_array(raw["x"]), probs[ids], atol=1e-6)
    assert np.allclose(decode_array(adj["x"]), adjusted[ids], atol=1e-6)
    assert [text.split("  ")[0].removeprefix("<b>") for text in ticktext] == [pieces[i] for i in ids]
    colours = raw["marker"]["color"]
    assert colours[1] != colours[0] and colours.count(colours[1]) == 1
    assert "chosen" in ticktext[1]
    assert "%{customdata}" in raw["hovertemplate"] and raw["hovertext"][1] == f'"{pieces[chosen]}" (id {chosen})'
    assert raw["customdata"][1] == viz.probability_text(probs[chosen])


def test_probabilities_chosen_outside_top_and_escaping():
    pieces = ["<b>", "a", "b", "␣c"]
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    spec = sent(probabilities(pieces, probs, chosen=3, top=2))
    ticktext = spec["layout"]["yaxis"]["ticktext"]
    assert len(spec["data"]) == 1
    assert decode_array(spec["data"][0]["x"]).tolist() == pytest.approx([0.5, 0.3, 0.05])
    assert ticktext[0] == "&lt;b&gt;"
    assert "␣c" in ticktext[2] and "chosen" in ticktext[2]
    assert spec["data"][0]["hovertext"][0] == '"&lt;b&gt;" (id 0)'


def test_probabilities_label_a_typed_token_as_typed_not_chosen():
    pieces, probs = ["a", "b", "c"], np.array([0.6, 0.3, 0.1])
    typed = sent(probabilities(pieces, probs, chosen=1, typed=True))["layout"]["yaxis"]["ticktext"]
    assert typed[1] == "<b>b  ◀ typed</b>" and not any("chosen" in t for t in typed)
    drawn = sent(probabilities(pieces, probs, chosen=1))["layout"]["yaxis"]["ticktext"]
    assert drawn[1] == "<b>b  ◀ chosen</b>" and not any("typed" in t for t in drawn)


# ----------------------------------------------------------------------------- loss


def test_loss_curve_empty_single_and_full():
    empty = sent(loss_curve(np.array([], dtype=int), np.array([])))
    assert len(empty["data"]) == 0 and "waiting for first step" in empty["layout"]["annotations"][0]["text"]
    assert empty["layout"]["xaxis"]["title"]["text"] == "step"
    one = sent(loss_curve(np.array([0]), np.array([4.2])))
    assert len(one["data"]) == 1 and one["data"][0]["mode"] == "markers"
    full = sent(loss_curve(np.arange(0, 100, 10), np.linspace(4, 2, 10), np.array([0, 50]), np.array([4.1, 3.0])))
    assert [tr["name"] for tr in full["data"]] == ["train", "validation"]
    assert full["data"][0]["mode"] == "lines" and not full["layout"].get("annotations")
    assert np.allclose(decode_array(full["data"][0]["y"]), np.linspace(4, 2, 10))


def test_figure_specs_send_what_plotly_would_send():
    """The fast JSON of every FigureSpec equals plotly's own serialisation of `to_plotly()`."""
    steps = np.arange(1, 301, dtype=np.float32)
    figures = [
        attention_grid(softmax_attention(4, 12)[0], tokens(12), 0, mask=future_mask(12)),
        loss_curve(steps, 3 / steps, steps[::50], 3.2 / steps[::50]),
        probabilities(tokens(12), np.full(12, 1 / 12, np.float32), adjusted=np.full(12, 1 / 12, np.float32), chosen=4),
    ]
    for fig in figures:
        assert isinstance(fig, FigureSpec)
        fast, reference = sent(fig), json.loads(fig.to_plotly().to_json())
        assert fast["data"] == reference["data"]
        for key, value in fast["layout"].items():
            if key in ("template", "coloraxis"):  # plotly expands named templates and colour scales
                continue
            assert value == reference["layout"][key], key


# ----------------------------------------------------------------------------- FigureSpec


def test_figure_spec_is_not_a_plotly_figure():
    """Edits that would be lost are refused, not silently accepted."""
    fig = attention_grid(softmax_attention(2, 6)[0], tokens(6), 0, mask=future_mask(6))
    assert isinstance(fig, FigureSpec) and not isinstance(fig, go.Figure)
    assert not hasattr(fig, "update_layout") and not hasattr(fig, "figure")
    with pytest.raises(AttributeError):
        fig.update_layout(title="lost")
    with pytest.raises(AttributeError):
        fig.layout = {}  # fields cannot be reassigned
    assert "FigureSpec" in repr(fig) and "heatmap" in repr(fig)


def test_to_plotly_carries_the_same_data():
    steps = np.arange(0, 500, 5)  # int64: narrowed like plotly.py narrows it
    specs = [
        attention_grid(softmax_attention(3, 20, seed=4)[0], tokens(20), 1, mask=future_mask(20)),
        attention_head(softmax_attention(1, 9)[1][0], tokens(9), 0, 0, kind="scores"),
        probabilities(tokens(9), np.full(9, 1 / 9), chosen=2),
        loss_curve(steps, 5 / (1 + steps), steps[::20], 5.5 / (1 + steps[::20])),
        loss_curve(np.zeros(0), np.zeros(0)),
    ]
    for spec in specs:
        plain = spec.to_plotly()
        assert isinstance(plain, go.Figure)
        assert_same_values(sent(spec)["data"], json.loads(plain.to_json())["data"])
        plain.update_layout(title="edited")  # a separate figure: the spec is unchanged
        assert sent(spec)["layout"].get("title", {}).get("text") != "edited"
    attention = specs[0]
    np.testing.assert_array_equal(attention_panels(attention.to_plotly()), attention_panels(attention))


def test_helpers_accept_both_figure_types_and_nothing_else():
    spec = probabilities(["a", "b"], np.array([0.25, 0.75]))
    plain = positional_table(sinusoidal(4, 4), "sinusoidal").to_plotly()
    for fig in (spec, plain, spec.to_plotly()):
        assert json.loads(plot_json(fig))["data"]
        assert payload_bytes(fig) <= payload_bytes(fig, compact=False)
    for call in (plot_json, payload_bytes):
        with pytest.raises(TypeError, match="FigureSpec or a plotly go.Figure"):
            call({"data": [], "layout": {}})
    # attention_panels also reads a figure's JSON (as the API returns it), but only an attention figure's
    with pytest.raises(ValueError, match="not an attention figure"):
        attention_panels({"data": [], "layout": {}})
    with pytest.raises(ValueError, match="not an attention figure"):
        attention_panels(json.loads(plot_json(spec)))
    with pytest.raises(TypeError, match="figure's JSON"):
        attention_panels({"nothing": 1})


def test_return_annotations_say_what_comes_back():
    t = 5
    w, s = softmax_attention(2, t)
    stack = np.stack([w, w])
    calls = [
        (attention_grid, lambda: attention_grid(w, tokens(t), 0, mask=future_mask(t))),
        (attention_head, lambda: attention_head(w[0], tokens(t), 0, 0, mask=future_mask(t))),
        (attention_overview, lambda: attention_overview(stack, tokens(t), mask=future_mask(t))),
        (probabilities, lambda: probabilities(["a", "b"], np.array([0.5, 0.5]))),
        (loss_curve, lambda: loss_curve(np.arange(3), np.ones(3))),
        (positional_table, lambda: positional_table(sinusoidal(4, 4), "sinusoidal")),
        (positional_similarity, lambda: positional_similarity(np.eye(3))),
        (no_positional_encoding, no_positional_encoding),
        (message_figure, lambda: message_figure("hello")),
    ]
    for fn, call in calls:
        assert typing.get_type_hints(fn)["return"] is FigureSpec, fn.__name__
        assert type(call()) is FigureSpec, fn.__name__
    assert typing.get_type_hints(attention_view)["return"] is FigureSpec
    common = {"layer": 0, "head": None, "causal": True}
    drawn = attention_view(np.stack([w]), np.stack([s]), tokens(t), view="all layers", overview_max_tokens=t, **common)
    refused = attention_view(np.stack([w]), None, tokens(t), view="all layers", overview_max_tokens=t - 1, **common)
    assert type(drawn) is FigureSpec and type(refused) is FigureSpec


def test_every_public_builder_returns_one_figure_type():
    """One figure type leaves viz: every public function that draws returns a FigureSpec, never a go.Figure
    (with_filename hands back the figure it was given). A new builder must be added to `calls` below."""
    from types import SimpleNamespace

    t = 5
    w, s = softmax_attention(2, t)
    stack = np.stack([w, w])
    role = SimpleNamespace(key="prev", name="previous-token", formula="A[i, i-1]", threshold=0.5)
    roles_a, roles_b = {"prev": np.full((2, 2), 0.25)}, {"prev": np.full((2, 2), 0.75)}
    probs = np.full((3, 4), 0.25)
    calls = {
        "attention_grid": lambda: attention_grid(w, tokens(t), 0, mask=future_mask(t)),
        "attention_head": lambda: attention_head(w[0], tokens(t), 0, 0, mask=future_mask(t)),
        "attention_overview": lambda: attention_overview(stack, tokens(t), mask=future_mask(t)),
        "attention_view": lambda: attention_view(stack, None, tokens(t), layer=0, head=None, view="all layers",
                                                 causal=True, overview_max_tokens=t - 1),
        "attention_difference": lambda: viz.attention_difference(w - w[::-1], tokens(t), layer=0, causal=True),
        "compare_distributions": lambda: viz.compare_distributions(list("abcd"), probs[0], probs[1]),
        "lens_grid": lambda: viz.lens_grid(probs, list("abcd"), top=2),
        "role_overview": lambda: viz.role_overview(roles_a, [role]),
        "score_changes": lambda: viz.score_changes(roles_a, roles_b, [role]),
        "score_curves": lambda: viz.score_curves(np.arange(3), np.full((3, 2, 2), 0.5), score="previous-token",
                                                 formula="A[i, i-1]", threshold=0.5),
        "probabilities": lambda: probabilities(["a", "b"], np.array([0.5, 0.5])),
        "loss_curve": lambda: loss_curve(np.arange(3), np.ones(3)),
        "positional_table": lambda: positional_table(sinusoidal(4, 4), "rope"),
        "positional_similarity": lambda: positional_similarity(np.eye(3)),
        "no_positional_encoding": no_positional_encoding,
        "message_figure": lambda: message_figure("hello"),
        "layer_heads": lambda: viz.layer_heads(w, tokens(t), 0),
        "head_thumbnails": lambda: viz.head_thumbnails(stack, tokens(t)),
    }
    figure_types = {FigureSpec, go.Figure, viz.Figure}
    builders = set()
    for name in viz.__all__:
        fn = getattr(viz, name)
        if not callable(fn) or isinstance(fn, type):
            continue
        hint = typing.get_type_hints(fn).get("return")
        if hint in figure_types or set(typing.get_args(hint)) & figure_types:
            builders.add(name)
    assert builders - calls.keys() == {"with_filename"}
    assert calls.keys() <= builders
    for name, call in calls.items():
        assert typing.get_type_hints(getattr(viz, name))["return"] is FigureSpec, name
        fig = call()
        assert type(fig) is FigureSpec, name
        assert json.loads(plot_json(fig))["layout"], name
    spec = probabilities(["a"], np.array([1.0]))
    assert viz.with_filename(spec, "x") is spec


# ----------------------------------------------------------------------------- attention_view


def _stack(layers: int = 2, heads: int = 3, t: int = 7) -> tuple[np.ndarray, np.ndarray]:
    pairs = [softmax_attention(heads, t, seed=layer) for layer in range(layers)]
    return np.stack([w for w, _ in pairs]), np.stack([s for _, s in pairs])


def test_attention_views_are_exported_once():
    assert ATTENTION_VIEWS == ("weights", "scores", "all layers", "heads as lines", "head thumbnails")
    assert viz.ATTENTION_VIEWS is viz.attention.ATTENTION_VIEWS


@pytest.mark.parametrize("view", ATTENTION_VIEWS)
@pytest.mark.parametrize("head", [None, 0, 2])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_view_matches_the_underlying_figure(view, head, causal):
    t, layer = 7, 1
    weights, scores = _stack(t=t)
    toks = tokens(t)
    mask = future_mask(t) if causal else None
    if not causal:  # unmasked (bidirectional) inputs: finite everywhere
        scores = np.nan_to_num(scores, neginf=-5.0)
    fig = attention_view(weights, scores, toks, layer=layer, head=head, view=view, causal=causal,
                         overview_max_tokens=48)
    if view == "all layers":
        expected = attention_overview(weights, toks, mask=mask, width_px=1200)
    elif view == viz.LINES_VIEW:
        expected = viz.layer_heads(weights[layer], toks, layer, head=head, causal=causal)
    elif view == viz.THUMBNAILS_VIEW:
        expected = viz.head_thumbnails(weights, toks, causal=causal, selected=(layer, head), width_px=1200)
    else:
        mats = scores if view == "scores" else weights
        if head is None:
            expected = attention_grid(mats[layer], toks, layer, kind=view, mask=mask, width_px=1200)
        else:
            expected = attention_head(mats[layer][head], toks, layer, head, kind=view, mask=mask)
    assert plot_json(fig) == plot_json(expected)


def test_attention_view_width_and_scores_optional():
    weights, _ = _stack(t=6)
    fig = attention_view(weights, None, tokens(6), layer=0, head=None, view="weights", causal=True,
                         overview_max_tokens=48, width_px=800)
    assert plot_json(fig) == plot_json(attention_grid(weights[0], tokens(6), 0, mask=future_mask(6), width_px=800))


def test_attention_view_overview_limit():
    t = 9
    weights, scores = _stack(layers=3, heads=4, t=t)
    args = (weights, scores, tokens(t))
    at_limit = attention_view(*args, layer=0, head=None, view="all layers", causal=True, overview_max_tokens=t)
    assert attention_panels(at_limit).shape == (12, t, t)
    past = attention_view(*args, layer=0, head=1, view="all layers", causal=True, overview_max_tokens=t - 1)
    assert isinstance(past, FigureSpec)
    text = sent(past)["layout"]["annotations"][0]["text"]
    assert text == f"The overview draws 3×4 panels; it needs ≤ {t - 1} tokens (there are {t}). Pick a layer instead."
    # the limit applies to the overview only; a layer is still drawn
    one_layer = attention_view(*args, layer=2, head=None, view="weights", causal=True, overview_max_tokens=t - 1)
    assert attention_panels(one_layer).shape == (4, t, t)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"view": "probs"}, "view must be one of 'weights', 'scores', 'all layers', 'heads as lines', "
                            "'head thumbnails', got 'probs'"),
        ({"layer": 2}, "layer 2 out of range: the model has 2 layers"),
        ({"layer": -1}, "layer -1 out of range"),
        ({"layer": 1.0}, "layer must be a whole number"),
        ({"layer": True}, "layer must be a whole number"),
        ({"head": 3}, "head 3 out of range: each layer has 3 heads"),
        ({"head": -1, "view": "all layers"}, "head -1 out of range"),
        ({"scores": None, "view": "scores"}, "view 'scores' needs the attention scores"),
        ({"scores": np.zeros((2, 3, 6, 6))}, r"scores have shape \(2, 3, 6, 6\) but weights have shape \(2, 3, 7, 7\)"),
        ({"weights": np.zeros((3, 7, 7))}, r"weights must be 4-D \(layers, heads, T, T\) or equal \(heads, T, T\) arrays"),
        ({"weights": np.zeros((2, 3, 7, 6))}, "weights is 7×6"),
        ({"tokens": list("abc")}, "attention is 7×7 but 3 token labels"),
        ({"overview_max_tokens": 0}, "overview_max_tokens must be a positive whole number"),
    ],
)
def test_attention_view_rejects_bad_input(change, message):
    weights, scores = _stack(t=7)
    kwargs = {"weights": weights, "scores": scores, "tokens": tokens(7), "layer": 0, "head": None,
              "view": "weights", "causal": True, "overview_max_tokens": 48, **change}
    with pytest.raises(ValueError, match=message):
        attention_view(**kwargs)


def test_the_top_of_a_whole_vocabulary_is_the_full_sort_s_top():
    """viz.sampling.first_ranked sorts only the entries near the top: it must pick exactly what the full
    stable lexsort of a vocabulary picks, ties (in the key, and in both keys) and NaNs included."""
    from viz.sampling import first_ranked

    rng = np.random.default_rng(0)
    for trial in range(200):
        n = int(rng.integers(1, 400))
        key = rng.integers(0, 6, n).astype(np.float64) / 5  # few values: many ties
        tie = rng.integers(0, 3, n).astype(np.float64)
        if trial % 7 == 0:
            key[rng.integers(0, n, max(1, n // 3))] = np.nan
        for k in (1, 3, 10, n, n + 5):
            want = np.lexsort((-tie, -key))[:k]
            np.testing.assert_array_equal(first_ranked(key, tie, k), want)
