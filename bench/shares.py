"""Per-address shares seen from outside: a victim's Step latency while one address abuses the server.

This starts `python app.py` (tests.support.server.AppServer) behind a pretend proxy (`DECODER_LAB_BEHIND_PROXY=1`)
with its real limits (`DECODER_LAB_RATE_SCALE=1`), so every client is its own address by
X-Forwarded-For. For each abuse of the list below, a new abusive address does it from `--abusers`
threads for `--seconds`, at whatever rate the server admits (its refusals are counted, not slept
on), while a new victim address presses Step on its own session again and again (one at a time,
`--pause` apart; a new text when the text is full). Each abuse prints one JSON line: the victim's
Step latency (n, median, p95, max, in ms), the victim's refusals and the abuser's calls by answer.

- `baseline`: nobody abuses (the victim alone on this machine, for reference);
- `session_store`: new sessions as fast as admitted (a raw join of a Step under a new session
  hash each time, not waiting for its answer);
- `memory`: Generate 256 tokens, each in a new session (texts held in memory);
- `disk_cache`: "View as web page" again and again (5-8 MB files in gradio's cache);
- `import_turn`: one session opens a session file of 1,024 actions (1,024 Steps to replay) while
  the other threads press Step on that same session (their calls wait for its turn);
- `link_flood`: page loads of a `steps=256` link, each under a new session hash, not waiting;
- `import_flood`: session files opened from new sessions, as fast as admitted.

The target, set with the per-address shares: the victim's p95 ≤ 1.5 s during each abuse. On a shared,
loaded machine the victim's latency also carries the load of everything else; read it next to
`machine` (load averages) and the baseline.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.common import emit, parser, summary
from tests.support.server import AppServer

GRAMMAR = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
STEP = [GRAMMAR, P, 0.8, 0, 1.0, 0, 0, "all", "weights"]
PAGE = ["linear", False, "1280x720", 0, "all", "weights"]
ABUSES = ("baseline", "session_store", "memory", "disk_cache", "import_turn", "link_flood", "import_flood")


def client(url: str, address: str):
    from gradio_client import Client

    return Client(url, verbose=False, download_files=False, analytics_enabled=False,
                  headers={"X-Forwarded-For": address})


def answer(exc: BaseException) -> str:
    """A refusal's class: its HTTP status at the door, or the start of the handler's sentence."""
    text = str(exc)
    for known in ("Slow down", "Your address", "The server is full", "This would take", "This session is still busy"):
        if known in text:
            return known
    while exc is not None:
        response = getattr(exc, "response", None)
        if response is not None:
            try:
                return f"HTTP {response.status_code}: {response.json()['error'][:40]}"
            except (ValueError, KeyError, TypeError):
                return f"HTTP {response.status_code}"
        if str(exc):
            text = str(exc)
        exc = exc.__context__
    return text[:60] or "no message"


class Raw:
    """Calls as the page sends them (POST /queue/join), by function index, from one address."""

    def __init__(self, url: str, address: str):
        self.url, self.address = url, address
        deps = httpx.get(url + "config", timeout=60).json()["dependencies"]
        self.step = next(d["id"] for d in deps if d["api_name"] == "step")
        self.load = next(d["id"] for d in deps if d["backend_fn"] and any(t[1] == "load" for t in d["targets"]))
        self.http = httpx.Client(timeout=120, headers={"X-Forwarded-For": address})

    def join(self, fn: int, data: list, query: str = "") -> str:
        r = self.http.post(f"{self.url}gradio_api/queue/join{query}",
                           json={"fn_index": fn, "data": data, "session_hash": uuid.uuid4().hex})
        return "joined" if r.status_code == 200 else f"HTTP {r.status_code}: {r.json().get('error', '')[:40]}"


def session_file(tmp: Path, pairs: int) -> Path:
    """A session file of `pairs` Step + Undo pairs on the grammar model (`pairs` Steps to replay)."""
    from lab.session import Session
    from lab.sessionfile import FORMAT, VERSION, builtin_checksum

    actions = [{"do": "step", "sampling": [1.0, 0, 1.0], "tokens": [5]}, {"do": "undo"}] * pairs
    doc = {"format": FORMAT, "version": VERSION,
           "model": {"builtin": GRAMMAR, "sha256": builtin_checksum(Session(), GRAMMAR)},
           "prompt": P, "seed": 0, "actions": actions, "view": {"layer": 0, "head": 0, "view": "weights"}}
    path = tmp / f"session-{pairs}.json"
    path.write_text(json.dumps(doc))
    return path


def abuse(kind: str, url: str, address: str, stop: threading.Event, worker: int, files: dict, shared: dict) -> list:
    """One abusive thread: the answers of its calls until `stop`."""
    from gradio_client import handle_file

    answers = []

    def record(fn):
        try:
            fn()
            answers.append("ok")
        except Exception as exc:  # noqa: BLE001 - a refusal is what is counted
            answers.append(answer(exc))

    if kind in ("session_store", "link_flood"):
        raw = Raw(url, address)
        while not stop.is_set():
            if kind == "session_store":
                answers.append(raw.join(raw.step, [None, *STEP]))
            else:
                answers.append(raw.join(raw.load, [None, *PAGE], "?prompt=anna+found+the+key+.&steps=256"))
        return answers
    if kind == "import_turn":
        c = shared["turn"]  # one session for every thread: the first imports, the others Step on it
        while not stop.is_set():
            if worker == 0:
                record(lambda: c.predict(handle_file(str(files["long"])), api_name="/import_session"))
            else:
                record(lambda: c.predict(*STEP, api_name="/step"))
        return answers
    c = client(url, address)
    if kind == "disk_cache":
        c.predict(*STEP, api_name="/step")
    while not stop.is_set():
        if kind == "memory":
            c = client(url, address)  # a new session for each text
            record(lambda: c.predict(GRAMMAR, P, 1.0, 0, 1.0, worker, 256, 0, "all", "weights", api_name="/generate"))
        elif kind == "disk_cache":
            record(lambda: c.predict(0, "all", "weights", api_name="/export_page"))
        elif kind == "import_flood":
            c = client(url, address)
            record(lambda: c.predict(handle_file(str(files["long"])), api_name="/import_session"))
    return answers


def victim(url: str, address: str, stop: threading.Event, pause: float) -> tuple[list[float], list[str]]:
    """Steps of the victim, one at a time: their latencies (s) and any refusal."""
    c = client(url, address)
    times, refusals = [], []
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            c.predict(*STEP, api_name="/step")
            times.append(time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001
            if "generated tokens; Reset" in str(exc):
                c = client(url, address)  # the text is full: a new session goes on
            else:
                refusals.append(answer(exc))
        stop.wait(pause)
    return times, refusals


def main() -> None:
    p = parser("shares", __doc__)
    p.add_argument("--seconds", type=float, default=30.0, help="how long each abuse runs")
    p.add_argument("--abusers", type=int, default=4, help="abusive threads (all from one address)")
    p.add_argument("--pause", type=float, default=0.25, help="seconds between the victim's Steps")
    p.add_argument("--only", default=",".join(ABUSES), help="comma-separated abuses to run")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shares-"))
    files = {"long": session_file(tmp, 512)}
    env = {"DECODER_LAB_BEHIND_PROXY": "1", "DECODER_LAB_RATE_SCALE": "1", "DECODER_LAB_THREADS": "1"}
    server = AppServer(env, tmp).start()
    try:
        for n, kind in enumerate(a for a in args.only.split(",") if a):
            abuser, victim_address = f"203.0.113.{n + 1}", f"198.51.100.{n + 1}"
            shared = {"turn": client(server.url, abuser)} if kind == "import_turn" else {}
            stop = threading.Event()
            workers = 0 if kind == "baseline" else args.abusers
            with ThreadPoolExecutor(workers + 1) as ex:
                abusers = [ex.submit(abuse, kind, server.url, abuser, stop, w, files, shared) for w in range(workers)]
                time.sleep(min(3.0, args.seconds / 5))  # the abuse is under way before the victim comes
                victim_job = ex.submit(victim, server.url, victim_address, stop, args.pause)
                time.sleep(args.seconds)
                stop.set()
                times, refusals = victim_job.result()
                calls: dict[str, int] = {}
                for job in abusers:
                    for a in job.result():
                        calls[a] = calls.get(a, 0) + 1
            emit("shares", abuse=kind, victim_step_ms=summary(times), victim_refused=len(refusals),
                 victim_refusals=sorted(set(refusals))[:3], abuser_calls=calls,
                 target_met=bool(times) and summary(times)["p95"] <= 1500)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
