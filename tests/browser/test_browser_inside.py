"""Inside one attention cell, in a real Chromium: a click on a cell of the grammar model's pronoun head
(layer 1, head 0, the row of "he") opens the panel on that cell; its softmax row outlines the clicked
share, which reads what the cell's hover read; the dot product is broken into its products; a click on
an entry of the head's matrices picks another cell; "columns" outlines who looks at a token; the
panel fits the window at every size, light and dark. Numbers are checked against lab.inside here."""

from __future__ import annotations

import pytest

from lab import inside as lab_inside
from tests.support.browser import ANSWER_MS, Page
from tests.support.explore_page import open_page, step
from tests.support.heads_page import greedy, local, text, wait_text
from tests.support.plot_click import CELL, click_plot

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HE, TOM = 11, 9  # the positions of "he" and "tom" in the grammar example


def cell_xy(p: Page, elem: str, row: float, col: float, panel: int = 0) -> list[float]:
    """Page coordinates of the centre of cell (row, col) of a figure's panel."""
    return p.page.evaluate(
        """([e, r, c, k]) => {
            const gd = document.querySelector('#' + e + ' .js-plotly-plot');
            const L = gd._fullLayout, sfx = k ? String(k + 1) : '';
            const xa = L['xaxis' + sfx], ya = L['yaxis' + sfx];
            const box = gd.querySelector('.main-svg').getBoundingClientRect();
            return [box.x + xa._offset + xa.l2p(c), box.y + ya._offset + ya.l2p(r)];
        }""", [elem, row, col, panel])


def hover_text(p: Page, xy: list[float]) -> str:
    """What the figure's hover label says over that point."""
    p.page.mouse.move(*xy)
    p.page.wait_for_function("() => (document.querySelector('#attention .hoverlayer')?.textContent || '')"
                             ".includes('weight')", timeout=ANSWER_MS)
    return p.page.evaluate("() => document.querySelector('#attention .hoverlayer').textContent")


def meta(p: Page, elem: str) -> dict:
    return p.page.evaluate(f"() => document.querySelector('#{elem} .js-plotly-plot')?._fullLayout.meta || null")


def wait_cell(p: Page, query: int, key: int) -> dict:
    """Wait until the panel's softmax row is drawn for (query, key); its layout.meta."""
    p.page.wait_for_function(
        "([q, k]) => { const m = document.querySelector('#inside_softmax .js-plotly-plot')?._fullLayout.meta;"
        " return m && m.query === q && m.key === k; }", arg=[query, key], timeout=ANSWER_MS)
    return meta(p, "inside_softmax")


def open_on_he_tom(p: Page) -> str:
    """Step, hover the cell ("he", "tom") of layer 1 head 0, click it: the hover's text."""
    step(p, 13)
    p.idle()  # the figure stays as it is now: the hover is read off it, then the same cell clicked
    hovered = hover_text(p, cell_xy(p, "attention", HE, TOM))
    assert click_plot(p, "attention", CELL, [HE, TOM, 0]) == f"1,0,{HE},{TOM}"
    wait_cell(p, HE, TOM)
    return hovered


def test_a_click_on_the_pronoun_heads_cell_works_it_through(app_server, browser, shots):
    context, p = open_page(app_server, browser)
    try:
        greedy(p)
        hovered = open_on_he_tom(p)
        s = local()
        data = lab_inside.cell(s.text, s.heads.settings, 1, 0, HE, TOM)
        # the hover read the weight the panel shows as the outlined share of the row
        assert '"he" (11)' in hovered and '"tom" (9)' in hovered and f"weight {data['weight']:.3f}" in hovered
        soft = wait_cell(p, HE, TOM)
        assert soft["shares"][TOM] == pytest.approx(data["weight"], abs=1e-5)
        bars = p.page.evaluate("() => document.querySelector('#inside_softmax .js-plotly-plot').data[0]")
        assert bars["marker"]["line"]["width"][TOM] > 0 and sum(bars["marker"]["line"]["width"]) == \
            bars["marker"]["line"]["width"][TOM]
        assert bars["text"][TOM] == f"{data['weight']:.3f}" and f"weight {bars['text'][TOM]}" in hovered
        header = wait_text(p, "#inside_header", "“tom” (9)")
        assert "Layer 1, head 0" in header and "“he” (11)" in header
        # the dot product, broken into its products and summed
        products = meta(p, "inside_products")
        # (the server's forward and this one may differ in float32's last bits)
        assert products["total"] == pytest.approx(data["dot"], rel=1e-5)
        assert products["score"] == pytest.approx(data["score"], rel=1e-5)
        assert products["order"][0] == max(range(len(data["products"])), key=lambda d: abs(data["products"][d]))
        title = p.page.evaluate("() => document.querySelector('#inside_products .js-plotly-plot')._fullLayout.title.text")
        assert f"q_i · k_j = Σ_d q_i[d] · k_j[d] = {products['total']:.4f}" in title
        assert f"{products['score']:.4f}" in text(p, "#inside_numbers")
        p.page.locator("#inside").scroll_into_view_if_needed()
        p.page.screenshot(path=str(shots / "inside-cell-1366x900.png"), full_page=True)
        # a click on an entry of the head's matrices (QKᵀ masked, row "he", column "found") picks that cell
        p.page.locator("#inside_matrices_section .label-wrap").click()
        p.page.wait_for_function("() => document.querySelector('#inside_matrices .js-plotly-plot')"
                                 "?._fullLayout.meta?.viz === 'inside_matrices'", timeout=ANSWER_MS)
        assert click_plot(p, "inside_matrices", CELL, [HE, 1, 5]) == f"1,0,{HE},1"
        wait_cell(p, HE, 1)
        wait_text(p, "#inside_header", "“found” (1)")
        assert p.console_errors == []
    finally:
        context.close()


def test_columns_outline_who_looks_at_a_token(app_server, browser):
    context, p = open_page(app_server, browser)
    try:
        greedy(p)
        step(p, 13)
        p.page.locator("#tokens .token").nth(TOM).click()
        box = "() => { const b = document.querySelector('#attention .lab-outline').getBoundingClientRect();" \
              " return [b.width, b.height]; }"
        p.page.wait_for_function("() => document.querySelector('#shade_note .lab-dir')", timeout=ANSWER_MS)
        w, h = p.page.evaluate(box)
        assert w > 4 * h  # a row
        p.page.locator("#shade_note .lab-dir[data-dir=column]").click()
        wait_text(p, "#shade_note", "how much each token looks at")
        w, h = p.page.evaluate(box)
        assert h > 4 * w  # a column
        titles = p.page.eval_on_selector_all("#tokens .token", "els => els.map(e => e.title)")
        weights = local().attention().weights[1][0]
        assert f"query {HE} → key {TOM}: weight {weights[HE, TOM]:.3f}" in titles[HE]
        assert "comes before the key" in titles[TOM - 1]
        p.page.locator("#shade_note .lab-dir[data-dir=row]").click()
        wait_text(p, "#shade_note", "looks in layer")
        # the colour menu's value-weighted attention: the caption says so, the hover reads lab.inside's norm
        p.choose("colour", "colour: ‖a·v W_O‖")
        p.page.wait_for_function("() => (document.querySelector('#attention .js-plotly-plot')?._fullLayout.title.text"
                                 " || '').includes('value-weighted')", timeout=ANSWER_MS)
        wait_text(p, "#caption", "Colours: ‖a·v W_O‖")
        s = local()
        norm = lab_inside.head(s.text, s.heads.settings, 1, 0)["value_weighted"][HE][TOM]
        p.page.mouse.move(*cell_xy(p, "attention", HE, TOM))
        p.page.wait_for_function("() => (document.querySelector('#attention .hoverlayer')?.textContent || '')"
                                 ".includes('‖a·v W_O‖')", timeout=ANSWER_MS)
        hovered = p.page.evaluate("() => document.querySelector('#attention .hoverlayer').textContent")
        assert f"‖a·v W_O‖ {norm:.3f}" in hovered, (hovered, norm)
        assert p.console_errors == []
    finally:
        context.close()


SIZES = [(1366, 900, False), (1280, 720, False), (1280, 720, True), (390, 844, False)]


@pytest.mark.parametrize("theme", ["", "?__theme=dark"], ids=["light", "dark"])
@pytest.mark.parametrize(("width", "height", "large"), SIZES, ids=["1366", "1280", "1280-large", "390"])
def test_the_panel_fits_the_window(app_server, browser, shots, theme, width, height, large):
    context, p = open_page(app_server, browser, width, height, query=theme)
    try:
        greedy(p)
        if large:
            p.large_fonts()
        step(p, 13)
        p.page.locator("#tokens .token").nth(HE).click()
        p.page.locator("#inside .label-wrap").first.click()
        p.page.wait_for_selector("#inside_selected", timeout=ANSWER_MS)
        p.idle()  # the panel's first answer (the token the tools last followed) before the button's
        p.page.locator("#inside_selected").click()
        wait_cell(p, HE, TOM)  # the selected token's row, at the key it gives the largest share
        p.idle()
        over = p.page.evaluate(
            """w => [...document.querySelectorAll('#inside .js-plotly-plot .main-svg:first-child')]
                .map(e => e.getBoundingClientRect()).filter(b => b.right > w + 1 || b.left < -1).length""", width)
        assert over == 0
        assert p.page.evaluate("() => document.documentElement.scrollWidth") <= width + 1
        p.page.locator("#inside_header").scroll_into_view_if_needed()
        name = f"inside-{width}x{height}{'-large' if large else ''}{'-dark' if theme else ''}.png"
        p.page.screenshot(path=str(shots / name))
        assert p.console_errors == []
    finally:
        context.close()
