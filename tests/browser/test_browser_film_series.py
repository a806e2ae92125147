"""A film made from a series of checkpoints (`python -m model.film`) in a real Chromium: given with
`python app.py --model FILE.safetensors`, the Train tab's film viewer offers it, opens it where it changes
most, names its phase and scrubs to its first checkpoint; uploaded in the Train tab, the viewer follows
it. Every check waits for what it reads.
"""

from __future__ import annotations

import pytest

from model.checkpoint import load_checkpoint
from model.film_series import main as film_main
from tests.support.browser import ANSWER_MS, Page
from tests.support.series import PROBE, build_series, revisions
from tests.support.server import AppServer
from ui.film import film_opening

pytest.importorskip("transformers")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NAME = "series-film (file)"


@pytest.fixture(scope="module")
def series_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("series-browser")
    build_series(tmp / "gpt2")
    path = tmp / "series-film.safetensors"
    assert film_main([str(tmp / "gpt2"), "--revisions", ",".join(revisions()), "--probe", PROBE,
                      "--out", str(path)]) == 0
    server = AppServer({"DECODER_LAB_MODEL_HASHES": str(tmp / "hashes.json"), "DECODER_LAB_BUSY_WAIT_S": "600"},
                       tmp, args=["--model", str(path)]).start()
    yield server, path
    server.stop()


def wait_text(p: Page, elem: str, text: str) -> None:
    p.page.wait_for_function("([e, t]) => (document.querySelector('#' + e)?.innerText || '').includes(t)",
                             arg=[elem, text], timeout=ANSWER_MS)


def wait_value(p: Page, elem: str, shown: str) -> None:
    p.page.wait_for_function("([e, v]) => document.querySelector('#' + e + ' input')?.value === v",
                             arg=[elem, shown], timeout=ANSWER_MS)


def test_a_series_film_opens_in_the_film_viewer(series_server, browser):
    server, path = series_server
    film = load_checkpoint(path).film
    layer, score = film_opening(film)
    p = Page(browser.new_context(viewport={"width": 1366, "height": 900}), server.url)
    p.open_train_tab()
    p.choose("film_model", NAME)
    wait_text(p, "film_caption", "Frame 7 of 7: step 120 of 120")
    wait_value(p, "film_layer", f"layer {layer}")
    wait_value(p, "film_score", film.role(score).name)
    wait_text(p, "film_phases", film.phases()[0].sentence())
    p.set_slider("film_frame", 0)
    wait_text(p, "film_caption", "Frame 1 of 7: step 0 of 120")
    assert p.figure("film_attention")["title"].startswith("Step 0 of 120")
    # uploaded in the Train tab, the same file joins the list and the film viewer follows it
    p.page.locator("#upload input[type=file]").set_input_files(str(path))
    p.page.wait_for_function("() => document.querySelector('#upload_status textarea')?.value.startsWith('Loaded')",
                             timeout=ANSWER_MS)
    wait_value(p, "film_model", "uploaded: series-film")
    wait_text(p, "film_caption", "Frame 7 of 7: step 120 of 120")
    assert p.console_errors == [] and p.outside == []
