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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import ModelConfig

ABLATION_MODES = ("zero", "mean", "uniform")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
        for name in ("layer", "head", "query"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ValueError(f"attention edit {name} must be a non-negative integer, got {_short(value)}")
        if self.key is not None and (not _is_int(self.key) or self.key < 0):
            raise ValueError(
                f"attention edit key must be a non-negative integer or None (uniform), got {_short(self.key)}"
            )

    @property
    def target(self) -> str:
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
                f"ablation mode must be one of {', '.join(ABLATION_MODES)}; got {_short(self.mode)}"
            )
        if not isinstance(self.keep_only, bool):
            raise ValueError(f"keep_only must be true or false, got {_short(self.keep_only)}")
        if isinstance(self.heads, (str, bytes)):
            raise ValueError(f"heads must be a list of (layer, head) pairs, got {_short(self.heads)}")
        try:
            pairs = [tuple(p) for p in self.heads]
        except TypeError:
            raise ValueError(
                f"heads must be a list of (layer, head) pairs, got {_short(self.heads)}"
            ) from None
        for p in pairs:
            if len(p) != 2 or not all(_is_int(v) and v >= 0 for v in p):
                raise ValueError(
                    f"each head must be a (layer, head) pair of non-negative integers, got {_short(p)}"
                )
        if len(set(pairs)) != len(pairs):
            raise ValueError("heads lists the same (layer, head) more than once")
        try:
            edits = tuple(self.edits)
        except TypeError:
            raise ValueError(f"edits must be a list of AttentionEdit, got {_short(self.edits)}") from None
        for e in edits:
            if not isinstance(e, AttentionEdit):
                raise ValueError(f"edits must be AttentionEdit objects, got {_short(e)}")
        seen = set()
        for e in edits:
            where = (e.layer, e.head, e.query)
            if where in seen:
                raise ValueError(f"two edits for layer {e.layer} head {e.head} query {e.query}; keep one")
            seen.add(where)
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
            q, k = e.query - offset, None if e.key is None else e.key - offset
            if start <= q < seq_len and (k is None or k >= 0):
                kept.append(AttentionEdit(e.layer, e.head, q, k))
        return Intervention(self.heads, self.mode, self.keep_only, kept)

    def ablated_heads(self, cfg: ModelConfig) -> frozenset[tuple[int, int]]:
        """The (layer, head) pairs actually ablated, keep_only resolved."""
        listed = set(self.heads)
        if not self.keep_only:
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
        for layer, head in self.heads:
            _check_head(layer, head, L, H, "ablated head")
        if self.mode == "mean" and start > 0 and self.ablated_heads(cfg):
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
            if seq_len is None:
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
                window = cfg.window(e.layer)
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
            edits = tuple((e.head, e.query - start, e.key) for e in self.edits if e.layer == layer)
            plans.append(LayerPlan(self.mode, heads, edits) if heads or edits else None)
        return plans


def _check_head(layer: int, head: int, n_layers: int, n_heads: int, what: str) -> None:
    if not 0 <= layer < n_layers:
        raise ValueError(f"{what}: layer {layer} is out of range; the model has layers 0..{n_layers - 1}")
    if not 0 <= head < n_heads:
        raise ValueError(f"{what}: head {head} is out of range; each layer has heads 0..{n_heads - 1}")
