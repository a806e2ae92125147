"""The views of many heads in the Explore handlers, on a random GPT-2 of 12 layers × 12 heads opened as a
folder: "heads as lines" draws the weights the model used (against transformers' own forward), follows a
clicked token, and its caption tells the truth; "head thumbnails" draws every head's weights, and a
click on a thumbnail opens that head as weights.
"""

from __future__ import annotations

import json

import gradio as gr
import numpy as np
import pytest
import torch

import viz
from lab.catalogue.external import ExternalModels, parse_source
from lab.session import Session
from tests.support.families import save_reference, sharpen
from ui import explore, heads

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

PROMPT = "Once upon a time there was a little fox. The fox liked to"
GREEDY = (0.0, 0, 1.0, 0)  # temperature, top-k, top-p, seed


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(transformers' model, its name in the lab's list, the lab's models) for a 12 × 12 random GPT-2."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tmp = tmp_path_factory.mktemp("lines")
    cfg = GPT2Config(n_positions=64, vocab_size=300, n_embd=24, n_layer=12, n_head=12, bos_token_id=1,
                     eos_token_id=0, attn_implementation="eager")
    torch.manual_seed(0)
    ref = GPT2LMHeadModel(cfg).eval()
    sharpen(ref, seed=3, conv1d=True)
    external = ExternalModels([parse_source(str(save_reference(ref, tmp / "gpt2-12x12", 300)))], tmp / "hashes.json")
    return ref, external.names[0], external


@pytest.fixture
def stepped(gpt2):
    """A session that took one greedy Step on the prompt, drawn as lines of layer 5."""
    ref, name, external = gpt2
    s = Session()
    s.external = external
    out = explore.step(s, name, PROMPT, *GREEDY, 5, "all", viz.LINES_VIEW)
    return s, name, ref, out


def figure(plot) -> dict:
    return json.loads(plot.plot if hasattr(plot, "plot") else plot["plot"])


def key_weights(fig: dict) -> np.ndarray:
    """(heads, keys) weights of the query drawn, read from the keys' hover."""
    (hover,) = [tr for tr in fig["data"] if "customdata" in tr]
    return viz.decode_array(hover["customdata"]).T


def reference(ref, window: list[int]) -> list[np.ndarray]:
    with torch.inference_mode():
        out = ref(torch.tensor([window]), output_attentions=True)
    return [a[0].numpy() for a in out.attentions]


def test_a_step_draws_the_last_tokens_lines_as_the_model_weighed_them(stepped):
    s, name, ref, (_, tokens, _, _, plot) = stepped
    fig = figure(plot)
    window = list(s.decoder.window)
    t = len(window)
    assert fig["layout"]["meta"]["viz"] == "layer_heads" and fig["layout"]["meta"]["query"] == t - 1
    drawn = key_weights(fig)
    np.testing.assert_array_equal(drawn, s.attention().weights[5][:, t - 1, :])  # the record the heatmaps draw
    np.testing.assert_allclose(drawn, reference(ref, window)[5][:, t - 1, :], atol=1e-5)  # what the model used
    assert fig["layout"]["yaxis2"]["ticktext"] == [viz.short_token(piece) for piece, _ in tokens]
    caption = explore.view_caption(s, name, 5, "all", viz.LINES_VIEW)
    w = s.attention().weights[5][:, t - 1]
    h, k = np.unravel_index(int(w.argmax()), w.shape)
    assert f"in head {h} ({w[h, k]:.2f})" in caption and "all 12 heads" in caption


def test_a_clicked_token_redraws_the_lines_from_it_and_other_views_wait(stepped):
    s, name, ref, _ = stepped
    click = gr.SelectData(None, {"index": 7, "value": "", "selected": True})
    fig = figure(explore.lines_from_token(s, 5, 3, viz.LINES_VIEW, click))
    assert fig["layout"]["meta"]["query"] == 7 and s.query == 7
    np.testing.assert_array_equal(key_weights(fig), s.attention().weights[5][:, 7, :8])
    np.testing.assert_allclose(key_weights(fig), reference(ref, list(s.decoder.window))[5][:, 7, :8], atol=1e-5)
    # the layer menu keeps the token: the redrawn view starts from it too
    again, _ = explore.redraw_view(s, name, 2, "all", viz.LINES_VIEW)
    assert figure(again)["layout"]["meta"]["query"] == 7 and figure(again)["layout"]["meta"]["layer"] == 2
    for view in ("weights", "scores", "all layers", viz.THUMBNAILS_VIEW):
        assert isinstance(explore.lines_from_token(s, 5, 3, view, click), type(gr.skip()))
    with pytest.raises(gr.Error):  # a position the text does not have
        explore.lines_from_token(s, 5, 3, viz.LINES_VIEW, gr.SelectData(None, {"index": 99, "value": "",
                                                                             "selected": True}))
    assert s.query == 7


def test_the_thumbnails_draw_every_heads_weights_and_a_click_opens_the_head(stepped):
    s, name, ref, _ = stepped
    plot, caption = explore.redraw_view(s, name, 9, 4, viz.THUMBNAILS_VIEW)
    fig = figure(plot)
    meta = fig["layout"]["meta"]
    assert meta["viz"] == "head_thumbnails" and (meta["layers"], meta["heads"]) == (12, 12)
    assert meta["selected"] == [9, 4]
    t = meta["T"]
    (heat,) = [tr for tr in fig["data"] if tr["type"] == "heatmap"]
    z = viz.decode_array(heat["z"])
    n, stride, edges = meta["cells"], meta["cells"] + meta["gap"], meta["edges"]
    assert n <= t and edges[0] == 0 and edges[-1] == t
    weights = reference(ref, list(s.decoder.window))
    future = np.triu(np.ones((t, t), dtype=bool), 1)
    for layer, head in ((0, 0), (9, 4), (11, 11)):
        cells = z[layer * stride: layer * stride + n, head * stride: head * stride + n]
        for mine, tol in ((s.attention().weights[layer][head], 0.0), (weights[layer][head], 1e-5 * 250)):
            w = np.where(future, np.nan, mine)
            for i in range(n):  # each cell: the largest weight of its block of queries × keys (×250, rounded)
                for j in range(i + 1):
                    block = w[edges[i]:edges[i + 1], edges[j]:edges[j + 1]]
                    assert abs(cells[i, j] - np.nanmax(block) * 250) <= 0.5 + tol, (layer, head, i, j)
    assert "All 12 × 12 heads" in caption and "click one to open it" in caption
    # the click: the page sends "layer,head" (assets/explore.js); the head opens as weights
    assert heads.pick_head(s, "9,4", False, [], name, viz.THUMBNAILS_VIEW) == (9, 4, gr.skip(), "weights")
    assert heads.pick_head(s, "9,4", False, [], name, viz.LINES_VIEW)[3] == gr.skip()


def test_the_colour_menu_leaves_these_views_as_weights(stepped):
    s, name, _, _ = stepped
    explore.set_display(s, "value", False, None, 5, "all", viz.LINES_VIEW)
    for view in (viz.LINES_VIEW, viz.THUMBNAILS_VIEW):
        assert "‖a·v W_O‖" not in explore.view_caption(s, name, 5, "all", view)
    assert "‖a·v W_O‖" in explore.view_caption(s, name, 5, "all", "weights")
