"""Training throughput inside the app's own loop vs the engine's training loop called directly.

Same config both ways, the Train tab's (lab.recipe.train_tab_recipe): corpus sort (char),
2 layers, 4 heads, d_model 64, d_ff 256, learned positions, pre-norm, GELU, dropout 0, 300 steps,
lr 3e-3, seed 0, the tab's batch size, warm-up and evaluation schedule.
"app" = iterating app.train_model(...) on a lab Session (builds the corpus, streams the loss figure,
saves the checkpoint at the end); "direct" = build_corpus + the same recipe + DecoderLM + iterating
model.train.train. One short untimed warm-up of each, then runs alternate (direct, app, direct,
app, ...); medians.

    python -m bench.train_app [--reps 3] [--steps 300] [--corpus sort] [--threads 1] [--arch tab|bench]
"""

from __future__ import annotations

import statistics
import time

from bench.common import emit, parser

ARCH = dict(layers=2, heads=4, d_model=64, d_ff=256, pos="learned", norm="pre", activation="gelu", dropout=0.0)


def direct(corpus_name: str, tok_kind: str, steps: int, lr: float, seed: int, text: str | None = None):
    import torch

    from lab.limits import TRAIN_MAX_SECONDS
    from model.corpora import build_corpus
    from lab.recipe import OWN_TOKENIZER, train_tab_recipe
    from model.train import train
    from model.transformer import DecoderLM

    t0 = time.perf_counter()
    corpus = build_corpus(corpus_name, tok_kind if corpus_name in OWN_TOKENIZER else None, seed=seed, text=text)
    cfg, tcfg = train_tab_recipe(corpus, layers=ARCH["layers"], heads=ARCH["heads"], d_model=ARCH["d_model"],
                                 d_ff=ARCH["d_ff"], pos_encoding=ARCH["pos"], norm=ARCH["norm"],
                                 activation=ARCH["activation"], dropout=ARCH["dropout"], steps=steps, lr=lr, seed=seed,
                                 max_seconds=TRAIN_MAX_SECONDS)
    torch.manual_seed(seed)
    model = DecoderLM(cfg)
    last = None
    for ev in train(model, corpus, tcfg):
        last = ev
    return time.perf_counter() - t0, last, tcfg.batch_size


def via_app(corpus_name: str, tok_kind: str, steps: int, lr: float, seed: int, text: str | None = None):
    import app
    from lab.session import Session

    session = Session()
    t0 = time.perf_counter()
    yields = 0
    for _ in app.train_model(session, corpus_name, text or "", None, tok_kind, ARCH["layers"], ARCH["heads"],
                             ARCH["d_model"], ARCH["d_ff"], ARCH["pos"], ARCH["norm"], ARCH["activation"],
                             ARCH["dropout"], steps, lr, seed):
        yields += 1
    wall = time.perf_counter() - t0
    run = session.run
    session.close()
    return wall, run, yields


def main() -> None:
    p = parser("train_app", __doc__)
    p.add_argument("--reps", type=int, default=3, help="timed runs of each way (alternating)")
    p.add_argument("--steps", type=int, default=300, help="training steps per run")
    p.add_argument("--corpus", default="sort", help="a Train tab corpus")
    p.add_argument("--tokenizer", default="char", help="tokenizer for the grammar / text corpora")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--text", help="train on this text file (corpus 'text', as if pasted in the Train tab)")
    p.add_argument("--arch", choices=["tab", "bench"], default="tab",
                   help="tab: the Train tab's defaults; bench: bench.train_bench's 4 layers x 4 heads x 128")
    args = p.parse_args()
    if args.arch == "bench":
        ARCH.update(layers=4, heads=4, d_model=128, d_ff=512)
    text = open(args.text, encoding="utf-8").read() if args.text else None
    if text is not None:
        args.corpus = "text"

    import torch

    import app  # noqa: F401  (importing the app sets its torch thread count; set ours after it)

    torch.set_num_threads(args.threads)
    lr, seed = 3e-3, 0
    d_walls, a_walls, d_loop, d_loss, a_loss, a_yields, batch = [], [], [], [], [], 0, None
    direct(args.corpus, args.tokenizer, 20, lr, seed, text)  # warm-up: imports, corpus code paths, allocator
    via_app(args.corpus, args.tokenizer, 20, lr, seed, text)
    for _ in range(args.reps):
        w, ev, batch = direct(args.corpus, args.tokenizer, args.steps, lr, seed, text)
        d_walls.append(w)
        d_loop.append(ev.elapsed)
        d_loss.append(ev.val_loss)
        w, run, a_yields = via_app(args.corpus, args.tokenizer, args.steps, lr, seed, text)
        a_walls.append(w)
        a_loss.append(run.val_loss[-1] if run.val_loss else None)
    d, a = statistics.median(d_walls), statistics.median(a_walls)
    emit("train_app_vs_direct", threads=args.threads, corpus=args.text or args.corpus, steps=args.steps, reps=args.reps,
         config=dict(ARCH, batch=batch, lr=lr, seed=seed),
         direct_s_median=round(d, 3), app_s_median=round(a, 3),
         direct_loop_s_median=round(statistics.median(d_loop), 3),
         direct_steps_per_s=round(args.steps / d, 1), app_steps_per_s=round(args.steps / a, 1),
         app_slowdown_pct=round(100 * (a / d - 1), 1), app_yields=a_yields,
         direct_walls=[round(x, 3) for x in d_walls], app_walls=[round(x, 3) for x in a_walls],
         final_val_loss={"direct": round(d_loss[-1], 4), "app": round(a_loss[-1], 4) if a_loss[-1] else None})


if __name__ == "__main__":
    main()
