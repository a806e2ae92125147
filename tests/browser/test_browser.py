"""The app as a person sees it: a real Chromium drives the running server and checks the pictures.

Screenshots of each tab go to $DECODER_LAB_SCREENSHOTS (default: pytest's tmp dir); the README's
pictures are refreshed with `DECODER_LAB_SCREENSHOTS=assets python -m pytest tests/browser/test_browser.py`.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tests.support.browser import ANSWER_MS, Page, VIEWPORT, sampling_section

pytestmark = [pytest.mark.browser, pytest.mark.slow]

GRAMMAR_PROMPT = "anna found the key . she gave it to tom because he"
ALERT_PROMPT = "<img src=x onerror=alert(1)>"


def hex_rgb(color: str) -> tuple[int, int, int]:
    color = color.lstrip("#")
    return tuple(int(color[i : i + 2], 16) for i in (0, 2, 4))


def is_viridis(rgb: tuple[int, int, int], tolerance: float = 24.0) -> bool:
    """Whether a pixel is a colour of the weights' scale (Viridis), not background or hatch."""
    import plotly.colors

    stops = [hex_rgb(c) for c in plotly.colors.sequential.Viridis]
    fine = [tuple(a + (b - a) * t / 8 for a, b in zip(lo, hi)) for lo, hi in zip(stops, stops[1:]) for t in range(9)]
    return min(sum((u - v) ** 2 for u, v in zip(rgb, c)) ** 0.5 for c in fine) <= tolerance


@pytest.fixture
def app_page(app_server, browser):
    context = browser.new_context(viewport=VIEWPORT)
    page = Page(context, app_server.url)
    yield page
    context.close()


def test_page_loads_offline_with_default_model(app_page, shots):
    p = app_page
    assert p.page.locator("#model input").input_value() == "grammar (built-in)"
    assert p.page.locator("#prompt textarea").input_value() == GRAMMAR_PROMPT
    assert p.console_errors == []
    assert p.outside == [], f"requests left 127.0.0.1: {p.outside}"


def test_three_steps_grow_the_masked_attention(app_page, shots):
    p = app_page
    p.choose("head", "all heads")
    p.choose("layer", "layer 0")
    p.click("step")
    first = p.wait_tokens(13)
    p.click("step")
    p.wait_tokens(14)
    p.click("step")
    tokens = p.wait_tokens(15)
    assert tokens[:12] == GRAMMAR_PROMPT.split() and first[:12] == tokens[:12]
    p.page.wait_for_function(
        "() => { const gd = document.querySelector('#attention .js-plotly-plot');"
        " return gd._fullLayout.meta.T === 15 && (gd._fullLayout.title.text || '').startsWith('Layer 0'); }",
        timeout=ANSWER_MS,
    )
    fig = p.figure("attention")
    x, y = fig["axes"]["xaxis"], fig["axes"]["yaxis"]
    # T columns, T rows, token labels at a readable size: every token, or every k-th (the newest among them)
    at, font = p.page.evaluate("() => { const L = document.querySelector('#attention .js-plotly-plot')._fullLayout;"
                               " return [Array.from(L.yaxis.tickvals), L.yaxis.tickfont.size]; }")
    every = at[1] - at[0]
    assert font >= 9 and at == list(range((15 - 1) % every, 15, every))
    assert x["ticktext"] == y["ticktext"] == [tokens[i] for i in at]
    assert fig["images"] >= 4  # one heatmap per head drawn
    # Every cell above the diagonal shows the hatch of a masked cell (page background and grey
    # lines: no colour of the weights' scale); every cell on or below it shows a weight's colour.
    img = p.pixels("attention")
    for i, cy in zip(at, y["centers"], strict=True):
        for j, cx in zip(at, x["centers"], strict=True):
            rgb = img.getpixel((int(cx), int(cy)))
            if is_viridis(rgb) != (j <= i):
                img.save(shots / "masked-check-failed.png")
            assert is_viridis(rgb) == (j <= i), f"cell ({i},{j}) colour {rgb}, masked={j > i}"
    # the probability chart follows the picture, and marks the token this step chose
    p.page.wait_for_function(
        "tok => { const t = document.querySelector('#probs .js-plotly-plot')?.textContent || '';"
        " return t.includes('chosen') && t.includes(tok); }", arg=tokens[-1], timeout=ANSWER_MS)
    assert p.console_errors == []


def test_layer_and_head_selectors_change_the_figure(app_page):
    p = app_page
    p.choose("head", "all heads")
    p.click("step")
    p.wait_tokens(13)
    p.choose("layer", "layer 2")
    p.page.wait_for_function(
        "() => (document.querySelector('#attention .js-plotly-plot')._fullLayout.title.text || '').startsWith('Layer 2')",
        timeout=ANSWER_MS)
    assert p.figure("attention")["ntraces"] >= 4
    p.choose("head", "head 1")
    p.page.wait_for_function(
        "() => { const t = document.querySelector('#attention .js-plotly-plot')._fullLayout.title.text || '';"
        " return t.includes('Layer 2') && t.includes('head 1'); }", timeout=ANSWER_MS)
    fig = p.figure("attention")
    assert "xaxis2" not in fig["axes"]  # a single panel now
    p.choose("view", "scores")
    p.page.wait_for_function(
        "() => (document.querySelector('#attention .js-plotly-plot')._fullLayout.title.text || '').includes('score')",
        timeout=ANSWER_MS)


def _reset_with(p: Page, max_new: int, seed: int | None = None) -> None:
    """Reset the text, then set Generate's length (and the seed, with temperature 1)."""
    p.click("reset")
    p.wait_tokens(0)
    p.idle()  # the reset's answer, even where the text was empty already
    sampling_section(p, True)
    if seed is not None:
        p.set_slider("temperature", 1.0)
        p.set_number("seed", seed)
    p.set_slider("max_new", max_new)
    sampling_section(p, False)


def _wait_generate_done(p: Page) -> None:
    """Wait until the Generate's stream has ended and what was pressed meanwhile has been answered (its tracker is
    hidden, show_progress="hidden": the calls on their way say it)."""
    p.idle(timeout=300_000)


def _wait_tokens_match_status(p: Page, n: int | None = None) -> None:
    """Wait until the text shows as many tokens as the status says are in view (`n` of them, if given):
    the last answer is drawn whole, however long the page took."""
    p.page.wait_for_function(
        """n => { const m = /(\\d+) tokens in view/.exec(document.querySelector('#status textarea').value);
                  const shown = document.querySelectorAll('#tokens .textfield .token').length;
                  return m !== null && +m[1] === shown && (n === null || shown === n); }""",
        arg=n, timeout=120_000,
    )


def _generate(p: Page, seed: int, max_new: int = 12) -> list[str]:
    _reset_with(p, max_new, seed)
    p.click("generate")
    # the whole Generate is on the page: all its tokens, or fewer ending in <EOS> (a stream's first
    # updates already say "generated", and the tracker can look idle between two of them)
    p.page.wait_for_function(
        """n => { const s = document.querySelector('#status textarea').value;
                  const m = /\\((\\d+) generated\\)/.exec(s);
                  return m !== null && (+m[1] === n || s.includes('produced <EOS>')); }""",
        arg=max_new, timeout=120_000,
    )
    _wait_generate_done(p)
    _wait_tokens_match_status(p)
    return p.tokens()


def test_generate_is_reproducible_by_seed(app_page):
    p = app_page
    a = _generate(p, 7)
    b = _generate(p, 7)
    c = _generate(p, 8)
    assert len(a) > 12 and a == b
    assert a != c


def test_step_pressed_during_generate_waits_for_it(app_page):
    """Generate streams 200 tokens; a Step pressed meanwhile runs after it, on the same text, no error."""
    p = app_page
    _reset_with(p, 200)
    p.click("generate")
    p.click("step")
    _wait_tokens_match_status(p, 12 + 200 + 1)
    _wait_generate_done(p)
    _wait_tokens_match_status(p)
    n = len(p.tokens())
    # the Step came after the Generate or before it (Generate then went on with its text): one more token
    assert n == 12 + 200 + 1, n
    assert p.page.locator(".toast-body").count() == 0, p.toast_text()
    assert p.console_errors == []


def test_positional_encoding_tab(app_page, shots):
    p = app_page
    p.tab("Positional encoding")
    p.page.wait_for_selector("#pe_table g.hm image", timeout=ANSWER_MS)
    fig = p.figure("pe_table")
    assert "position" in (fig["axes"]["yaxis"]["title"] or "")
    assert "dimension" in (fig["axes"]["xaxis"]["title"] or "")
    from model.checkpoint import load_checkpoint

    positions = load_checkpoint(Path(__file__).resolve().parents[2] / "assets" / "grammar.safetensors").model.cfg.block_size
    assert max(fig["axes"]["yaxis"]["range"]) == pytest.approx(positions - 0.5)  # one row per position
    assert p.page.locator("#pe_sim g.hm image").count() == 1
    p.page.screenshot(path=str(shots / "positional.png"), full_page=True)


def test_train_stop_then_explore_the_new_model(app_page, shots):
    p = app_page
    p.open_train_tab()
    p.set_slider("steps", 2000)
    p.click("train_btn")

    def points() -> int:
        return p.page.evaluate(
            "() => { const gd = document.querySelector('#loss .js-plotly-plot');"
            " return gd && gd._fullData.length ? gd._fullData[0].x.length : 0; }"
        )

    p.page.wait_for_function("() => { const gd = document.querySelector('#loss .js-plotly-plot');"
                             " return gd && gd._fullData.length && gd._fullData[0].x.length > 0; }", timeout=120_000)
    # the curve gains points while training (or the run ended first, at its time limit: then this fails)
    n1 = points()
    p.page.wait_for_function("n => { const gd = document.querySelector('#loss .js-plotly-plot');"
                             " return gd._fullData[0].x.length > n"
                             " || document.querySelector('#train_status textarea').value.startsWith('Training '); }",
                             arg=n1, timeout=120_000)
    assert points() > n1, "the loss curve did not gain points while training"
    assert p.page.locator("#loss .js-plotly-plot").is_visible()
    p.page.locator("#stop_btn").dispatch_event("click")
    # Stop answers with the status the run ends with, into the box the run's last update also writes: in
    # either order the box ends saying who stopped it (the model list comes with the run's last update)
    status = p.wait_training_end()
    assert "stopped by you" in status, status
    p.page.wait_for_function("() => document.querySelector('#model input').value === 'my sort model'",
                             timeout=ANSWER_MS)
    assert p.page.locator("#train_status textarea").input_value() == status
    assert p.page.locator("#loss .js-plotly-plot").is_visible()
    p.tab("Explore")
    assert p.page.locator("#model input").input_value() == "my sort model"
    p.set_prompt("503124=")
    p.click("step")
    assert len(p.wait_tokens(8)) == 8
    assert p.console_errors == []


def test_corrupt_upload_shows_error_and_app_keeps_working(app_page, tmp_path):
    p = app_page
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"\x80\x04\x95" + random.Random(0).randbytes(300))  # the same bytes every run
    p.open_train_tab()
    p.page.locator("#upload input[type=file]").set_input_files(str(bad))
    assert "safetensors" in p.toast_text().lower()
    p.close_toasts()
    p.tab("Explore")
    p.click("step")
    assert len(p.wait_tokens(13)) == 13


def test_two_people_do_not_see_each_other(app_server, browser):
    ctx_a, ctx_b = browser.new_context(viewport=VIEWPORT), browser.new_context(viewport=VIEWPORT)
    try:
        a, b = Page(ctx_a, app_server.url), Page(ctx_b, app_server.url)
        a.set_prompt("tom found the map .")
        b.set_prompt("lisa likes the red ball .")
        a.click("step")
        b.click("step")
        ta, tb = a.wait_tokens(6), b.wait_tokens(7)
        a.click("step")
        ta = a.wait_tokens(7)
        assert ta[:5] == "tom found the map .".split() and tb[:6] == "lisa likes the red ball .".split()
        assert len(b.tokens()) == 7  # b did not grow when a stepped
        options = b.page.evaluate("() => document.querySelector('#model input').value")
        assert options == "grammar (built-in)"
    finally:
        ctx_a.close()
        ctx_b.close()


def test_bad_prompts_get_clear_messages(app_page):
    p = app_page
    p.set_prompt("   ")
    p.click("step")
    assert "prompt is empty" in p.toast_text()
    p.close_toasts()
    p.choose("model", "sort digits (built-in)")
    p.page.wait_for_function("() => document.querySelector('#prompt textarea').value === '503124='",
                             timeout=ANSWER_MS)
    p.set_prompt("0123456789" * 3)  # 30 tokens; the sort model's context is 16
    p.click("step")
    p.wait_tokens(16)
    status = p.page.locator("#status textarea").input_value()
    assert "keeps the last 16" in status
    p.set_prompt("12ab")
    p.click("step")
    assert "does not know these characters" in p.toast_text()
    assert not p.dialogs


def test_hostile_text_is_shown_as_text(app_page):
    """A model that knows '<', '>' and '=' is asked to show an HTML payload: it must stay text."""
    p = app_page
    p.open_train_tab()
    p.choose("corpus", "text")
    # picking a corpus sets the form to its recipe: wait for it before changing the steps
    p.page.wait_for_function("() => document.querySelector('#steps input[type=number]').value === '1000'",
                             timeout=ANSWER_MS)
    p.page.get_by_role("button", name="Your own text").click()
    text = (ALERT_PROMPT + " the cat sat on the mat. ") * 60
    p.set_slider("steps", 10)  # the form's own answers first, then the text, typed last
    p.fill_text("pasted", text)
    assert p.page.locator("#pasted textarea").input_value() == text  # still there when Train is clicked
    p.click("train_btn")
    status = p.wait_training_end()
    assert "finished after 10 steps" in status, status
    p.tab("Explore")
    p.set_prompt(ALERT_PROMPT)
    p.click("step")
    tokens = p.wait_tokens(len(ALERT_PROMPT) + 1)
    assert "".join(tokens[: len(ALERT_PROMPT)]) == ALERT_PROMPT.replace(" ", "␣")
    # tick labels are drawn as text: the first one is a literal "<", not markup and not "&lt;" (one head
    # enlarged: its cells hold a readable label for every other token, the first among them)
    p.choose("head", "head 0")
    p.page.wait_for_function("() => (document.querySelector('#attention .js-plotly-plot')._fullLayout.title.text"
                             " || '').includes('head 0')", timeout=ANSWER_MS)
    p.page.wait_for_selector("#attention .xaxislayer-above text", timeout=ANSWER_MS)
    ticks = p.page.eval_on_selector_all("#attention .xaxislayer-above text", "els => els.map(e => e.textContent)")
    at = p.page.evaluate("() => Array.from(document.querySelector('#attention .js-plotly-plot')._fullLayout.xaxis.tickvals)")
    assert ticks == [tokens[i] for i in at]  # each label the token at its position
    assert ticks[0] == "<" and all(t in ALERT_PROMPT.replace(" ", "␣") + tokens[-1] for t in ticks)
    # with the text and the figure drawn, no payload ran
    assert p.dialogs == []
    assert p.page.evaluate("() => document.querySelectorAll('img[src=x]').length") == 0
