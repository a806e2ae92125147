"""A person's own models (trained here or uploaded) and the memory each takes.

At most MAX_USER_MODELS are kept, the oldest goes first. The bytes of each are what the server's
memory budget (lab.server.budget.MODEL_BUDGET) counts for them: the weights and, for a model with a
training film, the film's attention frames. The session asks the budget before a model joins.
"""

from __future__ import annotations

from collections import OrderedDict

from model.film import FILM_FRAMES

from ..limits import MAX_USER_MODELS
from ..server.budget import model_bytes
from .models import ModelEntry


def film_bytes(entry: ModelEntry) -> int:
    """Memory a model's film takes (or will take once its training has recorded every frame):
    per frame, the attention of every layer and head on the probe, float32."""
    if entry.film is None:
        return 0
    cfg, t = entry.cfg, len(entry.film.probe_ids)
    frames = max(len(entry.film.frames), FILM_FRAMES + 2)
    return frames * cfg.n_layers * cfg.n_heads * t * t * 4


def entry_bytes(entry: ModelEntry) -> int:
    """What the memory budget counts for an own model: its weights and its film."""
    return model_bytes(entry.model) + film_bytes(entry)


def removed_note(names: list[str]) -> str:
    """The sentence that tells a person which own models were removed to make room ('' if none)."""
    if not names:
        return ""
    quoted = ", ".join(f"'{n}'" for n in names)
    which = f"Your oldest model {quoted} was" if len(names) == 1 else f"Your oldest models {quoted} were"
    return f"{which} removed to make room ({MAX_USER_MODELS} own models at most)."


class OwnModels:
    """The own models, oldest first, with the bytes the memory budget counts for each."""

    def __init__(self) -> None:
        self.models: OrderedDict[str, ModelEntry] = OrderedDict()
        self.nbytes: dict[str, int] = {}

    def kept_after_adding(self, name: str) -> list[str]:
        """Own models that stay when `name` joins (at most MAX_USER_MODELS; the oldest goes)."""
        others = [n for n in self.models if n != name]
        return others[len(others) - (MAX_USER_MODELS - 1):] if MAX_USER_MODELS > 1 else []

    def bytes_of(self, names) -> int:
        return sum(self.nbytes.get(n, 0) for n in names)

    def unique_name(self, base: str) -> str:
        name, n = base, 2
        while name in self.models:
            name, n = f"{base} ({n})", n + 1
        return name

    def add(self, entry: ModelEntry, nbytes: int) -> list[str]:
        """Keep `entry` (newest); returns the names of the oldest models removed to make room."""
        self.nbytes[entry.name] = nbytes
        self.models[entry.name] = entry
        self.models.move_to_end(entry.name)
        removed = []
        while len(self.models) > MAX_USER_MODELS:
            gone, _ = self.models.popitem(last=False)
            self.nbytes.pop(gone, None)
            removed.append(gone)
        return removed

    def clear(self) -> None:
        self.models.clear()
        self.nbytes.clear()
