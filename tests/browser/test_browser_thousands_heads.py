"""A model of thousands of heads that nnsight runs, in a real Chromium: a random GPT-2 folder of 80 layers × 64
heads (5,120, the shape of a 70B model's attention) opened with `python app.py --model FOLDER --backend nnsight`.

It opens on one head with a caption that sends the reader to the Head roles map; after a Step that map draws
every head of every score compact on about one screen (5 maps, colours only), and a click on a cell shows that
head above; the status says where the model runs and what the Step cost; the logit lens, which reads the own
engine's modules, is refused by name; at 1280×720 and 390 px, light and dark. Every check waits for what it
reads; nothing depends on how fast the machine is.
"""

from __future__ import annotations

import pytest

from model.nnsight_backend import nnsight_available
from tests.support.browser import ANSWER_MS, Page
from tests.support.explore_page import PLOT, open_page
from tests.support.families import save_random_gpt2
from tests.support.heads_page import head_tab
from tests.support.plot_click import click_cell
from tests.support.server import AppServer

if not nnsight_available():  # checked without importing it (tests/lab/test_backend_lab.py says why)
    pytest.skip("the nnsight backend needs nnsight (requirements-scale.txt)", allow_module_level=True)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FOLDER = "gpt2-80x64"
MODEL = f"{FOLDER} (folder) (nnsight)"
LAYERS, HEADS = 80, 64
ROLES = "#head_roles .js-plotly-plot"


@pytest.fixture(scope="module")
def thousands_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("thousands")
    save_random_gpt2(tmp / FOLDER, LAYERS, HEADS, 64)
    server = AppServer({"DECODER_LAB_BUSY_WAIT_S": "600"}, tmp,
                       args=["--model", str(tmp / FOLDER), "--backend", "nnsight"]).start()
    yield server
    server.stop()


def open_and_step(p: Page) -> int:
    """Choose the model, check what it opens on, press Step; the number of tokens once the roles map is drawn."""
    p.choose("model", MODEL)
    caption = p.page.locator("#caption").inner_text(timeout=ANSWER_MS)
    assert f"{LAYERS * HEADS:,} heads" in caption and "Head roles map" in caption, caption
    assert p.page.locator("#head input").input_value() == "head 0"  # one head above, not a page of 64
    p.click("step")
    p.page.wait_for_function(
        f"() => {{ const n = document.querySelectorAll('#tokens .textfield .token').length; const gd = {PLOT};"
        " const m = gd && gd._fullLayout && gd._fullLayout.meta; return n > 0 && m && m.T === n; }",
        timeout=ANSWER_MS)
    n = len(p.tokens())
    head_tab(p, "Head roles")
    p.page.wait_for_function(f"() => {{ const m = document.querySelector('{ROLES}')?._fullLayout?.meta;"
                             f" return m && m.layers === {LAYERS} && m.heads === {HEADS}; }}", timeout=ANSWER_MS)
    return n


@pytest.mark.parametrize("size, theme", [((1280, 720), ""), ((390, 844), "?__theme=dark")], ids=["1280x720", "390"])
def test_thousands_of_heads_open_on_the_compact_roles_map(thousands_server, browser, shots, size, theme):
    context, p = open_page(thousands_server, browser, *size, query=theme)
    try:
        n = open_and_step(p)
        traces = p.page.evaluate(f"() => document.querySelector('{ROLES}')._fullData.map(t =>"
                                 " [t.texttemplate, t.z.length, t.z[0].length])")
        assert traces == [["", LAYERS, HEADS]] * 5  # five maps of every head, colours only
        box = p.page.locator(ROLES).bounding_box()
        assert box["width"] <= size[0] and box["height"] <= (1400 if size[0] > 700 else 3000), box
        status = p.page.locator("#status textarea").input_value()
        assert "runs the whole text once on nnsight in this process" in status and "the last took" in status
        p.page.locator("#head_roles").scroll_into_view_if_needed()
        name = "dark" if theme else "light"
        p.page.screenshot(path=str(shots / f"thousands-heads-roles-{size[0]}-{name}.png"))
        assert click_cell(p, "head_roles", 40, 33) == "40,33"
        p.page.wait_for_function(
            f"n => {{ const gd = {PLOT}; const m = gd && gd._fullLayout && gd._fullLayout.meta;"
            " return m && m.T === n && (gd._fullLayout.title.text || '').includes('Layer 40, head 33'); }",
            arg=n, timeout=ANSWER_MS)
        assert p.console_errors == []
        if not theme:  # the logit lens reads the own engine's modules: refused by name, in one toast
            head_tab(p, "Logit lens")
            said = p.toast_text()
            assert "logit lens" in said.lower() and "runs on nnsight" in said, said
    finally:
        context.close()
