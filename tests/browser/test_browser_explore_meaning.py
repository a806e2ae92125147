"""What the Explore page says is what it shows, in a real Chromium.

The caption above the attention follows the head and the text shown; a change made in the head tools
is named on the attention figure at once and a regeneration made under other changes goes; the
"after" bars of the probability chart follow the sampling sliders without a Step; the example menu
shows line breaks and names the prompt only while it is that example; a prompt with an unknown word
says where the vocabulary is, and the Vocabulary section lists it.
"""

from __future__ import annotations

import numpy as np
import pytest

from lab.catalogue.models import BUILTIN_MODELS, BUILTINS

from tests.support.browser import ANSWER_MS, sampling_section
from tests.support.explore_page import step
from tests.support.heads_page import GREEDY, P, head_tab, local, page, plot_title, text, wait_text, wait_title  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.slow]

GRAMMAR = "grammar (built-in)"
CAPTION = BUILTIN_MODELS[GRAMMAR].first_view.caption


def caption(p) -> str:
    return text(p, "#caption")


def test_the_caption_describes_the_head_and_text_shown(page):
    p = page
    assert CAPTION[:40] in caption(p)  # layer 1, head 0 on the first example: the built-in's own line
    tokens = step(p, 13)
    assert caption(p).startswith(CAPTION[:40])
    p.choose("head", "head 2")  # another head: a sentence read off its row of the last token
    said = wait_text(p, "#caption", "Layer 1, head 2:")
    s = local()
    row = s.attention().weights[1][2, -1]
    k = int(row.argmax())
    assert f"“{tokens[-1]}” puts its largest weight ({row[k]:.2f}) on “{tokens[k]}” (position {k})" in said
    assert "tom" not in said or tokens[k] == "tom"
    p.choose("head", "head 0")
    wait_text(p, "#caption", CAPTION[:40])
    p.click("reset")  # another text without "he": the built-in's line gives way once it is drawn
    p.wait_tokens(0)
    p.set_prompt("anna found the key . she")
    step(p, 7)
    said = wait_text(p, "#caption", "Layer 1, head 0: the row of the last token")
    assert "“he”" not in said and "0.76" not in said


def test_a_change_is_named_on_the_figure_and_an_old_regeneration_goes(page):
    p = page
    step(p, 13)
    head_tab(p, "Ablate & edit")
    p.page.locator("#ablate_heads label", has_text="L0H1").click()
    title = wait_title(p, "attention", "L0H1 ablated (zero)")  # at once: no other click redraws it
    assert "Layer 1" in title and "head 0" in title
    assert "With L0H1 ablated (zero):" in wait_text(p, "#caption", "With L0H1 ablated (zero):")
    p.click("regenerate")
    wait_text(p, "#regen", "with L0H1 zeroed")
    p.click("clear_changes")
    p.page.wait_for_function("() => !(document.querySelector('#regen')?.innerText || '').trim()", timeout=ANSWER_MS)
    p.page.wait_for_function(
        "() => !(document.querySelector('#attention .js-plotly-plot')?._fullLayout.title.text || '').includes('ablated')",
        timeout=ANSWER_MS)
    wait_text(p, "#caption", CAPTION[:40])  # the model as trained again: the built-in's line holds
    # a regeneration made under one change goes when another change replaces it
    p.page.locator("#ablate_heads label", has_text="L1H0").click()
    wait_title(p, "attention", "L1H0 ablated (zero)")
    p.click("regenerate")
    wait_text(p, "#regen", "with L1H0 zeroed")
    p.page.locator("#ablate_heads label", has_text="L2H3").click()
    wait_title(p, "attention", "L1H0, L2H3 ablated (zero)")
    p.page.wait_for_function("() => !(document.querySelector('#regen')?.innerText || '').trim()", timeout=ANSWER_MS)
    assert p.console_errors == []


def after_bars(p) -> tuple[list[float], list[float]]:
    """The probability chart's model bars and after bars, as drawn."""
    model, after = p.page.evaluate("() => { const d = document.querySelector('#probs .js-plotly-plot')._fullData;"
                                   " return [Array.from(d[0].x), Array.from(d[1].x)]; }")
    assert len(model) == len(after) >= 3
    return model, after


def test_the_after_bars_follow_the_sampling_sliders_at_once(page):
    p = page
    sampling_section(p, True)
    p.set_slider("temperature", 1.0)
    step(p, 13)
    p.page.wait_for_function("() => (document.querySelector('#probs .js-plotly-plot')?._fullData || []).length >= 2",
                             timeout=ANSWER_MS)
    model, after = after_bars(p)
    np.testing.assert_allclose(after, np.array(model) / sum(model) * sum(after), rtol=1e-3)  # T = 1: the same shape
    p.set_slider("temperature", 2.0)
    p.page.wait_for_function("() => (document.querySelector('#probs .js-plotly-plot')?._fullLayout.title.text || '')"
                             ".includes('under new settings')", timeout=ANSWER_MS)
    model, after = after_bars(p)
    assert len(p.tokens()) == 13  # nothing was generated
    # temperature 2: each after bar is the model's probability to the power 1/2, renormalised
    ratio = np.array(after) / np.sqrt(model)
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-3)
    p.set_slider("top_k", 1)
    p.page.wait_for_function("() => { const d = document.querySelector('#probs .js-plotly-plot')._fullData;"
                             " return Array.from(d[1].x).filter(v => v > 0).length === 1; }", timeout=ANSWER_MS)
    p.set_slider("top_k", 0)
    p.set_slider("temperature", 1.0)  # back to the settings it was drawn with: "drawn from this" again
    p.page.wait_for_function("() => (document.querySelector('#probs .js-plotly-plot')?._fullLayout.title.text || '')"
                             ".includes('was drawn from this')", timeout=ANSWER_MS)


def test_examples_keep_their_line_breaks_and_the_menu_names_only_the_prompt(page):
    p = page
    name = "shakespeare (built-in)"
    examples = BUILTIN_MODELS[name].examples
    p.choose("model", name)
    p.page.wait_for_function("e => document.querySelector('#prompt textarea').value === e", arg=examples[0],
                             timeout=ANSWER_MS)
    box = p.page.locator("#examples input")
    box.click()
    # this menu's own list (the model menu's may still be closing): the one its input controls
    menu = p.page.locator(f"[id='{box.get_attribute('aria-controls')}']")
    menu.get_by_role("option").first.wait_for(timeout=ANSWER_MS)
    options = [o.replace("✓", "").strip() for o in menu.get_by_role("option").all_inner_texts()]
    assert options == [e.replace("\n", " ⏎ ").strip() for e in examples]  # the line break is shown, not lost
    menu.get_by_role("option").nth(1).click()
    p.page.wait_for_function("e => document.querySelector('#prompt textarea').value === e", arg=examples[1],
                             timeout=ANSWER_MS)  # sent whole, with its line break
    p.set_prompt("ROMEO:\nBut soft")
    p.page.locator("#prompt textarea").press("End")  # an input event, as typing gives
    p.page.locator("#prompt textarea").type("!")
    p.page.wait_for_function("() => document.querySelector('#examples input').value === ''", timeout=ANSWER_MS)
    step(p, len(BUILTINS.get(name).tokenizer.encode("ROMEO:\nBut soft!")) + 1)
    p.click("reset")
    p.wait_tokens(0)
    p.idle()  # the reset's last link names the example the prompt is, if any: read the menu after it
    assert p.page.locator("#examples input").input_value() == ""  # the menu names no example the prompt is not


def test_an_unknown_word_points_to_the_vocabulary_which_lists_it(page):
    p = page
    p.set_prompt("anna found the zebra")
    p.click("step")
    toast = p.toast_text()
    assert "'zebra'" in toast and "Vocabulary" in toast
    p.close_toasts()
    p.page.get_by_text("Vocabulary", exact=True).click()
    p.page.wait_for_selector("#vocabulary_list .lab-piece", timeout=ANSWER_MS)
    pieces = p.page.eval_on_selector_all("#vocabulary_list .lab-piece", "els => els.map(e => e.textContent)")
    tok = BUILTINS.get(GRAMMAR).tokenizer
    assert pieces == [tok.piece(i) for i in range(tok.vocab_size)] and "zebra" not in pieces
    p.choose("model", "sort digits (built-in)")  # the section follows the model
    p.page.wait_for_function("() => document.querySelectorAll('#vocabulary_list .lab-piece').length === 13",
                             timeout=ANSWER_MS)
