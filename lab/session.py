"""One person's lab: the text being generated, their own models and their training run.

The Gradio wiring keeps one `Session` per browser tab (in `gr.State`) and talks to it only
through its verbs (`step`, `generate`, `undo`, `reset`, `select_model`, `train`, `stop_training`,
`upload`, `close`) and its read-outs (`tokens`, `status`, `attention`, `probabilities`,
`positional`). Nothing here imports gradio; what goes wrong because of what a person asked for
raises `UserError` with a message for them.

A Step's path: app.step → Session.step (checks, starts or continues the text) →
model.generate.generate (one loop) → Decoder.step → DecoderLM.forward; then the wiring asks
`Session.attention()` for the numbers and `viz.attention_view` draws them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from model.checkpoint import atomic_write, checkpoint_bytes, load_checkpoint
from model.corpora import Stopped, build_corpus, read_text_file
from model.generate import Decoder, Sampling, Step, generate
from model.presets import train_tab_recipe
from model.train import train
from model.transformer import DecoderLM

from . import files
from .budget import DISK_BUDGET, LIMITER, MODEL_BUDGET, SessionStore, model_bytes
from .checks import UserError, check_choice, check_float, check_int
from .limits import (
    ACTIVATIONS, ATTENTION_VIEWS, CHECKPOINT_LIMITS, MAX_NEW_TOKENS, MAX_PROMPT_CHARS, MAX_USER_MODELS, NORMS,
    POS_ENCODINGS, TOKENIZER_KINDS, TRAIN_CORPORA, TRAIN_LIMITS, TRAIN_MAX_SECONDS,
)
from .models import BUILTINS, BuiltinModels, ModelEntry, usable_examples

# Training runs on the GPU only when asked (or on ZeroGPU); stepping a model this small is fastest on the CPU.
TRAIN_DEVICE = os.environ.get("DECODER_LAB_DEVICE") or ("cuda" if os.environ.get("SPACES_ZERO_GPU") else "cpu")


@dataclass
class View:
    """Which attention picture to draw: a layer, one head (None = all of the layer's) and a view."""

    layer: int
    head: int | None
    view: str


@dataclass
class Attention:
    """The attention of the current window, as the model computed it.

    weights, scores: one (H, T, T) array per layer (the decoder's own, not copied); masked weights
    are 0 and masked scores -inf. tokens: T pieces.
    """

    weights: list[np.ndarray]
    scores: list[np.ndarray]
    tokens: list[str]
    causal: bool


@dataclass
class Probabilities:
    """The distribution the last token was drawn from: probs (V,) before and adjusted (V,) after
    temperature / top-k / top-p, the chosen id and every token's display piece."""

    pieces: list[str]
    probs: np.ndarray
    adjusted: np.ndarray
    chosen: int


@dataclass
class TrainingRun:
    name: str
    stop: threading.Event = field(default_factory=threading.Event)
    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    done: bool = False


@dataclass
class TrainProgress:
    """What a training reports as it goes: a status line, and at the end the model and its file."""

    message: str
    run: TrainingRun
    done: bool = False
    download: Path | None = None


BUSY_WAIT_S = 10.0  # how long an action waits for the same session's previous one (a Generate) to end
_STOP_REASONS = {"finished": "finished", "stopped": "stopped by you", "time limit": "hit the time limit"}


def encode_prompt(prompt, entry: ModelEntry) -> tuple[list[int], list[str]]:
    """A prompt's token ids for this model and any notices; refuses empty, long or unknown input."""
    if not isinstance(prompt, str):
        raise UserError("The prompt must be text.")
    if not prompt.strip():
        raise UserError("The prompt is empty: type a few words or characters first.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt has {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}.")
    tokenizer, block_size = entry.tokenizer, entry.model.cfg.block_size
    enc = tokenizer.encode_verbose(prompt)
    if enc.unknown:
        shown = ", ".join(repr(u if len(u) <= 20 else u[:19] + "…") for u in enc.unknown[:8])
        shown += " …" if len(enc.unknown) > 8 else ""
        unit = "words" if tokenizer.kind == "word" else "characters"
        raise UserError(
            f"This model does not know these {unit}: {shown}. "
            f"Its vocabulary has {tokenizer.vocab_size} tokens; try one of the example prompts."
        )
    ids = enc.ids
    if not ids:
        raise UserError("The prompt has no tokens for this model.")
    notices = []
    if len(ids) > block_size:
        notices.append(f"The prompt has {len(ids)} tokens but the model's context is {block_size}; "
                       f"it keeps the last {block_size}.")
        ids = ids[-block_size:]
    return ids, notices


class Session:
    """Everything one person has: their models, the text being generated, their training run."""

    def __init__(self, builtins: BuiltinModels = BUILTINS) -> None:
        self.builtins = builtins
        self.models: OrderedDict[str, ModelEntry] = OrderedDict()  # own models, oldest first
        self.entry: ModelEntry | None = None
        self.decoder: Decoder | None = None
        self.prompt: str | None = None
        self.notices: list[str] = []
        self.last_step: Step | None = None
        self.run: TrainingRun | None = None
        self.run_dir: Path | None = None
        self.closed = False  # set when the session's state is deleted (tab closed or expired)
        self.touched = time.monotonic()  # its last action: the server's budgets take from idle sessions first
        self.dropped: list[str] = []  # what the server took to make room, told to the person once
        self._starting: threading.Event | None = None  # the stop of a training whose corpus is being built
        self._model_bytes: dict[str, int] = {}  # bytes of each own model, for the memory budget
        # One action at a time per session: a Step sent while the same session's Generate streams
        # waits for it instead of interleaving with it. A plain Lock (not RLock), because gradio may
        # resume a streaming handler on another thread than the one that started it.
        self._turn = threading.Lock()

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

    @property
    def busy(self) -> bool:
        """Acting now, or training: the server's budgets never take from a busy session."""
        return self._turn.locked() or (self.run is not None and not self.run.done)

    def _give_up(self, reason: str, what) -> bool:
        """Let the server take something of this idle session (never waits for its turn)."""
        if not self._turn.acquire(blocking=False):
            return False
        try:
            if self.run is not None and not self.run.done:
                return False
            what()
            self.dropped.append(reason)
            return True
        finally:
            self._turn.release()

    def drop_own_models(self, reason: str) -> bool:
        """Remove this session's own models (and its text, if on one of them) for the server's budget."""
        def drop():  # the text goes too: its attention is memory the budget counts (no reset(): the
            # budget calls this holding its lock, and reset() reports to the budget)
            self.decoder, self.prompt, self.notices, self.last_step = None, None, [], None
            self.models.clear()
            self._model_bytes.clear()
        dropped = self._give_up(reason, drop)
        if dropped:
            release_freed_memory()
        return dropped

    def drop_files(self, reason: str) -> bool:
        """Delete this session's downloadable model files for the server's disk budget."""
        def drop():
            files.remove_dir(self.run_dir)
            self.run_dir = None
        return self._give_up(reason, drop)

    def __deepcopy__(self, memo) -> "Session":
        """gr.State deep-copies its initial value for every visitor: each gets a new, empty session
        over the same shared built-ins (which hold a lock and must not be copied)."""
        return Session(self.builtins)

    # ------------------------------------------------------------------------ models

    def model_names(self) -> list[str]:
        return self.builtins.names + list(self.models)

    def entry_for(self, name) -> ModelEntry:
        if not isinstance(name, str):
            raise UserError("The model must be given by its name in the list.")
        if name in self.models:
            return self.models[name]
        if name in self.builtins.models:
            return self.builtins.get(name)
        raise UserError(f"Unknown model {name[:60]!r}. Pick one from the list.")

    @property
    def model_name(self) -> str | None:
        """The model of the text in progress (None before the first Step)."""
        return None if self.entry is None else self.entry.name

    def check_view(self, model_name, layer, head, view) -> View:
        """The view settings checked against that model (None: the text's own, even if it has left
        the list since), before anything changes."""
        entry = self.entry if model_name is None and self.entry is not None else self.entry_for(model_name)
        cfg = entry.model.cfg
        layer = check_int("layer", layer, 0, cfg.n_layers - 1)
        head = None if head == "all" else check_int("head", head, 0, cfg.n_heads - 1)
        return View(layer, head, check_choice("view", view, ATTENTION_VIEWS))

    # ----------------------------------------------------------------------- memory

    def _kept_after_adding(self, name: str) -> list[str]:
        """Own models that stay when `name` joins (at most MAX_USER_MODELS; the oldest goes)."""
        others = [n for n in self.models if n != name]
        return others[len(others) - (MAX_USER_MODELS - 1):] if MAX_USER_MODELS > 1 else []

    def _text_bytes(self, entry: ModelEntry | None = None, tokens: int | None = None) -> int:
        """Bytes of a text's attention and scores: (layers, heads, T, T) float32 each, T = `tokens`
        (the current window when None)."""
        d = self.decoder
        if tokens is None:
            return 0 if d is None else sum(a.nbytes for a in (*d.attention, *d.scores))
        cfg = (entry or self.entry).model.cfg
        t = min(tokens, cfg.block_size)
        return 2 * cfg.n_layers * cfg.n_heads * t * t * 4

    def _hold(self, models: list[str] | None = None, extra_model: int = 0, text: int | None = None) -> None:
        """Tell the server-wide memory budget what this session will hold; it may refuse (UserError)
        before anything changes, or make room by taking from idle sessions."""
        models = list(self.models) if models is None else models
        total = sum(self._model_bytes.get(n, 0) for n in models) + extra_model
        MODEL_BUDGET.hold(self, total + (self._text_bytes() if text is None else text))

    def _add_model(self, entry: ModelEntry) -> None:
        """Keep at most MAX_USER_MODELS of a person's own models (the oldest goes).

        The server-wide budget is asked first: it may refuse (UserError) and then nothing changes.
        """
        nbytes = model_bytes(entry.model)
        kept = self._kept_after_adding(entry.name)
        self._hold(kept, nbytes)
        self._model_bytes[entry.name] = nbytes
        self.models[entry.name] = entry
        self.models.move_to_end(entry.name)
        while len(self.models) > MAX_USER_MODELS:
            gone, _ = self.models.popitem(last=False)
            self._model_bytes.pop(gone, None)

    def _unique_name(self, base: str) -> str:
        name, n = base, 2
        while name in self.models:
            name, n = f"{base} ({n})", n + 1
        return name

    # -------------------------------------------------------------------------- text

    def _start(self, entry: ModelEntry, prompt: str, sampling: Sampling, new_tokens: int) -> None:
        """Start a text from the prompt, once the memory of `new_tokens` more is granted."""
        ids, notices = encode_prompt(prompt, entry)
        self._hold(text=self._text_bytes(entry, len(ids) + new_tokens))
        self.decoder = Decoder(entry.model, ids, sampling, eos_id=entry.tokenizer.eos_id,
                               piece=entry.tokenizer.piece)
        self.entry, self.prompt, self.notices, self.last_step = entry, prompt, notices, None

    def select_model(self, name) -> ModelEntry:
        """Switch model: the text starts again."""
        entry = self.entry_for(name)
        self.reset()
        return entry

    def step(self, model_name, prompt, sampling: Sampling) -> Step:
        """One new token. The text continues unless the model, prompt or seed changed."""
        entry = self.entry_for(model_name)
        d = self.decoder
        if d is None or self.entry is not entry or self.prompt != prompt or d.sampling.seed != sampling.seed:
            self._start(entry, prompt, sampling, new_tokens=1)
        else:
            if len(d.ids) - d.prompt_len >= MAX_NEW_TOKENS:
                raise UserError(f"This text already has {MAX_NEW_TOKENS} generated tokens; Reset to start again.")
            self._hold(text=self._text_bytes(entry, len(d.window) + 1))  # before the text grows
        self.last_step = next(generate(self.decoder, 1, sampling))
        return self.last_step

    def generate(self, model_name, prompt, sampling: Sampling, max_new) -> Iterator[Step]:
        """Up to `max_new` tokens from the prompt (the text restarts), one Step at a time.

        Attention is computed once, after the last token: the wiring only draws it then.
        """
        entry = self.entry_for(model_name)
        max_new = check_int("max new tokens", max_new, 1, MAX_NEW_TOKENS)
        self._start(entry, prompt, sampling, new_tokens=max_new)
        for s in generate(self.decoder, max_new, sampling, attention="last"):
            self.last_step = s
            yield s

    def undo(self) -> bool:
        """Take the last generated token back (never the prompt)."""
        if self.decoder is None:
            return False
        self.last_step = None
        undone = self.decoder.undo()
        self._hold()  # less memory: always granted
        return undone

    def reset(self) -> None:
        self.decoder, self.prompt, self.notices, self.last_step = None, None, [], None
        self._hold()  # less memory: always granted

    # ----------------------------------------------------------------------- read-outs

    def tokens(self) -> list[tuple[str, str]]:
        """(display piece, "prompt" | "generated") for every token in the current window."""
        d = self.decoder
        if d is None:
            return []
        piece = self.entry.tokenizer.piece
        return [(piece(t), "prompt" if d.start + i < d.prompt_len else "generated") for i, t in enumerate(d.window)]

    def generated_text(self) -> str:
        d = self.decoder
        return "" if d is None else self.entry.tokenizer.decode(d.ids[d.prompt_len:])

    def attention(self) -> Attention | None:
        d = self.decoder
        if d is None:
            return None
        return Attention(d.attention, d.scores, [p for p, _ in self.tokens()],
                         causal=self.entry.model.cfg.mask == "causal")

    def probabilities(self) -> Probabilities | None:
        s = self.last_step
        if s is None:
            return None
        tok = self.entry.tokenizer
        return Probabilities([tok.piece(i) for i in range(tok.vocab_size)], s.probs, s.adjusted, s.token_id)

    def status(self) -> str:
        d = self.decoder
        if d is None:
            return ""
        lines = list(self.dropped) + list(self.notices)
        lines.append(f"{len(d.window)} tokens in view ({len(d.ids) - d.prompt_len} generated). "
                     f"Model: {self.entry.summary}")
        s = self.last_step
        if s is not None:
            lines.append(f"Last token: {s.piece!r} (sampled with probability {float(s.adjusted[s.token_id]):.3f}).")
            if s.cropped:
                lines.append(f"The context is full: the oldest token was dropped to keep {d.block_size}.")
            if s.eos:
                lines.append("The model produced <EOS>: end of sequence.")
        return "\n".join(lines)

    def positional(self, model_name) -> tuple[ModelEntry, str, np.ndarray | None]:
        """The positional table a model really uses: (entry, kind, (positions, dims) float32 or None)."""
        entry = self.entry_for(model_name)
        kind, table = entry.model.positional_table()
        return entry, kind, None if table is None else table.numpy().astype(np.float32)

    # ------------------------------------------------------------------------ training

    def train(self, corpus_name, pasted, upload, tokenizer_kind, layers, heads, d_model, d_ff, pos, norm,
              activation, dropout, steps, lr, seed) -> Iterator[TrainProgress]:
        """Train a new model for this session; it joins the model list at once and is kept if stopped.

        Everything is checked before the run starts, so a refused form changes nothing.
        """
        if self.run is not None and not self.run.done:
            raise UserError("A training run is already going in this session; stop it first.")
        if not isinstance(corpus_name, str) or corpus_name not in TRAIN_CORPORA:
            raise UserError(f"Unknown corpus {str(corpus_name)[:40]!r}; choose one of {', '.join(TRAIN_CORPORA)}.")
        L = TRAIN_LIMITS
        form = dict(
            layers=check_int("layers", layers, *L["layers"]), heads=check_int("heads", heads, *L["heads"]),
            d_model=check_int("d_model", d_model, *L["d_model"]), d_ff=check_int("d_ff", d_ff, *L["d_ff"]),
            pos_encoding=check_choice("positional encoding", pos, POS_ENCODINGS),
            norm=check_choice("norm placement", norm, NORMS),
            activation=check_choice("activation", activation, ACTIVATIONS),
            dropout=check_float("dropout", dropout, *L["dropout"]), steps=check_int("steps", steps, *L["steps"]),
            lr=check_float("learning rate", lr, *L["learning rate"]), seed=check_int("seed", seed, *L["seed"]),
        )
        own_tokenizer = corpus_name in ("grammar", "text")
        if own_tokenizer:
            tokenizer_kind = check_choice("tokenizer", tokenizer_kind, TOKENIZER_KINDS)
        text = None
        if corpus_name == "text":
            text = _read_upload(upload) if upload else pasted
            if not isinstance(text, str):
                raise UserError("Paste some text or upload a UTF-8 .txt file.")
        try:
            # Stop works from here on: while the tokenizer trains, and then for the run itself
            stop = self._starting = threading.Event()
            corpus = build_corpus(corpus_name, tokenizer_kind if own_tokenizer else None, seed=form["seed"], text=text,
                                  should_stop=stop.is_set)
            mcfg, tcfg = train_tab_recipe(corpus, max_seconds=TRAIN_MAX_SECONDS, **form)
        except Stopped:
            raise UserError("Training stopped by you before it began.") from None
        except ValueError as exc:
            raise UserError(f"This training cannot start: {exc}.") from None
        finally:
            self._starting = None
        try:  # whatever is trained here must load back through the upload checks
            CHECKPOINT_LIMITS.check(mcfg)
        except ValueError as exc:
            raise UserError(f"This model would be too big to save and load again: {exc}. "
                            "Use text with fewer distinct characters or words, or a smaller model.") from None
        return self._run_training(corpus, corpus_name, mcfg, tcfg, stop)

    def _run_training(self, corpus, corpus_name, mcfg, tcfg, stop: threading.Event) -> Iterator[TrainProgress]:
        files.sweep_runs()  # long-running servers: old run folders go even when no session closed
        torch.manual_seed(tcfg.seed)
        model = DecoderLM(mcfg)
        on_gpu = TRAIN_DEVICE == "cuda" and torch.cuda.is_available()
        if on_gpu:  # ZeroGPU: CUDA exists only inside the decorated call; the model returns to the CPU after
            model.to("cuda")
        name = self._unique_name(f"my {corpus_name} model")
        entry = ModelEntry(name, model, corpus.tokenizer, {"corpus": corpus_name},
                           examples=usable_examples(corpus.sample_prompts))
        with self.turn():  # the run runs beside the session's other actions; only this change waits for them
            self._add_model(entry)  # selectable (and kept) even if the run is cancelled mid-way
            run = self.run = TrainingRun(name, stop=stop)  # a Stop pressed while the corpus was built counts
        ev = None
        try:
            for ev in train(model, corpus, tcfg, should_stop=run.stop.is_set):
                run.steps.append(ev.step)
                run.train_loss.append(ev.train_loss)
                if ev.val_loss is not None:
                    run.val_steps.append(ev.step)
                    run.val_loss.append(ev.val_loss)
                if not ev.done:
                    yield TrainProgress(f"step {ev.step}/{ev.total_steps} · loss {ev.train_loss:.3f} · "
                                        f"{ev.tokens_per_s:,.0f} tokens/s", run)
        finally:
            run.done = True
            self.touched = time.monotonic()
            model.eval()
            if on_gpu:
                model.to("cpu")
        if self.closed:  # the session was closed while training: save nothing nobody can fetch
            return
        path = self._save_for_download(entry)
        note = "" if path is not None else " The server's disk is full right now, so there is no file to download."
        yield TrainProgress(
            f"Training {_STOP_REASONS[ev.stop_reason]} after {ev.step} steps in {ev.elapsed:.1f} s: "
            f"validation loss {ev.val_loss:.3f}. '{name}' is now in the Explore model list.{note}",
            run, done=True, download=path)

    def stop_training(self) -> None:
        """End the session's training at its next step, or before it begins if it is still starting."""
        starting = self._starting
        if starting is not None:
            starting.set()
        if self.run is not None:
            self.run.stop.set()

    def _save_for_download(self, entry: ModelEntry) -> Path | None:
        """The model as one file to download, within the server's disk budget (None if refused)."""
        meta = {**entry.meta, "examples": list(entry.examples)}
        data = checkpoint_bytes(entry.model, entry.tokenizer, meta)
        try:
            with DISK_BUDGET.room(self, len(data)):
                if self.run_dir is None:
                    self.run_dir = files.new_session_dir()
                self.run_dir.mkdir(parents=True, exist_ok=True)
                path = self.run_dir / f"{files.safe_file_stem(entry.name)}.safetensors"
                atomic_write(path, data)
                return path
        except UserError:
            return None

    # -------------------------------------------------------------------------- upload

    def upload(self, path) -> str:
        """Load a .safetensors checkpoint after validating it; returns its name in the model list."""
        if not path or not isinstance(path, str):
            raise UserError("Choose a .safetensors file first.")
        name = self._unique_name(f"uploaded: {Path(path).stem[:40]}")
        held_before = MODEL_BUDGET.held(self)

        def reserve(cfg) -> None:  # the memory is granted before a tensor is allocated
            weights = 4 * cfg.n_params() + 2 * 4 * cfg.block_size * cfg.d_model  # + positional buffers
            self._hold(self._kept_after_adding(name), weights)

        try:  # the file stays where gradio put it (its cache sweeps it): a path may name someone else's file
            ck = load_checkpoint(path, before_build=reserve)
        except ValueError as exc:
            MODEL_BUDGET.hold(self, held_before)  # a reservation for a file that failed later is given back
            raise UserError(f"This file is not a Decoder Lab model this app can load (.safetensors): {exc}.") from None
        examples = usable_examples(ck.meta.get("examples") or [ck.meta.get("example_prompt")])
        self._add_model(ModelEntry(name, ck.model, ck.tokenizer, ck.meta, examples=examples))
        return name

    # --------------------------------------------------------------------------- close

    def close(self) -> None:
        """The session's state expired or its tab closed: stop training, delete its files."""
        self.closed = True
        self.stop_training()
        files.remove_dir(self.run_dir)
        self.models.clear()
        self._model_bytes.clear()
        self.reset()
        MODEL_BUDGET.release(self)
        release_freed_memory()


def release_freed_memory() -> None:
    """Hand memory freed by dropped models back to the system (glibc keeps it otherwise); no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _read_upload(path) -> str:
    if not isinstance(path, str):
        raise UserError("The uploaded text file could not be read.")
    try:  # never deleted here: the path may name a file that is not this session's (gradio sweeps its cache)
        return read_text_file(path)
    except (ValueError, OSError) as exc:
        raise UserError(f"The text file cannot be used: {exc}.") from None


# Sessions by gradio's session hash: gradio's own store can drop a tab's state in a burst of new
# sessions, this one keeps every active session (see lab.budget.SessionStore).
SESSIONS = SessionStore(Session, limiter=LIMITER)
