"""Two checkouts' warm Step, back to back: time through the Explore handler and bytes sent to the page.

Each round runs one child process per checkout (alternating, so both see the same machine load); a
child opens the default model, takes one Step on a prompt of T tokens (the cold one, not timed), then
times `reps` warm Steps through `ui.explore.step`, each followed by an Undo (not timed) so that every
timed Step sees the same text. The payload is the JSON the page receives for the Step's outputs (the
components' postprocess, as gradio sends it). Printed: the median per checkout, and after / before.

    python -m bench.step_ab --before ../before [--after .] [--rounds 6] [--reps 20] [--lengths 16,64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[3]))
import gradio as gr
import ui.explore as explore
from lab.catalogue.models import BUILTINS, DEFAULT_MODEL
from lab.session import Session

reps, t = int(sys.argv[1]), int(sys.argv[2])
entry = BUILTINS.get(DEFAULT_MODEL)
words = (entry.examples[0] + " ") * 64
prompt = " ".join(words.split()[:t])
comps = [gr.HighlightedText(combine_adjacent=False), gr.Textbox(), gr.Plot(), gr.Plot()]
s = Session()
call = (DEFAULT_MODEL, prompt, 0.8, 0, 1.0, 7, 0, "all", "weights")
out = explore.step(s, *call)
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    out = explore.step(s, *call)
    times.append(time.perf_counter() - t0)
    explore.undo(s, 0, "all", "weights")
parts = []
for comp, value in zip(comps, tuple(out)[-4:]):
    v = comp.postprocess(value)
    parts.append(v.model_dump() if hasattr(v, "model_dump") else v)
print(json.dumps({"file": explore.__file__, "times": times, "payload": len(json.dumps(parts))}))
"""


def child(tree: Path, reps: int, t: int, threads: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(reps), str(t), str(threads)], cwd=tree,
                         capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(res["file"]).resolve().is_relative_to(tree.resolve()), res["file"]  # the right checkout ran
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, default=Path("."))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lengths", default="16,64")
    args = ap.parse_args(argv)
    for t in (int(x) for x in args.lengths.split(",")):
        times = {"before": [], "after": []}
        payload = {}
        for _ in range(args.rounds):
            for name in ("before", "after"):
                res = child(getattr(args, name), args.reps, t, args.threads)
                times[name] += res["times"]
                payload[name] = res["payload"]
        med = {k: statistics.median(v) * 1000 for k, v in times.items()}
        print(json.dumps({"bench": "step_ab", "prompt_words": t, "threads": args.threads,
                          "before_ms": round(med["before"], 3), "after_ms": round(med["after"], 3),
                          "time_ratio": round(med["after"] / med["before"], 3),
                          "before_payload": payload["before"], "after_payload": payload["after"],
                          "payload_ratio": round(payload["after"] / payload["before"], 4)}))


if __name__ == "__main__":
    main()
