"""Calling the running app's functions by number, as the page does, each answer waited for a bounded time.

A function of the page is called by its number (fn_index): functions in the queue through
`POST /gradio_api/queue/join`, their answers read from the session's shared event stream
(`GET /gradio_api/queue/data`, the stream the page reads); functions outside the queue through
`POST /gradio_api/run/predict`. `answers` sends several calls of one session and reads every answer
from one stream, so a test can call many functions quickly; a call that gets no answer before the
deadline (or whose answer breaks the stream) is reported as such, never waited on for ever.

The request bodies are written with `json.dumps` as it is (ASCII, with escapes), so a lone surrogate
travels as the JSON escape `\\udfff`, which is how a browser can send one.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

# what a refusal must not show: Python's own words, a traceback, a path, or the generic fault message
LEAKS = re.compile(r"Traceback|File \"|/tmp/|/work/|site-packages|<class|type:|invalid literal|object has no "
                   r"attribute|unhashable|not subscriptable|Something went wrong|Error\b|Exception")


@dataclass
class Call:
    """One call of function `fn` (a dependency of the page's config) with these values."""

    fn: dict
    data: list
    event_data: Any = None
    note: str = ""  # what is special about it, for a failure's report


@dataclass
class Answer:
    call: Call
    kind: str  # "ok", "refused" (a sentence came back), "http" (the app refused the request itself), "no answer"
    message: str | None = None
    output: Any = None
    status: int | None = None
    extra: dict = field(default_factory=dict)


def config(url: str) -> dict:
    return httpx.get(url + "config", timeout=60).json()


def problem(answer: Answer) -> str | None:
    """What is wrong with an answer (None: a result, or a refusal in one clear sentence)."""
    if answer.kind == "ok":
        return None
    if answer.kind == "no answer":
        return f"no answer ({answer.message})"
    msg = answer.message
    if isinstance(msg, str) and "Something went wrong" in msg:
        return "the generic message of a fault (the server logged an unexpected error)"
    if not isinstance(msg, str) or len(msg.split()) < 3:
        return f"a refusal that is not a sentence: {msg!r}"
    if len(msg) > 400 or LEAKS.search(msg):
        return f"a refusal that leaks or rambles: {msg[:300]!r}"
    return None


def _body(call: Call, session_hash: str, fn_index: bool = True) -> bytes:
    body = {"data": call.data, "session_hash": session_hash, "fn_index": call.fn["id"]}
    if call.fn.get("targets"):
        body["trigger_id"] = call.fn["targets"][0][0]
    if call.event_data is not None:
        body["event_data"] = call.event_data
    return json.dumps(body).encode()  # ensure_ascii: a lone surrogate becomes the escape \udfff


def _error_of(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("error") if isinstance(body, dict) else None


def answers(url: str, calls: list[Call], session_hash: str, timeout: float = 120.0) -> list[Answer]:
    """Send `calls` as one session (`session_hash`) and return their answers, in order. The whole batch
    gets `timeout` seconds (a hang guard); what has not answered by then is "no answer"."""
    deadline = time.monotonic() + timeout
    out: list[Answer | None] = [None] * len(calls)
    waiting: dict[str, int] = {}  # event id → index of its call
    with httpx.Client(timeout=timeout) as http:
        for i, call in enumerate(calls):
            headers = {"content-type": "application/json"}
            if not call.fn["queue"]:  # outside the queue: the answer is the reply
                r = http.post(url + "gradio_api/run/predict", content=_body(call, session_hash), headers=headers)
                if r.status_code == 200:
                    out[i] = Answer(call, "ok", output=r.json().get("data"), status=200)
                else:
                    kind = "refused" if 400 <= r.status_code < 500 else "server error"
                    out[i] = Answer(call, kind, message=_error_of(r), status=r.status_code)
                continue
            r = http.post(url + "gradio_api/queue/join", content=_body(call, session_hash), headers=headers)
            if r.status_code != 200:
                out[i] = Answer(call, "http" if r.status_code < 500 else "server error", message=_error_of(r),
                                status=r.status_code)
                continue
            waiting[r.json()["event_id"]] = i
        if waiting:
            _read_stream(http, url, session_hash, calls, waiting, out, deadline)
    for event, i in waiting.items():
        out[i] = out[i] or Answer(calls[i], "no answer", message=f"event {event} did not complete in {timeout:.0f} s")
    return out  # type: ignore[return-value]


def _read_stream(http: httpx.Client, url: str, session_hash: str, calls: list[Call], waiting: dict[str, int],
                 out: list, deadline: float) -> None:
    """Read the session's stream until every waiting event has completed, the stream ends or the deadline."""
    left = dict(waiting)
    try:
        with http.stream("GET", url + f"gradio_api/queue/data?session_hash={session_hash}",
                         timeout=httpx.Timeout(max(1.0, deadline - time.monotonic()))) as stream:
            for line in stream.iter_lines():
                if time.monotonic() > deadline:
                    return
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                i = left.get(message.get("event_id"))
                if i is None or message.get("msg") != "process_completed":
                    continue
                del left[message["event_id"]]
                output = message.get("output") or {}
                if message.get("success"):
                    out[i] = Answer(calls[i], "ok", output=output.get("data"))
                else:
                    out[i] = Answer(calls[i], "refused", message=output.get("error"))
                if not left:
                    return
    except (httpx.TransportError, httpx.StreamError) as exc:  # a stream the server broke off, or a read timeout
        for event, i in left.items():
            out[i] = Answer(calls[i], "no answer", message=f"the stream broke off: {type(exc).__name__}")


def inputs_of(cfg: dict, fn: dict) -> list[dict]:
    """The components a function takes, in order (State included)."""
    components = {c["id"]: c for c in cfg["components"]}
    return [components[i] for i in fn["inputs"]]


def page_values(cfg: dict, fn: dict, overrides: dict[str, Any] | None = None) -> list:
    """The values the page would send to `fn` as it first loads (each component's value; None for a
    State), with `overrides` by the component's elem_id."""
    overrides = overrides or {}
    values = []
    for c in inputs_of(cfg, fn):
        elem = c["props"].get("elem_id")
        values.append(overrides[elem] if elem in overrides else None if c["type"] == "state"
                      else c["props"].get("value"))
    return values
