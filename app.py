"""Decoder Lab: train or load a small GPT-style model and watch what it computes.

Run locally with `python app.py` (http://127.0.0.1:7860) or as a Hugging Face Space.
This file wires the UI; the model lives in model/, the figures in viz/.
"""

from __future__ import annotations

try:  # ZeroGPU needs `spaces` imported before torch touches CUDA; locally it is absent
    import spaces

    gpu = spaces.GPU
except ImportError:  # pragma: no cover - depends on the environment

    def gpu(fn=None, **_kwargs):
        return fn if callable(fn) else (lambda f: f)


import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import gradio as gr  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import viz  # noqa: E402
from model.checkpoint import DEFAULT_LIMITS, load_checkpoint, save_checkpoint  # noqa: E402
from model.config import ModelConfig  # noqa: E402
from model.corpora import CORPUS_DESCRIPTIONS, build_corpus, read_text_file  # noqa: E402
from model.session import (  # noqa: E402
    MAX_NEW_TOKENS,
    BuiltinModels,
    ModelEntry,
    UserError,
    TrainingRun,
    Workspace,
    check_float,
    check_int,
    make_sampling,
)
from model.train import TrainConfig, train  # noqa: E402
from model.transformer import DecoderLM  # noqa: E402

log = logging.getLogger("decoder_lab")
ROOT = Path(__file__).resolve().parent
ASSETS = ROOT / "assets"
RUNS = Path(tempfile.gettempdir()) / "decoder-lab-runs"
THREADS = int(os.environ.get("DECODER_LAB_THREADS", "1"))
torch.set_num_threads(THREADS)

BUILTIN = BuiltinModels(
    {
        "grammar (built-in)": ASSETS / "grammar.safetensors",
        "sort digits (built-in)": ASSETS / "sort.safetensors",
        "copy / induction (built-in)": ASSETS / "copy.safetensors",
        "article toy (built-in)": ASSETS / "toy.safetensors",
    }
)
DEFAULT_MODEL = "grammar (built-in)"
EXAMPLE_PROMPTS = {
    "grammar (built-in)": "anna found the key . she gave it to tom because he",
    "sort digits (built-in)": "503124=",
    "copy / induction (built-in)": "hcbpadlk|",
    "article toy (built-in)": "how is living in amsterdam <EOS>",
}

# Limits enforced on the server (the UI's own limits do not protect the API).
TRAIN_LIMITS = dict(layers=(1, 4), heads=(1, 4), d_model=(8, 128), d_ff=(0, 512), steps=(1, 2000), block=(8, 128))
TRAIN_MAX_SECONDS = float(os.environ.get("DECODER_LAB_TRAIN_SECONDS", "180"))
# Training runs on the GPU only when asked (or on ZeroGPU); stepping a model this small is fastest on the CPU.
TRAIN_DEVICE = os.environ.get("DECODER_LAB_DEVICE") or ("cuda" if os.environ.get("SPACES_ZERO_GPU") else "cpu")
STATE_TTL = float(os.environ.get("DECODER_LAB_STATE_TTL", "1800"))  # seconds a session's state lives
OVERVIEW_MAX_T = 48
VIEWS = ("weights", "scores", "all layers")
TRAIN_CORPORA = {
    "grammar": "Generated English (names, pronouns)",
    "sort": "Sort six digits",
    "copy": "Copy a random sequence (induction)",
    "toy": "Article toy (7 words)",
    "text": "My own text (paste or upload)",
}


def _error(exc: Exception) -> gr.Error:
    """A message for the person; details of unexpected errors stay in the server log."""
    if isinstance(exc, (UserError, ValueError)):
        return gr.Error(str(exc))
    log.exception("unexpected error")
    return gr.Error("Something went wrong on the server; the error was logged. Try again or reset.")


def _entry(ws: Workspace, name: str) -> ModelEntry:
    if name in ws.models:
        return ws.models[name]
    if name in BUILTIN.paths:
        return BUILTIN.get(name)
    raise UserError(f"Unknown model {name!r}. Pick one from the list.")


def _model_choices(ws: Workspace) -> list[str]:
    return BUILTIN.names + list(ws.models)


# ------------------------------------------------------------------------------------ Explore


def _msg(text: str):
    return viz.to_gradio_plot(viz.message_figure(text))


def _attention_figure(ws: Workspace, layer, head, view):
    """The attention view as gradio plot data (compact encoding, masked cells not sent)."""
    d = ws.decoder
    if d is None:
        return _msg("Press Step or Generate to see attention.")
    tokens = [p for p, _ in ws.tokens()]
    cfg = ws.entry.model.cfg
    mask = viz.causal_mask(len(tokens)) if cfg.mask == "causal" else None
    layer = check_int("layer", layer, 0, cfg.n_layers - 1) if layer is not None else 0
    if view == "all layers":
        if len(tokens) > OVERVIEW_MAX_T:
            return _msg(
                f"The overview draws {cfg.n_layers}×{cfg.n_heads} panels; it needs ≤ {OVERVIEW_MAX_T} tokens "
                f"(there are {len(tokens)}). Pick a layer instead."
            )
        return viz.to_gradio_plot(viz.attention_overview(np.stack(d.attention), tokens, mask=mask, width_px=1200))
    kind = "scores" if view == "scores" else "weights"
    mats = ws.attention(layer, kind)
    if head in (None, "all"):
        return viz.to_gradio_plot(viz.attention_grid(mats, tokens, layer, kind=kind, mask=mask, width_px=1200))
    h = check_int("head", head, 0, cfg.n_heads - 1)
    return viz.to_gradio_plot(viz.attention_head(mats[h], tokens, layer, h, kind=kind, mask=mask))


def _probs_figure(ws: Workspace):
    s = ws.last_step
    if s is None:
        return _msg("Next-token probabilities appear after the first step.")
    tok = ws.entry.tokenizer
    pieces = [tok.piece(i) for i in range(tok.vocab_size)]
    return viz.to_gradio_plot(viz.probabilities(pieces, s.probs, adjusted=s.adjusted, chosen=s.token_id, top=10))


def _status(ws: Workspace) -> str:
    d = ws.decoder
    if d is None:
        return ""
    lines = list(ws.notices)
    n_new = len(d.ids) - d.prompt_len
    lines.append(f"{len(d.window)} tokens in view ({n_new} generated). Model: {ws.entry.summary}")
    if ws.last_step is not None:
        s = ws.last_step
        p = float(s.adjusted[s.token_id])
        lines.append(f"Last token: {s.piece!r} (sampled with probability {p:.3f}).")
        if s.cropped:
            lines.append(f"The context is full: the oldest token was dropped to keep {d.block_size}.")
        if s.eos:
            lines.append("The model produced <EOS>: end of sequence.")
    return "\n".join(lines)


def _explore_outputs(ws: Workspace, layer, head, view):
    return (
        ws,
        ws.tokens(),
        _status(ws),
        _probs_figure(ws),
        _attention_figure(ws, layer, head, view),
    )


def _layer_head_choices(entry: ModelEntry):
    cfg = entry.model.cfg
    return (
        gr.update(choices=list(range(cfg.n_layers)), value=0),
        gr.update(choices=["all"] + list(range(cfg.n_heads)), value="all"),
    )


def _check_view(entry: ModelEntry, layer, head, view) -> None:
    """Validate the view settings before anything changes, so a bad value never advances the text."""
    cfg = entry.model.cfg
    check_int("layer", layer, 0, cfg.n_layers - 1)
    if head != "all":
        check_int("head", head, 0, cfg.n_heads - 1)
    if view not in VIEWS:
        raise UserError(f"view must be one of {', '.join(VIEWS)}; got {view!r}")


def _advance(ws, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view) -> None:
    """Validate everything, then sample one new token into the session's text."""
    ws.touched = time.time()
    entry = _entry(ws, model_name)
    sampling = make_sampling(temperature, top_k, top_p, seed)
    _check_view(entry, layer, head, view)
    ws.ensure_started(entry, prompt, sampling)
    if len(ws.decoder.ids) - ws.decoder.prompt_len >= MAX_NEW_TOKENS:
        raise UserError(f"This text already has {MAX_NEW_TOKENS} generated tokens; Reset to start again.")
    ws.last_step = ws.decoder.step(sampling)


def step(ws, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view):
    """One new token: sample from the model's distribution, then show what it attended to."""
    try:
        _advance(ws, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view)
        return _explore_outputs(ws, layer, head, view)
    except Exception as exc:
        raise _error(exc) from None


def step_picture(ws, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view):
    """`step` without the probability chart, which the page fetches right after the picture."""
    try:
        _advance(ws, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view)
        return ws, ws.tokens(), _status(ws), _attention_figure(ws, layer, head, view)
    except Exception as exc:
        raise _error(exc) from None


@gpu
def generate(ws, model_name, prompt, temperature, top_k, top_p, seed, max_new, layer, head, view):
    """Generate up to `max_new` tokens from the prompt (restarting it), streaming the text."""
    try:
        ws.touched = time.time()
        entry = _entry(ws, model_name)
        sampling = make_sampling(temperature, top_k, top_p, seed)
        max_new = check_int("max new tokens", max_new, 1, MAX_NEW_TOKENS)
        _check_view(entry, layer, head, view)
        ws.start(entry, prompt, sampling)
        # Only the last update draws attention: decode without capturing it (the fused attention
        # path, faster), then recompute the final window's attention once, exactly as a Step would.
        ws.decoder.capture(False)
        last_yield = 0.0
        for i in range(max_new):
            ws.last_step = ws.decoder.step(sampling)
            done = ws.last_step.eos or i == max_new - 1
            if done:
                ws.decoder.capture(True)
                yield _explore_outputs(ws, layer, head, view)
                break
            if time.perf_counter() - last_yield > 0.3:
                last_yield = time.perf_counter()
                yield ws, ws.tokens(), _status(ws), gr.skip(), gr.skip()
    except Exception as exc:
        raise _error(exc) from None


def undo(ws, layer, head, view):
    try:
        if ws.decoder is not None:
            ws.decoder.undo()
            ws.last_step = None
        return _explore_outputs(ws, layer, head, view)
    except Exception as exc:
        raise _error(exc) from None


def _example_prompt(ws: Workspace, model_name: str) -> str:
    if model_name in EXAMPLE_PROMPTS:
        return EXAMPLE_PROMPTS[model_name]
    entry = ws.models.get(model_name)
    return entry.meta.get("example_prompt", "") if entry is not None else ""


def reset(ws, model_name):
    ws.reset()
    prompt = _example_prompt(ws, model_name)
    return (ws, [], "", _probs_figure(ws), _attention_figure(ws, 0, "all", "weights"), prompt)


def redraw(ws, layer, head, view):
    try:
        return _attention_figure(ws, layer, head, view)
    except Exception as exc:
        raise _error(exc) from None


def select_model(ws, model_name):
    try:
        entry = _entry(ws, model_name)
    except Exception as exc:
        raise _error(exc) from None
    ws.reset()
    layer_u, head_u = _layer_head_choices(entry)
    prompt = _example_prompt(ws, model_name)
    return (ws, [], entry.summary, _probs_figure(ws), _msg("Press Step or Generate."),
            layer_u, head_u, gr.update(value=prompt))


# --------------------------------------------------------------------------- Positional tab


def positional(ws, model_name):
    try:
        entry = _entry(ws, model_name)
    except Exception as exc:
        raise _error(exc) from None
    kind, table = entry.model.positional_table()
    if table is None:
        fig = viz.to_gradio_plot(viz.no_positional_encoding())
        return fig, fig, f"**{entry.name}** uses no positional encoding."
    table = table.numpy().astype(np.float32)
    return (
        viz.to_gradio_plot(viz.positional_table(table, kind)),
        viz.to_gradio_plot(viz.positional_similarity(table, kind)),
        f"**{entry.name}** uses **{kind}** positions: table of {table.shape[0]} positions × {table.shape[1]} "
        + ("rotation angles (one per pair of dimensions in each head)." if kind == "rope" else "dimensions."),
    )


# ------------------------------------------------------------------------------- Train tab


def _read_upload(path) -> str:
    if not path:
        return ""
    try:
        return read_text_file(path)
    finally:
        try:
            Path(path).unlink()
        except OSError:
            pass


@gpu(duration=200)
def train_model(ws, corpus_name, pasted, upload, tokenizer_kind, layers, heads, d_model, d_ff, pos, norm,
                activation, dropout, steps, lr, seed):
    """Train a new model for this session, streaming the loss curve; Stop keeps what was learned."""
    try:
        if ws.run is not None and not ws.run.done:
            raise UserError("A training run is already going in this session; stop it first.")
        if not isinstance(corpus_name, str) or corpus_name not in TRAIN_CORPORA:
            raise UserError(f"Unknown corpus {corpus_name!r}; choose one of {', '.join(TRAIN_CORPORA)}.")
        lo, hi = TRAIN_LIMITS["layers"]
        layers = check_int("layers", layers, lo, hi)
        heads = check_int("heads", heads, *TRAIN_LIMITS["heads"])
        d_model = check_int("d_model", d_model, *TRAIN_LIMITS["d_model"])
        d_ff = check_int("d_ff", d_ff, *TRAIN_LIMITS["d_ff"])
        steps = check_int("steps", steps, *TRAIN_LIMITS["steps"])
        lr = check_float("learning rate", lr, 1e-5, 0.1)
        dropout = check_float("dropout", dropout, 0.0, 0.5)
        seed = check_int("seed", seed, 0, 2**31 - 1)
        text = None
        if corpus_name == "text":
            text = _read_upload(upload) if upload else (pasted or "")
        corpus = build_corpus(corpus_name, tokenizer_kind if corpus_name in ("grammar", "text") else None,
                              seed=seed, text=text)
        block = 64 if corpus.kind == "text" else int(corpus.train.x.shape[1])
        cfg = ModelConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=block, n_layers=layers, n_heads=heads,
                          d_model=d_model, d_ff=d_ff, pos_encoding=pos, norm=norm, activation=activation,
                          dropout=dropout)
        try:  # whatever is trained here must load back through the upload checks
            DEFAULT_LIMITS.check(cfg)
        except ValueError as exc:
            raise UserError(f"This model would be too big to save and load again: {exc}. "
                            "Use text with fewer distinct characters or words, or a smaller model.") from None
        tcfg = TrainConfig(steps=steps, batch_size=16, lr=lr, warmup=min(50, steps // 10), eval_every=max(10, steps // 10),
                           eval_batches=4, seed=seed, max_seconds=TRAIN_MAX_SECONDS)
    except Exception as exc:
        raise _error(exc) from None

    sweep_runs()  # long-running servers: old run folders go even when no session cleanup ran
    torch.manual_seed(seed)
    model = DecoderLM(cfg)
    on_gpu = TRAIN_DEVICE == "cuda" and torch.cuda.is_available()
    if on_gpu:  # ZeroGPU: CUDA exists only inside this decorated call; the model returns to the CPU after
        model.to("cuda")
    name = ws.unique_name(f"my {corpus_name} model")
    entry = ModelEntry(name, model, corpus.tokenizer, {"corpus": corpus_name, "example_prompt": corpus.sample_prompts[0]})
    run = ws.run = TrainingRun(name)
    ws.add_model(entry)  # selectable (and kept) even if the run is cancelled mid-way
    last_yield = 0.0
    ev = None
    try:
        for ev in train(model, corpus, tcfg, should_stop=run.stop.is_set):
            run.steps.append(ev.step)
            run.train_loss.append(ev.train_loss)
            if ev.val_loss is not None:
                run.val_steps.append(ev.step)
                run.val_loss.append(ev.val_loss)
            if ev.done or time.perf_counter() - last_yield > 0.5:
                last_yield = time.perf_counter()
                msg = f"step {ev.step}/{ev.total_steps} · loss {ev.train_loss:.3f} · {ev.tokens_per_s:,.0f} tokens/s"
                if not ev.done:
                    yield ws, msg, _loss_figure(run), gr.skip(), gr.skip()
    finally:
        run.done = True
        model.eval()
        if on_gpu:
            model.to("cpu")
    reason = {"finished": "finished", "stopped": "stopped by you", "time limit": "hit the time limit"}[ev.stop_reason]
    if ws.closed:  # the session was cleaned up while training: save nothing nobody can fetch
        return
    ws.checkpoint_path = _save_for_download(ws, entry)
    summary = (f"Training {reason} after {ev.step} steps in {ev.elapsed:.1f} s: validation loss {ev.val_loss:.3f}. "
               f"'{name}' is now in the Explore model list.")
    yield ws, summary, _loss_figure(run), gr.update(choices=_model_choices(ws), value=name), gr.update(
        value=str(ws.checkpoint_path), interactive=True)


def _loss_figure(run: TrainingRun):
    return viz.to_gradio_plot(viz.loss_curve(np.array(run.steps, dtype=np.float32), np.array(run.train_loss, dtype=np.float32),
                          np.array(run.val_steps, dtype=np.float32), np.array(run.val_loss, dtype=np.float32)))


def stop_training(ws):
    if ws.run is not None:
        ws.run.stop.set()
    return "Stopping…"


def _session_dir(ws: Workspace) -> Path:
    if ws.run_dir is None:
        ws.run_dir = RUNS / uuid.uuid4().hex
    ws.run_dir.mkdir(parents=True, exist_ok=True)
    return ws.run_dir


def _save_for_download(ws: Workspace, entry: ModelEntry) -> Path:
    safe = "".join(c if c.isalnum() else "-" for c in entry.name).strip("-") or "model"
    return save_checkpoint(_session_dir(ws) / f"{safe}.safetensors", entry.model, entry.tokenizer, entry.meta)


def upload_model(ws, path):
    """Load a .safetensors checkpoint into this session after validating it."""
    if not path:
        raise gr.Error("Choose a .safetensors file first.")
    try:
        ck = load_checkpoint(path)
    except Exception as exc:
        raise _error(exc) from None
    finally:
        try:
            Path(path).unlink()
        except OSError:
            pass
    name = ws.unique_name(f"uploaded: {Path(path).stem[:40]}")
    ws.add_model(ModelEntry(name, ck.model, ck.tokenizer, ck.meta))
    return ws, f"Loaded '{name}'. It is now in the Explore model list.", gr.update(choices=_model_choices(ws), value=name)


def cleanup_session(ws: Workspace) -> None:
    """Called when a session's state expires or its tab closes: stop training, delete its files."""
    ws.closed = True
    if ws.run is not None:
        ws.run.stop.set()
    if ws.run_dir is not None:
        shutil.rmtree(ws.run_dir, ignore_errors=True)


def sweep_runs(max_age_s: float = 3600) -> None:
    """Delete run directories untouched for max_age_s (also at start-up)."""
    if not RUNS.exists():
        return
    now = time.time()
    for d in RUNS.iterdir():
        try:
            if now - d.stat().st_mtime > max_age_s:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass


# ------------------------------------------------------------------------------------- UI

LEARN_MD = (ROOT / "assets" / "learn.md").read_text(encoding="utf-8") if (ROOT / "assets" / "learn.md").exists() else ""

LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]
CSS = """
#tokens .token { font-family: ui-monospace, monospace; }
footer { display: none !important; }
"""


def build_demo() -> gr.Blocks:
    default = DEFAULT_MODEL
    default_cfg = BUILTIN.get(default).model.cfg
    with gr.Blocks(title="Decoder Lab", delete_cache=(600, 3600)) as demo:
        ws = gr.State(Workspace(), time_to_live=STATE_TTL, delete_callback=cleanup_session)
        gr.Markdown("# Decoder Lab\nA small GPT-style transformer you can step through, one token at a time.")
        with gr.Tabs():
            with gr.Tab("Explore", id="explore"):
                with gr.Row():
                    model_dd = gr.Dropdown(BUILTIN.names, value=default, label="Model", elem_id="model", scale=1)
                    prompt = gr.Textbox(EXAMPLE_PROMPTS[default], label="Prompt", elem_id="prompt", scale=3,
                                        max_lines=3, max_length=2000)
                with gr.Accordion("Sampling", open=False):
                    with gr.Row():
                        temperature = gr.Slider(0, 2, value=0.8, step=0.05, label="Temperature (0 = greedy)",
                                                elem_id="temperature")
                        top_k = gr.Slider(0, 50, value=0, step=1, label="Top-k (0 = off)", elem_id="top_k")
                        top_p = gr.Slider(0.05, 1, value=1.0, step=0.05, label="Top-p (1 = off)", elem_id="top_p")
                        seed = gr.Number(0, label="Seed", precision=0, minimum=0, elem_id="seed")
                        max_new = gr.Slider(1, MAX_NEW_TOKENS, value=40, step=1, label="Max new tokens",
                                            elem_id="max_new")
                with gr.Row():
                    step_btn = gr.Button("Step", variant="primary", elem_id="step")
                    gen_btn = gr.Button("Generate", elem_id="generate")
                    undo_btn = gr.Button("Undo", elem_id="undo")
                    reset_btn = gr.Button("Reset", elem_id="reset")
                with gr.Row():
                    with gr.Column(scale=3):
                        tokens = gr.HighlightedText(label="Text so far (prompt / generated)", elem_id="tokens",
                                                    color_map={"prompt": "#cfd8e3", "generated": "#ffd27f"},
                                                    show_legend=True, combine_adjacent=False)
                        status = gr.Textbox(label="Status", elem_id="status", lines=3, interactive=False)
                    with gr.Column(scale=2):
                        probs_plot = gr.Plot(_msg("Next-token probabilities appear after the first step."),
                                             label="Next-token probabilities", elem_id="probs")
                with gr.Row():
                    layer = gr.Dropdown(list(range(default_cfg.n_layers)), value=0, label="Layer", elem_id="layer")
                    head = gr.Dropdown(["all", *range(default_cfg.n_heads)], value="all", label="Head", elem_id="head")
                    view = gr.Radio(list(VIEWS), value="weights",
                                    label="View", elem_id="view")
                attn_plot = gr.Plot(_msg("Press Step or Generate to see attention."),
                                    label="Masked self-attention (rows: queries, columns: keys)", elem_id="attention")

            with gr.Tab("Positional encoding", id="positional") as pe_tab:
                pe_info = gr.Markdown()
                gr.Markdown(
                    latex_delimiters=LATEX,
                    value="Sinusoidal: $PE_{pos,2i} = \\sin(pos / 10000^{2i/d})$, "
                    "$PE_{pos,2i+1} = \\cos(pos / 10000^{2i/d})$. Learned: a trained table of the same shape. "
                    "RoPE: queries and keys are rotated by the angle $pos \\cdot 10000^{-2i/d_{head}}$ per pair of dimensions."
                )
                with gr.Row():
                    pe_table = gr.Plot(label="Positions × dimensions", elem_id="pe_table")
                    pe_sim = gr.Plot(label="Similarity of positions (cosine)", elem_id="pe_sim")

            with gr.Tab("Train", id="train"):
                gr.Markdown("Train a new model for this session (runs are temporary: download what you want to keep).")
                with gr.Row():
                    with gr.Column(scale=1):
                        with gr.Row():
                            corpus = gr.Dropdown(list(TRAIN_CORPORA), value="sort", label="Corpus", elem_id="corpus")
                            tok_kind = gr.Radio(["char", "word", "bpe"], value="char",
                                                label="Tokenizer (grammar / own text)", elem_id="tokenizer")
                        corpus_info = gr.Markdown(CORPUS_DESCRIPTIONS.get("sort", ""))
                        with gr.Accordion("Your own text", open=False):
                            pasted = gr.Textbox("", label="Paste text (1 KB – 1.2 MB)", lines=4,
                                                max_length=1_200_000, elem_id="pasted")
                            text_file = gr.File(label="…or upload a UTF-8 .txt file", file_types=[".txt"],
                                                type="filepath", elem_id="text_file", height=120)
                        with gr.Row():
                            layers = gr.Slider(1, 4, value=2, step=1, label="Layers", elem_id="layers")
                            heads = gr.Slider(1, 4, value=4, step=1, label="Heads", elem_id="heads")
                        with gr.Row():
                            d_model = gr.Slider(8, 128, value=64, step=8, label="d_model", elem_id="d_model")
                            d_ff = gr.Slider(0, 512, value=256, step=32, label="d_ff (0 = none)", elem_id="d_ff")
                        with gr.Row():
                            pos = gr.Dropdown(["learned", "sinusoidal", "rope", "none"], value="learned",
                                              label="Positional encoding", elem_id="pos")
                            norm = gr.Dropdown(["pre", "post", "none"], value="pre", label="Norm placement",
                                               elem_id="norm")
                        with gr.Row():
                            activation = gr.Dropdown(["gelu", "relu", "swiglu"], value="gelu", label="Activation",
                                                     elem_id="activation")
                            dropout = gr.Slider(0, 0.5, value=0.0, step=0.05, label="Dropout", elem_id="dropout")
                        with gr.Row():
                            steps = gr.Slider(10, 2000, value=300, step=10, label="Steps", elem_id="steps")
                            lr = gr.Number(3e-3, label="Learning rate", minimum=1e-5, maximum=0.1, elem_id="lr")
                            train_seed = gr.Number(0, label="Seed", precision=0, minimum=0, elem_id="train_seed")
                    with gr.Column(scale=1):
                        with gr.Row():
                            train_btn = gr.Button("Train", variant="primary", elem_id="train_btn")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop_btn")
                        train_status = gr.Textbox(label="Training", interactive=False, elem_id="train_status")
                        loss_plot = gr.Plot(viz.to_gradio_plot(viz.loss_curve(np.zeros(0), np.zeros(0))),
                                            label="Loss", elem_id="loss")
                        download = gr.DownloadButton("Download trained model", interactive=False, elem_id="download")
                        upload = gr.File(label="Load a .safetensors model (max 20 MB)", file_types=[".safetensors"],
                                         type="filepath", elem_id="upload", height=120)
                        upload_status = gr.Textbox(label="Upload", interactive=False, elem_id="upload_status")

            with gr.Tab("Learn", id="learn"):
                gr.Markdown(LEARN_MD, latex_delimiters=LATEX)

        sampling_inputs = [temperature, top_k, top_p, seed]
        view_inputs = [layer, head, view]
        explore_outputs = [ws, tokens, status, probs_plot, attn_plot]
        # In the page, a Step draws the attention first and the probability chart right after: each
        # Plotly figure costs the browser ~100 ms to draw, and the attention is what the click is for.
        # A Step takes tens of milliseconds on the server, so no progress overlay either.
        step_inputs = [ws, model_dd, prompt, *sampling_inputs, *view_inputs]
        step_btn.click(step_picture, step_inputs, [ws, tokens, status, attn_plot], api_visibility="private",
                       concurrency_limit=4, concurrency_id="explore", show_progress="hidden").then(
            _probs_figure, ws, probs_plot, queue=False, api_visibility="private", show_progress="hidden")
        # The API's /step returns everything at once (bound to an invisible button: the same handler logic).
        api_step = gr.Button(visible=False)
        api_step.click(step, step_inputs, explore_outputs, api_name="step", concurrency_limit=4,
                       concurrency_id="explore")
        gen_btn.click(generate, [ws, model_dd, prompt, *sampling_inputs, max_new, *view_inputs], explore_outputs,
                      api_name="generate", concurrency_limit=2, concurrency_id="generate", show_progress="hidden")
        undo_btn.click(undo, [ws, *view_inputs], explore_outputs, api_name="undo",
                       concurrency_limit=4, concurrency_id="explore")
        reset_btn.click(reset, [ws, model_dd], [*explore_outputs, prompt], api_name="reset")
        for control in view_inputs:
            control.change(redraw, [ws, *view_inputs], attn_plot, api_name=False,
                           concurrency_limit=4, concurrency_id="explore")
        model_dd.change(select_model, [ws, model_dd],
                        [ws, tokens, status, probs_plot, attn_plot, layer, head, prompt], api_name="select_model")
        pe_tab.select(positional, [ws, model_dd], [pe_table, pe_sim, pe_info], api_name="positional")
        model_dd.change(positional, [ws, model_dd], [pe_table, pe_sim, pe_info], api_name=False)
        corpus.change(lambda c: CORPUS_DESCRIPTIONS.get(c, ""), corpus, corpus_info, api_name=False, queue=False)

        train_btn.click(
            train_model,
            [ws, corpus, pasted, text_file, tok_kind, layers, heads, d_model, d_ff, pos, norm, activation, dropout,
             steps, lr, train_seed],
            [ws, train_status, loss_plot, model_dd, download],
            api_name="train", concurrency_limit=1, concurrency_id="train", show_progress_on=[train_status],
        )
        stop_btn.click(stop_training, ws, train_status, api_name="stop", queue=False)
        upload.upload(upload_model, [ws, upload], [ws, upload_status, model_dd], api_name="upload_model",
                      concurrency_limit=2, concurrency_id="upload")
        demo.load(positional, [ws, model_dd], [pe_table, pe_sim, pe_info], api_name=False)
    return demo


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    sweep_runs()
    demo = build_demo()  # loads the default model: a missing or damaged asset fails here, at start-up
    demo.queue(max_size=int(os.environ.get("DECODER_LAB_QUEUE", "32")))
    demo.launch(
        max_file_size="20mb",
        show_error=False,
        enable_monitoring=False,
        state_session_capacity=300,  # ≈3 MB per session at a full window: bounded near 1 GB
        ssr_mode=False,
        footer_links=[],
        run_history=False,  # nothing to record or sync (its optional Hub bucket would need the network)
        css=CSS,
        allowed_paths=[str(RUNS)],
    )


if __name__ == "__main__":
    main()
