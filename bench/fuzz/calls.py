"""Calling the app: the endpoints and parameters `view_api()` lists, a call and its result, and one
session (`Side`) that sends a call through gradio_client or as hand-made HTTP, with a hang guard."""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from .checks import shorten
from .values import RawJSON

CALL_TIMEOUT_S = 60.0  # hang guards (no answer at all), far above any call on a busy machine
TRAIN_TIMEOUT_S = 120.0


@dataclass
class Param:
    name: str
    label: str
    component: str
    type: str
    enum: list | None
    lo: float | None
    hi: float | None
    default: Any
    example: Any


@dataclass
class Endpoint:
    name: str  # "/step"
    params: list[Param]
    returns: list[str]  # labels of the outputs


def discover(client) -> dict[str, Endpoint]:
    """Every named endpoint with its parameters, from the app's own API description."""
    api = client.view_api(return_format="dict", print_info=False)
    out = {}
    for name, ep in api["named_endpoints"].items():
        params = []
        for p in ep["parameters"]:
            t = p.get("type") or {}
            lo = hi = None
            m = re.search(r"between (-?[\d.e+-]+) and (-?[\d.e+-]+)", str(t.get("description", "")))
            if m:
                lo, hi = float(m.group(1)), float(m.group(2))
            params.append(Param(p.get("parameter_name") or p.get("label", "?"), p.get("label", ""),
                                p.get("component", ""), str(t.get("type", "")), t.get("enum"), lo, hi,
                                p.get("parameter_default"), p.get("example_input")))
        out[name] = Endpoint(name, params, [r.get("label", "") for r in ep.get("returns", [])])
    return out


# --------------------------------------------------------------------------- calling


@dataclass
class Call:
    api: str
    args: list
    transport: str = "client"  # "client" (gradio_client) or "raw" (hand-made HTTP)
    mode: str = "valid"  # valid / one-bad / chaos / probe / upload / scenario
    note: str = ""  # what is special about it (which argument is bad, what the file is)
    timeout: float = CALL_TIMEOUT_S
    replay: bool = True  # replay on the twin when it succeeds
    info: Any = None  # the ModelInfo of a model file this call uploads
    served: list = field(default_factory=list)  # served files named in the arguments (urls)

    def describe(self, n: int = 160) -> str:
        args = ", ".join(shorten(repr(a), n) for a in self.args)
        return f"{self.api}({args}) via {self.transport}" + (f" [{self.note}]" if self.note else "")

    def sent_text(self) -> str:
        return json.dumps(self.args, default=repr, ensure_ascii=False) + " " + self.note


@dataclass
class Result:
    status: str  # "ok", "error", "hang", "transport"
    outputs: Any = None
    message: str | None = None
    seconds: float = 0.0


def json_body(data: list, session_hash: str) -> str:
    """A request body with NaN/Infinity literals and RawJSON pieces spliced in (what the client cannot send)."""
    raws: dict[str, str] = {}

    def sub(x):
        if isinstance(x, RawJSON):
            key = f"@@raw{len(raws)}@@"
            raws[key] = x.text
            return key
        if isinstance(x, list):
            return [sub(v) for v in x]
        if isinstance(x, dict):
            return {k: sub(v) for k, v in x.items()}
        return x

    text = json.dumps({"data": sub(data), "session_hash": session_hash}, allow_nan=True)
    for key, raw in raws.items():
        text = text.replace(json.dumps(key), raw)
    return text


def client_can_send(args: list) -> bool:
    """Whether gradio_client can carry these arguments (it refuses NaN and infinity, and it sends UTF-8
    without escapes, so a lone surrogate fails on this side before anything is sent)."""
    try:
        json.dumps(args, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
        return False
    return not any(isinstance(a, RawJSON) for a in args)


class Side:
    """One session of the app: a gradio_client Client, and its session hash for hand-made requests."""

    def __init__(self, url: str):
        from gradio_client import Client

        self.url = url
        self.client = Client(url, verbose=False, download_files=False, analytics_enabled=False)
        self.hash = self.client.session_hash
        self.http = httpx.Client()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        self.http.close()

    def call(self, call: Call) -> Result:
        t0 = time.perf_counter()
        try:
            if call.transport == "raw":
                r = self._raw(call)
            else:
                r = self._client(call)
        except Exception as exc:  # noqa: BLE001 - every failure is classified
            r = Result("transport", message=f"{type(exc).__name__}: {shorten(str(exc), 300)}")
        r.seconds = time.perf_counter() - t0
        return r

    def _client(self, call: Call) -> Result:
        from gradio_client.exceptions import AppError

        job = self.client.submit(*call.args, api_name=call.api)
        try:
            out = job.result(timeout=call.timeout)
        except TimeoutError:
            with contextlib.suppress(Exception):
                job.cancel()
            return Result("hang", message=f"no answer in {call.timeout:.0f} s")
        except AppError as exc:
            return Result("error", message=str(exc))
        except httpx.HTTPStatusError as exc:  # the app refused the request itself (ui/http.py): read its message
            if 400 <= exc.response.status_code < 500:
                try:
                    msg = exc.response.json().get("error")
                except ValueError:
                    msg = None
                return Result("error", message=msg if isinstance(msg, str) else f"HTTP {exc.response.status_code}")
            raise
        return Result("ok", outputs=list(out) if isinstance(out, tuple) else [out])

    def _raw(self, call: Call) -> Result:
        """POST /gradio_api/call/<name> with this session's hash, then read the event stream to its end."""
        name = call.api.lstrip("/")
        deadline = time.monotonic() + call.timeout
        r = self.http.post(f"{self.url}gradio_api/call/{name}", content=json_body(call.args, self.hash),
                           headers={"content-type": "application/json"}, timeout=call.timeout)
        if 400 <= r.status_code < 500:  # a refusal of the request itself: its message is checked too
            try:
                body = r.json()
                msg = body.get("error") or body.get("detail") if isinstance(body, dict) else None
            except ValueError:
                msg = None
            return Result("error", message=msg if isinstance(msg, str) else f"HTTP {r.status_code}: {r.text}")
        if r.status_code != 200:
            return Result("transport", message=f"HTTP {r.status_code}: {shorten(r.text, 200)}")
        event_id = r.json()["event_id"]
        event = data = None
        with self.http.stream("GET", f"{self.url}gradio_api/call/{name}/{event_id}", timeout=call.timeout) as s:
            for line in s.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event in ("complete", "error"):
                    data = line[5:].strip()
                    break
                if time.monotonic() > deadline:
                    return Result("hang", message=f"no answer in {call.timeout:.0f} s")
        if event == "complete":
            return Result("ok", outputs=json.loads(data))
        if event == "error":
            try:
                payload = json.loads(data)
            except (TypeError, ValueError):
                payload = data
            msg = payload.get("error") if isinstance(payload, dict) else payload
            return Result("error", message=msg if isinstance(msg, str) else None)
        return Result("transport", message="the event stream ended without a result")
