"""Asking a model what its heads do, on one person's text: the logit lens, ablation, attention
edits and regeneration with them (head roles are lab.roles', prompt A against B lab.compare's).

Everything here is computed live from the text's model and window by the engine's own forward
(`DecoderLM.forward(..., intervention=, return_residuals=)`): nothing is estimated or cached
across texts. The settings a person chose (heads to ablate, a row to edit) are a `ProbeSettings`
the session keeps, so they stay while the text grows step by step and can be saved with it.
The functions are plain: they take the text (lab.text.Text: its model, window and selected
token) and the settings, and return plain numbers or new settings; the session's verbs call them.

Positions: `index` arguments are positions in the window shown (0 = its first token); an edit's
query and key are stored as positions in the whole text, so they stay put while the window grows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from model.generate import Decoder, Sampling, generate
from model.interventions import ABLATION_MODES, AttentionEdit, Intervention
from model.transformer import KVCache, LayerCache, read_out_rows

from .checks import UserError, check_choice, check_int, number_from_text
from .display import check_head
from .limits import MAX_NEW_TOKENS
from .models import ModelEntry
from .roles import HeadRoles
from .text import Text, used_rows

TOP_MOVES = 5  # how many of the top candidates a summary follows
LENS_TOP = 5
MAX_REGENERATE = 64  # tokens per continuation of "Regenerate": two continuations side by side stay readable
_HEAD_RE = re.compile(r"^\s*L\s*(\d{1,3})\s*[·.,:/ ]?\s*H\s*(\d{1,3})\s*$", re.IGNORECASE)
MODE_WORDS = {"zero": "zeroed", "mean": "mean-ablated", "uniform": "made uniform"}


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
              and all(isinstance(v, int) and not isinstance(v, bool) for v in item)):
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
            parts.append(f"all heads but {listed} {MODE_WORDS[self.mode]}" if self.keep_only
                         else f"{listed} {MODE_WORDS[self.mode]}")
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
             residuals: bool = False, attention: bool = False):
    with torch.inference_mode():
        return entry.model(torch.tensor([list(ids)]), return_attention=attention, intervention=intervention,
                           return_residuals=residuals)


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
        iv.validate(text.entry.model.cfg, len(d.window))
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


# ---------------------------------------------------------------------------- logit lens


@dataclass
class Lens:
    """The next-token distribution read out after each layer at one position of the text.

    probs: (L + 1, V) float64, row 0 after the embedding, row l + 1 after block l (the last row
    is the model's own distribution). labels: one per row. index: window position; token: its piece.
    """

    probs: np.ndarray
    labels: list[str]
    pieces: list[str]
    index: int
    token: str

    def top(self, k: int = LENS_TOP) -> list[list]:
        """Rows (stage, rank, token, probability) of the `/logit_lens` table."""
        out = []
        for label, row in zip(self.labels, self.probs):
            for rank, i in enumerate(np.argsort(-row, kind="stable")[:k], start=1):
                out.append([label, rank, self.pieces[int(i)], round(float(row[i]), 6)])
        return out


def lens_readout(text: Text, index=None) -> Lens:
    """What the model would predict after `index` (default: the selected token) if it stopped after
    each layer: the residual stream through the final norm and the output head (read_out_rows)."""
    need_text(text)
    index = position(text, index)
    d, entry = text.decoder, text.entry
    streams, own = streams_at(d, index)
    with torch.inference_mode():
        # every stream but the last, read out as one (L, C) batch: one pass over the output head
        # (GPT-2's is 154 MB; a pass per layer and position took a second); the last row is the
        # forward's own logits there
        rows = torch.cat(streams[:-1], dim=1)[0]  # (L, C)
        logits = torch.cat([read_out_rows(entry.model, rows), own]).cpu()  # (L + 1, V)
    probs = torch.softmax(used_rows(logits.double(), entry), dim=-1).numpy()
    labels = ["embedding"] + [f"after layer {i}" for i in range(len(streams) - 1)]
    return Lens(probs, labels, list(entry.pieces), index, entry.tokenizer.piece(d.window[index]))


def streams_at(d: Decoder, index: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The residual streams at window position `index` (n_layers + 1 of shape (1, 1, C)) and the
    logits there (1, V), as the text's decoder computed or computes them (its model, its intervention).

    The newest token's are the ones its Step (or the window's prefill) kept, with the logits it drew
    from. Under the causal mask an earlier position sees only the tokens up to it, whose keys and
    values the text's cache holds: the token alone runs against the cache cut before it (views, never
    changed). Without a cache that fits the window (bidirectional mask, mean ablation, a cooled text)
    the whole window runs."""
    model, cache, iv = d.model, d.cache, d.intervention
    if index == len(d.window) - 1 and d.streams is not None:
        return list(d.streams), d.logits[None]
    with torch.inference_mode():
        if d.use_cache and cache is not None and cache.length == len(d.window):
            past = KVCache([LayerCache(c.k[:, :, :index], c.v[:, :, :index]) for c in cache.layers])
            out = model(torch.tensor([[d.window[index]]], device=d.device), cache=past, return_residuals=True,
                        intervention=None if iv is None else iv.within(d.start, index, index + 1))
            return list(out.residuals), out.logits[:, 0]
        out = model(torch.tensor([d.window], device=d.device), return_residuals=True,
                    intervention=None if iv is None else iv.within(d.start, 0, len(d.window)))
        return [r[:, index : index + 1] for r in out.residuals], out.logits[:, index]


# ----------------------------------------------------------------------- ablation and edits


@dataclass
class Move:
    piece: str
    before: float
    after: float
    rank_before: int
    rank_after: int


@dataclass
class Effect:
    """The next-token distribution after window position `index` without and with the settings'
    intervention (both float64, from the same forward path), and KL(before ‖ after) in bits."""

    pieces: list[str]
    before: np.ndarray
    after: np.ndarray
    kl_bits: float
    index: int
    token: str
    what: str
    moves: list[Move] = field(default_factory=list)

    def summary(self) -> str:
        top = self.moves[0] if self.moves else None
        lines = [f"After “{self.token}” (position {self.index}), with {self.what}: "
                 f"KL(before ‖ after) = {self.kl_bits:.3f} bits."]
        if top is not None:
            after_top = max(self.moves, key=lambda m: m.after)
            if after_top.piece == top.piece:
                lines.append(f"The top candidate stays “{top.piece}” ({top.before:.2f} → {top.after:.2f}).")
            else:
                lines.append(f"The top candidate changes from “{top.piece}” ({top.before:.2f} → {top.after:.2f}) "
                             f"to “{after_top.piece}” ({after_top.before:.2f} → {after_top.after:.2f}).")
        return " ".join(lines)


def kl_bits(log_p: np.ndarray, log_q: np.ndarray) -> float:
    """KL(p ‖ q) in bits from log-probabilities (float64)."""
    p = np.exp(log_p)
    return float(np.sum(p * (log_p - log_q)) / math.log(2))


def ranks(probs: np.ndarray) -> np.ndarray:
    order = np.argsort(-probs, kind="stable")
    ranks = np.empty_like(order)
    ranks[order] = np.arange(1, len(order) + 1)
    return ranks


def effect(text: Text, settings: ProbeSettings, index=None) -> Effect:
    """The effect of the settings on the prediction after `index` (default: the selected token):
    before = the plain forward, after = the same forward with the intervention."""
    need_text(text)
    index = position(text, index)
    d, entry = text.decoder, text.entry
    iv = window_intervention(text, settings)
    before = used_rows(forward(entry, d.window).logits[0, index].double(), entry)
    after = before if iv is None else used_rows(forward(entry, d.window, iv).logits[0, index].double(), entry)
    log_p, log_q = torch.log_softmax(before, -1).numpy(), torch.log_softmax(after, -1).numpy()
    p, q = torch.softmax(before, -1).numpy(), torch.softmax(after, -1).numpy()
    rp, rq = ranks(p), ranks(q)
    tok = entry.tokenizer
    pieces = list(entry.pieces)
    top = list(dict.fromkeys([*np.argsort(-p, kind="stable")[:TOP_MOVES], *np.argsort(-q, kind="stable")[:TOP_MOVES]]))
    moves = [Move(pieces[i], float(p[i]), float(q[i]), int(rp[i]), int(rq[i])) for i in top]
    what = settings.describe([tok.piece(i) for i in d.window], d.start)
    return Effect(pieces, p, q, kl_bits(log_p, log_q), index, tok.piece(d.window[index]), what, moves)


def with_ablation(text: Text, settings: ProbeSettings, heads, mode, keep_only) -> ProbeSettings:
    """The settings with these heads to ablate and how (an empty list and keep_only False: none),
    checked against the text's model; the edit stays."""
    if text.entry is None:
        raise UserError("Press Step first: ablation works on the text in the Explore tab.")
    cfg = text.entry.model.cfg
    chosen = parse_heads(heads, cfg.n_layers, cfg.n_heads)
    mode = check_choice("ablation mode", mode, ABLATION_MODES)
    if not isinstance(keep_only, bool):
        raise UserError("keep only must be true or false.")
    if keep_only and not chosen:
        raise UserError("“Keep only these” needs at least one head to keep.")
    new = ProbeSettings(chosen, mode, keep_only, settings.edit)
    window_intervention(text, new)  # refused here, before anything changes
    return new


def with_edit(text: Text, settings: ProbeSettings, layer, head, query, key) -> ProbeSettings:
    """The settings with one attention row replaced: head `head` of `layer`, at window position
    `query`, attends only to window position `key` ("uniform": every allowed key equally; "off" or
    None: no edit)."""
    need_text(text)
    d, cfg = text.decoder, text.entry.model.cfg
    if key is None or key == "off":
        return ProbeSettings(settings.heads, settings.mode, settings.keep_only, None)
    layer = check_int("layer", layer, 0, cfg.n_layers - 1)
    head = check_int("head", head, 0, cfg.n_heads - 1)
    n = len(d.window)
    query = check_int("query position", query, 0, n - 1)
    if key == "uniform":
        k = None
    else:
        limit = query if cfg.mask == "causal" else n - 1
        if isinstance(key, int) and not isinstance(key, bool) and key > limit and key < n:
            raise UserError(f"Position {key} comes after the query ({query}): under the causal mask a token "
                            f"can only look at positions 0–{query}.")
        k = check_int("key position", key, 0, limit)
    edit = AttentionEdit(layer, head, d.start + query, None if k is None else d.start + k)
    new = ProbeSettings(settings.heads, settings.mode, settings.keep_only, edit)
    window_intervention(text, new)  # refused here, before anything changes
    return new


def with_restored_edit(text: Text, settings: ProbeSettings, layer, head, query, key) -> ProbeSettings:
    """The settings with an edit as `ProbeSettings` keeps it (query and key positions in the whole
    text; key None = uniform), as a session file brings it back: also when its row has slid out of
    the window since it was set (the tools then say so, as they did before the file was saved)."""
    need_text(text)
    d, cfg = text.decoder, text.entry.model.cfg
    layer = check_int("layer", layer, 0, cfg.n_layers - 1)
    head = check_int("head", head, 0, cfg.n_heads - 1)
    query = check_int("query position", query, 0, len(d.ids) - 1)
    limit = query if cfg.mask == "causal" else len(d.ids) - 1
    key = None if key is None else check_int("key position", key, 0, limit)
    new = ProbeSettings(settings.heads, settings.mode, settings.keep_only, AttentionEdit(layer, head, query, key))
    if query >= d.start and (key is None or key >= d.start):
        window_intervention(text, new)  # in the window: it must run on this text
    return new


def with_selected_edit(text: Text, settings: ProbeSettings, head, key) -> ProbeSettings:
    """`with_edit` for the selected token, with the head as a label ("L1H0") and the key as the page
    sends it (a position as text, "uniform" or "off")."""
    need_text(text)
    if (number := number_from_text(key)) is not None and number.is_integer():
        key = int(number)  # a position as text ("3"); other text (“²”, “3.5”) is left to with_edit's check
    if key is None or key == "off":
        return with_edit(text, settings, None, None, None, None)
    cfg = text.entry.model.cfg
    if not isinstance(head, str):
        raise UserError("Choose the head whose row to edit, e.g. L1H0.")
    ((layer, h),) = parse_heads([head], cfg.n_layers, cfg.n_heads)
    return with_edit(text, settings, layer, h, selected(text), key)


# ----------------------------------------------------------------------------- regenerate


@dataclass
class Regeneration:
    """The same continuation twice, same seed: by the plain model and with the settings applied.
    first_difference: index of the first generated token that differs (None: identical)."""

    normal: list[str]
    changed: list[str]
    first_difference: int | None
    what: str


def regenerate(text: Text, settings: ProbeSettings, sampling: Sampling, n) -> Regeneration:
    """Continue the text `n` tokens twice with the same seed: plainly and under the settings (heads
    ablated, row edited), to see where the two part."""
    need_text(text)
    n = check_int("tokens to regenerate", n, 1, min(MAX_REGENERATE, MAX_NEW_TOKENS))
    iv = settings.intervention()
    if iv is None:
        raise UserError("Choose heads to ablate (or an attention row to edit) first.")
    window_intervention(text, settings)  # the settings must fit the text
    d, entry = text.decoder, text.entry
    texts = []
    for intervention in (None, iv):
        dec = Decoder(entry.model, list(d.ids), sampling, eos_id=entry.tokenizer.eos_id, piece=entry.tokenizer.piece,
                      capture_attention=False, intervention=intervention)
        texts.append([s.piece for s in generate(dec, n, sampling, attention="none")])
    normal, changed = texts
    first = next((i for i, (a, b) in enumerate(zip(normal, changed)) if a != b), None)
    if first is None and len(normal) != len(changed):
        first = min(len(normal), len(changed))
    tok = entry.tokenizer
    return Regeneration(normal, changed, first, settings.describe([tok.piece(i) for i in d.window], d.start))


# ------------------------------------------------------------------- what the page shows


def selected(text: Text) -> int | None:
    """The window position the tools read (the selected token, else the last); None without a text."""
    if text.decoder is None:
        return None
    return position(text, None)


def head_labels(text: Text) -> list[str]:
    """Every head of the text's model as the page names it ("L1H0"); none before the first Step."""
    if text.entry is None:
        return []
    cfg = text.entry.model.cfg
    return [head_label(layer, h) for layer in range(cfg.n_layers) for h in range(cfg.n_heads)]


def shape(text: Text) -> tuple[int, int]:
    """(layers, heads) of the text's model."""
    cfg = text.entry.model.cfg
    return cfg.n_layers, cfg.n_heads


def check_shown(text: Text, layer, head) -> tuple[int | None, int | None]:
    """The layer and head the attention shows (None: none, or "all" heads), checked against the text's
    model before a handler changes anything (a refused call leaves the head settings as they were)."""
    if text.entry is None:  # no text: the tools draw nothing that needs them
        return None, None
    n_layers, n_heads = shape(text)
    layer = None if layer is None else check_int("layer", layer, 0, n_layers - 1)
    head = None if head is None else check_head(head, n_heads)[0]  # a page of heads: none outlined
    return layer, head


def ablated(text: Text, settings: ProbeSettings) -> list[tuple[int, int]]:
    """The heads the settings ablate on the text's model (keep-only resolved), sorted."""
    if not settings.active or text.entry is None:
        return []
    return sorted(settings.intervention().ablated_heads(text.entry.model.cfg))


def badges(text: Text, settings: ProbeSettings, layer: int, roles: HeadRoles | None) -> dict[int, str]:
    """What each head of `layer` is on this text (its strongest role, from `roles`) and what the
    person changed in it (ablated, row edited), for the attention panels' titles."""
    out = roles.badges(layer) if roles is not None else {}
    for layer_, h in ablated(text, settings):
        if layer_ == layer:
            out[h] = " · ".join(filter(None, [out.get(h), f"✕ {MODE_WORDS[settings.mode]}"]))
    e = settings.edit
    if e is not None and e.layer == layer:
        out[e.head] = " · ".join(filter(None, [out.get(e.head), "✎ row edited"]))
    return out


def key_choices(text: Text) -> list[tuple[str, str]]:
    """What the selected token's edited row may attend to: off, uniform, or one allowed position."""
    out = [("no edit", "off"), ("uniform (every allowed key)", "uniform")]
    q = selected(text)
    if q is None:
        return out
    n = len(text.decoder.window)
    limit = q if text.entry.model.cfg.mask == "causal" else n - 1
    tokens = [p for p, _ in text.tokens()]
    return out + [(f"{j}: {tokens[j]}", str(j)) for j in range(limit + 1)]


def edit_state(text: Text, settings: ProbeSettings) -> tuple[str | None, str]:
    """The edit as the page shows it: (its head's label or None, "off" | "uniform" | key position)."""
    e = settings.edit
    if e is None or text.decoder is None:
        return None, "off"
    return head_label(e.layer, e.head), "uniform" if e.key is None else str(e.key - text.decoder.start)


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
    out = forward(text.entry, text.decoder.window, iv, attention=True)
    return [a[0].float().numpy() for a in out.attentions], [s[0].float().numpy() for s in out.scores]
