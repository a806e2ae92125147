"""Load and isolation stress for the running app (loopback only, bounded loops); prints one JSON line.

    python -m bench.stress                       # starts its own app (short state TTL), 20 sessions × 30 s
    python -m bench.stress --sessions 20 --seconds 30 --sequential 1000
    python -m bench.stress --url http://127.0.0.1:7860/ --pid 12345   # an app you started (pid: for RSS)

Phase 1: `--sessions` gradio_client sessions at once for `--seconds`, each mixing /step, /generate
and a short /train (sort corpus, tiny model, 20 steps) with its own seed and its own prompt prefix.
Every answer is checked to belong to its session: its tokens start with that session's prompt,
consecutive Steps extend the same text, its trained models carry this session's names only.
Errors other than a full-queue refusal are counted as errors. Latencies per endpoint (p50/p95).
Phase 2 (after the sessions end): resident memory of the server after the state TTL has passed.
Phase 3: `--sequential` short sessions in a row (`client.reset_session()` + one /step), RSS every 100.

`run_load` is also what tests/api/test_robustness.py runs, shortened.
"""

from __future__ import annotations

import contextlib

import random
import tempfile
import threading
import time
from pathlib import Path

from bench.common import emit, parser
from lab.catalogue.models import BUILTINS, DEFAULT_MODEL
from tests.support.server import AppServer, rss_mb

GRAMMAR = DEFAULT_MODEL
BUILTIN_NAMES = set(BUILTINS.names)
NAMES = ["paul", "julia", "anna", "sara", "lisa", "john", "david", "mark", "tom", "maria", "emma", "peter"]
PLACES = ["station", "garden", "market", "park", "library", "school", "kitchen"]


def server_rss(pid: int | None) -> float | None:
    """The server's resident memory in MB, or None when its PID is unknown or it has gone."""
    if not pid:
        return None
    try:
        return rss_mb(pid)
    except OSError:
        return None


def pct(samples: list[float], q: float) -> float | None:
    if not samples:
        return None
    s = sorted(samples)
    return round(1000 * s[min(len(s) - 1, int(q * len(s)))], 1)


def session_prompt(i: int) -> str:
    a, b = NAMES[i % len(NAMES)], NAMES[(i // len(NAMES) + i + 1) % len(NAMES)]
    return f"{a} met {b} at the {PLACES[i % len(PLACES)]} ."


def words(tokens) -> list[str]:
    return [t["token"] for t in tokens]


def train_args(seed: int):
    return ("sort", "", None, "char", 1, 2, 16, 32, "learned", "pre", "gelu", 0.0, 20, 0.003, seed)


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lat: dict[str, list[float]] = {"step": [], "generate": [], "train": []}
        self.errors: list[str] = []
        self.queue_full = 0
        self.mismatches: list[str] = []
        self.trains = 0

    def add(self, kind: str, seconds: float) -> None:
        with self.lock:
            self.lat[kind].append(seconds)


def session_loop(url: str, i: int, deadline: float, stats: Stats, rng: random.Random) -> None:
    from gradio_client import Client

    prompt = session_prompt(i)
    pw = prompt.split()
    seed = 1000 + i
    own_models: set[str] = set()
    try:
        c = Client(url, verbose=False)
    except Exception as exc:  # noqa: BLE001
        with stats.lock:
            stats.errors.append(f"session {i} connect: {type(exc).__name__}: {str(exc)[:200]}")
        return
    prev: list[str] | None = None
    while time.time() < deadline:
        kind = rng.choices(["step", "generate", "train"], weights=[6, 3, 1])[0]
        t0 = time.perf_counter()
        try:
            if kind == "step":
                tokens = c.predict(GRAMMAR, prompt, 1.0, 0, 1.0, seed, 0, "all", "weights", api_name="/step")[0]
                w = words(tokens)
                if w[: len(pw)] != pw:
                    stats.mismatches.append(f"session {i}: step text {w[:8]} does not start with {pw}")
                if prev is not None and w[:-1] != prev:
                    stats.mismatches.append(f"session {i}: step did not extend its own text")
                prev = w
                if len(w) >= 120:  # stay below the context (128) so the prompt stays in view
                    c.predict(GRAMMAR, api_name="/reset")
                    prev = None
            elif kind == "generate":
                tokens = c.predict(GRAMMAR, prompt, 1.0, 0, 1.0, seed, 5, 0, "all", "weights",
                                   api_name="/generate")[0]
                w = words(tokens)
                if w[: len(pw)] != pw:
                    stats.mismatches.append(f"session {i}: generate text {w[:8]} does not start with {pw}")
                prev = w  # generate went on with the text (or started it); the next step continues it
                if len(w) >= 120:
                    c.predict(GRAMMAR, api_name="/reset")
                    prev = None
            else:
                status, _, dd, _, _ = c.predict(*train_args(seed), api_name="/train")
                name = dd["value"]
                own_models.add(name)
                choices = {ch[0] if isinstance(ch, (list, tuple)) else ch for ch in dd["choices"]}
                if not status.startswith("Training finished after 20 steps"):
                    stats.mismatches.append(f"session {i}: train status {status[:80]!r}")
                if not (choices - BUILTIN_NAMES) <= own_models or name not in choices:
                    stats.mismatches.append(f"session {i}: model list {sorted(choices - BUILTIN_NAMES)} not its own")
                with stats.lock:
                    stats.trains += 1
                tok = c.predict(name, "503124=", 0.0, 0, 1.0, 0, 0, "all", "weights", api_name="/step")[0]
                if "".join(words(tok[:7])) != "503124=":
                    stats.mismatches.append(f"session {i}: own model text {words(tok)}")
                prev = None
            stats.add(kind, time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - classified and reported
            msg = f"{type(exc).__name__}: {str(exc)[:200]}"
            with stats.lock:
                if "queue is full" in msg.lower() or "QueueError" in msg:
                    stats.queue_full += 1
                elif "ended this text with <EOS>" in msg:  # the model finished its text: start again below
                    pass
                else:
                    stats.errors.append(f"session {i} {kind}: {msg}")
            if "ended this text with <EOS>" in msg:
                with contextlib.suppress(Exception):
                    c.predict(GRAMMAR, api_name="/reset")
            prev = None
    try:
        c.close()
    except Exception:  # noqa: BLE001
        pass


def run_load(url: str, sessions: int = 20, seconds: float = 30, pid: int | None = None, seed: int = 0) -> dict:
    stats = Stats()
    rss0 = server_rss(pid)
    peak = [rss0 or 0.0]
    deadline = time.time() + seconds
    stop = threading.Event()

    def sample():
        while not stop.wait(0.5):
            r = server_rss(pid)
            if r:
                peak[0] = max(peak[0], r)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=session_loop, args=(url, i, deadline, stats, random.Random(seed * 1000 + i)),
                                daemon=True) for i in range(sessions)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 120)
    wall = time.perf_counter() - t0
    stop.set()
    all_lat = [x for v in stats.lat.values() for x in v]
    return {
        "sessions": sessions, "seconds": seconds, "wall_s": round(wall, 1),
        "requests": len(all_lat), "per_endpoint": {k: len(v) for k, v in stats.lat.items()},
        "errors": len(stats.errors), "error_samples": stats.errors[:5], "queue_full": stats.queue_full,
        "mismatches": len(stats.mismatches), "mismatch_samples": stats.mismatches[:5], "trains": stats.trains,
        "p50_ms": pct(all_lat, 0.5), "p95_ms": pct(all_lat, 0.95),
        "p95_by_endpoint_ms": {k: pct(v, 0.95) for k, v in stats.lat.items()},
        "p50_by_endpoint_ms": {k: pct(v, 0.5) for k, v in stats.lat.items()},
        "rss_before_mb": rss0, "rss_peak_mb": peak[0], "rss_end_mb": server_rss(pid),
        "threads_alive": sum(t.is_alive() for t in threads),
    }


def run_sequential(url: str, n: int, pid: int | None) -> dict:
    from gradio_client import Client

    c = Client(url, verbose=False)
    rss = []
    errors = 0
    t0 = time.perf_counter()
    lat = []
    for k in range(n):
        if k % 100 == 0:
            rss.append({"sessions": k, "rss_mb": server_rss(pid)})
        c.reset_session()
        t1 = time.perf_counter()
        try:
            c.predict(GRAMMAR, session_prompt(k), 1.0, 0, 1.0, k, 0, "all", "weights", api_name="/step")
        except Exception:  # noqa: BLE001
            errors += 1
        lat.append(time.perf_counter() - t1)
    rss.append({"sessions": n, "rss_mb": server_rss(pid)})
    return {"n": n, "errors": errors, "wall_s": round(time.perf_counter() - t0, 1), "p50_ms": pct(lat, 0.5),
            "p95_ms": pct(lat, 0.95), "rss_every_100": rss}


def main() -> None:
    ap = parser("stress", __doc__)
    ap.add_argument("--url", help="app URL; default: start our own app on a free loopback port")
    ap.add_argument("--pid", type=int, help="server PID for RSS readings (own server: known)")
    ap.add_argument("--sessions", type=int, default=20, help="gradio_client sessions at once in phase 1")
    ap.add_argument("--seconds", type=float, default=30, help="how long phase 1 runs")
    ap.add_argument("--sequential", type=int, default=1000, help="short sessions in a row (0 = skip)")
    ap.add_argument("--ttl", type=float, default=10, help="state TTL for our own app (DECODER_LAB_STATE_TTL)")
    ap.add_argument("--settle", type=float, default=None, help="seconds to wait after load (default ttl + 5)")
    args = ap.parse_args()
    if args.url and not args.url.startswith(("http://127.0.0.1", "http://localhost")):
        ap.error("loopback URLs only")
    server = None
    url, pid = args.url, args.pid
    if not url:
        tmp = Path(tempfile.mkdtemp(prefix="stress-"))
        # sessions idle for 5 s may make room (the default, 5 min, would refuse the 501st of 1,000 in a row)
        server = AppServer({"DECODER_LAB_STATE_TTL": str(args.ttl), "DECODER_LAB_TRAIN_SECONDS": "30",
                            "DECODER_LAB_IDLE_S": "5"}, tmp).start()
        url, pid = server.url, server.proc.pid
    try:
        from gradio_client import Client

        Client(url, verbose=False).predict(GRAMMAR, session_prompt(0), 1.0, 0, 1.0, 0, 0, "all", "weights",
                                           api_name="/step")  # warm up
        out = {"url": url, "rss_start_mb": server_rss(pid)}
        out["load"] = run_load(url, args.sessions, args.seconds, pid)
        settle = args.ttl + 5 if args.settle is None else args.settle
        time.sleep(settle)
        out["rss_after_settle_mb"] = server_rss(pid)
        out["settle_s"] = settle
        if args.sequential:
            out["sequential"] = run_sequential(url, args.sequential, pid)
            time.sleep(settle)
            out["rss_after_sequential_settle_mb"] = server_rss(pid)
        if server is not None:
            log = server.output()
            out["server_unexpected_errors"] = log.count("unexpected error")
        emit("stress", **out)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
