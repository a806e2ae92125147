"""The views of many heads at once in a real Chromium, on a random GPT-2 of 12 layers × 12 heads opened with
`python app.py --model FOLDER`: "heads as lines" draws, in one hue a head, a line from the selected token
to each key it weighs (what plotly drew is read back from the page and held to transformers' own forward),
follows a clicked token and keeps the heads its legend hid; "head thumbnails" draws every head, and a
real click on a thumbnail opens that head as weights. Both fit 1366×900, 1280×720 (also with Large fonts)
and a 390 px phone, light and dark, and are saved as screenshots.

Every check waits for what it reads; nothing depends on how fast the machine is.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.browser import ANSWER_MS, Page
from tests.support.explore_page import PLOT, open_page
from tests.support.families import hf_tokenizer, save_reference, sharpen
from tests.support.heads_page import greedy
from tests.support.plot_click import click_plot
from tests.support.server import AppServer

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FOLDER = "gpt2-12x12"
MODEL = f"{FOLDER} (folder)"
PROMPT = "Once upon a time there was a little fox. The fox liked to run"
LINES, THUMBS = "heads as lines", "head thumbnails"


@pytest.fixture(scope="module")
def lines_server(tmp_path_factory):
    """The app with a random GPT-2 of 12 layers × 12 heads added by --model, and (transformers' model, the
    window of ids a greedy Step on PROMPT gives)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tmp = tmp_path_factory.mktemp("layer_heads")
    cfg = GPT2Config(n_positions=64, vocab_size=300, n_embd=24, n_layer=12, n_head=12, bos_token_id=1,
                     eos_token_id=0, attn_implementation="eager")
    torch.manual_seed(0)
    ref = GPT2LMHeadModel(cfg).eval()
    sharpen(ref, seed=3, conv1d=True)
    folder = save_reference(ref, tmp / FOLDER, 300)
    ids = hf_tokenizer(folder)(PROMPT)["input_ids"]
    with torch.inference_mode():
        ids = ids + [int(ref(torch.tensor([ids])).logits[0, -1].argmax())]
    server = AppServer({"DECODER_LAB_BUSY_WAIT_S": "600"}, tmp, args=["--model", str(folder)]).start()
    yield server, ref, ids
    server.stop()


def attention(ref, ids: list[int]) -> list[np.ndarray]:
    with torch.inference_mode():
        return [a[0].numpy() for a in ref(torch.tensor([ids]), output_attentions=True).attentions]


# The centre of the thumbnail of layer 9, head 4 (a plot_click `where` function of the figure and its meta).
THUMB = """(gd, s) => { const L = gd._fullLayout, c = (s.cells - 1) / 2, stride = s.cells + s.gap;
  return {x: L.xaxis._offset + L.xaxis.l2p(4 * stride + c), y: L.yaxis._offset + L.yaxis.l2p(9 * stride + c),
          xaxis: L.xaxis._id, yaxis: L.yaxis._id}; }"""


def wait_meta(p: Page, what: dict) -> dict:
    """Wait until the attention figure's layout.meta holds these values; the meta."""
    p.page.wait_for_function(
        f"w => {{ const m = {PLOT}?._fullLayout?.meta;"
        " return m && Object.entries(w).every(([k, v]) => JSON.stringify(m[k]) === JSON.stringify(v)); }",
        arg=what, timeout=ANSWER_MS)
    p.page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    return p.page.evaluate(f"() => {PLOT}._fullLayout.meta")


def stepped(server, browser, width: int, height: int, large: bool = False, query: str = "") -> tuple:
    """The 12 × 12 model after one greedy Step on PROMPT: (context, page, number of tokens)."""
    context, p = open_page(server, browser, width, height, query=query)
    if large:
        p.large_fonts()
    p.choose("model", MODEL)  # its answer (its example prompt among it) before PROMPT is typed
    greedy(p)
    p.fill_text("prompt", PROMPT)
    p.click("step")
    p.page.wait_for_function(f"() => {PLOT}?._fullLayout?.meta?.T > 0", timeout=ANSWER_MS)
    p.idle()  # the chart and the head tools follow the Step
    return context, p, len(p.tokens())


# what plotly drew of the lines figure: every trace's lines (segments counted by the path's "M" commands,
# its stroke, its opacity), the keys' hover numbers, the legend's entries and the token columns' labels
DRAWN = """() => {
  const gd = document.querySelector('#attention .js-plotly-plot');
  const traces = Array.from(gd.querySelectorAll('.scatterlayer .trace'));
  const lines = traces.map((g) => { const paths = Array.from(g.querySelectorAll('path.js-line')), path = paths[0];
    const d = paths.map((e) => e.getAttribute('d') || '').join('');
    return {moves: (d.match(/M/g) || []).length, stroke: path ? path.style.stroke : null,
            alpha: path ? Number(path.style.strokeOpacity || 1) : null,
            opacity: Number(getComputedStyle(g).opacity)}; });
  const hover = gd._fullData.find((t) => t.customdata);
  return {lines, group: gd._fullData.map((t) => t.legendgroup || ''),
          keys: Array.from(hover.y), weights: Array.from(hover.customdata, (row) => Array.from(row)),
          legend: Array.from(gd.querySelectorAll('.legend .traces'), (e) => [e.textContent,
            e.querySelector('path.js-line').style.stroke, Number(getComputedStyle(e).opacity)]),
          left: Array.from(gd.querySelectorAll('g.ytick text'), (e) => e.textContent),
          right: Array.from(gd.querySelectorAll('g.y2tick text'), (e) => e.textContent)};
}"""


def test_the_lines_are_the_models_weights_in_a_hue_per_head_and_follow_a_clicked_token(lines_server, browser,
                                                                                       shots):
    server, ref, ids = lines_server
    context, p, n = stepped(server, browser, 1366, 900)
    try:
        assert n == len(ids)
        p.choose("layer", "layer 5")
        p.choose("view", LINES)
        wait_meta(p, {"viz": "layer_heads", "layer": 5, "query": n - 1})
        drawn = p.page.evaluate(DRAWN)
        weights = attention(ref, ids)[5]
        assert drawn["keys"] == list(range(n))
        np.testing.assert_allclose(np.array(drawn["weights"]).T, weights[:, n - 1, :], atol=1e-5)
        # one legend entry a head, each its own colour, all shown
        assert [e[0] for e in drawn["legend"]] == [str(h) for h in range(12)]
        assert len({e[1] for e in drawn["legend"]}) == 12 and all(e[2] == 1 for e in drawn["legend"])
        # a line for every weight of at least 0.05, in its head's colour; "every token" hidden
        colour = {f"h{h}": e[1] for h, e in enumerate(drawn["legend"])}
        shown = [(g, ln) for g, ln in zip(drawn["group"], drawn["lines"]) if g and ln["opacity"] > 0]
        strong = weights[:, n - 1, :] >= 0.05
        unsure = np.abs(weights[:, n - 1, :] - 0.05) < 1e-4  # a weight this near the floor may fall either side
        moves = sum(ln["moves"] for _, ln in shown)  # the legend's entries and the dots draw no line here
        assert strong.sum() - unsure.sum() <= moves <= strong.sum() + unsure.sum()
        for g, ln in shown:
            if ln["moves"]:  # in its head's colour, at an opacity of tenths
                assert ln["stroke"] == colour[g] and round(ln["alpha"] * 10, 6) in range(1, 11)
        assert drawn["right"] == p.tokens() and len(drawn["left"]) == n
        p.page.mouse.move(5, 5)
        p.page.screenshot(path=str(shots / "layer-heads-lines-1366x900.png"))
        # hide head 3 in the legend, then click the 8th token: its lines are drawn, head 3 stays hidden
        p.page.locator("#attention .legend .traces").nth(3).click()
        p.page.wait_for_function(f"() => {PLOT}._fullData.filter(t => t.legendgroup === 'h3')"
                                 ".every(t => t.visible === 'legendonly')", timeout=ANSWER_MS)
        p.page.locator("#tokens .textfield .token").nth(7).click()
        wait_meta(p, {"viz": "layer_heads", "query": 7})
        p.page.wait_for_function(f"() => {{ const d = {PLOT}._fullData;"
                                 " return d.filter(t => t.legendgroup === 'h3').every(t => t.visible === 'legendonly')"
                                 " && d.filter(t => t.legendgroup === 'h4').every(t => t.visible === true); }",
                                 timeout=ANSWER_MS)
        drawn = p.page.evaluate(DRAWN)
        assert drawn["keys"] == list(range(8))
        np.testing.assert_allclose(np.array(drawn["weights"]).T, weights[:, 7, :8], atol=1e-5)
        # hovering a key lists every head's weight on it
        xy = p.page.evaluate(f"""() => {{ const gd = {PLOT}, L = gd._fullLayout;
            const box = gd.querySelector('.main-svg').getBoundingClientRect();
            return [box.x + L.xaxis._offset + L.xaxis._length, box.y + L.yaxis2._offset + L.yaxis2.l2p(2)]; }}""")
        p.page.mouse.move(*xy)
        p.page.wait_for_selector("#attention .hoverlayer .hovertext", timeout=ANSWER_MS)
        label = p.page.locator("#attention .hoverlayer .hovertext").first.text_content()
        assert "weight in head" in label and f"{weights[0, 7, 2]:.3f}" in label and "(7)" in label
        assert p.console_errors == []
    finally:
        context.close()


def test_a_thumbnail_shows_its_heads_weights_and_a_click_opens_it(lines_server, browser, shots):
    server, ref, ids = lines_server
    context, p, n = stepped(server, browser, 1366, 900)
    try:
        p.choose("view", THUMBS)
        meta = wait_meta(p, {"viz": "head_thumbnails", "layers": 12, "heads": 12, "T": n})
        assert p.page.locator("#attention g.hm image").count() == 1  # the whole grid: one image
        z = np.array(p.page.evaluate(f"() => Array.from({PLOT}._fullData[0].z, r => Array.from(r))"))
        side, stride, edges = meta["cells"], meta["cells"] + meta["gap"], meta["edges"]
        w = attention(ref, ids)[9][4]
        cells = z[9 * stride: 9 * stride + side, 4 * stride: 4 * stride + side]
        for i in range(side):
            for j in range(i + 1):  # each cell: the largest weight of its block, × 250
                block = w[edges[i]:edges[i + 1], edges[j]:edges[j + 1]]
                block = np.where(np.tril(np.ones((n, n), bool))[edges[i]:edges[i + 1], edges[j]:edges[j + 1]],
                                 block, -1)
                assert abs(cells[i, j] - block.max() * 250) <= 0.5 + 1e-3
        p.page.mouse.move(5, 5)
        p.page.screenshot(path=str(shots / "layer-heads-thumbnails-1366x900.png"))
        xy = p.page.evaluate(f"""s => {{ const gd = {PLOT}, box = gd.querySelector('.main-svg').getBoundingClientRect();
            const w = ({THUMB})(gd, s); return [box.x + w.x, box.y + w.y]; }}""", meta)
        p.page.mouse.move(*xy)
        p.page.wait_for_selector("#attention .hoverlayer .hovertext", timeout=ANSWER_MS)
        assert "layer 9, head 4" in p.page.locator("#attention .hoverlayer .hovertext").first.text_content()
        assert click_plot(p, "attention", THUMB, meta, record="pick") == "9,4"
        p.page.wait_for_function("() => document.querySelector('#layer input').value === 'layer 9'"
                                 " && document.querySelector('#head input').value === 'head 4'"
                                 " && document.querySelector('#view input').value === 'weights'", timeout=ANSWER_MS)
        p.page.wait_for_function(f"() => ({PLOT}._fullLayout.title.text || '').includes('Layer 9, head 4')",
                                 timeout=ANSWER_MS)
        assert p.console_errors == []
    finally:
        context.close()


# the attention figure, the text and the chart on the screen, and every label, the legend and the buttons
# of the figure inside it
FITS = """([w, h, phone]) => {
  const box = (e) => e.getBoundingClientRect();
  const inside = (b, o) => b.top >= o.top - 1 && b.bottom <= o.bottom + 1 && b.left >= o.left - 1
                           && b.right <= o.right + 1;
  const screen = {top: 0, bottom: h, left: 0, right: w};
  const gd = document.querySelector('#attention .js-plotly-plot'), svg = box(gd.querySelector('.main-svg'));
  const out = [];
  for (const sel of phone ? ['#attention .js-plotly-plot'] : ['#attention .js-plotly-plot', '#tokens',
                                                              '#probs .js-plotly-plot']) {
    if (!inside(box(document.querySelector(sel)), screen)) out.push(sel);
  }
  for (const e of gd.querySelectorAll('.ytick text, .y2tick text, .xtick text, .legend .bg, .updatemenu-button,'
                                      + ' .gtitle, .annotation-text')) {
    const b = box(e);
    if (b.width > 0 && !inside(b, svg)) out.push(e.textContent || e.getAttribute('class'));
  }
  return out;
}"""


@pytest.mark.parametrize("size, large", [((1366, 900), False), ((1280, 720), False), ((1280, 720), True),
                                         ((390, 844), False)], ids=["1366x900", "1280x720", "1280x720-large", "390"])
def test_both_views_fit_each_screen_light_and_dark(lines_server, browser, shots, size, large):
    server, _, _ = lines_server
    context, p, n = stepped(server, browser, *size, large=large)
    phone = size[0] < 500
    name = f"{size[0]}x{size[1]}" + ("-large" if large else "")
    try:
        for view, what in ((LINES, "layer_heads"), (THUMBS, "head_thumbnails")):
            p.choose("view", view)
            wait_meta(p, {"viz": what, "T": n})
            p.page.mouse.move(1, 1)
            if phone:
                p.page.locator("#attention").scroll_into_view_if_needed()
                assert p.page.evaluate("() => document.documentElement.scrollWidth") <= size[0]
            else:
                assert p.page.evaluate("() => window.scrollY") == 0
            assert p.page.evaluate(FITS, [*size, phone]) == [], (view, name)
            label_px = p.page.evaluate(f"() => {PLOT}._fullLayout.meta.label_px")
            if view == LINES:
                assert label_px >= (16 if large else 9)
            for dark in (False, True):
                if dark:
                    p.click("dark")
                    p.page.wait_for_function("() => document.body.classList.contains('dark')", timeout=ANSWER_MS)
                p.page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
                p.page.screenshot(path=str(shots / f"layer-heads-{what}-{name}-{'dark' if dark else 'light'}.png"))
            p.click("dark")
            p.page.wait_for_function("() => !document.body.classList.contains('dark')", timeout=ANSWER_MS)
        assert p.console_errors == []
    finally:
        context.close()
