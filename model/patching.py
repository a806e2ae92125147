"""Activation patching: an argument of `DecoderLM.forward` that substitutes activations of another run.

Activation patching (Wang et al. 2022, the indirect-object circuit; Heimersheim & Nanda 2024, "How to
use and interpret activation patching") runs two prompts of the same length, copies one activation of
one run into the other, and measures how much of the difference in the answer moves with it.

Two pieces, both plain data:

* `Activations`: what a forward called with `record=True` returns in `ForwardOutput.activations`, for
  every layer l:
  - heads[l]     (B, H, T, hs): each head's output, its slice of the concatenated head outputs before
                 the output projection (after any ablation or attention edit of that forward);
  - attn[l]      (B, T, C): the attention branch's output (after the output projection), what the
                 block adds to the residual stream (post-norm: what it adds before the norm);
  - mlp[l]       (B, T, C): the feed-forward branch's output, None for a block without one;
  - residuals    n_layers + 1 tensors (B, T, C): the residual stream after the embedding (index 0)
                 and after block l (index l + 1), as `ForwardOutput.residuals` numbers them.
* `Patch(source, sites)`: the activations to substitute. Each `PatchSite` names one activation:
  kind "head" (layer, head), "attn" or "mlp" (layer), or "resid" (layer = residual index: 0 the
  embedding, l + 1 after block l); at every position (positions=None) or the positions listed; in
  every batch row (row=None) or in one row only, so one batched forward runs many patched runs at
  once (a sweep). The substituted values are `source`'s at the same positions; `source` has batch 1
  (used for every row) or the forward's batch. Optionally `base`: the recording of the patched
  forward's own input (the same ids, no intervention); with it a plain forward (no attention,
  residuals, recording, cache or intervention asked) does not run again the blocks before the first
  one a site changes: it starts from `base`'s residual stream there, which is what they would compute.

A patched activation is replaced where it is made, so everything after it reads the new value
(a residual patched after block l is what block l + 1 reads). With patch=None or an empty patch the
forward is bit-for-bit the normal one. Positions are positions of the forward's input; a patch needs
the whole text, so it is refused together with a key/value cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from .config import ModelConfig
from .json_bounds import is_int

PATCH_KINDS = ("head", "resid", "attn", "mlp")


def check_site_range(cfg, s, has_mlp: bool = True) -> None:
    """A ValueError when patch site `s` names a layer, residual index or head the model `cfg` lacks, or an MLP
    its block does not have (`has_mlp` False: d_ff=0, the block has attention only)."""
    # the residual stream has one more place than there are blocks: the embedding's output
    top = cfg.n_layers + 1 if s.kind == "resid" else cfg.n_layers
    if s.layer >= top:
        what = "residual index" if s.kind == "resid" else "layer"
        raise ValueError(f"patch {what} {s.layer} is out of range 0..{top - 1}")
    if s.head is not None and s.head >= cfg.n_heads:
        raise ValueError(f"patch head {s.head} is out of range; each layer has heads 0..{cfg.n_heads - 1}")
    if s.kind == "mlp" and not has_mlp:
        raise ValueError(f"layer {s.layer} has no feed-forward (MLP) branch to patch")


@dataclass(frozen=True)
class Activations:
    """One forward's activations, recorded with `record=True` (fields: see the module docstring)."""

    heads: tuple[torch.Tensor, ...]
    attn: tuple[torch.Tensor, ...]
    mlp: tuple[torch.Tensor | None, ...]
    residuals: tuple[torch.Tensor, ...]

    @property
    def shape(self) -> tuple[int, int]:
        """(batch, positions) of the recorded run."""
        B, T, _ = self.residuals[0].shape
        return B, T

    def row(self, b: int) -> "Activations":
        """Batch row `b` alone (batch 1), e.g. one prompt of a batch of two as a patch's source."""
        def one(t):  # a slice, not t[b], keeps the batch axis: (B, ..) -> (1, ..)
            return None if t is None else t[b : b + 1]
        return Activations(tuple(map(one, self.heads)), tuple(map(one, self.attn)), tuple(map(one, self.mlp)),
                           tuple(map(one, self.residuals)))


@dataclass(frozen=True)
class PatchSite:
    """One activation to substitute (see the module docstring for `kind` and `layer`)."""

    kind: str
    layer: int
    head: int | None = None
    positions: tuple[int, ...] | None = None
    row: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in PATCH_KINDS:
            raise ValueError(f"patch kind must be one of {', '.join(PATCH_KINDS)}; got {self.kind!r:.40}")
        if not is_int(self.layer) or self.layer < 0:
            raise ValueError(f"patch layer must be a non-negative integer, got {self.layer!r:.40}")
        # a head is named only by a head site: on any other kind it would be silently meaningless
        if (self.kind == "head") != (self.head is not None):
            raise ValueError("a head patch needs a head; other patches take none")
        if self.head is not None and (not is_int(self.head) or self.head < 0):
            raise ValueError(f"patch head must be a non-negative integer, got {self.head!r:.40}")
        if self.row is not None and (not is_int(self.row) or self.row < 0):
            raise ValueError(f"patch row must be a non-negative integer or None, got {self.row!r:.40}")
        if self.positions is not None:
            try:
                positions = tuple(self.positions)
            except TypeError:
                raise ValueError(f"patch positions must be a list of positions, got {self.positions!r:.40}") from None
            # an empty list would patch nothing while looking like a patch; None is how to say "every position"
            if not positions or not all(is_int(p) and p >= 0 for p in positions):
                raise ValueError("patch positions must be a non-empty list of non-negative integers")
            object.__setattr__(self, "positions", positions)


@dataclass(frozen=True)
class Patch:
    """Activations of `source` substituted at `sites` (see the module docstring)."""

    source: Activations | None = None
    sites: tuple[PatchSite, ...] = ()
    base: Activations | None = None

    def __post_init__(self) -> None:
        sites = tuple(self.sites)
        if not all(isinstance(s, PatchSite) for s in sites):
            raise ValueError("patch sites must be PatchSite objects")
        if sites and not isinstance(self.source, Activations):
            raise ValueError("a patch needs the source run's Activations (a forward with record=True)")
        if self.base is not None and not isinstance(self.base, Activations):
            raise ValueError("a patch's base must be the Activations of its own input's run, or None")
        object.__setattr__(self, "sites", sites)

    @property
    def is_empty(self) -> bool:
        return not self.sites

    def validate(self, cfg: ModelConfig, batch: int, seq_len: int) -> None:
        """ValueError unless every site exists in `cfg`, fits `seq_len` positions and `batch` rows,
        and the source was recorded on this model's shapes."""
        # both recordings are read position by position and row by row, so both must match this forward
        for what, run in (("source", self.source), ("base", self.base)):
            if run is None:  # no base given
                continue
            B_src, T_src = run.shape
            if T_src != seq_len:
                raise ValueError(f"the patch's {what} run has {T_src} positions, this forward {seq_len}; "
                                 "patching needs inputs of the same length")
            # batch 1 broadcasts over every row (one source for a sweep); otherwise row b patches row b
            if B_src not in (1, batch):
                raise ValueError(f"the patch's {what} run has batch {B_src}; use 1 or this forward's {batch}")
            # a cheap sign of a recording made on another model: its layer count or its width differs
            if len(run.heads) != cfg.n_layers or run.residuals[0].shape[-1] != cfg.d_model:
                raise ValueError(f"the patch's {what} run was recorded on a model of another shape")
        for s in self.sites:
            check_site_range(cfg, s, has_mlp=s.kind != "mlp" or self.source.mlp[s.layer] is not None)
            if s.positions is not None and max(s.positions) >= seq_len:
                raise ValueError(f"patch position {max(s.positions)} is out of range 0..{seq_len - 1}")
            if s.row is not None and s.row >= batch:
                raise ValueError(f"patch row {s.row} is out of range 0..{batch - 1}")


class _Swap:
    """Where one activation of a forward is replaced: a boolean mask over (rows, [heads,] positions)
    with a trailing 1, and the source values it selects."""

    def __init__(self, mask: torch.Tensor, source: torch.Tensor):
        self.mask, self.source = mask, source

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # the mask's trailing 1 broadcasts over the feature axis (C or hs), and a batch-1 source over the
        # rows, so one where() swaps whole vectors where the mask is set and leaves the rest untouched
        return torch.where(self.mask, self.source.to(x.dtype), x)


def _mask_for(sites: list[PatchSite], shape: tuple[int, ...], device) -> torch.Tensor:
    """Boolean (B, [H,] T, 1): True where one of `sites` substitutes."""
    mask = torch.zeros(*shape, 1, dtype=torch.bool, device=device)
    for s in sites:  # several sites of one kind and layer (e.g. a sweep, one per row) share one mask
        rows = slice(None) if s.row is None else s.row  # None: every row of the batch
        where = slice(None) if s.positions is None else list(s.positions)  # None: every position
        if s.kind == "head":  # the mask has a head axis: (B, H, T, 1)
            mask[rows, s.head, where] = True
        else:
            mask[rows, where] = True
    return mask


class LayerTap:
    """What one block does with its activations in a patched or recorded forward: each method gets
    the activation as made and returns the one the forward goes on with (recording it if asked)."""

    def __init__(self, record: bool):
        self.record = record
        self.swaps: dict[str, _Swap] = {}
        self.seen: dict[str, torch.Tensor] = {}

    def _pass(self, kind: str, x: torch.Tensor) -> torch.Tensor:
        swap = self.swaps.get(kind)
        if swap is not None:  # this activation of this block is patched
            x = swap(x)
        if self.record:  # recorded after the swap: what the rest of the forward actually read
            self.seen[kind] = x
        return x

    def head(self, y: torch.Tensor) -> torch.Tensor:
        """Head outputs y: (B, H, T, hs), before the heads are concatenated and projected."""
        return self._pass("head", y)

    def attn(self, a: torch.Tensor) -> torch.Tensor:
        """The attention branch's output (B, T, C)."""
        return self._pass("attn", a)

    def mlp(self, m: torch.Tensor) -> torch.Tensor:
        """The feed-forward branch's output (B, T, C)."""
        return self._pass("mlp", m)


class Taps:
    """The taps of one forward: one `LayerTap` per block and the residual stream's swaps."""

    def __init__(self, n_layers: int, record: bool):
        self.record = record
        self.layers = [LayerTap(record) for _ in range(n_layers)]
        self.resid_swaps: dict[int, _Swap] = {}
        self.residuals: list[torch.Tensor] = []
        self.skip = 0  # blocks the forward need not run: before the first one the patch changes
        self.start: torch.Tensor | None = None  # then the residual stream entering block `skip` (B, T, C)

    def resid(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """The residual stream at `index` (0: after the embedding, l + 1: after block l)."""
        swap = self.resid_swaps.get(index)
        if swap is not None:
            x = swap(x)
        if self.record:  # called once per index, in order, so the list's index is the residual index
            self.residuals.append(x)
        return x

    def activations(self) -> Activations:
        # every block has heads and an attention branch; "mlp" is missing where a block has no MLP
        return Activations(tuple(t.seen["head"] for t in self.layers), tuple(t.seen["attn"] for t in self.layers),
                           tuple(t.seen.get("mlp") for t in self.layers), tuple(self.residuals))


def make_taps(cfg: ModelConfig, patch: Patch | None, record: bool, batch: int, seq_len: int,
              device, start: int = 0, plain: bool = False) -> Taps | None:
    """The taps a forward needs (None: neither a patch nor a recording, the plain forward).

    Validates the patch first (ValueError); `start` is the key/value cache's length, which must be 0
    for a patch. plain: the forward asks for nothing but logits (no attention, residuals, cache or
    intervention), so a patch with a `base` may skip the blocks before its first site."""
    if patch is not None and not isinstance(patch, Patch):
        raise ValueError(f"patch must be a Patch, got {type(patch).__name__}")
    patching = patch is not None and not patch.is_empty
    if not patching and not record:  # the forward runs untouched, bit for bit the normal one
        return None
    taps = Taps(cfg.n_layers, record)
    if not patching:  # recording only: taps with no swaps
        return taps
    if start:
        raise ValueError("a patch substitutes activations of a whole text, so it cannot run on top of a "
                         "key/value cache; run the whole text without a cache")
    patch.validate(cfg, batch, seq_len)
    src, B, T = patch.source, batch, seq_len
    # one swap per (kind, layer) that any site names; n_layers + 1 covers the residual indices too (a block
    # kind never reaches the last one, since validate refused it)
    for kind in PATCH_KINDS:
        for layer in range(cfg.n_layers + 1):
            sites = [s for s in patch.sites if s.kind == kind and s.layer == layer]
            if not sites:
                continue
            if kind == "resid":
                taps.resid_swaps[layer] = _Swap(_mask_for(sites, (B, T), device), src.residuals[layer])
            elif kind == "head":  # source (B or 1, H, T, hs): the mask gets a head axis
                mask = _mask_for(sites, (B, cfg.n_heads, T), device)
                taps.layers[layer].swaps[kind] = _Swap(mask, src.heads[layer])
            else:  # "attn" or "mlp": (B or 1, T, C), read off the recording by the kind's own name
                taps.layers[layer].swaps[kind] = _Swap(_mask_for(sites, (B, T), device),
                                                       getattr(src, kind)[layer])
    if plain and not record and patch.base is not None:
        # a site at residual index r or in block l leaves blocks before r (before l) as the base run has them
        taps.skip = min(s.layer for s in patch.sites)
        if taps.skip:  # residual index skip is the input of block skip; a (1, T, C) base serves every row
            taps.start = patch.base.residuals[taps.skip].expand(B, -1, -1)
    return taps


def sweep_chunks(sites: Sequence[PatchSite], per_chunk: int, one_layer: bool = True) -> Iterator[tuple[int, int]]:
    """(start, stop) of each chunk of a sweep, in order: at most `per_chunk` sites, and with `one_layer` only
    sites of one layer (a batch of the own engine runs from its layer on, the blocks before it are the base
    run's; a run of one layer's sites is split where it ends). A sweep's batches everywhere: the contract's
    patch_steps, the lab's cost of a sweep, attribution patching's exact re-runs."""
    start = 0
    while start < len(sites):
        stop = min(start + per_chunk, len(sites))
        if one_layer:
            stop = next((i for i in range(start + 1, stop) if sites[i].layer != sites[start].layer), stop)
        yield start, stop
        start = stop
