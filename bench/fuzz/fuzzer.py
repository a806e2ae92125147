"""The fuzzer: it sends calls to twin sessions of a running app, checks each answer (bench/fuzz/
__init__.py says how), and chooses its next action: a random call, valid calls, an upload, a
training stopped mid-run, or a probe right after a refusal."""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from tests.support.server import ROOT

from .calls import TRAIN_TIMEOUT_S, Call, Endpoint, Result, Side, client_can_send, discover
from .checks import GENERIC, INCONCLUSIVE, first_difference, leaks, normalized, shorten, signature
from .files import Files
from .generators import CallGenerators
from .knowledge import Knowledge, ModelInfo
from .log import LogWatch, Traceback
from .report import Stats

WEIGHTS = {"/step": 24, "/generate": 10, "/undo": 10, "/reset": 5, "/select_model": 7, "/positional": 5,
           "/train": 6, "/stop": 4, "/upload_model": 5}
NEW_ENDPOINT_WEIGHT = 6  # an endpoint not listed above (added later) still gets its share


class Fuzzer(CallGenerators):
    """Sends calls to twin sessions of a running app, checks each answer, counts outcomes and defects."""

    def __init__(self, url: str, log_path: Path | None = None, server_dirs: list[str] | None = None,
                 workdir: Path | None = None, stats: Stats | None = None):
        self.url = url
        self.log = LogWatch(log_path)
        self.server_dirs = [str(ROOT), *(server_dirs or [])]
        self.own_tmp = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="fz-uploads-")) if workdir is None else workdir
        self.files = Files(self.workdir)
        self.stats = stats or Stats()
        self.a: Side | None = None
        self.b: Side | None = None
        self.endpoints: dict[str, Endpoint] = {}
        self.know = Knowledge()
        self.suspects: list[str] = []  # refused calls since the twins last agreed
        self.served: list[dict] = []  # files the server served (FileData), for cross-session probes
        self.previous: tuple[Call | None, dict] = (None, {"call": "(before the first call)"})
        self.last: Result | None = None
        self.new_pair()
        self.endpoints = discover(self.a.client)

    # -- sessions

    def new_pair(self) -> None:
        for s in (self.a, self.b):
            if s is not None:
                s.close()
        self.a, self.b = Side(self.url), Side(self.url)
        self.know = Knowledge()
        self.suspects = []

    def close(self) -> None:
        for s in (self.a, self.b):
            if s is not None:
                s.close()
        time.sleep(0.3)
        self.attribute(self.log.read())
        if self.own_tmp:
            shutil.rmtree(self.workdir, ignore_errors=True)



    def run(self, call: Call, side: Side | None = None, twin: bool = True) -> str:
        """Send `call` to session A (or `side`), check the answer, replay a success on the twin."""
        side = side or self.a
        self.attribute(self.log.read())  # printed after the previous call had its answer (e.g. an HTTP 500)
        res = self.last = side.call(call)
        if res.status == "transport":
            time.sleep(0.3)  # a server error's traceback may be printed after the answer went out
        tbs = self.log.read()
        self.stats.calls += 1
        self.stats.seconds.append(res.seconds)
        outcome, reasons = self.classify(call, res)
        example = {"call": call.describe(), "mode": call.mode, "got": shorten(res.message or "", 300),
                   "seconds": round(res.seconds, 3)}
        ep = self.endpoints.get(call.api)
        if res.status == "ok":
            self.collect_served(res.outputs, call)
            if twin and side is self.a and call.replay and ep is not None:
                rb = self.b.call(call)
                tbs += self.log.read()
                self.stats.replays += 1
                same = rb.status == "ok" and normalized(res.outputs) == normalized(rb.outputs)
                if rb.status == "error" and re.search(INCONCLUSIVE, rb.message or ""):
                    self.stats.inconclusive += 1  # the twin was turned away for load, not for its state
                    self.new_pair()
                elif rb.status == "hang":
                    outcome = "hang"
                    res = Result("hang", message=f"the twin's replay: {rb.message}")
                elif not same:
                    outcome = "state-changed"
                    diff = (first_difference(normalized(res.outputs), normalized(rb.outputs)) if rb.status == "ok"
                            else f"the twin got {rb.status}: {shorten(rb.message or '', 200)}")
                    if self.suspects:
                        self.stats.state_changes_on_refusal += 1
                        kind = f"state-changed: {call.api} answered differently after refused calls"
                    else:
                        kind = (f"state-changed: {call.api} answered differently with no refused call before "
                                "(nondeterminism?)")
                    self.stats.defect(kind, outcome, "app", call.transport, {
                        **example, "difference": diff, "refused_calls_before": self.suspects[-5:]})
                    self.new_pair()
                else:
                    self.suspects.clear()
                    self.know.learn(ep, call, res.outputs)
            elif not call.replay and side is self.a:
                self.new_pair()  # A now has what B has not (a call that could not be replayed)
        elif res.status == "error":
            self.suspects.append(call.describe(100))
        if call.served and not self.check_served(call, example):
            outcome = "state-changed"
        self.previous = (call, example)
        self.attribute(tbs)
        if outcome in ("refused-leaky", "unexpected", "hang"):
            cause = next((tb for tb in tbs if not tb.refusal), None) or next(iter(tbs), None)
            origin = cause.origin if cause else "app"
            detail = f" <- {cause.exc.split(':')[0]} in {cause.raised_in}" if cause else ""
            if outcome == "refused-leaky":
                what = "; ".join(r.split(":")[0] for r in reasons)
            elif res.status == "error":
                what = "generic error" if res.message else "error: null"
            else:
                what = signature(res.message or res.status)
            kind = f"{outcome}: {call.api} {what}{detail}"
            self.stats.defect(kind, outcome, origin, call.transport, {**example, "why": reasons,
                                                                      "exception": cause.exc if cause else None})
            if outcome == "hang":
                self.new_pair()
        elif outcome == "refused-clean":
            self.stats.refusals[f"{call.api}: {signature(res.message)}"] += 1
        self.stats.outcomes[outcome] += 1
        self.stats.per_endpoint.setdefault(call.api, Counter())[outcome] += 1
        self.stats.per_mode.setdefault(f"{call.mode} via {call.transport}", Counter())[outcome] += 1
        return outcome

    def attribute(self, tbs: list[Traceback]) -> None:
        """Count the tracebacks the server printed, each with the call that made it."""
        call, example = self.previous
        for tb in tbs:
            self.stats.tracebacks[tb.kind] += 1
            self.stats.defect(tb.kind, "traceback", tb.origin, call.transport if call else "?",
                              {**example, "exception": tb.exc})

    def classify(self, call: Call, res: Result) -> tuple[str, list[str]]:
        if res.status == "ok":
            return "ok", []
        if res.status == "hang":
            return "hang", [res.message]
        if res.status == "transport":
            return "unexpected", [res.message]
        msg = res.message
        if not msg or any(g in msg for g in GENERIC):
            return "unexpected", ["generic message" if msg else "no message (error: null)"]
        sent = call.sent_text() + " " + " ".join(self.know.models)  # a choices list names the session's models
        found = leaks(msg, sent, self.server_dirs)
        return ("refused-leaky", found) if found else ("refused-clean", [])

    def collect_served(self, outputs: Any, call: Call) -> None:
        def walk(x):
            if isinstance(x, dict):
                if isinstance(x.get("path"), str) and isinstance(x.get("url"), str) and x["url"].startswith("http"):
                    self.served.append({"path": x["path"], "url": x["url"], "by": call.api})
                    del self.served[:-8]
                else:
                    for v in x.values():
                        walk(v)
            elif isinstance(x, list):
                for v in x:
                    walk(v)

        walk(outputs)

    def check_served(self, call: Call, example: dict) -> bool:
        """True when every served file the call named is still served (HTTP 200)."""
        kept = True
        for f in call.served:
            try:
                code = httpx.get(f["url"], timeout=10).status_code
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            if code != 200:
                kept = False
                self.stats.defect(f"state-changed: {call.api} deleted a file the server had served to a session",
                                  "state-changed", "app", call.transport,
                                  {**example, "served_file": f["path"], "download_now": f"HTTP {code}"})
            self.served = [s for s in self.served if s is not f]
        return kept

    # -- actions

    def endpoint(self, draw) -> Endpoint:
        names = sorted(self.endpoints)
        weights = [WEIGHTS.get(n, NEW_ENDPOINT_WEIGHT) for n in names]
        k = draw.index(sum(weights))
        for n, w in zip(names, weights):
            if k < w:
                return self.endpoints[n]
            k -= w
        return self.endpoints[names[-1]]

    def random_call(self, draw, transport: str | None = None) -> str:
        ep = self.endpoint(draw)
        outcome = self.run(self.build(ep, draw, transport=transport))
        if outcome.startswith("refused") and draw.chance(0.5):
            self.probe(draw)
        return outcome

    def valid_calls(self, draw, n: int = 3) -> None:
        """A few valid calls in a row: long texts, trained and uploaded models, deeper states."""
        for _ in range(n):
            self.run(self.build(self.endpoint(draw), draw, mode="valid"))

    def probe(self, draw) -> str | None:
        """A call that shows the session's state: a Step continuing the current text, or an Undo."""
        t, v = self.know.text, self.know.view
        step, undo = self.endpoints.get("/step"), self.endpoints.get("/undo")
        if t is None or step is None or t.get("model_name") not in self.know.models:
            return None
        ep = undo if undo is not None and draw.chance(0.3) else step
        return self.run(self.with_args(self.build(ep, draw, mode="valid", transport="client"), "probe", "", **t, **v))

    def with_args(self, call: Call, mode: str, note: str, **named) -> Call:
        """`call` with the arguments of these names set (those its endpoint has)."""
        index = {p.name: i for i, p in enumerate(self.endpoints[call.api].params)}
        for k, value in named.items():
            if k in index and index[k] < len(call.args):
                call.args[index[k]] = value
        call.mode, call.note = mode, note
        call.transport = "client" if client_can_send(call.args) else "raw"
        return call

    def upload(self, draw) -> str | None:
        """A hostile (or sometimes valid) checkpoint through the upload endpoint."""
        ep = self.endpoints.get("/upload_model")
        if ep is None:
            return None
        from gradio_client import handle_file

        if draw.chance(0.85):
            path, label, info = self.files.hostile(draw)
        else:
            path, label, info = self.files.checkpoint(draw)
        call = Call(ep.name, [handle_file(str(path))], "client", "upload", note=label)
        call.info = ModelInfo(info["layers"], info["heads"], [info["prompt"]])
        outcome = self.run(call)
        if outcome.startswith("refused") and draw.chance(0.7):
            self.probe(draw)
        return outcome

    def train_stop(self, draw) -> None:
        """A long run on a third session: Explore works meanwhile, another session's Stop leaves it
        alone, its own Stop ends it within seconds and keeps the model."""
        train, stop, step = (self.endpoints.get(n) for n in ("/train", "/stop", "/step"))
        if not (train and stop and step):
            return
        c, d = Side(self.url), Side(self.url)
        try:
            call = self.build(train, draw, mode="valid", transport="client")
            named = {p.name: i for i, p in enumerate(train.params)}
            call.args[named["steps"]] = int(self.numeric_range(train.params[named["steps"]])[1])
            call.args[named["corpus_name"]] = "sort"
            call.args[named["d_model"]], call.args[named["d_ff"]] = 32, 64
            call.mode, call.note = "scenario", "train-stop: a long run"
            job = c.client.submit(*call.args, api_name=call.api)
            t0 = time.perf_counter()
            while not job.outputs() and not job.done() and time.perf_counter() - t0 < 30:
                time.sleep(0.05)
            if job.done():  # finished before it could be stopped: nothing to check
                with contextlib.suppress(Exception):
                    job.result(timeout=60)
                return
            self.run(self.with_args(self.build(step, draw, mode="valid", transport="client"), "scenario",
                                    "train-stop: Explore while training", model_name="sort digits (built-in)",
                                    prompt="503124=", layer=0, head="all"), side=c, twin=False)
            self.run(Call("/stop", [], mode="scenario", note="train-stop: another session's Stop"), side=d, twin=False)
            time.sleep(1.2)
            if job.done():
                with contextlib.suppress(Exception):
                    status = str(job.result(timeout=5)[0])
                    if "stopped" in status:
                        self.stats.defect("state-changed: /stop in one session stopped another session's training",
                                          "state-changed", "app", "client",
                                          {"call": call.describe(), "status": shorten(status, 200)})
                return  # finished (or stopped) before its own Stop: nothing more to check
            self.run(Call("/stop", [], mode="scenario", note="train-stop: its own Stop"), side=c, twin=False)
            t1 = time.perf_counter()
            try:
                out = job.result(timeout=TRAIN_TIMEOUT_S)  # a hang guard: how soon it ends depends on the machine
            except Exception as exc:  # noqa: BLE001
                self.stats.defect(f"unexpected: training did not end after Stop ({type(exc).__name__})", "hang",
                                  "app", "client", {"call": call.describe(), "got": shorten(str(exc), 200)})
                return
            waited = time.perf_counter() - t1
            status, model = out[0], out[2].get("value") if isinstance(out[2], dict) else None
            if not str(status).startswith(("Training stopped by you", "Training finished")):
                self.stats.defect("unexpected: Stop did not end the run with 'stopped by you'",
                                  "unexpected", "app", "client",
                                  {"call": call.describe(), "status": shorten(str(status), 200),
                                   "waited_s": round(waited, 2)})
            if model:
                self.run(self.with_args(self.build(step, draw, mode="valid", transport="client"), "scenario",
                                        "train-stop: the stopped run's model", model_name=model, prompt="503124=",
                                        layer=0, head="all"), side=c, twin=False)
        finally:
            c.close()
            d.close()

    def act(self, draw) -> None:
        """One action of the fuzzer, chosen by `draw`."""
        k = draw.index(1000)
        if k < 80:
            self.upload(draw)
        elif k < 83:
            self.train_stop(draw)
        elif k < 130:
            self.random_call(draw, transport="raw")
        elif k < 200:
            self.valid_calls(draw)
        else:
            self.random_call(draw)
