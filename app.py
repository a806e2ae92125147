"""Decoder Lab: train or load a small GPT-style model and watch what it computes.

Run locally with `python app.py` (http://127.0.0.1:7860) or as a Hugging Face Space.
This file is the Gradio wiring only: each handler checks its inputs, calls one verb of the
person's `lab.session.Session`, draws the result with one `viz` function and returns it.
"""

from __future__ import annotations

try:  # ZeroGPU needs `spaces` imported before torch touches CUDA; locally it is absent
    from spaces import GPU as gpu
except ImportError:  # pragma: no cover - depends on the environment
    def gpu(fn=None, **_kwargs):
        return fn if callable(fn) else (lambda f: f)

import contextlib
import functools
import inspect
import json
import logging
import os
import re
import time
from pathlib import Path

import gradio as gr
from starlette.middleware import Middleware
import numpy as np
import torch

import viz
from lab import files
from lab.checks import UserError, check_sampling
from lab.limits import (
    ACTIVATIONS, ATTENTION_VIEWS, CONCURRENCY, MAX_NEW_TOKENS, MAX_PROMPT_CHARS, NORMS, OVERVIEW_MAX_TOKENS,
    POS_ENCODINGS, QUEUE_SIZE, SEED_RANGE, SESSION_CAPACITY, STATE_TTL_S, TEMPERATURE_RANGE, TEXT_CHARS,
    TOKENIZER_KINDS, TOP_K_RANGE, TOP_P_RANGE, TRAIN_CORPORA, TRAIN_LIMITS, UPLOAD_MAX_MB,
)
from lab.budget import LIMITER, client_key
from lab.models import DEFAULT_MODEL
from lab.session import SESSIONS, Session

log = logging.getLogger("decoder_lab")
torch.set_num_threads(int(os.environ.get("DECODER_LAB_THREADS", "1")))  # one thread per request: bench/RESULTS.md
LEARN_PATH = Path(__file__).resolve().parent / "assets" / "learn.md"
LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]
PE_FORMULAS = ("Sinusoidal: $PE_{pos,2i} = \\sin(pos / 10000^{2i/d})$, $PE_{pos,2i+1} = \\cos(pos / 10000^{2i/d})$. "
               "Learned: a trained table of the same shape. RoPE: queries and keys are rotated by the angle "
               "$pos \\cdot 10000^{-2i/d_{head}}$ per pair of dimensions.")
CSS = "#tokens .token { font-family: ui-monospace, monospace; }\nfooter { display: none !important; }\n"


def handler(fn=None, *, exclusive: bool = True, rate: str | None = None):
    """Wrap an event handler so that every error reaches the person as a message.

    A refusal (`UserError`, or a ValueError from a check) shows its own text; anything else is
    logged with its traceback and shown as a generic message, never with internal details.
    With `exclusive`, the handler holds its session (first argument) for the whole call, a
    streaming one until its last update or its cancellation: one action per session at a time.
    """
    if fn is None:
        return functools.partial(handler, exclusive=exclusive, rate=rate)

    def prepared(args) -> list:
        """The server's own session for this tab in place of gradio's copy (lab.budget.SessionStore),
        after the client's rate for `rate` actions is checked."""
        args = list(args)
        request = next((a for a in args if isinstance(a, gr.Request)), None)
        if request is not None and args and isinstance(args[0], Session):
            host = request.client.host if request.client else None
            client = client_key(host, request.headers.get("x-forwarded-for"))
            args[0] = SESSIONS.resolve(request.session_hash, client, args[0])
            if rate is not None:
                LIMITER.check(client, rate)
        return args

    def turn(args):
        held = exclusive and args and isinstance(args[0], Session)
        return args[0].turn() if held else contextlib.nullcontext()

    def message(exc: Exception) -> gr.Error:
        if isinstance(exc, gr.Error):
            return exc
        if isinstance(exc, ValueError):
            log.info("refused %s: %s", fn.__name__, exc)  # one line: a refusal is not a fault
            return gr.Error(str(exc), print_exception=False)
        log.exception("unexpected error in %s", fn.__name__)
        return gr.Error("Something went wrong on the server; the error was logged. Try again or reset.")

    def wrapped(*args):
        try:
            args = prepared(args)
            with turn(args):
                return fn(*args)
        except Exception as exc:
            raise message(exc) from None

    def wrapped_gen(*args):  # gradio streams a handler only if it is a generator function itself
        try:
            args = prepared(args)
            with turn(args):
                yield from fn(*args)
        except Exception as exc:
            raise message(exc) from None

    return functools.wraps(fn)(wrapped_gen if inspect.isgeneratorfunction(fn) else wrapped)


# ------------------------------------------------------------------------ API values


# Every event hands its inputs to the handler as they were sent (`preprocess=False`): gradio's own
# input checks refuse bad API values before any handler runs, with messages that show Python type
# reprs and server paths and name no argument. Our handlers check every value first (lab.checks)
# and refuse it by name, changing nothing. Files still pass gradio's upload checks and arrive as
# a FileData dict, whose cached path `file_path` takes.
RAW = dict(preprocess=False)


def file_path(value, suffix: str) -> str | None:
    """The server-side path of an uploaded file as a handler receives it (None when there is none).

    Its name must end with `suffix` (gradio's own check of `file_types` is one we skip).
    """
    path = value.get("path") if isinstance(value, dict) else value
    if path is None or path == "":
        return None
    name = value.get("orig_name") or path if isinstance(value, dict) else path
    if not isinstance(path, str) or not isinstance(name, str) or not name.lower().endswith(suffix):
        raise UserError(f"Choose a {suffix} file.")
    return path


def api_example(component, value):
    """Show `value` as this input's example in view_api() (a valid prompt; no file from the web)."""
    component.example_payload = component.example_value = lambda: value


# ------------------------------------------------------------------------------ figures


def message_plot(text: str):
    return viz.to_gradio_plot(viz.message_figure(text))


def attention_figure(session: Session, layer, head, view):
    """The attention picture of the session's current text, for a gr.Plot."""
    att = session.attention()
    if att is None:
        return message_plot("Press Step or Generate to see attention.")
    v = session.check_view(session.entry.name, layer, head, view)
    return viz.to_gradio_plot(viz.attention_view(att.weights, att.scores, att.tokens, layer=v.layer, head=v.head,
                                                 view=v.view, causal=att.causal,
                                                 overview_max_tokens=OVERVIEW_MAX_TOKENS))


def probs_figure(session: Session):
    p = session.probabilities()
    if p is None:
        return message_plot("Next-token probabilities appear after the first step.")
    return viz.to_gradio_plot(viz.probabilities(p.pieces, p.probs, adjusted=p.adjusted, chosen=p.chosen, top=10))


def loss_figure(run):
    arr = functools.partial(np.array, dtype=np.float32)
    return viz.to_gradio_plot(viz.loss_curve(arr(run.steps), arr(run.train_loss), arr(run.val_steps),
                                             arr(run.val_loss)))


def explore_outputs(session: Session, layer, head, view):
    return (session, session.tokens(), session.status(), probs_figure(session),
            attention_figure(session, layer, head, view))


# ----------------------------------------------------------------------------- Explore


@handler
def step(session, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view,
         request: gr.Request = None):
    """One new token: sample from the model's distribution, then show what it attended to."""
    sampling = check_sampling(temperature, top_k, top_p, seed)
    session.check_view(model_name, layer, head, view)
    session.step(model_name, prompt, sampling)
    return explore_outputs(session, layer, head, view)


@handler
def step_picture(session, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view,
                 request: gr.Request = None):
    """`step` without the probability chart, which the page fetches right after the picture."""
    sampling = check_sampling(temperature, top_k, top_p, seed)
    session.check_view(model_name, layer, head, view)
    session.step(model_name, prompt, sampling)
    return session, session.tokens(), session.status(), attention_figure(session, layer, head, view)


@gpu
@handler(rate="generate")
def generate(session, model_name, prompt, temperature, top_k, top_p, seed, max_new, layer, head, view,
             request: gr.Request = None):
    """Generate up to `max_new` tokens from the prompt (restarting it), streaming the text."""
    sampling = check_sampling(temperature, top_k, top_p, seed)
    session.check_view(model_name, layer, head, view)
    last_yield = 0.0
    for s in session.generate(model_name, prompt, sampling, max_new):
        if time.perf_counter() - last_yield > 0.3 and not s.eos:  # the text streams; the figures come at the end
            last_yield = time.perf_counter()
            yield session, session.tokens(), session.status(), gr.skip(), gr.skip()
    yield explore_outputs(session, layer, head, view)


@handler
def undo(session, layer, head, view, request: gr.Request = None):
    if session.entry is not None:
        session.check_view(session.entry.name, layer, head, view)
    session.undo()
    return explore_outputs(session, layer, head, view)


@handler
def reset(session, model_name, request: gr.Request = None):
    examples = session.entry_for(model_name).examples  # checked before the text goes
    session.reset()
    return (session, [], "", probs_figure(session), message_plot("Press Step or Generate to see attention."),
            examples[0] if examples else "")


@handler
def redraw(session, layer, head, view, request: gr.Request = None):
    return attention_figure(session, layer, head, view)


@handler
def select_model(session, model_name, request: gr.Request = None):
    entry = session.select_model(model_name)
    cfg = entry.model.cfg
    return (session, [], entry.summary, probs_figure(session), message_plot("Press Step or Generate."),
            gr.update(choices=list(range(cfg.n_layers)), value=0),
            gr.update(choices=["all", *range(cfg.n_heads)], value="all"),
            gr.update(value=entry.examples[0] if entry.examples else ""))


@handler
def positional(session, model_name, request: gr.Request = None):
    entry, kind, table = session.positional(model_name)
    if table is None:
        fig = viz.to_gradio_plot(viz.no_positional_encoding())
        return fig, fig, f"**{entry.name}** uses no positional encoding."
    what = "rotation angles (one per pair of dimensions in each head)." if kind == "rope" else "dimensions."
    return (viz.to_gradio_plot(viz.positional_table(table, kind)),
            viz.to_gradio_plot(viz.positional_similarity(table, kind)),
            f"**{entry.name}** uses **{kind}** positions: table of {table.shape[0]} positions × {table.shape[1]} "
            + what)


# ------------------------------------------------------------------------------- Train


@gpu(duration=200)
@handler(exclusive=False, rate="train")  # a run takes minutes: Explore stays usable meanwhile
def train_model(session, corpus_name, pasted, upload, tokenizer_kind, layers, heads, d_model, d_ff, pos, norm,
                activation, dropout, steps, lr, seed, request: gr.Request = None):
    """Train a new model for this session, streaming the loss curve; Stop keeps what was learned."""
    progress = session.train(corpus_name, pasted, file_path(upload, ".txt"), tokenizer_kind, layers, heads, d_model,
                             d_ff, pos, norm, activation, dropout, steps, lr, seed)
    last_yield = 0.0
    for p in progress:
        if p.done:
            yield (session, p.message, loss_figure(p.run), gr.update(choices=session.model_names(), value=p.run.name),
                   gr.update(value=str(p.download), interactive=True))
        elif time.perf_counter() - last_yield > 0.5:
            last_yield = time.perf_counter()
            yield session, p.message, loss_figure(p.run), gr.skip(), gr.skip()


@handler(exclusive=False)  # Stop must not wait for the action it stops
def stop_training(session, request: gr.Request = None):
    session.stop_training()
    return "Stopping…"


@handler(rate="upload")
def upload_model(session, path, request: gr.Request = None):
    """Load a .safetensors checkpoint into this session after validating it."""
    name = session.upload(file_path(path, ".safetensors"))
    return (session, f"Loaded '{name}'. It is now in the Explore model list.",
            gr.update(choices=session.model_names(), value=name))


def corpus_info(name) -> str:
    return "**{}**: {}".format(*TRAIN_CORPORA[name]) if name in TRAIN_CORPORA else ""


# ------------------------------------------------------------------------------ HTTP


class RefuseMalformedCalls:
    """ASGI middleware: a call to an unknown endpoint, or with the wrong number of values or a
    non-finite number, gets a 4xx and a plain message before gradio's routes see it (they answer
    such calls with HTTP 500 or an empty error)."""

    CALL = re.compile(r"^/gradio_api/(?:(queue/join)|(?:call|run)/(?:v2/)?([^/]+))/?$")
    MAX_BODY = 16 * 2**20  # the largest valid call: 1.2 M characters of pasted text, JSON-escaped (≤ 12 B each)

    def __init__(self, app, blocks: gr.Blocks):
        self.app, self.blocks = app, blocks

    async def __call__(self, scope, receive, send):
        match = self.CALL.match(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.MAX_BODY:
                return await self.refuse(send, 413, "The request is too large.")
        problem = self.problem(match.group(2), body)
        if problem:
            log.info("refused HTTP call %s: %s", scope["path"][:80], problem[1])
            return await self.refuse(send, *problem)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def problem(self, api_name: str | None, body: bytes) -> tuple[int, str] | None:
        def finite_only(token):
            raise ValueError(token)

        try:
            payload = json.loads(body, parse_constant=finite_only)
        except ValueError:
            return 400, "The request is not valid JSON with finite numbers."
        if not isinstance(payload, dict):
            return 400, "The request must be a JSON object."
        fns, index = self.blocks.fns, payload.get("fn_index")
        if index is not None or api_name is None:  # the page's own calls name a function by index
            fn = fns.get(index) if isinstance(index, int) and not isinstance(index, bool) else None
            if fn is None:
                return 404, "There is no such function."
        else:
            fn = next((f for f in fns.values() if f.api_name == api_name), None)
            if fn is None:
                return 404, f"There is no API endpoint named {api_name[:40]!r}."
            if isinstance(payload.get("data"), dict):  # /call/v2: values by name, checked by gradio
                return None
        data = payload.get("data")
        counts = {len(fn.inputs), len([b for b in fn.inputs if not getattr(b, "skip_api", False)])}
        if not isinstance(data, list) or len(data) not in counts:
            got = len(data) if isinstance(data, list) else "none"
            return 400, f"This call needs {min(counts)} values; it sent {got}."
        return None

    @staticmethod
    async def refuse(send, status: int, message: str):
        raw = json.dumps({"error": message, "detail": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
        await send({"type": "http.response.body", "body": raw})


# ---------------------------------------------------------------------------------- UI


def build_demo() -> gr.Blocks:
    first = Session()
    default = first.entry_for(DEFAULT_MODEL)  # loads the default model: a damaged asset fails at start-up
    cfg = default.model.cfg
    L = TRAIN_LIMITS
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # nothing leaves the machine
    with gr.Blocks(title="Decoder Lab", delete_cache=(600, 3600), analytics_enabled=False) as demo:
        ses = gr.State(Session(), time_to_live=STATE_TTL_S, delete_callback=Session.close)
        gr.Markdown("# Decoder Lab\nA small GPT-style transformer you can step through, one token at a time.")
        with gr.Tabs():
            with gr.Tab("Explore", id="explore"):
                with gr.Row():
                    model_dd = gr.Dropdown(first.model_names(), value=DEFAULT_MODEL, label="Model", elem_id="model",
                                           scale=1)
                    prompt = gr.Textbox(default.examples[0], label="Prompt", elem_id="prompt", scale=3, max_lines=3,
                                        max_length=MAX_PROMPT_CHARS)
                with gr.Accordion("Sampling", open=False):
                    with gr.Row():
                        temperature = gr.Slider(*TEMPERATURE_RANGE, value=0.8, step=0.05,
                                                label="Temperature (0 = greedy)", elem_id="temperature")
                        top_k = gr.Slider(*TOP_K_RANGE, value=0, step=1, label="Top-k (0 = off)", elem_id="top_k")
                        top_p = gr.Slider(*TOP_P_RANGE, value=1.0, step=0.05, label="Top-p (1 = off)", elem_id="top_p")
                        seed = gr.Number(0, label="Seed", precision=0, minimum=SEED_RANGE[0], maximum=SEED_RANGE[1],
                                         elem_id="seed")
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
                        probs_plot = gr.Plot(probs_figure(first), label="Next-token probabilities", elem_id="probs")
                with gr.Row():
                    layer = gr.Dropdown(list(range(cfg.n_layers)), value=0, label="Layer", elem_id="layer")
                    head = gr.Dropdown(["all", *range(cfg.n_heads)], value="all", label="Head", elem_id="head")
                    view = gr.Radio(list(ATTENTION_VIEWS), value="weights", label="View", elem_id="view")
                attn_plot = gr.Plot(attention_figure(first, 0, "all", "weights"),
                                    label="Masked self-attention (rows: queries, columns: keys)", elem_id="attention")

            with gr.Tab("Positional encoding", id="positional") as pe_tab:
                pe_info = gr.Markdown()
                gr.Markdown(PE_FORMULAS, latex_delimiters=LATEX)
                with gr.Row():
                    pe_table = gr.Plot(label="Positions × dimensions", elem_id="pe_table")
                    pe_sim = gr.Plot(label="Similarity of positions (cosine)", elem_id="pe_sim")

            with gr.Tab("Train", id="train"):
                gr.Markdown("Train a new model for this session (runs are temporary: download what you want to keep).")
                with gr.Row():
                    with gr.Column(scale=1):
                        with gr.Row():
                            corpus = gr.Dropdown(list(TRAIN_CORPORA), value="sort", label="Corpus", elem_id="corpus")
                            tok_kind = gr.Radio(list(TOKENIZER_KINDS), value="char",
                                                label="Tokenizer (grammar / own text)", elem_id="tokenizer")
                        info = gr.Markdown(corpus_info("sort"))
                        with gr.Accordion("Your own text", open=False):
                            pasted = gr.Textbox("", label=f"Paste text ({TEXT_CHARS[0]:,}–{TEXT_CHARS[1]:,} characters)",
                                                lines=4, max_length=TEXT_CHARS[1], elem_id="pasted")
                            text_file = gr.File(label="…or upload a UTF-8 .txt file", file_types=[".txt"],
                                                type="filepath", elem_id="text_file", height=120)
                        with gr.Row():
                            layers = gr.Slider(*L["layers"], value=2, step=1, label="Layers", elem_id="layers")
                            heads = gr.Slider(*L["heads"], value=4, step=1, label="Heads", elem_id="heads")
                        with gr.Row():
                            d_model = gr.Slider(*L["d_model"], value=64, step=8, label="d_model", elem_id="d_model")
                            d_ff = gr.Slider(*L["d_ff"], value=256, step=32, label="d_ff (0 = none)", elem_id="d_ff")
                        with gr.Row():
                            pos = gr.Dropdown(list(POS_ENCODINGS), value="learned", label="Positional encoding",
                                              elem_id="pos")
                            norm = gr.Dropdown(list(NORMS), value="pre", label="Norm placement", elem_id="norm")
                        with gr.Row():
                            activation = gr.Dropdown(list(ACTIVATIONS), value="gelu", label="Activation",
                                                     elem_id="activation")
                            dropout = gr.Slider(*L["dropout"], value=0.0, step=0.05, label="Dropout",
                                                elem_id="dropout")
                        with gr.Row():
                            steps = gr.Slider(10, L["steps"][1], value=300, step=10, label="Steps", elem_id="steps")
                            lr = gr.Number(3e-3, label="Learning rate", minimum=L["learning rate"][0],
                                           maximum=L["learning rate"][1], elem_id="lr")
                            train_seed = gr.Number(0, label="Seed", precision=0, minimum=SEED_RANGE[0],
                                                   maximum=SEED_RANGE[1], elem_id="train_seed")
                    with gr.Column(scale=1):
                        with gr.Row():
                            train_btn = gr.Button("Train", variant="primary", elem_id="train_btn")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop_btn")
                        train_status = gr.Textbox(label="Training", interactive=False, elem_id="train_status")
                        loss_plot = gr.Plot(viz.to_gradio_plot(viz.loss_curve(np.zeros(0), np.zeros(0))),
                                            label="Loss", elem_id="loss")
                        download = gr.DownloadButton("Download trained model", interactive=False, elem_id="download")
                        upload = gr.File(label=f"Load a .safetensors model (max {UPLOAD_MAX_MB} MB)",
                                         file_types=[".safetensors"], type="filepath", elem_id="upload", height=120)
                        upload_status = gr.Textbox(label="Upload", interactive=False, elem_id="upload_status")

            with gr.Tab("Learn", id="learn"):
                gr.Markdown(LEARN_PATH.read_text(encoding="utf-8"), latex_delimiters=LATEX)

        api_example(prompt, default.examples[0])
        api_example(pasted, "")
        for file_input in (text_file, upload):
            api_example(file_input, None)
        sampling = [temperature, top_k, top_p, seed]
        views = [layer, head, view]
        explore = [ses, tokens, status, probs_plot, attn_plot]
        explore_group = dict(concurrency_limit=CONCURRENCY["explore"], concurrency_id="explore", **RAW)
        step_inputs = [ses, model_dd, prompt, *sampling, *views]
        # In the page a Step draws the attention first and the probability chart right after: the
        # attention is what the click is for. A Step takes milliseconds, so no progress overlay.
        step_btn.click(step_picture, step_inputs, [ses, tokens, status, attn_plot], api_visibility="private",
                       show_progress="hidden", **explore_group).then(
            probs_figure, ses, probs_plot, queue=False, api_visibility="private", show_progress="hidden")
        # The API's /step returns everything at once (an invisible button: the same handler logic).
        gr.Button(visible=False).click(step, step_inputs, explore, api_name="step", **explore_group)
        gen_btn.click(generate, [ses, model_dd, prompt, *sampling, max_new, *views], explore, api_name="generate",
                      concurrency_limit=CONCURRENCY["generate"], concurrency_id="generate", show_progress="hidden",
                      **RAW)
        undo_btn.click(undo, [ses, *views], explore, api_name="undo", **explore_group)
        reset_btn.click(reset, [ses, model_dd], [*explore, prompt], api_name="reset", **RAW)
        for control in views:
            control.change(redraw, [ses, *views], attn_plot, api_name=False, **explore_group)
        model_dd.change(select_model, [ses, model_dd],
                        [ses, tokens, status, probs_plot, attn_plot, layer, head, prompt],
                        api_name="select_model", **RAW)
        pe_tab.select(positional, [ses, model_dd], [pe_table, pe_sim, pe_info], api_name="positional", **RAW)
        model_dd.change(positional, [ses, model_dd], [pe_table, pe_sim, pe_info], api_name=False, **RAW)
        corpus.change(corpus_info, corpus, info, api_name=False, queue=False, **RAW)
        train_btn.click(train_model, [ses, corpus, pasted, text_file, tok_kind, layers, heads, d_model, d_ff, pos, norm,
                                      activation, dropout, steps, lr, train_seed],
                        [ses, train_status, loss_plot, model_dd, download], api_name="train",
                        concurrency_limit=CONCURRENCY["train"], concurrency_id="train",
                        show_progress_on=[train_status], **RAW)
        stop_btn.click(stop_training, ses, train_status, api_name="stop", queue=False)
        upload.upload(upload_model, [ses, upload], [ses, upload_status, model_dd], api_name="upload_model",
                      concurrency_limit=CONCURRENCY["upload"], concurrency_id="upload", **RAW)
        demo.load(positional, [ses, model_dd], [pe_table, pe_sim, pe_info], api_name=False, **RAW)
    return demo


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    files.sweep_runs()
    demo = build_demo()
    demo.queue(max_size=QUEUE_SIZE)
    demo.launch(max_file_size=f"{UPLOAD_MAX_MB}mb", show_error=False, enable_monitoring=False,
                state_session_capacity=SESSION_CAPACITY, ssr_mode=False, footer_links=[],
                run_history=False,  # nothing to record (its optional Hub bucket would need the network)
                css=CSS, allowed_paths=[str(files.RUNS)],
                app_kwargs={"middleware": [Middleware(RefuseMalformedCalls, blocks=demo)]})


if __name__ == "__main__":
    main()
