"""`python -m bench.fuzz`: start the app (or use a running one), fuzz it, print one JSON line."""

from __future__ import annotations

import json
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import bench.fuzz
from bench.common import emit, parser
from tests.support.server import AppServer

from .fuzzer import Fuzzer
from .values import RandomDraw

def run_fuzz(url: str, calls: int, seed: int, log_path: Path | None, server_dirs: list[str],
             progress: Callable[[dict], None] | None = None, every: int = 500) -> dict:
    fz = Fuzzer(url, log_path, server_dirs)
    draw = RandomDraw(random.Random(seed))
    next_report = every
    try:
        while fz.stats.calls < calls:
            fz.act(draw)
            if progress and fz.stats.calls >= next_report:
                next_report += every
                s = fz.stats
                progress({"calls": s.calls, "outcomes": dict(s.outcomes), "defect_kinds": len(s.defects),
                          "calls_per_s": round(s.calls / (time.perf_counter() - s.t0), 1)})
        time.sleep(0.5)
    finally:
        fz.close()
    out = fz.stats.summary()
    out["endpoints"] = {name: [p.name for p in ep.params] for name, ep in sorted(fz.endpoints.items())}
    return out


def main() -> None:
    p = parser("fuzz", bench.fuzz.__doc__)  # the package's docstring: how the fuzzer works
    p.add_argument("--calls", type=int, default=10_000, help="calls to send (twin replays not counted)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random choices")
    p.add_argument("--url", default=None, help="fuzz an app that is already running (default: start one)")
    p.add_argument("--log", default=None, help="with --url: the file the app writes its output to")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the app it started
    server = None
    tmp = Path(tempfile.mkdtemp(prefix="fuzz-app-"))
    try:
        if args.url:
            url, log_path, dirs = args.url, Path(args.log) if args.log else None, []
        else:
            server = AppServer({"DECODER_LAB_TRAIN_SECONDS": "60"}, tmp).start()
            url, log_path, dirs = server.url, server.log_path, [str(tmp)]

        def progress(row):
            print(json.dumps({"bench": "fuzz_progress", **row}), file=sys.stderr, flush=True)

        out = run_fuzz(url, args.calls, args.seed, log_path, dirs, progress)
        if server is not None:
            log = server.output()
            out["server_log"] = {"traceback_lines": log.count("Traceback (most recent call last)"),
                                 "unexpected_error_lines": log.count("unexpected error in"),
                                 "refused_lines": log.count(":refused ")}
        emit("fuzz", seed=args.seed, **out)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
