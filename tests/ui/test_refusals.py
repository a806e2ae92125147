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


# ------------------------------------------------------------------------- the head tools

HEAD_GOOD = {  # ui.heads handlers and good arguments for a session with a text on the grammar model
    "ablate": dict(heads=["L1H1", "L2H2"], mode="mean", keep_only=False, layer=0, head=0),
    "clear_settings": dict(layer=0, head=0),
    "edit_attention": dict(head="L0H0", key="0"),
    "refresh": dict(layer=0, head="all", query=3),
    "show_tool": dict(tool="ablate", layer=0, head=0),
}
HEAD_JUNK = {  # beside JUNK: values of the right kind that are out of range for this model
    "heads": [["L1H1", "L9H0"], ["L1H1", "L0H7"], ["L0H0", "²"]], "mode": ["MEAN", ""], "layer": [3, "²"],
    "head": [4, 99, "² "], "key": ["²", "13", "-1", "3.5"], "tool": ["film"],
}


@pytest.fixture
def probed_session():
    """A text on the grammar model with heads ablated and a row edited: the state a refusal must keep."""
    s = Session()
    app.step(s, GRAMMAR, P, 1.0, 0, 1.0, 3, 0, "all", "weights")
    s.heads.set_ablation(["L0H1"], "zero", False)
    s.select(5)
    s.heads.set_edit(1, 0, 5, 2)
    return s


def head_snapshot(s: Session):
    return (snapshot(s), s.heads.settings, s.query, s.display)


HEAD_CASES = [(name, arg, junk) for name, good in HEAD_GOOD.items() for arg in good
              for junk in JUNK + HEAD_JUNK.get(arg, [])
              if arg != "query"  # a token not in the text selects the last one (the page sends none after a Step)
              and not (arg in ("layer", "head") and junk is None)  # None: no layer / head / token given
              and not (arg == "key" and junk is None)  # None: no edit (as "off")
              and not (arg == "heads" and (junk is None or junk == [1]))]  # None: no heads; [1]: refused below


@pytest.mark.parametrize("name,arg,junk", HEAD_CASES, ids=[f"{n}-{a}-{i}" for i, (n, a, _) in enumerate(HEAD_CASES)])
def test_a_refused_head_tool_call_changes_nothing(probed_session, name, arg, junk):
    """Every argument of the head tools (layer and head shown, heads, mode, key, tool) is checked
    before a head setting changes: a refusal leaves the ablation, the edit and the view as they were."""
    from ui import heads

    s = probed_session
    before = head_snapshot(s)
    args = {**HEAD_GOOD[name], arg: junk}
    with pytest.raises(gr.Error) as info:
        getattr(heads, name)(s, *args.values())
    msg = info.value.message
    assert msg and "Something went wrong" not in msg and "invalid literal" not in msg, msg
    assert head_snapshot(s) == before, f"{name}({arg}={junk!r}) was refused and still changed the session"


def test_the_head_tools_accept_what_the_page_sends(probed_session):
    """The cases above fail for their bad value alone: the good values go through."""
    from ui import heads

    s = probed_session
    for name, good in HEAD_GOOD.items():
        getattr(heads, name)(s, *good.values())
    assert s.heads.settings.heads == () and s.heads.settings.edit is not None  # ablate, clear, then edit (in that order)


# ------------------------------------------------------------------ uploads and imports: a sentence


def _checkpoint_with(field: str, literal: str) -> bytes:
    """The sort built-in's file with one config number written as `literal` (JSON text)."""
    import json

    from tests.support.safetensors_bytes import safetensors_join, safetensors_split
    from lab.catalogue.models import BUILTINS

    header, body = safetensors_split(BUILTINS.path("sort digits (built-in)").read_bytes())
    cfg = json.loads(header["__metadata__"]["config"])
    header["__metadata__"]["config"] = json.dumps({**cfg, field: 0}).replace(f'"{field}": 0', f'"{field}": {literal}')
    return safetensors_join(header, body)


@pytest.mark.parametrize("field", ["pe_base", "dropout"])
def test_a_config_number_of_400_digits_is_refused_with_a_sentence_on_upload_and_import(tmp_path, field):
    import base64
    import json

    from lab import sessionfile
    from lab.session import View
    from model.generate import Sampling
    from ui import share, train

    data = _checkpoint_with(field, "1" + "0" * 400)
    path = tmp_path / "big.safetensors"
    path.write_bytes(data)
    s = Session()
    with pytest.raises(gr.Error) as info:
        train.upload_model(s, str(path))
    assert f"{field} must be" in info.value.message and "Something went wrong" not in info.value.message
    assert not s.models
    # the same checkpoint inside a session file
    doc = json.loads(sessionfile.export_session(Session(), "sort digits (built-in)", "503124=", Sampling(),
                                                View(0, 2, "weights")))
    doc["model"] = {"name": "big", "checkpoint": base64.b64encode(data).decode("ascii")}
    (tmp_path / "s.json").write_text(json.dumps(doc))
    with pytest.raises(gr.Error) as info:
        share.open_session(s, str(tmp_path / "s.json"))
    assert f"{field} must be" in info.value.message and "Something went wrong" not in info.value.message
    assert not s.models


def test_an_upload_refused_by_the_memory_budget_says_so(tmp_path, monkeypatch):
    """The file is fine; the server's memory budget is what refuses it (not "part of it is damaged")."""
    from lab import session as session_mod
    from lab.server import budget
    from lab.catalogue.models import BUILTINS
    from ui import train

    monkeypatch.setattr(session_mod, "MODEL_BUDGET", budget.ModelBudget(limit_bytes=1000, client_limit_bytes=1000))
    s = Session()
    with pytest.raises(gr.Error) as info:
        train.upload_model(s, str(BUILTINS.path("sort digits (built-in)")))
    msg = info.value.message
    assert "memory budget is full" in msg and "part of it is damaged" not in msg, msg
    assert not s.models and session_mod.MODEL_BUDGET.held(s) == 0
