"""Shared helpers for the Decoder Lab benchmarks (not timed tests: they print JSON lines).

Every script prints one JSON object per result with the command that produced it, the machine
load (1-minute load average and CPU count) and the torch thread count, so a number can be read
next to the conditions it was taken in.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

COMMAND = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])


def load() -> dict:
    one, five, _ = os.getloadavg()
    return {"load1": round(one, 2), "load5": round(five, 2), "cpus": os.cpu_count()}


def emit(bench: str, **fields) -> dict:
    row = {"bench": bench, **fields, "machine": load(), "command": COMMAND}
    print(json.dumps(row), flush=True)
    return row


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def summary(samples: list[float], scale: float = 1000.0, digits: int = 2) -> dict:
    """median / p95 / min / max of samples (seconds by default, reported in ms)."""
    if not samples:
        return {"n": 0}
    s = sorted(samples)
    p95 = s[min(len(s) - 1, max(0, round(0.95 * (len(s) - 1))))]
    return {"n": len(s), "median": round(statistics.median(s) * scale, digits), "p95": round(p95 * scale, digits),
            "min": round(s[0] * scale, digits), "max": round(s[-1] * scale, digits)}


def default_entry():
    """The app's default model (shared, read-only), loaded the app's way."""
    import app

    return app.BUILTIN.get(app.DEFAULT_MODEL)


def start_app(threads: int):
    """`python app.py` on a free loopback port with the given torch thread count (tests' AppServer)."""
    from conftest import AppServer

    return AppServer({"DECODER_LAB_THREADS": str(threads)}).start()


def served_parser(doc: str, lengths: str) -> argparse.ArgumentParser:
    """Argument parser of a bench that serves the app: --lengths (prompt tokens) and --threads."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default=lengths, help="comma-separated prompt lengths in tokens")
    p.add_argument("--threads", type=int, default=1, help="DECODER_LAB_THREADS of the served app")
    return p


@contextlib.contextmanager
def served_default_model(threads: int):
    """Yields (default model entry, its context size, running app server); stops the server after."""
    entry = default_entry()
    server = start_app(threads)
    try:
        yield entry, entry.model.cfg.block_size, server
    finally:
        server.stop()


def grammar_prompt(tokenizer, n_tokens: int, offset: int = 0) -> str:
    """A prompt of exactly n_tokens tokens for `tokenizer`, cut from the grammar corpus.

    `offset` shifts the cut (in tokens) so repeated prompts of one length differ.
    """
    from model.corpora import grammar_text

    ids = tokenizer.encode(grammar_text(seed=0, target_chars=40_000))
    ids = [i for i in ids if i != tokenizer.eos_id]
    start = offset % max(1, len(ids) - n_tokens)
    for shift in range(0, 200):  # the decoded text must re-encode to the same count (word joins)
        text = tokenizer.decode(ids[start + shift : start + shift + n_tokens])
        if len(tokenizer.encode(text)) == n_tokens:
            return text
    raise RuntimeError(f"could not build a {n_tokens}-token prompt")


def rss_kb(pid: int) -> int:
    """Resident set size of a process (VmRSS, kB) from /proc (psutil is not needed)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def tree_rss_kb(pid: int) -> int:
    """VmRSS of a process plus its children (app.py may spawn helpers)."""
    total = rss_kb(pid)
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for c in children:
        try:
            total += tree_rss_kb(int(c))
        except (OSError, ValueError):
            pass
    return total


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.s = time.perf_counter() - self.t0
