"""The models a lab can use: the shipped built-ins (shared, read-only) and a person's own.

A `ModelEntry` is a model with its tokenizer, the metadata its file carried and the example
prompts to offer with it: for a built-in they come from `BUILTIN_MODELS` below, for a model
trained in the app from its corpus, for an uploaded model from its file (when they fit the
prompt limit).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from model.backend import Backend, OwnBackend
from model.checkpoint import load_checkpoint
from model.config import ModelConfig
from model.film import Film
from model.tokenizers import Tokenizer
from model.transformer import DecoderLM

from ..checks import UserError
from ..limits import MANY_HEADS, MAX_PROMPT_CHARS

ASSETS = Path(__file__).resolve().parents[2] / "assets"
LISTED_VOCABULARY = 40  # a vocabulary this small is listed whole when a prompt has a token it lacks
# the notice of a prompt longer than the model's context (lab.text.cut_lines finds it again in a status)
PROMPT_CUT = "The prompt has {n} tokens but the model's context is {block}; it keeps the last {block}."


def many_heads(cfg: ModelConfig) -> bool:
    """Whether a model has so many heads (lab.limits.MANY_HEADS: 80 layers × 64 heads is 5,120) that it opens on
    one head, and the head-roles map under the text, which draws every head of the text compact in one figure,
    is the place to start (not a panel per head)."""
    return cfg.n_layers * cfg.n_heads >= MANY_HEADS


def thousands_of_heads_caption(cfg: ModelConfig) -> str:
    """What a model of many heads says first, above its one head (the page's first caption)."""
    return (f"This model has {cfg.n_layers * cfg.n_heads:,} heads ({cfg.n_layers} layers × {cfg.n_heads}): press "
            "Step, then start from the Head roles map under the text, which scores every head on the text in one "
            "figure; open the heads it singles out with the Layer and Head menus.")


# The lab's tools that read the own engine's modules or weights, beyond what model.backend's contract hands
# back (the contract's tools, Step to patching, run on every backend): what each needs, for the refusal.
OWN_ENGINE_TOOLS = {
    "lens": "The logit lens reads each layer's residual stream through the own engine's final norm and output head",
    "circuits": "The Circuits view reads the own engine's weights (W_Q, W_K, W_V, W_O, the unembedding)",
    "positions": "The positional table is read from the own engine's embedding",
    "value": "Colouring by ‖a·v·W_O‖ reads the own engine's values and output projection",
}


@dataclass(frozen=True)
class FirstView:
    """The attention view a built-in opens on for its first example prompt, with what to look for.

    layer and head count from 0; view is one of the Explore views ("weights" or "scores").
    caption is one line for a learner, and must be true: tests/lab/test_first_views.py checks every
    caption's claim numerically on the model and its first example prompt.
    """

    layer: int
    head: int
    caption: str
    view: str = "weights"

    def __post_init__(self) -> None:
        if self.layer < 0 or self.head < 0:
            raise ValueError("layer and head count from 0")
        if self.view not in ("weights", "scores"):
            raise ValueError(f"view must be 'weights' or 'scores', got {self.view!r}")
        if not self.caption.strip():
            raise ValueError("a first view needs a caption")


@dataclass(frozen=True)
class Builtin:
    file: str  # in assets/
    examples: tuple[str, ...]
    first_view: FirstView | None = None  # what to show (and say) first for examples[0]


# display name → shipped file, its example prompts (the first is the one offered by default) and
# the view worth seeing first on that prompt (numbers from `python -m lab.catalogue.first_views`)
BUILTIN_MODELS = {
    "grammar (built-in)": Builtin(
        "grammar.safetensors",
        ("anna found the key . she gave it to tom because he", "tom met lisa at the park . he", "maria lost her"),
        FirstView(layer=1, head=0, caption='Layer 1, head 0: the row of "he" puts most of its weight (0.76) on '
                                           '"tom" — the head links the pronoun to the name it stands for.')),
    "sort digits (built-in)": Builtin(
        "sort.safetensors", ("503124=", "987650=", "112233="),
        FirstView(layer=0, head=2, caption='Layer 0, head 2: the row of "=" puts its largest weight (0.50) on "0", '
                                           'the smallest digit, the one to write first; Generate, and most answer '
                                           'rows point at the next digit to write.')),
    "copy / induction (built-in)": Builtin(
        "copy.safetensors", ("hcbpadlk|", "abcdefgh|"),
        FirstView(layer=0, head=1, caption='Layer 0, head 1: the row of "|" puts 0.97 on "h", the first letter to '
                                           'copy; Generate, and each copied letter looks at the letter after its first '
                                           'copy (induction score 0.88).')),
    "article toy (built-in)": Builtin(
        "toy.safetensors", ("how is living in amsterdam <EOS>", "living in amsterdam is how <EOS>"),
        FirstView(layer=0, head=0, caption='The only head: the row of "<EOS>", which predicts "exciting", puts '
                                           'its largest weight (0.57) on "is"; in the second example, with the '
                                           'words reordered, it still finds "is" (0.96).')),
    "shakespeare (built-in)": Builtin(
        "shakespeare.safetensors",
        ("JULIET:\nO Romeo, Romeo! wherefore art thou", "KING HENRY:\nMy lords, we ",
         "First Citizen:\nWhat say you to "),
        FirstView(layer=1, head=3, caption="Layer 1, head 3: each character's row puts most of its weight (0.76 on "
                                           "average) on the space or line break just before its word — the head "
                                           "marks where the word began.")),
}
DEFAULT_MODEL = "grammar (built-in)"


@dataclass
class ModelEntry:
    name: str
    model: DecoderLM | None
    tokenizer: Tokenizer
    meta: dict
    builtin: bool = False
    examples: tuple[str, ...] = field(default_factory=tuple)
    first_view: FirstView | None = None  # built-ins only; other models open on layer 0, all heads
    film: Film | None = None  # the training film, when its training recorded one (model.film)
    # What runs the model for the Explore tools (model.backend's contract): the own engine for every model
    # with weights in this process (`model`), or another backend (nnsight) that runs a model the lab does not
    # own; such an entry has no `model`, and the tools beyond the contract say why they are not offered.
    runner: Backend | None = None

    def __post_init__(self) -> None:
        if (self.model is None) == (self.runner is None or isinstance(self.runner, OwnBackend)):
            raise ValueError("a model entry has its own engine's model or another backend, one of the two")

    @cached_property
    def backend(self) -> Backend:
        """The contract the lab's Explore tools run the model through."""
        return self.runner if self.runner is not None else OwnBackend(self.model, self.tokenizer)

    @property
    def cfg(self) -> ModelConfig:
        """The model's shape (layers, heads, context, vocabulary), whichever backend runs it."""
        return self.backend.cfg

    @property
    def own(self) -> bool:
        """Whether the own engine runs the model in this process (every tool is offered)."""
        return self.model is not None

    def refusal(self, tool: str) -> str | None:
        """Why `tool` is not offered on this model, or None: one of model.backend.BACKEND_TOOLS (the backend
        says), or one of OWN_ENGINE_TOOLS, which read the own engine's modules and weights beyond the contract."""
        if tool in OWN_ENGINE_TOOLS:
            return None if self.own else f"{OWN_ENGINE_TOOLS[tool]}; this model runs on {self.backend.where()}."
        return self.backend.refusal(tool)

    def require(self, tool: str) -> None:
        """UserError (the `refusal`'s sentence) unless `tool` is offered on this model."""
        if why := self.refusal(tool):
            raise UserError(why)

    def n_params(self) -> int:
        return self.cfg.n_params() if self.model is None else self.model.n_params()

    @cached_property
    def pieces(self) -> tuple[str, ...]:
        """Every token's display piece in id order, made once per model (GPT-2's 50,257 take a few hundred
        ms, too long to redo on every Step); callers that hand the pieces out take a list copy."""
        return tuple(self.tokenizer.piece(i) for i in range(self.tokenizer.vocab_size))

    @property
    def summary(self) -> str:
        c = self.cfg
        norm = "no norm" if c.norm == "none" else f"{c.norm}-norm"
        # without a feed-forward layer (d_ff 0) there is no activation to name
        ff = f"{c.activation} feed-forward" if c.ff_dim else "no feed-forward layer"
        return (
            f"{self.name}: {counted(c.n_layers, 'layer')} × {counted(c.n_heads, 'head')}, d_model {c.d_model}, "
            f"context {c.block_size}, {c.pos_encoding} positions, {norm}, {ff}, {self.tokenizer.kind} tokenizer "
            f"({counted(self.tokenizer.vocab_size, 'token')}), {counted(self.n_params(), 'parameter')}"
        )


def counted(n: int, noun: str) -> str:
    """"1 layer", "2 layers", "1,234 parameters": a count with its noun in agreement."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def usable_examples(candidates) -> tuple[str, ...]:
    """The example prompts worth offering: non-empty strings within the prompt limit."""
    if not isinstance(candidates, (list, tuple)):
        return ()
    return tuple(p for p in candidates if isinstance(p, str) and p.strip() and len(p) <= MAX_PROMPT_CHARS)[:8]


def encode_prompt(prompt, entry: ModelEntry) -> tuple[list[int], list[str]]:
    """A prompt's token ids for this model and any notices; refuses empty, long or unknown input."""
    if not isinstance(prompt, str):
        raise UserError("The prompt must be text.")
    if not prompt.strip():
        raise UserError("The prompt is empty: type a few words or characters first.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt has {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}.")
    tokenizer, block_size = entry.tokenizer, entry.cfg.block_size
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
        notices.append(PROMPT_CUT.format(n=len(ids), block=block_size))
        ids = ids[-block_size:]
    return ids, notices


class BuiltinModels:
    """Shipped checkpoints, loaded on first use and shared (read-only) by every session."""

    def __init__(self, models: dict[str, Builtin], folder: Path = ASSETS):
        self.models = dict(models)
        self.folder = folder
        self._loaded: dict[str, ModelEntry] = {}
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return list(self.models)

    def path(self, name: str) -> Path:
        return self.folder / self.models[name].file

    def get(self, name: str) -> ModelEntry:
        with self._lock:
            if name not in self._loaded:
                ck = load_checkpoint(self.path(name))
                for p in ck.model.parameters():
                    p.requires_grad_(False)
                self._loaded[name] = ModelEntry(name, ck.model, ck.tokenizer, ck.meta, builtin=True,
                                                examples=self.models[name].examples,
                                                first_view=self.models[name].first_view,
                                                film=ck.film)
            return self._loaded[name]


BUILTINS = BuiltinModels(BUILTIN_MODELS)
