"""The path of one warm Step through the code: which files it runs in, and how often it crosses a floor.

Calls the Explore tab's Step handler in-process on a session that has already stepped once (the
warm case: the KV cache holds the text) and records, with `sys.setprofile`, every call of a Python
function defined in this project. The floors, top to bottom: the wiring (app.py, ui/), the lab
(lab/) beside the figures (viz/), the engine (model/). Printed:

- files: the project files whose functions ran;
- trips down from the handler: calls made by the wiring into lab/ or viz/ (each is one trip down
  and one climb back up to the wiring);
- crossings: every call from a higher floor into a lower one (ui → lab/viz, lab/viz → model).

    python -m bench.step_path [--model NAME] [--view all|0]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOOR = {"app.py": 3, "ui": 3, "lab": 2, "viz": 2, "model": 1}


def floor_of(filename: str) -> tuple[int, str] | None:
    """(floor, path relative to the repository) of a project file, or None outside the project."""
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    top = rel.parts[0]
    floor = FLOOR.get(top)
    return None if floor is None else (floor, str(rel))


def trace(fn, *args):
    """Run fn(*args) and return (files, handler trips down, crossings) of the project calls it made."""
    files: Counter = Counter()
    trips: list[str] = []
    crossings: list[str] = []

    def nearest_project(frame):
        while frame is not None:
            where = floor_of(frame.f_code.co_filename)
            if where is not None:
                return where
            frame = frame.f_back
        return None

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = floor_of(frame.f_code.co_filename)
        if callee is None:
            return
        files[callee[1]] += 1
        caller = nearest_project(frame.f_back)
        if caller is None or caller[0] <= callee[0]:
            return
        crossings.append(f"{caller[1]} → {callee[1]}:{frame.f_code.co_name}")
        if caller[0] == 3:
            trips.append(f"{callee[1]}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return files, trips, crossings


def main(argv=None) -> None:
    from lab.catalogue.models import BUILTINS, DEFAULT_MODEL
    from lab.session import Session
    from ui import explore

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a built-in model's name (default: the app's default)")
    ap.add_argument("--view", default="all", help='"all" (all heads of layer 0, the default view) or a head number')
    args = ap.parse_args(argv)
    name = args.model or DEFAULT_MODEL
    prompt = BUILTINS.get(name).examples[0]
    head = "all" if args.view == "all" else int(args.view)
    s = Session()
    call = (name, prompt, 0.0, 0, 1.0, 0, 0, head, "weights")
    explore.step(s, *call)  # cold: the text is built and cached
    files, trips, crossings = trace(explore.step, s, *call)  # warm
    print(json.dumps({"bench": "step_path", "model": name, "view": args.view, "files": len(files),
                      "trips_down_from_handler": len(trips), "crossings_down": len(crossings)}))
    print("files:", ", ".join(sorted(files)))
    print("trips down from the handler:")
    for t in trips:
        print("  ", t)


if __name__ == "__main__":
    main()
