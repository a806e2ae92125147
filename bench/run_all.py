"""Run every Decoder Lab benchmark, one child process each, and pass their JSON lines through (stdout).

    python -m bench.run_all                      # every benchmark but the long training one, as in bench/RESULTS.md
    python -m bench.run_all --training-bench     # ... and the 2000-iteration training benchmark too
    python -m bench.run_all --quick              # all of them with tiny settings (a smoke run, minutes)
    python -m bench.run_all --only step_latency,load

Each JSON line is one result; its "command" re-runs just that measurement. A benchmark that fails
gives a JSON line with "error" and the tail of its stderr, and the run ends with exit status 1.
What is left out, and why, is said on stderr (lines starting with "#"), as is each script's time.
Nothing here needs the internet: the app runs on 127.0.0.1 with HF_HUB_OFFLINE=1 and Chromium is
driven locally.

    python -m bench.run_all > bench/results.jsonl && python -m bench.report bench/results.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HELPERS = {"__init__", "common", "clients", "report", "run_all"}  # modules here that are not benchmarks

FULL = [
    ("step_latency", ["--reps", "30", "--threads", "1", "--profile", "64"]),
    ("step_latency", ["--reps", "30", "--threads", "2"]),
    ("payload_http", ["--reps", "10"]),
    ("browser_latency", ["--clicks", "7"]),
    ("generation", ["--reps", "5"]),
    ("train_app", ["--reps", "3"]),
    ("startup", ["--starts", "5"]),
    ("memory", []),
    ("memory_rounds", []),
    ("load", ["--threads", "1"]),
    ("load", ["--threads", "2"]),
    ("stress", []),
    ("memory_budget", []),
    ("corpus_build", ["--reps", "3"]),
    ("shares", []),
    ("victim", []),
    ("inside", []),
    ("patching", []),
    ("device_latency", []),
    ("fuzz", ["--calls", "10000"]),
    ("train_bench", []),
    ("train_race", []),
    ("real_models", ["--reps", "7", "--gen-reps", "3"]),
    ("real_app", ["--reps", "15", "--sessions", "50", "--steps", "8"]),
    ("browser_real", ["--rounds", "9"]),
    ("step_path", []),
    ("step_path", ["--view", "0"]),
]
QUICK = [
    ("step_latency", ["--reps", "2", "--lengths", "16,64"]),
    ("payload_http", ["--reps", "2", "--lengths", "16,64"]),
    ("browser_latency", ["--clicks", "1", "--lengths", "16"]),
    ("generation", ["--reps", "1"]),
    ("train_app", ["--reps", "1", "--steps", "30"]),
    ("startup", ["--starts", "1"]),
    ("memory", ["--sessions", "2", "--steps", "2", "--train-steps", "20"]),
    ("memory_rounds", ["--rounds", "1", "--sessions", "2"]),
    ("load", ["--threads", "1", "--clients", "2", "--seconds", "5"]),
    ("stress", ["--sessions", "3", "--seconds", "5", "--sequential", "10", "--ttl", "2", "--settle", "1"]),
    ("memory_budget", ["--sessions", "6", "--models-mb", "60"]),
    ("corpus_build", ["--reps", "1", "--kinds", "bpe"]),
    ("shares", ["--seconds", "5", "--only", "baseline,link_flood"]),
    ("victim", ["--only", "steps,inside_cell", "--rounds", "1", "--seconds", "3"]),
    ("inside", ["--reps", "2", "--skip", "gpt2"]),
    ("patching", ["--reps", "1", "--skip", "gpt2"]),
    ("device_latency", ["--reps", "2", "--lengths", "16"]),
    ("fuzz", ["--calls", "200"]),
    ("train_race", ["--iters", "40", "--check-every", "20"]),
    ("train_bench", ["--iters", "30", "--compile", "none", "--no-bf16", "--threads", "1", "--eval-batches", "2"]),
    ("real_models", ["--reps", "1", "--gen-reps", "1", "--models", "pythia-70m", "--skip", "memory"]),
    ("real_app", ["--reps", "1", "--sessions", "2", "--steps", "1"]),
    ("browser_real", ["--rounds", "1"]),
    ("step_path", []),
]
# Left out unless asked for: name -> (the flag that includes it, why it is left out).
OPTIONAL = {
    "fuzz": ("--fuzz", "10,000 fuzzed calls take about 35 minutes here"),
    "train_bench": ("--training-bench", ("2000 training iterations take about 40 s and want the machine to "
                                         "themselves; python -m bench.train_race runs the default against fp32 "
                                         "eager")),
    "train_race": ("--training-bench", "the training race runs four fresh 2000-iteration trainings (minutes)"),
}
# Never run from here: name -> why (each is run by hand, as its docstring says).
BY_HAND = {
    "step_ab": ("it compares this checkout with a second one, `--before PATH`, which run_all cannot know; run "
                "python -m bench.step_ab --before PATH by hand"),
}


def benchmarks() -> list[str]:
    """Every benchmark in bench/: its modules but the helpers, and its packages run by a __main__ (fuzz)."""
    return sorted([p.stem for p in HERE.glob("*.py") if p.stem not in HELPERS]
                  + [p.parent.name for p in HERE.glob("*/__main__.py")])


def plan_for(quick: bool, only: set[str], include: set[str]) -> list[tuple[str, list[str]]]:
    plan = QUICK if quick else FULL
    missing = set(benchmarks()) - {name for name, _ in plan} - set(BY_HAND)
    if missing:  # a new script must be added to both lists above (or to BY_HAND, saying why)
        raise SystemExit(f"bench/run_all.py has no settings for: {', '.join(sorted(missing))}")
    if only:
        unknown = only - set(benchmarks())
        if unknown:
            raise SystemExit(f"no such benchmark: {', '.join(sorted(unknown))}")
        by_hand = sorted(only & set(BY_HAND))
        if by_hand:
            raise SystemExit("; ".join(f"{name} is not run from here: {BY_HAND[name]}" for name in by_hand))
        return [x for x in plan if x[0] in only]
    for name, why in sorted(BY_HAND.items()):
        print(f"# left out: {name} ({why})", file=sys.stderr, flush=True)
    if quick:
        return plan
    left_out = {name for name in OPTIONAL if name not in include}
    for name in sorted(left_out):
        flag, why = OPTIONAL[name]
        print(f"# left out: {name} ({why}; add {flag} to run it)", file=sys.stderr, flush=True)
    return [x for x in plan if x[0] not in left_out]


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run_all", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="every benchmark with tiny settings (a smoke run)")
    p.add_argument("--only", default="", help="comma-separated benchmark names (run whatever the flags say for them)")
    p.add_argument("--training-bench", action="store_true", help="include the long training benchmark (train_bench)")
    p.add_argument("--fuzz", action="store_true", help="include the 10,000-call fuzz run (bench.fuzz)")
    args = p.parse_args()
    include = ({"train_bench", "train_race"} if args.training_bench else set()) | ({"fuzz"} if args.fuzz else set())
    plan = plan_for(args.quick, {x for x in args.only.split(",") if x}, include)
    failed = 0
    for name, extra in plan:
        cmd = [sys.executable, "-m", f"bench.{name}", *extra]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True, check=False)
        for line in r.stdout.splitlines():
            if line.startswith("{"):
                print(line, flush=True)
        if r.returncode:
            failed += 1
            print(json.dumps({"bench": name, "error": f"exit {r.returncode}",
                              "command": " ".join(["python", *cmd[1:]]), "stderr_tail": r.stderr[-800:]}), flush=True)
        print(f"# {' '.join([name, *extra])}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
