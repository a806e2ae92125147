"""The Train tab: its layout and events (train a model for this session, stop it, upload a model file)."""

from __future__ import annotations

import gradio as gr
import numpy as np

import viz
from lab.limits import (
    ACTIVATIONS, CONCURRENCY, MAX_PROMPT_CHARS, NORMS, POS_ENCODINGS, SEED_RANGE, TEXT_CHARS, TOKENIZER_KINDS, TRAIN_CORPORA,
    TRAIN_LIMITS, UPLOAD_MAX_MB,
)
from lab.session import Session

from .common import RAW, api_example
from .plots import to_plot
from .train import (
    OWN_TOKENIZER, corpus_defaults, corpus_info, progress_html, stop_training, train_model, upload_model, upload_refused,
)

FIRST_CORPUS = "sort"


def build_train_tab(ses: gr.State, model_dd: gr.Dropdown) -> None:
    """Lay out the Train tab (call inside its `gr.Tab`) and bind its events; trained and uploaded
    models join `model_dd`, the Explore tab's model list."""
    L = TRAIN_LIMITS
    D = Session.train_defaults(FIRST_CORPUS)  # the form starts as the recipe of the first corpus's built-in model
    gr.Markdown("Train a new model for this session (runs are temporary: download what you want to keep).")
    with gr.Row():
        with gr.Column(scale=1):
            with gr.Row():
                corpus = gr.Dropdown(list(TRAIN_CORPORA), value=FIRST_CORPUS, label="Corpus", elem_id="corpus")
                tok_kind = gr.Radio(list(TOKENIZER_KINDS), value=D["tokenizer"], label="Tokenizer (grammar / own text)",
                                    interactive=FIRST_CORPUS in OWN_TOKENIZER, elem_id="tokenizer")
            info = gr.Markdown(corpus_info(FIRST_CORPUS))
            gr.Markdown("Picking a corpus sets the form to the recipe of its built-in model (your own text: the "
                        "Shakespeare model's); change anything before you train.", elem_id="recipe_note")
            with gr.Accordion("Your own text", open=False):
                pasted = gr.Textbox("", label=f"Paste text ({TEXT_CHARS[0]:,}–{TEXT_CHARS[1]:,} characters)",
                                    lines=4, max_length=TEXT_CHARS[1], elem_id="pasted")
                text_file = gr.File(label="…or upload a UTF-8 .txt file", file_types=[".txt"],
                                    type="filepath", elem_id="text_file", height=120)
            with gr.Row():
                layers = gr.Slider(*L["layers"], value=D["layers"], step=1, label="Layers", elem_id="layers")
                heads = gr.Slider(*L["heads"], value=D["heads"], step=1, label="Heads", elem_id="heads")
            with gr.Row():
                d_model = gr.Slider(*L["d_model"], value=D["d_model"], step=8, label="d_model", elem_id="d_model")
                d_ff = gr.Slider(*L["d_ff"], value=D["d_ff"], step=32, label="d_ff (0 = none)", elem_id="d_ff")
            with gr.Row():
                pos = gr.Dropdown(list(POS_ENCODINGS), value=D["pos_encoding"], label="Positional encoding",
                                  elem_id="pos")
                norm = gr.Dropdown(list(NORMS), value=D["norm"], label="Norm placement", elem_id="norm")
            with gr.Row():
                activation = gr.Dropdown(list(ACTIVATIONS), value=D["activation"], label="Activation",
                                         elem_id="activation")
                dropout = gr.Slider(*L["dropout"], value=D["dropout"], step=0.05, label="Dropout",
                                    elem_id="dropout")
            with gr.Row():
                steps = gr.Slider(10, L["steps"][1], value=D["steps"], step=10, label="Steps", elem_id="steps")
                lr = gr.Number(D["lr"], label="Learning rate", minimum=L["learning rate"][0],
                               maximum=L["learning rate"][1], elem_id="lr")
                train_seed = gr.Number(0, label="Seed", precision=0, minimum=SEED_RANGE[0],
                                       maximum=SEED_RANGE[1], elem_id="train_seed")
            keep_best = gr.Checkbox(True, label="Keep best: end with the weights of the lowest validation loss",
                                    elem_id="keep_best")
            probe = gr.Textbox("", label="Film probe prompt (empty: a held-out example of the corpus)",
                               elem_id="probe", max_lines=1, max_length=MAX_PROMPT_CHARS)
        with gr.Column(scale=1):
            with gr.Row():
                train_btn = gr.Button("Train", variant="primary", elem_id="train_btn")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop_btn")
            train_progress = gr.HTML(progress_html(), elem_id="train_progress")
            train_status = gr.Textbox(label="Training", interactive=False, lines=2, elem_id="train_status")
            loss_plot = gr.Plot(to_plot(viz.loss_curve(np.zeros(0), np.zeros(0), total_steps=D["steps"])),
                                label="Loss", elem_id="loss")
            download = gr.DownloadButton("Download trained model", interactive=False, elem_id="download")
            upload = gr.File(label=f"Load a .safetensors model (max {UPLOAD_MAX_MB} MB)",
                             file_types=[".safetensors"], type="filepath", elem_id="upload", height=120)
            upload_status = gr.Textbox(label="Upload", interactive=False, elem_id="upload_status")

    api_example(pasted, "")
    api_example(probe, "")
    for file_input in (text_file, upload):
        api_example(file_input, None)
    corpus.change(corpus_defaults, corpus, [info, tok_kind, layers, heads, d_model, d_ff, pos, norm, activation, dropout,
                                            steps, lr], api_name=False, queue=False, **RAW)
    train_btn.click(train_model, [ses, corpus, pasted, text_file, tok_kind, layers, heads, d_model, d_ff, pos, norm,
                                  activation, dropout, steps, lr, train_seed, keep_best, probe],
                    [ses, train_status, loss_plot, model_dd, download, train_progress], api_name="train",
                    concurrency_limit=CONCURRENCY["train"], concurrency_id="train",
                    show_progress_on=[train_status], **RAW)
    stop_btn.click(stop_training, ses, train_status, api_name="stop", queue=False)
    uploaded = upload.upload(upload_model, [ses, upload], [ses, upload_status, model_dd], api_name="upload_model",
                             concurrency_limit=CONCURRENCY["upload"], concurrency_id="upload", **RAW)
    # a refused file leaves the box (nothing was loaded) and the status says why; nothing else changes
    uploaded.failure(upload_refused, ses, [upload, upload_status], api_visibility="private", queue=False, **RAW)
