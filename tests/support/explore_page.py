"""Helpers for the Explore page in a real Chromium: open it, Step, wait for its pictures."""

from __future__ import annotations

from tests.support.browser import ANSWER_MS, Page


GRAMMAR = "grammar (built-in)"

PLOT = "document.querySelector('#attention .js-plotly-plot')"

# What of the Explore page lies off a [width, height] screen: the attention figure, the text and the chart
# ("off"), and any axis title or panel cut off by the figure or the screen ("clipped"); with the scroll
# position and the number of attention panels.
FIT = """([w, h]) => {
  const box = (e) => { const r = e.getBoundingClientRect();
                       return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; };
  const inside = (b, o) => b.top >= o.top - 1 && b.bottom <= o.bottom + 1
                           && b.left >= o.left - 1 && b.right <= o.right + 1;
  const screen = {top: 0, bottom: h, left: 0, right: w};
  const gd = document.querySelector('#attention .js-plotly-plot');
  const out = {scrolled: window.scrollY, off: [], clipped: [], panels: gd._fullLayout.meta.panels.length};
  for (const sel of ['#attention .js-plotly-plot', '#tokens', '#probs .js-plotly-plot']) {
    const b = box(document.querySelector(sel));
    if (!inside(b, screen)) out.off.push([sel, b]);
  }
  // every axis title and every panel's plot area lie inside the figure and on the screen
  const svg = box(gd.querySelector('.main-svg'));
  for (const e of gd.querySelectorAll('.xtitle, .ytitle, .g-xtitle text, .g-ytitle text, .nsewdrag')) {
    const b = box(e);
    if (b.bottom - b.top < 1) continue;
    if (!inside(b, svg) || !inside(b, screen)) out.clipped.push([e.textContent || e.getAttribute('class'), b, svg]);
  }
  return out;
}"""


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
        arg=[n_tokens, contains], timeout=ANSWER_MS)
    return p.figure("attention")


def step(p: Page, n_tokens: int) -> list[str]:
    p.click("step")
    tokens = p.wait_tokens(n_tokens)
    wait_picture(p, n_tokens)
    return tokens
