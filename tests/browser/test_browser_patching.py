"""Activation patching in a real Chromium (Explore → Compare A / B → Patching), on the grammar model.

A head sweep on the default minimal pair draws the share of the her/him difference each head restores,
cell by cell the numbers the lab computes here, with the summary line naming the best head; a real mouse
click on that cell opens the head: the Explore attention shows it, Compare A / B draws its layer's B − A
with the head named, and its attention on both prompts is drawn side by side. A position sweep labels its
columns with the prompts' tokens. Screenshots at 1366×900, 1280×720 (also Large fonts) and 390 px, light
and dark; at each size nothing of the Patching part lies outside the window's width.

Every check waits for what it reads; nothing depends on how fast the machine is.
"""

from __future__ import annotations

import numpy as np
import pytest

from lab import patching
from lab.session import Session
from tests.support.browser import ANSWER_MS, Page
from tests.support.explore_page import open_page, step, wait_picture
from tests.support.heads_page import GRAMMAR, click_cell, greedy, plot_title, text, wait_text, wait_title

pytestmark = [pytest.mark.browser, pytest.mark.slow]

A = "anna found the key . she gave it to tom because he asked"  # the Compare tab's first pair, its default
B = "tom found the key . he gave it to anna because she asked"
N_TOKENS = 13  # the Explore prompt after one Step
OPEN_FROM_MENU = """name => {
  if (document.querySelector('#patch_run')?.offsetParent) return true;
  const entry = [...document.querySelectorAll('#head_tools .overflow-dropdown button')]
    .find(b => b.innerText.trim() === name && b.getBoundingClientRect().height > 0);
  if (entry) entry.click(); else document.querySelector("#head_tools button[aria-label='More tabs']")?.click();
  return false;
}"""
PATCHING_PART = ["#patching", "#patch_map", "#patch_head", "#patch_run", "#patch_stop"]


def local(what: str = "heads", direction: str = "denoising") -> patching.PatchResult:
    return Session().sweeps.run(GRAMMAR, A, B, "logit_diff", "her", "him", what, direction)


def open_compare(p: Page) -> None:
    greedy(p)
    step(p, N_TOKENS)
    tab = p.page.locator("#head_tools").get_by_role("tab", name="Compare A / B")
    if tab.is_visible():
        tab.click()
    else:  # on a narrow window the tab sits in the "More tabs" menu, which a redraw of the tools may close:
        # open it and choose the tab until the tab shows
        p.page.wait_for_function(OPEN_FROM_MENU, arg="Compare A / B", polling=500, timeout=ANSWER_MS)
    p.page.locator("#patch_run").wait_for(state="visible", timeout=ANSWER_MS)
    p.idle()  # the tab's own answer, before the form is read or used
    p.page.locator("#patch_run").scroll_into_view_if_needed()


def run_sweep(p: Page, title: str) -> None:
    p.click("patch_run")
    wait_title(p, "patch_map", title)


def shown_values(p: Page) -> np.ndarray:
    """The cells' values as plotly.js computed them from the figure it received (layer 0 first)."""
    z = p.page.evaluate("() => Array.from(document.querySelector('#patch_map .js-plotly-plot').calcdata[0][0].z,"
                        " row => Array.from(row, v => (v === null || Number.isNaN(v)) ? null : v))")
    return np.array(z, dtype=np.float64)


def outside_width(p: Page, width: int) -> list:
    return p.page.evaluate(
        """([sels, w]) => sels.map(s => [s, document.querySelector(s).getBoundingClientRect().toJSON()])
                               .filter(([s, b]) => b.width > 0 && (b.left < -1 || b.right > w + 1))""",
        [PATCHING_PART, width])


def both_themes(p: Page, path: str) -> None:
    p.page.screenshot(path=path + "-light.png")
    for dark in (True, False):
        p.click("dark")
        p.page.wait_for_function("d => document.body.classList.contains('dark') === d", arg=dark, timeout=ANSWER_MS)
        p.page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        if dark:
            p.page.locator("#patch_map").scroll_into_view_if_needed()
            p.page.screenshot(path=path + "-dark.png")
            # a pale cell's number stays dark on a dark page (the page's light figure text is not for cells)
            fills = p.page.evaluate("() => [...document.querySelectorAll('#patch_map .heatmap-label text')]"
                                    ".map(t => [t.textContent, getComputedStyle(t).fill])")
            pale = [fill for label, fill in fills if label == "0%"]
            assert pale and "rgb(230, 230, 230)" not in pale, fills


def test_head_sweep_heatmap_summary_and_a_click_opens_the_head(app_server, browser, shots):
    context, p = open_page(app_server, browser, 1366, 900)
    try:
        open_compare(p)
        assert p.page.input_value("#prompt_a textarea") == A and p.page.input_value("#patch_answer textarea") == "her"
        run_sweep(p, "Denoising")
        r = local()
        note = wait_text(p, "#patch_note", "restores")
        assert r.summary() in note  # "L1H0 restores 102 % of the her/him difference"
        assert r.summary().startswith("L1H0 restores")
        assert f"{r.setup.clean:.3f} on A, {r.setup.corrupted:.3f} on B" in note
        np.testing.assert_allclose(shown_values(p), r.values, atol=1e-5)  # float32 sums of another thread count
        assert "her/him difference restored" in plot_title(p, "patch_map")
        p.page.locator("#patch_map").scroll_into_view_if_needed()
        p.page.screenshot(path=str(shots / "patching-heads-1366x900.png"))
        # the best cell, clicked with the mouse, opens L1H0
        (best_layer, best_head, share), *_ = r.best(1)
        assert click_cell(p, "patch_map", best_layer, best_head) == f"{best_layer},{best_head}"
        wait_title(p, "patch_head", f"L{best_layer}H{best_head}")
        head_fig = p.figure("patch_head")
        assert f"{100 * share:.0f} % restored" in head_fig["title"]
        ticks = next(a["ticktext"] for a in head_fig["axes"].values() if a["ticktext"])
        assert "anna→tom" in ticks and "asked" in ticks
        assert "prompt A" in text(p, "#patch_head") and "prompt B" in text(p, "#patch_head")
        wait_title(p, "cmp_diff", f"Layer {best_layer}")
        notes = p.page.evaluate("() => document.querySelector('#cmp_diff .js-plotly-plot')._fullLayout"
                                ".annotations.map(a => a.text).join(' | ')")
        assert f"head {best_head} · {100 * share:.0f} % restored" in notes
        wait_picture(p, N_TOKENS, f"Layer {best_layer}, head {best_head}")  # Explore shows that head
        selected = p.page.evaluate("() => document.querySelector('#patch_map .js-plotly-plot')._fullLayout.meta"
                                   ".selected")
        assert selected == [best_layer, best_head]
        p.page.locator("#patch_head").scroll_into_view_if_needed()
        p.page.screenshot(path=str(shots / "patching-head-opened-1366x900.png"))
        assert p.console_errors == []
    finally:
        context.close()


def test_position_sweep_names_the_tokens_and_refusals_change_nothing(app_server, browser, shots):
    context, p = open_page(app_server, browser, 1366, 900)
    try:
        open_compare(p)
        p.choose("patch_what", patching.SWEEPS["attn"])
        p.page.locator("#patch_direction label", has_text="noising: B into A").click()
        p.idle()
        run_sweep(p, "Noising: B into A")
        r = local("attn", "noising")
        assert r.summary() in wait_text(p, "#patch_note", "makes")
        np.testing.assert_allclose(shown_values(p), r.values, atol=1e-5)
        ticks = p.figure("patch_map")["axes"]["xaxis"]["ticktext"]
        assert ticks[0] == "anna→tom" and ticks[-1] == "asked"
        p.page.locator("#patch_map").scroll_into_view_if_needed()
        p.page.screenshot(path=str(shots / "patching-attn-noising-1366x900.png"))
        before = plot_title(p, "patch_map")
        p.page.fill("#prompt_b textarea", "tom found the key")
        p.click("patch_run")
        assert "same number of tokens" in p.toast_text()
        assert plot_title(p, "patch_map") == before  # the last sweep stays as it was
        assert p.console_errors == []
    finally:
        context.close()


@pytest.mark.parametrize("size, large, scheme", [
    ((1280, 720), False, "light"), ((1280, 720), True, "light"), ((390, 844), False, "light"),
], ids=["1280x720", "1280x720-large", "390"])
def test_patching_fits_small_windows(app_server, browser, shots, size, large, scheme):
    context, p = open_page(app_server, browser, *size, scheme=scheme)
    try:
        if large:
            p.large_fonts()
        open_compare(p)
        run_sweep(p, "Denoising")
        wait_text(p, "#patch_note", "L1H0 restores")
        assert click_cell(p, "patch_map", 1, 0) == "1,0"
        wait_title(p, "patch_head", "L1H0")
        assert outside_width(p, size[0]) == []
        p.page.locator("#patch_map").scroll_into_view_if_needed()
        name = f"patching-{size[0]}x{size[1]}" + ("-large" if large else "")
        both_themes(p, str(shots / name))
        p.page.locator("#patch_head").scroll_into_view_if_needed()
        p.page.screenshot(path=str(shots / f"{name}-head.png"))
        assert p.console_errors == []
    finally:
        context.close()
