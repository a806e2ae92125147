"""Layers with many heads (GPT-2's 12): a page of a layer's heads and the all-layers view past what
fits, checked on the figures the browser receives (the Head menu's pages: tests/ui/test_head_menu.py).
"""

from __future__ import annotations

import numpy as np

from viz import attention_panels, attention_view, future_mask

from tests.support.figures import all_strings, axis, sent, softmax_attention

STEP = 0.0005 + 1e-9  # milli-unit quantisation: half a step


def stack(layers: int, heads: int, t: int) -> np.ndarray:
    return np.stack([softmax_attention(heads, t, seed=layer)[0] for layer in range(layers)])


def test_a_page_of_heads_draws_those_heads_and_names_them():
    t, weights = 9, stack(2, 12, 9)
    tokens = [f"t{i}" for i in range(t)]
    fig = attention_view(weights, None, tokens, layer=1, head=None, view="weights", causal=True,
                         overview_max_tokens=48, width_px=760, max_height_px=515, heads=range(6, 12))
    layout = sent(fig)["layout"]
    assert [p["head"] for p in layout["meta"]["panels"]] == list(range(6, 12))
    assert layout["title"]["text"] == "Layer 1 attention weights: heads 6–11 of 12"
    seen, upper = attention_panels(fig), future_mask(t)
    assert np.abs(seen[:, ~upper] - weights[1, 6:][:, ~upper]).max() <= STEP  # each panel is its own head
    assert "head 6" in all_strings(layout["annotations"]) and "head 0" not in all_strings(layout["annotations"])
    # without a page: every head, and the title as it always was
    whole = sent(attention_view(weights[:, :4], None, tokens, layer=1, head=None, view="weights", causal=True,
                                overview_max_tokens=48, width_px=760, max_height_px=515))["layout"]
    assert whole["title"]["text"] == "Layer 1 attention weights"


def test_a_page_of_six_in_a_low_figure_keeps_readable_panels():
    """At a projector's height with large fonts one row of six would leave each panel ~60 px: the six take two
    rows of three at their readable size instead (the figure grows past the height; layout.meta.raised), and the
    key axis's title still fits beside the figure's left edge."""
    t, weights = 20, stack(1, 12, 20)
    fig = attention_view(weights, None, [f"t{i}" for i in range(t)], layer=0, head=None, view="weights",
                         causal=True, overview_max_tokens=48, width_px=716, max_height_px=325, presentation=True,
                         heads=range(6))
    layout = sent(fig)["layout"]
    tops = {tuple(axis(layout, p["yaxis"].replace("y", "yaxis"))["domain"]) for p in layout["meta"]["panels"]}
    assert len(tops) == 2  # two rows of three
    assert layout["meta"]["raised"] and layout["height"] > 325 and layout["meta"]["label_step"] <= 3
    assert axis(layout, "xaxis4")["title"]["text"] in ("key position", "key position (attended to)")  # under row 2


def test_all_layers_past_16_panels_points_to_the_head_roles_map():
    t = 5
    tokens = [f"t{i}" for i in range(t)]
    many = attention_view(stack(12, 12, t), None, tokens, layer=0, head=None, view="all layers", causal=True,
                          overview_max_tokens=48)
    text = " ".join(all_strings(sent(many)["layout"]))
    assert "12 layers × 12 heads are too many panels" in text and "Head roles map" in text
    four = sent(attention_view(stack(4, 4, t), None, tokens, layer=0, head=None, view="all layers", causal=True,
                               overview_max_tokens=48))["layout"]
    assert len(four["meta"]["panels"]) == 16  # 4 × 4 is still drawn
