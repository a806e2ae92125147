"""Untrusted values reach every handler: text is quoted escaped, numbers are read from text one way, and a
value of the wrong type, unknown or unused, is refused in one sentence that changes nothing.

The handlers are called directly with a session that has a text (the running server's side of the same
calls, by function number and with lone surrogates in raw HTTP, is tests/api/test_every_call_answers.py).
"""

from __future__ import annotations

import inspect
import json
import re

import gradio as gr
import pytest
from gradio.helpers import special_args

import app
from lab import patching
from lab.catalogue.models import BUILTINS
from lab.checks import UserError, check_int, number_from_text, quoted, whole_numbers
from lab.display import Display, changed_display
from lab.session import Session
from ui import explore, film, heads, inside, inside_tab, share, train
from ui import patching as patching_ui
from ui.common import handler

GRAMMAR = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
HOSTILE_TEXT = ["x\udfffy", "a\x00b", "\u202egnp.exe", "x" * 10_000]
LEAKS = ("Traceback", 'File "', "/work", "/tmp", "Something went wrong", "invalid literal", "<class", "unhashable")


def with_text() -> Session:
    s = Session()
    app.step(s, GRAMMAR, P, 0.0, 0, 1.0, 0, 0, "all", "weights")
    return s


def refusal(fn, *args) -> str:
    """The message of the gr.Error that `fn(*args)` raises: one line of valid UTF-8, no Python in it."""
    with pytest.raises(gr.Error) as info:
        out = fn(*args)
        if inspect.isgenerator(out):
            list(out)
    msg = info.value.message
    msg.encode("utf-8")  # a lone surrogate here would be a message gradio cannot send
    assert "\n" not in msg and "\x00" not in msg and len(msg) <= 400, msg
    assert not any(leak in msg for leak in LEAKS), msg
    return msg


# ------------------------------------------------------------------------------ text quoted escaped


def test_quoted_text_is_escaped_cut_and_valid_utf8():
    assert quoted("x\udfffy") == r"'x\udfffy'"
    assert quoted("a\x00b\nc") == r"'a\x00b\nc'"
    assert quoted("\u202egnp.exe") == r"'\u202egnp.exe'"  # a direction override cannot turn the message round
    assert quoted("x" * 10_000) == "'" + "x" * 39 + "…'" and quoted("x" * 10_000, 10) == "'xxxxxxxxx…'"
    assert quoted("she said “hi”") == "'she said “hi”'"  # printable text stays as typed
    for text in HOSTILE_TEXT:
        quoted(text).encode("utf-8")


def test_a_refusal_that_holds_a_lone_surrogate_is_still_sent_escaped():
    """ui.common's last line of defence: a message that repeats a lone surrogate (had one slipped past
    `quoted`) reaches the person with the surrogate as its escape, and the call ends."""
    refuse = handler(lambda value: (_ for _ in ()).throw(UserError(f"bad {value}")))
    assert refusal(refuse, "x\udfffy") == r"bad x\udfffy"


def test_a_patching_answer_of_several_tokens_is_quoted_escaped():
    entry = BUILTINS.get(GRAMMAR)
    for answer in ("x\udfffy", "a\x00b", "she he " * 2000):
        with pytest.raises(UserError) as info:
            patching.make_metric(entry, "logit_diff", answer, " he")
        msg = str(info.value)
        msg.encode("utf-8")
        assert quoted(answer, 30) in msg and "tokens for this model" in msg and len(msg) < 300


def outcome(fn, args) -> tuple[str, str | None]:
    """("ok", None), or ("refused", the message) after `refusal`'s checks; anything else fails the test."""
    try:
        out = fn(*args)
        if inspect.isgenerator(out):
            list(out)
        return "ok", None
    except gr.Error:
        return "refused", refusal(fn, *args)


def test_every_endpoint_refuses_hostile_text_in_one_line_of_valid_utf8():
    """Every text argument of every public endpoint (as the page binds it), with a lone surrogate, a NUL, a
    direction override and 10,000 characters: a result, or a refusal that repeats the text only escaped."""
    demo = app.build_demo()
    endpoints = [fn for fn in demo.fns.values() if fn.fn is not None and fn.api_visibility == "public"]
    counts = {"ok": 0, "refused": 0}
    s = with_text()
    for fn in endpoints:
        for i, component in enumerate(fn.inputs):
            if not isinstance(component, (gr.Textbox, gr.Dropdown, gr.Radio)) or component.elem_id == "pasted":
                continue  # "pasted": a valid training, with text its corpus does not use (slow, nothing to refuse)
            for text in HOSTILE_TEXT:
                values = [s if isinstance(c, gr.State) else c.example_value() for c in fn.inputs]  # view_api's
                values[i] = text
                args, *_ = special_args(fn.fn, values, None, None)
                kind, msg = outcome(fn.fn, args)
                counts[kind] += 1
                if msg is not None:
                    assert not any(c in msg for c in ("\udfff", "\x00", "\u202e")), (fn.api_name, i, msg)
        if not s.tokens():  # a call that was not refused may have left the session without a text
            s = with_text()
    assert counts["refused"] > 100 and counts["ok"] > 0, counts


# ------------------------------------------------------------------------- numbers read from text one way


def test_numbers_are_read_from_text_one_way():
    for text, number in [("3", 3.0), (" -2 ", -2.0), ("0.5", 0.5), ("1e3", 1000.0), (".5", 0.5), ("7.", 7.0)]:
        assert number_from_text(text) == number
    # digits of other scripts, circled and superscript digits (str.isdigit() is true of "①" and "²"),
    # underscores, Python's words for infinity and NaN, text too long to be a number
    for text in ["①", "²", "٣", "1_000", "nan", "inf", "infinity", "", " ", "3x", "0x10", "1" * 41, None, 3, ["3"]]:
        assert number_from_text(text) is None, text
    assert whole_numbers("1,0,4,2", ",", 4) == [1, 0, 4, 2] and whole_numbers(" 1366 x900", "x", 2) == [1366, 900]
    for text in ["1,①,0,0", "1,0,4", "1,0,4,2,5", "1,-1,0,0", "1,0.5,0,0", "a,b,c,d", None, [1, 0, 4, 2]]:
        assert whole_numbers(text, ",", 4) is None, text
    assert check_int("layer", " 2 ", 0, 3) == 2 and check_int("layer", "2.0", 0, 3) == 2
    for text in ["①", "²", "٣", "1_0"]:
        with pytest.raises(UserError, match=f"^layer must be a whole number between 0 and 3; got {quoted(text)}$"):
            check_int("layer", text, 0, 3)


def test_the_inside_panels_selected_token_refuses_a_head_in_other_digits():
    """'①' as the Explore view's head: "Use the selected token" names the head, in words."""
    s = with_text()
    for head in ("①", "²", "zzz", "6-①"):
        msg = refusal(inside.selected_token, s, "", "", "", 1, head)
        assert msg.startswith("head must be a whole number between 0 and 3; got "), msg
    for page in ("all", "0-3", 2, "2"):  # what the Head menu sends: a grid of heads opens on its first
        header = inside.selected_token(s, "", "", "", 1, page)[0]
        assert f"head {2 if page in (2, '2') else 0}" in header
    for cell in ("1,①,0,0", "1,2,3", "1,2,x,0", ["1", "2", "0", "0"]):
        assert refusal(inside.pick_cell, s, cell).startswith("Click a cell of the attention figure")
    assert inside.pick_cell(s, "1,2,3,1")[0]["open"] is True


def test_clicks_and_window_sizes_in_other_digits_are_refused_in_words():
    s = with_text()
    assert refusal(heads.pick_head, s, "①,0", False, [], GRAMMAR, "weights").startswith("Click a cell of the")
    assert heads.pick_head(s, "1,2", False, [], GRAMMAR, "weights")[:2] == (1, 2)
    with pytest.raises(UserError, match="^screen must look like 1366x900.$"):
        changed_display(Display(), screen="²x900")
    assert (changed_display(Display(), screen="1280x720").width, changed_display(Display(), screen="1280x720").height) \
        == (1280, 720)


# -------------------------------------------------------------- page-only handlers: values of the wrong type


WRONG = [["x"], {"a": 1}, 5]  # where text (or a flag) is expected
NOT_NUMBERS = [["x"], {"a": 1}, True, "3"]  # where a number is expected (the Inside panel's boxes take "3")


def test_page_only_handlers_refuse_values_of_the_wrong_type_in_words():
    """The handlers a raw call by number reaches with a list where text is expected answered with the
    generic fault (the regeneration guard, the patching part's model switch) or quietly did nothing."""
    s = with_text()
    before = (list(s.decoder.ids), s.heads.settings, s.display)
    cases = [
        (heads.drop_stale_regeneration, lambda v: (s, v), "The regeneration shown must be text"),
        (patching_ui.model_switched, lambda v: (s, v), "The model must be given by its name in the list."),
        (train.corpus_defaults, lambda v: (v,), "corpus must be one of grammar, sort, copy, toy, text"),
        (film.follow_model, lambda v: (s, v), "model must be text"),
        (film.film_choices, lambda v: (s, v), "model must be text"),
        (heads.refresh, lambda v: (s, 0, "all", v), "The selected token must be given by its position", NOT_NUMBERS),
        (heads.pick_head, lambda v: (s, "1,2", v, [], GRAMMAR, "weights"), "must be on or off"),
        (explore.show_caption, lambda v: (s, v, 0, "all", "weights"), "The model must be given by its name"),
        (explore.show_caption, lambda v: (s, GRAMMAR, v, "all", "weights"), "^layer must be a whole number"),
        (explore.show_vocabulary, lambda v: (s, v), "The model must be given by its name"),
        (inside.open_panel, lambda v: (s, v, "", "", "", 1, 2), "The cell's boxes", NOT_NUMBERS[:3]),
        (inside.draw_matrices, lambda v: (s, 1, 2, v, ""), "The cell's boxes", NOT_NUMBERS[:3]),
        (inside_tab._matrices_if_open, lambda v: (s, v, "1", "2", "", ""), "must be true or false"),
        (train.train_model, lambda v: (s, "toy", v, None, "word", 1, 1, 8, 0, "learned", "pre", "gelu", 0.0, 1,
                                       3e-3, 0), "The pasted text must be text"),
    ]
    for fn, args, pattern, *values in cases:
        for value in values[0] if values else WRONG:
            msg = refusal(fn, *args(value))
            assert re.search(pattern, msg), (fn.__name__, value, msg)
    assert (list(s.decoder.ids), s.heads.settings, s.display) == before and s.models == {}
    assert heads.drop_stale_regeneration(s, None) is not None and explore.show_caption(s, GRAMMAR, 1, 0, "weights")


# ---------------------------------------------------------------- values not used, or not known: refused


def test_an_edit_switched_off_still_refuses_an_unknown_head():
    s = with_text()
    heads.edit_attention(s, "L1H0", "3")
    edited = s.heads.settings
    for head in ("L9H9", "nonsense", "L1H①", "x\udfffy"):
        msg = refusal(heads.edit_attention, s, head, "off")
        assert "is not a head" in msg or "this model has layers" in msg, msg
        assert s.heads.settings == edited  # nothing changed
    for head in (["L1H0"], 5):
        assert refusal(heads.edit_attention, s, head, "off") == "Choose the head whose row to edit, e.g. L1H0."
    heads.edit_attention(s, "L1H0", "off")
    assert s.heads.settings.edit is None


def test_a_link_a_session_file_or_numbers_for_an_unknown_model_are_refused():
    s = with_text()
    form = [P, 0.0, 0, 1.0, 0, 0, "all", "weights"]
    for name in ("no such model", "x\udfffy", ["grammar (built-in)"]):
        for fn, args in ((share.make_link, (s, name, *form)), (share.save_session, (s, name, *form)),
                         (share.export_numbers, (s, "probabilities", "csv", name, 0, "all"))):
            msg = refusal(fn, *args)
            assert msg.startswith(("Unknown model ", "The model must be given by its name")), msg
    assert refusal(share.make_link, s, GRAMMAR, ["a prompt"], *form[1:]) == "prompt must be text; got a list."
    assert "Link to this view" in share.make_link(s, GRAMMAR, *form)
    assert share.export_numbers(s, "probabilities", "csv", GRAMMAR, 0, "all").endswith(".csv")


def test_every_kind_of_numbers_the_download_offers_is_written():
    # export_numbers finds each kind's lab.export function by the kind's API name (share.EXPORTS, or a call it
    # spells out), and the lab's functions are not all named as the kinds are (logit_lens, effect)
    s = with_text()
    for what in share.NUMBERS.values():
        with open(share.export_numbers(s, what, "json", GRAMMAR, 0, "all"), encoding="utf-8") as f:
            written = json.load(f)["what"]
        assert written == ("attention" if what in ("weights", "scores") else what), what
