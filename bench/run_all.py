"""Run every Decoder Lab benchmark and print their JSON lines (stdout) plus a log per script.

    python bench/run_all.py            # everything, as recorded in bench/RESULTS.md
    python bench/run_all.py --quick    # a fast subset with fewer repetitions (a smoke run)
    python bench/run_all.py --only step_latency,load

Each line is one result; "command" in it re-runs just that measurement. Nothing here needs the
internet: the app runs on 127.0.0.1 with HF_HUB_OFFLINE=1 and Chromium is driven locally.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

FULL = [
    ("step_latency", ["--reps", "30", "--threads", "1", "--profile", "64"]),
    ("step_latency", ["--reps", "30", "--threads", "2"]),
    ("payload_http", ["--reps", "10"]),
    ("browser_latency", ["--clicks", "7"]),
    ("generation", ["--reps", "5"]),
    ("train_app", ["--reps", "3"]),
    ("startup", ["--starts", "5"]),
    ("memory", []),
    ("load", ["--threads", "1"]),
    ("load", ["--threads", "2"]),
]
QUICK = [
    ("step_latency", ["--reps", "8", "--lengths", "16,64,128"]),
    ("payload_http", ["--reps", "3", "--lengths", "64,128"]),
    ("browser_latency", ["--clicks", "3", "--lengths", "64"]),
    ("generation", ["--reps", "2"]),
    ("train_app", ["--reps", "1", "--steps", "100"]),
    ("startup", ["--starts", "2"]),
    ("memory", ["--sessions", "10", "--steps", "10", "--train-steps", "100"]),
    ("load", ["--threads", "1", "--clients", "10", "--seconds", "10"]),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default="", help="comma-separated script names")
    args = p.parse_args()
    plan = QUICK if args.quick else FULL
    if args.only:
        keep = set(args.only.split(","))
        plan = [x for x in plan if x[0] in keep]
    failed = 0
    for name, extra in plan:
        cmd = [sys.executable, str(HERE / f"{name}.py"), *extra]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=HERE.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for line in r.stdout.splitlines():
            if line.startswith("{"):
                print(line, flush=True)
        if r.returncode:
            failed += 1
            print(json.dumps({"bench": name, "error": f"exit {r.returncode}", "command": " ".join(cmd),
                              "stderr_tail": r.stderr[-800:]}), flush=True)
        print(f"# {name} {' '.join(extra)}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
