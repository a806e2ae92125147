"""The Train tab's handlers: train a model for this session (streamed), stop it, upload a model file."""

from __future__ import annotations

import functools
import time

import gradio as gr
import numpy as np

import viz
from lab.limits import TRAIN_CORPORA

from .common import file_path, gpu, handler


def loss_figure(run):
    arr = functools.partial(np.array, dtype=np.float32)
    return viz.to_gradio_plot(viz.loss_curve(arr(run.steps), arr(run.train_loss), arr(run.val_steps),
                                             arr(run.val_loss)))


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
