"""The head tools through the page, in a real Chromium: head roles that follow each
Step and label the heads (badges on the attention panels too), a click on an overview cell that
shows that head, the logit lens following the selected token, ablation and an attention edit
with their effect, regeneration side by side, a head picked by clicking its attention panel,
and prompt A vs B. Numbers shown are checked against the same computation made here."""

from __future__ import annotations

import pytest


from tests.support.browser import ANSWER_MS
from tests.support.explore_page import open_page, step, wait_picture
from tests.support.heads_page import (
    GREEDY, click_cell, greedy, head_tab, local, page, plot_title, text, wait_text, wait_title,  # noqa: F401
)
from tests.support.plot_click import PANEL, click_plot

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_head_roles_follow_the_text_and_label_the_heads(page, shots):
    p = page
    step(p, 13)
    roles = local().heads.head_roles()
    note = wait_text(p, "#roles_note", "L1H0")
    assert f"L1H0 {roles.label(1, 0)}" in note  # "pronoun → name head: 0.76 ≥ 0.5"
    assert roles.label(1, 0) == "pronoun → name head: 0.76 ≥ 0.5"
    assert "pronoun → name 0.76" in plot_title(p, "attention")  # the badge on the head shown
    p.page.locator("#head_tools").scroll_into_view_if_needed()
    p.page.screenshot(path=str(shots / "heads-roles-1366x900.png"))
    # a click on an overview cell shows that head above
    click_cell(p, "head_roles", 2, 3)
    wait_picture(p, 13, "Layer 2, head 3")
    assert "pronoun → name 0.61" in plot_title(p, "attention")
    # the next Step recomputes the roles on the longer text
    step(p, 14)
    after = local(2).heads.head_roles()
    wait_text(p, "#roles_note", "L2H3" if after.label(2, 3) else "Labelled")
    assert all(f"L{lay}H{h} {after.label(lay, h)}" in text(p, "#roles_note")
               for lay in range(3) for h in range(4) if after.label(lay, h))


def test_logit_lens_follows_the_selected_token(page):
    p = page
    step(p, 13)
    p.tab("Logit lens")
    assert "after “asked” (position 12)" in wait_title(p, "lens", "asked")
    p.page.locator("#tokens .token").nth(11).click()
    assert "after “he” (position 11)" in wait_title(p, "lens", "“he”")


def test_ablate_edit_and_regenerate(page, shots):
    p = page
    step(p, 13)
    p.tab("Ablate & edit")
    p.page.locator("#ablate_heads label", has_text="L2H3").click()
    s = local()
    s.heads.set_ablation(["L2H3"], "zero", False)
    e = s.heads.effect()
    note = wait_text(p, "#effect_note", "L2H3 zeroed")
    assert f"KL(before ‖ after) = {e.kl_bits:.3f} bits" in note
    assert "KL(before ‖ after)" in wait_title(p, "effect", "KL")
    p.click("regenerate")
    regen = wait_text(p, "#regen", "with L2H3 zeroed")
    r = s.heads.regenerate(GREEDY, 24)
    assert " ".join(r.normal[:5]) in " ".join(regen.split())
    if r.first_difference is not None:
        assert p.page.locator("#regen .lab-first").count() == 2
    p.page.locator("#head_tools").scroll_into_view_if_needed()
    p.page.screenshot(path=str(shots / "heads-ablate-1366x900.png"))
    # an edit of the selected token's row: "he" in L1H0 looks only at "anna"
    p.page.locator("#tokens .token").nth(11).click()
    wait_text(p, "#query_note", "“he” (position 11)")
    p.page.locator("#edit_head input").click()
    p.page.get_by_role("option", name="L1H0", exact=True).click()
    p.page.locator("#edit_key input").click()
    p.page.get_by_role("option", name="0: anna").click()
    note = wait_text(p, "#effect_note", "attends to only “anna”")
    s.heads.clear_probe()
    s.heads.set_ablation(["L2H3"], "zero", False)
    s.select(11)
    s.heads.set_edit(1, 0, 11, 0)
    assert f"{s.heads.effect().kl_bits:.3f} bits" in note


def test_clicking_a_panel_picks_the_head_to_ablate(page):
    p = page
    p.choose("head", "all heads")
    step(p, 13)
    p.tab("Ablate & edit")
    p.page.locator("#picking input").check()
    # a click inside head 2's panel (the all-heads grid), once the tab's answer has come: it would undo the pick
    layer, head = map(int, click_plot(p, "attention", PANEL, 2, record="pick").split(","))
    assert head == 2
    label = f"L{layer}H2"
    p.page.wait_for_function(
        "l => [...document.querySelectorAll('#ablate_heads label')].some(e => e.innerText.trim() === l"
        " && e.querySelector('input').checked)", arg=label, timeout=ANSWER_MS)
    assert f"{label} zeroed" in wait_text(p, "#effect_note", label)


def test_compare_prompts(page, shots):
    p = page
    step(p, 13)
    p.tab("Compare A / B")
    p.click("compare")
    wait_title(p, "cmp_dist", "KL(A ‖ B)")
    assert "Both prompts have the same number of tokens" in text(p, "#cmp_notes")
    diff = p.figure("cmp_diff")
    ticks = next(a["ticktext"] for a in diff["axes"].values() if a["ticktext"])
    assert "anna→tom" in ticks and "she→he" in ticks
    p.page.locator("#head_tools").scroll_into_view_if_needed()
    p.page.screenshot(path=str(shots / "heads-compare-1366x900.png"))
    p.page.fill("#prompt_b textarea", "tom found the old key . he")
    p.click("compare")
    assert "13 and 7 tokens" in wait_text(p, "#cmp_notes", "tokens:")


@pytest.mark.parametrize("size", [(1280, 720), (390, 844)])
def test_head_tools_fit_small_windows(app_server, browser, shots, size):
    context, p = open_page(app_server, browser, *size)
    try:
        greedy(p)
        step(p, 13)
        wait_text(p, "#roles_note", "L1H0")
        for tab, elem in (("Head roles", "head_roles"), ("Logit lens", "lens"), ("Ablate & edit", "effect")):
            head_tab(p, tab)
            p.page.locator(f"#{elem}").wait_for(state="visible", timeout=ANSWER_MS)
            p.page.locator(f"#{elem}").scroll_into_view_if_needed()
            b = p.page.evaluate(f"() => document.querySelector('#{elem}').getBoundingClientRect().toJSON()")
            assert b["width"] <= size[0] and b["x"] >= 0, (tab, b)
        head_tab(p, "Head roles")
        p.page.locator("#head_roles").scroll_into_view_if_needed()
        p.page.screenshot(path=str(shots / f"heads-roles-{size[0]}.png"))
    finally:
        context.close()
