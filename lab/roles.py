"""What each head does on one text: its scores for the known roles (previous token, first token,
self, induction, entropy, and the task's own pattern for the sort, copy and grammar models), and
the role it plays most clearly, from the attention the model computed (model.heads scores it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from model.corpora import FEMALE_NAMES, MALE_NAMES
from model.heads import (
    ROLE_ORDER, ROLES, TASK_ROLES, Role, head_scores, strongest_role, task_of, task_score, task_targets,
)

from .catalogue.models import ModelEntry

GRAMMAR_NAMES = {**{n: "f" for n in FEMALE_NAMES}, **{n: "m" for n in MALE_NAMES}}
SCORE_ROLES = ("previous_token", "first_token", "self_attention", "induction", "entropy")


@dataclass
class HeadRoles:
    """Every score of every head on one text: scores[key] is (L, H), NaN where a score is undefined
    on this text (e.g. induction with no repeated token). roles: the scores shown, in order. Scores are
    per query head; kv_heads: the key/value heads under grouped-query attention (fewer than H: query head
    h reads key/value head h // (H / kv_heads), which the table and labels name); None without grouping."""

    roles: tuple[Role, ...]
    scores: dict[str, np.ndarray]
    tokens: list[str]
    kv_heads: int | None = None

    @property
    def grouped(self) -> bool:
        return self.kv_heads is not None and self.kv_heads < self.shape[1]

    def kv_head(self, head: int) -> int:
        """The key/value head query head `head` reads (itself without grouping)."""
        return head // (self.shape[1] // self.kv_heads) if self.grouped else head

    def sharing(self, head: int) -> str:
        """"key/value head 1, shared by heads 2–3" under grouping ('' without)."""
        if not self.grouped:
            return ""
        group = self.shape[1] // self.kv_heads
        g = self.kv_head(head)
        return f"key/value head {g}, shared by heads {g * group}–{g * group + group - 1}"

    @property
    def shape(self) -> tuple[int, int]:
        return next(iter(self.scores.values())).shape

    def strongest(self, layer: int, head: int) -> tuple[Role, float] | None:
        """The role this head plays most clearly on this text (its score ≥ threshold), or None."""
        found = strongest_role(self.scores, layer, head, roles=self._ranked())
        if found is None:
            return None
        return next(r for r in self.roles if r.key == found[0]), found[1]

    def _ranked(self) -> list[Role]:
        # the task's own role first (the most specific), then the general ones in model.heads' order
        return [r for r in self.roles if r.key == "match"] + [ROLES[k] for k in ROLE_ORDER]

    def badge(self, layer: int, head: int) -> str:
        """The head's strongest role and score, e.g. "previous-token 0.92" ('' when none)."""
        found = self.strongest(layer, head)
        return "" if found is None else f"{found[0].name} {found[1]:.2f}"

    def label(self, layer: int, head: int) -> str:
        """The plain label with its threshold: "previous-token head: 0.92 ≥ 0.5" ('' when none)."""
        found = self.strongest(layer, head)
        if found is None:
            return ""
        role, value = found
        shared = f" ({self.sharing(head)})" if self.grouped else ""
        return f"{role.name} head: {value:.2f} ≥ {role.threshold:g}{shared}"

    def badges(self, layer: int) -> dict[int, str]:
        return {h: b for h in range(self.shape[1]) if (b := self.badge(layer, h))}

    def columns(self) -> list[str]:
        return ["layer", "head", *(["kv_head"] if self.grouped else []), *(r.key for r in self.roles), "role"]

    def rows(self, digits: int | None = 4) -> list[list]:
        """The table of `/head_roles`: layer, head, one column per score (rounded to `digits`; None: full
        precision; None where undefined), role."""
        L, H = self.shape
        out = []
        for layer in range(L):
            for head in range(H):
                values = [None if np.isnan(v := float(self.scores[r.key][layer, head]))
                          else (v if digits is None else round(v, digits)) for r in self.roles]
                found = self.strongest(layer, head)
                kv = [self.kv_head(head)] if self.grouped else []
                out.append([layer, head, *kv, *values, "" if found is None else found[0].name])
        return out


def roles_for(entry: ModelEntry) -> tuple[Role, ...]:
    task = task_of(entry.meta.get("corpus"))
    return tuple(ROLES[k] for k in SCORE_ROLES) + ((TASK_ROLES[task],) if task else ())


def compute_head_roles(entry: ModelEntry, ids: Sequence[int], weights: Sequence[np.ndarray],
                       tokens: Sequence[str]) -> HeadRoles:
    """Every head's scores on these tokens from their attention (one (H, T, T) array per layer)."""
    scores = head_scores(weights, ids)
    task = task_of(entry.meta.get("corpus"))
    if task:
        q, k = task_targets(task, tokens, GRAMMAR_NAMES)
        scores["match"] = task_score(task, np.stack(weights), q, k)
    return HeadRoles(roles_for(entry), scores, list(tokens), entry.cfg.kv_heads)


class RolesCache:
    """The head roles of one text, computed once: a Step draws the badges, the overview and the table
    from one computation, kept while the text (model, tokens, and the very attention arrays, which
    every change of the text replaces) stays."""

    def __init__(self) -> None:
        self.key, self.roles = None, None

    def get(self, entry: ModelEntry, window: Sequence[int], att) -> HeadRoles:
        """The roles on `window` from `att` (lab.text.Attention), computed unless this text's are kept."""
        key = (id(entry), tuple(window), tuple(id(w) for w in att.weights))
        if self.key != key:
            self.key, self.roles = key, compute_head_roles(entry, window, att.weights, att.tokens)
        return self.roles
