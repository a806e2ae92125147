"""One person's lab: the lock that keeps their actions one at a time, their share of the server's
budgets, their files, and the verbs the wiring calls.

A `Session` is built from parts with one concept each: the text and its history (lab.text), how
figures are drawn (lab.display), own models (lab.catalogue.ownmodels), and the tools that keep a person's state,
each with its own verbs: the head tools (`heads`, lab.heads), Inside one cell (`inside`, lab.inside),
patching sweeps (`sweeps`, lab.sweeps) and training (`training`, lab.training). The wiring keeps one
per browser tab and calls its verbs (`step`, `generate`, `undo`, `reset`, `select_model`, `train`,
`upload`, `close`) and read-outs, or one part's (`session.heads.set_ablation(...)`); Step, Generate,
Undo and Reset return a `lab.shown.Shown` of what the page draws (README: "The path of a Step"). No
gradio here: a refusal is a `UserError` for the person.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from model.checkpoint import atomic_write
from model.film import Film
from model.generate import Sampling, generate

from .catalogue.external import EXTERNAL
from .catalogue.models import BUILTINS, BuiltinModels, ModelEntry, encode_prompt, usable_examples
from .catalogue.ownmodels import OwnModels, entry_bytes, removed_note
from .catalogue.uploads import checkpoint_data, load_upload, reserved_bytes
from .checks import UserError, check_int
from .circuits import Circuits
from .display import HEAD_TOOLS, Display, View, changed_display, check_view, with_tool
from .shown import Shown, make_shown
from .heads import Heads
from .inside import Inside
from .limits import MAX_LOG, MAX_NEW_TOKENS, TRAIN_LIMITS
from .recipe import train_tab_defaults
from .server import files
from .server.budget import DISK_BUDGET, MODEL_BUDGET
from .server.rates import LIMITER
from .server.sessionstore import SessionStore
from .server.warm import WARM, release_freed_memory
from .sweeps import Sweeps
from .text import Attention, Probabilities, Text, sampling_record, text_bytes
from .training import Training, TrainingRun, TrainProgress, check_form, new_entry, prepare_run, run_training

__all__ = ["Session", "SESSIONS", "BUSY_WAIT_S", "HEAD_TOOLS", "MAX_LOG", "View", "Display", "Attention",  # read
           "Probabilities", "TrainingRun", "TrainProgress", "encode_prompt", "removed_note"]  # from here too

# How long an action waits for the same session's previous one (a Generate) to end; a test server sets it
# far above any Generate it streams (DECODER_LAB_BUSY_WAIT_S), so that a slow machine waits, never refuses
BUSY_WAIT_S = float(os.environ.get("DECODER_LAB_BUSY_WAIT_S", "10"))


class Session:
    """Everything one person has: their models, the text being generated, their training run."""

    def __init__(self, builtins: BuiltinModels = BUILTINS) -> None:
        self.builtins = builtins
        self.external = EXTERNAL  # the models the person running the app added (none unless they did)
        self.own = OwnModels()
        self.display = Display()
        # what it will hold, warm or cooled (lab.server.warm)
        self._use_text(Text(lambda nbytes: self._hold(text=nbytes)))
        self.sweeps = Sweeps(self)  # patching: the sweep running, its stop, the last one's result
        self.circuits = Circuits(self)  # the Circuits view: its last records and its one long job
        self.training = Training()  # the training run, its stop, the last upload's refusal
        # a session file or link just set up this model's text: the model list's change event it causes keeps it
        self.keep_on_select: str | None = None
        self.run_dir: Path | None = None
        self.closed = False  # set when the session's state is deleted (tab closed or expired)
        self.touched = time.monotonic()  # its last action: the server's budgets take from idle sessions first
        self.dropped: list[str] = []  # what the server took to make room, told to the person once
        # One action at a time: a Step sent while the same session's Generate streams waits for it. A plain
        # Lock (not RLock): gradio may resume a streaming handler on another thread than the one that started it.
        self._turn = threading.Lock()

    # the text's read-outs, by the names the rest of the lab reads them
    entry = property(lambda self: self.text.entry)
    decoder = property(lambda self: self.text.decoder)
    prompt = property(lambda self: self.text.prompt)
    notices = property(lambda self: self.text.notices)
    last_step = property(lambda self: self.text.last_step)
    drawn = property(lambda self: self.text.drawn)
    log = property(lambda self: self.text.log)
    models = property(lambda self: self.own.models)
    query = property(lambda self: self.text.query)  # the token selected in the text (window position; None: the last)
    run = property(lambda self: self.training.run)  # the training run going, or the last one (None: none yet)

    def _use_text(self, text: Text, heads: Heads | None = None) -> None:
        """The text this session works on, with the parts that read it: the head tools (with their
        settings, or `heads`' settings) and Inside one cell."""
        self.text = text
        self.heads = Heads(text, self.entry_for, None if heads is None else heads.settings)
        self.inside = Inside(text, self.heads)

    @contextlib.contextmanager
    def turn(self, wait_s: float = BUSY_WAIT_S):
        """Hold this session for one action; refuse (changing nothing) if it stays busy too long."""
        if not self._turn.acquire(timeout=wait_s):
            raise UserError("This session is still busy with your previous action; try again in a moment.")
        self.touched = time.monotonic()
        try:
            yield self
        finally:
            self.touched = time.monotonic()
            self._turn.release()
            WARM.used(self)  # the most recently used text stays warm; the least recently used may cool

    @property
    def busy(self) -> bool:
        """Acting now, or training: the server's budgets never take from a busy session."""
        return self._turn.locked() or self.training.going

    def _give_up(self, reason: str, what) -> bool:
        """Let the server take something of this idle session (never waits for its turn)."""
        if not self._turn.acquire(blocking=False):
            return False
        try:
            if self.training.going:
                return False
            what()
            self.dropped += [reason] if reason else []  # cooling a text takes nothing the person sees
            return True
        finally:
            self._turn.release()

    def drop_own_models(self, reason: str) -> bool:
        """Remove this session's own models (and its text, if on one of them) for the server's budget."""
        def drop():  # the text goes too: its attention is memory the budget counts (no reset(): the
            # budget calls this holding its lock, and reset() reports to the budget)
            self.text.clear()
            self.own.clear()
        dropped = self._give_up(reason, drop)
        if dropped:
            release_freed_memory()
        return dropped

    def cool_text(self) -> bool:
        """Let the warm store (lab.server.warm) take the heavy part of this idle session's text (computed again
        when used)."""
        return self._give_up("", self.text.cool)

    def drop_files(self, reason: str) -> bool:
        """Delete this session's downloadable model files for the server's disk budget."""
        def drop():
            files.remove_dir(self.run_dir)
            self.run_dir = None
        return self._give_up(reason, drop)

    # ------------------------------------------------------------------------ models

    def model_names(self) -> list[str]:
        return self.builtins.names + self.external.names + list(self.own.models)

    def entry_for(self, name) -> ModelEntry:
        if not isinstance(name, str):
            raise UserError("The model must be given by its name in the list.")
        if name in self.own.models:
            return self.own.models[name]
        if name in self.builtins.models:
            return self.builtins.get(name)
        if name in self.external:
            return self.external.get(name)
        raise UserError(f"Unknown model {name[:60]!r}. Pick one from the list.")

    model_name = property(lambda self: None if self.entry is None else self.entry.name)  # None before the first Step

    def check_view(self, model_name, layer, head, view) -> View:
        """The view settings checked against that model (None: the text's own, even if it has left
        the list since), before anything changes."""
        entry = self.entry if model_name is None and self.entry is not None else self.entry_for(model_name)
        return check_view(entry, layer, head, view)

    def set_display(self, colour=None, presentation=None, screen=None) -> Display:
        """Change how figures are drawn (None leaves a setting as it is). screen: "WIDTHxHEIGHT" of
        the browser window in CSS pixels."""
        self.display = changed_display(self.display, colour, presentation, screen)
        return self.display

    def show_tool(self, tool) -> str:
        """Which head tool the page shows (the others are drawn when they are shown)."""
        self.display = with_tool(self.display, tool)
        return tool

    # ----------------------------------------------------------------------- memory

    def _hold(self, models: list[str] | None = None, extra_model: int = 0, text: int | None = None) -> None:
        """Tell the server-wide memory budget what this session will hold; it may refuse (UserError)
        before anything changes, or make room by taking from idle sessions."""
        total = self.own.bytes_of(list(self.own.models) if models is None else models) + extra_model
        MODEL_BUDGET.hold(self, total + (self.text.nbytes() if text is None else text))

    def _add_model(self, entry: ModelEntry) -> list[str]:
        """Keep at most MAX_USER_MODELS of a person's own models (the oldest goes); returns the names
        of the models removed to make room (`removed_note` says so to the person).

        The server-wide budget is asked first: it may refuse (UserError) and then nothing changes.
        """
        nbytes = entry_bytes(entry)
        self._hold(self.own.kept_after_adding(entry.name), nbytes)
        return self.own.add(entry, nbytes)

    # -------------------------------------------------------------------------- text

    def _make_shown(self, view: View | None, step=None, undone: bool = False) -> Shown:
        return make_shown(self.text, self.heads.settings, display=self.display, view=view,
                          roles=self.heads.head_roles, told=self.dropped, step=step, undone=undone)

    def _view(self, entry: ModelEntry, view) -> View | None:
        """The page's (layer, head, view) checked against `entry`, before anything changes (None: none asked)."""
        return None if view is None else check_view(entry, *view)

    def _start(self, entry: ModelEntry, prompt: str, sampling: Sampling, new_tokens: int) -> None:
        """Start a text from the prompt, once the memory of `new_tokens` more is granted."""
        ids, notices = encode_prompt(prompt, entry)
        self._hold(text=text_bytes(entry, len(ids) + new_tokens))
        self.heads.new_text(entry)  # before the text changes: it compares the model with the text's
        self.text.start(entry, prompt, ids, notices, sampling)

    def _grow(self, entry: ModelEntry, prompt, sampling: Sampling, max_new: int) -> int:
        """Make room for up to `max_new` more tokens: on the text, or on a new one from the prompt."""
        if self.text.continues(entry, prompt, sampling):
            max_new = min(max_new, self.text.room())
            self._hold(text=text_bytes(entry, len(self.decoder.ids) + max_new))  # before the text grows
        else:
            self._start(entry, prompt, sampling, new_tokens=max_new)
        return max_new

    def kept_on_select(self, name) -> bool:
        """Whether selecting `name` now keeps the text a session file or link just set up (once)."""
        kept = self.keep_on_select is not None and self.keep_on_select == name
        self.keep_on_select = None
        return kept

    def select_model(self, name) -> ModelEntry:
        """Switch model: the text starts again, and the heads' settings go (the heads differ)."""
        entry = self.entry_for(name)
        self.reset()
        self.heads.new_model(entry)
        self.text.entry = entry  # the head tools (and a session saved now) are about this model from here on
        return entry

    def step(self, model_name, prompt, sampling: Sampling, force: int | None = None, view=None) -> Shown:
        """One new token. The text continues unless the model, prompt or seed changed.
        force: the token to take instead of sampling (replaying a saved session). view: the page's
        (layer, head, view), checked first; the Shown then holds the figures' numbers for it."""
        entry = self.entry_for(model_name)
        asked = self._view(entry, view)
        self._grow(entry, prompt, sampling, 1)
        step = self.text.keep(next(generate(self.decoder, 1, sampling, force=None if force is None else [force])))
        self.text.record({"do": "step", "sampling": sampling_record(sampling), "tokens": [step.token_id]})
        return self._make_shown(asked, step)

    def generate(self, model_name, prompt, sampling: Sampling, max_new, force=None, view=None) -> Iterator[Shown]:
        """Up to `max_new` more tokens, one Shown each: the text goes on (as Step does) unless the
        model, prompt or seed changed; then it starts again from the prompt.

        Attention is computed once, after the last token: only the last Shown is complete (with `view`).
        """
        entry = self.entry_for(model_name)
        asked = self._view(entry, view)
        max_new = check_int("max new tokens", max_new, 1, MAX_NEW_TOKENS)
        max_new = self._grow(entry, prompt, sampling, max_new)
        record = {"do": "generate", "sampling": sampling_record(sampling), "tokens": []}
        self.text.record(record)
        for i, s in enumerate(generate(self.decoder, max_new, sampling, attention="last", force=force)):
            record["tokens"].append(s.token_id)
            self.text.keep(s)
            yield self._make_shown(asked if s.eos or i == max_new - 1 else None, s)

    def undo(self, view=None) -> Shown:
        """Take the last generated token back (never the prompt); `undone` says whether one went."""
        asked = self._view(self.entry, view) if self.entry is not None else None
        undone = self.text.undo()
        self.heads.token_undone()
        if self.decoder is not None:
            self._hold()  # less memory: always granted
        return self._make_shown(asked, undone=undone)

    def reset(self) -> Shown:
        """The text goes; the heads chosen to ablate stay for the next text on this model, an edited row
        (positions of the text that went) does not."""
        self.text.clear()
        self.heads.text_cleared()
        self._hold()  # less memory: always granted
        return self._make_shown(None)

    # ----------------------------------------------------------------------- read-outs

    def shown(self, layer, head, view) -> Shown:
        """What the page draws for the text as it stands, for this view (checked against the text's
        model; with no text there is nothing to check or draw)."""
        return self._make_shown(self._view(self.entry, (layer, head, view)) if self.decoder is not None else None)

    def tokens(self) -> list[tuple[str, str]]:
        """(display piece, "prompt" | "generated") for every token in the current window."""
        return self.text.tokens()

    def generated_text(self) -> str:
        return self.text.generated_text()

    def attention(self) -> Attention | None:
        return self.text.attention()

    def probabilities(self, index=None, sampling: Sampling | None = None) -> Probabilities | None:
        """The distribution the token at window position `index` (default: the last) was drawn from
        (lab.text.Text.probabilities)."""
        return self.text.probabilities(index, sampling)

    def select(self, index) -> int:
        """Select the token at window position `index` as the query of the head tools."""
        return self.text.select(index)

    def select_last(self) -> None:
        """The head tools read the last token again."""
        self.text.query = None

    def status(self) -> str:
        return self.text.status(self.dropped)

    def film(self, model_name) -> Film | None:
        """The training film of a model (a built-in's, or one trained or uploaded here); a model in
        training has the frames recorded so far."""
        return self.entry_for(model_name).film

    def film_probe_text(self, model_name) -> str:
        """The film's probe prompt as text (the model's tokenizer puts the spaces back)."""
        entry = self.entry_for(model_name)
        return "" if entry.film is None else entry.tokenizer.decode(list(entry.film.probe_ids))

    def positional(self, model_name) -> tuple[ModelEntry, str, np.ndarray | None]:
        """The positional table a model really uses: (entry, kind, (positions, dims) float32 or None)."""
        entry = self.entry_for(model_name)
        entry.require("positions")
        kind, table = entry.model.positional_table()
        return entry, kind, None if table is None else table.numpy().astype(np.float32)

    # ------------------------------------------------------------------------ taking over

    def adopt(self, scratch: "Session", name: str) -> str:
        """Take over what a scratch session built (lab.sessionfile: a replayed session file): its own
        model, if any, joins this session's models; its text, head settings and display follow.
        The memory is granted first (UserError changes nothing). Returns the model's name here."""
        own = scratch.own.models.get(name)
        if own is not None:
            nbytes = scratch.own.nbytes[name]
            new_name = self.own.unique_name(own.name)  # a second copy gets a name of its own
            self._hold(self.own.kept_after_adding(new_name), nbytes, text=scratch.text.nbytes())  # may refuse
            own.name = new_name
            self.own.add(own, nbytes)  # the oldest go, to make room
        else:
            self._hold(text=scratch.text.nbytes())
        self._use_text(scratch.text, scratch.heads)  # the head settings follow; the roles are computed again
        self.text.hold = lambda nbytes: self._hold(text=nbytes)
        d = scratch.display
        self.display = dataclasses.replace(self.display, colour=d.colour, presentation=d.presentation, tool=d.tool)
        self._hold()
        return self.entry.name if self.entry is not None else name

    def save_file(self, stem: str, suffix: str, data: bytes) -> Path:
        """A file for this person to download (a session, exported numbers), within the server's
        disk budget; refused with a sentence when the disk is full."""
        with DISK_BUDGET.room(self, len(data)):
            if self.run_dir is None:
                self.run_dir = files.new_session_dir()
            self.run_dir.mkdir(parents=True, exist_ok=True)
            path = self.run_dir / f"{files.safe_file_stem(stem)}{suffix}"
            atomic_write(path, data)
            return path

    # ------------------------------------------------------------------------ training

    @staticmethod
    def train_defaults(corpus_name: str) -> dict:
        """The Train form for `corpus_name`: the recipe of that corpus's built-in model
        (lab.recipe.train_tab_defaults), inside the form's limits."""
        return train_tab_defaults(corpus_name, TRAIN_LIMITS)

    def train(self, corpus_name, pasted, upload, tokenizer_kind, layers, heads, d_model, d_ff, pos, norm,
              activation, dropout, steps, lr, seed, keep_best=True, probe=None) -> Iterator[TrainProgress]:
        """Train a new model for this session; it joins the model list at once and is kept if stopped.

        With `keep_best`, the model ends with the weights of its lowest validation loss (model.train).
        Everything is checked before the run starts, so a refused form changes nothing.
        """
        if self.training.going:
            raise UserError("A training run is already going in this session; stop it first.")
        form = check_form(corpus_name=corpus_name, pasted=pasted, upload=upload, tokenizer_kind=tokenizer_kind,
                          layers=layers, heads=heads, d_model=d_model, d_ff=d_ff, pos=pos, norm=norm,
                          activation=activation, dropout=dropout, steps=steps, lr=lr, seed=seed, keep_best=keep_best,
                          probe=probe)
        try:  # Stop works from here on: while the tokenizer trains, and then for the run itself
            stop = self.training.starting = threading.Event()
            corpus, mcfg, tcfg = prepare_run(form, stop)
        finally:
            self.training.starting = None
        return self._run_training(corpus, form.corpus_name, mcfg, tcfg, stop)

    def _run_training(self, corpus, corpus_name, mcfg, tcfg, stop: threading.Event) -> Iterator[TrainProgress]:
        files.sweep_runs()  # long-running servers: old run folders go even when no session closed
        entry = new_entry(corpus, corpus_name, mcfg, tcfg, self.own.unique_name(f"my {corpus_name} model"))
        yield from run_training(entry, corpus, tcfg, stop, self._join_run, lambda: self.closed, self._save_for_download,
                                lambda: setattr(self, "touched", time.monotonic()))

    def _join_run(self, entry: ModelEntry, run: TrainingRun) -> list[str]:
        """A new run's model joins the models, selectable (and kept) even if the run is cancelled mid-way."""
        with self.turn():  # the run runs beside the session's other actions; only this change waits for them
            removed = self._add_model(entry)
            self.training.run = run  # a Stop while the corpus was built counts
        return removed

    def _save_for_download(self, entry: ModelEntry) -> Path | None:
        """The model as one file to download, within the server's disk budget (None if refused)."""
        try:
            return self.save_file(entry.name, ".safetensors", checkpoint_data(entry))
        except UserError:
            return None

    def upload(self, path) -> str:
        """Load a .safetensors checkpoint after validating it; returns its name in the model list."""
        return self.upload_noting_removed(path)[0]

    def upload_noting_removed(self, path) -> tuple[str, list[str]]:
        """`upload`, also returning the own models removed to make room for it (see `removed_note`)."""
        if not path or not isinstance(path, str):
            raise UserError("Choose a .safetensors file first.")
        name = self.own.unique_name(f"uploaded: {Path(path).stem[:40]}")
        held_before = MODEL_BUDGET.held(self)

        def reserve(cfg) -> None:  # the memory is granted before a tensor is allocated
            self._hold(self.own.kept_after_adding(name), reserved_bytes(cfg))

        ck = load_upload(path, reserve, give_back=lambda: MODEL_BUDGET.hold(self, held_before))
        examples = usable_examples(ck.meta.get("examples") or [ck.meta.get("example_prompt")])
        removed = self._add_model(ModelEntry(name, ck.model, ck.tokenizer, ck.meta, examples=examples, film=ck.film))
        return name, removed

    def close(self) -> None:
        """The session's state expired or its tab closed: stop training, delete its files."""
        self.closed = True
        self.training.stop()
        files.remove_dir(self.run_dir)
        self.own.clear()
        self.reset()
        MODEL_BUDGET.release(self)
        release_freed_memory()


# Sessions by gradio's session hash: gradio's own store can drop a tab's state in a burst of new
# sessions, this one keeps every active session (see lab.server.sessionstore.SessionStore).
SESSIONS = SessionStore(Session, limiter=LIMITER)
