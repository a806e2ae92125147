"""Attribution patching beside exact patching, on one torch thread (model/attribution.py, lab/patching.py).

GPT-2 small's shape (12 layers × 12 heads, d_model 768, 50,257 tokens, 1,024 positions, learned positions,
tanh GELU) with random weights (nothing downloaded), frozen as the app freezes the weights it serves; T = 64:
A is a random text, B the same text with three tokens changed; the metric is the logit difference of A's and
B's most likely next tokens; direction noising (A run with one activation of B, the gradient taken on A).

* attribution: `attribute` (one forward of B, one forward of A with a graph, one backward), every head ×
  position, layer × head, residual, attention and MLP cell at once; median of --reps after a warm-up, each
  phase apart. Target ≤ 2 s.
* verify: `verify_top`, the 10 largest head × position estimates re-run exactly, each alone (batch_rows 1), then
  each in the batch of the sweep's size that holds it (lab.patching.BATCH_TOKENS // T runs per batch: the
  sweep's own numbers bit for bit, at the cost of whole batches).
* exact head × position sweep (12 × 12 × 64 = 9,216 patched runs): extrapolated, not timed whole (about a
  quarter of an hour on one thread). For every layer one batch of the sweep's own size is timed (a batch runs
  from its layer on, so each layer's batches cost their own), and the layer's batches (H × T / rows) are counted
  at that time: the sum is the sweep. The flop count of the same batches is printed beside it.
* exact layer × head sweep (144 patched runs, the app's heads sweep, lab.patching.sweep): timed whole
  (--skip heads leaves it out).

Ratio: the exact head × position sweep's (extrapolated) time over attribution's. Every row prints the CPU
model and the machine load; wall and this thread's CPU time are both given (on a loaded machine the CPU
time is nearer what the code takes on an idle core).

    python -m bench.attribution [--reps 3] [--tokens 64] [--skip heads]
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.common import emit, parser, summary
from bench.real_app import Clock
from bench.real_models import cpu_model
from model.attribution import AnswerMetric, atp_grid_sites, attribution_steps, exact_patched_metrics, \
    verify_top
from model.config import ModelConfig
from model.patching import sweep_chunks
from model.transformer import DecoderLM

TARGET_S = 2.0
TOP_K = 10


def gpt2_small() -> DecoderLM:
    """GPT-2 small's shape, random weights (GPT-2's initialisation), frozen, in eval mode."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50257, block_size=1024, n_layers=12, n_heads=12, d_model=768,
                      gelu_approximate="tanh", norm_eps=1e-5)
    model = DecoderLM(cfg).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def pair(model: DecoderLM, T: int) -> tuple[list[int], list[int], AnswerMetric]:
    """A random text, the same with three tokens changed, and the logit difference of their top next tokens."""
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, model.cfg.vocab_size, (T,), generator=g)
    b = a.clone()
    for p in (T // 8, T // 2, T - 5):
        b[p] = (b[p] + 1000) % model.cfg.vocab_size
    with torch.inference_mode():
        la, lb = (model(t[None], logits="last").logits[0, -1] for t in (a, b))
    x, y = int(la.argmax()), int(lb.argmax())
    if x == y:
        y = int(lb.topk(2).indices[1])
    return a.tolist(), b.tolist(), AnswerMetric("logit_diff", x, y)


def timed_attribution(model, a, b, metric, reps: int):
    """Wall and CPU seconds of `attribute` (and wall seconds of each phase), median over `reps` after a warm-up."""
    wall, cpu, phases, result = [], [], {}, None
    for r in range(1 + reps):
        w0 = last = time.perf_counter()
        c0 = time.thread_time()
        for step in attribution_steps(model, a, b, metric):
            now = time.perf_counter()
            if r:
                phases.setdefault(step.phase, []).append(now - last)
            last, result = now, step.result or result
        if r:
            wall.append(time.perf_counter() - w0)
            cpu.append(time.thread_time() - c0)
    return result, summary(wall, 1.0, 3), summary(cpu, 1.0, 3), {p: round(statistics.median(v), 3)
                                                                 for p, v in phases.items()}


def block_flops(cfg: ModelConfig, rows: int, T: int, layers: int) -> float:
    """Floating-point operations of `rows` texts of T tokens through `layers` blocks and the last position's
    read-out (2 per multiply-add: projections, feed-forward, attention scores and weighted sums)."""
    C, F = cfg.d_model, cfg.ff_dim
    per_token = 2 * (C * 3 * C + C * C + 2 * C * F) + 4 * T * C
    return rows * (T * layers * per_token + 2 * C * cfg.vocab_size)


def exact_head_pos_extrapolated(model, att, rows: int) -> dict:
    """The exact head × position sweep's time from one timed batch per layer (see the module docstring)."""
    cfg, T = model.cfg, len(att.ids_a)
    sites = atp_grid_sites(cfg, "head_pos", T)
    batches = list(sweep_chunks(sites, rows))
    ids = torch.tensor([list(att.base_ids)])
    per_layer, total_wall, total_cpu, flops = [], 0.0, 0.0, 0.0
    for layer in range(cfg.n_layers):
        mine = [(s, e) for s, e in batches if sites[s].layer == layer]
        s, e = mine[0]
        with Clock() as t:
            exact_patched_metrics(model, ids, att.base, att.source, sites[s:e], att.metric)
        per_layer.append(round(t.s, 3))
        total_wall += t.s * len(mine)
        total_cpu += t.cpu * len(mine)
        flops += sum(block_flops(cfg, e - s, T, cfg.n_layers - layer) for s, e in mine)
    return {"cells": len(sites), "batches": len(batches), "rows_per_batch": rows, "timed_batches": cfg.n_layers,
            "batch_s_by_layer": per_layer, "extrapolated_wall_s": round(total_wall, 1),
            "extrapolated_cpu_s": round(total_cpu, 1), "gflop": round(flops / 1e9)}


def heads_sweep(model, att) -> dict:
    """lab.patching's layer × head sweep of the same pair and metric, timed whole."""
    from lab import patching
    from lab.catalogue.models import ModelEntry

    entry = ModelEntry("gpt2 shape (random weights)", model, None, {})
    m = att.metric
    lab_metric = patching.Metric(m.kind, m.answer, m.other, f"#{m.answer}", f"#{m.other}")
    setup = patching.PatchSetup(entry, list(att.ids_a), list(att.ids_b), lab_metric, att.metric_a, att.metric_b,
                                att.base, att.source)  # noising: A's recording is the base, B's the source
    with Clock() as t:
        result = patching.sweep(setup, "heads", "noising")
    assert result.done == result.values.size
    return {"cells": int(result.values.size), "wall_s": round(t.s, 2), "cpu_s": round(t.cpu, 2)}


def main() -> None:
    p = parser("attribution", __doc__)
    p.add_argument("--reps", type=int, default=3, help="timed attribution runs after one warm-up")
    p.add_argument("--tokens", type=int, default=64, help="tokens per text (T)")
    p.add_argument("--skip", default="", help="'heads' leaves out the whole layer × head sweep")
    args = p.parse_args()
    torch.set_num_threads(1)  # as the app runs a request (DECODER_LAB_THREADS)
    from lab.patching import BATCH_TOKENS

    model, T = gpt2_small(), args.tokens
    a, b, metric = pair(model, T)
    common = {"tokens": T, "cpu": cpu_model(), "threads": torch.get_num_threads()}
    att, wall, cpu, phases = timed_attribution(model, a, b, metric, args.reps)
    emit("attribution_gpt2", seconds_wall=wall, seconds_cpu=cpu, phases_wall_s=phases, target_s=TARGET_S,
         met=wall["median"] <= TARGET_S, metric_a=round(att.metric_a, 4), metric_b=round(att.metric_b, 4),
         **common)
    rows = max(1, BATCH_TOKENS // T)
    for batch_rows in (1, rows):  # each cell alone; each in the batch a sweep of the whole grid runs it in
        with Clock() as t:
            check = verify_top(model, att, "head_pos", TOP_K, batch_rows=batch_rows)
        emit("attribution_verify_top", k=TOP_K, rows_per_batch=batch_rows, wall_s=round(t.s, 2),
             cpu_s=round(t.cpu, 2), disagreements=len(check.disagreements),
             worst_rel_error=round(max(c.rel_error for c in check.cells), 3),
             cells=[(c.name, round(c.estimate, 4), round(c.exact, 4)) for c in check.cells], **common)
    exact = exact_head_pos_extrapolated(model, att, rows)
    emit("attribution_exact_head_pos_sweep", method="extrapolated from one timed batch per layer", **exact, **common)
    ratio = {"ratio_wall": round(exact["extrapolated_wall_s"] / wall["median"]),
             "ratio_cpu": round(exact["extrapolated_cpu_s"] / cpu["median"])}
    heads = None if "heads" in args.skip else heads_sweep(model, att)
    if heads is not None:
        emit("attribution_exact_heads_sweep", method="timed whole (lab.patching.sweep)", **heads, **common)
        ratio["heads_sweep_ratio_wall"] = round(heads["wall_s"] / wall["median"], 1)
    emit("attribution_ratio", attribution_wall_s=wall["median"], exact_head_pos_wall_s=exact["extrapolated_wall_s"],
         **ratio, **common)


if __name__ == "__main__":
    main()
