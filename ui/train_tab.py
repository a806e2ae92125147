"""The Train tab: its layout and events (train a model for this session, stop it, upload a model file)."""

from __future__ import annotations

import gradio as gr
import numpy as np

import viz
from lab.limits import (
    ACTIVATIONS, CONCURRENCY, NORMS, POS_ENCODINGS, SEED_RANGE, TEXT_CHARS, TOKENIZER_KINDS, TRAIN_CORPORA,
    TRAIN_LIMITS, UPLOAD_MAX_MB,
)

from .common import RAW, api_example
from .train import corpus_info, stop_training, train_model, upload_model


def build_train_tab(ses: gr.State, model_dd: gr.Dropdown) -> None:
    """Lay out the Train tab (call inside its `gr.Tab`) and bind its events; trained and uploaded
    models join `model_dd`, the Explore tab's model list."""
    L = TRAIN_LIMITS
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

    api_example(pasted, "")
    for file_input in (text_file, upload):
        api_example(file_input, None)
    corpus.change(corpus_info, corpus, info, api_name=False, queue=False, **RAW)
    train_btn.click(train_model, [ses, corpus, pasted, text_file, tok_kind, layers, heads, d_model, d_ff, pos, norm,
                                  activation, dropout, steps, lr, train_seed],
                    [ses, train_status, loss_plot, model_dd, download], api_name="train",
                    concurrency_limit=CONCURRENCY["train"], concurrency_id="train",
                    show_progress_on=[train_status], **RAW)
    stop_btn.click(stop_training, ses, train_status, api_name="stop", queue=False)
    upload.upload(upload_model, [ses, upload], [ses, upload_status, model_dd], api_name="upload_model",
                  concurrency_limit=CONCURRENCY["upload"], concurrency_id="upload", **RAW)
