"""A person's training run: the Train form checked, the corpus and configs made from it (the recipe
is lab.recipe's), the run's record as it goes (`TrainingRun`) and what it reports (`TrainProgress`).

The session starts a run and holds its lock only while the new model joins its models; the run
itself goes on beside the session's other actions and can be stopped at any step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch

from model.corpora import Corpus, Stopped, build_corpus, read_text_file
from model.film import FILM_FRAMES, MAX_PROBE_TOKENS, Film, default_probe
from model.heads import task_of
from model.train import TrainConfig, train, well_above_best
from model.transformer import DecoderLM

from .catalogue.models import ModelEntry, usable_examples
from .catalogue.ownmodels import removed_note
from .checks import UserError, check_choice, check_float, check_int
from .limits import (
    ACTIVATIONS, CHECKPOINT_LIMITS, NORMS, POS_ENCODINGS, TOKENIZER_KINDS, TRAIN_CORPORA, TRAIN_LIMITS,
    TRAIN_MAX_SECONDS,
)
from .recipe import OWN_TOKENIZER, bf16_choice, train_tab_recipe

# Training runs on the GPU only when asked (or on ZeroGPU); stepping a model this small is fastest on the CPU.
TRAIN_DEVICE = os.environ.get("DECODER_LAB_DEVICE") or ("cuda" if os.environ.get("SPACES_ZERO_GPU") else "cpu")
STOP_REASONS = {"finished": "finished", "stopped": "stopped by you", "time limit": "hit the time limit"}


@dataclass
class TrainingRun:
    """A training's record as it goes: the losses, where it stands, and what made room for it."""

    name: str
    stop: threading.Event = field(default_factory=threading.Event)
    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    done: bool = False
    total_steps: int = 0  # the steps asked for
    step: int = 0  # steps done
    elapsed: float = 0.0  # seconds since the first step began
    max_seconds: float | None = None  # the wall-clock limit that may end it first
    keep_best: bool = False
    kept_step: int | None = None  # at the end: the step whose weights the model holds
    removed: list[str] = field(default_factory=list)  # own models removed to make room for this one
    final: str | None = None  # the status the run ended with
    ended: threading.Event = field(default_factory=threading.Event)  # set once `final` is written, or the run failed

    def halt(self, wait: float = 0.0) -> str | None:
        """Stop the run at its next step; with `wait`, wait up to that many seconds for it to end: the status
        it ended with, or None if it has not ended by then (or had ended before)."""
        if self.ended.is_set():
            return None
        self.stop.set()
        return self.final if wait > 0 and self.ended.wait(wait) else None

    def seconds_left(self) -> float | None:
        """An estimate of the time left: the time per step so far times the steps left, capped by the
        time limit (None before the first step)."""
        if self.step <= 0 or self.done:
            return None if self.step <= 0 else 0.0
        left = self.elapsed / self.step * (self.total_steps - self.step)
        if self.max_seconds is not None:
            left = min(left, max(0.0, self.max_seconds - self.elapsed))
        return left

    def overfitting(self) -> str:
        """A plain hint when the latest validation loss is well above its best (model.train.well_above_best),
        or ''."""
        if len(self.val_loss) < 2:
            return ""
        best = min(range(len(self.val_loss)), key=self.val_loss.__getitem__)
        last, low, at = self.val_loss[-1], self.val_loss[best], self.val_steps[best]
        if not well_above_best(last, low):
            return ""
        keep = (f"'keep best' keeps the weights from step {at}." if self.keep_best
                else f"tick 'keep best' to keep the weights from step {at}.")
        return (f"Validation loss {last:.2f} is well above its best {low:.2f} (step {at}): the model is memorising "
                f"the training text (overfitting). Fewer steps, dropout, or a smaller model help; {keep}")


class Training:
    """One person's training (the session's `training`): the run going, or the last one; the stop of a run
    whose corpus is still being built; and why their last upload was refused, told once (the Train tab
    empties its file box after a refusal and says why)."""

    def __init__(self) -> None:
        self.run: TrainingRun | None = None
        self.starting: threading.Event | None = None  # the stop of a training whose corpus is being built
        self._refusal: str | None = None

    @property
    def going(self) -> bool:
        return self.run is not None and not self.run.done

    def stop(self, wait: float = 0.0) -> str | None:
        """End the training at its next step, or before it begins if it is still starting; with `wait`, the
        status a going run ends with if it ends within that many seconds (`TrainingRun.halt`)."""
        starting = self.starting
        if starting is not None:
            starting.set()
        return None if self.run is None else self.run.halt(wait)

    @contextlib.contextmanager
    def upload_refusal(self) -> Iterator[None]:
        """Around an upload: a refusal (ValueError) raised inside is kept for `refused_upload`, then raised on."""
        self._refusal = None
        try:
            yield
        except ValueError as exc:
            self._refusal = str(exc)
            raise

    def refused_upload(self) -> str | None:
        """Why the last upload was refused (once; None when it was not, or was told already)."""
        why, self._refusal = self._refusal, None
        return why


@dataclass
class TrainProgress:
    """What a training reports as it goes: a status line, and at the end the model and its file."""

    message: str
    run: TrainingRun
    done: bool = False
    download: Path | None = None


@dataclass
class TrainForm:
    """The Train form, checked: the corpus, its tokenizer (None: the corpus brings its own), the text
    of a "text" corpus, the model's sizes and the run's settings, and the film's probe prompt."""

    corpus_name: str
    tokenizer_kind: str | None
    text: str | None
    sizes: dict
    keep_best: bool
    probe: str | None


def check_form(corpus_name, pasted, upload, tokenizer_kind, layers, heads, d_model, d_ff, pos, norm, activation,
               dropout, steps, lr, seed, keep_best, probe) -> TrainForm:
    """Every field of the Train form checked, before anything starts (UserError names the first wrong one)."""
    if not isinstance(corpus_name, str) or corpus_name not in TRAIN_CORPORA:
        raise UserError(f"Unknown corpus {str(corpus_name)[:40]!r}; choose one of {', '.join(TRAIN_CORPORA)}.")
    L = TRAIN_LIMITS
    sizes = dict(
        layers=check_int("layers", layers, *L["layers"]), heads=check_int("heads", heads, *L["heads"]),
        d_model=check_int("d_model", d_model, *L["d_model"]), d_ff=check_int("d_ff", d_ff, *L["d_ff"]),
        pos_encoding=check_choice("positional encoding", pos, POS_ENCODINGS),
        norm=check_choice("norm placement", norm, NORMS),
        activation=check_choice("activation", activation, ACTIVATIONS),
        dropout=check_float("dropout", dropout, *L["dropout"]), steps=check_int("steps", steps, *L["steps"]),
        lr=check_float("learning rate", lr, *L["learning rate"]), seed=check_int("seed", seed, *L["seed"]),
    )
    if not isinstance(keep_best, bool):
        raise UserError("keep best must be true or false.")
    if probe is not None and not isinstance(probe, str):
        raise UserError("The film's probe prompt must be text.")
    own_tokenizer = corpus_name in OWN_TOKENIZER
    if own_tokenizer:
        tokenizer_kind = check_choice("tokenizer", tokenizer_kind, TOKENIZER_KINDS)
    text = None
    if corpus_name == "text":
        text = read_upload(upload) if upload else pasted
        if not isinstance(text, str):
            raise UserError("Paste some text or upload a UTF-8 .txt file.")
    return TrainForm(corpus_name, tokenizer_kind if own_tokenizer else None, text, sizes, keep_best, probe)


def prepare_run(form: TrainForm, stop: threading.Event) -> tuple[Corpus, object, TrainConfig]:
    """The corpus (its tokenizer trained) and the run's configs; `stop` ends the preparation early."""
    try:
        corpus = build_corpus(form.corpus_name, form.tokenizer_kind, seed=form.sizes["seed"], text=form.text,
                              should_stop=stop.is_set)
        mcfg, tcfg = train_tab_recipe(corpus, max_seconds=TRAIN_MAX_SECONDS, keep_best=form.keep_best, **form.sizes)
        ids = probe_ids(corpus, form.corpus_name, form.probe, mcfg.block_size)
        tcfg = dataclasses.replace(tcfg, film_frames=FILM_FRAMES, probe_ids=tuple(ids))
    except Stopped:
        raise UserError("Training stopped by you before it began.") from None
    except ValueError as exc:
        raise UserError(f"This training cannot start: {exc}.") from None
    try:  # whatever is trained here must load back through the upload checks
        CHECKPOINT_LIMITS.check(mcfg)
    except ValueError as exc:
        raise UserError(f"This model would be too big to save and load again: {exc}. "
                        "Use text with fewer distinct characters or words, or a smaller model.") from None
    return corpus, mcfg, tcfg


def probe_ids(corpus, corpus_name, probe, block_size: int) -> list[int]:
    """The film's probe prompt as token ids: the typed one, else a held-out example of the corpus."""
    limit = min(block_size, MAX_PROBE_TOKENS)
    if probe is None or not probe.strip():
        return default_probe(corpus, corpus_name)[-limit:]
    enc = corpus.tokenizer.encode_verbose(probe)
    if enc.unknown:
        shown = ", ".join(repr(u[:20]) for u in enc.unknown[:5])
        raise UserError(f"The film's probe prompt has tokens this corpus does not know: {shown}. "
                        "Leave it empty to use a held-out example.")
    if not enc.ids:
        raise UserError("The film's probe prompt has no tokens.")
    return enc.ids[-limit:]


def new_entry(corpus, corpus_name: str, mcfg, tcfg: TrainConfig, name: str) -> ModelEntry:
    """The model to train, untrained, as it joins the model list: its film grows frame by frame while it
    trains, so the film section can show it meanwhile."""
    torch.manual_seed(tcfg.seed)
    entry = ModelEntry(name, DecoderLM(mcfg), corpus.tokenizer, {"corpus": corpus_name},
                       examples=usable_examples(corpus.sample_prompts))
    probe = list(tcfg.probe_ids)
    entry.film = Film(probe, [corpus.tokenizer.piece(i) for i in probe], [], tcfg.steps, task=task_of(corpus_name))
    return entry


def on_device(model, tcfg: TrainConfig) -> tuple[TrainConfig, bool]:
    """Move the model to the GPU when the lab trains there (ZeroGPU: CUDA exists only inside the decorated
    call; the model returns to the CPU after), and train under bfloat16 autocast there."""
    if TRAIN_DEVICE == "cuda" and torch.cuda.is_available():
        model.to("cuda")
        return dataclasses.replace(tcfg, bf16=bf16_choice(model.cfg, tcfg.batch_size, "cuda")[0]), True
    return tcfg, False


def run_training(entry: ModelEntry, corpus, tcfg: TrainConfig, stop: threading.Event, join, closed, save,
                 touch) -> Iterator[TrainProgress]:
    """Train `entry`'s model, reporting as it goes. join(entry, run): the model joins the person's models
    (it may refuse; returns the models removed to make room); closed(): the session is gone (nothing
    is saved); save(entry): its download (None if the disk is full); touch(): the session acted."""
    tcfg, on_gpu = on_device(entry.model, tcfg)
    run = TrainingRun(entry.name, stop=stop, total_steps=tcfg.steps, max_seconds=tcfg.max_seconds,
                      keep_best=tcfg.keep_best)
    run.removed = join(entry, run)
    notes = [removed_note(run.removed)] if run.removed else []
    try:
        try:
            ev = yield from follow(run, entry, corpus, tcfg, notes)
        finally:
            run.done = True
            touch()
            entry.model.eval()
            if on_gpu:
                entry.model.to("cpu")
        if closed():  # the session was closed while training: save nothing nobody can fetch
            return
        path = save(entry)
        run.final = final_message(run, ev, path is not None, notes)
    finally:
        run.ended.set()  # whoever waits for the run's end (Training.stop) waits no longer
    yield TrainProgress(run.final, run, done=True, download=path)


def follow(run: TrainingRun, entry: ModelEntry, corpus, tcfg: TrainConfig, notes: list[str]):
    """Train `entry`'s model, recording into `run` and the film; yields a TrainProgress per step reported
    and returns the last event (None if none came)."""
    ev = None
    for ev in train(entry.model, corpus, tcfg, should_stop=run.stop.is_set):
        run.step, run.elapsed = ev.step, ev.elapsed
        if ev.frame is not None:
            entry.film.frames.append(ev.frame)
        if ev.film is not None:  # the whole film, its last frame the final model's
            ev.film.probe_tokens = entry.film.probe_tokens
            entry.film = ev.film
        if ev.done:  # the curve shows where the run ended; the kept weights are marked apart
            run.kept_step = ev.kept_step
            if ev.kept_step == ev.step:
                run.steps.append(ev.step)
                run.train_loss.append(ev.train_loss)
            run.val_steps.append(ev.step)
            run.val_loss.append(ev.end_val_loss)
            continue
        run.steps.append(ev.step)
        run.train_loss.append(ev.train_loss)
        if ev.val_loss is not None:
            run.val_steps.append(ev.step)
            run.val_loss.append(ev.val_loss)
        hint = [run.overfitting()] if run.overfitting() else []
        yield TrainProgress("\n".join([f"step {ev.step}/{ev.total_steps} · loss {ev.train_loss:.3f} · "
                                       f"{ev.tokens_per_s:,.0f} tokens/s", *notes, *hint]), run)
    return ev


def final_message(run: TrainingRun, ev, saved: bool, notes: list[str]) -> str:
    """What the run says when it ends: why, its validation loss and which weights it kept."""
    note = "" if saved else " The server's disk is full right now, so there is no file to download."
    if ev.kept_step != ev.step:
        loss = (f"it kept the weights from step {ev.kept_step}, whose validation loss {ev.val_loss:.3f} was the "
                f"lowest (the last weights' was {ev.end_val_loss:.3f})")
    else:
        loss = f"validation loss {ev.val_loss:.3f}"
        if run.keep_best and ev.step > 0:
            loss += " (its lowest, so the last weights are kept)"
    hint = run.overfitting()
    if hint and ev.kept_step != ev.step:
        hint = hint.replace("'keep best' keeps the weights", "'keep best' kept the weights")
    return "\n".join([f"Training {STOP_REASONS[ev.stop_reason]} after {ev.step} steps in {ev.elapsed:.1f} s: "
                      f"{loss}. '{run.name}' is now in the Explore model list.{note}", *notes, *([hint] if hint else [])])


def read_upload(path) -> str:
    """A text file uploaded for the "text" corpus."""
    if not isinstance(path, str):
        raise UserError("The uploaded text file could not be read.")
    try:  # never deleted here: the path may name a file that is not this session's (gradio sweeps its cache)
        return read_text_file(path)
    except (ValueError, OSError) as exc:
        raise UserError(f"The text file cannot be used: {exc}.") from None
