"""Turn the JSON lines the benchmarks print into the results table of bench/RESULTS.md (Markdown).

    python -m bench.run_all > bench/results.jsonl && python -m bench.report bench/results.jsonl

Printing the table is this module's whole job, so it prints it directly rather than as a JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results.jsonl"


def rows(path: str) -> list[dict]:
    out = []
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def find(rs, bench, **match):
    for r in rs:
        if r.get("bench") == bench and all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def load(r) -> str:
    m = r.get("machine", {}) if r else {}
    return f"{m.get('load1', '?')} / {m.get('cpus', '?')} CPU" if r else "?"


def row(name: str, value: str, target: str, ok: bool | None, r: dict | None) -> str:
    """One line of the table; `ok` None: the figure has no target to meet."""
    met = "—" if ok is None else ("yes" if ok else "**no**")
    cmd = f"`{r['command']}`" if r else "?"
    return f"| {name} | {value} | {target} | {met} | {cmd} | {load(r)} |"


def step_rows(rs: list[dict]) -> list[str]:
    """A Step: server side, its payload, and over HTTP."""
    lines = []
    for threads in (1, 2):
        for t in (16, 64, 128, 256):
            r = find(rs, "step_server", prompt_tokens=t, threads=threads)
            if not r:
                continue
            m = r["ms"]
            model_ms = m["model"]["median"] if "model" in m else m["prefill"]["median"] + m["forward"]["median"]
            value = (f"{m['app_step_first']['median']} ms median, p95 {m['app_step_first']['p95']} (window "
                     f"{r['window_tokens_first']}; model {model_ms:.1f}, "
                     f"figures {m['probs_fig']['median'] + m['attn_fig']['median']:.1f}, "
                     f"JSON {m['serialise']['median']}; next Step {m['next_total']['median']})")
            target = {64: "≤ 30 ms", 256: "≤ 80 ms"}.get(t, "—")
            ok = None if t not in (64, 256) else m["app_step_first"]["median"] <= (30 if t == 64 else 80)
            lines.append(row(f"Step, server side, T={t}, {threads} thread(s)", value, target, ok, r))
    for t in (16, 64, 128, 256):
        r = find(rs, "step_payload", prompt_tokens=t)
        h = find(rs, "step_http", prompt_tokens=t)
        if r:
            value = f"attention {r['attn_kb']} KB, all outputs {r['total_kb']} KB"
            if h:
                value += f"; SSE `complete` event {h['complete_event_kb_median']} KB"
            lines.append(row(f"Payload per Step, T={t} (window {r['window_tokens']})", value,
                             "≤ 150 KB (T=128)" if t == 128 else "—",
                             (r["attn_kb"] <= 150) if t == 128 else None, r))
    for t in (16, 64, 256):
        h = find(rs, "step_http", prompt_tokens=t)
        if h:
            lines.append(row(f"Step over HTTP (queue + SSE, no browser), T={t}",
                             f"{h['roundtrip_ms']['median']} ms median, p95 {h['roundtrip_ms']['p95']}", "—", None, h))
    return lines


def browser_and_generation_rows(rs: list[dict]) -> list[str]:
    """A click in Chromium, and Generate (the engine and the app)."""
    lines = []
    for t in (16, 64, 128):
        r = find(rs, "click_to_picture", prompt_tokens=t)
        if r:
            f, n = r["first_click_ms"], r["next_click_ms"]
            lines.append(row(
                f"Click Step → attention picture (Chromium), T={t}",
                f"{f.get('median')} ms median (p95 {f.get('p95')}, n={f.get('n')}); next click {n.get('median')} ms; "
                f"tokens shown at {r['first_click_tokens_shown_ms'].get('median')} ms",
                "≤ 250 ms (T=64)" if t == 64 else "—", (f.get("median", 1e9) <= 250) if t == 64 else None, r))
    for n_new in sorted({r["new_tokens"] for r in rs if r.get("bench") == "generation"}, reverse=True):
        r = find(rs, "generation", new_tokens=n_new)
        res = r["results"]
        value = ", ".join(f"{k.replace('cache=', 'cache ').replace(',attention=', '/attn ')}: {v['tokens_per_s']} tok/s"
                          for k, v in res.items())
        value += f"; speed-up {r['cache_speedup']}; crosses context: {r['crosses_context']}"
        lines.append(row(f"Generate {n_new} tokens from 16 (context {r['block_size']})", value,
                         "cache ≥ 2× (200 tokens)" if n_new == 200 else "—",
                         (r["cache_speedup"]["attention=True"] >= 2) if n_new == 200 else None, r))
    r = find(rs, "generation_app")
    if r:
        lines.append(row("app.generate 200 tokens (end to end)", f"{r['tokens_per_s']} tok/s ({r['seconds_median']} s)",
                         "—", None, r))
    return lines


def server_rows(rs: list[dict]) -> list[str]:
    """Training in the app, start-up, memory, and Steps under load."""
    lines = []
    for r in [x for x in rs if x.get("bench") == "train_app_vs_direct"]:
        c = r["config"]
        lines.append(row(
            f"Training in app loop vs model.train.train ({r['corpus']}, {c['layers']}×{c['heads']}×{c['d_model']}, "
            f"{r['steps']} steps)", f"app {r['app_s_median']} s vs direct {r['direct_s_median']} s "
            f"({r['app_slowdown_pct']:+} %)", "≤ +10 %", r["app_slowdown_pct"] <= 10, r))
    r = find(rs, "startup_http200")
    if r:
        lines.append(row("Start-up `python app.py` → HTTP 200", f"{r['median_s']} s median ({r['all_s']})", "≤ 6 s",
                         r["median_s"] <= 6, r))
    r = find(rs, "memory_rss")
    if r:
        lines.append(row("Memory idle (VmRSS)", f"{r['idle_mb']} MB", "≤ 500 MB", r["idle_mb"] <= 500, r))
        keys = [k for k in r if k.startswith("after_") and k.endswith("_sessions_mb")]
        lines.append(row("Memory after sessions", ", ".join(f"{k[6:-3].replace('_', ' ')}: {r[k]} MB" for k in keys)
                         + f" (growth {r['growth_first_batch_mb']} then {r['growth_second_batch_mb']} MB)", "bounded",
                         None, r))
        lines.append(row("Memory during one training", f"peak {r['training_peak_mb']} MB, after "
                         f"{r['after_training_mb']} MB", "bounded", None, r))
    for threads in (1, 2):
        r = find(rs, "load_step_with_training", server_threads=threads)
        if r:
            lat = r["latency_ms"]
            ok = lat.get("p95", 1e9) <= 1500 and not r["errors"]
            lines.append(row(
                f"Under load: {r['clients']} sessions Step T={r['prompt_tokens']} + 1 training, {threads} thread(s)",
                f"{r['steps_per_s']} Steps/s, median {lat.get('median')} ms, p95 {lat.get('p95')} ms, "
                f"errors {sum(r['errors'].values())}, queue-full {r['queue_full_refusals']}",
                "p95 ≤ 1.5 s, 0 errors", ok, r))
    return lines


def real_model_rows(rs: list[dict]) -> list[str]:
    """bench.real_models: Decoder Lab against transformers on real model sizes, one thread."""
    lines = []
    for r in rs:
        if r.get("bench") == "real_models.step":
            lines.append(row(f"{r['model']} cached Step with attention, T={r['T']}, vs transformers",
                             f"{r['ratio_step']}× ({r['decoder_step_ms']} vs {r['transformers_ms']} ms; model forward "
                             f"alone {r['engine_forward_ms']} ms, {r['ratio_forward']}×)", "≤ 1.0×",
                             r["ratio_step"] <= 1.0, r))
        elif r.get("bench") == "real_models.generate":
            lines.append(row(f"{r['model']} greedy generation of {r['new_tokens']} tokens vs transformers' generate",
                             f"{r['ratio']}× ({r['decoder_lab_tok_s']} vs {r['transformers_tok_s']} tokens/s; same "
                             f"tokens: {r['same_tokens']})", "≥ 1.0×", r["ratio"] >= 1.0, r))
        elif r.get("bench") == "real_models.memory":
            lines.append(row(f"{r['model']} opened: resident memory vs fp32 weights",
                             f"{r['ratio']}× ({r['rss_added_mb']} vs {r['fp32_weights_mb']} MB)", "≤ 1.2×",
                             r["ratio"] <= 1.2, r))
    return lines + real_app_rows(rs)


def real_app_rows(rs: list[dict]) -> list[str]:
    """bench.real_app: GPT-2 small (random weights) through the app's own paths, one thread."""
    lines = []
    r = find(rs, "real_app_server")
    if r:
        m, met, t = r["ms"], r["met"], r["targets_ms"]
        for key, name in (("step_next", "Step on a 64-token text (cached), with JSON"),
                          ("step_first_with_json", "first Step on a new 64-token prompt, with JSON"),
                          ("head_roles", "head roles, 144 heads, T=64"), ("logit_lens", "logit lens, T=64")):
            lines.append(row(f"GPT-2 small in the app: {name}", f"{m[key]['median']} ms median, p95 {m[key]['p95']}",
                             f"≤ {t[key]:g} ms", met[key], r))
        lines.append(row("GPT-2 small in the app: one layer's 12 heads drawn at T=64 (server part)",
                         f"{m['attention_figure']['median']} ms figure + {m['attention_figure_json']['median']} ms "
                         f"JSON ({r['attention_figure_json_bytes'] // 1024} KB); the browser's draw not measured",
                         "≤ 400 ms click → drawn", None, r))
    r = find(rs, "real_app_memory")
    if r:
        n, met, t = r["sessions"], r["met"], r["targets_mb"]
        lines.append(row("GPT-2 small in the app: idle with it loaded (VmRSS)", f"{r['idle_loaded_mb']} MB",
                         f"≤ {t['idle_loaded']:g} MB", met["idle_loaded"], r))
        lines.append(row(f"GPT-2 small in the app: {n} sessions × {r['steps_per_session']} Steps",
                         f"+{r['growth_mb']} MB (errors {r['errors']})", f"≤ +{t['sessions_growth']:g} MB",
                         met["sessions_growth"], r))
    return lines


def table(rs: list[dict]) -> str:
    """The whole table: a header, then each group of figures in the order of bench/RESULTS.md."""
    lines = ["| Figure | Result | Target | Met? | Command | Load (1 min) |", "|---|---|---|---|---|---|"]
    for section in (step_rows, browser_and_generation_rows, server_rows, real_model_rows):
        lines += section(rs)
    return "\n".join(lines)

if __name__ == "__main__":
    print(table(rows(sys.argv[1] if len(sys.argv) > 1 else str(RESULTS))))
