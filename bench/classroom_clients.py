"""The learners of bench/classroom.py on the wire: one gradio_client Client each, from its own loopback address.

A learner's address. Every 127.x.y.z address is this machine, but a connection to 127.0.0.1 comes from
127.0.0.1 unless the client picks its source address, and gradio_client cannot be told one (it makes
its requests through httpx's module functions, which take no transport). So `own_addresses` wraps
httpcore's connect in this process: a request to http://127.0.0.N:PORT/ (N ≠ 1) is made from 127.0.0.N
to the server's 127.0.0.1:PORT, and the server sees the learner's address as a classroom's browsers
would show theirs. The server keeps listening on 127.0.0.1 alone; nothing is opened to the network.

A learner's waits. Besides a call's answer time (the wall time of `predict`), `LearnerClient` keeps
where it went: the client's own work before it sends the call (`client`: gradio_client makes a new
HTTP client per request, which costs milliseconds of CPU and more on a loaded machine), the join
request's round trip (`door`: the door, ui/door.py, holds it while the address or the session has no
turn, so this is the door's wait), and the time in gradio's queue (`queue`: its "in queue" message to
its "process starts", waiting for a worker of the call's lane), read from every status the queue sent
(`Timeline`). gradio_client reads those messages every 50 ms at most, so `queue` is late or early by up
to that, and a call that runs in a few milliseconds reads them all at once (a queue time of 0).
"""

from __future__ import annotations

import contextlib
import ipaddress
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from bench.shares import answer

# A refusal's kind: a few words for each sentence the door, the rates and the budgets answer with
# (ui/door.py, lab/server/rates.py, lab/server/budget.py, lab/server/sessionstore.py).
KINDS = (
    ("Your address has", "address queue share (CLIENT_QUEUE)"),
    ("Your address's earlier calls are still running", "address workers busy (CLIENT_WORKERS)"),
    ("This session is still busy", "session busy"),
    ("Your address already has a training", "address long calls"),
    ("Your address already has", "address sessions (CLIENT_SESSIONS)"),
    ("The sessions from your address would hold", "address memory (CLIENT_MEMORY_MB)"),
    ("The server is full", "server full"),
    ("queue is full", "queue full (QUEUE)"),
    ("ended this text with", "text ended with <EOS>"),
    ("generated tokens; Reset", "text full"),
)
ENDED = ("text ended with <EOS>", "text full")  # the model's doing, not the server's: a new text goes on


def kind(exc: BaseException) -> str:
    """A refused or failed call's kind: a rate's "Slow down" names its action, a share its setting."""
    text = f"{exc} {answer(exc)}"
    if "Slow down:" in text:
        what = text.split("Slow down:", 1)[1].split(" from your address")[0].split(" in a short time")[0]
        return "rate: " + what.strip()[:60]
    return next((k for said, k in KINDS if said in text), answer(exc)[:60])


def learner_url(port: int, address: str) -> str:
    return f"http://{address}:{port}/"


@contextlib.contextmanager
def own_addresses():
    """While open, a connection this process makes to 127.0.0.N (N ≠ 1) goes to 127.0.0.1 from 127.0.0.N."""
    from httpcore._backends.sync import SyncBackend

    plain = SyncBackend.connect_tcp

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if ip is not None and ip.is_loopback and ip.version == 4 and str(ip) != "127.0.0.1" and local_address is None:
            host, local_address = "127.0.0.1", str(ip)
        return plain(self, host, port, timeout=timeout, local_address=local_address, socket_options=socket_options)

    SyncBackend.connect_tcp = connect_tcp
    try:
        yield
    finally:
        SyncBackend.connect_tcp = plain


def _timeline_class():
    from gradio_client.utils import JobStatus

    class Timeline(JobStatus):
        """A job's status that also keeps every status it was set to: (status, when it was read, queue rank)."""

        def __setattr__(self, name, value):
            if name == "latest_status":
                self.__dict__.setdefault("seen", []).append((value.code, time.perf_counter(), value.rank))
            super().__setattr__(name, value)

    return Timeline


def learner_client(url: str):
    """A gradio_client Client whose last call's statuses are `client.timeline()`."""
    from gradio_client import Client
    from gradio_client.utils import Status

    timeline = _timeline_class()

    class LearnerClient(Client):
        def new_helper(self, fn_index, headers=None):  # once per call, before it is sent
            helper = super().new_helper(fn_index, headers=headers)
            helper.job = timeline()
            self.last_job, self.last_send = helper.job, None
            return helper

        def send_data(self, *args, **kwargs):  # the join request (POST …/queue/join)
            t0 = time.perf_counter()
            try:
                return super().send_data(*args, **kwargs)
            finally:
                self.last_send = (t0, time.perf_counter())

        def waits(self, t0: float) -> tuple[float | None, float | None, float | None, int | None]:
            """The last call's (client: t0 → join sent, door: the join's round trip, queue: "in queue" → "process
            starts", in seconds; its largest queue rank), None where it never got there."""
            seen = getattr(getattr(self, "last_job", None), "seen", [])
            sent = getattr(self, "last_send", None)
            queued = next((t for code, t, _ in seen if code == Status.IN_QUEUE), None)
            start = next((t for code, t, _ in seen if code == Status.PROCESSING), None)
            ranks = [r for _, _, r in seen if r is not None]
            return (None if sent is None else sent[0] - t0, None if sent is None else sent[1] - sent[0],
                    None if queued is None or start is None else max(0.0, start - queued),
                    max(ranks) if ranks else None)

    return LearnerClient(url, verbose=False, download_files=False, analytics_enabled=False)


def head_change_index(client) -> int:
    """The fn_index of the page's head menu: changing it redraws the attention (ui/explore_tab.py).

    The page calls it by number; it has no API name. It is marked callable on this client so that
    gradio_client sends it through the same queue, session and status messages as the named calls."""
    config = client.config
    head = next(c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == "head")
    dep = next(d for d in config["dependencies"]
               if [head, "change"] in [list(t) for t in d.get("targets", [])] and d.get("backend_fn"))
    index = dep.get("id", config["dependencies"].index(dep))
    client.endpoints[index].is_valid = True
    return index


@dataclass
class Call:
    """One click of one learner: what it was, when, how long until the answer and until it ran, how it ended."""

    learner: int
    round: int
    action: str
    at: float  # seconds since the class began
    answer_s: float
    client_s: float | None  # click → join sent (the client's own work)
    door_s: float | None  # the join's round trip (the door's wait for a turn)
    queue_s: float | None  # queued → started (gradio's queue)
    rank: int | None
    outcome: str  # "ok", or the refusal's kind


def run_learner(i: int, url: str, script: Iterable, calls: list, lock: threading.Lock, t_start: float,
                stop_at: float | None, reset) -> None:
    """One learner's lessons: think, click, wait for the answer, in the script's order, until done or `stop_at`.

    `script` yields (round, Action) (bench.classroom.script's); `reset(client)` starts a new text after the
    model ended one. A call that raises is recorded with its kind and the lesson goes on, as a
    person would after a sentence."""
    client, head_fn = None, None
    for rnd, act in script:
        if act.think_s:
            time.sleep(act.think_s)
        if stop_at is not None and time.perf_counter() >= stop_at:
            break
        t0 = time.perf_counter()
        outcome, waits = "ok", (None, None, None, None)
        try:
            if act.action == "open":
                opened = learner_client(url)
                head_fn = head_change_index(opened)
                client = opened
            elif act.api == "head":
                client.predict(*act.args, fn_index=head_fn)
            else:
                client.predict(*act.args, api_name=act.api)
        except Exception as exc:  # noqa: BLE001 - a refusal is what is counted
            outcome = kind(exc)
        answer_s = time.perf_counter() - t0
        if client is not None and act.action != "open":
            waits = client.waits(t0)
        with lock:
            calls.append(Call(i, rnd, act.action, round(t0 - t_start, 3), answer_s, *waits, outcome))
        if client is None:
            return  # the page never opened
        if outcome in ENDED:
            with contextlib.suppress(Exception):
                reset(client)
    if client is not None:
        client.close()
