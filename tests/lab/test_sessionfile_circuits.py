"""Session files keep the Circuits tab (lab.sessionfile's "circuits" object): what the person's tab shows
is saved and opened again as it was; files saved before (without it) open as they did; hostile values in it are
refused with one sentence and change nothing."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lab import links, sessionfile
from lab.checks import UserError
from lab.session import Session, View
from model.generate import Sampling

GRAMMAR = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
GREEDY = Sampling(temperature=0.0, seed=0)
ATP = dict(prompt_a="anna found the key . she gave it to tom because he asked",
           prompt_b="tom found the key . he gave it to anna because she asked", metric="prob", answer=" her",
           other="", what="resid", direction="noising", k=7)


def used_circuits() -> Session:
    """A text whose Circuits tab shows everything a file keeps."""
    s = Session()
    for _ in range(2):
        s.step(GRAMMAR, P, GREEDY)
    s.select(9)
    s.circuits.dla(None, " tom", " anna")
    s.circuits.circuits(2, 3)
    s.circuits.composition(GRAMMAR)
    links.note_kind(s, "v")
    links.note_atp(s, ATP)
    links.note_tab(s, "circuits")
    return s


def save(s: Session, tmp_path, name="s.json") -> str:
    path = tmp_path / name
    path.write_bytes(sessionfile.export_session(s, GRAMMAR, P, GREEDY, View(1, 0, "weights")))
    return str(path)


def test_the_circuits_tab_is_saved_and_opens_as_it_was(tmp_path):
    path = save(used_circuits(), tmp_path)
    doc = json.loads(open(path, encoding="utf-8").read())
    assert doc["version"] == 1  # the same version: the key is optional
    assert doc["circuits"] == {"tab": "circuits", "dla": {"answer": "tom", "other": "anna"}, "kind": "v",
                               "head": {"layer": 2, "head": 3}, "atp": ATP}
    t = Session()
    opened = sessionfile.open_session(t, path)
    assert opened.circuits == links.CircuitsView("circuits", ("tom", "anna"), "v", (2, 3), ATP)
    assert t.query == 9  # DLA is drawn again at the token the file selects
    # saved again from the opened session once the page has drawn it: the same object
    links.keep_form(t, opened.circuits)
    t.circuits.dla(None, *opened.circuits.dla)
    t.circuits.circuits(*opened.circuits.head)
    t.circuits.composition(GRAMMAR)
    again = json.loads(open(save(t, tmp_path, "again.json"), encoding="utf-8").read())
    assert again["circuits"] == doc["circuits"]


def test_the_model_s_own_prediction_and_a_tab_unused_are_kept_as_such(tmp_path):
    s = Session()
    s.step(GRAMMAR, P, GREEDY)
    s.circuits.dla(None, None, None)
    doc = json.loads(open(save(s, tmp_path), encoding="utf-8").read())
    assert doc["circuits"] == {"tab": None, "dla": {"answer": "", "other": ""}, "kind": None, "head": None,
                               "atp": None}
    assert sessionfile.open_session(Session(), save(s, tmp_path)).circuits == links.CircuitsView(dla=("", ""))


def test_files_without_circuits_open_as_they_did(tmp_path):
    s = Session()
    s.step(GRAMMAR, P, GREEDY)
    path = save(s, tmp_path)
    doc = json.loads(open(path, encoding="utf-8").read())
    assert "circuits" not in doc  # the tab unused: the file is as files were before
    opened = sessionfile.open_session(Session(), path)
    assert opened.circuits is None and opened.model == GRAMMAR
    # a file saved with the tab used, its object taken out (as an older app wrote it), or null
    doc = json.loads(open(save(used_circuits(), tmp_path, "used.json"), encoding="utf-8").read())
    for value in ("absent", None):
        old = {k: v for k, v in doc.items() if k != "circuits"} if value == "absent" else {**doc, "circuits": None}
        (tmp_path / "old.json").write_text(json.dumps(old))
        t = Session()
        assert sessionfile.open_session(t, str(tmp_path / "old.json")).circuits is None
        assert len(t.tokens()) == len(used_circuits().tokens())


@pytest.mark.parametrize("change, fragment", [
    (lambda c: "everything", "not an object"),
    (lambda c: {**c, "tab": "graphs"}, "tab must be one of"),
    (lambda c: {**c, "tab": ["circuits"]}, "tab must be one of"),
    (lambda c: {**c, "kind": "qk"}, "kind must be one of"),
    (lambda c: {**c, "dla": "tom"}, "direct logit attribution is not an object"),
    (lambda c: {**c, "dla": {"answer": "zebra crossing", "other": ""}}, "not one token of this model"),
    (lambda c: {**c, "dla": {"answer": 7, "other": ""}}, "first answer must be text"),
    (lambda c: {**c, "dla": {"answer": "x" * 10_000, "other": ""}}, "at most 100 characters"),
    (lambda c: {**c, "dla": {"answer": "", "other": "tom"}}, "second answer token needs a first"),
    (lambda c: {**c, "dla": {"answer": "tom", "other": " tom"}}, "the same token"),
    (lambda c: {**c, "head": {"layer": 3, "head": 0}}, "layer must be a whole number between 0 and 2"),
    (lambda c: {**c, "head": {"layer": 0, "head": -1}}, "head must be a whole number between 0 and 3"),
    (lambda c: {**c, "head": {"layer": 0.5, "head": 0}}, "layer must be a whole number"),
    (lambda c: {**c, "head": [0, 1]}, "head opened is not an object"),
    (lambda c: {**c, "atp": [1]}, "attribution patching form is not an object"),
    (lambda c: {**c, "atp": {**ATP, "k": 10**9}}, "cells re-run exactly must be a whole number between 1 and 50"),
    (lambda c: {**c, "atp": {**ATP, "metric": "loss"}}, "metric must be one of"),
    (lambda c: {**c, "atp": {**ATP, "direction": None}}, "direction must be one of"),
    (lambda c: {**c, "atp": {**ATP, "prompt_b": "x" * 2001}}, "prompt B must be text of at most 2,000"),
    (lambda c: {**c, "atp": {**ATP, "answer": {"a": 1}}}, "answer token must be text"),
])
def test_hostile_circuits_settings_are_refused_and_change_nothing(tmp_path, change, fragment):
    doc = json.loads(open(save(used_circuits(), tmp_path), encoding="utf-8").read())
    doc["circuits"] = change(doc["circuits"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    t = Session()
    t.step(GRAMMAR, "tom found the key", GREEDY)
    t.circuits.circuits(0, 1)
    links.note_kind(t, "q")
    before = (t.tokens(), list(t.models), t.query, t.display, list(t.log), dict(t.circuits.last),
              dataclasses.replace(links.circuits_form(t)))
    with pytest.raises(UserError, match="circuits settings do not fit") as info:
        sessionfile.open_session(t, str(bad))
    message = str(info.value)
    assert fragment in message and message.count(". ") == 0 and len(message) < 300, message
    assert (t.tokens(), list(t.models), t.query, t.display, list(t.log), dict(t.circuits.last),
            links.circuits_form(t)) == before
