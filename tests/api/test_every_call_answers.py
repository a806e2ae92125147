"""Every call of the running app gets an answer in time: a result, or a refusal in one clear sentence.

Three kinds of careless or hostile calls, each sent the way the page sends its own (by function number
on the page's shared event stream, tests/support/page_calls.py) and waited for a bounded time:

* every text argument of every public endpoint (`view_api()`'s list) with a lone surrogate (JSON's
  `\\udfff`, which gradio_client cannot send, so the request is written by hand), a NUL and a
  10,000-character string; the lone surrogate also through the API's own route (`/call/<name>`);
* every function of the page (every fn_index, page-only ones included) with a list, an object, a
  number and None in place of each value in turn;
* values a call takes but does not use, or does not know: an unknown head for an edit that is switched
  off, an unknown model for a link or a download of numbers.

Before the batches each session gets a text (a Step), so the head tools and the Inside panel have
something to work on and reach their own checks.
"""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from tests.support.api import assert_clean_error
from tests.support.page_calls import Call, answers, config, inputs_of, page_values, problem

GRAMMAR = "grammar (built-in)"
PROMPT = "anna found the key . she gave it to tom because he"
HOSTILE_TEXT = {"lone surrogate": "x\udfffy", "NUL": "a\x00b", "10k characters": "x" * 10_000}
WRONG_TYPES = [["x"], {"a": 1}, 5, None]
# the Train form's values for the calls below: a training that a wrong value does not stop stays tiny
SMALL_TRAINING = {"corpus": "toy", "steps": 10, "layers": 1, "heads": 1, "d_model": 8, "d_ff": 0}


def step_call(cfg: dict) -> Call:
    step = next(d for d in cfg["dependencies"] if d["api_name"] == "step")
    return Call(step, [None, GRAMMAR, PROMPT, 0.0, 0, 1.0, 0, 0, "all", "weights"], note="the Step before")


def with_text(url: str, cfg: dict, session_hash: str) -> None:
    """A text for the session (the head tools and the Inside panel work on one)."""
    (done,) = answers(url, [step_call(cfg)], session_hash)
    assert done.kind == "ok", done


def report(bad: list[tuple[Call, str]], total: int) -> str:
    lines = [f"{len(bad)} of {total} calls got no clean answer:"]
    lines += [f"  fn {c.fn['id']} ({c.fn['api_name']}) {c.note}: {why}" for c, why in bad[:40]]
    return "\n".join(lines)


def text_parameters(cfg: dict, api: dict) -> dict[str, tuple[dict, list, list[int]]]:
    """endpoint → (its function, the page's values with view_api()'s examples in place, the positions of its
    text arguments: those documented as a str or a choice among strings)."""
    out = {}
    for name, endpoint in api["named_endpoints"].items():
        fn = next(d for d in cfg["dependencies"] if d["api_name"] == name.lstrip("/"))
        positions = [i for i, c in enumerate(inputs_of(cfg, fn)) if c["type"] != "state"]
        values = [None] * len(fn["inputs"])
        texts = []
        for i, p in zip(positions, endpoint["parameters"]):
            values[i] = p["example_input"]
            kind = p["python_type"]["type"]
            if kind.startswith(("str", "Literal")):
                texts.append(i)
        out[name] = (fn, values, texts)
    return out


def test_every_text_argument_of_every_endpoint_answers_hostile_text(app_server):
    url, cfg = app_server.url, config(app_server.url)
    api = Client(url, verbose=False).view_api(return_format="dict", print_info=False)
    endpoints = text_parameters(cfg, api)
    assert sum(len(t) for _, _, t in endpoints.values()) >= 40  # what this test is about exists
    bad, total, kinds = [], 0, Counter()
    for name, (fn, values, texts) in endpoints.items():
        calls = []
        for i in texts:
            for what, text in HOSTILE_TEXT.items():
                data = list(values)
                data[i] = text
                calls.append(Call(fn, data, note=f"argument {i} = {what}"))
        session = f"hostile-text-{fn['id']}"
        with_text(url, cfg, session)
        for answer in answers(url, calls, session, timeout=300):
            total += 1
            kinds[answer.kind] += 1
            if problem(answer):
                bad.append((answer.call, problem(answer)))
            elif "surrogate" in answer.call.note:  # not text: refused at the door, in words
                assert answer.kind == "http" and "not valid Unicode" in answer.message, answer
    print(f"[robustness] hostile text: {total} calls on {len(endpoints)} endpoints: {dict(kinds)}")
    assert not bad, report(bad, total)


def test_a_lone_surrogate_through_the_apis_own_route_is_refused_in_words(app_server):
    """/call/<name>, as gradio_client calls: a lone surrogate in any text argument gets a 400 and a sentence."""
    url, cfg = app_server.url, config(app_server.url)
    api = Client(url, verbose=False).view_api(return_format="dict", print_info=False)
    count = 0
    for name, (fn, values, texts) in text_parameters(cfg, api).items():
        positions = [i for i, c in enumerate(inputs_of(cfg, fn)) if c["type"] != "state"]  # what the API sends
        for i in texts:
            data = [values[p] for p in positions]
            data[positions.index(i)] = "x\udfffy"
            r = httpx.post(f"{url}gradio_api/call/{name.lstrip('/')}", content=json.dumps({"data": data}),
                           headers={"content-type": "application/json"}, timeout=60)
            assert r.status_code == 400 and "not valid Unicode" in r.json()["error"], (name, i, r.text[:200])
            count += 1
    assert count >= 40


def test_every_function_by_number_answers_values_of_the_wrong_type(app_server):
    """Every fn_index of the page, page-only functions included, with a list, an object, a number and None in
    place of each of its values in turn: a result or a refusal in a sentence, never the generic fault, a
    Python message or silence; and no answer repeats the Python form of what was sent (['x'], {'a': 1})."""
    url, cfg = app_server.url, config(app_server.url)
    functions = [d for d in cfg["dependencies"] if d["backend_fn"]]
    same = {}  # one handler bound to several triggers: its cases are shared out among them
    for fn in functions:
        same.setdefault(json.dumps([fn["inputs"], fn["api_name"].rstrip("0123456789_") if fn["api_name"] else None]),
                        []).append(fn)
    bad, total, called, kinds = [], 0, set(), Counter()
    for group in same.values():
        types = [c["type"] for c in inputs_of(cfg, group[0])]
        cases = [(i, v) for i, kind in enumerate(types) if kind != "state" for v in WRONG_TYPES]
        calls = []
        for n in range(max(len(cases), len(group))):
            fn = group[n % len(group)]
            data = page_values(cfg, fn, SMALL_TRAINING)
            note = "the page's values"
            if n < len(cases):
                i, value = cases[n]
                data[i] = value
                note = f"argument {i} = {value!r}"
            event = {"index": 0, "value": "he"} if fn["collects_event_data"] else None
            calls.append(Call(fn, data, event, note))
            called.add(fn["id"])
        session = f"wrong-types-{group[0]['id']}"
        with_text(url, cfg, session)
        for answer in answers(url, calls, session, timeout=300):
            total += 1
            kinds[answer.kind] += 1
            why = problem(answer)
            if why is None and answer.kind == "ok":
                shown = json.dumps(answer.output, default=str)
                echoed = [r for r in ("['x']", "{'a': 1}") if r in shown]
                why = f"the answer repeats {echoed[0]}" if echoed else None
            if why:
                bad.append((answer.call, why))
    print(f"[robustness] wrong types: {total} calls of {len(functions)} functions: {dict(kinds)}")
    assert called == {fn["id"] for fn in functions} and len(functions) > 100
    assert not bad, report(bad, total)


@pytest.fixture(scope="module")
def client_with_text(app_server):
    c = Client(app_server.url, verbose=False)
    c.predict(GRAMMAR, PROMPT, 0.0, 0, 1.0, 0, 0, "all", "weights", api_name="/step")
    return c


def test_an_edit_that_is_off_still_refuses_a_head_the_model_does_not_have(client_with_text):
    c = client_with_text
    for head in ("L9H9", "nonsense", "L1H①"):
        with pytest.raises(AppError) as info:
            c.predict(head, "off", api_name="/edit_attention")
        assert_clean_error(info.value, "is not a head|this model has layers|each layer has heads")
    c.predict("L1H0", "off", api_name="/edit_attention")  # a head of the model: no edit, as asked


def test_a_link_or_numbers_for_an_unknown_model_are_refused(client_with_text):
    c = client_with_text
    form = ["no such model", PROMPT, 0.0, 0, 1.0, 0, 0, "all", "weights"]
    with pytest.raises(AppError) as info:
        c.predict(*form, api_name="/link")
    assert_clean_error(info.value, r"^Unknown model 'no such model'\. Pick one from the list\.$")
    for what in ("weights", "probabilities", "head_roles"):
        with pytest.raises(AppError) as info:
            c.predict(what, "csv", "no such model", 0, "all", api_name="/export_numbers")
        assert_clean_error(info.value, r"^Unknown model 'no such model'")
    assert "Link to this view" in c.predict(GRAMMAR, *form[1:], api_name="/link")
    assert c.predict("probabilities", "csv", GRAMMAR, 0, "all", api_name="/export_numbers")
