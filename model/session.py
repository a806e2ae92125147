"""Per-person state of the explorer, free of any UI code.

The app keeps one `Workspace` per browser session (in `gr.State`). Built-in models are shared
and read-only; models a person trains or uploads live only in their own workspace.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint, load_checkpoint
from .generate import Decoder, Sampling, Step
from .tokenizers import Tokenizer
from .transformer import DecoderLM

MAX_PROMPT_CHARS = 2000
MAX_NEW_TOKENS = 256
MAX_USER_MODELS = 3


class UserError(ValueError):
    """A problem with what the person asked for; its message is shown to them as is."""


@dataclass
class ModelEntry:
    name: str
    model: DecoderLM
    tokenizer: Tokenizer
    meta: dict
    builtin: bool = False

    @property
    def summary(self) -> str:
        c = self.model.cfg
        return (
            f"{self.name}: {c.n_layers} layers × {c.n_heads} heads, d_model {c.d_model}, context {c.block_size}, "
            f"{c.pos_encoding} positions, {c.norm}-norm, {c.activation}, {self.tokenizer.kind} tokenizer "
            f"({self.tokenizer.vocab_size} tokens), {self.model.n_params():,} parameters"
        )


class BuiltinModels:
    """Shipped checkpoints, loaded on first use and shared (read-only) by every session."""

    def __init__(self, paths: dict[str, Path]):
        self.paths = dict(paths)
        self._loaded: dict[str, ModelEntry] = {}
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return list(self.paths)

    def get(self, name: str) -> ModelEntry:
        with self._lock:
            if name not in self._loaded:
                ck: Checkpoint = load_checkpoint(self.paths[name])
                for p in ck.model.parameters():
                    p.requires_grad_(False)
                self._loaded[name] = ModelEntry(name, ck.model, ck.tokenizer, ck.meta, builtin=True)
            return self._loaded[name]


def check_int(name: str, value, lo: int, hi: int) -> int:
    """Whole number in [lo, hi], from a UI/API value that may be a float, a numeric string or junk."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise UserError(f"{name} must be a whole number between {lo} and {hi}; got {value[:20]!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{name} must be a whole number between {lo} and {hi}; got {value!r}")
    if value != int(value) or not lo <= value <= hi:
        raise UserError(f"{name} must be a whole number between {lo} and {hi}; got {value!r}")
    return int(value)


def check_float(name: str, value, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not lo <= value <= hi:
        raise UserError(f"{name} must be a number between {lo} and {hi}; got {value!r}")
    return float(value)


def make_sampling(temperature, top_k, top_p, seed) -> Sampling:
    return Sampling(
        temperature=check_float("temperature", temperature, 0.0, 2.0),
        top_k=check_int("top-k", top_k, 0, 50),
        top_p=check_float("top-p", top_p, 0.05, 1.0),
        seed=check_int("seed", seed, 0, 2**31 - 1),
    )


@dataclass
class Encoded:
    ids: list[int]
    notices: list[str]


def encode_prompt(prompt, tokenizer: Tokenizer, block_size: int) -> Encoded:
    """Validate and tokenise a prompt; over-long prompts keep their last tokens, with a notice."""
    if not isinstance(prompt, str):
        raise UserError("the prompt must be text")
    if not prompt.strip():
        raise UserError("The prompt is empty: type a few words or characters first.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt has {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}.")
    enc = tokenizer.encode_verbose(prompt)
    if enc.unknown:
        shown = ", ".join(repr(u) for u in enc.unknown[:8]) + (" …" if len(enc.unknown) > 8 else "")
        unit = "words" if tokenizer.kind == "word" else "characters"
        raise UserError(
            f"This model does not know these {unit}: {shown}. "
            f"Its vocabulary has {tokenizer.vocab_size} tokens; try one of the example prompts."
        )
    notices = []
    ids = enc.ids
    if not ids:
        raise UserError("The prompt has no tokens for this model.")
    if len(ids) > block_size:
        notices.append(
            f"The prompt has {len(ids)} tokens but the model's context is {block_size}; "
            f"it keeps the last {block_size}."
        )
        ids = ids[-block_size:]
    return Encoded(ids, notices)


@dataclass
class TrainingRun:
    name: str
    stop: threading.Event = field(default_factory=threading.Event)
    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    done: bool = False


class Workspace:
    """Everything one person has: their models, the text being generated, their training run."""

    def __init__(self) -> None:
        self.models: OrderedDict[str, ModelEntry] = OrderedDict()
        self.entry: ModelEntry | None = None
        self.decoder: Decoder | None = None
        self.prompt: str | None = None
        self.notices: list[str] = []
        self.last_step: Step | None = None
        self.run: TrainingRun | None = None
        self.checkpoint_path: Path | None = None
        self.touched = time.time()
        self.run_dir: Path | None = None
        self.closed = False  # set when the session's state is deleted (tab closed or expired)

    def add_model(self, entry: ModelEntry) -> None:
        """Keep at most MAX_USER_MODELS of a person's own models (oldest dropped)."""
        self.models[entry.name] = entry
        self.models.move_to_end(entry.name)
        while len(self.models) > MAX_USER_MODELS:
            self.models.popitem(last=False)

    def unique_name(self, base: str) -> str:
        name, n = base, 2
        while name in self.models:
            name, n = f"{base} ({n})", n + 1
        return name

    def reset(self) -> None:
        self.decoder, self.prompt, self.notices, self.last_step = None, None, [], None

    def start(self, entry: ModelEntry, prompt: str, sampling: Sampling) -> None:
        enc = encode_prompt(prompt, entry.tokenizer, entry.model.cfg.block_size)
        self.entry, self.prompt, self.notices, self.last_step = entry, prompt, enc.notices, None
        self.decoder = Decoder(entry.model, enc.ids, sampling, eos_id=entry.tokenizer.eos_id, piece=entry.tokenizer.piece)

    def ensure_started(self, entry: ModelEntry, prompt: str, sampling: Sampling) -> None:
        """(Re)start when the model, prompt or seed changed; otherwise continue the same text."""
        d = self.decoder
        if d is None or self.entry is not entry or self.prompt != prompt or d.sampling.seed != sampling.seed:
            self.start(entry, prompt, sampling)

    def tokens(self) -> list[tuple[str, str]]:
        """(display piece, "prompt"|"generated") for every token in the current window."""
        d = self.decoder
        if d is None:
            return []
        piece = self.entry.tokenizer.piece
        return [(piece(t), "prompt" if d.start + i < d.prompt_len else "generated") for i, t in enumerate(d.window)]

    def generated_text(self) -> str:
        d = self.decoder
        return "" if d is None else self.entry.tokenizer.decode(d.ids[d.prompt_len :])

    def attention(self, layer: int, kind: str) -> np.ndarray:
        d = self.decoder
        mats = d.attention if kind == "weights" else d.scores
        return mats[layer]
