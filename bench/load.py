"""Step latency under load: 10 gradio_client sessions stepping at T=64 while one training runs.

`python app.py` (tests.support.server.AppServer: offline, 127.0.0.1, DECODER_LAB_THREADS=N) gets one
training run (Train tab path, sort corpus, 2000 steps, its own session) and N_CLIENTS sessions
that each Step in a loop for DURATION seconds. Every Step uses a 64-token grammar prompt with a
new seed, so each is a first Step (prefill 64 + step + figures; window 65). Client-side latency
per Step (POST to result), throughput, errors (a full-queue refusal counted apart), and the
training's steps/s under load (from its status line) are reported. Loops are bounded by time.

    python -m bench.load [--threads 1] [--clients 10] [--seconds 30]
"""

from __future__ import annotations

import re
import threading
import time

from bench.clients import client, start_training, step, stop_training
from bench.common import default_entry, emit, grammar_prompt, parser, start_app, summary


def main() -> None:
    p = parser("load", __doc__)
    p.add_argument("--threads", type=int, default=1, help="DECODER_LAB_THREADS for the server")
    p.add_argument("--clients", type=int, default=10, help="sessions stepping at once")
    p.add_argument("--seconds", type=float, default=30, help="how long they step")
    p.add_argument("--tokens", type=int, default=64, help="prompt length in tokens")
    p.add_argument("--no-training", action="store_true", help="no training run alongside")
    args = p.parse_args()

    from lab.catalogue.models import DEFAULT_MODEL

    entry = default_entry()
    prompt = grammar_prompt(entry.tokenizer, args.tokens)
    server = start_app(args.threads)
    lat, errors, queue_full, lock = [], {}, 0, threading.Lock()
    try:
        clients = [client(server.url) for _ in range(args.clients)]
        step(clients[0], DEFAULT_MODEL, prompt, 0)  # warm-up
        tc = job = None
        if not args.no_training:
            tc, job = start_training(server.url, steps=2000)
            time.sleep(2)
        deadline = time.perf_counter() + args.seconds

        def loop(i: int) -> None:
            nonlocal queue_full
            seed = i * 100_000
            while time.perf_counter() < deadline:
                seed += 1
                t0 = time.perf_counter()
                try:
                    step(clients[i], DEFAULT_MODEL, prompt, seed)
                    with lock:
                        lat.append(time.perf_counter() - t0)
                except Exception as exc:  # noqa: BLE001
                    msg = f"{type(exc).__name__}: {exc}"[:120]
                    with lock:
                        if "queue is full" in msg.lower():
                            queue_full += 1
                        else:
                            errors[msg] = errors.get(msg, 0) + 1

        t_start = time.perf_counter()
        threads = [threading.Thread(target=loop, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t_start
        train_status = ""
        if job is not None:
            outs = job.outputs()
            train_status = str(outs[-1][0]) if outs else ""
            stopped = stop_training(tc, job)
        tps = re.findall(r"([\d,]+) tokens/s", train_status)
        emit("load_step_with_training", model=DEFAULT_MODEL, server_threads=args.threads, clients=args.clients,
             prompt_tokens=args.tokens, seconds=round(wall, 1), training=not args.no_training,
             steps_done=len(lat), steps_per_s=round(len(lat) / wall, 2), latency_ms=summary(lat, digits=1),
             errors=errors, queue_full_refusals=queue_full,
             training_status_during_load=train_status[:120],
             training_tokens_per_s=tps[-1] if tps else None,
             training_end=(stopped if job is not None else None))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
