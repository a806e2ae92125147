"""Item 5: training throughput inside the app's own loop vs model.train.train directly.

Same config both ways, the Train tab's: corpus sort (char), 2 layers, 4 heads, d_model 64, d_ff 256,
learned positions, pre-norm, GELU, dropout 0, 300 steps, lr 3e-3, seed 0, batch 16 (the app's),
warm-up min(50, steps // 10), evaluation every max(10, steps // 10) steps on 4 batches.
"app" = iterating app.train_model(...) with a Workspace (builds the corpus, streams the loss
figure every 0.5 s, saves the checkpoint at the end); "direct" = build_corpus + DecoderLM +
iterating model.train.train. One short untimed warm-up of each, then runs alternate (direct, app, direct, app, ...); medians.

    python bench/train_app.py [--reps 3] [--steps 300] [--corpus sort] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import emit

ARCH = dict(layers=2, heads=4, d_model=64, d_ff=256, pos="learned", norm="pre", activation="gelu", dropout=0.0)


def direct(corpus_name: str, tok_kind: str, steps: int, lr: float, seed: int, text: str | None = None):
    import torch

    import app
    from model.config import ModelConfig
    from model.corpora import build_corpus
    from model.train import TrainConfig, train
    from model.transformer import DecoderLM

    t0 = time.perf_counter()
    corpus = build_corpus(corpus_name, tok_kind if corpus_name in ("grammar", "text") else None, seed=seed, text=text)
    block = 64 if corpus.kind == "text" else int(corpus.train.x.shape[1])
    cfg = ModelConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=block, n_layers=ARCH["layers"],
                      n_heads=ARCH["heads"], d_model=ARCH["d_model"], d_ff=ARCH["d_ff"], pos_encoding=ARCH["pos"],
                      norm=ARCH["norm"], activation=ARCH["activation"], dropout=ARCH["dropout"])
    tcfg = TrainConfig(steps=steps, batch_size=16, lr=lr, warmup=min(50, steps // 10), eval_every=max(10, steps // 10),
                       eval_batches=4, seed=seed, max_seconds=app.TRAIN_MAX_SECONDS)
    torch.manual_seed(seed)
    model = DecoderLM(cfg)
    last = None
    for ev in train(model, corpus, tcfg):
        last = ev
    return time.perf_counter() - t0, last


def via_app(corpus_name: str, tok_kind: str, steps: int, lr: float, seed: int, text: str | None = None):
    import app
    from model.session import Workspace

    ws = Workspace()
    t0 = time.perf_counter()
    yields = 0
    for _ in app.train_model(ws, corpus_name, text or "", None, tok_kind, ARCH["layers"], ARCH["heads"], ARCH["d_model"],
                             ARCH["d_ff"], ARCH["pos"], ARCH["norm"], ARCH["activation"], ARCH["dropout"], steps, lr,
                             seed):
        yields += 1
    wall = time.perf_counter() - t0
    app.cleanup_session(ws)
    return wall, ws.run, yields


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--corpus", default="sort")
    p.add_argument("--tokenizer", default="char")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--text", help="train on this text file (corpus 'text', as if pasted in the Train tab)")
    p.add_argument("--arch", choices=["tab", "bench"], default="tab",
                   help="tab: the Train tab's defaults; bench: train_bench.py's 4 layers x 4 heads x 128")
    args = p.parse_args()
    if args.arch == "bench":
        ARCH.update(layers=4, heads=4, d_model=128, d_ff=512)
    text = open(args.text, encoding="utf-8").read() if args.text else None
    if text is not None:
        args.corpus = "text"

    import torch

    import app  # noqa: F401  (sets the app's torch thread count; overridden below)

    torch.set_num_threads(args.threads)
    lr, seed = 3e-3, 0
    d_walls, a_walls, d_loop, d_loss, a_loss, a_yields = [], [], [], [], [], 0
    direct(args.corpus, args.tokenizer, 20, lr, seed, text)  # warm-up: imports, corpus code paths, allocator
    via_app(args.corpus, args.tokenizer, 20, lr, seed, text)
    for _ in range(args.reps):
        w, ev = direct(args.corpus, args.tokenizer, args.steps, lr, seed, text)
        d_walls.append(w)
        d_loop.append(ev.elapsed)
        d_loss.append(ev.val_loss)
        w, run, a_yields = via_app(args.corpus, args.tokenizer, args.steps, lr, seed, text)
        a_walls.append(w)
        a_loss.append(run.val_loss[-1] if run.val_loss else None)
    d, a = statistics.median(d_walls), statistics.median(a_walls)
    emit("train_app_vs_direct", threads=args.threads, corpus=args.text or args.corpus, steps=args.steps, reps=args.reps,
         config=dict(ARCH, batch=16, lr=lr, seed=seed),
         direct_s_median=round(d, 3), app_s_median=round(a, 3), direct_loop_s_median=round(statistics.median(d_loop), 3),
         direct_steps_per_s=round(args.steps / d, 1), app_steps_per_s=round(args.steps / a, 1),
         app_slowdown_pct=round(100 * (a / d - 1), 1), app_yields=a_yields,
         direct_walls=[round(x, 3) for x in d_walls], app_walls=[round(x, 3) for x in a_walls],
         final_val_loss={"direct": round(d_loss[-1], 4), "app": round(a_loss[-1], 4) if a_loss[-1] else None})


if __name__ == "__main__":
    main()
