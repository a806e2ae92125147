"""Save & share in a real Chromium: a link opens the page in its state (and names what it
left out), a saved session opens in a fresh browser with the same tokens and the same figure
numbers, and the web pages of a view and of a training film open offline from a file."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from tests.support.browser import ANSWER_MS, Page
from tests.support.explore_page import open_page, step, wait_picture
from tests.support.share_page import share_section

pytestmark = [pytest.mark.browser, pytest.mark.slow]

COPY = "copy / induction (built-in)"
SHADE = "() => document.querySelector('#attention .js-plotly-plot')._fullLayout.meta.shade.data"


def download_from(p: Page, elem: str, tmp_path, timeout: float = 30_000):
    """Wait for a gr.File to offer its file and download it."""
    link = p.page.locator(f"#{elem} a[download]").first
    link.wait_for(state="attached", timeout=timeout)
    with p.page.expect_download() as info:
        link.click()
    path = tmp_path / info.value.suggested_filename
    info.value.save_as(path)
    return path


def offline_page(browser, path):
    context = browser.new_context(offline=True)
    context.route("**/*", lambda r: r.abort() if not r.request.url.startswith("file:") else r.continue_())
    page = context.new_page()
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=ANSWER_MS)
    return context, page, requests


def test_a_link_opens_its_state_and_names_what_it_left_out(app_server, browser, shots):
    query = urlencode({"model": COPY, "prompt": "hcbpadlk|", "steps": 5, "temperature": 0, "layer": 0, "head": 1,
                       "view": "weights", "colour": "red", "seed": "abc"})
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    try:
        p = Page(context, f"{app_server.url}?{query}")
        p.wait_tokens(14)
        assert "".join(p.tokens()) == "hcbpadlk|hcbpa"
        wait_picture(p, 14, "Layer 0, head 1")
        note = p.page.evaluate("() => document.querySelector('#share_note').innerText")
        assert "unknown link parameter 'colour'" in note and "seed='abc'" in note
        assert p.page.evaluate("() => document.querySelector('#model input').value") == COPY
        p.page.screenshot(path=str(shots / "link-1366x900.png"))
        # the page's own link to this view opens the same text
        share_section(p)
        p.click("make_link")
        href = p.page.locator("#share_link_a").get_attribute("href", timeout=ANSWER_MS)
        assert "steps=5" in href and "temperature=0.0" in href and "head=1" in href
        q = Page(context, f"{app_server.url}{href}")
        q.wait_tokens(14)
        assert q.tokens() == p.tokens()
    finally:
        context.close()


def test_a_saved_session_opens_the_same_in_a_fresh_browser(app_server, browser, tmp_path):
    context, p = open_page(app_server, browser)
    try:
        for n in (13, 14, 15):
            step(p, n)
        p.page.locator("#tokens .token").nth(11).click()
        p.idle()  # the token's answer first: the file saves the session as it then is
        share_section(p)
        p.click("save_session")
        path = download_from(p, "session_file", tmp_path)
        assert path.suffix == ".json"
        tokens, shade = p.tokens(), p.page.evaluate(SHADE)
    finally:
        context.close()
    context, q = open_page(app_server, browser)  # a fresh browser: another session on the server
    try:
        share_section(q)
        with q.page.expect_file_chooser() as chooser:
            q.click("open_session")
        chooser.value.set_files(str(path))
        q.wait_tokens(15)
        assert q.tokens() == tokens
        q.page.wait_for_function(f"s => ({SHADE})() === s", arg=shade, timeout=ANSWER_MS)  # the same weights, byte for byte
        assert "3 generated tokens replayed" in q.page.evaluate("() => document.querySelector('#share_note').innerText")
    finally:
        context.close()


def test_web_pages_of_a_view_and_a_film_open_offline(app_server, browser, tmp_path):
    context, p = open_page(app_server, browser)
    try:
        step(p, 13)
        share_section(p)
        p.click("view_page")
        view = download_from(p, "session_file", tmp_path)
        p.open_train_tab()
        p.page.locator("#film_page_btn").click()
        film = download_from(p, "film_page", tmp_path, timeout=ANSWER_MS)
    finally:
        context.close()
    assert view.suffix == ".html" and view.name.startswith("grammar_L")
    ctx, page, requests = offline_page(browser, view)
    try:
        assert page.evaluate("() => document.querySelector('.js-plotly-plot').data.length") > 0
        assert all(u.startswith("file:") for u in requests)
    finally:
        ctx.close()
    ctx, page, requests = offline_page(browser, film)
    try:
        assert "step 0:" in page.evaluate("() => document.body.innerText")  # it opens on the first frame
        page.locator("input[type=range]").first.focus()
        page.keyboard.press("End")
        page.wait_for_function("() => !document.body.innerText.includes('step 0:')", timeout=ANSWER_MS)
        assert all(u.startswith("file:") for u in requests)
    finally:
        ctx.close()
