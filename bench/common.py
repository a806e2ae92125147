"""Shared helpers of the Decoder Lab benchmarks: the one output function, timing summaries, prompts.

Every benchmark prints its results through `emit`: one JSON object per line, carrying the command
that re-runs it, the machine load (1- and 5-minute load average, CPU count), so a number is read
next to the conditions it was taken in. The app server and the memory reader come from
tests/support/server.py, which the tests use too.
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

from tests.support.server import AppServer

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def _command() -> str:
    """How this process was started, as `python -m bench.<name> ARGS` when it was run as a module."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = spec.name.removesuffix(".__main__") if spec is not None and spec.name else None  # a package: its name
    head = ["-m", name] if name else [sys.argv[0]]
    return "python " + " ".join(shlex.quote(a) for a in [*head, *sys.argv[1:]])


COMMAND = _command()


def load() -> dict:
    one, five, _ = os.getloadavg()
    return {"load1": round(one, 2), "load5": round(five, 2), "cpus": os.cpu_count()}


def emit(bench: str, **fields) -> dict:
    """Print one result as a JSON line (with machine load and command) and return it."""
    row = {"bench": bench, **fields, "machine": load(), "command": COMMAND}
    print(json.dumps(row), flush=True)
    return row


def summary(samples: list[float], scale: float = 1000.0, digits: int = 2) -> dict:
    """n / median / p95 / min / max of samples (seconds by default, reported in ms)."""
    if not samples:
        return {"n": 0}
    s = sorted(samples)
    p95 = s[min(len(s) - 1, max(0, round(0.95 * (len(s) - 1))))]
    return {"n": len(s), "median": round(statistics.median(s) * scale, digits), "p95": round(p95 * scale, digits),
            "min": round(s[0] * scale, digits), "max": round(s[-1] * scale, digits)}


def default_entry():
    """The lab's default built-in model (shared, read-only), loaded the way the app loads it."""
    from lab.catalogue.models import BUILTINS, DEFAULT_MODEL

    return BUILTINS.get(DEFAULT_MODEL)


def start_app(threads: int, **env: str) -> AppServer:
    """`python app.py` on a free loopback port with the given torch thread count, started."""
    return AppServer({"DECODER_LAB_THREADS": str(threads), **env}).start()


def parser(name: str, doc: str) -> argparse.ArgumentParser:
    """Argument parser of `python -m bench.<name>`, its help text the module's docstring."""
    return argparse.ArgumentParser(prog=f"python -m bench.{name}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def served_parser(name: str, doc: str, lengths: str) -> argparse.ArgumentParser:
    """Argument parser of a bench that serves the app: --lengths (prompt tokens) and --threads."""
    p = parser(name, doc)
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
    for shift in range(200):  # the decoded text must re-encode to the same count (word joins)
        text = tokenizer.decode(ids[start + shift : start + shift + n_tokens])
        if len(tokenizer.encode(text)) == n_tokens:
            return text
    raise RuntimeError(f"could not build a {n_tokens}-token prompt")


class Timer:
    """`with Timer() as t: ...` then t.s is the elapsed wall time in seconds."""

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.s = time.perf_counter() - self.t0
