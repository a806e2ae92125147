"""A link that opens the Circuits tab, in a real Chromium at 1366×900: the page opens on the Circuits tab with
direct logit attribution drawn at the link's last token and the link's head opened (ui/circuits_reopen.py)."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from tests.support.browser import ANSWER_MS, Page
from tests.support.page_events import TRACKER

pytestmark = [pytest.mark.browser, pytest.mark.slow]

G = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
SELECTED_TAB = ("() => { const list = document.querySelector('#tabs [role=tablist]');"
                " const tab = list && list.querySelector('[role=tab][aria-selected=true]');"
                " return tab ? tab.innerText.trim() : null; }")


class LinkPage(Page):
    """A page opened from a link that leaves Explore: as `Page`, but its first wait is for the load's answer,
    not for Explore's figure (hidden once the link's tab is selected)."""

    def __init__(self, context, url: str):  # noqa: D107 - Page's own settings, without its first wait
        self.url, self.page = url, context.new_page()
        self.console_errors, self.outside, self.dialogs = [], [], []
        self.page.on("pageerror", lambda e: self.console_errors.append(str(e)))
        self.page.on("dialog", self._dialog)
        self.page.on("request", self._request)
        self.page.add_init_script(TRACKER)
        self.page.goto(url, wait_until="load")
        self.wait_answered("load", 0)
        self.idle()  # and the event chained after the load, which draws the Circuits tab


def test_a_link_opens_the_circuits_tab_with_dla_drawn(app_server, browser, shots):
    query = urlencode({"model": G, "prompt": P, "steps": 1, "temperature": 0, "tab": "circuits", "answer": " tom",
                       "other": " anna", "circuit_layer": 1, "circuit_head": 2})
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    try:
        p = LinkPage(context, f"{app_server.url}?{query}")
        assert p.page.evaluate(SELECTED_TAB) == "Circuits"
        p.page.wait_for_selector("#circuits_dla .js-plotly-plot", state="visible", timeout=ANSWER_MS)
        dla = p.figure("circuits_dla")
        assert dla["ntraces"] >= 1 and dla["images"] >= 1 and dla["box"][2] > 600  # a heatmap across the page
        note = p.page.locator("#circuits_dla_note").inner_text()
        assert "logit(tom) − logit(anna)" in note and "(12)" in note  # at the last token: the one the Step made
        assert p.page.locator("#circuits_dla_answer textarea, #circuits_dla_answer input").first.input_value() == " tom"
        assert "L1H2" in p.page.locator("#circuits_head_note").inner_text()
        assert not p.console_errors and not p.outside and not p.dialogs
        p.page.screenshot(path=str(shots / "circuits-link-1366x900.png"))
    finally:
        context.close()
