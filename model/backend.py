"""The contract between the Explore tools and whatever runs the model: what one forward must hand back, and
the interventions it must apply, written once so that a second runtime can stand in for the own engine.

Every Explore tool reads a few things from a forward of one text, and changes a few things in it:

* read: the attention probabilities of chosen heads (or all), each (T, T), the rows that multiplied the
  values, and on request the same heads' pre-softmax scores (T, T) as the own engine's forward returns them
  (scaled, after any soft-cap, -inf where the mask hides a key; an edited row or a uniform head changes the
  weights after the softmax, so its scores are the model's own); each head's output before the output
  projection (the per-head z, (H, T, head_dim) per layer, after any change of this forward); the residual
  stream after the embedding and after each block (n_layers + 1 of (T, C)); the final logits ((T, V), or
  the last position's (1, V));
* change: zero, mean (over this text's positions) or uniform-attention ablation of heads, and one
  attention row replaced, all as the own engine's `Intervention` and `AttentionEdit` say
  (model/interventions.py); a head's output times a factor (`HeadScale`); and activations of another
  prompt of the same length patched in at a layer and positions (the own engine's `PatchSite`:
  "resid", "head", "attn" or "mlp", model/patching.py).

`ForwardRequest` asks for all of it at once, `ForwardResult` holds the answer (on the CPU, float32 or the
model's wider dtype), and `Backend.patch_steps` runs a sweep: one patched run per site, the last
position's logits of each, handed back a chunk of sites at a time (`PATCH_BATCH_TOKENS` patched tokens), so
that a caller can show progress and stop between chunks; `Backend.patch_cells` is the whole sweep at once.
`check_request` (and `check_sweep` for a sweep) holds both backends to the same refusals, in the engine's
words, before anything runs. A text continues through any backend with model/backend_decoder.py's
`make_decoder`: the own engine's cached `Decoder`, or a `BackendDecoder` that samples as it does (it is one)
from a forward of the whole window per token.

Two backends implement it: `OwnBackend` here, on the own engine (DecoderLM), by calling the forward with
its own arguments (nothing is computed twice in another way), and `model.nnsight_backend.NnsightBackend`,
on a Hugging Face model through nnsight (local, spread with device_map, or on NDIF). What a backend cannot
do beyond the contract (training, films, the rebuild of one attention cell) it refuses by name
(`Backend.refusal`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Protocol, runtime_checkable

import numpy as np
import torch

from .config import ModelConfig
from .interventions import Intervention
from .json_bounds import is_int, short
from .patching import Patch, PatchSite, check_site_range, sweep_chunks
from .transformer import DecoderLM, readable

LOGITS = ("all", "last")
# The tools a backend may offer beyond the contract; `Backend.refusal` says why one is not offered.
BACKEND_TOOLS = ("train", "film", "inside")
# patched runs × tokens in one chunk of a sweep (lab/patching.py's BATCH_TOKENS): the own engine's batched forward,
# one nnsight session (one NDIF request)
PATCH_BATCH_TOKENS = 512


@dataclass(frozen=True)
class HeadScale:
    """Head `head` of layer `layer` passes on its output times `factor` (0 is a zero ablation, 1 nothing)."""

    layer: int
    head: int
    factor: float

    def __post_init__(self) -> None:
        for name in ("layer", "head"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise ValueError(f"head scale {name} must be a non-negative integer, got {short(getattr(self, name))}")
        f = self.factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f):
            raise ValueError(f"head scale factor must be a finite number, got {short(f)}")


@dataclass(frozen=True)
class PatchRequest:
    """Activations of the run over `source_ids` (as long as the forward's text) substituted at `sites`."""

    source_ids: tuple[int, ...]
    sites: tuple[PatchSite, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "source_ids", _token_ids(self.source_ids, "the patch's source"))
        sites = tuple(self.sites)
        if not sites or not all(isinstance(s, PatchSite) for s in sites):
            raise ValueError("a patch request needs one or more PatchSite objects")
        object.__setattr__(self, "sites", sites)


@dataclass(frozen=True)
class ForwardRequest:
    """One forward of one text (`ids`) and what it must read and change (see the module docstring).

    attention: "all", or the (layer, head) pairs whose probabilities to return (none by default).
    logits: "all" positions or the "last" one. scores: also return the pre-softmax scores of the heads
    `attention` names (so it needs some: a request for scores of no head is refused)."""

    ids: tuple[int, ...]
    attention: str | tuple[tuple[int, int], ...] = ()
    head_outputs: bool = False
    residuals: bool = False
    logits: str = "last"
    intervention: Intervention | None = None
    scales: tuple[HeadScale, ...] = ()
    patch: PatchRequest | None = None
    scores: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", _token_ids(self.ids, "the text"))
        if self.attention != "all":
            if isinstance(self.attention, str):
                raise ValueError(f'attention must be "all" or a list of (layer, head) pairs, '
                                 f'got {short(self.attention)}')
            pairs = tuple(tuple(p) for p in self.attention)
            if not all(len(p) == 2 and all(is_int(v) and v >= 0 for v in p) for p in pairs):
                raise ValueError("attention must list (layer, head) pairs of non-negative integers")
            object.__setattr__(self, "attention", tuple(sorted(set(pairs))))
        if self.logits not in LOGITS:
            raise ValueError(f'logits must be "all" or "last", got {short(self.logits)}')
        if self.intervention is not None and not isinstance(self.intervention, Intervention):
            raise ValueError("intervention must be an Intervention (model.interventions)")
        scales = tuple(self.scales)
        if not all(isinstance(s, HeadScale) for s in scales):
            raise ValueError("scales must be HeadScale objects")
        object.__setattr__(self, "scales", scales)
        if self.patch is not None and not isinstance(self.patch, PatchRequest):
            raise ValueError("patch must be a PatchRequest")
        if not isinstance(self.scores, bool):
            raise ValueError(f"scores must be true or false, got {short(self.scores)}")
        if self.scores and not self.attention:
            raise ValueError('scores are returned for the heads attention names; name some, or "all"')

    def heads_wanted(self, cfg: ModelConfig) -> tuple[tuple[int, int], ...]:
        """The (layer, head) pairs whose attention the forward returns, "all" resolved."""
        if self.attention == "all":
            return tuple((l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads))
        return self.attention


@dataclass
class ForwardResult:
    """What a forward hands back (one text, no batch dimension; on the CPU).

    attention: {(layer, head): (T, T)} for the heads asked for; scores: {(layer, head): (T, T)}, the same
    heads' pre-softmax scores with -inf where the mask hides a key, when asked for (else empty); head_outputs:
    per layer (H, T, head_dim), or None; residuals: n_layers + 1 of (T, C) (index 0 after the embedding, l + 1
    after block l), or None; seconds: how long the call took, to show what an action costs where the model runs."""

    logits: torch.Tensor
    attention: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    scores: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    head_outputs: tuple[torch.Tensor, ...] | None = None
    residuals: tuple[torch.Tensor, ...] | None = None
    seconds: float = 0.0


def per_layer(heads: dict, cfg: ModelConfig) -> list[np.ndarray]:
    """A result's attention or scores for every head ({(layer, head): (T, T)}) as one (H, T, T) float32 array per
    layer, the shape the own engine's decoder and the lab's figures read."""
    return [torch.stack([heads[layer, h] for h in range(cfg.n_heads)]).float().numpy() for layer in range(cfg.n_layers)]


@runtime_checkable
class Backend(Protocol):
    """What runs the model for the Explore tools: the own engine, or nnsight (see the module docstring)."""

    name: str  # "own" or "nnsight"
    cfg: ModelConfig  # the model's shape as the own engine reads it: layers, heads, windows, vocabulary
    tokenizer: object  # model.tokenizers.Tokenizer: encode, decode, piece, eos_id

    def where(self) -> str:
        """Where the model runs and how large it is, in words for the page."""

    def forward(self, request: ForwardRequest) -> ForwardResult:
        """One forward of request.ids with its reads and changes (ValueError names what is refused)."""

    def patch_steps(self, ids: Iterable[int], source_ids: Iterable[int], sites: Iterable[PatchSite],
                    batch_tokens: int | None = None) -> Iterator[torch.Tensor]:
        """The sweep of `patch_cells` a chunk at a time: the last position's logits (n_chunk, V) of consecutive
        chunks of `sites`, in order, each chunk at most max(1, batch_tokens // len(ids)) sites (batch_tokens:
        PATCH_BATCH_TOKENS by default). Everything is checked when it is called, before the first chunk runs
        (ValueError); the chunks run as they are asked for, so a caller may stop between two."""

    def patch_cells(self, ids: Iterable[int], source_ids: Iterable[int], sites: Iterable[PatchSite]) -> torch.Tensor:
        """One run of `ids` per site, with that site's activation from the run of `source_ids`:
        the last position's logits of each, (n_sites, V): every chunk of `patch_steps` joined."""

    def refusal(self, tool: str) -> str | None:
        """Why this backend does not offer `tool` (one of BACKEND_TOOLS), or None when it does."""


def _token_ids(ids, what: str) -> tuple[int, ...]:
    if isinstance(ids, (str, bytes)):
        raise ValueError(f"{what} must be a list of token ids, got {short(ids)}")
    try:
        out = tuple(ids.tolist() if isinstance(ids, torch.Tensor) else ids)
    except TypeError:
        raise ValueError(f"{what} must be a list of token ids, got {short(ids)}") from None
    if not out or not all(is_int(i) and i >= 0 for i in out):
        raise ValueError(f"{what} must be a non-empty list of non-negative token ids")
    return out


def check_request(cfg: ModelConfig, request: ForwardRequest) -> None:
    """ValueError unless the request fits the model `cfg` describes: the same refusals on every backend."""
    T = len(request.ids)
    _check_ids(cfg, request.ids, "the text")
    for layer, head in request.heads_wanted(cfg):
        _check_head(cfg, layer, head, "attention head")
    iv = request.intervention
    if iv is not None:
        iv.validate(cfg, T)
    ablated = iv.ablated_heads(cfg) if iv is not None else frozenset()
    seen = set()
    for s in request.scales:
        _check_head(cfg, s.layer, s.head, "head scale")
        if (s.layer, s.head) in seen:
            raise ValueError(f"layer {s.layer} head {s.head} is scaled twice; keep one factor")
        if (s.layer, s.head) in ablated:
            raise ValueError(f"layer {s.layer} head {s.head} is both ablated ({iv.mode}) and scaled; choose one")
        seen.add((s.layer, s.head))
    if request.patch is not None:
        if request.scales:
            raise ValueError("a forward takes head scales or a patch from another prompt, not both; run them apart")
        check_patch(cfg, request.ids, request.patch.source_ids, request.patch.sites)


def check_patch(cfg: ModelConfig, ids: tuple[int, ...], source_ids: tuple[int, ...], sites) -> None:
    """ValueError unless the source is as long as the text and every site exists in the model and the text."""
    T = len(ids)
    _check_ids(cfg, source_ids, "the patch's source")
    if len(source_ids) != T:
        raise ValueError(f"the patch's source has {len(source_ids)} tokens, the text {T}; patching needs prompts "
                         "of the same length")
    for s in sites:
        if not isinstance(s, PatchSite):
            raise ValueError("patch sites must be PatchSite objects")
        if s.row is not None:
            raise ValueError("a patch site of the contract names no batch row: each site is its own run")
        check_site_range(cfg, s, has_mlp=cfg.ff_dim != 0)
        if s.positions is not None and max(s.positions) >= T:
            raise ValueError(f"patch position {max(s.positions)} is out of range 0..{T - 1}")


def check_sweep(cfg: ModelConfig, ids, source_ids, sites, batch_tokens: int | None
                ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[PatchSite, ...], int]:
    """A sweep's arguments read and checked (ValueError), and the most sites one chunk of it holds."""
    ids, source_ids = _token_ids(ids, "the text"), _token_ids(source_ids, "the patch's source")
    if isinstance(sites, (str, bytes)):
        raise ValueError("patch sites must be PatchSite objects")
    try:
        sites = tuple(sites)
    except TypeError:
        raise ValueError("patch sites must be PatchSite objects") from None
    if batch_tokens is not None and (not is_int(batch_tokens) or batch_tokens < 1):
        raise ValueError(f"batch_tokens must be a whole number >= 1, got {short(batch_tokens)}")
    _check_ids(cfg, ids, "the text")
    check_patch(cfg, ids, source_ids, sites)
    return ids, source_ids, sites, max(1, (batch_tokens or PATCH_BATCH_TOKENS) // len(ids))


def _check_ids(cfg: ModelConfig, ids: tuple[int, ...], what: str) -> None:
    if len(ids) > cfg.block_size:
        raise ValueError(f"{what} has {len(ids)} tokens; the model reads at most {cfg.block_size}")
    if max(ids) >= cfg.vocab_size:
        raise ValueError(f"{what} has token id {max(ids)}; the model has ids 0..{cfg.vocab_size - 1}")


def _check_head(cfg: ModelConfig, layer: int, head: int, what: str) -> None:
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(f"{what}: layer {layer} is out of range; the model has layers 0..{cfg.n_layers - 1}")
    if not 0 <= head < cfg.n_heads:
        raise ValueError(f"{what}: head {head} is out of range; each layer has heads 0..{cfg.n_heads - 1}")


class OwnBackend:
    """The contract on the own engine: each request is the arguments of `DecoderLM.forward` (return_attention,
    return_residuals, record, intervention, patch, logits; the scores are the forward's own `scores`). A
    sweep runs a chunk of sites as one batched forward, one batch row per site, as lab/patching.py's sweeps
    do. A head scale is a patch of the head's own output times its factor, recorded layer by layer (a scale in
    layer l changes what every later layer computes)."""

    name = "own"

    def __init__(self, model: DecoderLM, tokenizer=None):
        self.model = model
        self.cfg = model.cfg
        self.tokenizer = tokenizer

    def where(self) -> str:
        device = self.model.tok_emb.weight.device
        return f"the own engine in this process ({device.type}), {self.cfg.n_params():,} parameters"

    def refusal(self, tool: str) -> str | None:
        if tool not in BACKEND_TOOLS:
            raise ValueError(f"tool must be one of {', '.join(BACKEND_TOOLS)}, got {short(tool)}")
        return None

    def _ids(self, ids) -> torch.Tensor:
        return torch.tensor([list(ids)], device=self.model.tok_emb.weight.device)

    def forward(self, request: ForwardRequest) -> ForwardResult:
        check_request(self.cfg, request)
        started = time.perf_counter()
        ids = self._ids(request.ids)
        with torch.inference_mode():
            patch = None
            if request.patch is not None:
                source = self.model(self._ids(request.patch.source_ids), record=True, logits="last").activations
                patch = Patch(source, request.patch.sites)
            elif request.scales:
                patch = self._scale_patch(ids, request.intervention, request.scales)
            heads = request.heads_wanted(self.cfg)
            out = self.model(ids, return_attention=bool(heads), return_residuals=request.residuals,
                             intervention=request.intervention, patch=patch, record=request.head_outputs,
                             logits=request.logits)
        return ForwardResult(
            logits=readable(out.logits[0]).cpu(),
            attention={(l, h): readable(out.attentions[l][0, h]).cpu() for l, h in heads},
            scores={(l, h): readable(out.scores[l][0, h]).cpu() for l, h in heads} if request.scores else {},
            head_outputs=tuple(readable(t[0]).cpu() for t in out.activations.heads) if request.head_outputs else None,
            residuals=tuple(readable(r[0]).cpu() for r in out.residuals) if request.residuals else None,
            seconds=time.perf_counter() - started)

    def _scale_patch(self, ids: torch.Tensor, intervention: Intervention | None, scales) -> Patch:
        """The patch that scales heads: layer by layer, a recorded forward (with the scales of earlier layers
        already patched in) gives each scaled head's output there, which is patched in times its factor."""
        sites: list[PatchSite] = []
        patch = None
        for layer in sorted({s.layer for s in scales}):
            run = self.model(ids, intervention=intervention, patch=patch, record=True, logits="last").activations
            heads = list(run.heads)
            scaled = heads[layer].clone()
            for s in scales:
                if s.layer == layer:
                    scaled[:, s.head] = heads[layer][:, s.head] * s.factor
                    sites.append(PatchSite("head", layer, head=s.head))
            heads[layer] = scaled
            # every earlier layer's recorded head outputs are already the scaled ones: recorded after the swap
            patch = Patch(replace(run, heads=tuple(heads)), tuple(sites))
        return patch

    def patch_steps(self, ids, source_ids, sites, batch_tokens: int | None = None) -> Iterator[torch.Tensor]:
        ids, source_ids, sites, per_chunk = check_sweep(self.cfg, ids, source_ids, sites, batch_tokens)
        return self._sweep(ids, source_ids, sites, per_chunk) if sites else iter(())

    def _sweep(self, ids, source_ids, sites, per_chunk: int) -> Iterator[torch.Tensor]:
        """The chunks of a checked sweep: the source and the plain run recorded once, then one batched forward
        per chunk (sites of one layer: a chunk's forward starts at that layer, the blocks before it the plain
        run's, model.patching's `base`)."""
        x = self._ids(ids)
        with torch.inference_mode():
            source = self.model(self._ids(source_ids), record=True, logits="last").activations
            base = self.model(x, record=True, logits="last").activations
        for start, stop in sweep_chunks(sites, per_chunk):
            # one batch row per site, as the lab's sweeps run them (model.patching's `row`)
            batch = tuple(replace(s, row=i) for i, s in enumerate(sites[start:stop]))
            with torch.inference_mode():
                out = self.model(x.expand(len(batch), -1), patch=Patch(source, batch, base=base), logits="last")
            yield readable(out.logits[:, -1]).cpu()

    def patch_cells(self, ids, source_ids, sites) -> torch.Tensor:
        return join_chunks(self.patch_steps(ids, source_ids, sites), self.cfg.vocab_size)


def join_chunks(chunks: Iterable[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """A sweep's chunks as one (n_sites, V) tensor; (0, V) for a sweep of no site."""
    chunks = list(chunks)
    return torch.cat(chunks) if chunks else torch.empty(0, vocab_size)
