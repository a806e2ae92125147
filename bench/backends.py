"""What the Explore tools cost on each backend, on a folder of GPT-2 small's shape: the own engine against
nnsight in this process (model/backend.py's contract; `python app.py --backend nnsight`).

Measured back to back in one run, interleaved rep by rep, on the same folder and text:

* `step_own`: the lab's Step on the own engine (`make_decoder` gives the cached `Decoder`: one new row per token);
* `step_own_uncached`: a `BackendDecoder` over the own engine's contract (a forward of the whole window per
  token with every head's attention and scores): what the missing cache costs by itself;
* `step_nnsight`: the same `BackendDecoder` over nnsight: the cache, and what nnsight's trace adds;
* `sweep_own` / `sweep_nnsight`: a heads patching sweep (144 cells) through `patch_steps`.

Each row prints the median and the ratio to the own engine's. NDIF adds the network and its queue to each
request, which no local number shows (docs/models.md says what each tool costs there).

    python -m bench.backends [--tokens 64] [--reps 5] [--folder /tmp/gpt2-small]

Needs nnsight (requirements-scale.txt); the folder is built once (tests/support/gpt2_small.py) and kept.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from bench.common import emit, parser
from bench.real_models import cpu_model


def main() -> None:
    p = parser("backends", __doc__)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--folder", default="/tmp/decoder-lab-gpt2-small")
    args = p.parse_args()
    torch.set_num_threads(1)
    from model.backend import OwnBackend
    from model.backend_decoder import BackendDecoder, make_decoder
    from model.families import open_folder
    from model.generate import Sampling
    from model.nnsight_backend import NnsightBackend
    from model.patching import PatchSite
    from tests.support.gpt2_small import build_gpt2_small

    folder = Path(args.folder)
    if not (folder / "config.json").exists():
        build_gpt2_small(folder)
    model, tok = open_folder(folder)
    own, nn = OwnBackend(model, tok), NnsightBackend(folder)
    ids = list(range(1000, 1000 + args.tokens - 1))
    greedy = Sampling(temperature=0.0)
    decoders = {"step_own": make_decoder(own, ids, greedy), "step_own_uncached": BackendDecoder(own, ids, greedy),
                "step_nnsight": BackendDecoder(nn, ids, greedy)}
    sites = [PatchSite("head", layer, head=h) for layer in range(12) for h in range(12)]
    source = ids[:-1] + [ids[-1] + 1]
    sweeps = {"sweep_own": own, "sweep_nnsight": nn}
    times: dict[str, list[float]] = {k: [] for k in (*decoders, *sweeps)}
    for _ in range(args.reps):
        for name, d in decoders.items():
            if len(d.ids) > len(ids):  # the same window length at every rep
                d.undo()
            started = time.perf_counter()
            d.step()
            times[name].append(time.perf_counter() - started)
        for name, backend in sweeps.items():
            started = time.perf_counter()
            for _chunk in backend.patch_steps(ids, source, sites):
                pass
            times[name].append(time.perf_counter() - started)
    medians = {k: statistics.median(v) for k, v in times.items()}
    for name, value in medians.items():
        base = medians["sweep_own" if name.startswith("sweep") else "step_own"]
        emit(f"backends.{name}", tokens=args.tokens, reps=args.reps, median_ms=round(value * 1000, 1),
             ratio_to_own=round(value / base, 2), cpu=cpu_model(), threads=1)


if __name__ == "__main__":
    main()
