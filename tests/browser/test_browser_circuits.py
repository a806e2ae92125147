"""The Circuits tab in a real Chromium, on the built-in grammar model and on a random GPT-2 of 12 layers × 12 heads
(`python app.py --model FOLDER`; one server holds both): at 1366×900, at a projector's 1280×720 with Large fonts
and on a 390 px phone, its four sections draw (direct logit attribution after a Step, head composition computed to
the end, one head's circuits opened, attribution patching run), every figure within the window's width with its
labels apart and its titles whole, light and dark, and the maps link to the rest of the page:

* a head's cell of the DLA map selects that head in Explore (its attention) and opens Inside one cell on it;
* a cell of a composition map, or a pair of the strongest-pairs list, selects the later (reading) head in Explore
  and opens the earlier (writing) head in One head's circuits, with a line naming the pair.

Screenshots of each section at each size, light and dark, go to the `shots` folder ($DECODER_LAB_SCREENSHOTS).
Every check waits for what it reads; nothing depends on how fast the machine is.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.browser import ANSWER_MS, Page
from tests.support.drawn import EXPORT_COVERS, check_drawn, check_readable
from tests.support.explore_page import PLOT, wait_picture
from tests.support.families import save_reference, sharpen
from tests.support.heads_page import click_cell, text, wait_text, wait_title
from tests.support.server import AppServer

pytest.importorskip("transformers")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FOLDER = "gpt2-12x12"
TWELVE = f"{FOLDER} (folder)"  # as the model list names a local folder
GRAMMAR = "grammar (built-in)"
# per model: the Explore prompt, attribution patching's A / B pair and its two answers (the grammar model's are
# the tab's own defaults), the DLA head clicked
SETUPS = {
    GRAMMAR: {"prompt": "anna found the key . she gave it to tom because he", "pair": None, "dla_head": (1, 2)},
    TWELVE: {"prompt": "the cat sat on the mat and the dog", "dla_head": (9, 4),
             "pair": ("the cat sat on the mat", "the dog sat on the mat", "␣the", "␣a")},
}
FIGURES = ["circuits_dla", "circuits_composition", "circuits_ov", "circuits_spectrum", "circuits_qk",
           "circuits_atp_scatter", "circuits_atp_maps"]
SECTIONS = ["circuits_dla_section", "circuits_composition_section", "circuits_head_section", "circuits_atp_section"]
SETTLE = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
META = "e => document.querySelector('#' + e + ' .js-plotly-plot')?._fullLayout?.meta || null"


@pytest.fixture(scope="module")
def circuits_server(tmp_path_factory):
    """The app with a random GPT-2 of 12 layers × 12 heads (head size 2) added by --model, beside the built-in
    grammar model."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tmp = tmp_path_factory.mktemp("circuits")
    cfg = GPT2Config(n_positions=64, vocab_size=300, n_embd=24, n_layer=12, n_head=12, bos_token_id=1,
                     eos_token_id=0)
    torch.manual_seed(0)
    ref = GPT2LMHeadModel(cfg).eval()
    sharpen(ref, seed=3, conv1d=True)
    save_reference(ref, tmp / FOLDER, 300)
    server = AppServer({"DECODER_LAB_BUSY_WAIT_S": "600"}, tmp, args=["--model", str(tmp / FOLDER)]).start()
    yield server
    server.stop()


def meta(p: Page, elem: str) -> dict | None:
    return p.page.evaluate(META, elem)


def wait_meta(p: Page, elem: str, check: str, arg=None) -> dict:
    """Wait until figure #`elem`'s layout.meta passes `check` (a JS expression of `m` and `a`); that meta."""
    p.page.wait_for_function(f"([e, a]) => {{ const m = ({META})(e); return !!m && ({check}); }}", arg=[elem, arg],
                             timeout=ANSWER_MS)
    return meta(p, elem)


def show_tab(p: Page, name: str) -> None:
    """Show one of the page's tabs; on a narrow window the last ones sit behind the tab bar's "More tabs"."""
    tab = p.page.get_by_role("tab", name=name, exact=True)
    if tab.is_visible():
        tab.click()
    else:  # the page's own tab bar comes first, before the head tools' inside Explore
        p.page.locator("button[aria-label='More tabs']").first.click()
        p.page.locator(".overflow-dropdown button, .overflow-menu button").filter(has_text=name).first.click()
    p.page.wait_for_function("n => [...document.querySelectorAll('[role=tab][aria-selected=true]')]"
                             ".some(t => t.innerText.trim() === n)", arg=name, timeout=ANSWER_MS)
    p.idle()


def fill_box(p: Page, elem: str, value: str) -> None:
    """Type `value` into text box #`elem` (a one-line box is an input, a longer one a textarea) until it holds it."""
    box = f"#{elem} input, #{elem} textarea"
    for _ in range(5):
        p.wait_uncovered(box)
        p.page.locator(box).first.fill(value)
        try:
            p.page.wait_for_function("([s, v]) => document.querySelector(s)?.value === v", arg=[box, value],
                                     timeout=2_000)
            return
        except Exception:  # noqa: BLE001 - typed while the page redrew the form: type it again
            continue
    raise AssertionError(f"the box #{elem} did not keep {value!r}")


def step_on(p: Page, model: str) -> int:
    """Choose the model, Step its prompt, and wait until the attention and the chart show the text: its length."""
    if model != GRAMMAR:
        p.choose("model", model)
    p.fill_text("prompt", SETUPS[model]["prompt"])
    p.click("step")
    p.page.wait_for_function(
        f"() => {{ const n = document.querySelectorAll('#tokens .textfield .token').length; const gd = {PLOT};"
        " const m = gd && gd._fullLayout && gd._fullLayout.meta;"
        " const probs = document.querySelector('#probs .js-plotly-plot');"
        " return n > 1 && m && m.T === n && probs && probs.textContent.includes('position ' + (n - 1)); }",
        timeout=ANSWER_MS)
    p.idle()
    return len(p.tokens())


def draw_all(p: Page, model: str) -> dict:
    """The tab's four sections drawn in turn; the composition map's meta."""
    show_tab(p, "Circuits")
    p.click("circuits_dla_run")
    wait_title(p, "circuits_dla", "Direct logit attribution")
    wait_text(p, "#circuits_dla_note", "actual")
    p.click("circuits_composition_run")
    comp = wait_meta(p, "circuits_composition", "m.viz === 'composition_map' && m.kind === 'k'")
    wait_text(p, "#circuits_pairs", "Strongest K-composition pairs")
    wait_text(p, "#circuits_composition_progress", "done")
    L, H = comp["layers"], comp["heads"]
    p.set_number("circuits_layer", L - 1)
    p.set_number("circuits_head", H - 1)
    p.click("circuits_head_run")
    for elem in ("circuits_ov", "circuits_spectrum", "circuits_qk"):
        wait_title(p, elem, f"L{L - 1}H{H - 1}")
    pair = SETUPS[model]["pair"]
    if pair:
        for elem, value in zip(("circuits_prompt_a", "circuits_prompt_b", "circuits_answer", "circuits_other"), pair):
            fill_box(p, elem, value)
    p.click("circuits_atp_run")
    wait_title(p, "circuits_atp_scatter", "Attribution patching")
    wait_text(p, "#circuits_atp_progress", "done")
    p.page.wait_for_function("() => document.querySelector('#circuits_atp_maps .js-plotly-plot')?.calcdata?.length",
                             timeout=ANSWER_MS)
    p.idle()
    return comp


def click_dla_head(p: Page, n: int, layer: int, head: int) -> None:
    """A head's cell of the DLA map: Explore shows that head, Inside one cell opens on it at the selected token (the
    last, after a Step), the map outlines it."""
    assert click_cell(p, "circuits_dla", layer, head, record="pick") == f"{layer},{head}"
    wait_text(p, "#circuits_dla_link", f"L{layer}H{head} is open in Explore")
    wait_meta(p, "circuits_dla", "JSON.stringify(m.selected) === JSON.stringify(a)", [layer, head])
    wait_picture(p, n, f"Layer {layer}, head {head}")  # Explore's attention (drawn while its tab is hidden)
    wait_text(p, "#inside_header", f"Layer {layer}, head {head}")
    p.page.wait_for_function("([l, h, q]) => document.querySelector('#inside_layer input')?.value === String(l)"
                             " && document.querySelector('#inside_head input')?.value === String(h)"
                             " && document.querySelector('#inside_query input')?.value === String(q)",
                             arg=[layer, head, n - 1], timeout=ANSWER_MS)  # the selected token: the last
    p.idle()


def wait_pair_opened(p: Page, n: int, pair: list[int]) -> None:
    """Pair (earlier layer, head, later layer, head) opened: the later head in Explore, the earlier one's circuits
    in One head's circuits (its boxes and its three figures), the note naming both, the pair outlined."""
    l0, h0, l1, h1 = pair
    wait_text(p, "#circuits_pair_note", f"L{l0}H{h0} → L{l1}H{h1}")
    for elem in ("circuits_ov", "circuits_spectrum", "circuits_qk"):
        wait_title(p, elem, f"L{l0}H{h0}:")
    p.page.wait_for_function("([l, h]) => document.querySelector('#circuits_layer input')?.value === String(l)"
                             " && document.querySelector('#circuits_head input')?.value === String(h)",
                             arg=[l0, h0], timeout=ANSWER_MS)
    wait_meta(p, "circuits_composition", "JSON.stringify(m.selected) === JSON.stringify(a)", pair)
    wait_picture(p, n, f"Layer {l1}, head {h1}")
    p.idle()


def click_pair_cell(p: Page, n: int, pair: list[int]) -> None:
    """The pair's cell of the composition map (too narrow for a cell per pair: its layers' cell, whose strongest
    pair a top pair is), clicked."""
    l0, h0, l1, h1 = pair
    m = meta(p, "circuits_composition")
    H = m["heads"]
    row, col = (l0, l1 - 1) if m["blocks"] else (l0 * H + h0, (l1 - 1) * H + h1)
    got = click_cell(p, "circuits_composition", row, col, record="pick")
    assert got == f"{l1},{h1}", (got, pair)
    wait_pair_opened(p, n, pair)


def click_pair_in_list(p: Page, n: int, index: int, pair: list[int]) -> None:
    """The `index`th pair of the strongest-pairs list (0: the first), clicked."""
    item = p.page.locator("#circuits_pairs li").nth(index)
    l0, h0, l1, h1 = pair
    assert f"L{l0}H{h0} → L{l1}H{h1}" in item.inner_text()
    p.idle()
    item.scroll_into_view_if_needed()
    item.click()
    wait_pair_opened(p, n, pair)


def outside_width(p: Page, width: int) -> list:
    """The tab's figures and sections that reach past the window's left or right edge."""
    return p.page.evaluate(
        """([sels, w]) => sels.map(s => [s, document.querySelector(s)?.getBoundingClientRect().toJSON()])
                               .filter(([s, b]) => !b || (b.width > 0 && (b.left < -1 || b.right > w + 1)))""",
        [[f"#{e}" for e in FIGURES + SECTIONS], width])


# Axis titles that run into a tick label, or reach past the figure's bottom: [title, tick label or "bottom"].
TITLES_CLEAR = """(sel) => {
  const gd = document.querySelector(sel + ' .js-plotly-plot');
  const svg = gd.querySelector('.main-svg').getBoundingClientRect();
  const ticks = [...gd.querySelectorAll('.xtick text, .ytick text')].filter(t => t.textContent.trim())
    .map(t => [t.textContent, t.getBoundingClientRect()]);
  const out = [];
  for (const title of gd.querySelectorAll('.g-xtitle text, .g-ytitle text')) {
    const a = title.getBoundingClientRect();
    if (!title.textContent.trim() || a.width === 0) continue;
    if (a.bottom > svg.bottom + 1 || a.top < svg.top - 1) out.push([title.textContent, 'edge']);
    for (const [t, b] of ticks) {
      const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (w > 1 && h > 1) out.push([title.textContent, t]);
    }
  }
  return out;
}"""


def check_tab(p: Page, width: int, phone: bool) -> None:
    """Every figure of the tab draws its data, readable, within the window's width; the page never scrolls
    sideways; on a phone the PNG / SVG buttons cover no text."""
    for elem in FIGURES:
        p.page.locator(f"#{elem}").scroll_into_view_if_needed()
        check_drawn(p, f"#{elem}")
        check_readable(p, f"#{elem}")
        assert p.page.evaluate(TITLES_CLEAR, f"#{elem}") == [], elem
        if phone:
            assert p.page.evaluate(EXPORT_COVERS, f"#{elem}") == [], elem
    assert outside_width(p, width) == []
    assert p.page.evaluate("() => document.documentElement.scrollWidth") <= width


def shots_of(p: Page, path: str) -> None:
    for section in SECTIONS:
        p.page.locator(f"#{section}").scroll_into_view_if_needed()
        p.page.evaluate(SETTLE)
        p.page.screenshot(path=f"{path}-{section.removeprefix('circuits_').removesuffix('_section')}.png")


def go_dark(p: Page) -> None:
    """◐ Dark (a button of the Explore tab), then back to the Circuits tab."""
    show_tab(p, "Explore")
    p.click("dark")
    p.page.wait_for_function("() => document.body.classList.contains('dark')", timeout=ANSWER_MS)
    show_tab(p, "Circuits")
    p.page.evaluate(SETTLE)


SIZES = {"1366x900": (1366, 900, False, False), "1280x720-large": (1280, 720, True, False),
         "390": (390, 844, False, True)}


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("model", [GRAMMAR, TWELVE], ids=["grammar", "12x12"])
def test_the_circuits_tab_draws_readably_and_its_maps_open_the_heads(circuits_server, browser, shots, model, size):
    width, height, large, phone = SIZES[size]
    extra = {"is_mobile": True, "has_touch": True, "device_scale_factor": 1} if phone else {}
    context = browser.new_context(viewport={"width": width, "height": height}, color_scheme="light", **extra)
    name = str(shots / f"circuits-{'grammar' if model == GRAMMAR else '12x12'}-{size}")
    try:
        p = Page(context, circuits_server.url)
        if large:
            p.large_fonts()
        n = step_on(p, model)
        comp = draw_all(p, model)
        L, H = comp["layers"], comp["heads"]
        assert L == (12 if model == TWELVE else L) and comp["top"], comp
        dla = meta(p, "circuits_dla")
        assert (dla["layers"], dla["heads"]) == (L, H) and dla["pick"] == "head"
        assert "Click a head's cell" in text(p, "#circuits_dla_hint")
        assert "Click a cell" in text(p, "#circuits_composition_hint")
        assert "Click a pair" in text(p, "#circuits_pairs")

        click_dla_head(p, n, *SETUPS[model]["dla_head"])
        assert comp["blocks"] == (phone and model == TWELVE), comp  # 132 × 132 pairs on a phone: 11 × 11 layers
        click_pair_cell(p, n, comp["top"][0])
        if len(comp["top"]) > 1:
            click_pair_in_list(p, n, 1, comp["top"][1])
        if large:  # the figures are laid out for Large fonts
            assert all(meta(p, e) is not None for e in FIGURES)
            ticks = p.page.evaluate("() => document.querySelector('#circuits_dla .js-plotly-plot')"
                                    "._fullLayout.yaxis.tickfont.size")
            assert ticks >= 16
            px = p.page.evaluate("() => parseFloat(getComputedStyle(document.querySelector('#circuits_pairs li'))"
                                 ".fontSize)")
            assert px >= 18

        shots_of(p, f"{name}-light")  # first: a figure that fails a check below can be looked at
        check_tab(p, width, phone)
        go_dark(p)
        shots_of(p, f"{name}-dark")
        check_tab(p, width, phone)
        assert p.console_errors == []
    finally:
        context.close()
