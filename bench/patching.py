"""Activation patching sweeps, timed as the server runs them (lab.patching, 1 torch thread).

* grammar: the layer × head sweep (3 × 4 = 12 patched runs) of the grammar model on the minimal pair
  "anna found the key . she gave it to tom because he asked" ⇄ "tom … anna because she asked" (13
  tokens), metric logit(she) − logit(he), denoising. `prepare_sweep` (A and B run once each, recorded) and
  the sweep, timed together and apart. Target ≤ 0.5 s.
* gpt2: GPT-2 small's shape with random weights (bench.real_app.build_gpt2: 12 layers × 12 heads,
  d_model 768, 50,257 tokens; nothing downloaded), opened as the app opens a --model folder; two
  16-token prompts of that tokenizer, the layer × head sweep (144 patched runs), metric the logit
  difference of A's and B's most likely next tokens. Target ≤ 10 s. Also the residual-stream sweep
  (13 × 16 = 208 runs), without a target, and the sweep at other batch sizes (--batch-tokens).
* arithmetic: the floating-point operations of that sweep as it is batched (each batch from its layer
  on, the last position read out) and this CPU's float32 rate on a matmul of the feed-forward's shape,
  measured in the same run: their quotient is the time no float32 implementation of these forwards
  on this CPU can beat, whatever the machine's load does to the wall clock.

    python -m bench.patching [--reps 5] [--batch-tokens 256,512,1024] [--skip gpt2]

Each row prints its target, whether it is met, the CPU model and the machine load.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from bench.common import Timer, emit, grammar_prompt, parser, summary
from bench.real_models import cpu_model

GRAMMAR_PAIR = ("anna found the key . she gave it to tom because he asked",
                "tom found the key . he gave it to anna because she asked", " she", " he")
TARGETS_S = {"grammar_heads": 0.5, "gpt2_heads": 10.0}
T_GPT2 = 16


def timed(setup_fn, sweep_fn, reps: int) -> dict:
    """Median seconds of prepare, of the sweep and of both, over `reps` runs after one warm-up."""
    from lab import patching

    rows = {"prepare": [], "sweep": [], "total": []}
    for r in range(1 + reps):
        with Timer() as t_prep:
            setup = setup_fn()
        with Timer() as t_sweep:
            result = sweep_fn(setup)
        if r:
            rows["prepare"].append(t_prep.s)
            rows["sweep"].append(t_sweep.s)
            rows["total"].append(t_prep.s + t_sweep.s)
    assert result.done == result.values.size and isinstance(result, patching.PatchResult)
    return {k: summary(v, scale=1.0, digits=3) for k, v in rows.items()} | {"summary": result.summary()}


def grammar(reps: int) -> None:
    from lab import patching
    from lab.catalogue.models import BUILTINS

    entry = BUILTINS.get("grammar (built-in)")
    a, b, x, y = GRAMMAR_PAIR
    out = timed(lambda: patching.prepare_sweep(entry, a, b, "logit_diff", x, y),
                lambda s: patching.sweep(s, "heads", "denoising"), reps)
    met = out["total"]["median"] <= TARGETS_S["grammar_heads"]
    emit("patching_grammar_heads", cells=12, tokens=13, seconds=out, target_s=TARGETS_S["grammar_heads"], met=met,
         cpu=cpu_model(), threads=torch.get_num_threads())


def matmul_rate(rows: int, d_model: int) -> float:
    """This CPU's float32 rate (FLOP/s, current torch threads) on the feed-forward's shape: (rows, C) @ (C, 4C)."""
    x, w = torch.randn(rows, d_model), torch.randn(d_model, 4 * d_model)
    x @ w
    times = []
    for _ in range(10):
        with Timer() as t:
            x @ w
        times.append(t.s)
    return 2 * rows * d_model * 4 * d_model / sorted(times)[len(times) // 2]


def gpt2_entry(folder: Path):
    from bench.real_app import build_gpt2
    from lab.catalogue.models import ModelEntry
    from model.families import open_folder

    build_gpt2(folder)
    model, tok = open_folder(folder)
    return ModelEntry("gpt2 (random weights)", model, tok, {})


def gpt2(reps: int, batch_tokens: list[int]) -> None:
    from lab import patching

    with tempfile.TemporaryDirectory() as tmp:
        entry = gpt2_entry(Path(tmp) / "gpt2")
    tok = entry.tokenizer
    a, b = grammar_prompt(tok, T_GPT2), grammar_prompt(tok, T_GPT2, offset=3)
    with torch.inference_mode():
        la, lb = (entry.model(torch.tensor([tok.encode(p)]), logits="last").logits[0, -1] for p in (a, b))
    x, y = int(la.argmax()), int(lb.argmax())
    if x == y:
        y = int(lb.topk(2).indices[1])
    answer, other = entry.pieces[x], entry.pieces[y]
    default = patching.BATCH_TOKENS
    flops, rate = patching.sweep_flops(entry, "heads", T_GPT2), matmul_rate(12 * T_GPT2, entry.model.cfg.d_model)
    emit("patching_gpt2_arithmetic", gflop_heads_sweep=round(flops / 1e9, 1), gflop_per_s=round(rate / 1e9, 1),
         floor_s=round(flops / rate, 2), cpu=cpu_model(), threads=torch.get_num_threads())
    for bt in batch_tokens:
        out = timed(lambda: patching.prepare_sweep(entry, a, b, "logit_diff", answer, other),
                    lambda s: patching.sweep(s, "heads", "denoising", batch_tokens=bt), reps)
        met = out["total"]["median"] <= TARGETS_S["gpt2_heads"]
        emit("patching_gpt2_heads", cells=144, tokens=T_GPT2, batch_tokens=bt, seconds=out,
             target_s=TARGETS_S["gpt2_heads"], met=met, cpu=cpu_model(), threads=torch.get_num_threads())
    out = timed(lambda: patching.prepare_sweep(entry, a, b, "logit_diff", answer, other),
                lambda s: patching.sweep(s, "resid", "denoising"), max(1, reps // 2))
    emit("patching_gpt2_resid", cells=13 * T_GPT2, tokens=T_GPT2, batch_tokens=default, seconds=out,
         cpu=cpu_model(), threads=torch.get_num_threads())


def main() -> None:
    p = parser("patching", __doc__)
    p.add_argument("--reps", type=int, default=5, help="timed runs after one warm-up")
    p.add_argument("--batch-tokens", default="512", help="comma-separated patched runs × tokens per batch (GPT-2)")
    p.add_argument("--skip", default="", help="'gpt2' to time the grammar model only")
    args = p.parse_args()
    torch.set_num_threads(1)  # as the app runs a request (DECODER_LAB_THREADS)
    grammar(args.reps)
    if "gpt2" not in args.skip:
        gpt2(args.reps, [int(x) for x in args.batch_tokens.split(",")])


if __name__ == "__main__":
    main()
