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
import dataclasses
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
from model.film import FILM_FRAMES, MAX_PROBE_TOKENS, Film, default_probe, task_of
from model.generate import Decoder, Sampling, Step, adjust_probs, generate
from model.presets import train_tab_defaults, train_tab_recipe
from model.train import train, well_above_best
from model.transformer import DecoderLM

from . import files
from .budget import DISK_BUDGET, LIMITER, MODEL_BUDGET, SessionStore, model_bytes
from .checks import UserError, check_choice, check_float, check_int
from .limits import (
    ACTIVATIONS, ATTENTION_VIEWS, CHECKPOINT_LIMITS, COLOUR_MODES, MAX_LOG, MAX_NEW_TOKENS, MAX_PROMPT_CHARS, MAX_USER_MODELS, NORMS,
    POS_ENCODINGS, TOKENIZER_KINDS, TRAIN_CORPORA, TRAIN_LIMITS, TRAIN_MAX_SECONDS,
)
from .models import BUILTINS, BuiltinModels, ModelEntry, usable_examples
from .probing import ProbeSettings

NARROW_PX = 700  # a window narrower than this gets the one-column page (phones)
SHORT_PX = 800  # a window lower than this (a projector's 1280×720) hides the page's header line
HEAD_TOOLS = ("roles", "lens", "ablate", "compare")  # the tabs under the Explore text (ui/heads_tab.py)

# Training runs on the GPU only when asked (or on ZeroGPU); stepping a model this small is fastest on the CPU.
TRAIN_DEVICE = os.environ.get("DECODER_LAB_DEVICE") or ("cuda" if os.environ.get("SPACES_ZERO_GPU") else "cpu")


@dataclass
class View:
    """Which attention picture to draw: a layer, one head (None = all of the layer's) and a view."""

    layer: int
    head: int | None
    view: str


@dataclass
class Display:
    """How this person's figures are drawn: the colour mode of attention weights, large fonts for
    projecting, and the size of their browser window (figures are laid out for it)."""

    colour: str = "linear"
    presentation: bool = False
    width: int = 1366
    height: int = 900
    tool: str = "roles"  # the head tool shown under the text (HEAD_TOOLS): only it is drawn at each Step

    @property
    def narrow(self) -> bool:
        return self.width < NARROW_PX

    @property
    def plot_width(self) -> int:
        """Width of the attention figure: the left column of the Explore page, the whole page when narrow."""
        return max(260, self.width - 64) if self.narrow else max(480, int(self.width * 0.56))

    @property
    def screen_height(self) -> int:
        """Tallest any figure may be: the window less a margin."""
        return max(320, self.height - 40)

    @property
    def plot_height(self) -> int:
        """Tallest the attention figure may be: what the window leaves below the page's controls."""
        if self.narrow:
            return max(300, min(self.width + 60, self.height - 110))
        large = 30 if self.presentation else 0  # large fonts: a taller caption above the figure
        return max(320, self.height - (385 if self.height > SHORT_PX else 365) - large)  # the header hides when short

    @property
    def chart_height(self) -> int:
        """Tallest the next-token chart may be: what the window leaves below the text and its shading note
        (assets/explore.css keeps the text to a few lines on a short window)."""
        if self.narrow:
            return 360
        return min(360, max(220, self.height - (480 if self.presentation else 455)))


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
    """The distribution a token of the text was drawn from: probs (V,) before and adjusted (V,)
    after temperature / top-k / top-p, the chosen id and every token's display piece.

    index: the token's position in the window. typed: the token came from the prompt, so nothing
    was sampled: probs is what the model predicted there (from the tokens before it) and
    adjusted is None. resampled: adjusted is under other sampling settings than the token was
    drawn with (the ones asked for), not the distribution it was drawn from.
    """

    pieces: list[str]
    probs: np.ndarray
    adjusted: np.ndarray | None
    chosen: int
    index: int = -1
    typed: bool = False
    resampled: bool = False


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


@dataclass
class TrainProgress:
    """What a training reports as it goes: a status line, and at the end the model and its file."""

    message: str
    run: TrainingRun
    done: bool = False
    download: Path | None = None


def removed_note(names: list[str]) -> str:
    """The sentence that tells a person which own models were removed to make room ('' if none)."""
    if not names:
        return ""
    quoted = ", ".join(f"'{n}'" for n in names)
    which = f"Your oldest model {quoted} was" if len(names) == 1 else f"Your oldest models {quoted} were"
    return f"{which} removed to make room ({MAX_USER_MODELS} own models at most)."


# How long an action waits for the same session's previous one (a Generate) to end; a test server sets it
# far above any Generate it streams (DECODER_LAB_BUSY_WAIT_S), so that a slow machine waits, never refuses
BUSY_WAIT_S = float(os.environ.get("DECODER_LAB_BUSY_WAIT_S", "10"))
_STOP_REASONS = {"finished": "finished", "stopped": "stopped by you", "time limit": "hit the time limit"}


LISTED_VOCABULARY = 40  # a vocabulary this small is listed whole when a prompt has a token it lacks


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
        if tokenizer.vocab_size <= LISTED_VOCABULARY:
            known = ", ".join(tokenizer.piece(i) for i in range(tokenizer.vocab_size) if i != tokenizer.unk_id)
            see = f": {known}."
        else:
            see = "; open “Vocabulary” (under the text) to see them all, or try one of the example prompts."
        raise UserError(f"This model does not know these {unit}: {shown}. "
                        f"Its vocabulary has {tokenizer.vocab_size} tokens{see}")
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
        self.drawn: list[Step] = []  # what each generated token was drawn from, in order (rows dropped)
        self.display = Display()
        self.query: int | None = None  # the token selected in the text (window position; None = the last)
        # what made the current text, in order (lab.sessionfile replays it): {"do": "step" |
        # "generate" | "undo", "sampling": [temperature, top_k, top_p], "tokens": [ids]}
        self.log: list[dict] = []
        self.probe = ProbeSettings()  # heads to ablate, a row to edit (lab.probing)
        self._roles = None  # lab.probing.head_roles of the current text, computed once per text
        # a session file or a link just set up this model's text: the model list's change event that
        # follows (its value set by the same answer) must keep it, not start again
        self.keep_on_select: str | None = None
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
            self.decoder, self.prompt, self.notices, self.last_step, self.drawn = None, None, [], None, []
            self.log = []
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

    def set_display(self, colour=None, presentation=None, screen=None) -> Display:
        """Change how figures are drawn (None leaves a setting as it is). screen: "WIDTHxHEIGHT" of
        the browser window in CSS pixels."""
        d = self.display
        colour = d.colour if colour is None else check_choice("colour", colour, COLOUR_MODES)
        if presentation is not None and not isinstance(presentation, bool):
            raise UserError("presentation must be true or false.")
        width, height = d.width, d.height
        if screen is not None:
            parts = screen.split("x") if isinstance(screen, str) else []
            if len(parts) != 2 or not all(p.isdigit() and len(p) <= 5 for p in parts):
                raise UserError("screen must look like 1366x900.")
            width, height = (min(max(int(p), 200), 8000) for p in parts)
        self.display = Display(colour, d.presentation if presentation is None else presentation, width, height, d.tool)
        return self.display

    def show_tool(self, tool) -> str:
        """Which head tool the page shows (the others are drawn when they are shown)."""
        self.display = dataclasses.replace(self.display, tool=check_choice("head tool", tool, HEAD_TOOLS))
        return tool

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
            return 0 if d is None else (sum(a.nbytes for a in (*d.attention, *d.scores))
                                        + sum(s.probs.nbytes + s.adjusted.nbytes for s in self.drawn))
        entry = entry or self.entry
        cfg = entry.model.cfg
        t = min(tokens, cfg.block_size)
        # attention and scores of the window, and the two distributions kept for every token
        return 2 * cfg.n_layers * cfg.n_heads * t * t * 4 + 2 * entry.tokenizer.vocab_size * 4 * tokens

    def _hold(self, models: list[str] | None = None, extra_model: int = 0, text: int | None = None) -> None:
        """Tell the server-wide memory budget what this session will hold; it may refuse (UserError)
        before anything changes, or make room by taking from idle sessions."""
        models = list(self.models) if models is None else models
        total = sum(self._model_bytes.get(n, 0) for n in models) + extra_model
        MODEL_BUDGET.hold(self, total + (self._text_bytes() if text is None else text))

    def _add_model(self, entry: ModelEntry) -> list[str]:
        """Keep at most MAX_USER_MODELS of a person's own models (the oldest goes); returns the names
        of the models removed to make room (`removed_note` says so to the person).

        The server-wide budget is asked first: it may refuse (UserError) and then nothing changes.
        """
        nbytes = model_bytes(entry.model) + film_bytes(entry)
        kept = self._kept_after_adding(entry.name)
        self._hold(kept, nbytes)
        self._model_bytes[entry.name] = nbytes
        self.models[entry.name] = entry
        self.models.move_to_end(entry.name)
        removed = []
        while len(self.models) > MAX_USER_MODELS:
            gone, _ = self.models.popitem(last=False)
            self._model_bytes.pop(gone, None)
            removed.append(gone)
        return removed

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
        # a new text: an edited row's positions meant the old one; another model has other heads
        self.probe = ProbeSettings() if entry is not self.entry else dataclasses.replace(self.probe, edit=None)
        self.entry, self.prompt, self.notices, self.last_step, self.drawn = entry, prompt, notices, None, []
        self.query, self.log = None, []

    def _continues(self, entry: ModelEntry, prompt, sampling: Sampling) -> bool:
        """Whether a Step or Generate goes on with the current text (same model, prompt and seed)."""
        d = self.decoder
        return d is not None and self.entry is entry and self.prompt == prompt and d.sampling.seed == sampling.seed

    def _room(self) -> int:
        """How many more tokens the current text may get; refuses when it is finished."""
        d = self.decoder
        if d.eos_id is not None and len(d.ids) > d.prompt_len and d.ids[-1] == d.eos_id:
            raise UserError("The model ended this text with <EOS>. Undo takes that token back; "
                            "Reset starts again from the prompt.")
        room = MAX_NEW_TOKENS - (len(d.ids) - d.prompt_len)
        if room <= 0:
            raise UserError(f"This text already has {MAX_NEW_TOKENS} generated tokens; Reset to start again.")
        return room

    def _keep(self, step: Step) -> Step:
        self.last_step, self.query = step, None
        self.drawn.append(dataclasses.replace(step, rows=[]))
        return step

    def _record(self, action: dict) -> None:
        """Add an action to the text's log; past MAX_LOG actions the log stops (and says so with a
        None at its end): a text made of endless Step/Undo cannot be saved, and takes no memory."""
        if len(self.log) < MAX_LOG:
            self.log.append(action)
        elif self.log[-1] is not None:
            self.log.append(None)

    def kept_on_select(self, name) -> bool:
        """Whether selecting `name` now keeps the text a session file or link just set up (once)."""
        kept = self.keep_on_select is not None and self.keep_on_select == name
        self.keep_on_select = None
        return kept

    def select_model(self, name) -> ModelEntry:
        """Switch model: the text starts again, and the heads' settings go (the heads differ)."""
        entry = self.entry_for(name)
        self.reset()
        if entry is not self.entry:
            self.probe = ProbeSettings()
        self.entry = entry  # the head tools (and a session saved now) are about this model from here on
        return entry

    def step(self, model_name, prompt, sampling: Sampling, force: int | None = None) -> Step:
        """One new token. The text continues unless the model, prompt or seed changed.
        force: the token to take instead of sampling (replaying a saved session)."""
        entry = self.entry_for(model_name)
        if self._continues(entry, prompt, sampling):
            self._room()
            self._hold(text=self._text_bytes(entry, len(self.decoder.ids) + 1))  # before the text grows
        else:
            self._start(entry, prompt, sampling, new_tokens=1)
        step = self._keep(next(generate(self.decoder, 1, sampling, force=None if force is None else [force])))
        self._record({"do": "step", "sampling": _settings(sampling), "tokens": [step.token_id]})
        return step

    def generate(self, model_name, prompt, sampling: Sampling, max_new, force=None) -> Iterator[Step]:
        """Up to `max_new` more tokens, one Step at a time: the text goes on (as Step does) unless
        the model, prompt or seed changed; then it starts again from the prompt.

        Attention is computed once, after the last token: the wiring only draws it then.
        """
        entry = self.entry_for(model_name)
        max_new = check_int("max new tokens", max_new, 1, MAX_NEW_TOKENS)
        if self._continues(entry, prompt, sampling):
            max_new = min(max_new, self._room())
            self._hold(text=self._text_bytes(entry, len(self.decoder.ids) + max_new))
        else:
            self._start(entry, prompt, sampling, new_tokens=max_new)
        record = {"do": "generate", "sampling": _settings(sampling), "tokens": []}
        self._record(record)
        for s in generate(self.decoder, max_new, sampling, attention="last", force=force):
            record["tokens"].append(s.token_id)
            yield self._keep(s)

    def undo(self) -> bool:
        """Take the last generated token back (never the prompt)."""
        if self.decoder is None:
            return False
        undone = self.decoder.undo()
        if undone:
            self.drawn.pop()
            self._record({"do": "undo"})
        self.last_step = self.drawn[-1] if self.drawn else None
        self.query = None
        e = self.probe.edit
        if e is not None and max(e.query, e.key or 0) >= len(self.decoder.ids):  # its token was taken back
            self.probe = dataclasses.replace(self.probe, edit=None)
        self._hold()  # less memory: always granted
        return undone

    def reset(self) -> None:
        """The text goes; the heads chosen to ablate stay for the next text on this model, an edited row
        (positions of the text that went) does not."""
        self.decoder, self.prompt, self.notices, self.last_step, self.drawn = None, None, [], None, []
        self.query, self._roles, self.log = None, None, []
        self.probe = dataclasses.replace(self.probe, edit=None)
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

    def probabilities(self, index=None, sampling: Sampling | None = None) -> Probabilities | None:
        """The distribution the token at window position `index` (default: the last) was drawn from;
        with `sampling`, a generated token's adjusted distribution is the one these settings give.

        A generated token: the distribution kept when it was sampled. A prompt token: what the
        model predicts there from the tokens before it (nothing was sampled). None for the first
        token of the text (nothing comes before it) and when there is no text.
        """
        d = self.decoder
        if d is None:
            return None
        n = len(d.window)
        index = n - 1 if index is None else check_int("token index", index, 0, max(n - 1, 0))
        pos = d.start + index  # position in the whole text
        tok = self.entry.tokenizer
        pieces = [tok.piece(i) for i in range(tok.vocab_size)]
        if pos >= d.prompt_len:
            s = self.drawn[pos - d.prompt_len]
            adjusted = s.adjusted
            if sampling is not None:  # log(probs) are the logits up to a constant, which softmax ignores
                adjusted = adjust_probs(torch.log(torch.from_numpy(s.probs)), sampling).numpy()
                if np.allclose(adjusted, s.adjusted, rtol=0, atol=1e-6):  # the settings it was drawn with
                    adjusted = s.adjusted
            return Probabilities(pieces, s.probs, adjusted, s.token_id, index=index,
                                 resampled=adjusted is not s.adjusted)
        if pos == 0:
            return None
        context = d.ids[max(0, pos - d.block_size):pos]
        with torch.inference_mode():
            logits = self.entry.model(torch.tensor([context], device=d.device)).logits[0, -1]
        probs = torch.softmax(logits.float(), dim=-1).numpy()
        return Probabilities(pieces, probs, None, d.ids[pos], index=index, typed=True)

    def select(self, index) -> int:
        """Select the token at window position `index` as the query of the head tools."""
        if self.decoder is None:
            raise UserError("Press Step first: there is no text to select from.")
        self.query = check_int("token index", index, 0, len(self.decoder.window) - 1)
        return self.query

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
        kind, table = entry.model.positional_table()
        return entry, kind, None if table is None else table.numpy().astype(np.float32)

    def adopt(self, scratch: "Session", name: str) -> str:
        """Take over what a scratch session built (lab.sessionfile: a replayed session file): its own
        model, if any, joins this session's models; its text, head settings and display follow.
        The memory is granted first (UserError changes nothing). Returns the model's name here."""
        own = scratch.models.get(name)
        if own is not None:
            nbytes = scratch._model_bytes[name]
            new_name = self._unique_name(own.name)  # a second copy gets a name of its own
            kept = self._kept_after_adding(new_name)
            self._hold(kept, nbytes, text=scratch._text_bytes())  # the only step that may refuse
            own.name = new_name
            self._model_bytes[new_name] = nbytes
            self.models[new_name] = own
            for gone in [n for n in self.models if n != new_name and n not in kept]:  # the oldest, to make room
                del self.models[gone]
                self._model_bytes.pop(gone, None)
        else:
            self._hold(text=scratch._text_bytes())
        for attr in ("entry", "decoder", "prompt", "notices", "last_step", "drawn", "query", "probe", "log"):
            setattr(self, attr, getattr(scratch, attr))
        self._roles = None
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
        (model.presets.train_tab_defaults), inside the form's limits."""
        return train_tab_defaults(corpus_name, TRAIN_LIMITS)

    def train(self, corpus_name, pasted, upload, tokenizer_kind, layers, heads, d_model, d_ff, pos, norm,
              activation, dropout, steps, lr, seed, keep_best=True, probe=None) -> Iterator[TrainProgress]:
        """Train a new model for this session; it joins the model list at once and is kept if stopped.

        With `keep_best`, the model ends with the weights of its lowest validation loss (model.train).
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
        if not isinstance(keep_best, bool):
            raise UserError("keep best must be true or false.")
        if probe is not None and not isinstance(probe, str):
            raise UserError("The film's probe prompt must be text.")
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
            mcfg, tcfg = train_tab_recipe(corpus, max_seconds=TRAIN_MAX_SECONDS, keep_best=keep_best, **form)
            probe_ids = self._probe_ids(corpus, corpus_name, probe, mcfg.block_size)
            tcfg = dataclasses.replace(tcfg, film_frames=FILM_FRAMES, probe_ids=tuple(probe_ids))
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

    @staticmethod
    def _probe_ids(corpus, corpus_name, probe, block_size: int) -> list[int]:
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

    def _run_training(self, corpus, corpus_name, mcfg, tcfg, stop: threading.Event) -> Iterator[TrainProgress]:
        files.sweep_runs()  # long-running servers: old run folders go even when no session closed
        torch.manual_seed(tcfg.seed)
        model = DecoderLM(mcfg)
        on_gpu = TRAIN_DEVICE == "cuda" and torch.cuda.is_available()
        if on_gpu:  # ZeroGPU: CUDA exists only inside the decorated call; the model returns to the CPU after
            model.to("cuda")
            tcfg = dataclasses.replace(tcfg, bf16=True)  # CUDA trains under bfloat16 autocast
        name = self._unique_name(f"my {corpus_name} model")
        entry = ModelEntry(name, model, corpus.tokenizer, {"corpus": corpus_name},
                           examples=usable_examples(corpus.sample_prompts))
        probe = list(tcfg.probe_ids)
        # the film grows frame by frame while the model trains: the film section can show it meanwhile
        entry.film = Film(probe, [corpus.tokenizer.piece(i) for i in probe], [], tcfg.steps,
                          task=task_of(corpus_name))
        with self.turn():  # the run runs beside the session's other actions; only this change waits for them
            removed = self._add_model(entry)  # selectable (and kept) even if the run is cancelled mid-way
            run = self.run = TrainingRun(name, stop=stop, total_steps=tcfg.steps, max_seconds=tcfg.max_seconds,
                                         keep_best=tcfg.keep_best, removed=removed)  # a Stop while the corpus was built counts
        notes = [removed_note(removed)] if removed else []
        ev = None
        try:
            for ev in train(model, corpus, tcfg, should_stop=run.stop.is_set):
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
        yield TrainProgress("\n".join([
            f"Training {_STOP_REASONS[ev.stop_reason]} after {ev.step} steps in {ev.elapsed:.1f} s: "
            f"{loss}. '{name}' is now in the Explore model list.{note}", *notes, *([hint] if hint else [])]),
            run, done=True, download=path)

    def stop_training(self) -> None:
        """End the session's training at its next step, or before it begins if it is still starting."""
        starting = self._starting
        if starting is not None:
            starting.set()
        if self.run is not None:
            self.run.stop.set()

    @staticmethod
    def checkpoint_data(entry: ModelEntry) -> bytes:
        """The model as the bytes of one .safetensors file: weights, tokenizer, meta with its examples, film."""
        return checkpoint_bytes(entry.model, entry.tokenizer, {**entry.meta, "examples": list(entry.examples)},
                                film=entry.film)

    def _save_for_download(self, entry: ModelEntry) -> Path | None:
        """The model as one file to download, within the server's disk budget (None if refused)."""
        data = self.checkpoint_data(entry)
        try:
            return self.save_file(entry.name, ".safetensors", data)
        except UserError:
            return None

    # -------------------------------------------------------------------------- upload

    def upload(self, path) -> str:
        """Load a .safetensors checkpoint after validating it; returns its name in the model list."""
        return self.upload_noting_removed(path)[0]

    def upload_noting_removed(self, path) -> tuple[str, list[str]]:
        """`upload`, also returning the own models removed to make room for it (see `removed_note`)."""
        if not path or not isinstance(path, str):
            raise UserError("Choose a .safetensors file first.")
        name = self._unique_name(f"uploaded: {Path(path).stem[:40]}")
        held_before = MODEL_BUDGET.held(self)

        def reserve(cfg) -> None:  # the memory is granted before a tensor is allocated
            weights = 4 * cfg.n_params() + 2 * 4 * cfg.block_size * cfg.d_model  # + positional buffers
            self._hold(self._kept_after_adding(name), weights)

        try:  # the file stays where gradio put it (its cache sweeps it): a path may name someone else's file
            ck = load_checkpoint(path, before_build=reserve)
        except UserError as exc:  # the memory budget's refusal in `reserve`: the file itself was read fine
            MODEL_BUDGET.hold(self, held_before)
            raise UserError(f"This model was refused because the server's memory budget is full (the file is "
                            f"not damaged): {str(exc).rstrip('.')}.") from None
        except ValueError as exc:
            MODEL_BUDGET.hold(self, held_before)  # a reservation for a file that failed later is given back
            raise UserError(upload_refusal(str(exc))) from None
        examples = usable_examples(ck.meta.get("examples") or [ck.meta.get("example_prompt")])
        removed = self._add_model(ModelEntry(name, ck.model, ck.tokenizer, ck.meta, examples=examples,
                                             film=ck.film))
        return name, removed

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


def _settings(s: Sampling) -> list:
    """A Step's sampling settings as a session file keeps them (the seed is the text's own)."""
    return [s.temperature, s.top_k, s.top_p]


def film_bytes(entry: ModelEntry) -> int:
    """Memory a model's film takes (or will take once its training has recorded every frame):
    per frame, the attention of every layer and head on the probe, float32."""
    if entry.film is None:
        return 0
    cfg, t = entry.model.cfg, len(entry.film.probe_ids)
    frames = max(len(entry.film.frames), FILM_FRAMES + 2)
    return frames * cfg.n_layers * cfg.n_heads * t * t * 4


UPLOAD_DETAIL_CHARS = 160  # the exact reason, shortened: a message stays a few lines (bench/fuzz.py bounds it)


def upload_refusal(reason: str) -> str:
    """A refused upload in a learner's words first; the exact reason after, for whoever needs it."""
    if reason.startswith(("not a safetensors", "safetensors header", "file is ")) or "8-byte" in reason:
        what = "This file is not a Decoder Lab model (.safetensors): it is not a safetensors file at all."
    elif reason.startswith("not a Decoder Lab checkpoint"):
        what = "This file is a safetensors file, but not a Decoder Lab model: it lacks the model's description."
    else:
        what = "This file is not a Decoder Lab model this app can load (.safetensors): part of it is damaged."
    reason = reason if len(reason) <= UPLOAD_DETAIL_CHARS else reason[: UPLOAD_DETAIL_CHARS - 1] + "…"
    return f"{what} Load a model saved with the Train tab's Download button. Details: {reason}."


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
