"""The models a lab can use: the shipped built-ins (shared, read-only) and a person's own.

A `ModelEntry` is a model with its tokenizer, the metadata its file carried and the example
prompts to offer with it: for a built-in they come from `BUILTIN_MODELS` below, for a model
trained in the app from its corpus, for an uploaded model from its file (when they fit the
prompt limit).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from model.checkpoint import load_checkpoint
from model.tokenizers import Tokenizer
from model.transformer import DecoderLM

from .limits import MAX_PROMPT_CHARS

ASSETS = Path(__file__).resolve().parents[1] / "assets"


@dataclass(frozen=True)
class Builtin:
    file: str  # in assets/
    examples: tuple[str, ...]


# display name → shipped file and its example prompts (the first is the one offered by default)
BUILTIN_MODELS = {
    "grammar (built-in)": Builtin("grammar.safetensors", ("anna found the key . she gave it to tom because he",
                                                          "tom met lisa at the park . he", "maria lost her")),
    "sort digits (built-in)": Builtin("sort.safetensors", ("503124=", "987650=", "112233=")),
    "copy / induction (built-in)": Builtin("copy.safetensors", ("hcbpadlk|", "abcdefgh|")),
    "article toy (built-in)": Builtin("toy.safetensors", ("how is living in amsterdam <EOS>",
                                                          "living in amsterdam is how <EOS>")),
    "shakespeare (built-in)": Builtin("shakespeare.safetensors", ("JULIET:\nO Romeo, Romeo! wherefore art thou",
                                                                  "KING HENRY:\nMy lords, we ",
                                                                  "First Citizen:\nWhat say you to ")),
}
DEFAULT_MODEL = "grammar (built-in)"


@dataclass
class ModelEntry:
    name: str
    model: DecoderLM
    tokenizer: Tokenizer
    meta: dict
    builtin: bool = False
    examples: tuple[str, ...] = field(default_factory=tuple)

    @property
    def summary(self) -> str:
        c = self.model.cfg
        return (
            f"{self.name}: {c.n_layers} layers × {c.n_heads} heads, d_model {c.d_model}, context {c.block_size}, "
            f"{c.pos_encoding} positions, {c.norm}-norm, {c.activation}, {self.tokenizer.kind} tokenizer "
            f"({self.tokenizer.vocab_size} tokens), {self.model.n_params():,} parameters"
        )


def usable_examples(candidates) -> tuple[str, ...]:
    """The example prompts worth offering: non-empty strings within the prompt limit."""
    if not isinstance(candidates, (list, tuple)):
        return ()
    return tuple(p for p in candidates if isinstance(p, str) and p.strip() and len(p) <= MAX_PROMPT_CHARS)[:8]


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
                                                examples=self.models[name].examples)
            return self._loaded[name]


BUILTINS = BuiltinModels(BUILTIN_MODELS)
