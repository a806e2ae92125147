"""A model with many heads in a real Chromium: a random 12-layer × 12-head GPT-2 folder opened with
`python app.py --model FOLDER`. Its layer view shows the heads a page at a time (Head menu, ◀ ▶), the
attention, the text and the chart stay on one screen at 1366×900 and 1280×720 (also with Large fonts),
nothing is cut off at 390 px, the all-layers view points to the head-roles map instead of 144 panels,
a click on a cell of that map shows that head, and a link to a page of heads reopens on that page.

Every check waits for what it reads; nothing depends on how fast the machine is.
"""

from __future__ import annotations

import pytest

from tests.support.browser import ANSWER_MS, Page
from tests.support.explore_page import FIT, PLOT, open_page
from tests.support.families import save_random_gpt2
from tests.support.heads_page import click_cell, head_tab
from tests.support.share_page import share_section
from tests.support.server import AppServer

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FOLDER = "gpt2-12x12"
MODEL = f"{FOLDER} (folder)"  # as the model list names a local folder
LAYERS = HEADS = 12


@pytest.fixture(scope="module")
def many_heads_server(tmp_path_factory):
    """The app with a random GPT-2 of 12 layers × 12 heads (head size 2) added by --model."""
    tmp = tmp_path_factory.mktemp("many_heads")
    save_random_gpt2(tmp / FOLDER, LAYERS, HEADS, 24)
    server = AppServer({"DECODER_LAB_BUSY_WAIT_S": "600"}, tmp, args=["--model", str(tmp / FOLDER)]).start()
    yield server
    server.stop()


def value(p: Page, elem: str) -> str:
    return p.page.locator(f"#{elem} input").input_value()


def wait_value(p: Page, elem: str, shown: str) -> None:
    p.page.wait_for_function("([e, v]) => document.querySelector('#' + e + ' input').value === v",
                             arg=[elem, shown], timeout=ANSWER_MS)


def wait_heads(p: Page, heads: list[int], title: str) -> None:
    """Wait until the attention figure draws exactly these heads (in this order) and its title holds `title`."""
    p.page.wait_for_function(
        f"([hs, s]) => {{ const gd = {PLOT}; const m = gd && gd._fullLayout && gd._fullLayout.meta;"
        " return m && m.panels && JSON.stringify(m.panels.map(q => q.head)) === JSON.stringify(hs)"
        " && (gd._fullLayout.title.text || '').includes(s); }", arg=[heads, title], timeout=ANSWER_MS)
    p.page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def open_model_and_step(p: Page) -> int:
    """Choose the 12-head model (its answer, with its example prompt, waited for), press Step, and wait until its
    attention and chart show the text; the number of tokens."""
    p.choose("model", MODEL)
    p.click("step")
    p.page.wait_for_function(
        f"() => {{ const n = document.querySelectorAll('#tokens .textfield .token').length; const gd = {PLOT};"
        " const m = gd && gd._fullLayout && gd._fullLayout.meta;"
        " const probs = document.querySelector('#probs .js-plotly-plot');"
        " return n > 0 && m && m.T === n && probs && probs.textContent.includes('position ' + (n - 1)); }",
        timeout=ANSWER_MS)
    return len(p.tokens())


def fits(p: Page, width: int, height: int, panels: int) -> None:
    """The attention, the text and the chart on one screen, nothing of the figure cut off. With Large fonts a
    figure whose panels would be too small to read keeps them readable (layout.meta.raised,
    tests/viz/test_viz_gpt2_sizes.py) and may reach past the screen's bottom, where the page scrolls: then
    only its lower part is off the screen (its first 150 px are on it)."""
    fit = p.page.evaluate(FIT, [width, height])
    if p.page.evaluate(f"() => {PLOT}._fullLayout.meta.raised"):
        fit["off"] = [o for o in fit["off"] if o[0] != "#attention .js-plotly-plot" or o[1]["top"] > height - 150]
        fit["clipped"] = [c for c in fit["clipped"] if c[1]["bottom"] <= height + 1]
    assert fit == {"scrolled": 0, "off": [], "clipped": [], "panels": panels}, (width, height, fit)


def both_themes(p: Page, path) -> None:
    """Screenshots of the page light and dark (◐ Dark toggles it), back to light at the end."""
    p.page.screenshot(path=str(path) + "-light.png")
    for dark in (True, False):
        p.click("dark")
        p.page.wait_for_function("d => document.body.classList.contains('dark') === d", arg=dark, timeout=ANSWER_MS)
        p.page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        if dark:
            p.page.screenshot(path=str(path) + "-dark.png")


@pytest.mark.parametrize("size, large", [((1366, 900), False), ((1280, 720), False), ((1280, 720), True)],
                         ids=["1366x900", "1280x720", "1280x720-large"])
def test_a_layer_of_12_heads_pages_through_them_on_one_screen(many_heads_server, browser, shots, size, large):
    """Step works; the Head menu offers the layer's heads six at a time and ◀ ▶ move between the pages, and
    to head 11 from head 0; each view keeps the attention, the text and the chart on the screen (Large fonts:
    six readable panels start on it)."""
    context, p = open_page(many_heads_server, browser, *size)
    try:
        if large:
            p.large_fonts()
        open_model_and_step(p)
        p.choose("layer", "layer 7")
        p.choose("head", "H0–5")
        wait_heads(p, list(range(6)), "Layer 7 attention weights: heads 0–5 of 12")
        fits(p, *size, panels=6)
        both_themes(p, shots / f"many-heads-{size[0]}x{size[1]}{'-large' if large else ''}")
        p.click("next_head")  # the next page
        wait_value(p, "head", "H6–11")
        wait_heads(p, list(range(6, 12)), "Layer 7 attention weights: heads 6–11 of 12")
        fits(p, *size, panels=6)
        whole = "() => { const i = document.querySelector('#head input'); return i.scrollWidth <= i.clientWidth; }"
        assert p.page.evaluate(whole), "the Head box cuts its page's name"
        p.click("next_head")  # and round to the first
        wait_value(p, "head", "H0–5")
        wait_heads(p, list(range(6)), "heads 0–5 of 12")
        p.choose("head", "head 0")
        wait_heads(p, [0], "Layer 7, head 0")
        p.click("prev_head")  # one head back from head 0 is the last
        wait_value(p, "head", "head 11")
        wait_heads(p, [11], "Layer 7, head 11")
        fits(p, *size, panels=1)
        assert p.console_errors == []
    finally:
        context.close()


def test_the_heads_map_stands_for_144_panels_and_a_cell_shows_its_head(many_heads_server, browser, shots):
    """"all layers" on 12 × 12 heads says to use the head-roles map; a click on its cell (layer 9, head 4)
    shows that head's attention above, as weights."""
    context, p = open_page(many_heads_server, browser, 1366, 900)
    try:
        n = open_model_and_step(p)
        p.choose("view", "all layers")
        p.page.wait_for_function(f"() => ({PLOT}.textContent || '').includes('too many panels')", timeout=ANSWER_MS)
        head_tab(p, "Head roles")
        p.page.wait_for_function("() => { const m = document.querySelector('#head_roles .js-plotly-plot')"
                                 "?._fullLayout?.meta; return m && m.pick === 'head' && m.layers === 12; }",
                                 timeout=ANSWER_MS)
        p.page.locator("#head_roles").scroll_into_view_if_needed()
        p.page.screenshot(path=str(shots / "many-heads-roles-1366x900.png"))
        assert click_cell(p, "head_roles", 9, 4) == "9,4"  # once nothing covers the map, counted once
        wait_value(p, "layer", "layer 9")
        wait_value(p, "head", "head 4")
        p.page.wait_for_function(
            f"n => {{ const gd = {PLOT}; const m = gd && gd._fullLayout && gd._fullLayout.meta;"
            " return m && m.T === n && (gd._fullLayout.title.text || '').includes('Layer 9, head 4'); }",
            arg=n, timeout=ANSWER_MS)
        assert p.console_errors == []
    finally:
        context.close()


@pytest.mark.parametrize("theme", ["", "?__theme=dark"], ids=["light", "dark"])
def test_on_a_phone_nothing_of_a_12_head_layer_is_cut_off(many_heads_server, browser, shots, theme):
    """At 390×844 the page of six heads and the one head shown at first lie inside the screen's width and
    their figure: no axis title or panel is cut off, and the page never scrolls sideways."""
    context, p = open_page(many_heads_server, browser, 390, 844, query=theme)
    try:
        open_model_and_step(p)
        name = "dark" if theme else "light"
        for head, heads in (("head 11", [11]), ("H6–11", list(range(6, 12)))):
            p.choose("head", head)
            wait_heads(p, heads, "")
            p.page.evaluate("() => window.scrollTo(0, 0)")
            whole = p.page.evaluate("() => [document.documentElement.scrollWidth,"
                                    " document.documentElement.scrollHeight]")
            assert whole[0] <= 390, whole
            fits(p, 390, whole[1], panels=len(heads))
            p.page.locator("#attention").scroll_into_view_if_needed()
            p.page.screenshot(path=str(shots / f"many-heads-390-{len(heads)}-{name}.png"))
        assert p.console_errors == []
    finally:
        context.close()


def test_the_link_to_heads_6_to_11_reopens_on_heads_6_to_11(many_heads_server, browser):
    """The page's own link to layer 7's heads 6–11 (head=6-11) opens, in another tab, the same text with the
    Head menu on H6–11 and those six heads drawn."""
    context, p = open_page(many_heads_server, browser, 1366, 900)
    try:
        n = open_model_and_step(p)
        p.choose("layer", "layer 7")
        p.choose("head", "H6–11")
        wait_heads(p, list(range(6, 12)), "Layer 7 attention weights: heads 6–11 of 12")
        share_section(p)
        p.click("make_link")
        href = p.page.locator("#share_link_a").get_attribute("href", timeout=ANSWER_MS)
        assert "head=6-11" in href and "layer=7" in href and "steps=1" in href, href
        q = Page(context, f"{many_heads_server.url}{href}")
        q.wait_tokens(n)
        assert q.tokens() == p.tokens()
        wait_value(q, "layer", "layer 7")
        wait_value(q, "head", "H6–11")
        wait_heads(q, list(range(6, 12)), "Layer 7 attention weights: heads 6–11 of 12")
        assert p.console_errors == [] and q.console_errors == []
    finally:
        context.close()
