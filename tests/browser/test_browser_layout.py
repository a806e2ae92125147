"""What a learner sees, measured in a real Chromium: messages shown whole, the lesson on one projector
screen, figure titles clear of Plotly's tool bar on a phone, and a link that copies with one click.

Every check reads the page's own boxes (getBoundingClientRect) after waiting for what it measures;
nothing depends on how fast the machine is.
"""

from __future__ import annotations

import pytest

from lab.checks import UserError
from lab.catalogue.models import BUILTIN_MODELS, BUILTINS
from lab.session import Session, encode_prompt
from model.generate import Sampling

from tests.support.browser import ANSWER_MS, Page
from tests.support.explore_page import FIT, GRAMMAR, PLOT, open_page
from tests.support.share_page import share_section

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SORT = "sort digits (built-in)"
PROJECTOR = (1280, 720)


def refusal(call) -> str:
    """The sentence a lab refusal says (what the page must show, whole)."""
    with pytest.raises(UserError) as info:
        call()
    return str(info.value)


def toast(p: Page) -> str:
    text = " ".join(p.toast_text().split())
    p.close_toasts()
    p.page.wait_for_selector(".toast-body", state="detached", timeout=ANSWER_MS)
    return text


# ----------------------------------------------------------------------------- messages


def test_a_message_with_angle_brackets_shows_whole(app_server, browser):
    """gradio shows a message as HTML: "<EOS>" or a typed "<b>" would be swallowed, with the rest of the sentence."""
    s = Session()
    prompt = BUILTIN_MODELS[SORT].examples[0]
    list(s.generate(SORT, prompt, Sampling(temperature=0.8, seed=0), 40))
    ended = refusal(lambda: s.step(SORT, prompt, Sampling(temperature=0.8, seed=0)))
    typed = "tom <b>met</b> lisa"
    unknown = refusal(lambda: encode_prompt(typed, BUILTINS.get(GRAMMAR)))
    assert "<EOS>" in ended and "'<'" in unknown
    context, p = open_page(app_server, browser)
    try:
        p.set_prompt(typed)
        p.click("step")
        assert " ".join(unknown.split()) in toast(p)
        p.choose("model", SORT)
        p.page.wait_for_function("e => document.querySelector('#prompt textarea').value === e", arg=prompt,
                                 timeout=ANSWER_MS)
        p.click("generate")
        p.page.wait_for_function("() => [...document.querySelectorAll('#tokens .token .text')]"
                                 ".some(e => e.textContent === '<EOS>')", timeout=ANSWER_MS)
        p.click("step")
        assert " ".join(ended.split()) in toast(p)
        assert p.console_errors == []
    finally:
        context.close()


# ----------------------------------------------------------------------------- one screen


def first_view_size(name: str) -> int:
    """Tokens on screen after one Step of a built-in's first example."""
    entry = BUILTINS.get(name)
    return min(len(encode_prompt(BUILTIN_MODELS[name].examples[0], entry)[0]) + 1, entry.model.cfg.block_size)


def step_and_measure(p: Page, n_tokens: int, panels: int) -> dict:
    p.click("step")
    p.wait_tokens(n_tokens)
    p.page.wait_for_function(
        f"([n, k]) => {{ const gd = {PLOT}; const m = gd && gd._fullLayout && gd._fullLayout.meta;"
        " const probs = document.querySelector('#probs .js-plotly-plot');"
        " return m && m.T === n && m.panels.length === k && probs"
        " && probs.textContent.includes('position ' + (n - 1)); }",
        arg=[n_tokens, panels], timeout=ANSWER_MS)
    return measure(p)


def measure(p: Page) -> dict:
    """FIT at the projector's size, once nothing more is on its way (the head tools under the text, drawn a
    moment after a Step, change the page's height) and the browser has laid the page out."""
    p.idle()
    p.page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    return p.page.evaluate(FIT, list(PROJECTOR))


def switch_view_and_measure(p: Page, n_tokens: int, layer: str, head: str, panels: int) -> dict:
    """Choose a layer and head for the text on screen, and measure once the figure shows them: each choice's
    answer is waited for (`Page.choose`), so no earlier redraw can land over the figure measured."""
    p.choose("layer", layer)
    p.choose("head", head)
    p.page.wait_for_function(
        f"([n, k]) => {{ const gd = {PLOT}; const m = gd && gd._fullLayout && gd._fullLayout.meta;"
        " return m && m.T === n && m.panels && m.panels.length === k; }",
        arg=[n_tokens, panels], timeout=ANSWER_MS)
    return measure(p)


@pytest.fixture(scope="module")
def own_model(tmp_path_factory) -> str:
    """A model trained as the Train tab trains one (a few steps of the grammar corpus, 2 layers × 4 heads): its
    downloaded file, which the page uploads."""
    s = Session()
    for progress in s.train("grammar", "", None, "word", 2, 4, 32, 64, "learned", "pre", "gelu", 0.0, 5, 3e-3, 0):
        pass
    assert progress.done and progress.download is not None
    return str(progress.download)


@pytest.mark.parametrize("large", [False, True], ids=["normal", "large-fonts"])
def test_every_opening_view_fits_one_projector_screen(app_server, browser, shots, own_model, large):
    """At 1280×720, with and without Large fonts, the view each model opens on (each built-in's first view after
    one Step of its first example; an own model's "all heads" of layer 0) shows the whole attention figure, the
    text and the chart on the screen, with no axis title cut off."""
    context, p = open_page(app_server, browser, *PROJECTOR)
    try:
        if large:
            p.large_fonts()
            caption_px = "() => parseFloat(getComputedStyle(document.querySelector('#caption p')).fontSize)"
            assert p.page.evaluate(caption_px) >= 18
        for name in BUILTIN_MODELS:
            if name != GRAMMAR:
                p.choose("model", name)
                p.page.wait_for_function("e => document.querySelector('#prompt textarea').value === e",
                                         arg=BUILTIN_MODELS[name].examples[0], timeout=ANSWER_MS)
            fit = step_and_measure(p, first_view_size(name), 1)
            assert fit == {"scrolled": 0, "off": [], "clipped": [], "panels": 1}, (name, large, fit)
            if large and name == GRAMMAR:  # the words around the figure are large too
                px = "s => parseFloat(getComputedStyle(document.querySelector(s)).fontSize)"
                assert p.page.evaluate(px, "#shade_note .lab-note") >= 16
                assert p.page.evaluate(px, "#status textarea") >= 18
            p.page.screenshot(path=str(shots / f"fit-1280x720-{'large' if large else 'normal'}-{name.split()[0]}.png"))
        # an own model opens on all heads of layer 0
        p.tab("Train")
        p.page.locator("#upload input[type=file]").set_input_files(own_model)
        p.page.wait_for_function("() => document.querySelector('#upload_status textarea').value.startsWith('Loaded')",
                                 timeout=ANSWER_MS)
        p.tab("Explore")
        p.page.wait_for_function("() => document.querySelector('#head input').value === 'all heads'", timeout=ANSWER_MS)
        n = len(p.page.locator("#prompt textarea").input_value().split()) + 1
        fit = step_and_measure(p, n, 4)
        assert fit == {"scrolled": 0, "off": [], "clipped": [], "panels": 4}, ("own model", large, fit)
        # the longest of them, the grammar built-in's 12-token example, on all heads as well
        p.choose("model", GRAMMAR)
        p.page.wait_for_function("e => document.querySelector('#prompt textarea').value === e",
                                 arg=BUILTIN_MODELS[GRAMMAR].examples[0], timeout=ANSWER_MS)
        p.page.wait_for_function("() => document.querySelector('#head input').value === 'head 0'", timeout=ANSWER_MS)
        n = first_view_size(GRAMMAR)
        step_and_measure(p, n, 1)
        fit = switch_view_and_measure(p, n, "layer 0", "all heads", 4)
        assert fit == {"scrolled": 0, "off": [], "clipped": [], "panels": 4}, ("grammar, all heads", large, fit)
        assert p.console_errors == []
    finally:
        context.close()


# ----------------------------------------------------------------------------- phone


@pytest.mark.parametrize("theme", ["", "?__theme=dark"], ids=["light", "dark"])
def test_on_a_phone_the_tool_bar_leaves_every_title_readable(app_server, browser, theme):
    """At 390×844 Plotly's tool bar (shown while a finger is on the figure) sits in a strip of its own above each
    Explore figure: its box never meets the title's."""
    context, p = open_page(app_server, browser, 390, 844, query=theme)
    try:
        p.click("step")
        p.wait_tokens(13)
        p.page.wait_for_function("() => (document.querySelector('#probs .js-plotly-plot')?.textContent || '')"
                                 ".includes('position')", timeout=ANSWER_MS)
        p.page.wait_for_selector("#head_roles .js-plotly-plot .gtitle", timeout=ANSWER_MS)
        for fig in ("#attention", "#probs", "#head_roles"):
            gd = p.page.locator(f"{fig} .js-plotly-plot")
            gd.scroll_into_view_if_needed()
            gd.hover(position={"x": 20, "y": 60})  # plotly shows its tool bar while the pointer is on the figure
            p.page.wait_for_function("s => { const m = document.querySelector(s + ' .modebar');"
                                     " return m && getComputedStyle(m).opacity === '1'; }", arg=fig, timeout=ANSWER_MS)
            boxes = p.page.evaluate(
                """s => { const r = e => { const b = e.getBoundingClientRect();
                                           return {top: b.top, bottom: b.bottom, left: b.left, right: b.right}; };
                          return {bar: r(document.querySelector(s + ' .modebar')),
                                  title: r(document.querySelector(s + ' .gtitle')),
                                  figure: r(document.querySelector(s + ' .js-plotly-plot')),
                                  svg: r(document.querySelector(s + ' .main-svg'))}; }""", fig)
            bar, title = boxes["bar"], boxes["title"]
            assert title["bottom"] - title["top"] > 5, (fig, boxes)  # the figure has a title to keep clear
            apart = bar["bottom"] <= title["top"] or title["bottom"] <= bar["top"] or \
                bar["right"] <= title["left"] or title["right"] <= bar["left"]
            assert apart, f"the tool bar covers the title of {fig}: {boxes}"
            assert bar["left"] >= 0 and bar["right"] <= 390, (fig, boxes)  # on the screen
            svg = boxes["svg"]  # the title is whole: inside its figure, not cut at the top or the right
            assert svg["top"] - 1 <= title["top"] and title["right"] <= svg["right"] + 1, (fig, boxes)
        assert p.console_errors == []
    finally:
        context.close()


# ----------------------------------------------------------------------------- link


def test_the_link_has_a_copy_button_that_copies_the_whole_address(app_server, browser):
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    origin = app_server.url.rstrip("/")
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=origin)
    try:
        p = Page(context, app_server.url)
        p.click("step")
        p.wait_tokens(13)
        share_section(p)
        p.click("make_link")
        box = p.page.locator("#share_link_text textarea")
        p.page.wait_for_function("() => document.querySelector('#share_link_text textarea').value.startsWith('http')",
                                 timeout=ANSWER_MS)
        link = box.input_value()
        href = p.page.locator("#share_link_a").get_attribute("href")
        assert link == f"{origin}/{href}" and "steps=1" in link
        copy = p.page.locator("#share_link_text button[aria-label='Copy']")
        assert copy.is_visible()
        copy.click()
        p.page.wait_for_function("l => navigator.clipboard.readText().then(t => t === l)", arg=link, timeout=ANSWER_MS)
        # the copied address opens the same text
        q = Page(context, link)
        assert q.wait_tokens(13) == p.tokens()
        assert p.console_errors == [] and q.console_errors == []
    finally:
        context.close()
