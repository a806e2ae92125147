"""Decoder Lab: train or load a small GPT-style model and watch what it computes.

Run locally with `python app.py` (http://127.0.0.1:7860) or as a Hugging Face Space. This file
lays out the page and binds each control to its handler; the handlers live in ui/ (one module per
tab): each checks its inputs, calls one verb of the person's `lab.session.Session`, draws with
one `viz` function and returns it.
"""

from __future__ import annotations

import ui.common  # noqa: F401 - first: ZeroGPU's `spaces` must be imported before torch

import logging
import os
from pathlib import Path

import gradio as gr
import torch
from starlette.middleware import Middleware

from lab import files
from lab.limits import (
    ATTENTION_VIEWS, CONCURRENCY, MAX_NEW_TOKENS, MAX_PROMPT_CHARS, QUEUE_SIZE,
    SEED_RANGE, SESSION_CAPACITY, STATE_TTL_S, TEMPERATURE_RANGE, TOP_K_RANGE,
    TOP_P_RANGE, UPLOAD_MAX_MB,
)
from lab.models import DEFAULT_MODEL
from lab.session import Session
from ui.common import RAW, api_example
from ui.explore import (
    attention_figure, generate, probs_figure, redraw, reset, select_model, step, step_picture, undo,
)
from ui.http import RefuseMalformedCalls
from ui.positional import PE_FORMULAS, positional
from ui.train import stop_training, train_model, upload_model
from ui.train_tab import build_train_tab

__all__ = [  # the handlers, importable from here as the API names them (tests and benchmarks call them)
    "attention_figure", "build_demo", "generate", "main", "positional", "probs_figure", "redraw", "reset",
    "select_model", "step", "step_picture", "stop_training", "train_model", "undo", "upload_model",
]

torch.set_num_threads(int(os.environ.get("DECODER_LAB_THREADS", "1")))  # one thread per request: bench/RESULTS.md
LEARN_PATH = Path(__file__).resolve().parent / "assets" / "learn.md"
LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]
CSS = "#tokens .token { font-family: ui-monospace, monospace; }\nfooter { display: none !important; }\n"


def build_demo() -> gr.Blocks:
    first = Session()
    default = first.entry_for(DEFAULT_MODEL)  # loads the default model: a damaged asset fails at start-up
    cfg = default.model.cfg
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
                build_train_tab(ses, model_dd)

            with gr.Tab("Learn", id="learn"):
                gr.Markdown(LEARN_PATH.read_text(encoding="utf-8"), latex_delimiters=LATEX)

        api_example(prompt, default.examples[0])
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
        demo.load(positional, [ses, model_dd], [pe_table, pe_sim, pe_info], api_name=False, **RAW)
    return demo


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    for chatty in ("httpx", "httpcore", "urllib3"):  # one line per request of gradio's own start-up checks
        logging.getLogger(chatty).setLevel(logging.WARNING)
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
