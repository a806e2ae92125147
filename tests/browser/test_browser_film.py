"""The training film in a real Chromium: a built-in's film without training anything,
scrubbing to a frame, the player, and the score with its formula; and the API's /film."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from gradio_client import Client

from lab.catalogue.models import DEFAULT_MODEL
from lab.session import Session
from tests.support.browser import ANSWER_MS, Page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TITLE = "() => document.querySelector('#film_attention .js-plotly-plot')?._fullLayout?.title?.text || ''"


def frame_value(p: Page) -> int:
    return int(float(p.page.locator("#film_frame input[type=number]").input_value()))


def test_a_builtin_film_scrubs_plays_and_explains_its_scores(train_page, shots):
    p = train_page
    film = Session().film(DEFAULT_MODEL)
    steps = [f.step for f in film.frames]
    last = f"Step {steps[-1]} of {film.total_steps}"
    p.page.wait_for_function(f"s => ({TITLE})().includes(s)", arg=last, timeout=ANSWER_MS)
    # scrub to frame 5: the attention, the caption and the markers follow
    p.set_slider("film_frame", 5)
    p.page.wait_for_function(f"s => ({TITLE})().includes(s)", arg=f"Step {steps[5]} of", timeout=ANSWER_MS)
    assert f"step {steps[5]} of {film.total_steps}" in p.page.locator("#film_caption").inner_text()
    marker = p.page.evaluate("() => document.querySelector('#film_loss .js-plotly-plot')._fullLayout.shapes"
                             ".map(s => s.x0)")
    assert steps[5] in marker
    # the score menu: induction, with its formula on the figure
    p.choose("film_score", "induction")
    p.page.wait_for_function("() => (document.querySelector('#film_scores .js-plotly-plot')?.textContent || '')"
                             ".includes('occurred earlier')", timeout=ANSWER_MS)
    p.page.screenshot(path=str(shots / "film.png"), full_page=True)
    # play: the frames advance on their own; pause: they stop. The player's timer runs on the page's clock,
    # which the test moves (0.7 s of it per tick); a tick is seen as the call it sends
    config = httpx.get(p.url + "config", timeout=60).json()
    tick = {d["id"] for d in config["dependencies"] if any(event == "tick" for _, event in d["targets"])}
    sent = []
    p.page.on("request", lambda r: sent.append(1) if r.method == "POST" and "/queue/join" in r.url
              and json.loads(r.post_data or "{}").get("fn_index") in tick else None)
    p.page.clock.install()
    with p.page.expect_response(lambda r: "/run/predict" in r.url):
        p.click("film_play")
    deadline = time.monotonic() + 300  # a hang guard
    while frame_value(p) < 7 and time.monotonic() < deadline:
        p.page.clock.run_for(700)  # one tick's time (sent unless the last tick is still on its way)
        time.sleep(0.05)  # pacing only: the answers arrive whenever they do
    assert frame_value(p) >= 7 and sent  # the frames advanced by the player's ticks
    with p.page.expect_response(lambda r: "/run/predict" in r.url):
        p.click("film_play")
    p.page.evaluate("() => fetch('config').then(r => r.ok)")  # the page has taken the pause in
    before = len(sent)
    p.page.clock.run_for(7000)  # ten ticks' time
    p.page.evaluate("() => fetch('config').then(r => r.ok)")  # what a tick would have sent is out by now
    assert len(sent) == before, "the player went on ticking after the pause"
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


def test_the_film_opens_where_it_changes_most_and_a_saved_page_leaves_with_its_film(train_page):
    """The default model's film opens on layer 1 and its own role, pronoun → name (the largest change,
    tests/engine/test_film.py); a saved film page leaves the file box when another model's film is shown, and the
    next one saved is that model's."""
    p = train_page
    p.page.wait_for_function("() => document.querySelector('#film_score input')?.value === 'pronoun → name'",
                             timeout=ANSWER_MS)
    assert p.page.locator("#film_layer input").input_value() == "layer 1"
    p.click("film_page_btn")
    p.page.wait_for_function("() => document.querySelector('#film_page')?.innerText.includes('grammar_film_L1')",
                             timeout=ANSWER_MS)
    p.choose("film_model", "copy / induction (built-in)")
    p.page.wait_for_function("() => document.querySelector('#film_score input')?.value === 'copy match'",
                             timeout=ANSWER_MS)
    assert p.page.locator("#film_layer input").input_value() == "layer 0"  # the copying heads
    p.page.wait_for_function("() => !document.querySelector('#film_page').innerText.includes('.html')",
                             timeout=ANSWER_MS)
    p.click("film_page_btn")
    p.page.wait_for_function("() => document.querySelector('#film_page')?.innerText.includes('_film_L0')",
                             timeout=ANSWER_MS)
    shown = p.page.locator("#film_page").inner_text()
    assert "grammar" not in shown and "copy" in shown
    p.choose("film_layer", "layer 1")  # a page is one layer's: it leaves too
    p.page.wait_for_function("() => !document.querySelector('#film_page').innerText.includes('.html')",
                             timeout=ANSWER_MS)
    assert p.console_errors == []


LABEL_BOXES = """() => {
  const plot = document.querySelector('#film_loss .js-plotly-plot');
  const area = plot.querySelector('.nsewdrag').getBoundingClientRect();
  const labels = [...plot.querySelectorAll('g.annotation')].map(g => {
    const r = g.querySelector('text').getBoundingClientRect();
    return {text: g.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom};
  });
  const lines = [...plot.querySelectorAll('.shapelayer path')].map(p => p.getBoundingClientRect())
    .filter(r => r.width < 4 && r.height > area.height * 0.9).map(r => r.left + r.width / 2);
  return {area: {left: area.left, right: area.right, top: area.top}, labels, lines};
}"""


@pytest.mark.parametrize("size", [(1366, 900), (1280, 720), (390, 844)])
def test_phase_labels_are_apart_in_the_browser(app_server, browser, size):
    """The sort film's seven phases (four at step 64, two at 84, one at 258) and the copy film's four (one
    step): drawn in Chromium, no two labels overlap, each lies inside the plot, and no phase line but its own
    edge runs through a label."""
    from tests.support.browser import Page

    context = browser.new_context(viewport={"width": size[0], "height": size[1]})
    try:
        p = Page(context, app_server.url)
        if p.page.get_by_role("tab", name="Train").count():
            p.tab("Train")
        else:  # a phone: the tab is in the "More tabs" menu
            p.page.locator("button[aria-label='More tabs']").first.click()
            p.page.locator("button").filter(has_text="Train").last.click()
        p.page.wait_for_selector("#film_attention .js-plotly-plot", timeout=ANSWER_MS)
        p.idle()  # the tab's film, drawn when it is shown, before another model's is chosen
        for model in ("sort digits (built-in)", "copy / induction (built-in)"):
            p.choose("film_model", model)
            p.page.wait_for_function(  # this model's film is drawn: its task role on the scores, labels on the loss
                "s => (document.querySelector('#film_scores .js-plotly-plot')?.textContent || '').includes(s)"
                " && [...document.querySelectorAll('#film_loss g.annotation')].some(g => /L\\d/.test(g.textContent))",
                arg="sort match" if model.startswith("sort") else "copy match", timeout=ANSWER_MS)
            got = p.page.evaluate(LABEL_BOXES)
            labels = [b for b in got["labels"] if "L" in b["text"] and "kept" not in b["text"]]
            assert labels and got["lines"], model
            for i, a in enumerate(labels):
                assert got["area"]["left"] - 1 <= a["left"] and a["right"] <= got["area"]["right"] + 1, (model, a)
                assert all(not (a["left"] + 1 < x < a["right"] - 1) for x in got["lines"]), (model, a, got["lines"])
                for b in labels[i + 1:]:
                    apart = a["right"] <= b["left"] or b["right"] <= a["left"]
                    stacked = a["bottom"] <= b["top"] or b["bottom"] <= a["top"]
                    assert apart or stacked, (model, a, b)
        assert p.console_errors == []
    finally:
        context.close()
