"""The head tools' settings and how they run: which heads to ablate and how, one attention row to
edit (`ProbeSettings`), heads named and parsed as the page writes them ("L1H0"), the settings checked
against a text and applied in the engine's own forward, and the KL divergence that measures what a
change does to a prediction. Plain functions of a text (lab.text.Text) and the settings; the person's
head tools (lab.heads.Heads) hold the settings and call them, as do the Explore figure (lab.shown),
Inside one cell (lab.inside) and Compare (lab.compare).

Positions: `index` arguments are positions in the window shown (0 = its first token); an edit's
query and key are stored as positions in the whole text, so they stay put while the window grows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from model.backend import ForwardRequest, ForwardResult, per_layer
from model.interventions import ABLATION_MODE_WORDS, AttentionEdit, Intervention

from .catalogue.models import ModelEntry
from .checks import UserError, check_int, is_int
from .roles import HeadRoles
from .text import Text

_HEAD_RE = re.compile(r"^\s*L\s*(\d{1,3})\s*[·.,:/ ]?\s*H\s*(\d{1,3})\s*$", re.IGNORECASE)


def head_label(layer: int, head: int) -> str:
    """How a head is named on the page and in the API: "L1H0"."""
    return f"L{layer}H{head}"


def parse_heads(value, n_layers: int, n_heads: int) -> tuple[tuple[int, int], ...]:
    """A set of heads from the page or the API: a list of "L1H0" labels (or [layer, head] pairs).
    Refuses anything else with a clear message; repeats count once."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [v for v in re.split(r"[;,]\s*(?=L)", value) if v.strip()] if value.strip() else []
    if not isinstance(value, (list, tuple)):
        raise UserError('Heads must be a list such as ["L0H1", "L1H0"].')
    if len(value) > n_layers * n_heads:
        raise UserError(f"{len(value)} heads listed; this model has {n_layers * n_heads}.")
    found = []
    for item in value:
        if isinstance(item, str):
            m = _HEAD_RE.match(item)
            if not m:
                raise UserError(f"{item[:30]!r} is not a head: write them as L<layer>H<head>, e.g. L1H0.")
            layer, head = int(m.group(1)), int(m.group(2))
        elif (isinstance(item, (list, tuple)) and len(item) == 2
              and all(is_int(v) for v in item)):
            layer, head = item
        else:
            raise UserError(f"{str(item)[:30]!r} is not a head: write them as L<layer>H<head>, e.g. L1H0.")
        if not 0 <= layer < n_layers:
            raise UserError(f"Head {head_label(layer, head)}: this model has layers 0–{n_layers - 1}.")
        if not 0 <= head < n_heads:
            raise UserError(f"Head {head_label(layer, head)}: each layer has heads 0–{n_heads - 1}.")
        if (layer, head) not in found:
            found.append((layer, head))
    return tuple(sorted(found))


@dataclass
class ProbeSettings:
    """What a person set on their heads: which to ablate and how, and one attention row to edit.

    edit: (layer, head, query, key) with query and key positions in the whole text, key None =
    attend uniformly. Cleared when the model changes (its heads differ); kept while the text grows.
    """

    heads: tuple[tuple[int, int], ...] = ()
    mode: str = "zero"
    keep_only: bool = False
    edit: AttentionEdit | None = None

    @property
    def active(self) -> bool:
        return bool(self.heads) or self.keep_only or self.edit is not None

    def intervention(self) -> Intervention | None:
        """The engine's intervention (edit positions still in the whole text), or None."""
        if not self.active:
            return None
        return Intervention(self.heads, self.mode, self.keep_only, [self.edit] if self.edit else [])

    def describe(self, tokens: Sequence[str] | None = None, start: int = 0) -> str:
        """One line: what is changed ("L1H0, L0H2 zeroed · row of “he” in L1H0 → “anna”")."""
        parts = []
        if self.heads or self.keep_only:
            listed = ", ".join(head_label(*h) for h in self.heads) or "no head"
            done = ABLATION_MODE_WORDS[self.mode].done
            parts.append(f"all heads but {listed} {done}" if self.keep_only else f"{listed} {done}")
        if self.edit is not None:
            e = self.edit

            def tok(pos: int) -> str:
                i = pos - start
                return f"“{tokens[i]}” ({pos})" if tokens is not None and 0 <= i < len(tokens) else f"position {pos}"
            target = "every allowed key equally" if e.key is None else f"only {tok(e.key)}"
            parts.append(f"row of {tok(e.query)} in {head_label(e.layer, e.head)} attends to {target}")
        return " · ".join(parts) if parts else "nothing changed"


# ---------------------------------------------------------------------------- the forward


def forward(entry: ModelEntry, ids: Sequence[int], intervention: Intervention | None = None,
            attention: bool = False, logits: str = "all") -> ForwardResult:
    """One forward of `ids` through the entry's backend (model.backend's contract), with `intervention`:
    the logits of every position (or the "last"), and with `attention` every head's weights and scores."""
    return entry.backend.forward(ForwardRequest(tuple(ids), attention="all" if attention else (), scores=attention,
                                                intervention=intervention, logits=logits))


def window_intervention(text: Text, settings: ProbeSettings) -> Intervention | None:
    """The settings' intervention in window positions; refuses settings that do not fit this text."""
    iv = settings.intervention()
    if iv is None or text.decoder is None:
        return None
    d = text.decoder
    e = settings.edit
    if e is not None and not (d.start <= e.query < len(d.ids) and (e.key is None or d.start <= e.key)):
        raise UserError("The edited attention row is no longer in the text shown; set the edit again.")
    iv = iv.within(d.start, 0, len(d.window))
    try:
        iv.validate(text.entry.cfg, len(d.window))
    except ValueError as exc:
        raise UserError(f"These settings cannot run: {exc}.") from None
    return iv


def need_text(text: Text) -> None:
    if text.decoder is None:
        raise UserError("Press Step first: these tools work on the text in the Explore tab.")


def position(text: Text, index) -> int:
    """A window position (default: the selected token, else the last)."""
    n = len(text.decoder.window)
    if index is None:
        index = text.query if text.query is not None and text.query < n else n - 1
    return check_int("token position", index, 0, n - 1)


def kl_bits(log_p: np.ndarray, log_q: np.ndarray) -> float:
    """KL(p ‖ q) in bits from log-probabilities (float64)."""
    p = np.exp(log_p)
    return float(np.sum(p * (log_p - log_q)) / math.log(2))


# ------------------------------------------------------------------- what the figures show


def ablated(text: Text, settings: ProbeSettings) -> list[tuple[int, int]]:
    """The heads the settings ablate on the text's model (keep-only resolved), sorted."""
    if not settings.active or text.entry is None:
        return []
    return sorted(settings.intervention().ablated_heads(text.entry.cfg))


def badges(text: Text, settings: ProbeSettings, layer: int, roles: HeadRoles | None) -> dict[int, str]:
    """What each head of `layer` is on this text (its strongest role, from `roles`) and what the
    person changed in it (ablated, row edited), for the attention panels' titles."""
    out = roles.badges(layer) if roles is not None else {}
    for layer_, h in ablated(text, settings):
        if layer_ == layer:
            out[h] = " · ".join(filter(None, [out.get(h), f"✕ {ABLATION_MODE_WORDS[settings.mode].done}"]))
    e = settings.edit
    if e is not None and e.layer == layer:
        out[e.head] = " · ".join(filter(None, [out.get(e.head), "✎ row edited"]))
    return out


def changed_attention(text: Text, settings: ProbeSettings) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """The attention of the text shown under the person's settings (heads ablated, a row edited):
    per layer (H, T, T) weights (the ones that multiplied the values) and scores, from the engine's
    forward with the change. None without settings, or when they no longer fit the text."""
    if text.decoder is None or not settings.active:
        return None
    try:
        iv = window_intervention(text, settings)
    except UserError:
        return None
    out = forward(text.entry, text.decoder.window, iv, attention=True, logits="last")
    return per_layer(out.attention, text.entry.cfg), per_layer(out.scores, text.entry.cfg)
