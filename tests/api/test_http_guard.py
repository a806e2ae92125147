"""Raw HTTP on the app's own routes: bad input gets a 4xx and a plain message, never HTTP 500."""

from __future__ import annotations

import json

import httpx
import pytest

GRAMMAR = "grammar (built-in)"
LEAKS = ("Traceback", "/tmp", "/work", "site-packages", "Internal Server Error", "<class")


def post(server, path: str, body) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + path, content=content, headers={"content-type": "application/json"}, timeout=30)


CASES = [
    ("gradio_api/queue/join", {"fn_index": 99999, "data": [], "session_hash": "abc"}, 404, "no such function"),
    ("gradio_api/queue/join", {"fn_index": -1, "data": [], "session_hash": "abc"}, 404, "no such function"),
    ("gradio_api/queue/join", {"fn_index": 2**70, "data": [], "session_hash": "abc"}, 404, "no such function"),
    ("gradio_api/queue/join", {"fn_index": True, "data": [], "session_hash": "abc"}, 404, "no such function"),
    ("gradio_api/queue/join", {"data": [], "session_hash": "abc"}, 404, "no such function"),
    ("gradio_api/queue/join", b"{", 400, "not valid json"),
    ("gradio_api/queue/join", b"[1, 2]", 400, "json object"),
    ("gradio_api/call/step", {"data": [1]}, 400, "needs 9 values; it sent 1"),
    ("gradio_api/call/step", {"data": "abc"}, 400, "needs 9 values; it sent none"),
    ("gradio_api/call/step", b'{"data": ["grammar (built-in)", "he", NaN, 0, 1, 0, 0, "all", "weights"]}', 400,
     "finite numbers"),
    ("gradio_api/call/nope", {"data": []}, 404, "no api endpoint named 'nope'"),
    ("gradio_api/run/predict", {"data": []}, 404, "no api endpoint named 'predict'"),
    ("gradio_api/run/step", {"data": [1]}, 404, "runs in the queue"),
    ("gradio_api/queue/join", {"fn_index": 0, "data": [], "session_hash": 5}, 400, "session_hash must be text"),
    ("gradio_api/queue/join", {"fn_index": 0, "data": [], "session_hash": "a", "trigger_id": "1"}, 400,
     "trigger_id must be a whole number"),
]


@pytest.mark.parametrize("path,body,status,message", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_malformed_calls_get_a_4xx_with_a_plain_message(app_server, path, body, status, message):
    r = post(app_server, path, body)
    assert r.status_code == status, (r.status_code, r.text[:200])
    assert message in r.json()["error"].lower()
    assert not any(leak in r.text for leak in LEAKS)


def test_a_body_larger_than_any_valid_call_is_refused_with_413(app_server):
    r = post(app_server, "gradio_api/call/step", b'{"data": ["' + b"a" * (17 * 2**20) + b'"]}')
    assert r.status_code == 413 and "too large" in r.json()["error"]


def test_well_formed_calls_still_pass_the_guard(app_server):
    r = post(app_server, "gradio_api/call/step", {"data": [GRAMMAR, "anna found the key . she", 0.0, 0, 1.0, 0, 0,
                                                           "all", "weights"]})
    assert r.status_code == 200 and "event_id" in r.json()
    result = httpx.get(app_server.url + f"gradio_api/call/step/{r.json()['event_id']}", timeout=30).text
    assert "event: complete" in result


def test_a_file_in_an_argument_that_is_not_a_file_gets_a_400(app_server):
    fake = {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}
    for data in ([fake, "all", "weights"], [0, [{"x": fake}], "weights"]):
        r = post(app_server, "gradio_api/call/undo", {"data": data})
        assert r.status_code == 400 and "a file is not a value" in r.json()["error"], r.text[:200]
        assert not any(leak in r.text for leak in LEAKS)


# ------------------------------------------------------------------ calls by index, and the direct routes


def dependencies(server) -> list[dict]:
    return httpx.get(server.url + "config", timeout=30).json()["dependencies"]


def named(deps: list[dict], api_name: str) -> dict:
    return next(d for d in deps if d["api_name"] == api_name)


def join(server, body: dict) -> tuple[httpx.Response, dict | None]:
    """POST /queue/join as the page does, then read the session's stream to the event's end: the join's
    response and the completion message (None when the join was refused)."""
    r = post(server, "gradio_api/queue/join", body)
    if r.status_code != 200:
        return r, None
    event = r.json()["event_id"]
    url = server.url + f"gradio_api/queue/data?session_hash={body['session_hash']}"
    with httpx.stream("GET", url, timeout=120) as stream:
        for line in stream.iter_lines():
            message = json.loads(line[5:]) if line.startswith("data:") else {}
            if message.get("event_id") == event and message.get("msg") == "process_completed":
                return r, message
    raise AssertionError(f"the stream ended before event {event} completed")


def assert_sentence(text) -> None:
    assert isinstance(text, str) and len(text.split()) >= 3 and len(text) <= 400, text  # words, not a code
    assert not any(leak in text for leak in LEAKS), text


def test_page_only_functions_called_by_index_get_a_4xx_with_a_sentence(app_server):
    deps = dependencies(app_server)
    js_only = [d for d in deps if not d["backend_fn"]]
    event_data = [d for d in deps if d["collects_event_data"] and d["api_visibility"] == "private"]
    assert js_only and event_data  # what this test is about exists in the app
    for d in js_only:  # a function of the page's JavaScript alone
        r, _ = join(app_server, {"fn_index": d["id"], "data": [None] * len(d["inputs"]), "session_hash": "pageonly"})
        assert r.status_code == 404 and "runs in the page alone" in r.json()["error"], (d["id"], r.text[:200])
        assert_sentence(r.json()["error"])
    for d in event_data:  # a click on a token: the page sends which one; a raw call with none, or a broken one
        for sent in (None, {}, {"index": 0}, "x", [0]):
            body = {"fn_index": d["id"], "data": [None] * len(d["inputs"]), "session_hash": "pageonly",
                    "trigger_id": d["targets"][0][0], "event_data": sent}
            r, _ = join(app_server, body)
            assert r.status_code == 400 and "needs the details the page sends" in r.json()["error"], (sent, r.text)
            assert_sentence(r.json()["error"])
        r, done = join(app_server, {**body, "event_data": {"index": 0, "value": "he"}})  # what the page sends
        assert r.status_code == 200, r.text[:200]  # past the door: the handler answers (here: its own checks)
        if not done["success"]:
            assert_sentence(done["output"]["error"])


def test_every_page_only_function_answers_with_its_output_or_a_sentence(app_server):
    """By index, with every value None: each runs (and answers) or refuses with a sentence, never the
    empty error of a call gradio could not make."""
    deps = [d for d in dependencies(app_server) if d["api_visibility"] == "private" and d["backend_fn"]]
    outcomes = {"ok": 0, "refused": 0}
    for d in deps:
        body = {"fn_index": d["id"], "data": [None] * len(d["inputs"]), "session_hash": "everypageonly",
                "trigger_id": d["targets"][0][0], "event_data": {"index": 0, "value": ""}}
        r, done = join(app_server, body)
        assert r.status_code == 200, (d["id"], d["api_name"], r.text[:200])
        if not done["success"]:
            assert_sentence(done["output"]["error"])
        outcomes["ok" if done["success"] else "refused"] += 1
    assert outcomes["ok"] and outcomes["refused"] and sum(outcomes.values()) == len(deps) > 20, outcomes


def test_the_queue_needs_every_value_of_a_function(app_server):
    """Only /call/<name> fills in what the API leaves out (the session); by index every value is needed."""
    step = named(dependencies(app_server), "step")
    values = [GRAMMAR, "anna found the key . she", 0.0, 0, 1.0, 0, 0, "all", "weights"]
    r, _ = join(app_server, {"fn_index": step["id"], "data": values, "session_hash": "allvalues"})
    assert r.status_code == 400 and "needs 10 values; it sent 9" in r.json()["error"], r.text[:200]
    r, done = join(app_server, {"fn_index": step["id"], "data": [None, *values], "session_hash": "allvalues"})
    assert r.status_code == 200 and done["success"], done


REFUSED_STEP = [None, "no such model", "he", 0.0, 0, 1.0, 0, 0, "all", "weights"]  # the handler refuses the model


@pytest.mark.parametrize("path", ["gradio_api/run/predict", "gradio_api/run/step", "gradio_api/api/step"])
def test_a_queued_event_called_directly_gets_a_4xx_with_a_sentence(app_server, path):
    """Direct routes would skip the queue (its concurrency limits and admission): a queued function is
    refused there with the route to use, whatever its values."""
    step = named(dependencies(app_server), "step")
    body = {"data": REFUSED_STEP, "session_hash": "direct", **({"fn_index": step["id"]} if "predict" in path else {})}
    r = post(app_server, path, body)
    assert r.status_code == 404, (r.status_code, r.text[:200])
    assert "runs in the queue" in r.json()["error"] and "/gradio_api/call/step" in r.json()["error"]
    assert_sentence(r.json()["error"])
    page_only = next(d for d in dependencies(app_server) if d["queue"] and d["api_visibility"] == "private")
    r = post(app_server, "gradio_api/run/predict", {"fn_index": page_only["id"], "session_hash": "direct",
                                                    "data": [None] * len(page_only["inputs"])})
    assert r.status_code == 404 and "/gradio_api/queue/join" in r.json()["error"], r.text[:200]


def test_a_refusal_on_a_direct_route_is_a_400_with_its_sentence(app_server):
    """The page calls functions outside the queue through /run/predict; gradio answers their refusals
    with HTTP 500. A value not in a menu's choices is refused (a 400 and the sentence), one in them runs."""
    deps, components = dependencies(app_server), httpx.get(app_server.url + "config", timeout=30).json()["components"]
    dropdowns = {c["id"]: c for c in components if c["type"] == "dropdown"}
    menu = next(d for d in deps if not d["queue"] and d["backend_fn"] and len(d["inputs"]) == 1
                and d["inputs"][0] in dropdowns)
    body = {"fn_index": menu["id"], "session_hash": "direct", "trigger_id": menu["targets"][0][0]}
    r = post(app_server, "gradio_api/run/predict", {**body, "data": ["no such choice"]})
    assert r.status_code == 400, (r.status_code, r.text[:200])
    assert_sentence(r.json()["error"])
    assert "no such choice" not in r.json()["error"]  # the app's sentence, not gradio's echo of the value
    r = post(app_server, "gradio_api/run/predict", {**body, "data": ["\ud800"]})
    assert r.status_code == 400 and "not valid unicode" in r.json()["error"].lower(), (r.status_code, r.text[:200])
    choice = dropdowns[menu["inputs"][0]]["props"]["choices"][0][1]
    r = post(app_server, "gradio_api/run/predict", {**body, "data": [choice]})
    assert r.status_code == 200 and len(r.json()["data"]) == len(menu["outputs"]), r.text[:200]


def test_the_minimal_pairs_menu_takes_one_of_its_pairs_or_refuses_with_a_sentence(app_server):
    """The Compare tab's menu of minimal pairs (a page-only event outside the queue) takes its value as sent:
    one of its pairs fills both prompts, nothing chosen changes nothing, and any other value is refused with
    the app's sentence (gradio's own check would echo the value back with its Python type)."""
    config = httpx.get(app_server.url + "config", timeout=30).json()
    pair = next(c for c in config["components"] if c["props"].get("elem_id") == "pair")
    menu = next(d for d in config["dependencies"] if d["inputs"] == [pair["id"]] and d["backend_fn"])
    body = {"fn_index": menu["id"], "session_hash": "pairs", "trigger_id": menu["targets"][0][0]}
    _, value = pair["props"]["choices"][0]
    r = post(app_server, "gradio_api/run/predict", {**body, "data": [value]})
    assert r.status_code == 200 and r.json()["data"] == value.split("\u241e"), r.text[:200]
    r = post(app_server, "gradio_api/run/predict", {**body, "data": [None]})  # the menu cleared
    assert r.status_code == 200 and all(out.get("__type__") == "update" and "value" not in out
                                        for out in r.json()["data"]), r.text[:200]
    for bad in ("no such pair", "a\u241eb", 5, True, ["x"], {"value": value}, "x" * 5000):
        r = post(app_server, "gradio_api/run/predict", {**body, "data": [bad]})
        assert r.status_code == 400, (bad, r.status_code, r.text[:200])
        assert r.json()["error"] == "Minimal pairs: choose one of the pairs in the list.", r.text[:200]
