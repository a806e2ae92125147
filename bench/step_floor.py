"""A cached Step on GPT-2 small against the machine's memory floor for its weights, on 1 and 2 threads.

A Step at this size is bound by memory: each token reads every weight once (the 12 blocks, and the 50,257 × 768
table again as the unembedding). The floor is measured in the same run, interleaved with the Step: one
float32 matrix-vector product (torch.mv) over a matrix of exactly the bytes the Step's weights take, which is
what reading them once costs on this machine at its best. Printed per thread count: the floor, the engine's
forward of one cached token (with and without the attention rows the app draws), the whole `Decoder.step` (the
forward, the attention matrices grown, sampling), and each one's ratio to the floor (target: Step ≤ 1.1×),
and where the time beyond the floor goes (torch.profiler, the operators that take the most).

    python -m bench.step_floor [--reps 30] [--tokens 64] [--threads 1,2]

Random weights of GPT-2 small's shape (transformers' class, imported by model.families; nothing is downloaded).
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.common import emit, parser
from bench.real_models import cpu_model, ours, reference


def weight_bytes(model) -> int:
    """Bytes of every distinct parameter and buffer that a Step reads as a weight (the position table is read
    one row at a time, so it is left out)."""
    seen, total = set(), 0
    for name, p in list(model.named_parameters()):
        if p.data_ptr() in seen or "pos" in name:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(model, T: int, reps: int, threads: int) -> dict:
    from model.generate import Decoder, Sampling

    torch.set_num_threads(threads)
    nbytes = weight_bytes(model)
    cols = 768
    matrix = torch.randn(nbytes // 4 // cols, cols)
    vec = torch.randn(cols)
    g = torch.Generator().manual_seed(T)
    ids = torch.randint(0, 1000, (T - 1,), generator=g).tolist()
    decoder = Decoder(model, ids, Sampling(temperature=0.0), capture_attention=True)
    x = torch.tensor([[int(decoder.logits.argmax())]])
    times = {"floor": [], "forward_plain": [], "forward_attention": [], "step": []}

    @torch.inference_mode()
    def plain():
        return model(x, cache=decoder.cache)

    @torch.inference_mode()
    def attn():
        return model(x, return_attention=True, cache=decoder.cache)

    for _ in range(3):  # warm-up: the first calls allocate
        torch.mv(matrix, vec), plain(), attn()
    for _ in range(reps):  # interleaved, so a busy moment of the machine falls on all of them alike
        times["floor"].append(timed(lambda: torch.mv(matrix, vec)))
        times["forward_plain"].append(timed(plain))
        times["forward_attention"].append(timed(attn))
        times["step"].append(timed(decoder.step))
        decoder.undo()
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {"threads": threads, "T": T, "weight_mb": round(nbytes / 2**20, 1),
            "floor_gb_s": round(nbytes / med["floor"] / 1e6, 1),
            **{f"{k}_ms": round(v, 2) for k, v in med.items()},
            **{f"ratio_{k}": round(v / med["floor"], 3) for k, v in med.items() if k != "floor"}}


def where(model, T: int, threads: int, top: int = 8) -> list:
    """The operators of one cached Step that take the most time (self CPU time, ms)."""
    from torch.profiler import ProfilerActivity, profile

    from model.generate import Decoder, Sampling

    torch.set_num_threads(threads)
    ids = torch.randint(0, 1000, (T - 1,), generator=torch.Generator().manual_seed(T)).tolist()
    decoder = Decoder(model, ids, Sampling(temperature=0.0), capture_attention=True)
    decoder.step()
    decoder.undo()
    totals: dict[str, list[float]] = {}
    for _ in range(5):  # one profile per Step: the undo's fresh prefill between them is not counted
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            decoder.step()
        for e in prof.key_averages():
            t = totals.setdefault(e.key, [0.0, 0])
            t[0] += e.self_cpu_time_total
            t[1] += e.count
        decoder.undo()
    rows = sorted(totals.items(), key=lambda kv: kv[1][0], reverse=True)
    return [[k, round(t / 1e3 / 5, 2), c // 5] for k, (t, c) in rows[:top]]


def main() -> None:
    p = parser("step_floor", __doc__)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--tokens", type=int, default=64, help="context of the Step (T)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--profile", action="store_true", help="also list where the time goes (torch.profiler)")
    args = p.parse_args()
    model = ours(reference("gpt2"))
    for threads in (int(t) for t in args.threads.split(",")):
        emit("step_floor", model="gpt2", cpu=cpu_model(), target="ratio_step <= 1.1",
             **measure(model, args.tokens, args.reps, threads))
        if args.profile:
            emit("step_floor_where", threads=threads, ops_ms_per_step=where(model, args.tokens, threads))


if __name__ == "__main__":
    main()
