"""Session files (lab.sessionfile): a saved session opens in a fresh one with the same tokens and
the same numbers, value for value (the attention, every distribution a token was drawn from, the
head settings, the view); own models travel inside the file; hostile or inconsistent files are
refused with a sentence and change nothing."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from lab import sessionfile
from lab.checks import UserError
from lab.headsettings import ProbeSettings
from lab.session import MAX_LOG, Session, View
from model.generate import Sampling
from tests.support.sessions import assert_same_text

GRAMMAR, SORT = "grammar (built-in)", "sort digits (built-in)"
P = "anna found the key . she gave it to tom because he"
HOT = Sampling(temperature=1.0, seed=5)


def busy_session() -> Session:
    """A text made of every kind of action, with changing sampling settings and head settings."""
    s = Session()
    s.step(GRAMMAR, P, HOT)
    s.step(GRAMMAR, P, Sampling(temperature=0.7, top_k=5, seed=5))
    list(s.generate(GRAMMAR, P, Sampling(temperature=1.2, top_p=0.9, seed=5), 6))
    s.undo()
    s.step(GRAMMAR, P, HOT)
    s.heads.set_ablation(["L1H0", "L2H3"], "mean", False)
    s.heads.set_edit(0, 2, 11, 3)
    s.select(11)
    s.set_display(colour="log", presentation=True)
    s.show_tool("ablate")
    return s


def save(s: Session, tmp_path, name="s.json", view=View(1, 0, "weights"), model=GRAMMAR, prompt=P) -> str:
    path = tmp_path / name
    path.write_bytes(sessionfile.export_session(s, model, prompt, HOT, view))
    return str(path)


def test_a_saved_session_opens_the_same_value_for_value(tmp_path):
    s = busy_session()
    t = Session()
    opened = sessionfile.open_session(t, save(s, tmp_path))
    assert_same_text(s, t)
    assert opened.model == GRAMMAR and opened.view == View(1, 0, "weights") and opened.prompt == P
    assert t.heads.settings == s.heads.settings and t.query == 11
    assert (t.display.colour, t.display.presentation, t.display.tool) == ("log", True, "ablate")
    # the numbers the head tools show are the same too
    e, f = s.heads.effect(), t.heads.effect()
    np.testing.assert_array_equal(e.after, f.after)
    np.testing.assert_array_equal(s.heads.lens().probs, t.heads.lens().probs)
    # and the text goes on the same way: the sampler was restored where it was
    a, b = s.step(GRAMMAR, P, HOT).step, t.step(GRAMMAR, P, HOT).step
    assert a.token_id == b.token_id
    np.testing.assert_array_equal(a.probs, b.probs)


def test_a_session_without_a_text_keeps_model_and_prompt(tmp_path):
    s = Session()
    t = Session()
    opened = sessionfile.open_session(t, save(s, tmp_path, model=SORT, prompt="503124=", view=View(0, "all", "weights")))
    assert opened.model == SORT and opened.prompt == "503124=" and t.tokens() == []


def test_an_own_model_travels_inside_the_file(tmp_path, train_sort):
    s = Session()
    name = train_sort(s).run.name
    s.step(name, "503124=", HOT)
    list(s.generate(name, "503124=", HOT, 4))
    path = save(s, tmp_path, model=name, prompt="503124=", view=View(0, 1, "weights"))
    t = Session()
    opened = sessionfile.open_session(t, path)
    assert opened.model in t.models and opened.model.startswith("uploaded: ")
    assert_same_text(s, t)
    film_s, film_t = s.film(name), t.film(opened.model)
    assert [f.step for f in film_s.frames] == [f.step for f in film_t.frames]


def test_a_built_in_session_of_256_tokens_stays_small(tmp_path):
    s = Session()
    s.step(GRAMMAR, P, HOT)
    list(s.generate(GRAMMAR, P, HOT, 255))
    size = len(sessionfile.export_session(s, GRAMMAR, P, HOT, View(0, "all", "weights")))
    assert len(s.tokens()) == 256 and size <= 100_000, size


def test_a_text_of_too_many_actions_is_refused_by_name(tmp_path):
    s = Session()
    s.step(GRAMMAR, P, HOT)
    for _ in range(MAX_LOG // 2 + 1):
        s.undo()
        s.step(GRAMMAR, P, HOT)
    assert s.log[-1] is None and len(s.log) == MAX_LOG + 1  # it stopped growing
    with pytest.raises(UserError, match="too many to save"):
        sessionfile.export_session(s, GRAMMAR, P, HOT, View(0, "all", "weights"))


def _doc(tmp_path) -> dict:
    return json.loads((tmp_path / "s.json").read_bytes()) if (tmp_path / "s.json").exists() else \
        json.loads(open(save(busy_session(), tmp_path)).read())


def _mutate(doc: dict, path: list, value) -> dict:
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


HOSTILE = [
    (["format"], "a session", "not a session file"),
    (["version"], 99, "version '99'"),
    (["model", "builtin"], "no such model", "not one of this app's"),
    (["model", "sha256"], "0" * 64, "another version"),
    (["prompt"], 42, "prompt is missing"),
    (["prompt"], "zebra " * 3, "cannot be replayed|does not know"),
    (["seed"], -5, "seed is out of range"),
    (["seed"], True, "seed is missing"),
    (["actions"], {"do": "step"}, "actions is missing"),
    (["actions"], [{"do": "explode"}], "not a Step, Generate or Undo"),
    (["actions"], [{"do": "undo"}], "undoes a token"),
    (["actions"], [{"do": "step", "sampling": [1.0, 0, 1.0], "tokens": [10**9]}], "tokens this model does not have"),
    (["actions"], [{"do": "step", "sampling": [1.0, 0, 1.0], "tokens": [1, 2]}], "a Step of 2 tokens"),
    (["actions"], [{"do": "step", "sampling": [99.0, 0, 1.0], "tokens": [1]}], "temperature"),
    (["actions"], [{"do": "step", "sampling": "hot", "tokens": [1]}], "sampling settings"),
    (["actions"], [{"do": "generate", "sampling": [1.0, 0, 1.0], "tokens": []}], "tokens this model does not have"),
    (["actions"], [{"do": "step", "sampling": [0.0, 0, 1.0], "tokens": [0]}], "cannot be replayed"),  # greedy never picks it
    (["actions"], [{"do": "step", "sampling": [1.0, 0, 1.0], "tokens": [1]}] * (MAX_LOG + 1), "more than"),
    (["view", "layer"], 7, "view settings are out of range"),
    (["view", "head"], "everything", "view settings are out of range"),
    (["view", "colour"], "rainbow", "view settings"),
    (["view", "tool"], "hammer", "view settings"),
    (["view", "query"], 999, "selected token"),
    (["view", "presentation"], "yes", "large-fonts"),
    (["probe", "heads"], ["L9H9"], "head settings do not fit"),
    (["probe", "mode"], "shuffle", "head settings do not fit"),
    (["probe", "edit"], {"layer": 0, "head": 0, "query": 2, "key": 9}, "head settings do not fit"),
    (["probe", "edit"], "everything", "head settings do not fit"),
    (["sampling", "top_p"], 7, "sampling settings are out of range"),
    (["model"], KeyError, "model is missing"),
]


@pytest.mark.parametrize("path, value, fragment", HOSTILE)
def test_hostile_files_are_refused_and_change_nothing(tmp_path, path, value, fragment):
    good = json.loads(open(save(busy_session(), tmp_path, "good.json")).read())
    if path == ["prompt"] and isinstance(value, str):  # a prompt the replayed tokens do not fit
        good["actions"] = [{"do": "step", "sampling": [0.0, 0, 1.0], "tokens": [5]}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_mutate(good, path, value)))
    t = busy_session()
    before = (t.tokens(), list(t.models), t.heads.settings, t.query, t.display, list(t.log))
    with pytest.raises(UserError, match=fragment):
        sessionfile.open_session(t, str(bad))
    assert (t.tokens(), list(t.models), t.heads.settings, t.query, t.display, list(t.log)) == before


@pytest.mark.parametrize("content, fragment", [
    (b"\x89PNG\r\n\x1a\n", "not JSON"), (b"[1, 2, 3]", "not a session file"), (b"{" * 100_000, "not JSON"),
    (b'{"format": "decoder-lab-session"', "not JSON"), ("ünïcödé".encode("latin-1"), "not JSON"),
])
def test_files_that_are_not_sessions(tmp_path, content, fragment):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    with pytest.raises(UserError, match=fragment):
        sessionfile.open_session(Session(), str(bad))
    with pytest.raises(UserError, match="Choose a session file"):
        sessionfile.open_session(Session(), None)


def test_a_damaged_own_model_is_refused(tmp_path):
    doc = json.loads(open(save(busy_session(), tmp_path)).read())
    doc["model"] = {"name": "mine", "checkpoint": base64.b64encode(b"not a checkpoint at all").decode()}
    (tmp_path / "m.json").write_text(json.dumps(doc))
    t = Session()
    with pytest.raises(UserError, match="not a Decoder Lab model"):
        sessionfile.open_session(t, str(tmp_path / "m.json"))
    assert not t.models
    doc["model"] = {"name": "mine", "checkpoint": "!!!not base64!!!"}
    (tmp_path / "m.json").write_text(json.dumps(doc))
    with pytest.raises(UserError, match="base64"):
        sessionfile.open_session(t, str(tmp_path / "m.json"))


def test_a_file_over_the_limit_is_refused_before_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(sessionfile, "MAX_FILE_BYTES", 100)
    with pytest.raises(UserError, match="over the"):
        sessionfile.open_session(Session(), save(busy_session(), tmp_path))


# ------------------------------------------------------- every file the app writes opens again


def save_through_page(s: Session, model, prompt, layer, head, view="weights") -> str:
    """"Save session" as the page calls it (the form's values)."""
    from ui import share

    path, _ = share.save_session(s, model, prompt, *HOT_FORM, layer, head, view)
    return path


HOT_FORM = (1.0, 0, 1.0, 5)


def open_through_page(t: Session, path: str):
    from ui import share

    return share.open_session(t, path)


def test_a_session_showing_all_heads_of_a_layer_reopens(tmp_path, train_sort):
    """Own models open on all heads of layer 0: a file saved so, with a text or without, opens on it."""
    s = Session()
    name = train_sort(s, layers=2).run.name
    t = Session()
    out = open_through_page(t, save_through_page(s, name, "503124=", 0, "all"))  # no text yet
    assert out[10]["value"] == "all" and t.tokens() == []
    s.step(name, "503124=", HOT)
    t = Session()
    out = open_through_page(t, save_through_page(s, name, "503124=", 1, "all"))
    assert (out[9]["value"], out[10]["value"]) == (1, "all") and out[8].plot
    assert_same_text(s, t)
    # a file written before "all" was spelt out (head: null) opens too
    doc = json.loads(open(save_through_page(s, name, "503124=", 0, "all")).read())
    doc["view"]["head"] = None
    (tmp_path / "null.json").write_text(json.dumps(doc))
    assert open_through_page(Session(), str(tmp_path / "null.json"))[10]["value"] == "all"


def test_heads_chosen_after_reset_reopen_and_stay_for_the_next_text(tmp_path):
    s = Session()
    s.step(SORT, "503124=", HOT)
    s.select(3)
    s.heads.set_edit(0, 1, 3, 1)
    s.reset()
    s.heads.set_ablation(["L1H2"], "mean", False)
    assert s.heads.settings.edit is None  # the edited row went with its text
    t = Session()
    open_through_page(t, save_through_page(s, SORT, "503124=", 0, 2))
    assert t.heads.settings == s.heads.settings and t.tokens() == []
    a, b = s.step(SORT, "503124=", HOT).step, t.step(SORT, "503124=", HOT).step
    assert a.token_id == b.token_id and t.heads.settings.heads == ((1, 2),)
    np.testing.assert_array_equal(s.heads.effect().after, t.heads.effect().after)


def test_head_settings_of_another_model_are_not_saved_with_this_one(tmp_path):
    s = Session()
    s.step(GRAMMAR, P, HOT)
    s.reset()
    s.heads.set_ablation(["L2H3"], "zero", False)  # the grammar model has layer 2; sort does not
    s.select_model(SORT)
    assert s.heads.settings == ProbeSettings()
    t = Session()
    open_through_page(t, save_through_page(s, SORT, "503124=", 0, 2))
    assert t.heads.settings == ProbeSettings()


def test_an_edit_whose_row_slid_out_of_the_window_reopens(tmp_path):
    """The sort model keeps 16 tokens: after 19 the edited row's key has left the window; the file
    keeps the edit, and the opened session says what the saved one said."""
    s = Session()
    s.step(SORT, "503124=", HOT)
    s.step(SORT, "503124=", HOT)
    s.select(8)
    s.heads.set_edit(0, 1, 8, 1)
    list(s.generate(SORT, "503124=", HOT, 10, force=[5] * 10))  # the tokens forced: no <EOS> ends it early
    assert len(s.decoder.ids) == 19 and s.decoder.start > 1  # the key (position 1) is out of the window
    with pytest.raises(UserError, match="no longer in the text shown") as said:
        s.heads.effect()
    t = Session()
    open_through_page(t, save_through_page(s, SORT, "503124=", 0, 1))
    assert t.heads.settings == s.heads.settings and t.heads.settings.edit is not None
    assert_same_text(s, t)
    with pytest.raises(UserError) as again:
        t.heads.effect()
    assert str(again.value) == str(said.value)


def page_snapshot(t: Session):
    return (t.tokens(), list(t.models), t.heads.settings, t.query, t.display, list(t.log), t.prompt, t.model_name,
            None if t.decoder is None else list(t.decoder.ids))


@pytest.mark.parametrize("path, value, fragment", [
    (["view", "head"], "everything", "view settings"), (["probe", "heads"], ["L9H9"], "head settings"),
    (["actions"], [{"do": "undo"}], "undoes a token"), (["model", "sha256"], "0" * 64, "another version"),
])
def test_a_refused_file_leaves_the_page_as_it_was(tmp_path, path, value, fragment):
    """Through the page's handler: the refusal is a sentence, and the session (text, models, head settings,
    view) is exactly as before."""
    import gradio as gr

    good = json.loads(open(save(busy_session(), tmp_path, "good.json")).read())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_mutate(good, path, value)))
    t = busy_session()
    before = page_snapshot(t)
    with pytest.raises(gr.Error, match=fragment):
        open_through_page(t, str(bad))
    assert page_snapshot(t) == before


# ------------------------------------------------------- a file without a text: the prompt box


def _form_file(tmp_path, prompt) -> str:
    doc = json.loads(sessionfile.export_session(Session(), SORT, "503124=", HOT, View(0, 2, "weights")))
    assert doc["actions"] == []
    doc["prompt"] = prompt
    path = tmp_path / "form.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("prompt, fragment", [
    ("1" * 2001, "2,001 characters; the limit is 2,000"),
    ("7" * 10_000_000, "10,000,000 characters"),
    ("503124=zebra", "does not know these characters"),
], ids=["2001-characters", "10-MB", "unknown-characters"])
def test_a_file_without_a_text_keeps_the_limits_of_typing(tmp_path, prompt, fragment):
    t = busy_session()
    before = page_snapshot(t)
    with pytest.raises(UserError, match=fragment) as info:
        sessionfile.open_session(t, _form_file(tmp_path, prompt))
    assert prompt[:50] not in str(info.value) and len(str(info.value)) < 400  # not echoed back
    assert page_snapshot(t) == before


def test_a_file_without_a_text_opens_with_a_readable_or_blank_prompt(tmp_path):
    for prompt in ("503124=", "", "   "):
        assert sessionfile.open_session(Session(), _form_file(tmp_path, prompt)).prompt == prompt
    long = "5" * 40  # more tokens than the sort model's context of 16: typed, it keeps the last 16 and says so
    notes = sessionfile.open_session(Session(), _form_file(tmp_path, long)).notes
    assert any("context is 16" in n for n in notes)


def test_save_refuses_a_prompt_box_it_could_not_open_again():
    with pytest.raises(UserError, match="does not know"):
        sessionfile.export_session(Session(), SORT, "hello", HOT, View(0, 2, "weights"))
    with pytest.raises(UserError, match="2,001 characters"):
        sessionfile.export_session(Session(), SORT, "1" * 2001, HOT, View(0, 2, "weights"))
