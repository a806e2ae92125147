"""The Explore page as a learner and a teacher meet it, in a real Chromium.

One screen at 1366×900 and 1280×720, one head at full width on a phone, a first view worth
seeing for every built-in, clicking a token (outlined row, shaded text, its own distribution),
labels, colours, dark mode and presentation fonts, buttons and shortcuts, and figures drawn
while their tab was hidden. Screenshots go to $DECODER_LAB_SCREENSHOTS (default: a tmp dir).
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

from lab.catalogue.models import BUILTIN_MODELS, BUILTINS
from lab.session import encode_prompt

from tests.support.browser import ANSWER_MS, Page, sampling_section
from tests.support.explore_page import GRAMMAR, PLOT, open_page, step, wait_picture

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def page(app_server, browser):
    context, p = open_page(app_server, browser)
    yield p
    context.close()


def probs_title(p: Page) -> str:
    return p.page.evaluate("() => document.querySelector('#probs .js-plotly-plot')?._fullLayout.title?.text || ''")


def probs_labels(p: Page) -> list[str]:
    """The probability chart's row labels, as drawn."""
    return p.page.evaluate("() => [...document.querySelectorAll('#probs .ytick text')].map(t => t.textContent)")


def box(p: Page, selector: str) -> dict:
    return p.page.evaluate("s => { const r = document.querySelector(s).getBoundingClientRect();"
                           " return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, width: r.width}; }",
                           selector)


def model_attention(name: str, prompt: str, extra: list[int] = ()) -> list[np.ndarray]:
    entry = BUILTINS.get(name)
    ids, _ = encode_prompt(prompt, entry)
    with torch.inference_mode():
        out = entry.model(torch.tensor([ids + list(extra)]), return_attention=True)
    return [a[0].numpy() for a in out.attentions]


@pytest.mark.parametrize("size", [(1366, 900), (1280, 720)])
def test_one_screen_after_a_step(app_server, browser, shots, size):
    context, p = open_page(app_server, browser, *size)
    try:
        step(p, 13)
        p.page.wait_for_function("() => (document.querySelector('#probs .js-plotly-plot')?.textContent || '')"
                                 ".includes('drawn from')", timeout=ANSWER_MS)
        p.idle()  # the head tools under the text are drawn a moment after the Step, and the page grows
        height = size[1]
        assert p.page.evaluate("() => window.scrollY") == 0
        for sel in ("#tokens", "#probs .js-plotly-plot", "#attention .js-plotly-plot", "#step"):
            b = box(p, sel)
            assert b["top"] >= 0 and b["bottom"] <= height + 1, f"{sel} is off screen at {size}: {b}"
        p.page.screenshot(path=str(shots / f"explore-{size[0]}x{size[1]}.png"))
        assert p.console_errors == []
    finally:
        context.close()


def test_phone_shows_one_head_at_full_width_and_moves_between_heads(app_server, browser, shots):
    context, p = open_page(app_server, browser, 390, 844)
    try:
        step(p, 13)
        fig = p.figure("attention")
        assert "xaxis2" not in fig["axes"], "one head, not a grid"
        assert fig["box"][2] >= 0.8 * 390  # the page's width less its padding
        x = fig["axes"]["xaxis"]
        assert x["length"] >= 0.55 * 390, "the panel itself is wide"
        assert "head 0" in fig["title"]  # the grammar model opens on head 0
        p.click("next_head")  # ▶ shows head 1: the figure drawn for it, not any figure other than the first
        p.page.wait_for_function(f"() => ({PLOT}._fullLayout.title.text || '').includes('head 1')", timeout=ANSWER_MS)
        p.page.screenshot(path=str(shots / "explore-390.png"), full_page=True)
        assert p.console_errors == []
    finally:
        context.close()


@pytest.mark.parametrize("size", [(1366, 900), (1280, 720), (390, 844)])
def test_dropdown_values_stay_clear_of_their_caret(app_server, browser, size):
    """Gradio draws a dropdown's caret over the right end of its input: the text box must end where the caret
    begins, and a value too long for it ends with an ellipsis ("colour: weight" lost its "t" under the caret). The
    short values above the attention ("layer 1", "head 0", "colour: weight") fit whole, even at 1280 px."""
    context, p = open_page(app_server, browser, *size)
    try:
        boxes = p.page.evaluate("""() => [...document.querySelectorAll('.secondary-wrap > input[role="combobox"]')]
            .filter(e => e.offsetParent !== null).map(e => {
              const r = e.getBoundingClientRect(), s = getComputedStyle(e);
              const icon = e.parentElement.querySelector('.icon-wrap').getBoundingClientRect();
              const ctx = document.createElement('canvas').getContext('2d'); ctx.font = s.font;
              return {label: e.getAttribute('aria-label'), textEnd: r.right - parseFloat(s.paddingRight),
                      caret: icon.left, overflow: s.textOverflow, value: e.value,
                      room: e.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight),
                      text: ctx.measureText(e.value).width}; })""")
        assert {b["label"] for b in boxes} >= {"Model", "Example prompts", "Colour"}, boxes
        for b in boxes:
            assert b["textEnd"] <= b["caret"] + 0.5, f"{b['label']}: the value runs under the caret at {size}: {b}"
            assert b["overflow"] == "ellipsis", b
        short = {b["label"]: b for b in boxes if b["label"] in ("Layer", "Head", "Colour")}
        assert [short[k]["value"] for k in ("Layer", "Head", "Colour")] == ["layer 1", "head 0", "colour: weight"]
        for b in short.values():
            assert b["text"] <= b["room"], f"{b['label']}: {b['value']!r} does not fit whole at {size}: {b}"
    finally:
        context.close()


@pytest.mark.parametrize("name", list(BUILTIN_MODELS))
def test_every_builtin_opens_on_its_first_view_with_examples(page, name):
    p = page
    builtin = BUILTIN_MODELS[name]
    fv = builtin.first_view
    if name != GRAMMAR:
        p.choose("model", name)
        p.page.wait_for_function("e => document.querySelector('#prompt textarea').value === e",
                                 arg=builtin.examples[0], timeout=ANSWER_MS)
    caption = p.page.locator("#caption").inner_text()
    assert fv.caption[:40] in caption
    assert p.page.locator("#head input").input_value() == f"head {fv.head}"
    assert p.page.locator("#layer input").input_value() == f"layer {fv.layer}"
    n = len(encode_prompt(builtin.examples[0], BUILTINS.get(name))[0])
    step(p, min(n + 1, BUILTINS.get(name).model.cfg.block_size))
    assert f"head {fv.head}" in p.figure("attention")["title"]
    # every example is offered, and picking one fills the prompt
    box = p.page.locator("#examples input")
    box.click()
    menu = p.page.locator(f"[id='{box.get_attribute('aria-controls')}']")  # this menu's own list
    menu.get_by_role("option").first.wait_for(timeout=ANSWER_MS)
    options = menu.get_by_role("option").all_inner_texts()
    shown = [" ".join(o.replace("✓", "").split()) for o in options]  # the selected one carries a check mark
    assert shown == [" ".join(e.replace("\n", " ⏎ ").split()) for e in builtin.examples]  # line breaks shown
    menu.get_by_role("option").nth(1).click()
    p.page.wait_for_function("e => document.querySelector('#prompt textarea').value === e",
                             arg=builtin.examples[1], timeout=ANSWER_MS)


def test_clicking_a_token_links_the_three_views(page, shots):
    p = page
    tokens = step(p, 13)
    # default: the last token is the query
    p.page.wait_for_selector("#tokens .token.lab-query", timeout=ANSWER_MS)
    i = tokens.index("he")
    p.page.locator("#tokens .textfield .token").nth(i).click()
    p.page.wait_for_function("i => document.querySelectorAll('#tokens .textfield .token')[i]"
                             ".classList.contains('lab-query')", arg=i, timeout=5_000)
    # the row of "he" is outlined in the panel, at the right height
    fig = p.figure("attention")
    y = fig["axes"]["yaxis"]
    outline = p.page.evaluate("() => { const o = document.querySelector('#attention .lab-outline');"
                              " const g = document.querySelector('#attention .js-plotly-plot').getBoundingClientRect();"
                              " const r = o.getBoundingClientRect(); return [r.top - g.top, r.bottom - g.top]; }")
    assert outline[0] - 2 <= y["centers"][i] <= outline[1] + 2
    # the text is shaded by that row of layer 1, head 0: the most shaded token is the model's argmax
    weights = model_attention(GRAMMAR, p.page.locator("#prompt textarea").input_value())
    row = weights[1][0, i, : i + 1]
    shades = p.page.evaluate("() => [...document.querySelectorAll('#tokens .textfield .token')]"
                             ".map(e => parseFloat(e.style.getPropertyValue('--lab-shade') || 'NaN'))")
    assert int(np.nanargmax(shades)) == int(np.argmax(row)) == tokens.index("tom")
    np.testing.assert_allclose(shades[: i + 1], row, atol=0.01)  # full yellow = weight 1
    assert all(np.isnan(s) for s in shades[i + 1:])  # later tokens are masked for this query
    assert "“he”" in p.page.locator("#shade_note").inner_text()
    # the chart shows what "he" was predicted from (a typed token)
    p.page.wait_for_function("i => (document.querySelector('#probs .js-plotly-plot')?._fullLayout.title?.text || '')"
                             ".includes('position ' + i)", arg=i, timeout=ANSWER_MS)
    assert "Typed" in probs_title(p)
    assert "he  ◀ typed" in probs_labels(p) and not any("chosen" in t for t in probs_labels(p))  # nothing was drawn
    p.page.screenshot(path=str(shots / "explore-linked.png"))  # the README's first picture
    # clicking the generated token shows the distribution it was drawn from
    p.page.locator("#tokens .textfield .token").nth(12).click()
    p.page.wait_for_function("() => (document.querySelector('#probs .js-plotly-plot')?._fullLayout.title?.text || '')"
                             ".includes('position 12')", timeout=ANSWER_MS)
    assert "drawn from" in probs_title(p)
    assert any(t.endswith("◀ chosen") for t in probs_labels(p)) and not any("typed" in t for t in probs_labels(p))
    # hovering a cell names layer, head, query and key
    hover = p.page.evaluate(f"() => {PLOT}._fullData.map(t => [t.hovertemplate || '', String(t.meta || '')])")
    assert hover and all("query" in t and "key" in t and "%{meta}" in t for t, _ in hover)
    assert all("layer 1" in name and "head 0" in name for _, name in hover)
    assert p.console_errors == []


def test_keys_and_buttons_do_what_they_say(page):
    p = page
    prompt = "tom met lisa at the park . he"
    p.set_prompt(prompt)
    p.page.locator("#prompt textarea").press("Enter")  # Enter in the prompt steps
    first = p.wait_tokens(9)
    p.page.locator("#caption").click()  # focus leaves the text box: shortcuts work
    p.page.keyboard.press("s")
    p.wait_tokens(10)
    p.page.wait_for_function("() => (document.querySelector('#probs .js-plotly-plot')?._fullLayout.title?.text || '')"
                             ".includes('position 9')", timeout=ANSWER_MS)
    p.page.keyboard.press("u")  # Undo brings back the previous step's distribution
    p.wait_tokens(9)
    p.page.wait_for_function("() => (document.querySelector('#probs .js-plotly-plot')?._fullLayout.title?.text || '')"
                             ".includes('position 8')", timeout=ANSWER_MS)
    assert "drawn from" in probs_title(p)
    # Generate goes on from this text
    sampling_section(p, True)
    p.set_slider("max_new", 3)
    p.page.wait_for_function("() => document.querySelector('#max_new input[type=number]').value === '3'",
                             timeout=ANSWER_MS)
    sampling_section(p, False)
    p.page.locator("#caption").click()
    p.page.keyboard.press("g")
    after = p.wait_tokens(12)
    assert after[:9] == first
    # Reset keeps the typed prompt
    p.click("reset")
    p.wait_tokens(0)
    assert p.page.locator("#prompt textarea").input_value() == prompt
    # ←/→ move the selected token
    p.click("step")
    p.wait_tokens(9)
    p.page.locator("#caption").click()
    p.page.keyboard.press("ArrowLeft")
    p.page.wait_for_function("() => document.querySelectorAll('#tokens .textfield .token')[7]"
                             ".classList.contains('lab-query')", timeout=5_000)
    assert "S" in p.page.locator("#step").inner_text()  # the shortcut is shown on the button
    assert p.console_errors == []


def test_labels_at_64_tokens_and_a_focus_beyond(page):
    p = page
    words = ("tom met lisa at the park . he gave it to anna because she " * 8).split()
    p.set_prompt(" ".join(words[:63]))
    step(p, 64)
    fig = p.figure("attention")
    tokens, labels = p.tokens(), fig["axes"]["yaxis"]["ticktext"]
    font = p.page.evaluate(f"() => {PLOT}._fullLayout.yaxis.tickfont.size")
    every = int(p.page.evaluate(f"() => {{ const v = {PLOT}._fullLayout.yaxis.tickvals; return v[1] - v[0]; }}"))
    # a readable label for every k-th token, the newest always among them
    assert font >= 9 and labels == tokens[(64 - 1) % every::every] and labels[-1] == tokens[-1]
    assert fig["box"][3] <= 900  # never taller than the screen
    # a colour for long texts: log scale
    p.choose("colour", "colour: log scale")
    p.page.wait_for_function(f"() => ({PLOT}._fullLayout.coloraxis.colorbar.title.text || '').includes('log')",
                             timeout=ANSWER_MS)
    p.choose("head", "all heads")
    p.set_prompt(" ".join(words[:31]))
    tokens = step(p, 32)
    fig = p.figure("attention")
    shown = [a["ticktext"] for k, a in fig["axes"].items() if k.startswith("y") and a["ticktext"]]
    every = int(p.page.evaluate(f"() => {{ const v = {PLOT}._fullLayout.yaxis.tickvals; return v[1] - v[0]; }}"))
    assert shown and all(labels == tokens[(32 - 1) % every::every] for labels in shown)
    assert p.page.evaluate(f"() => {PLOT}._fullLayout.yaxis.tickfont.size") >= 9


def test_colours_dark_mode_and_presentation(app_server, browser, shots):
    context, p = open_page(app_server, browser, scheme="dark", query="?__theme=dark")
    try:
        step(p, 13)
        bg = p.page.evaluate(f"() => {PLOT}._fullLayout.paper_bgcolor")
        assert bg in ("rgba(0, 0, 0, 0)", "rgba(0,0,0,0)", "transparent"), bg
        fill = p.page.evaluate(f"() => getComputedStyle({PLOT}.querySelector('.xtick text')).fill")
        rgb = [int(v) for v in fill[fill.index("(") + 1: fill.index(")")].split(",")[:3]]
        assert sum(rgb) / 3 > 160, f"tick labels too dark on a dark page: {fill}"
        p.page.screenshot(path=str(shots / "explore-dark.png"))
        # scores: positive is red in the colour scale, as in the Positional tab
        p.choose("view", "scores")
        wait_picture(p, 13, "score")
        scale = p.page.evaluate(f"() => {PLOT}._fullLayout.coloraxis.colorscale")
        top, bottom = scale[-1][1], scale[0][1]
        assert _reddish(top) and _bluish(bottom), (top, bottom)
        # presentation: tick labels ≥ 16 px
        p.large_fonts()
        p.page.wait_for_function(f"() => {PLOT}._fullLayout.xaxis.tickfont.size >= 16", timeout=ANSWER_MS)
        p.page.screenshot(path=str(shots / "explore-presentation.png"))
        p.tab("Positional encoding")
        p.page.wait_for_selector("#pe_table g.hm image", timeout=ANSWER_MS)
        pe_scale = p.page.evaluate("() => { const L = document.querySelector('#pe_table .js-plotly-plot')._fullLayout;"
                                   " return (L.coloraxis && L.coloraxis.colorscale) ||"
                                   " document.querySelector('#pe_table .js-plotly-plot')._fullData[0].colorscale; }")
        assert _reddish(pe_scale[-1][1]) and _bluish(pe_scale[0][1])
        pe_font = p.page.evaluate("() => document.querySelector('#pe_table .js-plotly-plot')._fullLayout.xaxis.tickfont.size")
        assert pe_font >= 16  # large fonts in every tab
        assert p.console_errors == []
    finally:
        context.close()


def _rgb(colour: str) -> tuple[int, int, int]:
    colour = colour.strip()
    if colour.startswith("#"):
        return tuple(int(colour[i: i + 2], 16) for i in (1, 3, 5))
    return tuple(int(float(v)) for v in colour[colour.index("(") + 1: colour.index(")")].split(",")[:3])


def _reddish(c: str) -> bool:
    r, g, b = _rgb(c)
    return r > b + 60


def _bluish(c: str) -> bool:
    r, g, b = _rgb(c)
    return b > r + 60


def test_figures_drawn_while_hidden_fit_when_shown(page):
    """The Positional tab seen once, the model switched, the tab seen again: the figure fills its
    box (colour bar inside); the Explore placeholder is centred after a model switch elsewhere."""
    p = page
    p.tab("Positional encoding")
    p.page.wait_for_selector("#pe_table g.hm image", timeout=ANSWER_MS)
    p.tab("Explore")
    p.choose("model", "sort digits (built-in)")
    p.page.wait_for_function("() => document.querySelector('#prompt textarea').value === '503124='",
                             timeout=ANSWER_MS)
    p.tab("Positional encoding")
    p.page.wait_for_function("() => (document.querySelector('#pe_info')?.innerText || '').includes('sort')",
                             timeout=ANSWER_MS)
    for elem in ("pe_table", "pe_sim"):
        sizes = ("s => { const gd = document.querySelector(s + ' .js-plotly-plot');"
                 " return [gd._fullLayout.width, gd.parentElement.getBoundingClientRect().width]; }")
        try:  # the figure is laid out again once shown: wait for it (a hang guard), then say what was found
            p.page.wait_for_function(f"s => {{ const [w, box] = ({sizes})(s); return Math.abs(w - box) <= 4; }}",
                                     arg="#" + elem, timeout=ANSWER_MS)
        except Exception:  # noqa: BLE001 - the assertion below reports the sizes
            pass
        width, box_w = p.page.evaluate(sizes, "#" + elem)
        assert abs(width - box_w) <= 4, f"{elem}: laid out {width}px in a {box_w}px box"
    assert p.console_errors == []


def test_token_selection_reacts_within_a_frame_or_two(page):
    """The outline and shading are drawn by the page itself: no server round trip (the 150 ms
    target is measured in bench/browser_latency.py, not here)."""
    p = page
    step(p, 13)
    calls = []
    p.page.on("request", lambda r: calls.append(r.url) if "/gradio_api/" in r.url else None)
    applied = p.page.evaluate("() => window.decoderLab.applied")
    p.page.evaluate("() => document.querySelectorAll('#tokens .textfield .token')[3].click()")
    state = p.page.evaluate("() => [window.decoderLab.applied, window.decoderLab.query,"
                            " document.querySelectorAll('#attention .lab-outline').length]")
    assert state[0] > applied and state[1] == 3 and state[2] >= 1  # synchronously, in the click itself


def test_a_step_draws_each_figure_once(page):
    """gradio's Plot mounts a new plot element for each new value and used to draw the value into the
    element it was dropping as well (two full Plotly draws per update). assets/explore.js skips the
    redraw of an element that leaves the page: after a Step the old attention element still holds the
    old figure, and the element on screen holds the new one."""
    p = page
    step(p, 13)
    p.page.evaluate(f"() => {{ const gd = {PLOT}; gd.data[0].__labOld = true; window.__labOldPlot = gd; }}")
    p.click("step")
    p.wait_tokens(14)
    p.page.wait_for_function(f"() => {{ const gd = {PLOT}; return gd && gd !== window.__labOldPlot"
                             " && gd._fullLayout && gd._fullLayout.meta && gd._fullLayout.meta.T === 14; }",
                             timeout=ANSWER_MS)
    p.page.wait_for_function("() => !window.__labOldPlot.isConnected", timeout=ANSWER_MS)
    p.idle()  # every answer the Step set off is in and applied: a redraw of the old element would have run
    p.page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    old = p.page.evaluate("() => { const gd = window.__labOldPlot;"
                          " return [gd.data[0].__labOld === true, gd._fullLayout.meta.T]; }")
    assert old == [True, 13], f"the dropped element was drawn again: {old}"
    assert p.page.evaluate("() => window.Plotly.__labOnce") is True
    assert p.console_errors == []
