"""Every tool's figures on a model of GPT-2 small's sizes (12 layers × 12 heads, 768 wide, 50,257 tokens, 1,024
positions; random weights, `python app.py --model FOLDER`), in a real Chromium: each figure is read for what it
draws (heatmap pixels painted, bars and lines with a size: tests/support/drawn.py), its labels never overlap
and its titles are never cut; at a projector's 1280×720 with Large fonts the heads and the chart stay readable;
on a phone the PNG / SVG buttons cover no label. Screenshots at 1366×900, 1280×720 (also Large fonts) and
390 px, light and dark, go to the `shots` folder.

Every check waits for what it reads; nothing depends on how fast the machine is.
"""

from __future__ import annotations

import pytest

from tests.support.browser import ANSWER_MS, Page
from tests.support.drawn import EXPORT_COVERS, check_drawn, check_readable, drawn
from tests.support.explore_page import PLOT
from tests.support.gpt2_small import HEADS, LAYERS, WIDTH, build_gpt2_small
from tests.support.heads_page import click_cell, head_tab, wait_text, wait_title
from tests.support.plot_click import CELL, click_plot
from tests.support.server import AppServer

pytest.importorskip("transformers")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FOLDER = "gpt2-small"
MODEL = f"{FOLDER} (folder)"
PROMPT = "Anna found the key under the mat. She gave it to Tom because he asked Mary and John to the store"
A = "When Mary and John went to the store, John gave a drink to"
B = "When John and Mary went to the store, Mary gave a drink to"
SETTLE = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
# A first Step of GPT-2 small's sizes reads its 500 MB of weights: on a busy two-core machine that can take
# minutes. A hang guard, not a speed requirement.
FIRST_STEP_MS = 300_000
INSIDE = ["inside_inputs", "inside_qk", "inside_products", "inside_softmax", "inside_values", "inside_heads"]


@pytest.fixture(scope="module")
def gpt2_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpt2_sizes")
    build_gpt2_small(tmp / FOLDER)
    server = AppServer({"DECODER_LAB_BUSY_WAIT_S": "600"}, tmp, args=["--model", str(tmp / FOLDER)]).start()
    yield server
    server.stop()


def open_at(server, browser, width: int, height: int, *, dark: bool = False, large: bool = False,
            phone: bool = False) -> tuple:
    """A page of the app at this size (a phone: a touch screen), on the GPT-2 folder after one Step of PROMPT;
    (context, page, number of tokens). The model's own answer (its example prompt among it) is waited for
    before PROMPT is typed, and the Step's for a text longer than that example, so neither can be mistaken
    for the other."""
    extra = {"is_mobile": True, "has_touch": True, "device_scale_factor": 1} if phone else {}
    context = browser.new_context(viewport={"width": width, "height": height},
                                  color_scheme="dark" if dark else "light", **extra)
    p = Page(context, server.url + ("?__theme=dark" if dark else ""))
    if large:
        p.large_fonts()
    p.choose("model", MODEL)
    p.fill_text("prompt", PROMPT)
    p.click("step")
    try:
        p.page.wait_for_function(
            f"() => {{ const n = document.querySelectorAll('#tokens .textfield .token').length; const gd = {PLOT};"
            " const m = gd && gd._fullLayout && gd._fullLayout.meta;"
            " const probs = document.querySelector('#probs .js-plotly-plot');"
            " return n > 20 && m && m.T === n && probs && probs.textContent.includes('position ' + (n - 1)); }",
            timeout=FIRST_STEP_MS)
    except Exception as exc:  # noqa: BLE001 - say what the page shows instead
        shown = p.page.evaluate("() => [document.querySelector('#status textarea')?.value,"
                                " [...document.querySelectorAll('.toast-body')].map(e => e.innerText)]")
        raise AssertionError(f"the Step did not draw: {shown}") from exc
    return context, p, len(p.tokens())


def wait_view(p: Page, what: str) -> dict:
    """Wait until the attention figure's title holds `what` (or its message, for a view without panels)."""
    p.page.wait_for_function(
        f"s => {{ const gd = {PLOT}; const L = gd && gd._fullLayout; if (!L) return false;"
        " const text = (L.title && L.title.text || '') + (L.annotations || []).map(a => a.text).join(' ');"
        " return text.includes(s); }", arg=what, timeout=ANSWER_MS)
    p.page.evaluate(SETTLE)
    return p.page.evaluate(f"() => {PLOT}._fullLayout.meta || {{}}")


def choose_view(p: Page, view: str) -> None:
    """Pick an attention view, from the View menu (or its radio buttons)."""
    if p.page.locator("#view input[role=combobox]").count():
        p.choose("view", view)
    else:
        p.page.locator("#view").get_by_text(view, exact=True).click()
        p.idle()


def shot(p: Page, path, dark_too: bool = True) -> None:
    """Screenshots light and dark (◐ Dark), back to light at the end."""
    p.page.evaluate(SETTLE)
    p.page.screenshot(path=f"{path}-light.png")
    if dark_too:
        for dark in (True, False):
            p.click("dark")
            p.page.wait_for_function("d => document.body.classList.contains('dark') === d", arg=dark, timeout=ANSWER_MS)
            p.page.evaluate(SETTLE)
            if dark:
                p.page.screenshot(path=f"{path}-dark.png")


def open_inside(p: Page, query: int, key: int) -> None:
    """Open Inside one cell and click cell (query, key) of the one head shown."""
    p.page.locator("#inside .label-wrap").first.click()
    p.page.wait_for_selector("#inside_selected", timeout=ANSWER_MS)
    # the click counts once the panel's own answer (the selected token's cell) has come: it can no longer land
    # over the clicked cell's
    cell = click_plot(p, "attention", CELL, [query, key, 0])
    assert cell.endswith(f",{query},{key}"), cell
    p.page.wait_for_function(
        "([q, k]) => { const m = document.querySelector('#inside_softmax .js-plotly-plot')?._fullLayout.meta;"
        " return m && m.query === q && m.key === k; }", arg=[query, key], timeout=ANSWER_MS)
    p.page.wait_for_function("() => document.querySelector('#inside_inputs .js-plotly-plot')?._fullLayout.meta"
                             "?.viz === 'inside_vectors'", timeout=ANSWER_MS)
    p.idle()  # the six figures come in one answer, the head's matrices (when open) in the next


def test_the_attention_views_chart_and_head_tools_draw_at_gpt2_small_sizes(gpt2_server, browser, shots):
    """At 1366×900 each view of the attention, the next-token chart and the head tools (roles, lens, ablation,
    A / B comparison, patching and its head) draw their data, readable."""
    context, p, n = open_at(gpt2_server, browser, 1366, 900)
    try:
        meta = wait_view(p, "head")
        assert meta["T"] == n and len(meta["panels"]) == 1
        for sel in ("#attention", "#probs"):
            check_drawn(p, sel)
            check_readable(p, sel)
        probs = p.page.evaluate("() => document.querySelector('#probs .js-plotly-plot').data[0]")
        assert len(probs["hovertext"]) >= 5 and "0.000" not in probs["customdata"]  # small ones read 4.9e-4
        shot(p, shots / "gpt2-1366x900-head")
        p.choose("head", "H0–5")
        assert [q["head"] for q in wait_view(p, "heads 0–5 of 12")["panels"]] == list(range(6))
        check_drawn(p, "#attention")
        check_readable(p, "#attention")
        shot(p, shots / "gpt2-1366x900-heads", dark_too=False)
        choose_view(p, "scores")
        wait_view(p, "scores")
        check_drawn(p, "#attention")
        check_readable(p, "#attention")
        choose_view(p, "all layers")
        wait_view(p, "too many panels")
        check_readable(p, "#attention")  # the message is whole, not cut at both edges
        caption = wait_text(p, "#caption", "too many panels")
        assert f"{LAYERS} layers × {HEADS} heads" in caption and "in each panel" not in caption
        choose_view(p, "weights")
        p.choose("head", "head 3")
        wait_view(p, "head 3")

        # the head tools under the text
        for tab, elem in (("Head roles", "head_roles"), ("Logit lens", "lens")):
            head_tab(p, tab)
            p.page.wait_for_function(f"() => document.querySelector('#{elem} .js-plotly-plot')?.calcdata?.length",
                                     timeout=ANSWER_MS)
            p.page.locator(f"#{elem}").scroll_into_view_if_needed()
            check_drawn(p, f"#{elem}")
            check_readable(p, f"#{elem}")
        head_tab(p, "Ablate & edit")
        p.page.locator("#ablate_heads label", has_text="L11H11").click()
        wait_title(p, "effect", "KL")
        check_drawn(p, "#effect")
        check_readable(p, "#effect")
        p.click("clear_changes")  # the effect goes: no note, the chart's message instead of its KL
        p.page.wait_for_function("() => !(document.querySelector('#effect_note')?.innerText || '').trim()"
                                 " && !(document.querySelector('#effect .js-plotly-plot')?._fullLayout.title?.text"
                                 " || '').includes('KL')", timeout=ANSWER_MS)
        p.idle()
        head_tab(p, "Compare A / B")
        p.fill_text("prompt_a", A)
        p.fill_text("prompt_b", B)
        p.click("compare")
        for elem in ("cmp_diff", "cmp_dist", "cmp_scores"):
            p.page.wait_for_function(f"() => document.querySelector('#{elem} .js-plotly-plot')?.calcdata?.length",
                                     timeout=ANSWER_MS)
            check_drawn(p, f"#{elem}")
            check_readable(p, f"#{elem}")
        p.fill_text("patch_answer", "␣Mary")
        p.fill_text("patch_other", "␣John")
        p.click("patch_run")
        wait_title(p, "patch_map", "restored")
        p.page.locator("#patch_map").scroll_into_view_if_needed()
        got = check_drawn(p, "#patch_map")
        assert sum(t["n"] for t in got["traces"] if t["type"] == "heatmap") >= LAYERS * HEADS
        check_readable(p, "#patch_map")
        shot(p, shots / "gpt2-1366x900-patching", dark_too=False)
        assert click_cell(p, "patch_map", 5, 7) == "5,7"
        wait_title(p, "patch_head", "L5H7")
        check_drawn(p, "#patch_head")
        check_readable(p, "#patch_head")

        assert p.console_errors == []
    finally:
        context.close()


def test_inside_one_cell_and_the_positional_encoding_draw_at_gpt2_small_sizes(gpt2_server, browser, shots):
    """At 1366×900 Inside one cell (its six figures, the inputs' 768 columns all painted, and the head's
    matrices) and the positional encoding (1,024 × 768) draw their data, readable; the page holds no id twice."""
    context, p, n = open_at(gpt2_server, browser, 1366, 900)
    try:
        wait_view(p, "head")
        open_inside(p, n - 1, 2)
        for elem in INSIDE:
            p.page.locator(f"#{elem}").scroll_into_view_if_needed()
            check_drawn(p, f"#{elem}")
            check_readable(p, f"#{elem}")
        inputs = drawn(p, "#inside_inputs")
        assert [t["n"] for t in inputs["traces"]] == [4 * WIDTH]
        assert min(im["painted"] for im in inputs["images"]) > 0.5, inputs["images"]
        p.page.locator("#inside").scroll_into_view_if_needed()
        shot(p, shots / "gpt2-1366x900-inside")
        p.page.locator("#inside_matrices_section .label-wrap").click()
        p.page.wait_for_function("() => document.querySelector('#inside_matrices .js-plotly-plot')"
                                 "?._fullLayout.meta?.viz === 'inside_matrices'", timeout=ANSWER_MS)
        p.page.locator("#inside_matrices").scroll_into_view_if_needed()
        check_drawn(p, "#inside_matrices")
        check_readable(p, "#inside_matrices")

        # the positional encoding of this model (learned, 1,024 × 768)
        p.tab("Positional encoding")
        p.page.wait_for_function("() => [...document.querySelectorAll('#pe_table .js-plotly-plot, "
                                 "#pe_sim .js-plotly-plot')].every(g => g.calcdata && g.calcdata.length)"
                                 " && document.querySelectorAll('#pe_table .js-plotly-plot').length", timeout=ANSWER_MS)
        for sel in ("#pe_table", "#pe_sim"):
            check_drawn(p, sel)
            check_readable(p, sel)
        twice = p.page.evaluate("() => { const seen = {}; for (const e of document.querySelectorAll('[id]'))"
                                " if (e.id && !(e instanceof SVGElement) && !e.id.startsWith('plotly')) seen[e.id] = (seen[e.id] || 0) + 1;"
                                " return Object.entries(seen).filter(([, k]) => k > 1); }")
        assert twice == []
        assert p.console_errors == []
    finally:
        context.close()


def panel_px(p: Page) -> list[float]:
    """The drawn width of each attention panel, in px."""
    return p.page.evaluate(f"() => {{ const L = {PLOT}._fullLayout;"
                           " return L.meta.panels.map(q => L[q.xaxis.replace('x', 'xaxis')]._length); }")


@pytest.mark.parametrize("large", [False, True], ids=["normal", "large-fonts"])
def test_a_projector_shows_gpt2_heads_and_candidates_readably(gpt2_server, browser, shots, large):
    """At 1280×720 one head of a 23-token text and a page of six heads are drawn at a size whose token labels
    are large enough and dense enough to read (Large fonts: 16 px, every 3rd token for one head, every 4th at
    most for six, ≥ 130 px panels), the colour bar's ticks apart, the chart with at least five candidates; the
    six-figure Inside one cell panel reads whole at that size too."""
    context, p, n = open_at(gpt2_server, browser, 1280, 720, large=large)
    name = f"gpt2-1280x720{'-large' if large else ''}"
    try:
        meta = wait_view(p, "head")
        assert len(meta["panels"]) == 1
        for sel in ("#attention", "#probs"):
            check_drawn(p, sel)
            check_readable(p, sel)
        rows = "() => document.querySelector('#probs .js-plotly-plot')._fullLayout.yaxis.ticktext.length"
        assert p.page.evaluate(rows) >= 5
        if large:
            assert meta["label_px"] >= 16 and meta["label_step"] <= 3 and panel_px(p)[0] >= 200, (meta, panel_px(p))
        shot(p, shots / f"{name}-head")
        p.choose("head", "H0–5")
        meta = wait_view(p, "heads 0–5 of 12")
        check_drawn(p, "#attention")
        check_readable(p, "#attention")
        if large:
            assert meta["label_px"] >= 16 and meta["label_step"] <= 4 and min(panel_px(p)) >= 130, (meta, panel_px(p))
        shot(p, shots / f"{name}-heads")
        p.choose("head", "head 3")
        wait_view(p, "head 3")
        open_inside(p, n - 1, 2)
        for elem in INSIDE:
            p.page.locator(f"#{elem}").scroll_into_view_if_needed()
            check_drawn(p, f"#{elem}")
            check_readable(p, f"#{elem}")
        p.page.locator("#inside_softmax").scroll_into_view_if_needed()
        shot(p, shots / f"{name}-inside", dark_too=False)
        assert p.console_errors == []
    finally:
        context.close()


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_on_a_phone_gpt2_figures_read_whole_and_the_buttons_cover_nothing(gpt2_server, browser, shots, dark):
    """At 390 px on a touch screen (where the PNG / SVG buttons always show) the attention, the chart, the head
    roles, the logit lens and the six figures of Inside one cell draw their data with no label overlapping another, no title or subtitle cut
    at the right edge, and the buttons in a strip of their own, over none of a figure's text."""
    context, p, n = open_at(gpt2_server, browser, 390, 844, dark=dark, phone=True)
    name = f"gpt2-390-{'dark' if dark else 'light'}"
    try:
        wait_view(p, "head")
        assert p.page.evaluate("() => document.documentElement.scrollWidth") <= 390
        figures = ["#attention", "#probs"]
        for sel in figures:
            p.page.locator(sel).scroll_into_view_if_needed()
            check_drawn(p, sel)
            check_readable(p, sel)
        p.page.locator("#attention").scroll_into_view_if_needed()
        p.page.screenshot(path=str(shots / f"{name}-attention.png"))
        for tab, elem in (("Head roles", "head_roles"), ("Logit lens", "lens")):
            head_tab(p, tab)
            p.page.wait_for_function(f"() => document.querySelector('#{elem} .js-plotly-plot')?.calcdata?.length",
                                     timeout=ANSWER_MS)
            p.page.locator(f"#{elem}").scroll_into_view_if_needed()
            check_drawn(p, f"#{elem}")
            check_readable(p, f"#{elem}")
            figures.append(f"#{elem}")
            p.page.screenshot(path=str(shots / f"{name}-{elem}.png"))
        p.page.evaluate("() => window.scrollTo(0, 0)")
        open_inside(p, n - 1, 2)
        for elem in INSIDE:
            sel = f"#{elem}"
            p.page.locator(sel).scroll_into_view_if_needed()
            check_drawn(p, sel)
            check_readable(p, sel)
            figures.append(sel)
        for sel in figures:
            assert p.page.evaluate(EXPORT_COVERS, sel) == [], sel  # shown (a touch screen), covering nothing
        for elem in ("inside_inputs", "inside_softmax"):
            p.page.locator(f"#{elem}").scroll_into_view_if_needed()
            p.page.screenshot(path=str(shots / f"{name}-{elem}.png"))
        assert p.page.evaluate("() => document.documentElement.scrollWidth") <= 390
        assert p.console_errors == []
    finally:
        context.close()
