"""Generation throughput (tokens/s) of the default model: KV cache vs full recompute.

All variants run in the same process, interleaved, with the same seed (so the same tokens):
model.generate.Decoder with use_cache True / False, capture_attention True / False, for
  * 200 new tokens from a 16-token prompt: crosses the default model's context, after which
    the Decoder crops and re-prefills the whole window every step (cache or not);
  * min(100, block_size - 16) new tokens: stays inside the context, the clean cache comparison.
Also the app's own Generate handler (app.generate on a lab Session, its default view) for the
200-token case, end to end.

    python -m bench.generation [--reps 5] [--threads 1]
"""

from __future__ import annotations

import statistics
import time

from bench.common import default_entry, emit, grammar_prompt, parser


def run_decoder(entry, prompt_ids, n_new, use_cache, capture, seed):
    from model.generate import Decoder, Sampling

    s = Sampling(temperature=0.8, seed=seed)
    t0 = time.perf_counter()
    d = Decoder(entry.model, list(prompt_ids), s, use_cache=use_cache, capture_attention=capture,
                eos_id=None, piece=entry.tokenizer.piece)
    crops = 0
    for _ in range(n_new):
        crops += d.step().cropped
    return time.perf_counter() - t0, crops, d.ids[len(prompt_ids):]


def main() -> None:
    p = parser("generation", __doc__)
    p.add_argument("--reps", type=int, default=5, help="timed runs of every variant (interleaved)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    args = p.parse_args()

    import torch

    import app
    from lab.catalogue.models import DEFAULT_MODEL
    from lab.session import Session

    torch.set_num_threads(args.threads)
    entry = default_entry()
    block = entry.model.cfg.block_size
    prompt = grammar_prompt(entry.tokenizer, 16)
    ids = entry.tokenizer.encode(prompt)
    variants = [(c, a) for c in (True, False) for a in (True, False)]
    for n_new in (200, min(100, block - 16)):
        times = {v: [] for v in variants}
        crops, seqs = {}, {}
        run_decoder(entry, ids, 20, True, True, 0)  # warm-up
        for r in range(args.reps):
            for v in variants:
                s, c, seq = run_decoder(entry, ids, n_new, *v, seed=r)
                times[v].append(s)
                crops[v] = c
                seqs.setdefault(r, []).append(seq)
        same = all(all(x == s[0] for x in s) for s in seqs.values())
        med = {v: statistics.median(ts) for v, ts in times.items()}
        res = {f"cache={cache},attention={attn}": {"tokens_per_s": round(n_new / m, 1),
                                                   "ms_per_token": round(m / n_new * 1000, 3),
                                                   "cropped_steps": crops[(cache, attn)]}
               for (cache, attn), m in med.items()}
        speedup = {f"attention={a}": round(med[(False, a)] / med[(True, a)], 2) for a in (True, False)}
        emit("generation", model=DEFAULT_MODEL, threads=args.threads, prompt_tokens=16, new_tokens=n_new,
             block_size=block, crosses_context=16 + n_new > block, same_tokens_all_variants=same,
             reps=args.reps, results=res, cache_speedup=speedup)

    # the app's Generate handler end to end (streams; last yield carries the figures)
    times = []
    for r in range(args.reps):
        session = Session()
        t0 = time.perf_counter()
        n = 0
        for _ in app.generate(session, DEFAULT_MODEL, prompt, 0.8, 0, 1.0, r, 200, 0, "all", "weights"):
            n += 1
        times.append(time.perf_counter() - t0)
        got = len(session.decoder.ids) - session.decoder.prompt_len
        session.close()
    med = statistics.median(times)
    emit("generation_app", model=DEFAULT_MODEL, threads=args.threads, prompt_tokens=16, new_tokens=got,
         block_size=block, yields=n, seconds_median=round(med, 3), tokens_per_s=round(got / med, 1))


if __name__ == "__main__":
    main()
