"""Training benchmark: character-level Tiny Shakespeare with a fixed nanoGPT-CPU-like config.

4 layers, 4 heads, d_model 128, block 64, batch 12, learned positions, pre-norm, GELU, tied
weights, no bias, dropout 0, AdamW lr 1e-3 -> 1e-4 (cosine), 2000 iterations. Runs the project's
own training loop (model.train.train) and prints one JSON line.

    python bench/train_bench.py                    # fp32, 1 thread
    python bench/train_bench.py --bf16 --threads 2 # variants to compare
    python bench/train_bench.py --text PATH --iters 200
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from model.config import ModelConfig  # noqa: E402
from model.corpora import build_corpus  # noqa: E402
from model.train import TrainConfig, train  # noqa: E402
from model.transformer import DecoderLM  # noqa: E402

DEFAULT_TEXT = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


def bench_config(vocab_size: int) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, block_size=64, n_layers=4, n_heads=4, d_model=128,
                       pos_encoding="learned", norm="pre", activation="gelu", bias=False,
                       tie_weights=True, dropout=0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="training text (default: shared Tiny Shakespeare)")
    p.add_argument("--iters", type=int, default=2000, help="training iterations")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--eval-batches", type=int, default=50, help="batches for the final train/val loss")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    text = args.text.read_text(encoding="utf-8")
    corpus = build_corpus("text", "char", seed=1337, text=text)
    model = DecoderLM(bench_config(corpus.tokenizer.vocab_size))
    if args.compile:
        model = torch.compile(model)
    cfg = TrainConfig(steps=args.iters, batch_size=12, lr=1e-3, min_lr=1e-4, warmup=100, weight_decay=0.1,
                      betas=(0.9, 0.99), grad_clip=1.0, eval_every=0, eval_batches=args.eval_batches,
                      seed=1337, bf16=args.bf16)
    times, last, prev = [], None, time.perf_counter()
    for ev in train(model, corpus, cfg):
        now = time.perf_counter()
        if not ev.done:
            times.append(now - prev)
        prev, last = now, ev
    warm = times[10:] or times
    print(json.dumps({
        "bench": "train_tinyshakespeare_char",
        "iters": last.step,
        "threads": args.threads,
        "bf16": args.bf16,
        "compile": args.compile,
        "ms_per_iter_median": round(1000 * statistics.median(warm), 2),
        "tokens_per_s": round(12 * 64 / statistics.median(warm)),
        "train_loss": round(last.eval_train_loss, 4),
        "val_loss": round(last.val_loss, 4),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "params": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
