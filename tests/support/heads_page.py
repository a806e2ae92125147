"""Helpers (and the `page` fixture) for the head tools in a real Chromium."""

from __future__ import annotations

import pytest

from lab.session import Session
from model.generate import Sampling
from tests.support.browser import ANSWER_MS, Page, sampling_section
from tests.support.explore_page import open_page
from tests.support.plot_click import click_cell  # noqa: F401 - the head tools' tests click overview cells


GRAMMAR = "grammar (built-in)"

P = "anna found the key . she gave it to tom because he"

GREEDY = Sampling(temperature=0.0)


@pytest.fixture
def page(app_server, browser):
    context, p = open_page(app_server, browser)
    greedy(p)
    yield p
    context.close()


def head_tab(p: Page, name: str) -> None:
    """Show one of the head tools' tabs; on a narrow window the last ones sit behind "More tabs"."""
    tab = p.page.locator("#head_tools").get_by_role("tab", name=name)
    if tab.is_visible():
        tab.click()
    else:
        p.page.locator("#head_tools button[aria-label='More tabs']").click()
        p.page.locator("#head_tools .overflow-dropdown button, #head_tools .overflow-menu button").filter(
            has_text=name).first.click()
    # the tab's answer draws its figure and sets the heads to ablate from the server's state: an answer of a
    # click made before it came would be undone by it
    p.idle()


def greedy(p: Page) -> None:
    sampling_section(p, True)
    p.set_slider("temperature", 0)
    sampling_section(p, False)


def text(p: Page, selector: str) -> str:
    return p.page.evaluate("s => document.querySelector(s)?.innerText || ''", selector)


def wait_text(p: Page, selector: str, fragment: str, timeout: float = ANSWER_MS) -> str:
    p.page.wait_for_function("([s, f]) => (document.querySelector(s)?.innerText || '').includes(f)",
                             arg=[selector, fragment], timeout=timeout)
    return text(p, selector)


def plot_title(p: Page, elem: str) -> str:
    return p.page.evaluate(f"() => document.querySelector('#{elem} .js-plotly-plot')?._fullLayout.title?.text || ''")


def wait_title(p: Page, elem: str, fragment: str) -> str:
    p.page.wait_for_function(
        "([e, f]) => (document.querySelector('#' + e + ' .js-plotly-plot')?._fullLayout.title?.text || '').includes(f)",
        arg=[elem, fragment], timeout=ANSWER_MS)
    return plot_title(p, elem)


def local(steps: int = 1) -> Session:
    s = Session()
    for _ in range(steps):
        s.step(GRAMMAR, P, GREEDY)
    return s
