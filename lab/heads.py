"""One person's head tools (`Heads`, the session's `heads` part): the heads chosen to ablate and a row to
edit, the head roles of the current text, and the tools that read them: the logit lens, the effect of
the settings on a prediction, regeneration with them, and prompt A against prompt B (head roles are
lab.roles', the comparison lab.compare's, the settings and how they run lab.headsettings').

Everything here is computed live from the text's model and window by the engine's own forward
(`DecoderLM.forward(..., intervention=, return_residuals=)`): nothing is estimated or cached
across texts. The settings a person chose are a `ProbeSettings` the part keeps, so they stay while
the text grows step by step and can be saved with it. The computations are plain functions of the
text (lab.text.Text: its model, window and selected token) and the settings; the part's verbs call
them, and change the settings only once a new setting is checked.

Positions: `index` arguments are positions in the window shown (0 = its first token); an edit's
query and key are stored as positions in the whole text, so they stay put while the window grows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from model.backend_decoder import make_decoder
from model.generate import Decoder, Sampling, generate
from model.interventions import ABLATION_MODE_WORDS, ABLATION_MODES, AttentionEdit
from model.attention import LayerCache
from model.transformer import KVCache, read_out_rows

from .catalogue.models import ModelEntry
from .checks import UserError, check_choice, check_int, is_int, number_from_text
from .compare import Comparison, compare
from .display import check_head
from .headsettings import (
    ProbeSettings, ablated, forward, head_label, kl_bits, need_text, parse_heads, position, window_intervention,
)
from .limits import MAX_NEW_TOKENS
from .roles import HeadRoles, RolesCache
from .text import Text, used_rows

__all__ = ["Heads", "Lens", "Effect", "Move", "Regeneration", "lens_readout", "streams_at", "effect", "ranks",
           "regenerate", "ABLATION_MODES", "ABLATION_MODE_WORDS", "LENS_TOP", "MAX_REGENERATE", "head_label"]

TOP_MOVES = 5  # how many of the top candidates a summary follows
LENS_TOP = 5
MAX_REGENERATE = 64  # tokens per continuation of "Regenerate": two continuations side by side stay readable


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
    text.entry.require("lens")
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
            past = cache.upto(index)  # every layer's keys and values (and what else it keeps) before it
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
    before = used_rows(forward(entry, d.window).logits[index].double(), entry)
    after = before if iv is None else used_rows(forward(entry, d.window, iv).logits[index].double(), entry)
    log_p, log_q = torch.log_softmax(before, -1).numpy(), torch.log_softmax(after, -1).numpy()
    p, q = torch.softmax(before, -1).numpy(), torch.softmax(after, -1).numpy()
    rp, rq = ranks(p), ranks(q)
    tok = entry.tokenizer
    pieces = list(entry.pieces)
    top = list(dict.fromkeys([*np.argsort(-p, kind="stable")[:TOP_MOVES], *np.argsort(-q, kind="stable")[:TOP_MOVES]]))
    moves = [Move(pieces[i], float(p[i]), float(q[i]), int(rp[i]), int(rq[i])) for i in top]
    what = settings.describe([tok.piece(i) for i in d.window], d.start)
    return Effect(pieces, p, q, kl_bits(log_p, log_q), index, tok.piece(d.window[index]), what, moves)


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
        dec = make_decoder(entry.backend, list(d.ids), sampling, eos_id=entry.tokenizer.eos_id,
                           piece=entry.tokenizer.piece, capture_attention=False, intervention=intervention)
        texts.append([s.piece for s in generate(dec, n, sampling, attention="none")])
    normal, changed = texts
    first = next((i for i, (a, b) in enumerate(zip(normal, changed)) if a != b), None)
    if first is None and len(normal) != len(changed):
        first = min(len(normal), len(changed))
    tok = entry.tokenizer
    return Regeneration(normal, changed, first, settings.describe([tok.piece(i) for i in d.window], d.start))



# ------------------------------------------------------------------ one person's head tools


class Heads:
    """One person's head tools on their text (the session's `heads`): the settings (heads to ablate, a row
    to edit), the head roles of the current text (computed once per text), and the verbs the wiring calls.
    A refused setting changes nothing. The session tells it when its text starts, goes or loses a token."""

    def __init__(self, text: Text, entry_for: Callable[[object], ModelEntry],
                 settings: ProbeSettings | None = None) -> None:
        self.text = text
        self.entry_for = entry_for  # a model of the person's list, by its name (for Compare)
        self.settings = ProbeSettings() if settings is None else settings
        self._roles = RolesCache()  # the head roles of the current text, computed once per text

    # -------------------------------------------------------------------- as the text changes

    def new_text(self, entry: ModelEntry) -> None:
        """A text starts on `entry`: an edited row meant the old text's positions; another model has other heads."""
        same = entry is self.text.entry
        self.settings = dataclasses.replace(self.settings, edit=None) if same else ProbeSettings()

    def new_model(self, entry: ModelEntry) -> None:
        """The model is switched to `entry`: the settings go when it is another model (its heads differ)."""
        if entry is not self.text.entry:
            self.settings = ProbeSettings()

    def token_undone(self) -> None:
        """A token was taken back: an edited row that reads it goes with it."""
        e, d = self.settings.edit, self.text.decoder
        if e is not None and d is not None and max(e.query, e.key or 0) >= len(d.ids):
            self.settings = dataclasses.replace(self.settings, edit=None)

    def text_cleared(self) -> None:
        """The text went: its roles and an edited row (positions of that text) go; the heads chosen stay."""
        self._roles = RolesCache()
        self.settings = dataclasses.replace(self.settings, edit=None)

    # ---------------------------------------------------------------------------- the tools

    def head_roles(self) -> HeadRoles | None:
        """The head roles on the current window (None before the first Step)."""
        att = self.text.attention()
        if att is None:
            return None
        return self._roles.get(self.text.entry, self.text.decoder.window, att)

    def lens(self, index=None) -> Lens:
        """The logit lens at window position `index` (default: the selected token)."""
        return lens_readout(self.text, index)

    def lens_at(self, index) -> Lens:
        """The page's logit lens: the token at window position `index` selected first (None: the one selected)."""
        if self.selected() is None:
            raise UserError("Press Step first: the logit lens reads the text in the Explore tab.")
        if index is not None:
            self.text.select(index)
        return self.lens()

    def effect(self, index=None) -> Effect:
        """What the settings change in the prediction after `index` (default: the selected token)."""
        return effect(self.text, self.settings, index)

    def regenerate(self, sampling: Sampling, n) -> Regeneration:
        """The text continued `n` tokens twice, plainly and under the settings."""
        return regenerate(self.text, self.settings, sampling, n)

    def compare(self, model_name, prompt_a, prompt_b) -> Comparison:
        """Prompt A against prompt B on a model of the person's list."""
        return compare(self.entry_for(model_name), prompt_a, prompt_b)

    # ------------------------------------------------------------------------- the settings

    def set_ablation(self, heads, mode, keep_only) -> ProbeSettings:
        """Choose the heads to ablate and how (an empty list and keep_only False: none), checked against
        the text's model; the edit stays."""
        text = self.text
        if text.entry is None:
            raise UserError("Press Step first: ablation works on the text in the Explore tab.")
        cfg = text.entry.cfg
        chosen = parse_heads(heads, cfg.n_layers, cfg.n_heads)
        mode = check_choice("ablation mode", mode, ABLATION_MODES)
        if not isinstance(keep_only, bool):
            raise UserError("keep only must be true or false.")
        if keep_only and not chosen:
            raise UserError("“Keep only these” needs at least one head to keep.")
        new = ProbeSettings(chosen, mode, keep_only, self.settings.edit)
        window_intervention(text, new)  # refused here, before anything changes
        self.settings = new
        return new

    def set_edit(self, layer, head, query, key) -> ProbeSettings:
        """Replace one attention row: head `head` of `layer`, at window position `query`, attends only to
        window position `key` ("uniform": every allowed key equally; "off" or None: no edit)."""
        self.settings = self._edited(layer, head, query, key)
        return self.settings

    def _edited(self, layer, head, query, key) -> ProbeSettings:
        """The settings with `set_edit`'s row, checked against the text (nothing changes here)."""
        text, settings = self.text, self.settings
        need_text(text)
        d, cfg = text.decoder, text.entry.cfg
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
            if is_int(key) and key > limit and key < n:
                raise UserError(f"Position {key} comes after the query ({query}): under the causal mask a token "
                                f"can only look at positions 0–{query}.")
            k = check_int("key position", key, 0, limit)
        edit = AttentionEdit(layer, head, d.start + query, None if k is None else d.start + k)
        new = ProbeSettings(settings.heads, settings.mode, settings.keep_only, edit)
        window_intervention(text, new)  # refused here, before anything changes
        return new

    def edit_selected(self, head, key) -> ProbeSettings:
        """`set_edit` for the selected token, as the page sends it: the head as a label ("L1H0"), checked
        once there is a model even when `key` asks for no edit (a head that is not the model's is refused),
        and the key as a position as text, "uniform" or "off"."""
        if head is not None and self.text.entry is not None:
            self.parse_heads([self._head_label(head)])
        need_text(self.text)
        if (number := number_from_text(key)) is not None and number.is_integer():
            key = int(number)  # a position as text ("3"); other text (“²”, “3.5”) is left to set_edit's check
        if key is None or key == "off":
            return self.set_edit(None, None, None, None)
        ((layer, h),) = self.parse_heads([self._head_label(head)])
        return self.set_edit(layer, h, self.selected(), key)

    @staticmethod
    def _head_label(head) -> str:
        if not isinstance(head, str):
            raise UserError("Choose the head whose row to edit, e.g. L1H0.")
        return head

    def restore_edit(self, layer, head, query, key) -> ProbeSettings:
        """Set an edit as `ProbeSettings` keeps it (query and key positions in the whole text; key None =
        uniform), as a session file brings it back: also when its row has slid out of the window since it
        was set (the tools then say so, as they did before the file was saved)."""
        text, settings = self.text, self.settings
        need_text(text)
        d, cfg = text.decoder, text.entry.cfg
        layer = check_int("layer", layer, 0, cfg.n_layers - 1)
        head = check_int("head", head, 0, cfg.n_heads - 1)
        query = check_int("query position", query, 0, len(d.ids) - 1)
        limit = query if cfg.mask == "causal" else len(d.ids) - 1
        key = None if key is None else check_int("key position", key, 0, limit)
        new = ProbeSettings(settings.heads, settings.mode, settings.keep_only, AttentionEdit(layer, head, query, key))
        if query >= d.start and (key is None or key >= d.start):
            window_intervention(text, new)  # in the window: it must run on this text
        self.settings = new
        return new

    def restore_mode(self, mode) -> ProbeSettings:
        """Only the ablation mode the form shows (no head ablated), as a session file keeps it."""
        self.settings = dataclasses.replace(self.settings, mode=check_choice("ablation mode", mode, ABLATION_MODES))
        return self.settings

    def clear_probe(self) -> None:
        """No head ablated, no row edited."""
        self.settings = ProbeSettings()

    # ------------------------------------------------------------------- what the page shows

    def selected(self) -> int | None:
        """The window position the tools read (the selected token, else the last); None without a text."""
        if self.text.decoder is None:
            return None
        return position(self.text, None)

    def follow(self, layer, head, query) -> tuple[int | None, int | None]:
        """The tools follow the text after it or its selected token changed: `query` (a window position;
        None, or one the text no longer has after an Undo: the last token) is selected. Returns the layer
        and head the attention shows, checked first (`check_shown`)."""
        layer, head = self.check_shown(layer, head)
        if query is not None and (isinstance(query, bool) or not isinstance(query, (int, float))):
            raise UserError("The selected token must be given by its position in the text.")
        if self.selected() is not None:
            n = len(self.text.tokens())
            if 0 <= (query if query is not None else -1) < n and float(query).is_integer():
                self.text.select(int(query))
            else:
                self.text.query = None
        return layer, head

    def head_labels(self) -> list[str]:
        """Every head of the text's model as the page names it ("L1H0"); none before the first Step."""
        if self.text.entry is None:
            return []
        cfg = self.text.entry.cfg
        return [head_label(layer, h) for layer in range(cfg.n_layers) for h in range(cfg.n_heads)]

    def shape(self) -> tuple[int, int]:
        """(layers, heads) of the text's model."""
        cfg = self.text.entry.cfg
        return cfg.n_layers, cfg.n_heads

    def parse_heads(self, value) -> tuple[tuple[int, int], ...]:
        """Heads as the page or the API sends them, checked against the text's model (lab.headsettings.parse_heads)."""
        if self.text.entry is None:
            raise UserError("Press Step first.")
        return parse_heads(value, *self.shape())

    def check_shown(self, layer, head) -> tuple[int | None, int | None]:
        """The layer and head the attention shows (None: none, or "all" heads), checked against the text's
        model before a handler changes anything (a refused call leaves the head settings as they were)."""
        if self.text.entry is None:  # no text: the tools draw nothing that needs them
            return None, None
        n_layers, n_heads = self.shape()
        layer = None if layer is None else check_int("layer", layer, 0, n_layers - 1)
        head = None if head is None else check_head(head, n_heads)[0]  # a page of heads: none outlined
        return layer, head

    def ablated(self) -> list[tuple[int, int]]:
        """The heads the settings ablate on the text's model (keep-only resolved), sorted."""
        return ablated(self.text, self.settings)

    def key_choices(self) -> list[tuple[str, str]]:
        """What the selected token's edited row may attend to: off, uniform, or one allowed position."""
        out = [("no edit", "off"), ("uniform (every allowed key)", "uniform")]
        q = self.selected()
        if q is None:
            return out
        n = len(self.text.decoder.window)
        limit = q if self.text.entry.cfg.mask == "causal" else n - 1
        tokens = [p for p, _ in self.text.tokens()]
        return out + [(f"{j}: {tokens[j]}", str(j)) for j in range(limit + 1)]

    def edit_state(self) -> tuple[str | None, str]:
        """The edit as the page shows it: (its head's label or None, "off" | "uniform" | key position)."""
        e = self.settings.edit
        if e is None or self.text.decoder is None:
            return None, "off"
        return head_label(e.layer, e.head), "uniform" if e.key is None else str(e.key - self.text.decoder.start)
