"""A text cut to the model's context says so where the text is shown (Explore), not only in the Status box
below it: the note above the text follows the status (ui.explore_tab.text_cut_note, lab.text.cut_lines)."""

from __future__ import annotations

import app
from lab.session import Session
from lab.text import CONTEXT_FULL, PROMPT_CUT, cut_lines
from ui.explore import step
from ui.explore_tab import text_cut_note

SORT = "sort digits (built-in)"  # a context of 16 characters
SHAKESPEARE = "shakespeare (built-in)"  # 64


def test_a_prompt_longer_than_the_context_is_said_above_the_text():
    s = Session()
    prompt = "5031249876543210="  # 17 characters
    _, tokens, status, _, _ = step(s, SORT, prompt, 0.0, 0, 1.0, 0, 0, "all", "weights")
    assert len(tokens) == 16 and [t for t, _ in tokens[:15]] == list(prompt[2:])  # cut, then slid by the step
    said = PROMPT_CUT.format(n=17, block=16)
    assert said in status.splitlines()  # the Status box says it, as before
    note = text_cut_note(status)
    full = CONTEXT_FULL.format(block=16)  # and the step slid it by one more
    assert note["visible"] is True and note["value"] == f"✂ {said}  \n✂ {full}"
    # a prompt that fits: nothing above the text
    _, _, status, _, _ = step(Session(), SORT, "503124=", 0.0, 0, 1.0, 0, 0, "all", "weights")
    assert cut_lines(status) == [] and text_cut_note(status) == {"__type__": "update", "value": "", "visible": False}


def test_a_context_that_fills_while_stepping_is_said_too():
    s = Session()
    prompt = "ROMEO:\nO, she doth teach the torches to burn bright! It seems s"[:63]  # 63 of 64 characters
    notes = []
    for _ in range(3):
        _, tokens, status, _, _ = step(s, SHAKESPEARE, prompt, 0.0, 0, 1.0, 0, 0, "all", "weights")
        notes.append(text_cut_note(status))
    assert [n["visible"] for n in notes] == [False, True, True] and len(tokens) == 64
    assert notes[-1]["value"] == f"✂ {CONTEXT_FULL.format(block=64)}"


def test_only_the_lines_of_a_cut_count_and_anything_else_is_no_note():
    for status in (None, "", 5, ["x"], "The prompt has many tokens", "The context is full", "junk\n" * 3):
        assert text_cut_note(status)["visible"] is False


def test_the_note_is_wired_to_the_status_above_the_text():
    demo = app.build_demo()
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    [fn] = [f for f in demo.fns.values() if f.name == "text_cut_note"]
    assert [i._id for i in fn.inputs] == [by_id["status"]._id]
    assert [o._id for o in fn.outputs] == [by_id["text_note"]._id]
    assert fn.api_visibility == "private" and by_id["text_note"].visible is False
    column = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "text_col")
    order = [getattr(b, "elem_id", None) for b in column.children]
    assert order.index("text_note") < order.index("tokens")  # read before the text itself
