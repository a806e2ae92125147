"""Attribution patching beside exact patching, for the Circuits view: the first-order estimate of every cell of
a patching sweep from one backward pass (model.attribution), the exact sweep of the same cells (lab.patching's
own sweep, its batches and its numbers), and the cells of largest estimate re-run exactly
(model.attribution.verify_top, in the very batches the sweep runs them in, so their numbers are the sweep's bit
for bit), with every cell where the two disagree flagged.

The A/B pair, the metric, the sweeps ("heads", "resid", "attn", "mlp") and the directions ("denoising": run B
with one activation of A; "noising": run A with one of B) are lab.patching's, and so are the shares: 0 = the
patch changes nothing, 1 = it moves the metric all the way. A cell disagrees when the estimated change of the
metric is off the exact change by more than both tolerances: ATP_REL_TOL of the exact change and ATP_ABS_SHARE
of |m_A − m_B| (model.attribution's rule for a verified cell, applied here to every cell the sweep ran).

When the exact sweep would pass the server's limit (lab.patching.MAX_SWEEP_GFLOP) only the top cells are run
exactly (`exact_mode` "top-k"): the case attribution patching is for, a fixed budget of exact runs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from model.attribution import (ATP_ABS_SHARE, ATP_REL_TOL, FAILURE_REASONS, AnswerMetric, Attribution,
                               AttributionCheck, attribution_steps, verify_steps)
from model.patching import sweep_chunks

from . import patching
from .catalogue.models import ModelEntry
from .circuits_records import CircuitsProgress, engine_refusal, json_grid, json_number
from .downloads import Export, to_csv
from .patching import DIRECTIONS, SWEEPS, VALUE_NAMES, Metric, PatchSetup
from .server.files import model_stem

ATP_TOP = 10  # cells re-run exactly by default
MAX_ATP_TOP = 50


@dataclass
class VerifiedCell:
    """One of the top cells re-run exactly (model.attribution.CellCheck at its place in the map)."""

    row: int
    column: int
    name: str
    estimate: float
    exact: float
    patched: float
    relative_change: float
    abs_error: float
    rel_error: float
    disagrees: bool
    sign_flip: bool

    def to_json(self) -> dict:
        return {"row": self.row, "column": self.column, "name": self.name, "estimate": json_number(self.estimate),
                "exact": json_number(self.exact), "metric_patched": json_number(self.patched),
                "relative_change": json_number(self.relative_change), "abs_error": json_number(self.abs_error),
                "rel_error": json_number(self.rel_error), "disagrees": self.disagrees, "sign_flip": self.sign_flip}


@dataclass
class AtPRecord:
    """Attribution patching beside exact patching over one sweep's grid (R, C) = (rows, columns):
    estimate: the estimated change of the metric when a cell is patched (NaN where stopped before the backward
    pass); estimate_share: as a share of the A→B difference (lab.patching's sign for the direction);
    exact_metric: the exact patched run's metric (the sweep's, NaN where not run); exact_share its share;
    disagree: the cells whose estimate is off (see the module docstring); verified: the top cells re-run."""

    model: str
    what: str
    direction: str
    metric: Metric
    metric_a: float
    metric_b: float
    tokens_a: list[str]
    tokens_b: list[str]
    rows: list[str]
    columns: list[str]
    estimate: np.ndarray
    estimate_share: np.ndarray
    exact_metric: np.ndarray
    exact_share: np.ndarray
    exact_mode: str
    disagree: np.ndarray
    verified: list[VerifiedCell]
    k: int
    rel_tol: float
    abs_tol: float
    stopped: bool = False
    cautions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def difference(self) -> float:
        return self.metric_a - self.metric_b

    @property
    def metric_base(self) -> float:
        """The metric of the run patched: B's when denoising, A's when noising."""
        return self.metric_b if self.direction == "denoising" else self.metric_a

    @property
    def exact_effect(self) -> np.ndarray:
        return self.exact_metric - self.metric_base

    def correlation(self) -> float | None:
        """Pearson's r between estimate and exact change over the cells that have both (None: fewer than 3,
        or one side constant)."""
        both = np.isfinite(self.estimate) & np.isfinite(self.exact_metric)
        if both.sum() < 3:
            return None
        x, y = self.estimate[both], self.exact_effect[both]
        if np.ptp(x) == 0 or np.ptp(y) == 0:
            return None
        return float(np.corrcoef(x, y)[0, 1])

    def summary(self) -> str:
        if not np.isfinite(self.estimate).any():
            return "Stopped before the backward pass: there is no estimate yet."
        flagged = int(self.disagree.sum())
        ran = int(np.isfinite(self.exact_metric).sum())
        agree = sum(not c.disagrees for c in self.verified)
        r = self.correlation()
        line = f"Of the {len(self.verified)} cells of largest estimate, {agree} agree with their exact re-run"
        if self.exact_mode == "sweep":
            line += f"; over all {ran} cells the estimate disagrees at {flagged}"
        return line + (f" (Pearson r = {r:.2f})" if r is not None else "")

    def to_json(self) -> dict:
        m = self.metric
        return {"what": "attribution patching", "model": self.model, "sweep": self.what, "sweep_is": SWEEPS[self.what],
                "direction": self.direction, "direction_is": DIRECTIONS[self.direction], "metric": m.kind,
                "metric_is": m.label, "answer": m.answer_piece, "other": m.other_piece, "metric_a": self.metric_a,
                "metric_b": self.metric_b, "tokens_a": self.tokens_a, "tokens_b": self.tokens_b, "rows": self.rows,
                "columns": self.columns, "value_is": VALUE_NAMES[self.direction],
                "estimate": json_grid(self.estimate), "estimate_share": json_grid(self.estimate_share),
                "exact_metric": json_grid(self.exact_metric), "exact_share": json_grid(self.exact_share),
                "exact_mode": self.exact_mode, "disagree": self.disagree.tolist(),
                "verified": [c.to_json() for c in self.verified], "k": self.k, "rel_tol": self.rel_tol,
                "abs_tol": self.abs_tol, "correlation": self.correlation(), "stopped": self.stopped,
                "summary": self.summary(), "cautions": self.cautions, "notes": self.notes,
                "known_failures": list(FAILURE_REASONS.values())}


def atp_bytes(entry: ModelEntry, T: int) -> int:
    """Memory while it runs (float32), an estimate from the shapes: the base forward's graph and its
    gradients (per layer and token: the branches, q/k/v, the MLP's hidden layer and the attention rows),
    the source run's recording, and the exact sweep's own (lab.patching.sweep_bytes)."""
    cfg = entry.cfg
    per_token_layer = 12 * cfg.d_model + 3 * max(cfg.ff_dim, 1) + 3 * cfg.n_heads * T + 4 * cfg.attn_dim
    return 4 * 3 * T * cfg.n_layers * per_token_layer + patching.sweep_bytes(entry, T)


def verify_flops(entry: ModelEntry, what: str, T: int, k: int) -> float:
    """An upper bound of the exact re-runs' arithmetic: the `k` largest of the sweep's batches (at most one
    per cell re-run), each priced as a batch that runs every block (lab.patching.sweep_flops prices a batch by
    the blocks from its layer on), so never more than the whole sweep."""
    sites = patching.grid(entry, what, T)[2]
    sizes = sorted((e - s for s, e in sweep_chunks(sites, max(1, patching.BATCH_TOKENS // T))), reverse=True)
    cfg = entry.cfg
    C, hs, F = cfg.d_model, cfg.head_dim, cfg.ff_dim
    proj = C * (cfg.n_heads + 2 * cfg.kv_heads) * hs + cfg.attn_dim * C + C * F * (3 if cfg.gated else 2)
    per_row = T * cfg.n_layers * (2 * proj + 4 * T * cfg.n_heads * hs) + 2 * C * cfg.vocab_size
    return min(patching.sweep_flops(entry, what, T), sum(sizes[:k]) * per_row)


def _cell_name(what: str, rows: list[str], columns: list[str], r: int, c: int) -> str:
    if what == "heads":
        return f"{rows[r]}{columns[c]}"
    return f"{rows[r]} {what} @{c}" if what != "resid" else f"{rows[r]} @{c}"


def _disagree(estimate: np.ndarray, exact_effect: np.ndarray, abs_tol: float, rel_tol: float) -> np.ndarray:
    """model.attribution's rule for a verified cell, on every cell with both numbers."""
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.abs(estimate - exact_effect)
        rel = np.where(exact_effect != 0, err / np.abs(exact_effect), np.where(err == 0, 0.0, np.inf))
        return np.isfinite(estimate) & np.isfinite(exact_effect) & (err > abs_tol) & (rel > rel_tol)


def _shares(setup: PatchSetup, direction: str, metric: np.ndarray) -> np.ndarray:
    """A patched metric's share of the difference, as lab.patching.sweep_steps writes it."""
    if direction == "denoising":
        return (metric - setup.corrupted) / setup.difference
    return (setup.clean - metric) / setup.difference


def _estimate(setup: PatchSetup, direction: str, stop: threading.Event) -> Iterator[CircuitsProgress | Attribution]:
    """model.attribution's three phases, as progress, then the Attribution."""
    m = setup.metric
    metric = AnswerMetric(m.kind, m.answer, m.other)
    try:
        for p in attribution_steps(setup.entry.model, setup.ids_a, setup.ids_b, metric, direction, stop):
            if p.result is not None:
                yield p.result
                return
            yield CircuitsProgress("estimate", p.done, p.total)
    except ValueError as exc:
        raise engine_refusal(exc) from None


def atp_steps(setup: PatchSetup, what: str, direction: str, k: int, stop: threading.Event,
              exact_sweep: bool) -> Iterator[CircuitsProgress]:
    """The estimate, the exact sweep (when `exact_sweep`), then the top `k` cells re-run: progress after each
    phase's step, the AtPRecord at the end (a set `stop` ends it where it is; what was not run is NaN)."""
    entry, T = setup.entry, len(setup.ids_a)
    att = None
    for p in _estimate(setup, direction, stop):
        if isinstance(p, Attribution):
            att = p
        else:
            yield p
    sweep = None
    if exact_sweep and not att.stopped:
        for p in patching.sweep_steps(setup, what, direction, stop):
            if p.result is not None:
                sweep = p.result
            else:
                yield CircuitsProgress("exact sweep", p.done, p.total)
    check = None
    if not att.stopped and np.isfinite(att.estimates[what]).any() and not stop.is_set():
        rows_per_batch = max(1, patching.BATCH_TOKENS // T)
        for p in verify_steps(entry.model, att, what, k, rows_per_batch, stop=stop):
            if p.result is not None:
                check = p.result
            else:
                yield CircuitsProgress("exact re-runs", p.done, p.total)
    yield CircuitsProgress("done", 1, 1, _record(setup, what, direction, k, att, sweep, check, stop.is_set()))


def _record(setup: PatchSetup, what: str, direction: str, k: int, att: Attribution, sweep,
            check: AttributionCheck | None, stopped: bool) -> AtPRecord:
    rows, columns, _ = patching.grid(setup.entry, what, len(setup.ids_a))
    estimate = att.estimates[what]
    abs_tol = check.abs_tol if check is not None else ATP_ABS_SHARE * abs(att.difference)
    verified = [] if check is None else [
        VerifiedCell(c.index[0], c.index[1], _cell_name(what, rows, columns, *c.index), c.estimate, c.exact, c.patched,
                     c.relative_change, c.abs_error, c.rel_error, c.disagrees, c.sign_flip) for c in check.cells]
    if sweep is not None:
        exact_metric, mode = sweep.metric, "sweep"
    else:
        exact_metric, mode = np.full(estimate.shape, np.nan), "top-k"
        for c in verified:
            exact_metric[c.row, c.column] = c.patched
    with np.errstate(divide="ignore", invalid="ignore"):
        est_share = att.shares(what)
    disagree = _disagree(estimate, exact_metric - att.metric_base, abs_tol, ATP_REL_TOL)
    cautions = sweep.cautions() if sweep is not None else []
    notes = list(setup.notes)
    if mode == "top-k":
        notes.append(f"The exact sweep of every cell would pass the server's limit of {patching.MAX_SWEEP_GFLOP:,} "
                     f"GFLOP: only the {len(verified)} cells of largest estimate were run exactly.")
    return AtPRecord(setup.entry.name, what, direction, setup.metric, setup.clean, setup.corrupted, setup.tokens_a,
                     setup.tokens_b, rows, columns, estimate, est_share, exact_metric,
                     _shares(setup, direction, exact_metric), mode, disagree, verified, k, ATP_REL_TOL, abs_tol,
                     stopped, cautions, notes)


ATP_COLUMNS = ["sweep", "direction", "row", "layer", "head", "position", "token_a", "token_b", "estimate",
               "estimate_share", "metric_patched", "exact_share", "disagrees", "verified"]


def atp_export(r: AtPRecord) -> Export:
    """One CSV line per cell: the estimate and the exact number side by side; the JSON of `AtPRecord.to_json`."""
    verified = {(c.row, c.column) for c in r.verified}
    out = []
    for i in range(len(r.rows)):
        for j in range(len(r.columns)):
            pos = None if r.what == "heads" else j
            out.append([r.what, r.direction, r.rows[i], i - 1 if r.what == "resid" else i,
                        j if r.what == "heads" else None, pos, None if pos is None else r.tokens_a[pos],
                        None if pos is None else r.tokens_b[pos], r.estimate[i, j], r.estimate_share[i, j],
                        r.exact_metric[i, j], r.exact_share[i, j], bool(r.disagree[i, j]), (i, j) in verified])
    name = "_".join([model_stem(r.model), "atp", r.what, r.direction, f"{len(r.tokens_a)}tokens"])
    return Export(name, to_csv(ATP_COLUMNS, out), r.to_json())
