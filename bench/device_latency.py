"""Where a Step is fastest for the built-in models: CPU or CUDA.

For each built-in model and text length, time the two things a Step does, on each device there is:
the whole window's forward (a new prompt: prefill with attention) and one cached step of one token.
Prints one JSON line per (model, length, device) with median / p95 in ms; CUDA timings synchronise.

    python -m bench.device_latency                       # every device present, T = 16, 64, 256
    python -m bench.device_latency --lengths 64 --reps 50
"""

from __future__ import annotations

import time

import torch

from bench.common import emit, parser, summary
from lab.catalogue.models import BUILTINS
from model.attention import LayerCache
from model.transformer import KVCache


def timed(fn, device: torch.device, reps: int) -> list[float]:
    out = []
    for i in range(reps + 3):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 3:  # warm-up
            out.append(time.perf_counter() - t)
    return out


def main() -> None:
    p = parser("device_latency", __doc__)
    p.add_argument("--lengths", default="16,64,256")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (the app uses 1)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    for name in BUILTINS.names:
        entry = BUILTINS.get(name)
        block = entry.model.cfg.block_size
        for t in sorted({min(int(x), block) for x in args.lengths.split(",")}):
            ids = torch.randint(0, entry.tokenizer.vocab_size, (1, t))
            for device in devices:
                model = entry.model.to(device)
                x = ids.to(device)
                with torch.inference_mode():
                    prefill = timed(lambda: model(x, return_attention=True, cache=KVCache([])), device, args.reps)
                    if t < block:
                        cache = model(x[:, :-1], cache=KVCache([])).cache

                        def one():
                            model(x[:, -1:], return_attention=True,
                                  cache=KVCache([LayerCache(c.k.clone(), c.v.clone()) for c in cache.layers]))
                        step = timed(one, device, args.reps)
                    else:
                        step = []
                emit("device_latency", model=name, tokens=t, device=str(device), threads=args.threads,
                     prefill_ms=summary(prefill), cached_step_ms=summary(step) if step else None,
                     gpu=torch.cuda.get_device_name(0) if device.type == "cuda" else None)
            entry.model.to("cpu")


if __name__ == "__main__":
    main()
