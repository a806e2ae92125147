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
import numpy as np
import torch
from starlette.middleware import Middleware

import viz
from lab import files
from lab.limits import (
    ACTIVATIONS, ATTENTION_VIEWS, CONCURRENCY, MAX_NEW_TOKENS, MAX_PROMPT_CHARS, NORMS, POS_ENCODINGS, QUEUE_SIZE,
    SEED_RANGE, SESSION_CAPACITY, STATE_TTL_S, TEMPERATURE_RANGE, TEXT_CHARS, TOKENIZER_KINDS, TOP_K_RANGE,
    TOP_P_RANGE, TRAIN_CORPORA, TRAIN_LIMITS, UPLOAD_MAX_MB,
)
from lab.models import DEFAULT_MODEL
from lab.session import Session
from ui.common import RAW, api_example
from ui.explore import (
    attention_figure, generate, probs_figure, redraw, reset, select_model, step, step_picture, undo,
)
from ui.http import RefuseMalformedCalls
from ui.positional import PE_FORMULAS, positional
from ui.train import corpus_info, stop_training, train_model, upload_model

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
