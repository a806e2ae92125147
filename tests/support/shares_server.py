"""Settings and helpers of the per-address shares server tests (raw calls as the page sends)."""

from __future__ import annotations

import json
import threading
import time

import httpx


GRAMMAR = "grammar (built-in)"

P = "anna found the key . she gave it to tom because he"

STEP = (GRAMMAR, P, 0.0, 0, 1.0, 0, 0, "all", "weights")

ABUSER, VICTIM = "203.0.113.66", "198.51.100.7"

PLACES = 3

# a training that runs far longer than any test needs (the test stops it): 2,000 steps of the largest model
LONG_TRAIN = ["grammar", "", None, "word", 4, 4, 128, 512, "learned", "pre", "gelu", 0.0, 2000, 0.003, 0, True, ""]


def function(server, api_name: str | None = None, event: str | None = None) -> int:
    """The index the page calls a function by: by its API name, or the one a page `event` (load) runs."""
    deps = httpx.get(server.url + "config", timeout=60).json()["dependencies"]
    if api_name is not None:
        return next(d["id"] for d in deps if d["api_name"] == api_name)
    return next(d["id"] for d in deps if d["backend_fn"] and any(t[1] == event for t in d["targets"]))


def join(server, fn_index: int, data: list, session_hash: str, address: str, query: str = "") -> httpx.Response:
    """POST /queue/join as the page does (`query`: the page address's own, which the page sends along);
    a 200 means gradio has put the call in its queue."""
    return httpx.post(f"{server.url}gradio_api/queue/join{query}", json={
        "fn_index": fn_index, "data": data, "session_hash": session_hash}, headers={"X-Forwarded-For": address},
        timeout=120)


class Listener:
    """The session's event stream, read in a thread for as long as the test needs the session's calls:
    gradio ends a session's calls when its stream closes (as when a page is closed)."""

    def __init__(self, server, session_hash: str, address: str):
        self.messages: list[dict] = []
        self.ended = False
        url = f"{server.url}gradio_api/queue/data?session_hash={session_hash}"
        self.stream = httpx.stream("GET", url, headers={"X-Forwarded-For": address}, timeout=None)
        self.response = self.stream.__enter__()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self.response.iter_lines():
                if line.startswith("data:"):
                    self.messages.append(json.loads(line[5:]))
        except httpx.HTTPError:
            pass
        self.ended = True

    def wait(self, msg: str, timeout: float = 300.0) -> dict:
        """The first message `msg` (process_generating, process_completed…); the timeout only guards a hang."""
        t0 = time.monotonic()
        while True:
            found = next((m for m in self.messages if m.get("msg") == msg), None)
            if found is not None:
                return found
            assert not self.ended, f"the stream ended before {msg}: {self.messages[-1:]}"
            assert time.monotonic() - t0 < timeout, f"no {msg} yet: {self.messages[-1:]}"
            time.sleep(0.1)

    def close(self) -> None:
        self.stream.__exit__(None, None, None)


def refused(r: httpx.Response, status: int, start: str) -> None:
    assert r.status_code == status and r.json()["error"].startswith(start), (r.status_code, r.text[:300])
