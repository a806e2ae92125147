"""The training film in a real Chromium (issue 13): a built-in's film without training anything,
scrubbing to a frame, the player, and the score with its formula; and the API's /film."""

from __future__ import annotations

import json
import time

import pytest
from gradio_client import Client

from lab.models import DEFAULT_MODEL
from lab.session import Session
from test_browser import Page  # pytest puts tests/ on the path (rootdir-relative "prepend" imports)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TITLE = "() => document.querySelector('#film_attention .js-plotly-plot')?._fullLayout?.title?.text || ''"


def frame_value(p: Page) -> int:
    return int(float(p.page.locator("#film_frame input[type=number]").input_value()))


def test_a_builtin_film_scrubs_plays_and_explains_its_scores(train_page, shots):
    p = train_page
    film = Session().film(DEFAULT_MODEL)
    steps = [f.step for f in film.frames]
    last = f"Step {steps[-1]} of {film.total_steps}"
    p.page.wait_for_function(f"s => ({TITLE})().includes(s)", arg=last, timeout=30_000)
    # scrub to frame 5: the attention, the caption and the markers follow
    p.set_slider("film_frame", 5)
    p.page.wait_for_function(f"s => ({TITLE})().includes(s)", arg=f"Step {steps[5]} of", timeout=20_000)
    assert f"step {steps[5]} of {film.total_steps}" in p.page.locator("#film_caption").inner_text()
    marker = p.page.evaluate("() => document.querySelector('#film_loss .js-plotly-plot')._fullLayout.shapes"
                             ".map(s => s.x0)")
    assert steps[5] in marker
    # the score menu: induction, with its formula on the figure
    p.choose("film_score", "induction")
    p.page.wait_for_function("() => (document.querySelector('#film_scores .js-plotly-plot')?.textContent || '')"
                             ".includes('occurred earlier')", timeout=20_000)
    p.page.screenshot(path=str(shots / "film.png"), full_page=True)
    # play: the frames advance on their own; pause: they stop
    p.click("film_play")
    p.page.wait_for_function("() => Number(document.querySelector('#film_frame input[type=number]').value) >= 7",
                             timeout=20_000)
    p.click("film_play")
    time.sleep(1.5)
    paused = frame_value(p)
    time.sleep(1.5)
    assert frame_value(p) == paused
    assert p.console_errors == []


def test_the_film_endpoint_returns_a_frame(app_server):
    c = Client(app_server.url, verbose=False)
    film = Session().film("copy / induction (built-in)")
    attention, loss, scores, phases, caption = c.predict("copy / induction (built-in)", 3, 0, "induction",
                                                         api_name="/film")
    spec = json.loads(attention["plot"])
    assert spec["layout"]["title"]["text"].startswith(f"Step {film.frames[3].step} of {film.total_steps}")
    assert f"Frame 4 of {len(film.frames)}" in caption and "What changed" in phases
    with pytest.raises(Exception, match="frame"):
        c.predict("copy / induction (built-in)", 10_000, 0, "induction", api_name="/film")
