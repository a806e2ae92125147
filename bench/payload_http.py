"""One Step over HTTP: the bytes it sends and its time through Gradio's queue (no browser).

Starts `python app.py` (tests.support.server.AppServer: offline, 127.0.0.1) and, per prompt length,
POSTs a Step to /gradio_api/call/step and reads the SSE stream of that event with urllib: the
bytes of the `complete` event's data line are what one Step sends (probs + attention figures,
tokens, status; gr.State is not sent), and the time from POST to the end of that event is the
server's Step as seen over HTTP through Gradio's queue (no browser).

    python -m bench.payload_http [--reps 10] [--lengths 16,64,128,256] [--threads 1]
"""

from __future__ import annotations

import json
import time
import urllib.request

from bench.common import emit, grammar_prompt, served_default_model, served_parser, summary


def call_step(url: str, data: list, timeout: float = 60) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    req = urllib.request.Request(url + "gradio_api/call/step", data=json.dumps({"data": data}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        event_id = json.loads(r.read())["event_id"]
    event, nbytes = None, 0
    with urllib.request.urlopen(url + f"gradio_api/call/step/{event_id}", timeout=timeout) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event in ("complete", "error"):
                nbytes = len(raw)
                break
    return time.perf_counter() - t0, nbytes, event or "none"


def main() -> None:
    p = served_parser("payload_http", __doc__, "16,64,128,256")
    p.add_argument("--reps", type=int, default=10, help="new prompts per length")
    args = p.parse_args()

    from lab.catalogue.models import DEFAULT_MODEL

    with served_default_model(args.threads) as (entry, block, server):
        call_step(server.url, [DEFAULT_MODEL, grammar_prompt(entry.tokenizer, 8), 0.8, 0, 1.0, 0, 0, "all", "weights"])
        for t in [int(x) for x in args.lengths.split(",")]:
            times, sizes, events = [], [], []
            for r in range(args.reps):
                prompt = grammar_prompt(entry.tokenizer, t, offset=41 * r + t)
                s, n, ev = call_step(server.url, [DEFAULT_MODEL, prompt, 0.8, 0, 1.0, r, 0, "all", "weights"])
                events.append(ev)
                if ev == "complete":
                    times.append(s)
                    sizes.append(n)
            emit("step_http", model=DEFAULT_MODEL, threads=args.threads, prompt_tokens=t,
                 window_tokens=min(t + 1, block), block_size=block, roundtrip_ms=summary(times),
                 complete_event_bytes_max=max(sizes) if sizes else None,
                 complete_event_kb_median=round(sorted(sizes)[len(sizes) // 2] / 1000, 1) if sizes else None,
                 non_complete=[e for e in events if e != "complete"])


if __name__ == "__main__":
    main()
