"""Readable at GPT-2 small's sizes (768 wide, 12 × 12 heads, 50,257 tokens, a 23-token text): one rule per
test, read from the JSON the browser receives. The same figures drawn in a real Chromium on a GPT-2-shaped
folder: tests/browser/test_browser_gpt2_sizes.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import viz
from tests.support.figures import axis, sent, softmax_attention
from viz import attention_view, message_figure, overview_refusal, probabilities, probability_text
from viz._common import text_width_em
from viz.attention_colour import bar_ticks
from viz.inside import dot_products, head_matrices, softmax_row, thinned_ticks, vector_rows

GPT2_TOKENS = ["Anna", "␣found", "␣the", "␣key", "␣under", "␣the", "␣mat", ".", "␣She", "␣gave", "␣it", "␣to",
               "␣Tom", "␣because", "␣he", "␣asked", "␣Mary", "␣and", "␣John", "␣to", "␣the", "␣store", "��"]
T = len(GPT2_TOKENS)  # 23
PROJECTOR = dict(width_px=716, max_height_px=325)  # the Explore figure at 1280×720 with Large fonts
PHONE_PX = 298  # an Inside one cell figure on a 390 px phone


def view(n_heads: int, head, **kw) -> dict:
    w, s = softmax_attention(n_heads, T)
    fig = attention_view(w[None], s[None], GPT2_TOKENS, layer=0, head=head, view="weights", causal=True,
                         overview_max_tokens=48, **kw)
    return sent(fig)["layout"]


def panel_px(layout: dict, width_px: int, k: int = 0) -> float:
    ref = layout["meta"]["panels"][k]["xaxis"]
    domain = layout[f"xaxis{ref[1:]}"]["domain"]
    return (domain[1] - domain[0]) * (width_px - layout["margin"]["l"] - layout["margin"]["r"])


def line_widths_px(text: str, font_px: float) -> list[float]:
    return [0.92 * text_width_em(line) * font_px for line in text.split("<br>")]


# ----------------------------------------------------------------------------- Inside one cell


@pytest.mark.parametrize("dims, width", [(768, 422), (768, 720), (768, PHONE_PX), (64, 422), (16, PHONE_PX)])
def test_a_vector_of_any_width_paints_its_columns(dims, width):
    """A 1-px gap between columns is drawn only where a column is at least 4 px wide: GPT-2's 768 dimensions in a
    half-page figure are under a pixel each, and a gap as wide as the column left figure 1 blank."""
    rng = np.random.default_rng(0)
    lay_fig = sent(vector_rows([("x_22 (residual in)", rng.normal(size=dims)), ("x̂_22", rng.normal(size=dims))],
                               title="1 · The inputs", width_px=width))
    trace, lay = lay_fig["data"][0], lay_fig["layout"]
    column = (width - lay["margin"]["l"] - lay["margin"]["r"]) / dims
    assert trace["xgap"] == (1 if column >= 4 else 0), (column, trace["xgap"])
    assert trace["xgap"] == 0 or column - trace["xgap"] >= 3  # a gap never eats its column


def test_long_row_labels_take_two_lines_within_the_figure_on_a_phone():
    rows = [("x̂_22 (what attention reads)", [1.0] * 768), ("what the head passed on", [0.5] * 768)]
    lay = sent(vector_rows(rows, title="1 · The inputs", subtitle="query “��” (22), key “␣the” (2)",
                           width_px=PHONE_PX))["layout"]
    labels = lay["yaxis"]["ticktext"]
    assert labels == ["x̂_22<br>(what attention reads)", "what the head<br>passed on"]
    assert max(w for label in labels for w in line_widths_px(label, 11)) <= lay["margin"]["l"]
    for text in (lay["title"]["text"], lay["title"]["subtitle"]["text"]):
        assert max(line_widths_px(text, 14)) <= PHONE_PX  # whole within the figure, not cut at its right edge


def test_a_row_of_many_keys_labels_what_fits_and_always_the_query_and_the_key():
    """27 keys on a phone: every other label (no two overlap when rotated), the query's and the clicked key's
    always; the numbers over the bars only where they fit, the clicked share's always."""
    t, query, key = 27, 26, 5
    scores = np.linspace(-1, 1, t)
    e = np.exp(scores - scores.max())
    fig = sent(softmax_row(scores, e, e / e.sum(), [chr(97 + i % 26) for i in range(t)], query=query, key=key,
                           total=float(e.sum()), width_px=PHONE_PX))
    lay, bars = fig["layout"], fig["data"][0]
    ticks = lay["xaxis"]["tickvals"]
    room = PHONE_PX - lay["margin"]["l"] - lay["margin"]["r"]
    assert query in ticks and key in ticks and len(ticks) < t
    assert min(b - a for a, b in zip(ticks, ticks[1:])) * room / t >= 11 * 1.25  # pitch ≥ the label's line
    assert [j for j, text in enumerate(bars["text"]) if text] == [key]
    wide = sent(softmax_row(scores[:8], e[:8], e[:8] / e[:8].sum(), list("abcdefgh"), query=7, key=2,
                            total=float(e[:8].sum()), width_px=720))
    assert wide["layout"]["xaxis"]["tickvals"] == list(range(8)) and all(wide["data"][0]["text"])


def test_thinned_ticks_keep_their_positions_apart():
    for n, room, keep in ((1024, 600, (1000, 3)), (64, 300, (0,)), (5, 500, ())):
        ticks = thinned_ticks(n, room, 11, keep)
        step = max(1, math.ceil(11 * 1.3 * n / room))
        assert set(keep) <= set(ticks) and (n - 1 in ticks or any(abs(n - 1 - k) < step for k in keep))
        assert all(b - a >= step for a, b in zip(ticks, ticks[1:]))


def test_the_head_as_matrices_labels_only_the_rows_that_fit():
    t, d = 64, 64
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(3, t, d))
    raw = q @ k.T
    masked = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, raw / 8)
    lay = sent(head_matrices(q, k, v, raw, raw / 8, masked, [f"w{i}" for i in range(t)], layer=0, head=0,
                             query=40, key=3, scale=0.125, width_px=900))["layout"]
    rows = lay["yaxis"]["tickvals"]
    assert 40 in rows and 3 in rows and len(rows) < t


def test_the_dot_products_numbers_stay_inside_the_figure():
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(2, 64)) * 3
    p = q * k
    fig = sent(dot_products(q, k, products=p, total=float(p.sum()), scale=0.125, score=float(p.sum()) / 8,
                            width_px=PHONE_PX))
    lay, bars = fig["layout"], fig["data"][0]
    lo, hi = lay["xaxis"]["range"]
    room = PHONE_PX - lay["margin"]["l"] - lay["margin"]["r"]
    for value, text in zip(bars["x"], bars["text"]):
        end = (value - lo) / (hi - lo) * room
        reach = end + len(text) * 0.6 * 11 if value >= 0 else end - len(text) * 0.6 * 11
        assert -lay["margin"]["l"] <= reach <= room + lay["margin"]["r"], (value, text)


# ----------------------------------------------------------------------------- probabilities in words


@pytest.mark.parametrize("p, words", [(1 / 2048, "4.9e-4"), (0.873, "0.873"), (0.0049, "0.0049"), (1.0, "1.000"),
                                      (0.0, "0"), (2e-9, "2.0e-9")])
def test_probabilities_read_as_numbers_at_every_size(p, words):
    assert probability_text(p) == words


def test_no_probability_above_zero_reads_zero():
    for p in np.logspace(-12, 0, 400):
        text = probability_text(p)
        assert float(text) > 0 and abs(float(text) - p) <= 0.06 * p, (p, text)


def test_the_chart_hover_reads_small_probabilities():
    probs = np.full(50_257, 1e-6)
    probs[7], probs[9] = 0.5, 1 / 2048
    probs /= probs.sum()
    fig = sent(probabilities([f"t{i}" for i in range(50_257)], probs, chosen=9, top=5))
    bars, row = fig["data"][0], fig["layout"]["meta"]["ids"].index(9)
    assert "%{customdata}" in bars["hovertemplate"] and bars["customdata"][row] == probability_text(probs[9])
    assert "e-4" in bars["customdata"][row]


# ----------------------------------------------------------------------------- a projector: 1280×720, Large fonts


def test_one_gpt2_head_on_a_projector_keeps_readable_cells():
    """23 tokens, one head, Large fonts: the panel ≥ 200 px (not ~115), labels 16 px on every 3rd token at most;
    the figure passes its height limit to stay so, and says so (layout.meta.raised)."""
    lay = view(1, 0, presentation=True, **PROJECTOR)
    assert panel_px(lay, 716) >= 200 and lay["meta"]["label_px"] >= 16 and lay["meta"]["label_step"] <= 3
    assert lay["meta"]["raised"] and lay["height"] > 325


def test_six_gpt2_heads_on_a_projector_keep_readable_panels():
    lay = view(12, None, presentation=True, heads=range(6), **PROJECTOR)
    assert len(lay["meta"]["panels"]) == 6
    assert min(panel_px(lay, 716, k) for k in range(6)) >= 130 and lay["meta"]["label_step"] <= 4


def test_short_texts_and_normal_fonts_keep_to_their_height():
    """The readable minimum only ever grows a figure that would be unreadable: a built-in's 13 words at Large
    fonts, and any text at normal fonts, keep within the height they are given."""
    w, s = softmax_attention(1, 13)
    short = sent(attention_view(w[None], s[None], [f"w{i}" for i in range(13)], layer=0, head=0, view="weights",
                                causal=True, overview_max_tokens=48, presentation=True, **PROJECTOR))["layout"]
    assert short["height"] <= 325 and not short["meta"]["raised"]
    normal = view(12, None, heads=range(6), width_px=716, max_height_px=355)
    assert normal["height"] <= 355 and not normal["meta"]["raised"]


def test_large_fonts_put_the_hatch_legend_under_the_colour_bar():
    lay = view(1, 0, presentation=True, **PROJECTOR)
    assert "subtitle" not in lay["title"] or "hatched" not in lay["title"]["subtitle"]["text"]
    hint = next(a for a in lay["annotations"] if "hatched" in a["text"])
    bar = lay["coloraxis"]["colorbar"]
    assert hint["x"] == bar["x"] and hint["y"] == 0 and bar["len"] < 1 and bar["yanchor"] == "top"


@pytest.mark.parametrize("bar_px", [60, 100, 180, 400])
@pytest.mark.parametrize("font", [10, 16])
def test_colour_bar_ticks_never_overlap(bar_px, font):
    ticks = bar_ticks(0.0, 1.0, 5, bar_px, font)
    assert ticks[0] == 0 and ticks[-1] == 1 and 2 <= len(ticks) <= 5
    if len(ticks) > 2:
        assert bar_px / (len(ticks) - 1) >= font * 1.6
    if bar_px >= 5 * font * 1.6:
        assert len(ticks) == 5


def test_the_colour_bar_of_a_projector_grid_labels_what_fits():
    lay = view(12, None, presentation=True, heads=range(6), **PROJECTOR)
    plot_h = lay["height"] - lay["margin"]["t"] - lay["margin"]["b"]
    bar = lay["coloraxis"]["colorbar"]
    ticks = bar["tickvals"]
    assert (len(ticks) - 1) * bar["tickfont"]["size"] * 1.6 <= plot_h * bar.get("len", 1.0) + 1


def test_panel_titles_fit_over_their_panels():
    lay = view(12, None, presentation=True, heads=range(6), badges={1: "induction", 2: "previous-token"},
               **PROJECTOR)
    panel = panel_px(lay, 716)
    titles = [a["text"] for a in lay["annotations"] if a["text"].startswith("head")]
    assert "head 1<br>induction" in titles
    assert max(w for title in titles for w in line_widths_px(title, 17)) <= panel + 18


def test_the_chart_lists_five_candidates_on_a_projector():
    rng = np.random.default_rng(3)
    probs = rng.random(50_257) ** 8
    probs /= probs.sum()
    adjusted = probs ** 1.25 / (probs ** 1.25).sum()
    lay = sent(probabilities([f"t{i}" for i in range(50_257)], probs, adjusted=adjusted, chosen=int(probs.argmax()),
                             top=10, presentation=True, max_height_px=240))["layout"]
    assert len(lay["yaxis"]["ticktext"]) >= 5 and lay["height"] <= 240


# ----------------------------------------------------------------------------- all layers on 12 × 12


def test_all_layers_of_12_by_12_says_why_in_lines_that_fit():
    w = np.stack([softmax_attention(12, 5, seed=i)[0] for i in range(12)])
    lay = sent(attention_view(w, None, [f"t{i}" for i in range(5)], layer=0, head=None, view="all layers",
                              causal=True, overview_max_tokens=48, width_px=716, presentation=True))["layout"]
    note = lay["annotations"][0]
    reason = overview_refusal(12, 12, 5)
    assert note["text"].replace("<br>", " ") == reason and "<br>" in note["text"]
    assert max(line_widths_px(note["text"], note["font"]["size"])) <= 716 - 40
    assert lay["height"] >= (note["text"].count("<br>") + 1) * note["font"]["size"] * 1.3
    assert overview_refusal(4, 4, 5) is None and "tokens" in overview_refusal(4, 4, 60)
    # a message without a width is left as it is written
    assert message_figure("one long line " * 10).layout["annotations"][0]["text"] == "one long line " * 10


def test_axis_font_of_one_head_is_shared_by_both_axes():
    lay = view(1, 0, presentation=True, **PROJECTOR)
    assert axis(lay, "xaxis")["tickfont"]["size"] == axis(lay, "yaxis")["tickfont"]["size"] >= 16
    assert viz.READABLE_TICK_PX <= 16


# ----------------------------------------------------------------------------- the head tools on a phone


@pytest.mark.parametrize("width", [326, 720])
def test_the_logit_lens_names_its_ranks_in_what_fits(width):
    """13 rows (embedding and 12 layers) over 50,257 tokens: "rank 3" over a column wide enough, "#3" on a phone,
    so the five labels never run into each other; the title breaks into lines within the figure."""
    rng = np.random.default_rng(4)
    probs = rng.random((13, 50_257)) ** 12
    probs /= probs.sum(1, keepdims=True)
    rows = ["embedding"] + [f"after layer {i}" for i in range(1, 13)]
    title = "Logit lens after “��” (position 22): the prediction read out after each layer"
    lay = sent(viz.lens_grid(probs, [f"t{i}" for i in range(50_257)], row_labels=rows, width_px=width,
                             title=title))["layout"]
    assert lay["title"]["text"].replace("<br>", " ") == title
    assert max(line_widths_px(lay["title"]["text"], lay["title"]["font"]["size"])) <= width - 20
    labels = lay["xaxis"]["ticktext"]
    column = (width - lay["margin"]["l"] - lay["margin"]["r"]) / 5
    assert labels == ([f"rank {k}" for k in range(1, 6)] if width == 720 else [f"#{k}" for k in range(1, 6)])
    assert max(len(label) for label in labels) * 0.6 * 11 < column


@pytest.mark.parametrize("width, numbers", [(326, False), (1302, True)])
def test_a_12_by_12_head_map_prints_numbers_only_where_they_fit(width, numbers):
    """On a phone twelve heads leave a cell ~24 px: numbers like "0.13" would run into each other, so the cells
    show their colour only (hover gives each number); on a wide page each cell prints its score."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Role:
        key: str
        name: str
        formula: str
        threshold: float | None

    rng = np.random.default_rng(5)
    roles = [Role("previous_token", "previous-token", "mean of A[i, i−1]", 0.5), Role("entropy", "entropy", "H", None)]
    fig = sent(viz.role_overview({r.key: rng.random((12, 12)) for r in roles}, roles, width_px=width))
    for trace in fig["data"]:
        assert trace["texttemplate"] == ("%{text}" if numbers else "")
        assert len(trace["hovertext"]) == 12  # every cell still hovers with its number


@pytest.mark.parametrize("width, presentation, columns", [(1300, False, 3), (1200, True, 3), (390, False, 1)])
def test_the_roles_map_of_thousands_of_heads_is_compact(width, presentation, columns):
    """80 layers × 64 heads (5,120, past viz.heads.COMPACT_HEADS): the five maps three a row on a wide page
    (one on a phone), about a screen tall, cells of at least COMPACT_CELL_PX, a label every few heads
    and layers that does not overlap, no per-cell outlines or dashes, and every cell still hovers and clicks."""
    from types import SimpleNamespace as Role

    from viz.heads import COMPACT_CELL_PX, COMPACT_HEADS

    rng = np.random.default_rng(7)
    keys = ("previous_token", "first_token", "self_attention", "induction", "entropy")
    roles = [Role(key=k, name=k, formula="f", threshold=None if k == "entropy" else 0.5) for k in keys]
    scores = {k: rng.random((80, 64)) for k in keys}
    scores["induction"][:] = np.nan  # undefined on this text: no dash in 5,120 cells
    assert 80 * 64 >= COMPACT_HEADS > 12 * 12
    fig = sent(viz.role_overview(scores, roles, width_px=width, presentation=presentation, selected=(3, 5),
                                 marked=[(0, 1)]))
    lay = fig["layout"]
    xs = {round(lay[f"xaxis{'' if k == 0 else k + 1}"]["domain"][0], 3) for k in range(5)}
    assert len(xs) == columns
    cell_w = panel_px(lay, width) / 64
    assert cell_w >= COMPACT_CELL_PX
    assert lay["height"] <= (1400 if columns == 3 else 2800)  # 5,120 heads × 5 scores, not 15,000 px of panels
    x, y = lay["xaxis"], lay["yaxis"]
    assert 1 < len(x["tickvals"]) < 64 and 1 < len(y["tickvals"]) < 80
    step = x["tickvals"][1] - x["tickvals"][0]
    font = x["tickfont"]["size"]
    assert step * cell_w >= text_width_em("H63") * font  # the labels do not overlap
    assert not any(s.get("line", {}).get("color") == "#000" for s in lay.get("shapes", []))
    assert len(lay.get("shapes", [])) <= 5 * 4  # the selected head's outline per panel, nothing per cell
    assert not any(a.get("text") == "–" for a in lay.get("annotations", []))
    for trace in fig["data"]:
        assert trace["texttemplate"] == "" and trace["xgap"] == 0
        assert len(trace["hovertext"]) == 80 and len(trace["customdata"]) == 80
