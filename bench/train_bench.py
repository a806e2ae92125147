"""Training benchmark: character-level Tiny Shakespeare with a fixed nanoGPT-CPU-like config.

4 layers, 4 heads, d_model 128, block 64, batch 12, learned positions, pre-norm, GELU, tied
weights, no bias, dropout 0, AdamW lr 1e-3 -> 1e-4 (warm-up, hold, linear decay over the last 30 %),
2000 iterations. Runs the project's own training loop (model.train.train) and prints one JSON line;
val_loss is the loss over the whole held-out 10 % (model.evaluation.stream_loss). The text defaults
to the shared Tiny Shakespeare next to the checkout (../shared/data/tinyshakespeare.txt).

    python -m bench.train_bench        # default: all cores, the hand-written step (model/fastpath.py: flat fp32
                                       # master weights, a bf16 copy when in bf16, fused AdamW), wsd; bf16 where the
                                       # app's Train tab would use it (lab.recipe.bf16_choice: AMX tiles, or CUDA),
                                       # the choice and why in the JSON; compiled (max-autotune, autograd) only from
                                       # COMPILE_PAYS_AFTER iterations on
    python -m bench.train_bench --no-bf16 --compile none --backward autograd  # the plain fp32 eager loop
    python -m bench.train_bench --no-bf16 --compile none --sdpa auto --adamw loop --schedule cosine --backward autograd
                                       # the first loop
    python -m bench.train_bench --iters 200 --threads 2 --compile default           # variants to compare
    python -m bench.train_bench --text PATH --iters 200
"""

from __future__ import annotations

import time

PROCESS_START = time.perf_counter()  # before torch is imported: start-up counts in the wall clock

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

import torch

from bench.common import emit, parser
from lab.recipe import bf16_choice
from model.config import ModelConfig
from model.corpora import build_corpus
from model.evaluation import stream_loss
from model.train import (
    ADAMW_IMPLS, BACKWARDS, COMPILE_MODES, SCHEDULES, SDPA_BACKENDS, TrainConfig, manual_step_blocker, train,
    uses_manual_step,
)
from model.transformer import DecoderLM

ROOT = Path(__file__).resolve().parents[1]
# `--compile auto` compiles only runs this long: a cold compile of the training step costs more than it saves
# in a shorter run (the measurements are in bench/RESULTS.md, "on this CPU").
COMPILE_PAYS_AFTER = 10_000
DEFAULT_TEXT = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
BATCH_SIZE = 12


def bench_config(vocab_size: int) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, block_size=64, n_layers=4, n_heads=4, d_model=128,
                       pos_encoding="learned", norm="pre", activation="gelu", bias=False,
                       tie_weights=True, dropout=0.0)


def precision(asked: bool | None, device: str, vocab_size: int = 65) -> tuple[bool, str]:
    """Whether the run is in bf16, and why: as `--bf16` / `--no-bf16` asked, else as the app decides for this
    model and batch on `device` (lab.recipe.bf16_choice, the Train tab's rule); the vocabulary does not count."""
    if asked is not None:
        return asked, f"{'--bf16' if asked else '--no-bf16'} asked"
    bf16, why = bf16_choice(bench_config(vocab_size), BATCH_SIZE, device)
    return bf16, f"default, the app's rule (lab.recipe.bf16_choice): {why}"


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with `--compile auto` and `none` resolved to a mode or None."""
    p = parser("train_bench", __doc__)
    p.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="training text (default: shared Tiny Shakespeare)")
    p.add_argument("--iters", type=int, default=2000, help="training iterations")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="torch intra-op threads (default: one per core, torch's own default; "
                        "use 1 when the box is shared)")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bfloat16 matrix products (default: where the app's Train tab would use them: CUDA, or a CPU "
                        "with AMX tiles; see lab.recipe.bf16_choice)")
    p.add_argument("--compile", nargs="?", const="default", default="auto",
                   choices=["auto", "none", *COMPILE_MODES],
                   help="torch.compile mode for the training forward+loss and its backward ('none' = eager; "
                        f"'auto' = max-autotune-no-cudagraphs from {COMPILE_PAYS_AFTER:,} iterations on, where its "
                        "cold compile pays for itself, else eager)")
    p.add_argument("--adamw", default="fused", choices=list(ADAMW_IMPLS), help="AdamW implementation")
    p.add_argument("--sdpa", default="auto", choices=list(SDPA_BACKENDS),
                   help="attention kernel while training (autograd; default: the one PyTorch picks, as in a plain loop "
                        "and in model.train)")
    p.add_argument("--backward", default="auto", choices=list(BACKWARDS),
                   help="training step: autograd on the module, the hand-written step (manual), or manual where it "
                        "can run (auto: not with --compile or on CUDA)")
    p.add_argument("--schedule", default="wsd", choices=list(SCHEDULES),
                   help="lr 1e-3 -> 1e-4 after 100 warm-up steps: wsd (hold, then linear over the last 30%%) or cosine")
    p.add_argument("--seed", type=int, default=1337, help="seed for initialisation and batches")
    p.add_argument("--eval-batches", type=int, default=50, help="batches for the final train/val loss")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to train")
    p.add_argument("--target", type=float, default=None, metavar="LOSS",
                   help="also report the wall clock from the process start to the first whole-held-out "
                        "validation loss <= LOSS, checked every --check-every iterations (check time excluded)")
    p.add_argument("--check-every", type=int, default=250)
    args = p.parse_args(argv)
    if args.compile == "auto":  # skip compiling a run too short to earn its compile time back
        args.compile = "max-autotune-no-cudagraphs" if args.iters >= COMPILE_PAYS_AFTER else None
    if args.compile == "none":
        args.compile = None
    return args


def get_batch_ms(corpus) -> float:
    """Milliseconds to draw one training batch (12 × 64), the mean of 200."""
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for _ in range(200):
        corpus.train.get_batch(BATCH_SIZE, 64, g)
    return (time.perf_counter() - t0) / 200 * 1000


def timed_training(model, corpus, cfg: TrainConfig, args: argparse.Namespace):
    """Train, timing each iteration; with `--target`, check the whole held-out loss every `--check-every`
    iterations (the checks' time left out of the iterations and of the wall clock to the target).
    Returns (seconds per iteration, the last event, (step, wall s) where the target was reached or None,
    [(step, loss) of each check])."""
    times, last, prev = [], None, time.perf_counter()
    checking, reached, checks_s = 0.0, None, []
    for ev in train(model, corpus, cfg):
        now = time.perf_counter()
        if not ev.done:
            times.append(now - prev)
        if args.target is not None and not ev.done and reached is None and ev.step % args.check_every == 0:
            c0 = time.perf_counter()
            model.eval()
            loss = stream_loss(model, corpus.val, 64)
            model.train()
            checking += time.perf_counter() - c0
            checks_s.append((ev.step, round(loss, 4)))
            if loss <= args.target:
                reached = (ev.step, round(now - PROCESS_START - checking + (time.perf_counter() - c0), 2))
            now = time.perf_counter()
        prev, last = now, ev
    return times, last, reached, checks_s


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    text = args.text.read_text(encoding="utf-8")
    corpus = build_corpus("text", "char", seed=args.seed, text=text)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = DecoderLM(bench_config(corpus.tokenizer.vocab_size)).to(device)
    bf16, bf16_why = precision(args.bf16, args.device, corpus.tokenizer.vocab_size)
    cfg = TrainConfig(steps=args.iters, batch_size=BATCH_SIZE, lr=1e-3, min_lr=1e-4, warmup=100, weight_decay=0.1,
                      betas=(0.9, 0.99), grad_clip=1.0, eval_every=0, eval_batches=args.eval_batches,
                      seed=args.seed, bf16=bf16, schedule=args.schedule, decay_frac=0.3, adamw=args.adamw,
                      compile=args.compile, sdpa=args.sdpa, backward=args.backward)
    manual = uses_manual_step(model, cfg)
    batch_ms = get_batch_ms(corpus)
    load_before = os.getloadavg()[0]
    times, last, reached, checks_s = timed_training(model, corpus, cfg, args)
    warm = times[10:] or times
    med = statistics.median(warm)
    val_full = stream_loss(model, corpus.val, 64)
    emit(
        "train_tinyshakespeare_char",
        iters=last.step,
        seed=args.seed,
        threads=args.threads,
        bf16=bf16,
        bf16_why=bf16_why,
        compile=args.compile,
        adamw=args.adamw,
        sdpa=None if manual else args.sdpa,
        backward="manual" if manual else "autograd",
        backward_why_not_manual=None if manual else manual_step_blocker(model, cfg),
        schedule=args.schedule,
        ms_per_iter_median=round(1000 * med, 2),
        ms_per_iter_p10=round(1000 * sorted(warm)[len(warm) // 10], 2),
        tokens_per_s=round(BATCH_SIZE * 64 / med),
        first_iters_overhead_s=round(sum(times[:10]) - 10 * med, 2),  # compile time when --compile
        get_batch_ms=round(batch_ms, 4),
        total_s=round(last.elapsed, 1),
        train_loss=round(last.eval_train_loss, 4),
        val_loss=round(val_full, 4),  # the whole held-out 10 %, every character once
        val_loss_50_batches=round(last.val_loss, 4),
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        params=sum(p.numel() for p in model.parameters()),
        torch=torch.__version__,
        loadavg_1m_before_after=[round(load_before, 2), round(os.getloadavg()[0], 2)],
        device=str(device),
        target=args.target,
        target_reached_at=None if reached is None else {"step": reached[0], "wall_s_from_process_start": reached[1]},
        target_checks=checks_s,
        process_wall_s=round(time.perf_counter() - PROCESS_START, 1),
    )


if __name__ == "__main__":
    main()
