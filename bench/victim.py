"""One visitor never waits on another: a victim's Step alone and under each one-address attack, side by side.

    python -m bench.victim                          # every attack, 3 rounds of 8 s alone + 8 s attacked each
    python -m bench.victim --only inside_cell,uploads --rounds 5 --seconds 6

This starts `python app.py` (tests.support.server.AppServer) behind a pretend proxy with its real
limits (`DECODER_LAB_RATE_SCALE=1`, one torch thread), as bench/shares.py does, so each client is
its own address by X-Forwarded-For. A victim address presses Step on its own session, one at a time,
`--pause` apart, for the whole run. Each attack comes from one other address with `--attackers`
threads that call as fast as the server admits (a refusal is counted, not slept on), as the page
sends its calls (POST /queue/join, then the session's event stream until the call has completed):

- `steps`: Step on the attacker's own sessions;
- `inside_cell`: the Inside-one-cell panel (open a cell, the selected token, a picked cell) and the
  API's /inside, on a 200-token text;
- `head_matrices`: the head's Q, K, V and QKᵀ matrices of the Inside panel, on that text;
- `uploads`: the largest own model the app takes (a ~19 MB .safetensors) uploaded and loaded;
- `links`: "Link to this view", and page loads of a link with 64 steps, each under a new session;
- `imports`: a session file of 256 Step + Undo pairs on the grammar model opened, from new sessions.

Alone and attacked windows alternate (`--rounds` of each per attack, the attack stopped and its calls
drained before an alone window), so a ratio compares times taken under the same background load of
the machine. One JSON line per attack: the victim's Step p50/p95 alone and attacked (ms), their
ratios (attacked / alone), and the attacker's calls by answer; then a table of the ratios. The aim
(issue 35): the victim's median at most 2x its median alone under any one attack.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.common import emit, parser, summary
from bench.shares import GRAMMAR, P, PAGE, STEP, answer, session_file
from tests.support.server import AppServer

ATTACKS = ("steps", "inside_cell", "head_matrices", "uploads", "links", "imports")
VICTIM, ATTACKER = "198.51.100.20", "203.0.113.{}"


def function_indices() -> dict[str, int]:
    """Each handler's fn_index as the page calls it (built here as app.py builds the page: the same
    order, so the same numbers the server has). The first event of a handler's name wins."""
    import app

    out: dict[str, int] = {}
    for index, fn in app.build_demo().fns.items():
        name = getattr(fn.fn, "__name__", None)
        if name and fn.queue is not False:
            out.setdefault(name, index)
    return out


class Page:
    """Calls from one address as the page sends them: a join, then its session's event stream until done."""

    def __init__(self, url: str, address: str, fns: dict[str, int]):
        self.url, self.fns = url, fns
        self.http = httpx.Client(timeout=300, headers={"X-Forwarded-For": address})

    def call(self, name: str, data: list, session_hash: str, query: str = "") -> str:
        """"ok", or the refusal's class (bench.shares.answer's words). A call that succeeded is known by its
        message's words: its output (megabytes for a figure) is not parsed, so the client costs little."""
        r = self.http.post(f"{self.url}gradio_api/queue/join{query}",
                           json={"fn_index": self.fns[name], "data": data, "session_hash": session_hash})
        if r.status_code != 200:
            return f"HTTP {r.status_code}: {r.json().get('error', '')[:40]}"
        event = r.json()["event_id"].encode()
        done, buf = b'"msg":"process_completed"', bytearray()
        with self.http.stream("GET", f"{self.url}gradio_api/queue/data?session_hash={session_hash}") as stream:
            for chunk in stream.iter_raw():  # bytes as they come: a figure's megabytes are never decoded
                buf += chunk
                while True:
                    start = buf.find(done)
                    if start < 0:
                        del buf[:-len(done)]
                        break
                    end = buf.find(b"\n", start)
                    if end < 0:
                        del buf[:start]
                        break
                    line = bytes(buf[start:end])
                    del buf[:end]
                    if event not in line[:200]:
                        continue  # another call's message
                    if b'"success":true' in line[-300:].replace(b" ", b""):
                        return "ok"
                    msg = json.loads(b"{" + line)
                    return answer(RuntimeError((msg.get("output") or {}).get("error") or "failed"))
        return "stream ended"

    def upload(self, path: Path) -> dict | str:
        """A file sent to gradio's upload route, as the FileData a handler receives (or the refusal)."""
        with path.open("rb") as f:
            r = self.http.post(f"{self.url}gradio_api/upload", files={"files": (path.name, f)})
        if r.status_code != 200:
            return f"HTTP {r.status_code}: {r.text[:40]}"
        return {"path": r.json()[0], "orig_name": path.name, "meta": {"_type": "gradio.FileData"}}

    def close(self) -> None:
        self.http.close()


def largest_model(folder: Path) -> Path:
    """An own model at the upload limits' edge (6 layers, 8 heads, d_model 256, context 256; ~19 MB)."""
    import dataclasses

    import torch

    from lab.catalogue.models import BUILTINS
    from model.checkpoint import save_checkpoint
    from model.transformer import DecoderLM

    grammar = BUILTINS.get(GRAMMAR)
    cfg = dataclasses.replace(grammar.model.cfg, n_layers=6, n_heads=8, d_model=256, d_ff=1024, block_size=256)
    torch.manual_seed(0)
    return save_checkpoint(folder / "largest.safetensors", DecoderLM(cfg).eval(), grammar.tokenizer)


def attack(kind: str, page: Page, on: threading.Event, stop: threading.Event, files: dict, worker: int) -> list:
    """One attacking thread: its calls' answers while `on`, until `stop`."""
    answers: list[str] = []
    own = uuid.uuid4().hex  # this thread's session, with a long text for the Inside panel
    if kind in ("inside_cell", "head_matrices"):
        page.call("generate", [None, GRAMMAR, P, 1.0, 0, 1.0, worker, 200, 0, "all", "weights"], own)
    rng = random.Random(worker)
    while not stop.is_set():
        if not on.wait(0.2):
            continue
        layer, head, q = rng.randrange(3), rng.randrange(4), rng.randrange(150, 200)
        if kind == "steps":
            a = page.call("step", [None, *STEP], own)
            if a != "ok":
                own = uuid.uuid4().hex  # the text is full: another session goes on
        elif kind == "inside_cell":
            name, data = rng.choice([("open_panel", [None, layer, head, q, q - 3, 0, "all"]),
                                     ("selected_token", [None, layer, head, q, 0, "all"]),
                                     ("pick_cell", [None, f"{layer},{head},{q},{q - 1}"]),
                                     ("inside", [None, layer, head, q, None])])
            a = page.call(name, data, own)
        elif kind == "head_matrices":
            a = page.call("draw_matrices", [None, layer, head, q, q - 1], own)
        elif kind == "uploads":
            sent = page.upload(files["model"])
            a = sent if isinstance(sent, str) else page.call("upload_model", [None, sent], uuid.uuid4().hex)
        elif kind == "links":
            if worker % 2:
                a = page.call("make_link", [None, *STEP], own)
            else:
                a = page.call("page_load", [None, *PAGE], uuid.uuid4().hex, "?prompt=anna+found+the+key+.&steps=64")
        else:  # imports
            sent = page.upload(files["session"])
            a = sent if isinstance(sent, str) else page.call("open_session", [None, sent], uuid.uuid4().hex)
        answers.append(a)
    return answers


def victim_steps(page: Page, until: float, pause: float, times: list) -> None:
    """The victim's Steps, one at a time, until `until`: each one's latency (s) goes into `times`."""
    session = uuid.uuid4().hex
    while time.monotonic() < until:
        t0 = time.perf_counter()
        a = page.call("step", [None, *STEP], session)
        if a == "ok":
            times.append(time.perf_counter() - t0)
        else:
            session = uuid.uuid4().hex  # the text is full (or ended): a new session goes on
        time.sleep(pause)


def ratio(a: dict, b: dict, key: str) -> float | None:
    return round(a[key] / b[key], 2) if a.get("n") and b.get("n") and b[key] else None


def attackers(kind: str, url: str, address: str, fns: dict, files: dict, threads: int, on, stop, out) -> None:
    """The attack, in a process of its own (its client's work never holds the victim client's GIL): `threads`
    threads from one address, their answers counted into `out` once `stop` is set."""
    pages = [Page(url, address, fns) for _ in range(threads)]
    with ThreadPoolExecutor(threads) as ex:
        jobs = [ex.submit(attack, kind, p, on, stop, files, w) for w, p in enumerate(pages)]
        calls: dict[str, int] = {}
        for job in jobs:
            for a in job.result():
                calls[a] = calls.get(a, 0) + 1
    out.put(calls)


def run_attack(kind: str, url: str, fns: dict, files: dict, args, n: int) -> dict:
    ctx = multiprocessing.get_context("spawn")
    on, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=attackers, args=(kind, url, ATTACKER.format(n + 1), fns, files, args.attackers,
                                               on, stop, out))
    proc.start()
    victim = Page(url, VICTIM, fns)
    alone: list[float] = []
    attacked: list[float] = []
    time.sleep(3.0)  # the attackers' sessions are set up
    for _ in range(args.rounds):
        victim_steps(victim, time.monotonic() + args.seconds, args.pause, alone)
        on.set()
        time.sleep(1.0)  # the attack is under way before the victim comes
        victim_steps(victim, time.monotonic() + args.seconds, args.pause, attacked)
        on.clear()
        time.sleep(args.drain)  # the attack's calls in flight end
    stop.set()
    calls = out.get(timeout=600)
    proc.join(timeout=60)
    victim.close()
    s_alone, s_attacked = summary(alone), summary(attacked)
    return emit("victim", attack=kind, alone_ms=s_alone, attacked_ms=s_attacked,
                p50_ratio=ratio(s_attacked, s_alone, "median"), p95_ratio=ratio(s_attacked, s_alone, "p95"),
                attacker_calls=calls, aim_met=(ratio(s_attacked, s_alone, "median") or 99) <= 2.0)


def main() -> None:
    p = parser("victim", __doc__)
    p.add_argument("--only", default=",".join(ATTACKS), help="comma-separated attacks to run")
    p.add_argument("--rounds", type=int, default=3, help="alone + attacked windows per attack")
    p.add_argument("--seconds", type=float, default=8.0, help="length of each window")
    p.add_argument("--attackers", type=int, default=4, help="attacking threads (all from one address)")
    p.add_argument("--pause", type=float, default=0.1, help="seconds between the victim's Steps")
    p.add_argument("--drain", type=float, default=3.0, help="seconds for an attack's calls to end")
    args = p.parse_args()
    kinds = [k for k in args.only.split(",") if k]
    tmp = Path(tempfile.mkdtemp(prefix="victim-"))
    files = {"model": largest_model(tmp), "session": session_file(tmp, 256)}
    fns = function_indices()
    env = {"DECODER_LAB_BEHIND_PROXY": "1", "DECODER_LAB_RATE_SCALE": "1", "DECODER_LAB_THREADS": "1"}
    server = AppServer(env, tmp).start()
    rows = []
    try:
        Page(server.url, VICTIM, fns).call("step", [None, *STEP], uuid.uuid4().hex)  # warm up
        for n, kind in enumerate(kinds):
            rows.append(run_attack(kind, server.url, fns, files, args, n))
    finally:
        server.stop()
    print(f"# {'attack':<14} {'alone p50':>9} {'p95':>7} {'attacked p50':>12} {'p95':>7} {'p50 x':>6} {'p95 x':>6}")
    for r in rows:
        a, b = r["alone_ms"], r["attacked_ms"]
        print(f"# {r['attack']:<14} {a.get('median', '-'):>9} {a.get('p95', '-'):>7} {b.get('median', '-'):>12} "
              f"{b.get('p95', '-'):>7} {r['p50_ratio'] or '-':>6} {r['p95_ratio'] or '-':>6}")


if __name__ == "__main__":
    main()
