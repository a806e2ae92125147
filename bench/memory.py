"""Resident memory of the running app (VmRSS from /proc via tests.support.server.rss_mb; psutil not needed).

`python app.py` (tests.support.server.AppServer, offline) is measured: idle after start-up and one
page load; after 50 gradio_client sessions that each step 20 tokens (5 at a time); after another
50 (growth per session should be the per-session state, not more: sessions live in gr.State, kept
up to lab.limits.SESSION_CAPACITY sessions for STATE_TTL_S idle seconds); and peak/last during one training
run (Train tab path, sort corpus, 300 steps) in its own session. Also the bytes one lab Session's
text holds (attention, scores, KV cache, sampler history) after 20 steps and at a full context,
computed in-process, to give the bound.

    python -m bench.memory [--sessions 50] [--steps 20] [--train-steps 300]
"""

from __future__ import annotations

import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from bench.clients import Sampler, client, start_training, step
from bench.common import default_entry, emit, grammar_prompt, parser
from tests.support.server import AppServer, rss_mb


def session_bytes(session) -> int:
    """Bytes of the arrays one session's current text holds: attention and scores (their buffers, with the
    room for rows to come), KV cache, sampler history."""
    d = session.decoder
    n = d.attention_nbytes
    if d.cache is not None:
        n += sum(c.k.numel() * c.k.element_size() + c.v.numel() * c.v.element_size() for c in d.cache.layers)
    n += d.undo_bytes
    return n


def per_session_bound(app, entry) -> dict:
    from lab.limits import MAX_NEW_TOKENS
    from lab.session import Session

    out = {}
    for label, prompt_len, steps in (("20_steps", 12, 20), ("full_context_max_tokens", entry.model.cfg.block_size,
                                                           MAX_NEW_TOKENS)):
        session = Session()
        prompt = grammar_prompt(entry.tokenizer, prompt_len)
        for i in range(steps):
            app.step(session, entry.name, prompt, 0.8, 0, 1.0, 0, 0, "all", "weights")
        out[label] = session_bytes(session)
        session.close()
    return out


def main() -> None:
    p = parser("memory", __doc__)
    p.add_argument("--sessions", type=int, default=50, help="gradio_client sessions per batch (two batches)")
    p.add_argument("--steps", type=int, default=20, help="Steps per session")
    p.add_argument("--train-steps", type=int, default=300, help="steps of the one training run")
    args = p.parse_args()

    import app
    from lab.limits import SESSION_CAPACITY

    entry = default_entry()
    server = AppServer().start()
    pid = server.proc.pid
    rows = {}
    try:
        urllib.request.urlopen(server.url, timeout=10).read()
        time.sleep(2)
        rows["idle_mb"] = rss_mb(pid, tree=True)

        def session(i: int) -> int:
            c = client(server.url)
            prompt = entry.examples[0]
            errors = 0
            for _ in range(args.steps):
                try:
                    step(c, entry.name, prompt, seed=i)
                except Exception:  # noqa: BLE001
                    errors += 1
            c.close() if hasattr(c, "close") else None
            return errors

        t0 = time.perf_counter()
        for batch in (1, 2):
            with ThreadPoolExecutor(5) as ex:
                errors = sum(ex.map(session, range(args.sessions)))
            time.sleep(2)
            rows[f"after_{batch * args.sessions}_sessions_mb"] = rss_mb(pid, tree=True)
            rows[f"errors_batch{batch}"] = errors
        rows["sessions_seconds"] = round(time.perf_counter() - t0, 1)
        first, second = rows[f"after_{args.sessions}_sessions_mb"], rows[f"after_{2 * args.sessions}_sessions_mb"]
        rows["growth_first_batch_mb"] = round(first - rows["idle_mb"], 1)
        rows["growth_second_batch_mb"] = round(second - first, 1)

        sampler = Sampler(lambda: rss_mb(pid, tree=True), every=0.2)
        sampler.start()
        c, job = start_training(server.url, steps=args.train_steps)
        t0 = time.time()
        while not job.done() and time.time() - t0 < 300:
            time.sleep(0.2)
        vals = sampler.stop()
        out = job.outputs()
        rows["training_peak_mb"] = max(vals) if vals else None
        time.sleep(2)
        rows["after_training_mb"] = rss_mb(pid, tree=True)
        rows["training_result"] = str(out[-1][0])[:120] if out else "none"
    finally:
        server.stop()
    bound = per_session_bound(app, entry)
    emit("memory_rss", model=entry.name, sessions_per_batch=args.sessions, steps_per_session=args.steps,
         **rows, workspace_bytes=bound,
         session_capacity=SESSION_CAPACITY,
         worst_case_state_mb_at_capacity=round(SESSION_CAPACITY * bound["full_context_max_tokens"] / 1e6, 1))


if __name__ == "__main__":
    main()
