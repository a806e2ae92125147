"""GPT-2 small in the app on a 2-vCPU Space: the app's own paths, one torch thread, random weights.

A GPT-2 folder of the real size (transformers' GPT2Config defaults: 12 layers × 12 heads, d_model
768, 1024 positions, 50,257 tokens; 124 M parameters) is built here with random weights and
saved with save_pretrained to a temporary folder, beside a byte-level BPE tokenizer.json of
50,257 tokens made up here (the 256 byte symbols and 50,000 two-symbol merges, then
<|endoftext|>): nothing is downloaded. It is opened the way the app opens a --model folder
(lab.catalogue.external, hash recorded in a temporary file). Measured, in process with 1 torch thread,
at T = 64 (a 64-token prompt):

* step_first: the first Step on the prompt through the Explore handler `ui.explore.step` on layer
  0's 12 heads (prefill, sampling, the Shown, both figures), and its JSON (what gr.Plot and the
  other outputs send); step_next: the Step after it on the same text (the KV-cache path), with
  its JSON. Target ≤ 80 ms, held to both. step_first_2_threads: the same first Step on another new
  prompt with torch.set_num_threads(2) (a 2-vCPU Space can give torch both), no target of its own.
  prefill / prefill_2_threads: the model's forward over the 64 tokens alone (a Decoder built on
  them: cache, attention, next-token logits), the part of the first Step the arithmetic bounds.
* cpu_ms: for the one-thread rows marked Clock (step_first, step_next, logit_lens, logit_lens_middle,
  prefill), the CPU time of the thread that ran them: on a loaded machine, far closer to the time on an
  idle core than the wall time, which also counts the other processes' turns.
* arithmetic: what bounds the prefill. The multiply-adds of a 64-token forward of this model
  (counted from its shapes) and this CPU's float32 rate on a plain torch matmul of the feed-forward
  layer's shape (64 x 768 times 768 x 3,072), at 1 and 2 threads, best (the fastest of many short
  products: an idle core's rate) and median: FLOP / best rate is the time no float32 forward on this
  CPU can beat.
* attention_figure: the attention figure of one layer's 12 heads at T = 64 (ui.explore.attention_plot
  of the Shown, viz's build) and its JSON. The browser's draw time is not measured here:
  bench/browser_real.py measures the issue's ≤ 400 ms from click to drawn in Chromium on this model.
* head_roles: lab.roles.compute_head_roles over all 144 heads (what a Step's first head-roles call
  computes; later calls on the same text are cached). Target ≤ 20 ms.
* logit_lens: Session.lens at the last token (12 layers read through the final norm and the
  50,257-token head). Target ≤ 40 ms. logit_lens_middle: the same at the middle token of the window.
* memory (unless --skip memory): the app itself (`python app.py --model FOLDER`, 1 thread) as a
  child process, its resident memory (VmRSS of the process tree) after GPT-2 was loaded by a first
  gradio_client Step and the process settled (target ≤ 1.2 GB), then after --sessions gradio_client
  sessions (one Client = one server session, 5 at a time) that each Step --steps times on the
  model's own example prompt (target: ≤ 250 MB more). Those sessions are real server sessions over
  HTTP, so the growth includes gradio's per-session state, not only the lab's texts. The texts beyond
  the store of warm texts (lab/server/warm.py, DECODER_LAB_WARM_MB, --warm-mb) are cooled: they keep their
  tokens and sampler and compute the rest again when used. Beside it, one such text in process: what
  its attention, cache and distributions hold warm, what it keeps cold, and what the budget holds.

    python -m bench.real_app [--reps 15] [--sessions 50] [--steps 8] [--warm-mb MB] [--skip memory]

Each row prints its targets, whether they are met, the CPU model and the machine load.
"""

from __future__ import annotations

import os
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from bench.common import Timer, emit, grammar_prompt, parser, summary
from bench.real_models import cpu_model
from tests.support.server import AppServer, rss_mb

T = 64
VIEW = (0, "all", "weights")  # layer 0, its 12 heads side by side
# the server targets; a Step is held to it on a 64-token text (step_next) and on a new 64-token
# prompt (step_first_with_json, which adds the prefill of the 64 tokens)
TARGETS_MS = {"step_next": 80.0, "step_first_with_json": 80.0, "head_roles": 20.0, "logit_lens": 40.0}
IDLE_TARGET_MB, SESSIONS_TARGET_MB = 1200.0, 250.0
MERGES = 50_000  # the real GPT-2 vocabulary: 256 byte symbols + 50,000 merges + <|endoftext|>


def write_gpt2_tokenizer(folder: Path) -> None:
    """A byte-level BPE tokenizer of GPT-2's size: every pair of byte symbols in a fixed order, merged."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(alphabet)}
    merges = []
    for a in alphabet:  # pairs of the common symbols (letters, space) come first, as in a trained BPE
        for b in alphabet:
            if len(merges) == MERGES:
                break
            merges.append((a, b))
            vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    fast.save_pretrained(folder)


def build_gpt2(folder: Path) -> int:
    """GPT-2 small with random weights, saved in the Hugging Face layout; its parameter count."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config())
    model.save_pretrained(folder)
    write_gpt2_tokenizer(folder)
    n = sum(p.numel() for p in model.parameters())
    del model
    return n


class Clock(Timer):
    """Wall time (`s`, as Timer) and the CPU time of this thread (`cpu`). With one torch thread every product
    runs in the calling thread, so on a loaded machine the CPU time comes far closer to what the code takes
    on an idle core than the wall time, which also counts the other processes' turns (the cached Step at
    load 8-15: 84 ms of CPU, 500 ms of wall time, 64 ms on an idle machine)."""

    def __enter__(self):
        self.cpu0 = time.thread_time()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.cpu = time.thread_time() - self.cpu0


def in_process(folder: Path, reps: int) -> dict:
    """The Step, the attention figure, head roles and the logit lens, as the app runs them."""
    import ui.explore
    from bench.step_latency import components, serialise
    from lab.checks import check_sampling
    from lab.catalogue.external import EXTERNAL, HashRecord, parse_source
    from lab.roles import compute_head_roles
    from lab.session import Session
    from model.generate import Decoder

    EXTERNAL.record = HashRecord(folder.parent / "hashes.json")
    EXTERNAL.configure([parse_source(str(folder))])
    name = EXTERNAL.names[0]
    with Timer() as opened:
        entry = EXTERNAL.get(name)
    comps = components()
    rows = {k: [] for k in ("step_first", "step_first_json", "step_next", "attention_figure",
                            "attention_figure_json", "head_roles", "logit_lens", "logit_lens_middle",
                            "step_first_2_threads", "step_first_2_threads_json", "prefill", "prefill_2_threads")}
    sizes, cpu = {}, {}  # cpu: the one-thread rows' CPU time (Clock)
    for r in range(3 + reps):  # three warm-up rounds
        prompt = grammar_prompt(entry.tokenizer, T, offset=37 * r)
        session = Session()
        with Clock() as first:
            out = ui.explore.step(session, name, prompt, 0.8, 0, 1.0, r, *VIEW)
        with Timer() as first_json:
            serialise(comps, out)
        shown = session.shown(*VIEW)
        with Timer() as fig:
            plot = ui.explore.attention_plot(shown)
        with Timer() as fig_json:
            payload = comps["attn"].postprocess(plot)
            text = payload.model_dump_json() if hasattr(payload, "model_dump_json") else str(payload)
        att = session.attention()
        window = session.decoder.window
        with Timer() as roles:
            compute_head_roles(entry, window, att.weights, att.tokens)
        with Clock() as lens:
            session.heads.lens(len(window) - 1)
        with Clock() as lens_middle:
            session.heads.lens(len(window) // 2)
        with Clock() as nxt:
            serialise(comps, ui.explore.step(session, name, prompt, 0.8, 0, 1.0, r, *VIEW))
        session.close()
        with Clock() as prefill:
            Decoder(entry.model, entry.tokenizer.encode(prompt))
        first2, first2_json, prefill2 = first_step_two_threads(comps, entry, name, r)
        if r < 3:
            continue
        for k, t in (("step_first", first), ("step_first_json", first_json), ("step_next", nxt),
                     ("attention_figure", fig), ("attention_figure_json", fig_json), ("head_roles", roles),
                     ("logit_lens", lens), ("logit_lens_middle", lens_middle), ("step_first_2_threads", first2),
                     ("step_first_2_threads_json", first2_json), ("prefill", prefill), ("prefill_2_threads", prefill2)):
            rows[k].append(t.s)
            if isinstance(t, Clock):
                cpu.setdefault(k, []).append(t.cpu)
        sizes = {"attention_figure_json_bytes": len(text), "window_tokens_first": len(window)}
    ms = {k: summary(v) for k, v in rows.items()}
    cpu_ms = {k: summary(v) for k, v in cpu.items()}
    server_step = [a + b for a, b in zip(rows["step_first"], rows["step_first_json"])]
    ms["step_first_with_json"] = summary(server_step)
    ms["step_first_2_threads_with_json"] = summary([a + b for a, b in zip(rows["step_first_2_threads"],
                                                                          rows["step_first_2_threads_json"])])
    met = {k: ms[k]["median"] <= v for k, v in TARGETS_MS.items()}
    return dict(model=entry.summary, open_seconds=round(opened.s, 2), ms=ms, **sizes,
                targets_ms=TARGETS_MS, met=met, cpu_ms=cpu_ms, arithmetic=arithmetic(entry.model.cfg, reps))


def first_step_two_threads(comps, entry, name: str, r: int) -> tuple:
    """A first Step on a new prompt, its JSON and the prefill alone, with torch on 2 threads (Timers)."""
    import ui.explore
    from bench.step_latency import serialise
    from lab.session import Session
    from model.generate import Decoder

    prompt = grammar_prompt(entry.tokenizer, T, offset=37 * r + 11)
    torch.set_num_threads(2)
    try:
        session = Session()
        with Timer() as first:
            out = ui.explore.step(session, name, prompt, 0.8, 0, 1.0, r, *VIEW)
        with Timer() as first_json:
            serialise(comps, out)
        session.close()
        with Timer() as prefill:
            Decoder(entry.model, entry.tokenizer.encode(prompt))
    finally:
        torch.set_num_threads(1)
    return first, first_json, prefill


def forward_gflop(cfg, T: int) -> dict:
    """Multiply-adds (as 2 FLOP each) of a forward over T new tokens from an empty cache, by part."""
    C, F, L = cfg.d_model, cfg.ff_dim, cfg.n_layers
    per_token = 2 * L * (C * 3 * C + C * C + 2 * C * F)  # q, k, v; the output projection; the two MLP matrices
    attention = 2 * L * 2 * C * T * T  # scores and weights @ v: all T x T, the mask applies after
    head = 2 * C * cfg.vocab_size  # one position through the output head
    return {"blocks": per_token * T / 1e9, "attention": attention / 1e9, "head_last": head / 1e9,
            "head_all_positions": head * T / 1e9}


def matmul_rate(threads: int, reps: int, rows: int = T, d: int = 768, f: int = 3072) -> dict:
    """GFLOP/s of a plain float32 torch matmul (rows x d) @ (d x f), the feed-forward layer's shape:
    "best" from the fastest of many products (each a few ms, shorter than a scheduler's time slice, so
    the fastest ran with the core to itself: the rate of an idle machine), "median" as the load allows."""
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(rows, d), torch.randn(d, f)
        for _ in range(5):
            a @ b
        times = []
        for _ in range(max(reps, 5) * 40):
            with Timer() as t:
                a @ b
            times.append(t.s)
    finally:
        torch.set_num_threads(1)
    times.sort()
    return {k: 2 * rows * d * f / s / 1e9 for k, s in (("best", times[0]), ("median", times[len(times) // 2]))}


def arithmetic(cfg, reps: int) -> dict:
    """What the prefill of T tokens costs in float32 arithmetic, and the least time this CPU needs for it
    at the matmul's best rate (an idle machine's)."""
    g = forward_gflop(cfg, T)
    total = g["blocks"] + g["attention"] + g["head_last"]
    rates = {f"{n}_thread{'s' if n > 1 else ''}": matmul_rate(n, reps) for n in (1, 2)}
    return {"gflop": {k: round(v, 3) for k, v in g.items()}, "prefill_gflop": round(total, 2),
            "matmul_gflops": {k: {m: round(x, 1) for m, x in v.items()} for k, v in rates.items()},
            "prefill_floor_ms": {k: round(total / v["best"] * 1000, 1) for k, v in rates.items()}}


SERVED_PROMPT = "The cat sat on the mat. The dog sat on the log. The cat sat on the"


def text_breakdown(folder: Path, steps: int) -> dict:
    """What one session's text holds after `steps` Steps on SERVED_PROMPT, in process (MB): warm, its
    attention and scores (with the decoder's room for rows to come), key/value cache and next-token
    logits, kept distributions and sampler states, and what the memory budget reserved for it; then
    cooled (lab/server/warm.py): what it keeps and what the budget holds for it."""
    from lab.server import budget
    from lab.catalogue.external import EXTERNAL, HashRecord, parse_source
    from lab.session import Session
    from model.generate import Sampling

    name = parse_source(str(folder)).name
    if name not in EXTERNAL:  # --skip server: not opened yet
        EXTERNAL.record = HashRecord(folder.parent / "hashes.json")
        EXTERNAL.configure([parse_source(str(folder))])
    s = Session()
    for _ in range(steps):
        with s.turn():
            s.step(name, SERVED_PROMPT, Sampling(temperature=0.8, seed=0))
    d, mb = s.decoder, 2**20
    drawn = sum(x.probs.nbytes + x.adjusted.nbytes for x in s.text.drawn)
    out = {"tokens": len(d.window), "attention_and_scores_mb": round(d.attention_nbytes / mb, 2),
           "cache_and_logits_mb": round((d.warm_nbytes - d.attention_nbytes) / mb, 2),
           "distributions_mb": round(drawn / mb, 2), "sampler_states_mb": round(d.undo_bytes / mb, 3),
           "text_mb": round(s.text.nbytes() / mb, 2), "reserved_mb": round(budget.MODEL_BUDGET.held(s) / mb, 2)}
    s.cool_text()
    out.update(cold_text_mb=round(s.text.nbytes() / mb, 3), cold_held_mb=round(budget.MODEL_BUDGET.held(s) / mb, 3),
               model=EXTERNAL.names[0])
    s.close()
    return out


def served_memory(folder: Path, sessions: int, steps: int, warm_mb: int | None = None) -> dict:
    """RSS of the app with GPT-2 loaded, idle, then after `sessions` gradio_client sessions stepped on it
    (with `warm_mb` as the store of warm texts' bound; None: the app's default)."""
    from bench.clients import client, step
    from lab.catalogue.external import parse_source
    from lab.limits import WARM_MAX_BYTES

    env = {"DECODER_LAB_THREADS": "1", "DECODER_LAB_MODEL_HASHES": str(folder.parent / "served-hashes.json")}
    if warm_mb is not None:
        env["DECODER_LAB_WARM_MB"] = str(warm_mb)
    server = AppServer(env, args=["--model", str(folder)]).start(timeout=300)
    pid = server.proc.pid
    rows: dict = {}
    try:
        urllib.request.urlopen(server.url, timeout=30).read()
        rows["started_mb"] = rss_mb(pid, tree=True)
        first = client(server.url)
        name = parse_source(str(folder)).name
        step(first, name, "Hello world, hello", seed=0)  # loads the model (lazily, on first use)
        time.sleep(3)
        rows["idle_loaded_mb"] = rss_mb(pid, tree=True)
        prompt = SERVED_PROMPT

        def one(i: int) -> int:
            c = client(server.url)
            errors = 0
            for _ in range(steps):
                try:
                    step(c, name, prompt, seed=i)
                except Exception:  # noqa: BLE001 - counted, the run goes on
                    errors += 1
            return errors

        t0 = time.perf_counter()
        with ThreadPoolExecutor(5) as ex:
            rows["errors"] = sum(ex.map(one, range(sessions)))
        rows["sessions_seconds"] = round(time.perf_counter() - t0, 1)
        time.sleep(3)
        rows[f"after_{sessions}_sessions_mb"] = rss_mb(pid, tree=True)
    finally:
        server.stop()
    rows["growth_mb"] = round(rows[f"after_{sessions}_sessions_mb"] - rows["idle_loaded_mb"], 1)
    rows["warm_store_mb"] = warm_mb if warm_mb is not None else WARM_MAX_BYTES // 2**20
    rows["met"] = {"idle_loaded": rows["idle_loaded_mb"] <= IDLE_TARGET_MB,
                   "sessions_growth": rows["growth_mb"] <= SESSIONS_TARGET_MB}
    rows["targets_mb"] = {"idle_loaded": IDLE_TARGET_MB, "sessions_growth": SESSIONS_TARGET_MB}
    return rows


def main() -> None:
    p = parser("real_app", __doc__)
    p.add_argument("--reps", type=int, default=15, help="measured rounds (after three warm-up rounds)")
    p.add_argument("--sessions", type=int, default=50, help="gradio_client sessions stepping on the served model")
    p.add_argument("--steps", type=int, default=8, help="Steps per session")
    p.add_argument("--warm-mb", type=int, default=None,
                   help="the served app's store of warm texts in MB (DECODER_LAB_WARM_MB; default: the app's own)")
    p.add_argument("--skip", default="", help="'memory' leaves out the served-app memory measurement, "
                   "'server' the in-process timings (comma-separated)")
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="real-app-") as tmp:
        folder = Path(tmp) / "gpt2-random"
        params = build_gpt2(folder)
        machine = {"cpu_model": cpu_model(), "torch_threads": torch.get_num_threads(), "parameters": params}
        if "server" not in args.skip.split(","):
            emit("real_app_server", T=T, view=list(VIEW), **machine, **in_process(folder, args.reps))
        if "memory" not in args.skip.split(","):
            emit("real_app_memory", **machine, sessions=args.sessions, steps_per_session=args.steps,
                 one_text=text_breakdown(folder, args.steps),
                 **served_memory(folder, args.sessions, args.steps, args.warm_mb))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
