"""Prompt A against prompt B on one model: the attention of B minus A position by position, each
prompt's head scores and the next-token distributions after each, from the model's own forward."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .catalogue.models import ModelEntry, encode_prompt
from model.backend import per_layer

from .headsettings import forward, kl_bits
from .roles import HeadRoles, compute_head_roles
from .text import used_rows


@dataclass
class Comparison:
    """Prompt A against prompt B on one model.

    tokens_a, tokens_b: the pieces; common: how many positions are compared (the shorter length);
    diff: per layer (H, common, common) = B's weights − A's on the common positions;
    roles_a, roles_b: head scores of each prompt on its own text; probs_a, probs_b: the
    next-token distributions after each prompt; notes: what a learner should know (lengths differ…);
    weights_a, weights_b: each prompt's attention weights, per layer (H, T, T).
    """

    tokens_a: list[str]
    tokens_b: list[str]
    common: int
    diff: list[np.ndarray]
    roles_a: HeadRoles
    roles_b: HeadRoles
    probs_a: np.ndarray
    probs_b: np.ndarray
    pieces: list[str]
    notes: list[str]
    causal: bool
    weights_a: list[np.ndarray] | None = None  # per layer (H, T_a, T_a): A's own attention weights
    weights_b: list[np.ndarray] | None = None

    def aligned_tokens(self) -> list[str]:
        """One label per common position: the token, or "a→b" where the prompts differ."""
        return [a if a == b else f"{a}→{b}" for a, b in zip(self.tokens_a, self.tokens_b)]

    def kl_bits(self) -> float:
        return kl_bits(np.log(np.maximum(self.probs_a, 1e-300)), np.log(np.maximum(self.probs_b, 1e-300)))

    def rows(self, digits: int | None = 4) -> list[list]:
        """The table of `/compare`: layer, head, then score A, score B and B − A per score (rounded to
        `digits`; None: full precision); None where a score is undefined."""
        def value(x: float):
            return None if not np.isfinite(x) else (x if digits is None else round(x, digits))

        L, H = self.roles_a.shape
        out = []
        for layer in range(L):
            for head in range(H):
                row = [layer, head]
                for r in self.roles_a.roles:
                    a, b = float(self.roles_a.scores[r.key][layer, head]), float(self.roles_b.scores[r.key][layer, head])
                    row += [value(a), value(b), value(b - a)]
                out.append(row)
        return out

    def columns(self) -> list[str]:
        cols = ["layer", "head"]
        for r in self.roles_a.roles:
            cols += [f"{r.key} A", f"{r.key} B", f"{r.key} B−A"]
        return cols


def compare(entry: ModelEntry, prompt_a, prompt_b) -> Comparison:
    """Run both prompts through the model and line them up position by position."""
    ids_a, notes_a = encode_prompt(prompt_a, entry)
    ids_b, notes_b = encode_prompt(prompt_b, entry)
    tok = entry.tokenizer
    outs = [forward(entry, ids, attention=True, logits="last") for ids in (ids_a, ids_b)]
    weights = [per_layer(o.attention, entry.cfg) for o in outs]
    tokens = [[tok.piece(i) for i in ids] for ids in (ids_a, ids_b)]
    n = min(len(ids_a), len(ids_b))
    causal = entry.cfg.mask == "causal"
    notes = [f"Prompt A: {m}" for m in notes_a] + [f"Prompt B: {m}" for m in notes_b]
    if len(ids_a) != len(ids_b):
        notes.append(f"The prompts have {len(ids_a)} and {len(ids_b)} tokens: positions are compared one by one "
                     f"over the first {n} (the common part); the head scores and next-token distributions use "
                     "each whole prompt.")
    if not causal:
        notes.append("This model attends in both directions, so the common positions also look at tokens past "
                     "them; the difference includes that.")
    diff = [wb[:, :n, :n] - wa[:, :n, :n] for wa, wb in zip(*weights)]
    roles = [compute_head_roles(entry, ids, w, t) for ids, w, t in zip((ids_a, ids_b), weights, tokens)]
    probs = [torch.softmax(used_rows(o.logits[-1].double(), entry), -1).numpy() for o in outs]
    return Comparison(tokens_a=tokens[0], tokens_b=tokens[1], common=n, diff=diff, roles_a=roles[0], roles_b=roles[1],
                      probs_a=probs[0], probs_b=probs[1], pieces=list(entry.pieces), notes=notes, causal=causal,
                      weights_a=weights[0], weights_b=weights[1])
