"""Interventions on attention heads: an argument of `DecoderLM.forward`, never a patch.

An `Intervention` says which heads to ablate and how, and which attention rows to rewrite:

* ablation of a set of (layer, head) pairs, with one mode from `ABLATION_MODES`:
  - "zero":    the head's output (its slice of the concatenated head outputs, before the
               output projection) is replaced by 0;
  - "mean":    the head's output at every position is replaced by its mean over the positions
               of this forward pass (the whole text; under the causal mask this mean includes
               later positions, which is the point: it keeps the head's average contribution
               and removes what depends on the position). Needs the whole text, so it is
               refused together with a non-empty key/value cache;
  - "uniform": the head attends equally to every allowed key: 1/(i+1) over keys <= i under
               the causal mask, 1/T over all keys under the bidirectional mask;
  with keep_only=True every head NOT listed is ablated instead.
* attention edits (`AttentionEdit`): for one (layer, head, query) the softmax row is replaced
  by a one-hot row at `key` (which the mask must allow) or, with key=None, a uniform row.

Positions (`query`, `key`) are absolute positions in the text (0-based), also with a cache.
With intervention=None, or an empty intervention, the forward is bit-for-bit the normal one.
The attention weights a forward returns under an intervention are the weights it multiplied
V with (uniform / edited rows included); the scores are the model's own pre-softmax scores.

What each mode does lives here, on the layer's plan (`LayerPlan.apply_to_weights`,
`LayerPlan.apply_to_outputs`), which the forward and the rebuild of one cell (model/inside.py) both
call through model/attention.py's `attend`: a new mode is a word in `ABLATION_MODES`, its family
(`WEIGHT_MODES` or `OUTPUT_MODES`, and `WHOLE_TEXT_MODES` if it needs every position), its rule in
one of those two methods, and its words in `ABLATION_MODE_WORDS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .config import ModelConfig
from .json_bounds import is_int, short

ABLATION_MODES = ("zero", "mean", "uniform")
# Where each mode acts: on a head's softmax rows (before they multiply V), or on what the head passes on
# (after). The two families never meet in one head, so their order does not matter.
WEIGHT_MODES = ("uniform",)
OUTPUT_MODES = ("zero", "mean")
# Modes that read every position of the text, which a key/value cache has not got: refused on top of one.
WHOLE_TEXT_MODES = ("mean",)


class ModeWords(NamedTuple):
    label: str  # the mode among the page's choices
    done: str  # what it did to a head, where the page says what is changed ("L1H0 zeroed", "✕ zeroed")


# Every mode's words, kept beside its rule so that a new mode is written in this module alone.
ABLATION_MODE_WORDS = {
    "zero": ModeWords("zero", "zeroed"),
    "mean": ModeWords("mean over positions", "mean-ablated"),
    "uniform": ModeWords("uniform attention", "made uniform"),
}


@dataclass(frozen=True)
class AttentionEdit:
    """Replace one attention row: head `head` of layer `layer`, query position `query`.

    key=None: attend uniformly to every key the mask allows; else attend only to `key`.
    """

    layer: int
    head: int
    query: int
    key: int | None = None

    def __post_init__(self) -> None:
        # checked when made, so a bad edit is refused where it is built, not deep inside a forward
        for name in ("layer", "head", "query"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise ValueError(f"attention edit {name} must be a non-negative integer, got {short(value)}")
        if self.key is not None and (not is_int(self.key) or self.key < 0):
            raise ValueError(
                f"attention edit key must be a non-negative integer or None (uniform), got {short(self.key)}"
            )

    @property
    def target(self) -> str:
        """The edit's target in words, as the page and row_source name it."""
        return "uniform" if self.key is None else f"key {self.key}"


@dataclass(frozen=True)
class LayerPlan:
    """What one attention layer must do (built by `Intervention.layer_plans`).

    ablate: head indices to ablate with `mode`; edits: (head, query row within this call's
    queries, key or None for uniform).
    """

    mode: str
    ablate: tuple[int, ...]
    edits: tuple[tuple[int, int, int | None], ...]

    def apply_to_weights(self, weights: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """The rows that multiply V: a weight-mode head's rows and each edited (head, query) row replace
        the softmax's; every other row is `weights`' own.

        weights (.., H, R, Tk): softmax rows, one per query of this call (any batch dimensions before);
        allowed (R, Tk): the keys each query may read. The new rows are built once, (H, R, Tk), and
        broadcast over the batch: an intervention is the same for every sequence."""
        weight_heads = self.ablate if self.mode in WEIGHT_MODES else ()
        if not weight_heads and not self.edits:  # an output-mode plan: the rows stay the softmax's, untouched
            return weights
        H, (R, t_key) = weights.shape[-3], allowed.shape
        # 1/(number of allowed keys) on each allowed key: (R, Tk); a causal query at position p has p + 1
        # of them (fewer in a local window), a bidirectional one every key
        uniform = allowed.to(weights.dtype) / allowed.sum(-1, keepdim=True).to(weights.dtype)
        new = torch.zeros(H, R, t_key, dtype=weights.dtype, device=weights.device)
        replace = torch.zeros(H, R, 1, dtype=torch.bool, device=weights.device)  # which rows are new
        for h in weight_heads:  # "uniform", the one weight mode
            new[h] = uniform
            replace[h] = True
        for h, row, key in self.edits:
            if key is None:  # attend equally to what the mask allows
                new[h, row] = uniform[row]
            else:  # all of the row's weight on one key
                new[h, row] = 0.0
                new[h, row, key] = 1.0
            replace[h, row] = True
        return torch.where(replace, new, weights)  # (.., H, R, Tk)

    def apply_to_outputs(self, out: torch.Tensor) -> torch.Tensor:
        """What the heads pass on, with the output-mode heads zeroed or replaced by their mean over queries.

        out (.., H, R, X): one vector per head and query, before heads are concatenated (X = head_dim for
        the heads' values; any other per-query quantity that is linear in them, such as model/inside's
        value-weighted norms, ablates the same way). The mean runs over the R queries of this call,
        which is the whole text: WHOLE_TEXT_MODES are refused on top of a cache."""
        if self.mode not in OUTPUT_MODES or not self.ablate:  # weight modes and edits acted before V already
            return out
        mask = torch.zeros(out.shape[-3], 1, 1, dtype=torch.bool, device=out.device)  # (H, 1, 1)
        mask[list(self.ablate)] = True
        if self.mode == "zero":  # a 0-d zero broadcasts over (.., H, R, X) without building a zero tensor
            return torch.where(mask, torch.zeros((), dtype=out.dtype, device=out.device), out)
        return torch.where(mask, out.mean(dim=-2, keepdim=True), out)  # mean over this text's positions

    def ablation_of(self, head: int) -> str | None:
        """The mode that ablates `head`, or None when it is not ablated."""
        return self.mode if head in self.ablate else None

    def row_source(self, head: int, row: int) -> str:
        """Where row `row` of `head`'s used weights comes from: "softmax", a weight mode's word (the head's
        rows are replaced: "uniform"), or an edit ("edit: uniform", "edit: key k")."""
        # validate refuses an edit on an ablated head, so an edited row and a replaced head never overlap
        for h, r, key in self.edits:
            if h == head and r == row:
                return "edit: uniform" if key is None else f"edit: key {key}"
        return self.mode if self.mode in WEIGHT_MODES and head in self.ablate else "softmax"

    def edited_rows(self, head: int) -> list[int]:
        """The queries whose rows of `head` are edited, in order."""
        return sorted(row for h, row, _ in self.edits if h == head)


@dataclass(frozen=True)
class Intervention:
    """Heads to ablate (with `mode`, or all others with keep_only=True) and attention edits.

    `heads` accepts any iterable of (layer, head) pairs and is stored as a sorted tuple;
    `edits` accepts any iterable of `AttentionEdit`. Structure is checked when built; ranges
    (layers, heads, positions, mask) by `validate`, which the forward calls itself.
    """

    heads: tuple[tuple[int, int], ...] = ()
    mode: str = "zero"
    keep_only: bool = False
    edits: tuple[AttentionEdit, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in ABLATION_MODES:
            raise ValueError(
                f"ablation mode must be one of {', '.join(ABLATION_MODES)}; got {short(self.mode)}"
            )
        if not isinstance(self.keep_only, bool):
            raise ValueError(f"keep_only must be true or false, got {short(self.keep_only)}")
        # a string is iterable, so "0,1" would otherwise be read as pairs of characters
        if isinstance(self.heads, (str, bytes)):
            raise ValueError(f"heads must be a list of (layer, head) pairs, got {short(self.heads)}")
        try:  # lists from JSON, tuples from code: each pair becomes a tuple so pairs can be sorted and hashed
            pairs = [tuple(p) for p in self.heads]
        except TypeError:
            raise ValueError(
                f"heads must be a list of (layer, head) pairs, got {short(self.heads)}"
            ) from None
        for p in pairs:
            if len(p) != 2 or not all(is_int(v) and v >= 0 for v in p):
                raise ValueError(
                    f"each head must be a (layer, head) pair of non-negative integers, got {short(p)}"
                )
        # refused rather than merged: a pair listed twice points to a mistake in whatever built the list
        if len(set(pairs)) != len(pairs):
            raise ValueError("heads lists the same (layer, head) more than once")
        try:
            edits = tuple(self.edits)
        except TypeError:
            raise ValueError(f"edits must be a list of AttentionEdit, got {short(self.edits)}") from None
        for e in edits:
            if not isinstance(e, AttentionEdit):
                raise ValueError(f"edits must be AttentionEdit objects, got {short(e)}")
        # two edits of one row would leave which one wins to the order they were listed in
        seen = set()
        for e in edits:
            where = (e.layer, e.head, e.query)
            if where in seen:
                raise ValueError(f"two edits for layer {e.layer} head {e.head} query {e.query}; keep one")
            seen.add(where)
        # frozen dataclass: normalised through object.__setattr__, so equal interventions compare and hash equal
        object.__setattr__(self, "heads", tuple(sorted(pairs)))
        object.__setattr__(self, "edits", edits)

    @property
    def is_empty(self) -> bool:
        """True when the forward is the normal one (no head ablated, no row edited)."""
        return not self.heads and not self.keep_only and not self.edits

    def within(self, offset: int, start: int, seq_len: int) -> "Intervention":
        """This intervention, its edits given in positions of a whole text, for a forward over the
        text's positions offset .. offset + seq_len - 1 whose new (uncached) positions begin at
        `start` (positions of that forward): edits move to the forward's positions; an edit whose
        query is not among the new positions, or whose key lies before the window, is left out
        (a cached row was already computed with it; a key that left the window cannot be read).
        """
        kept = []
        for e in self.edits:
            q, k = e.query - offset, None if e.key is None else e.key - offset  # text -> window positions
            if start <= q < seq_len and (k is None or k >= 0):
                kept.append(AttentionEdit(e.layer, e.head, q, k))
        return Intervention(self.heads, self.mode, self.keep_only, kept)

    def ablated_heads(self, cfg: ModelConfig) -> frozenset[tuple[int, int]]:
        """The (layer, head) pairs actually ablated, keep_only resolved."""
        listed = set(self.heads)
        if not self.keep_only:  # the listed heads are the ablated ones
            return frozenset(listed)
        return frozenset(
            (l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads) if (l, h) not in listed
        )

    def validate(self, cfg: ModelConfig, seq_len: int | None = None, start: int = 0) -> None:
        """ValueError unless every layer/head exists in `cfg` and every edit fits the text.

        seq_len: total positions (cached + new) of the forward; start: the first new position
        (the cache length). Edit queries must be among the new positions; keys must exist and
        be allowed by the mask.
        """
        L, H = cfg.n_layers, cfg.n_heads
        # the listed heads are checked even under keep_only: a head that does not exist is a mistake either way
        for layer, head in self.heads:
            _check_head(layer, head, L, H, "ablated head")
        # a whole-text mode with no head ablated changes nothing, so only a real ablation is refused on a cache
        if self.mode in WHOLE_TEXT_MODES and start > 0 and self.ablated_heads(cfg):
            raise ValueError(
                "mean ablation averages over every position of the text, so it cannot run on "
                "top of a key/value cache; run the whole text without a cache"
            )
        ablated = self.ablated_heads(cfg)
        for e in self.edits:
            _check_head(e.layer, e.head, L, H, "attention edit")
            if (e.layer, e.head) in ablated:
                raise ValueError(
                    f"layer {e.layer} head {e.head} is both ablated ({self.mode}) and edited; "
                    "choose one for that head"
                )
            if seq_len is None:  # without a text only heads can be checked; positions need its length
                continue
            if not start <= e.query < seq_len:
                where = f"positions {start}..{seq_len - 1}" if start else f"0..{seq_len - 1}"
                raise ValueError(f"attention edit query {e.query} is out of range: the text has {where}")
            if e.key is not None:
                if e.key >= seq_len:
                    raise ValueError(
                        f"attention edit key {e.key} is out of range: the text has 0..{seq_len - 1}"
                    )
                if cfg.mask == "causal" and e.key > e.query:
                    raise ValueError(
                        f"attention edit key {e.key} is masked for query {e.query}: under the causal "
                        f"mask a query may only attend to keys 0..{e.query}"
                    )
                window = cfg.window(e.layer)  # 0 for a global layer: no lower bound on the key
                if window and e.key <= e.query - window:
                    raise ValueError(
                        f"attention edit key {e.key} is outside layer {e.layer}'s local window: query "
                        f"{e.query} attends only to keys {e.query - window + 1}..{e.query}"
                    )

    def layer_plans(self, cfg: ModelConfig, seq_len: int, start: int = 0) -> list[LayerPlan | None]:
        """Validate, then one plan per layer (None for a layer the intervention does not touch)."""
        self.validate(cfg, seq_len, start)
        ablated = self.ablated_heads(cfg)
        plans: list[LayerPlan | None] = []
        for layer in range(cfg.n_layers):
            heads = tuple(sorted(h for l, h in ablated if l == layer))
            # queries become rows of this call (it computes positions start .. seq_len - 1); keys stay as they
            # are, since this call's keys are every position, the cached ones included
            edits = tuple((e.head, e.query - start, e.key) for e in self.edits if e.layer == layer)
            # None lets the layer run the plain attention, bit for bit the forward without an intervention
            plans.append(LayerPlan(self.mode, heads, edits) if heads or edits else None)
        return plans


def _check_head(layer: int, head: int, n_layers: int, n_heads: int, what: str) -> None:
    """ValueError naming `what` and the valid range when (layer, head) is not in the model."""
    if not 0 <= layer < n_layers:
        raise ValueError(f"{what}: layer {layer} is out of range; the model has layers 0..{n_layers - 1}")
    if not 0 <= head < n_heads:
        raise ValueError(f"{what}: head {head} is out of range; each layer has heads 0..{n_heads - 1}")
