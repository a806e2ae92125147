"""Refusal changes nothing: every handler checks everything first, then acts.

Each handler is called on a session with a text in progress, an own model and a history of
steps, once for each kind of bad value in each argument; it must refuse with a message, and the
session's text, selected model, model list, undo history and last distribution must be exactly
as before.
"""

from __future__ import annotations

import gradio as gr
import pytest

import app
from lab.session import Session

GRAMMAR = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
JUNK = [None, [1], {"a": 1}, {"path": "/etc/passwd"}, 10**400, -5, "zzz", float("nan"), True]
GOOD = {
    "step": dict(model_name=GRAMMAR, prompt=P, temperature=1.0, top_k=0, top_p=1.0, seed=3, layer=0, head="all",
                 view="weights"),
    "generate": dict(model_name=GRAMMAR, prompt=P, temperature=1.0, top_k=0, top_p=1.0, seed=3, max_new=2, layer=0,
                     head="all", view="weights"),
    "undo": dict(layer=0, head="all", view="weights"),
    "reset": dict(model_name=GRAMMAR),
    "redraw": dict(layer=0, head="all", view="weights"),
    "select_model": dict(model_name=GRAMMAR),
    "train_model": dict(corpus_name="sort", pasted="", upload=None, tokenizer_kind="char", layers=1, heads=1,
                        d_model=8, d_ff=0, pos="learned", norm="pre", activation="gelu", dropout=0.0, steps=2,
                        lr=3e-3, seed=0),
    "upload_model": dict(path=None),
}


@pytest.fixture(scope="module")
def busy_session():
    s = Session()
    list(app.train_model(s, *GOOD["train_model"].values()))  # an own model
    for _ in range(3):
        app.step(s, *GOOD["step"].values())
    return s


def snapshot(s: Session):
    d = s.decoder
    return (
        None if d is None else (list(d.ids), d.start, d.prompt_len, len(d._rng_history), d.sampling),
        s.prompt, None if s.entry is None else s.entry.name, list(s.models), id(s.last_step),
        list(s.notices), id(s.run), None if s.run is None else len(s.run.steps),
    )


def call(name: str, session: Session, args: dict):
    result = getattr(app, name)(session, *args.values())
    if hasattr(result, "__next__"):
        result = list(result)
    return result


CASES = [(name, arg, junk) for name, good in GOOD.items() for arg in good for junk in JUNK
         if not (name == "train_model" and arg in ("pasted", "upload", "tokenizer_kind"))
         and not (name == "upload_model" and junk is None)]


@pytest.mark.parametrize("name,arg,junk", CASES, ids=[f"{n}-{a}-{i}" for i, (n, a, _) in enumerate(CASES)])
def test_a_refused_call_changes_nothing(busy_session, name, arg, junk):
    s = busy_session
    before = snapshot(s)
    args = {**GOOD[name], arg: junk}
    try:
        call(name, s, args)
    except gr.Error as exc:
        assert exc.message and "Something went wrong" not in exc.message
        assert snapshot(s) == before, f"{name}({arg}={junk!r}) was refused and still changed the session"
        return
    pytest.fail(f"{name} accepted {arg}={junk!r}")


def test_the_text_stays_viewable_when_its_model_leaves_the_list():
    """A fourth own model pushes out the oldest; a text on that model can still be undone and drawn."""
    s = Session()
    first = list(app.train_model(s, *GOOD["train_model"].values()))[-1][3]["value"]
    app.step(s, first, "503124=", 0.0, 0, 1.0, 0, 0, "all", "weights")
    app.step(s, first, "503124=", 0.0, 0, 1.0, 0, 0, "all", "weights")
    for _ in range(3):
        list(app.train_model(s, *GOOD["train_model"].values()))
    assert first not in s.models
    out = app.undo(s, 0, "all", "weights")
    assert out[1] and out[4].plot
