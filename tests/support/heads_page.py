"""Helpers (and the `page` fixture) for the head tools in a real Chromium."""

from __future__ import annotations

import pytest

from lab.session import Session
from model.generate import Sampling
from tests.support.browser import Page, sampling_section
from tests.support.explore_page import open_page


GRAMMAR = "grammar (built-in)"

P = "anna found the key . she gave it to tom because he"

GREEDY = Sampling(temperature=0.0)


@pytest.fixture
def page(app_server, browser):
    context, p = open_page(app_server, browser)
    greedy(p)
    yield p
    context.close()


def click_cell(p: Page, elem: str, layer: int, head: int, panel: int = 0) -> None:
    """A real mouse click on the centre of cell (layer, head) of an overview figure's panel."""
    xy = p.page.evaluate(
        """([e, l, h, k]) => {
            const gd = document.querySelector('#' + e + ' .js-plotly-plot');
            const L = gd._fullLayout, sfx = k ? String(k + 1) : '';
            const xa = L['xaxis' + sfx], ya = L['yaxis' + sfx];
            const box = gd.querySelector('.main-svg').getBoundingClientRect();
            return [box.x + xa._offset + xa.l2p(h), box.y + ya._offset + ya.l2p(l)];
        }""", [elem, layer, head, panel])
    p.page.mouse.click(*xy)


def head_tab(p: Page, name: str) -> None:
    """Show one of the head tools' tabs; on a narrow window the last ones sit behind "More tabs"."""
    tab = p.page.locator("#head_tools").get_by_role("tab", name=name)
    if tab.is_visible():
        tab.click()
        return
    p.page.locator("#head_tools button[aria-label='More tabs']").click()
    p.page.locator("#head_tools .overflow-dropdown button, #head_tools .overflow-menu button").filter(
        has_text=name).first.click()


def greedy(p: Page) -> None:
    sampling_section(p, True)
    p.set_slider("temperature", 0)
    sampling_section(p, False)


def text(p: Page, selector: str) -> str:
    return p.page.evaluate("s => document.querySelector(s)?.innerText || ''", selector)


def wait_text(p: Page, selector: str, fragment: str, timeout: float = 30_000) -> str:
    p.page.wait_for_function("([s, f]) => (document.querySelector(s)?.innerText || '').includes(f)",
                             arg=[selector, fragment], timeout=timeout)
    return text(p, selector)


def plot_title(p: Page, elem: str) -> str:
    return p.page.evaluate(f"() => document.querySelector('#{elem} .js-plotly-plot')?._fullLayout.title?.text || ''")


def wait_title(p: Page, elem: str, fragment: str) -> str:
    p.page.wait_for_function(
        "([e, f]) => (document.querySelector('#' + e + ' .js-plotly-plot')?._fullLayout.title?.text || '').includes(f)",
        arg=[elem, fragment], timeout=30_000)
    return plot_title(p, elem)


def local(steps: int = 1) -> Session:
    s = Session()
    for _ in range(steps):
        s.step(GRAMMAR, P, GREEDY)
    return s
