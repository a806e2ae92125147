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
    ("gradio_api/run/step", {"data": [1]}, 400, "needs 9 values"),
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
