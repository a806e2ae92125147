"""Time of one Step on the server, piece by piece, and the bytes it sends to the browser.

Runs in-process (no HTTP). For each prompt it times the engine alone (prefill = building a
`model.generate.Decoder` over the prompt, forward = its `step`: sampling + one-token forward), the
same first Step through the lab (`lab.session.Session.step`), the two figures the wiring draws
(`app.probs_figure`, `app.attention_figure`) and serialisation (json.dumps of what the gr.Plot /
gr.HighlightedText / gr.Textbox components postprocess the outputs into), then the next Step on
the same text (the KV-cache path), and finally the first Step end to end through `app.step`.

Then the head tools (lab.heads) on a session after its first Step, back to back in the
same run and threads, at the prompt lengths of --probe-lengths (default: 64 and 256 where --lengths
has them): head roles (`Heads.head_roles`, and `headsettings.badges`, the part of
`app.attention_figure` that calls it), the logit lens at the last token, an ablation of L1H0
(`set_ablation` + `effect`) in "zero" and in "mean" mode, an attention edit (the last token's row of
L1H0 attends only to the first token) + `effect`, `compare` of two prompts of T tokens, and the
head panel's refresh after a Step (`ui.heads.probe_views`). Each row carries the tool's latency target
(at T=64) and whether its median meets it.

Prompt lengths 16, 64, 128, 256 tokens are cut from the grammar corpus; a prompt longer than the
model's context keeps its last block_size tokens (as a person would see), and a step on a full
window re-prefills the window. "first" is the first Step on a new prompt (what a click after
editing the prompt costs); "next" is the Step after it.

    python -m bench.step_latency [--reps 30] [--threads 1] [--lengths 16,64,128,256] [--profile 128]
                                 [--probe-lengths 64,256] [--profile-probes 64]
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import time

from bench.common import Timer, default_entry, emit, grammar_prompt, parser, summary

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
    """JSON text of the data gradio sends for one Step's outputs: (tokens, status, probs, attention).

    A handler's outputs may start with the session (gr.State, never sent); only the last four count.
    """
    tokens, status, probs, attn = tuple(outputs)[-4:]
    parts = {}
    for name, value in (("tokens", tokens), ("status", status), ("probs", probs), ("attn", attn)):
        v = comps[name].postprocess(value)
        parts[name] = v.model_dump() if hasattr(v, "model_dump") else v
    text = json.dumps([parts["tokens"], parts["status"], parts["probs"], parts["attn"]])
    sizes = {k: len(json.dumps(v)) for k, v in parts.items()}
    return text, sizes


def run_length(app, entry, comps, t: int, reps: int, warmup: int = 3) -> dict:
    from lab.checks import check_sampling
    from lab.catalogue.models import DEFAULT_MODEL
    from lab.session import Session, encode_prompt
    from model.generate import Decoder

    block = entry.model.cfg.block_size
    rows = {k: [] for k in ("prefill", "forward", "model", "probs_fig", "attn_fig", "serialise", "first_total",
                            "next_forward", "next_figs", "next_serialise", "next_total", "app_step_first")}
    sizes, window = None, None
    for r in range(warmup + reps):
        prompt = grammar_prompt(entry.tokenizer, t, offset=37 * r)
        sampling = check_sampling(SAMPLING["temperature"], SAMPLING["top_k"], SAMPLING["top_p"], r)
        # the engine alone: prefill over the prompt, then sampling + one-token forward
        ids, _ = encode_prompt(prompt, entry)
        with Timer() as a:
            d = Decoder(entry.model, ids, sampling, eos_id=entry.tokenizer.eos_id, piece=entry.tokenizer.piece)
        with Timer() as b:
            d.step(sampling)
        # the same first Step through the lab, then the figures and the bytes the wiring sends
        session = Session()
        with Timer() as m:
            session.step(DEFAULT_MODEL, prompt, sampling)
        with Timer() as c:
            probs = app.probs_figure(session)
        with Timer() as f1:
            attn = app.attention_figure(session, *VIEW)
        with Timer() as e:
            text, sz = serialise(comps, (session.tokens(), session.status(), probs, attn))
        # the next click on the same text: cached one-token step (or a re-prefill when the window is full)
        with Timer() as f:
            session.step(DEFAULT_MODEL, prompt, sampling)
        with Timer() as g:
            outputs2 = (session.tokens(), session.status(), app.probs_figure(session),
                        app.attention_figure(session, *VIEW))
        with Timer() as h:
            serialise(comps, outputs2)
        window = len(session.decoder.window)
        session.close()
        # the same first click through app.step itself (end to end, the app's real handler)
        s2 = Session()
        with Timer() as k:
            out = app.step(s2, DEFAULT_MODEL, prompt, SAMPLING["temperature"], SAMPLING["top_k"],
                           SAMPLING["top_p"], r, *VIEW)
            serialise(comps, out)
        s2.close()
        if r < warmup:
            continue
        for key, v in (("prefill", a.s), ("forward", b.s), ("model", m.s), ("probs_fig", c.s), ("attn_fig", f1.s),
                       ("serialise", e.s), ("first_total", m.s + c.s + f1.s + e.s),
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


# The head tools' latency targets (median ms, server side), set when the tools were designed: at T=64 only.
PROBE_TARGETS_MS = {64: {"head_roles": 5.0, "head_badges": 5.0, "logit_lens": 10.0,
                         "ablate_zero": 30.0, "ablate_mean": 30.0}}
PROBE_ROWS = (
    ("head_roles", "head roles: Session.head_roles after a Step"),
    ("head_badges", "head roles as the Step draws them: the attention panels' badges (layer 0)"),
    ("logit_lens", "logit lens at the last token"),
    ("ablate_zero", 'ablation: set_ablation(["L1H0"], "zero") + effect'),
    ("ablate_mean", 'ablation: set_ablation(["L1H0"], "mean") + effect'),
    ("edit", "attention edit (L1H0, last row -> first token) + effect"),
    ("compare", "compare of two prompts of T tokens"),
    ("probe_views", "head panel refresh after a Step: ui.heads.probe_views (no settings)"),
)


def probe_ops(session, prompt_a: str, prompt_b: str):
    """(name, callable) of each measured head tool on a session after its first Step, in run order.
    Settings are cleared after the ablations and the edit, so each starts from none."""
    import ui.explore
    import ui.heads
    from lab import headsettings
    from lab.catalogue.models import DEFAULT_MODEL

    head_badges = headsettings.badges  # what lab.shown.make_shown calls for the attention panels' badges
    probe_views = ui.heads.probe_views
    last = len(session.decoder.window) - 1

    def ablate(mode):
        def run():
            session.heads.set_ablation(["L1H0"], mode, False)
            e = session.heads.effect()
            session.heads.clear_probe()
            return e
        return run

    def edit():
        session.heads.set_edit(1, 0, last, 0)
        e = session.heads.effect()
        session.heads.clear_probe()
        return e

    return (
        ("head_roles", lambda: session.heads.head_roles()),
        ("head_badges", lambda: head_badges(session.text, session.heads.settings, 0, session.heads.head_roles())),
        ("logit_lens", lambda: session.heads.lens(last)),
        ("ablate_zero", ablate("zero")),
        ("ablate_mean", ablate("mean")),
        ("edit", edit),
        ("compare", lambda: session.heads.compare(DEFAULT_MODEL, prompt_a, prompt_b)),
        ("probe_views", lambda: probe_views(session, 0, 0)),
    )


def probe_session(entry, t: int, r: int):
    """A session after the first Step on a new T-token prompt, that prompt, and a second one (for compare)."""
    from lab.checks import check_sampling
    from lab.catalogue.models import DEFAULT_MODEL
    from lab.session import Session

    prompt = grammar_prompt(entry.tokenizer, t, offset=37 * r)
    prompt_b = grammar_prompt(entry.tokenizer, t, offset=37 * r + 11)
    session = Session()
    session.step(DEFAULT_MODEL, prompt, check_sampling(SAMPLING["temperature"], SAMPLING["top_k"],
                                                       SAMPLING["top_p"], r))
    return session, prompt, prompt_b


def run_probes(entry, t: int, reps: int, warmup: int = 3) -> dict:
    """Median / p95 of each head tool at prompt length t, each on a session right after its Step."""
    rows = {k: [] for k, _ in PROBE_ROWS}
    window = None
    for r in range(warmup + reps):
        session, prompt_a, prompt_b = probe_session(entry, t, r)
        window = len(session.decoder.window)
        for key, op in probe_ops(session, prompt_a, prompt_b):
            with Timer() as tm:
                op()
            if r >= warmup:
                rows[key].append(tm.s)
        session.close()
    return dict(prompt_tokens=t, window_tokens=window, ms={k: summary(v) for k, v in rows.items()})


def report_probes(res: dict, threads: int) -> None:
    """One JSON line per head tool (stdout) with its target and whether it is met; a table on stderr."""
    import sys

    from lab.catalogue.models import DEFAULT_MODEL

    t = res["prompt_tokens"]
    targets = PROBE_TARGETS_MS.get(t, {})
    print(f"# head tools, T={t} (window {res['window_tokens']}), {threads} thread(s), {DEFAULT_MODEL}",
          file=sys.stderr)
    print(f"# {'figure':<72} {'median':>8} {'p95':>8}  target     met", file=sys.stderr)
    for key, label in PROBE_ROWS:
        m = res["ms"][key]
        target = targets.get(key)
        met = None if target is None else m["median"] <= target
        emit("probe_server", model=DEFAULT_MODEL, threads=threads, prompt_tokens=t,
             window_tokens=res["window_tokens"], figure=key, label=label, ms=m, target_ms=target, met=met)
        print(f"# {label:<72} {m['median']:>8.2f} {m['p95']:>8.2f}  "
              f"{'—' if target is None else f'≤ {target:g} ms':<9}  {'—' if met is None else ('yes' if met else 'NO')}",
              file=sys.stderr)


def profile_probes(entry, t: int, n: int = 20) -> None:
    """cProfile of each head tool over n new T-token prompts: a JSON line per tool with its top functions."""
    for key, _ in PROBE_ROWS:
        prof = cProfile.Profile()
        total = 0.0
        for r in range(n):
            session, prompt_a, prompt_b = probe_session(entry, t, 1000 + r)
            op = dict(probe_ops(session, prompt_a, prompt_b))[key]
            t0 = time.perf_counter()
            prof.enable()
            op()
            prof.disable()
            total += time.perf_counter() - t0
            session.close()
        top = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: kv[1][3], reverse=True)[:12]
        emit("probe_profile", prompt_tokens=t, figure=key, ms_per_call=round(total / n * 1000, 2),
             top_cumtime=[{"fn": f"{k[0].split('/')[-1]}:{k[1]}:{k[2]}",
                           "cumtime_ms_per_call": round(v[3] / n * 1000, 2),
                           "tottime_ms_per_call": round(v[2] / n * 1000, 2)} for k, v in top])


def main() -> None:
    p = parser("step_latency", __doc__)
    p.add_argument("--reps", type=int, default=30, help="new prompts per length (after 3 untimed warm-ups)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the app's DECODER_LAB_THREADS)")
    p.add_argument("--lengths", default="16,64,128,256", help="comma-separated prompt lengths in tokens")
    p.add_argument("--profile", type=int, default=0, help="also cProfile 20 first Steps at this prompt length")
    p.add_argument("--probe-lengths", default=None,
                   help="prompt lengths for the head tools; default: 64 and 256 where --lengths has "
                        "them; 'none' skips them")
    p.add_argument("--profile-probes", type=int, default=0, help="also cProfile each head tool at this length")
    args = p.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.probe_lengths is None:
        probe_lengths = [t for t in lengths if t in (64, 256)]
    elif args.probe_lengths.strip().lower() in ("", "none"):
        probe_lengths = []
    else:
        probe_lengths = [int(x) for x in args.probe_lengths.split(",")]

    import torch

    import app
    from lab.catalogue.models import DEFAULT_MODEL
    from lab.session import Session

    torch.set_num_threads(args.threads)
    entry = default_entry()
    comps = components()
    for t in lengths:
        res = run_length(app, entry, comps, t, args.reps)
        emit("step_server", model=DEFAULT_MODEL, threads=args.threads, **res)
        emit("step_payload", model=DEFAULT_MODEL, prompt_tokens=t, window_tokens=res["window_tokens_first"],
             bytes=res["payload_bytes"], attn_kb=round(res["payload_bytes"]["attn"] / 1000, 1),
             total_kb=round(res["payload_bytes"]["total"] / 1000, 1))
    for t in probe_lengths:  # the head tools, after the Steps, same process and threads
        report_probes(run_probes(entry, t, args.reps), args.threads)
    if args.profile_probes:
        profile_probes(entry, args.profile_probes)
    if args.profile:
        prof = cProfile.Profile()
        prompt = grammar_prompt(entry.tokenizer, args.profile)
        t0 = time.perf_counter()
        prof.enable()
        for r in range(20):
            serialise(comps, app.step(Session(), DEFAULT_MODEL, prompt, 0.8, 0, 1.0, r, *VIEW))
        prof.disable()
        ms_per_step = round((time.perf_counter() - t0) / 20 * 1000, 1)
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        top = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: kv[1][2], reverse=True)[:12]
        emit("step_profile", prompt_tokens=args.profile, ms_per_step=ms_per_step,
             top_tottime=[{"fn": f"{k[0].split('/')[-1]}:{k[1]}:{k[2]}",
                           "tottime_ms_per_step": round(v[2] / 20 * 1000, 2)} for k, v in top],
             cumulative_top25=s.getvalue()[:6000])


if __name__ == "__main__":
    main()
