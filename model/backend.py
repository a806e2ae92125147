"""The contract between the Explore tools and whatever runs the model: what one forward must hand back, and
the interventions it must apply, written once so that a second runtime can stand in for the own engine.

Every Explore tool reads a few things from a forward of one text, and changes a few things in it:

* read: the attention probabilities of chosen heads (or all), each (T, T), the rows that multiplied the
  values; each head's output before the output projection (the per-head z, (H, T, head_dim) per layer,
  after any change of this forward); the residual stream after the embedding and after each block
  (n_layers + 1 of (T, C)); the final logits ((T, V), or the last position's (1, V));
* change: zero, mean (over this text's positions) or uniform-attention ablation of heads, and one
  attention row replaced, all as the own engine's `Intervention` and `AttentionEdit` say
  (model/interventions.py); a head's output times a factor (`HeadScale`); and activations of another
  prompt of the same length patched in at a layer and positions (the own engine's `PatchSite`:
  "resid", "head", "attn" or "mlp", model/patching.py).

`ForwardRequest` asks for all of it at once, `ForwardResult` holds the answer (on the CPU, float32 or the
model's wider dtype), and `Backend.patch_cells` runs a sweep: one patched run per site, the last
position's logits of each. `check_request` holds both backends to the same refusals, in the engine's
words, before anything runs. `generate_steps` continues a text through any backend, sampling exactly as
`model.generate.Decoder.step` does (same settings, same generator), one forward per token.

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

import torch

from .config import ModelConfig
from .generate import Sampling, Step, adjust_probs, mask_padding
from .interventions import Intervention
from .json_bounds import is_int, short
from .patching import Patch, PatchSite, check_site_range
from .transformer import DecoderLM, readable

LOGITS = ("all", "last")
# The tools a backend may offer beyond the contract; `Backend.refusal` says why one is not offered.
BACKEND_TOOLS = ("train", "film", "inside")
PATCH_BATCH = 32  # patched runs the own engine puts in one batched forward of a sweep


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
    logits: "all" positions or the "last" one."""

    ids: tuple[int, ...]
    attention: str | tuple[tuple[int, int], ...] = ()
    head_outputs: bool = False
    residuals: bool = False
    logits: str = "last"
    intervention: Intervention | None = None
    scales: tuple[HeadScale, ...] = ()
    patch: PatchRequest | None = None

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

    def heads_wanted(self, cfg: ModelConfig) -> tuple[tuple[int, int], ...]:
        """The (layer, head) pairs whose attention the forward returns, "all" resolved."""
        if self.attention == "all":
            return tuple((l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads))
        return self.attention


@dataclass
class ForwardResult:
    """What a forward hands back (one text, no batch dimension; on the CPU).

    attention: {(layer, head): (T, T)} for the heads asked for; head_outputs: per layer (H, T, head_dim), or
    None; residuals: n_layers + 1 of (T, C) (index 0 after the embedding, l + 1 after block l), or None;
    seconds: how long the call took, to show what an action costs where the model runs."""

    logits: torch.Tensor
    attention: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    head_outputs: tuple[torch.Tensor, ...] | None = None
    residuals: tuple[torch.Tensor, ...] | None = None
    seconds: float = 0.0


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

    def patch_cells(self, ids: Iterable[int], source_ids: Iterable[int], sites: Iterable[PatchSite]) -> torch.Tensor:
        """One run of `ids` per site, with that site's activation from the run of `source_ids`:
        the last position's logits of each, (n_sites, V)."""

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
    return_residuals, record, intervention, patch, logits). A head scale is a patch of the head's own output
    times its factor, recorded layer by layer (a scale in layer l changes what every later layer computes)."""

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

    def patch_cells(self, ids, source_ids, sites) -> torch.Tensor:
        ids, source_ids, sites = _token_ids(ids, "the text"), _token_ids(source_ids, "the patch's source"), tuple(sites)
        check_patch(self.cfg, ids, source_ids, sites)
        x = self._ids(ids)
        rows = []
        with torch.inference_mode():
            source = self.model(self._ids(source_ids), record=True, logits="last").activations
            base = self.model(x, record=True, logits="last").activations
            for start in range(0, len(sites), PATCH_BATCH):
                chunk = sites[start : start + PATCH_BATCH]
                # one batch row per site, as the lab's sweeps run them (model.patching's `row`)
                batch = tuple(replace(s, row=i) for i, s in enumerate(chunk))
                out = self.model(x.expand(len(chunk), -1), patch=Patch(source, batch, base=base), logits="last")
                rows.append(readable(out.logits[:, -1]).cpu())
        return torch.cat(rows) if rows else torch.empty(0, self.cfg.vocab_size)


def generate_steps(backend: Backend, ids: Iterable[int], max_new_tokens: int, sampling: Sampling,
                   eos_id: int | None = None, piece: Callable[[int], str] = str) -> Iterator[Step]:
    """Continue `ids` through `backend`, one forward over the window (the last block_size tokens) per new token,
    sampling as `Decoder.step` does: the padded vocabulary rows masked, temperature / top-k / top-p applied by
    `adjust_probs`, one draw of a generator seeded with sampling.seed (greedy at temperature 0). Stops after
    `max_new_tokens` or right after `eos_id`. Steps carry no attention rows."""
    if not is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a whole number >= 0, got {short(max_new_tokens)}")
    ids = list(_token_ids(ids, "the prompt"))
    cfg = backend.cfg
    generator = torch.Generator().manual_seed(sampling.seed)
    for _ in range(max_new_tokens):
        window = ids[-cfg.block_size :]
        logits = backend.forward(ForwardRequest(tuple(window), logits="last")).logits[-1]
        logits = mask_padding(logits.float().cpu(), cfg.vocab_used)
        probs = torch.softmax(logits, dim=-1)
        adjusted = adjust_probs(logits, sampling)
        token = (int(torch.multinomial(adjusted, 1, generator=generator)) if sampling.temperature
                 else int(adjusted.argmax()))
        # the window slides when the text was already a whole context long (Decoder's `cropped`)
        cropped = len(ids) >= cfg.block_size
        ids.append(token)
        eos = eos_id is not None and token == eos_id
        yield Step(token_id=token, piece=piece(token), probs=probs.numpy(), adjusted=adjusted.numpy(), rows=[],
                   position=len(ids) - 1, cropped=cropped, eos=eos, sampling=sampling)
        if eos:
            return
