"""Helpers for the Explore page in a real Chromium: open it, Step, wait for its pictures."""

from __future__ import annotations

from tests.support.browser import Page


GRAMMAR = "grammar (built-in)"

PLOT = "document.querySelector('#attention .js-plotly-plot')"


def open_page(app_server, browser, width=1366, height=900, scheme="light", query: str = "") -> tuple:
    """A new browser context on the app (its address + `query`, e.g. "?__theme=dark"): opened at that address
    directly, since navigating a loaded page aborts its requests still on their way (console errors)."""
    context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme)
    return context, Page(context, app_server.url + query)


def wait_picture(p: Page, n_tokens: int, contains: str = "") -> dict:
    """Wait until the attention figure shows `n_tokens` tokens (and its title holds `contains`)."""
    p.page.wait_for_function(
        f"([n, s]) => {{ const gd = {PLOT}; const m = gd && gd._fullLayout && gd._fullLayout.meta;"
        " return m && m.T === n && (gd._fullLayout.title.text || '').includes(s); }",
        arg=[n_tokens, contains], timeout=30_000)
    return p.figure("attention")


def step(p: Page, n_tokens: int) -> list[str]:
    p.click("step")
    tokens = p.wait_tokens(n_tokens)
    wait_picture(p, n_tokens)
    return tokens
