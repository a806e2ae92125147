"""Items 1 + 2: one Step on the server, and the bytes it sends to the browser.

Runs the app's own code in-process (no HTTP): `app.step` on a `Workspace`, and its pieces
(Workspace.ensure_started = prefill, Decoder.step = sampling + one-token forward,
app._probs_figure, app._attention_figure, and serialisation = json.dumps of what the gr.Plot /
gr.HighlightedText / gr.Textbox components postprocess the outputs into).

Prompt lengths 16, 64, 128, 256 tokens cut from the grammar corpus; a prompt longer than the
model's context is kept to its last block_size tokens by the app (as a person would see), and a
step on a full window re-prefills the window (the Decoder crops). "first" is the first Step on a
new prompt (prefill + step, what a click after editing the prompt costs); "next" is the Step
after it (the KV cache path).

    python bench/step_latency.py [--reps 30] [--threads 1] [--lengths 16,64,128,256] [--profile 128]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

from common import Timer, default_entry, emit, grammar_prompt, summary

VIEW = (0, "all", "weights")  # the default view: layer 0, all heads, weights
SAMPLING = dict(temperature=0.8, top_k=0, top_p=1.0)


def components():
    import gradio as gr

    return dict(
        tokens=gr.HighlightedText(color_map={"prompt": "#cfd8e3", "generated": "#ffd27f"}, show_legend=True,
                                  combine_adjacent=False),
        status=gr.Textbox(),
        probs=gr.Plot(),
        attn=gr.Plot(),
    )


def serialise(comps, outputs) -> tuple[str, dict]:
    """JSON text of the data gradio sends for one Step's outputs (the gr.State is not sent)."""
    _ws, tokens, status, probs, attn = outputs
    parts = {}
    for name, value in (("tokens", tokens), ("status", status), ("probs", probs), ("attn", attn)):
        v = comps[name].postprocess(value)
        parts[name] = v.model_dump() if hasattr(v, "model_dump") else v
    text = json.dumps([parts["tokens"], parts["status"], parts["probs"], parts["attn"]])
    sizes = {k: len(json.dumps(v)) for k, v in parts.items()}
    return text, sizes


def run_length(app, entry, comps, t: int, reps: int, warmup: int = 3) -> dict:
    from model.session import Workspace, make_sampling

    block = entry.model.cfg.block_size
    rows = {k: [] for k in ("prefill", "forward", "probs_fig", "attn_fig", "serialise", "first_total",
                            "next_forward", "next_figs", "next_serialise", "next_total", "app_step_first")}
    sizes = None
    for r in range(warmup + reps):
        prompt = grammar_prompt(entry.tokenizer, t, offset=37 * r)
        sampling = make_sampling(SAMPLING["temperature"], SAMPLING["top_k"], SAMPLING["top_p"], r)
        ws = Workspace()
        with Timer() as a:
            ws.ensure_started(entry, prompt, sampling)
        with Timer() as b:
            ws.last_step = ws.decoder.step(sampling)
        with Timer() as c:
            probs = app._probs_figure(ws)
        with Timer() as d:
            attn = app._attention_figure(ws, *VIEW)
        outputs = (ws, ws.tokens(), app._status(ws), probs, attn)
        with Timer() as e:
            text, sz = serialise(comps, outputs)
        # the next click on the same text: cached one-token step (or a re-prefill when the window is full)
        with Timer() as f:
            ws.last_step = ws.decoder.step(sampling)
        with Timer() as g:
            outputs2 = (ws, ws.tokens(), app._status(ws), app._probs_figure(ws), app._attention_figure(ws, *VIEW))
        with Timer() as h:
            serialise(comps, outputs2)
        # the same first click through app.step itself (end to end, the app's real function)
        ws2 = Workspace()
        with Timer() as k:
            out = app.step(ws2, app.DEFAULT_MODEL, prompt, SAMPLING["temperature"], SAMPLING["top_k"],
                           SAMPLING["top_p"], r, *VIEW)
            serialise(comps, out)
        if r < warmup:
            continue
        window = len(ws.decoder.window)
        for key, v in (("prefill", a.s), ("forward", b.s), ("probs_fig", c.s), ("attn_fig", d.s),
                       ("serialise", e.s), ("first_total", a.s + b.s + c.s + d.s + e.s),
                       ("next_forward", f.s), ("next_figs", g.s), ("next_serialise", h.s),
                       ("next_total", f.s + g.s + h.s), ("app_step_first", k.s)):
            rows[key].append(v)
        sizes = dict(sz, total=len(text))
    return dict(
        prompt_tokens=t, window_tokens_first=min(t, block) + (1 if t < block else 0),
        window_tokens_next=window, block_size=block, cropped=t >= block,
        ms={k: summary(v) for k, v in rows.items()},
        payload_bytes=sizes,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--threads", type=int, default=1, help="torch threads (the app's DECODER_LAB_THREADS)")
    p.add_argument("--lengths", default="16,64,128,256")
    p.add_argument("--profile", type=int, default=0, help="also cProfile 20 first-steps at this prompt length")
    args = p.parse_args()

    import torch

    import app

    torch.set_num_threads(args.threads)
    entry = default_entry()
    comps = components()
    for t in [int(x) for x in args.lengths.split(",")]:
        res = run_length(app, entry, comps, t, args.reps)
        emit("step_server", model=app.DEFAULT_MODEL, threads=args.threads, **res)
        emit("step_payload", model=app.DEFAULT_MODEL, prompt_tokens=t, window_tokens=res["window_tokens_first"],
             bytes=res["payload_bytes"], attn_kb=round(res["payload_bytes"]["attn"] / 1000, 1),
             total_kb=round(res["payload_bytes"]["total"] / 1000, 1))
    if args.profile:
        from model.session import Workspace

        prof = cProfile.Profile()
        prompt = grammar_prompt(entry.tokenizer, args.profile)
        t0 = time.perf_counter()
        prof.enable()
        for r in range(20):
            ws = Workspace()
            serialise(comps, app.step(ws, app.DEFAULT_MODEL, prompt, 0.8, 0, 1.0, r, *VIEW))
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        top = pstats.Stats(prof).sort_stats("tottime")
        rows = sorted(top.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:12]
        emit("step_profile", prompt_tokens=args.profile, ms_per_step=round((time.perf_counter() - t0) / 20 * 1000, 1),
             top_tottime=[{"fn": f"{k[0].split('/')[-1]}:{k[1]}:{k[2]}", "tottime_ms_per_step": round(v[2] / 20 * 1000, 2)}
                          for k, v in rows])
        print(s.getvalue()[:6000])


if __name__ == "__main__":
    main()
