"""Attribution patching: a first-order estimate of every activation-patching cell from one backward pass,
set beside exact patching (model/patching.py) and checked against it.

Exact activation patching (model.patching; lab/patching.py's sweeps) runs one patched forward per cell.
Attribution patching (Nanda 2023, "Attribution patching: activation patching at industrial scale";
Kramár et al. 2024, "AtP*: an efficient and scalable method for localizing LLM behaviour to components")
replaces each of those forwards by the first term of a Taylor series around the patched run's own input:

    effect(site) = m(base run, site := source's activation) − m(base run)
                 ≈ (act_source(site) − act_base(site)) · ∂m/∂act(site), the gradient taken on the base run

for every site at once: one forward of the base text with a graph and one backward of the metric give the
gradient at every recorded activation; one forward of the source text gives its activations. The two
directions are lab/patching.py's: "noising" runs A (the clean text) with one activation of B (base A,
source B: the gradient is taken on A), "denoising" runs B with one activation of A (base B, source A).

Grids (`ATP_GRIDS`; each estimate array is laid out as its grid, row-major, in `atp_grid_sites`' order):
"head_pos" (L, H, T) each head's output at one position; "heads" (L, H) a head's output at every
position (the app's layer × head sweep: the sum of that head's positions, since the first-order term is
linear in the patch); "resid" (L + 1, T) the residual stream after the embedding (row 0) and after each
block at one position; "attn" and "mlp" (L, T) a block's branch output at one position (NaN for a block
without a feed-forward branch).

The metric (`AnswerMetric`) is lab/patching.py's `Metric`, defined again here because the lab sits above
the engine: at the last position, in float64 from the logits the forward returns, over the vocabulary rows
a token stands for (ModelConfig.vocab_used): the logit difference of two answer tokens, or the softmax
probability of one. Its values are the lab's bit for bit.

How the gradient is taken without touching the forward. A forward with record=True hands back every
site's tensor, and those tensors are the very ones the rest of the forward reads, so the metric's gradient
with respect to each is its derivative under a patch of that site. The app's weights do not require
gradients, so something must start a graph: one patch of model.patching swaps the residual stream after
the embedding for a copy of itself that requires a gradient. The swap takes the copy's bits (torch.where),
so the forward computes exactly the numbers of a plain recording (the tests hold them equal bit for bit).
The engine's forward is not changed at all: without attribution nothing runs differently.

Verification (`verify_top`): the k cells of largest estimated |effect| run again exactly through
model.patching, as lab/patching.py's sweeps run them (the base text's own recording as the patch's `base`,
the last position read out). float32 products round differently in batches of other shapes (by about 1e-7
of a logit), so with `batch_rows` (the cells a sweep runs per batch) each cell runs in the very batch that
sweep of its whole grid would run it in, and its number is that sweep's bit for bit.

Where the estimate is known to fail (`FAILURE_REASONS`; Kramár et al. 2024, section 3), and why a cell is
flagged when the estimate and the exact effect differ by more than both tolerances:
* saturated softmax: where an attention pattern (or, for a probability metric, the output distribution)
  is saturated its gradient is near zero, yet a patch can move it over to another key or token; the
  estimate says "nothing" where the exact effect is large (a false negative, AtP's main failure);
* cancellation: effects along several paths (a head's direct write and what later layers make of it,
  or the positions of one head in the layer × head grid) can cancel to first order but not exactly, so a
  small estimate hides a real effect, or a large one a small effect;
* nonlinearity of LayerNorm / RMSNorm: each norm divides by the size of what it reads; a patch large
  next to the activation it replaces changes that size, which a first-order term holds fixed. Residual
  sites, whose patch replaces the whole stream at a position, suffer most (`CellCheck.relative_change`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from .attention import soft_cap
from .config import ModelConfig
from .json_bounds import is_int
from .patching import Activations, Patch, PatchSite, sweep_chunks
from .transformer import DecoderLM, ForwardOutput

ATP_METRICS = {"logit_diff": "logit difference of two answer tokens", "prob": "probability of one answer token"}
ATP_DIRECTIONS = {"noising": "run A with one activation of B (the gradient taken on A)",
                  "denoising": "run B with one activation of A (the gradient taken on B)"}
ATP_GRIDS = {"head_pos": "each head's output at one position (layer × head × position)",
             "heads": "each head's output at every position (layer × head)",
             "resid": "the residual stream at one position (embedding and after each block × position)",
             "attn": "a block's attention output at one position (layer × position)",
             "mlp": "a block's MLP output at one position (layer × position)"}
ATP_REL_TOL = 0.2  # a verified cell disagrees when off by more than this share of its exact effect ...
ATP_ABS_SHARE = 0.05  # ... and by more than this share of |m_A − m_B| (the default absolute tolerance)
FAILURE_REASONS = {
    "saturation": "Saturated softmax: a saturated attention pattern (or output distribution) has a gradient near "
                  "zero, yet a patch can move it to another key or token, so the estimate misses a large effect.",
    "cancellation": "Cancellation: effects along several paths, or over several positions, cancel to first order "
                    "but not exactly, so a small estimate can hide a real effect.",
    "norm": "Nonlinearity of LayerNorm/RMSNorm: a norm divides by the size of what it reads; a patch large next to "
            "the activation it replaces changes that size, which the first-order term holds fixed.",
}

_Stop = Callable[[], bool] | threading.Event | None
_Progress = Callable[[str, int, int], None] | None


@dataclass(frozen=True)
class AnswerMetric:
    """What is measured at the last position: kind "logit_diff" (logit[answer] − logit[other]) or "prob"
    (the softmax probability of `answer` over the used vocabulary rows); lab/patching.py's `Metric`."""

    kind: str
    answer: int
    other: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ATP_METRICS:
            raise ValueError(f"metric kind must be one of {', '.join(ATP_METRICS)}; got {self.kind!r:.40}")
        for name in ("answer", "other"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 0):
                raise ValueError(f"the metric's {name} token must be a token id, got {value!r:.40}")
        if (self.kind == "logit_diff") != (self.other is not None):
            raise ValueError("a logit difference needs two answer tokens; a probability takes one")
        if self.other is not None and self.other == self.answer:
            raise ValueError("the two answer tokens are the same token: a logit difference needs two")

    def check(self, cfg: ModelConfig) -> None:
        n = cfg.vocab_used or cfg.vocab_size
        for token in (self.answer, self.other):
            if token is not None and token >= n:
                raise ValueError(f"answer token {token} is out of range: the model's tokens are 0..{n - 1}")

    def of(self, last_logits: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
        """The metric of each row of `last_logits` (N, V): float64 (N,), differentiable."""
        z = last_logits.double()[..., : cfg.vocab_used or cfg.vocab_size]  # the padded rows stand for no token
        if self.kind == "prob":
            return torch.softmax(z, dim=-1)[:, self.answer]
        return z[:, self.answer] - z[:, self.other]


def atp_grid_sites(cfg: ModelConfig, kind: str, n_positions: int) -> list[PatchSite]:
    """One patch site per cell of a grid, row-major (the order of lab/patching.py's `grid` for its sweeps)."""
    L, H, T = cfg.n_layers, cfg.n_heads, n_positions
    if kind == "head_pos":
        return [PatchSite("head", l, head=h, positions=(t,)) for l in range(L) for h in range(H) for t in range(T)]
    if kind == "heads":
        return [PatchSite("head", l, head=h) for l in range(L) for h in range(H)]
    if kind == "resid":
        return [PatchSite("resid", r, positions=(t,)) for r in range(L + 1) for t in range(T)]
    if kind in ("attn", "mlp"):
        return [PatchSite(kind, l, positions=(t,)) for l in range(L) for t in range(T)]
    raise ValueError(f"grid must be one of {', '.join(ATP_GRIDS)}; got {kind!r:.40}")


@dataclass
class Attribution:
    """The estimates of one A/B pair: `estimates[grid]` the estimated change of the metric when that cell's
    activation of the source run is patched into the base run (all NaN when stopped before the backward
    pass). metric_a, metric_b: the metric on A and on B (lab's PatchSetup.clean and .corrupted)."""

    metric: AnswerMetric
    direction: str
    ids_a: tuple[int, ...]
    ids_b: tuple[int, ...]
    metric_a: float
    metric_b: float
    estimates: dict[str, np.ndarray]
    base: Activations | None = field(default=None, repr=False)  # the base run's recording (detached)
    source: Activations | None = field(default=None, repr=False)  # the source run's recording
    stopped: bool = False

    @property
    def difference(self) -> float:
        return self.metric_a - self.metric_b

    @property
    def metric_base(self) -> float:
        """The metric of the run that is patched (A when noising, B when denoising)."""
        return self.metric_a if self.direction == "noising" else self.metric_b

    @property
    def base_ids(self) -> tuple[int, ...]:
        return self.ids_a if self.direction == "noising" else self.ids_b

    def shares(self, grid: str) -> np.ndarray:
        """The estimates as lab/patching.py's shares of the A→B difference: (m_patched − m_B) / (m_A − m_B)
        when denoising, (m_A − m_patched) / (m_A − m_B) when noising."""
        est = self.estimates[grid]
        with np.errstate(divide="ignore", invalid="ignore"):  # A and B alike: no difference to share out
            return (est if self.direction == "denoising" else -est) / self.difference

    def top(self, grid: str, k: int) -> list[tuple[int, ...]]:
        """The indices of the `k` cells of largest estimated |effect|, largest first (ties in grid order)."""
        est = self.estimates[grid]
        flat = np.where(np.isfinite(est), np.abs(est), -1.0).ravel()
        order = np.argsort(-flat, kind="stable")[:k]
        return [tuple(int(i) for i in np.unravel_index(f, est.shape)) for f in order if flat[f] >= 0]


@dataclass(frozen=True)
class CellCheck:
    """One verified cell: the estimated and the exact change of the metric, the exact patched run's metric
    (the sweep's cell), how large the patch is next to the activation it replaces (‖Δ‖ / ‖act_base‖),
    the errors, whether the two disagree (beyond both tolerances) and whether they point opposite ways."""

    grid: str
    index: tuple[int, ...]
    site: PatchSite
    estimate: float
    exact: float
    patched: float
    relative_change: float
    abs_error: float
    rel_error: float
    disagrees: bool
    sign_flip: bool

    @property
    def name(self) -> str:
        i = self.index
        if self.grid in ("head_pos", "heads"):
            return f"L{i[0]}H{i[1]}" + (f" @{i[2]}" if self.grid == "head_pos" else "")
        if self.grid == "resid":
            return ("embedding" if i[0] == 0 else f"after L{i[0] - 1}") + f" @{i[1]}"
        return f"L{i[0]} {self.grid} @{i[1]}"


@dataclass
class AttributionCheck:
    """The top cells of one grid re-run exactly, largest estimate first (fewer than asked when stopped)."""

    attribution: Attribution
    grid: str
    cells: list[CellCheck]
    rel_tol: float
    abs_tol: float
    batch_rows: int
    stopped: bool = False

    @property
    def disagreements(self) -> list[CellCheck]:
        return [c for c in self.cells if c.disagrees]


@dataclass
class AtPProgress:
    """Where a run is: `done` of `total` steps of `phase`; `result` is set on the last one (also when stopped)."""

    phase: str
    done: int
    total: int
    result: Attribution | AttributionCheck | None = None


def _stopped(stop: _Stop) -> bool:
    if stop is None:
        return False
    return stop.is_set() if isinstance(stop, threading.Event) else bool(stop())


def _token_ids(model: DecoderLM, ids, which: str) -> torch.Tensor:
    """(1, T) long ids of one text, checked against the model."""
    t = torch.as_tensor(ids, dtype=torch.long)
    t = t.reshape(1, -1) if t.dim() == 1 or (t.dim() == 2 and t.shape[0] == 1) else None
    if t is None or t.shape[1] == 0:
        raise ValueError(f"text {which} must be a non-empty list of token ids (one text)")
    cfg = model.cfg
    if t.shape[1] > cfg.block_size:
        raise ValueError(f"text {which} has {t.shape[1]} tokens; the model reads at most {cfg.block_size}")
    if int(t.min()) < 0 or int(t.max()) >= cfg.vocab_size:
        raise ValueError(f"text {which} holds a token id outside 0..{cfg.vocab_size - 1}")
    return t.to(model.head.weight.device)


def _last_logits(model: DecoderLM, out: ForwardOutput) -> torch.Tensor:
    """The last position's logits (N, V) as the metric reads them: the forward's own, except for float64
    weights, whose read-out the forward rounds to float32; those are read out again in float64."""
    if model.head.weight.dtype != torch.float64:
        return out.logits[:, -1]
    x = out.activations.residuals[-1][:, -1]
    return soft_cap(model.head(model.norm_f(x)), model.cfg.logit_softcap)


def _tracked_forward(model: DecoderLM, ids: torch.Tensor) -> ForwardOutput:
    """The recorded forward of `ids` with a graph from the stream after the embedding on (see the module
    docstring): that stream is swapped for a copy of itself that requires a gradient."""
    cfg = model.cfg
    with torch.no_grad():
        if cfg.smear_width:  # `embed` refuses a smear model (nanochat): its stream from a recording instead
            start = model(ids, record=True, logits="last").activations.residuals[0]
        else:  # what the forward adds up first (its dropout is off in eval mode)
            start = model.embed(ids, torch.arange(ids.shape[1], device=ids.device))
    leaf = start.detach().clone().requires_grad_(True)
    fill = (leaf,) * cfg.n_layers  # only residual 0 is read: the rest stands in for the other sites
    swap = Patch(Activations(fill, fill, fill, (leaf,)), [PatchSite("resid", 0)])
    return model(ids, patch=swap, record=True, logits="last")


def _detached(acts: Activations) -> Activations:
    def d(t):
        return None if t is None else t.detach()
    return Activations(tuple(map(d, acts.heads)), tuple(map(d, acts.attn)), tuple(map(d, acts.mlp)),
                       tuple(map(d, acts.residuals)))


def _estimates(cfg: ModelConfig, base: Activations, source: Activations, grads: dict) -> dict[str, np.ndarray]:
    """(source − base) · gradient at every site, summed over each site's features, in float64."""
    def dot(src, bas, g):  # (1, .., F) -> (..) as numpy
        return ((src.double() - bas.double()) * g.double()).sum(-1)[0].cpu().numpy()
    L, T = cfg.n_layers, base.shape[1]
    head_pos = np.stack([dot(source.heads[l], base.heads[l], grads["head"][l]) for l in range(L)])  # (L, H, T)
    out = {"head_pos": head_pos, "heads": head_pos.sum(-1),
           "resid": np.stack([dot(source.residuals[r], base.residuals[r], grads["resid"][r]) for r in range(L + 1)])}
    for kind in ("attn", "mlp"):
        rows = [np.full(T, np.nan) if getattr(base, kind)[l] is None else
                dot(getattr(source, kind)[l], getattr(base, kind)[l], grads[kind][l]) for l in range(L)]
        out[kind] = np.stack(rows)
    return out


def _gradients(metric_value: torch.Tensor, acts: Activations) -> dict[str, list]:
    """∂metric/∂activation at every recorded site (zeros where the metric does not depend on it)."""
    named = [("head", l, t) for l, t in enumerate(acts.heads)] + [("attn", l, t) for l, t in enumerate(acts.attn)]
    named += [("mlp", l, t) for l, t in enumerate(acts.mlp) if t is not None]
    named += [("resid", r, t) for r, t in enumerate(acts.residuals)]
    wanted = [t for _, _, t in named if t.requires_grad]
    found = iter(torch.autograd.grad(metric_value, wanted, allow_unused=True))
    grads: dict[str, list] = {"head": [None] * len(acts.heads), "attn": [None] * len(acts.attn),
                              "mlp": [None] * len(acts.mlp), "resid": [None] * len(acts.residuals)}
    for kind, i, t in named:
        g = next(found) if t.requires_grad else None
        grads[kind][i] = torch.zeros_like(t) if g is None else g
    return grads


def attribution_steps(model: DecoderLM, ids_a, ids_b, metric: AnswerMetric, direction: str = "noising",
                      stop: _Stop = None) -> Iterator[AtPProgress]:
    """Attribution patching one phase at a time ("source forward", "base forward", "backward"), yielding
    progress after each and the `Attribution` at the end; `stop` (a callable or an Event) is checked
    before each phase, and a stopped run ends with stopped=True (its estimates NaN)."""
    if direction not in ATP_DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(ATP_DIRECTIONS)}; got {direction!r:.40}")
    if not isinstance(metric, AnswerMetric):
        raise ValueError(f"metric must be an AnswerMetric, got {type(metric).__name__}")
    cfg = model.cfg
    metric.check(cfg)
    if model.training and cfg.dropout > 0:
        raise ValueError("the model is in training mode with dropout: put it in eval mode first")
    a, b = _token_ids(model, ids_a, "A"), _token_ids(model, ids_b, "B")
    if a.shape != b.shape:
        raise ValueError(f"patching compares activations position by position, so A and B need the same number "
                         f"of tokens: A has {a.shape[1]}, B has {b.shape[1]}")
    base_ids, source_ids = (a, b) if direction == "noising" else (b, a)
    T, nan = a.shape[1], float("nan")
    result = Attribution(metric, direction, tuple(a[0].tolist()), tuple(b[0].tolist()), nan, nan,
                         {g: np.full(_grid_shape(cfg, g, T), np.nan) for g in ATP_GRIDS})

    def ends(done: int) -> AtPProgress:
        result.stopped = True
        return AtPProgress("stopped", done, 3, result)

    if _stopped(stop):
        yield ends(0)
        return
    with torch.inference_mode():  # the source run, exactly as lab/patching.py records it
        src = model(source_ids, record=True, logits="last")
        m_source = float(metric.of(_last_logits(model, src), cfg)[0])
    setattr(result, "metric_b" if direction == "noising" else "metric_a", m_source)
    yield AtPProgress("source forward", 1, 3)
    if _stopped(stop):
        yield ends(1)
        return
    with torch.inference_mode(False), torch.enable_grad():  # even under a caller's inference mode
        out = _tracked_forward(model, base_ids)
        m = metric.of(_last_logits(model, out), cfg)[0]
    setattr(result, "metric_a" if direction == "noising" else "metric_b", float(m.detach()))
    result.base, result.source = _detached(out.activations), src.activations
    yield AtPProgress("base forward", 2, 3)
    if _stopped(stop):
        yield ends(2)
        return
    with torch.inference_mode(False), torch.enable_grad():
        grads = _gradients(m, out.activations)
    result.estimates = _estimates(cfg, result.base, result.source, grads)
    yield AtPProgress("backward", 3, 3, result)


def _grid_shape(cfg: ModelConfig, grid: str, T: int) -> tuple[int, ...]:
    L, H = cfg.n_layers, cfg.n_heads
    return {"head_pos": (L, H, T), "heads": (L, H), "resid": (L + 1, T), "attn": (L, T), "mlp": (L, T)}[grid]


def _run_steps(steps: Iterator[AtPProgress], progress: _Progress):
    for p in steps:
        if p.result is not None:
            return p.result
        if progress is not None:
            progress(p.phase, p.done, p.total)
    raise AssertionError("a run always ends with its result")


def attribute(model: DecoderLM, ids_a, ids_b, metric: AnswerMetric, direction: str = "noising",
              progress: _Progress = None, stop: _Stop = None) -> Attribution:
    """`attribution_steps` to the end, calling progress(phase, done, total) after each phase."""
    return _run_steps(attribution_steps(model, ids_a, ids_b, metric, direction, stop), progress)


def exact_patched_metrics(model: DecoderLM, ids: torch.Tensor, own: Activations, source: Activations,
                          sites: Sequence[PatchSite], metric: AnswerMetric) -> np.ndarray:
    """The metric (float64) of one exact patched run of `ids` (1, T) per site, all in one batch: row j takes
    sites[j] from `source`; `own` is the recording of `ids` itself (the patch's `base`). The forward
    lab/patching.py's sweeps run for one batch of cells, call for call."""
    rows = [PatchSite(s.kind, s.layer, s.head, s.positions, row=j) for j, s in enumerate(sites)]
    with torch.inference_mode():
        logits = model(ids.expand(len(rows), ids.shape[1]), patch=Patch(source, rows, base=own), logits="last").logits
        return metric.of(logits[:, -1], model.cfg).cpu().numpy()


def _site_tensor(acts: Activations, grid: str, index: tuple[int, ...]) -> torch.Tensor:
    """The slice of a recording that one cell's patch replaces."""
    if grid in ("head_pos", "heads"):
        return acts.heads[index[0]][0, index[1]][index[2] if grid == "head_pos" else slice(None)]
    if grid == "resid":
        return acts.residuals[index[0]][0, index[1]]
    return getattr(acts, grid)[index[0]][0, index[1]]


def _cell(att: Attribution, grid: str, index: tuple[int, ...], site: PatchSite, patched: float,
          rel_tol: float, abs_tol: float) -> CellCheck:
    est = float(att.estimates[grid][index])
    exact = patched - att.metric_base
    base, src = (_site_tensor(a, grid, index).double() for a in (att.base, att.source))
    size, change = float(base.norm()), float((src - base).norm())
    relative = change / size if size else (0.0 if change == 0 else float("inf"))
    err = abs(est - exact)
    rel = err / abs(exact) if exact else (0.0 if err == 0 else float("inf"))
    flip = est * exact < 0 and min(abs(est), abs(exact)) > abs_tol
    return CellCheck(grid, index, site, est, exact, patched, relative, err, rel, err > abs_tol and rel > rel_tol, flip)


def verify_steps(model: DecoderLM, attribution: Attribution, grid: str = "head_pos", k: int = 10,
                 batch_rows: int = 1, rel_tol: float = ATP_REL_TOL, abs_tol: float | None = None,
                 stop: _Stop = None) -> Iterator[AtPProgress]:
    """Re-run the `k` cells of `grid` with the largest estimated |effect| exactly, a batch at a time, yielding
    progress (cells done) after each batch and the `AttributionCheck` at the end. batch_rows: the cells a
    sweep of the whole grid runs per batch (lab/patching.py: max(1, BATCH_TOKENS // T)); each cell runs in
    the batch of that sweep which holds it, so its number is that sweep's bit for bit (1: each cell alone).
    abs_tol None: ATP_ABS_SHARE × |m_A − m_B|. `stop` is checked before each batch."""
    if grid not in ATP_GRIDS:
        raise ValueError(f"grid must be one of {', '.join(ATP_GRIDS)}; got {grid!r:.40}")
    if not is_int(k) or k < 1 or not is_int(batch_rows) or batch_rows < 1:
        raise ValueError("k and batch_rows must be positive whole numbers")
    cfg = model.cfg
    if grid == "mlp" and cfg.ff_dim == 0:
        raise ValueError("this model has no MLP (feed-forward) layers to verify")
    if attribution.base is None or not np.isfinite(attribution.estimates[grid]).any():
        raise ValueError("this attribution has no estimates to verify (it was stopped before its backward pass)")
    abs_tol = ATP_ABS_SHARE * abs(attribution.difference) if abs_tol is None else float(abs_tol)
    T = len(attribution.ids_a)
    shape, sites = _grid_shape(cfg, grid, T), atp_grid_sites(cfg, grid, T)
    wanted = [int(np.ravel_multi_index(i, shape)) for i in attribution.top(grid, k)]
    batches = [(s, e) for s, e in sweep_chunks(sites, batch_rows) if any(s <= f < e for f in wanted)]
    ids = torch.tensor([list(attribution.base_ids)], device=model.head.weight.device)
    patched: dict[int, float] = {}
    stopped = False
    for n, (s, e) in enumerate(batches):
        if _stopped(stop):
            stopped = True
            break
        values = exact_patched_metrics(model, ids, attribution.base, attribution.source, sites[s:e],
                                       attribution.metric)
        patched.update({f: float(values[f - s]) for f in wanted if s <= f < e})
        if n + 1 < len(batches):
            yield AtPProgress("exact re-runs", len(patched), len(wanted))
    cells = [_cell(attribution, grid, tuple(int(i) for i in np.unravel_index(f, shape)), sites[f], patched[f],
                   rel_tol, abs_tol) for f in wanted if f in patched]
    yield AtPProgress("exact re-runs", len(patched), len(wanted),
                      AttributionCheck(attribution, grid, cells, rel_tol, abs_tol, batch_rows, stopped))


def verify_top(model: DecoderLM, attribution: Attribution, grid: str = "head_pos", k: int = 10, batch_rows: int = 1,
               rel_tol: float = ATP_REL_TOL, abs_tol: float | None = None, progress: _Progress = None,
               stop: _Stop = None) -> AttributionCheck:
    """`verify_steps` to the end, calling progress(phase, done, total) after each batch."""
    return _run_steps(verify_steps(model, attribution, grid, k, batch_rows, rel_tol, abs_tol, stop), progress)


def attribute_and_verify(model: DecoderLM, ids_a, ids_b, metric: AnswerMetric, grid: str = "head_pos", k: int = 10,
                         direction: str = "noising", batch_rows: int = 1, rel_tol: float = ATP_REL_TOL,
                         abs_tol: float | None = None, progress: _Progress = None,
                         stop: _Stop = None) -> AttributionCheck:
    """`attribute`, then `verify_top` on its `grid`; a run stopped before the estimates exist ends with an
    AttributionCheck of no cells and stopped=True."""
    att = attribute(model, ids_a, ids_b, metric, direction, progress, stop)
    if att.stopped and not np.isfinite(att.estimates[grid]).any():
        return AttributionCheck(att, grid, [], rel_tol, ATP_ABS_SHARE * abs(att.difference) if abs_tol is None
                                else float(abs_tol), batch_rows, stopped=True)
    return verify_top(model, att, grid, k, batch_rows, rel_tol, abs_tol, progress, stop)
