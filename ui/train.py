"""The Train tab's handlers: train a model for this session (streamed), stop it, upload a model file."""

from __future__ import annotations

import functools
import html
import time

import gradio as gr
import numpy as np

import viz
from lab.export import model_stem
from lab.checks import check_choice, check_text
from lab.limits import STOP_WAIT_S, TOKENIZER_KINDS, TRAIN_CORPORA, TRAIN_MAX_SECONDS
from lab.recipe import OWN_TOKENIZER
from lab.session import Session, TrainingRun, removed_note

from .common import file_path, gpu, handler, named
from .plots import to_plot

# The form's controls set by a corpus's recipe, in the order `corpus_defaults` returns them.
RECIPE_KEYS = ("tokenizer", "layers", "heads", "d_model", "d_ff", "pos_encoding", "norm", "activation", "dropout",
               "steps", "lr")


def loss_figure(run: TrainingRun):
    arr = functools.partial(np.array, dtype=np.float32)
    restored = run.kept_step is not None and run.kept_step != run.step
    fig = viz.loss_curve(arr(run.steps), arr(run.train_loss), arr(run.val_steps), arr(run.val_loss),
                         total_steps=max(1, run.total_steps), kept_step=run.kept_step if restored else None)
    return to_plot(named(fig, model_stem(run.name), "loss", f"step{run.step}"))


def _seconds(s: float) -> str:
    s = max(0.0, s)
    return f"{s:.0f} s" if s < 90 else f"{int(s // 60)} min {int(round(s % 60)):02d} s"


def progress_html(run: TrainingRun | None = None) -> str:
    """A progress bar with the steps done, the time elapsed and an estimate of the time left.

    The estimate is the time per step so far times the steps left (capped by the time limit,
    which is said when it will end the run first)."""
    if run is None:
        done, total, text = 0, 1, "No training yet."
    else:
        done, total = run.step, max(1, run.total_steps)
        if run.done:
            text = f"{done} / {total} steps in {_seconds(run.elapsed)}"
            if done < total:
                text += " (ended early)"
            if run.kept_step is not None and run.kept_step != done:
                text += f"; weights kept from step {run.kept_step}"
        elif done == 0:
            text = f"step 0 / {total} · preparing…"
        else:
            text = (f"step {done} / {total} · {_seconds(run.elapsed)} elapsed · "
                    f"about {_seconds(run.seconds_left())} left")
            by_rate = run.elapsed / done * (total - done)
            if run.max_seconds is not None and by_rate > run.max_seconds - run.elapsed:
                text += f" (the {run.max_seconds:g} s time limit ends it first)"
    return ('<div class="train-progress" style="display:flex;flex-direction:column;gap:2px">'
            f'<progress value="{done}" max="{total}" aria-label="training progress" style="width:100%;height:14px">'
            f'{100 * done / total:.0f}%</progress>'
            f'<span style="font-size:var(--text-sm)">{html.escape(text)}</span></div>')


def gpu_seconds(session, corpus_name, pasted, upload, tokenizer_kind, layers, heads, d_model, d_ff, pos, norm,
                activation, dropout, steps, *rest, **kw) -> int:
    """The GPU time a training asks ZeroGPU for: its steps at a cautious pace, plus start-up and the
    film, never past the run's wall-clock limit (a visitor's quota is spent by what is asked)."""
    try:
        n = int(steps)
    except (TypeError, ValueError):
        n = 0
    return int(min(TRAIN_MAX_SECONDS + 20, 20 + GPU_SECONDS_PER_STEP * max(0, n)))


GPU_SECONDS_PER_STEP = 0.05  # the Train tab's largest model runs well under this on a GPU (bench/RESULTS.md)


@gpu(duration=gpu_seconds)
@handler(exclusive=False, rate="train")  # a run takes minutes: Explore stays usable meanwhile
def train_model(session, corpus_name, pasted, upload, tokenizer_kind, layers, heads, d_model, d_ff, pos, norm,
                activation, dropout, steps, lr, seed, keep_best=True, probe=None, request: gr.Request = None):
    """Train a new model for this session, streaming the loss curve and a progress bar; Stop keeps what
    was learned. With keep_best, the model kept is the one of the lowest validation loss seen."""
    check_text("The pasted text", pasted, optional=True)  # used by the "text" corpus only, but always text
    if tokenizer_kind is not None:  # the page sends its choice even where the corpus brings its own tokenizer
        check_choice("tokenizer", tokenizer_kind, TOKENIZER_KINDS)
    progress = session.train(corpus_name=corpus_name, pasted=pasted, upload=file_path(upload, ".txt"),
                             tokenizer_kind=tokenizer_kind, layers=layers, heads=heads, d_model=d_model, d_ff=d_ff,
                             pos=pos, norm=norm, activation=activation, dropout=dropout, steps=steps, lr=lr, seed=seed,
                             keep_best=keep_best, probe=None if probe in (None, "") else probe)
    last_yield = 0.0
    for p in progress:
        if p.done:
            yield (session, p.message, loss_figure(p.run), gr.update(choices=session.model_names(), value=p.run.name),
                   gr.update(value=str(p.download), interactive=True), progress_html(p.run))
        elif time.perf_counter() - last_yield > 0.5:
            last_yield = time.perf_counter()
            yield session, p.message, loss_figure(p.run), gr.skip(), gr.skip(), progress_html(p.run)


@handler(exclusive=False)  # Stop must not wait for the action it stops
def stop_training(session, request: gr.Request = None):
    """Stop the session's training; the answer is the status the run ended with ("Stopping…" if it has not
    ended within STOP_WAIT_S). The page writes it into the status box the run's own last update writes, so
    whichever of the two arrives last, the box says how the run ended."""
    return session.training.stop(wait=STOP_WAIT_S) or "Stopping…"


@handler(rate="upload")
def upload_model(session, path, request: gr.Request = None):
    """Load a .safetensors checkpoint into this session after validating it."""
    with session.training.upload_refusal():  # a refusal is kept for `upload_refused` to tell
        name, removed = session.upload_noting_removed(file_path(path, ".safetensors"))
    status = " ".join(filter(None, [f"Loaded '{name}'. It is now in the Explore model list.", removed_note(removed)]))
    return session, status, gr.update(choices=session.model_names(), value=name)


@handler(exclusive=False)
def upload_refused(session, request: gr.Request = None):
    """After a refused upload: the file box is emptied (nothing was loaded) and the status says why."""
    why = session.training.refused_upload() or "The file was not loaded."
    return None, f"{why} Nothing was loaded."


def corpus_info(name) -> str:
    return "**{}**: {}".format(*TRAIN_CORPORA[name]) if name in TRAIN_CORPORA else ""


@handler
def corpus_defaults(name) -> tuple:
    """The line under the corpus, then the form set to the recipe of that corpus's built-in model
    (Session.train_defaults); the tokenizer can be chosen only where the corpus does not
    bring its own."""
    check_choice("corpus", name, TRAIN_CORPORA)
    form = Session.train_defaults(name)
    tokenizer = gr.update(value=form["tokenizer"], interactive=name in OWN_TOKENIZER)
    return (corpus_info(name), tokenizer, *(form[k] for k in RECIPE_KEYS[1:]))
