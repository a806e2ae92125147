"""Activation patching between two prompts: which heads and positions carry the difference in the answer.

The field's method (Wang et al. 2022; Heimersheim & Nanda 2024, "How to use and interpret activation
patching"): run prompt A (the clean run) and prompt B (the corrupted run), which differ in a few
tokens and have the same number of tokens, then copy one activation from one run into the other and
measure how much of the difference in the answer moves with it. Every cell is a real forward of the
model with that activation substituted (`model.patching`); cells run many at a time in one batch.

* The metric, at the last position: the logit difference between two answer tokens (logit(" she") −
  logit(" he")), or the probability of one answer token. m_A and m_B are its values on A and on B.
* Denoising (clean → corrupted): run B with one activation from A. Its share of the A→B difference
  restored = (m_patched − m_B) / (m_A − m_B): 1 when that activation alone brings A's answer back
  into B's run, 0 when it changes nothing. It finds what is *enough* to carry the difference.
* Noising (corrupted → clean): run A with one activation from B. Its share of the difference made
  = (m_A − m_patched) / (m_A − m_B): 1 when that activation alone turns A's answer into B's, 0 when
  A's run does not need it. It finds what A's answer *needs*. (The normalised metric the field writes
  for both directions, (m_patched − m_B) / (m_A − m_B), is 1 minus this: noising plots are usually
  read as how far a cell falls from 1; here both directions read 0 = nothing, 1 = everything.)
* Sweeps: "heads" (every layer × head: the head's output at every position), "resid" (the residual
  stream after the embedding and after each block × position), "attn" and "mlp" (each block's
  attention or feed-forward output × position).

A patching result says which activations carry the difference between these two prompts for this
metric; it says nothing about what they compute on other prompts, and cells need not add up (two
heads that each restore 60 % may do it by the same path).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch

from model.hf_tokenizer import HFFileTokenizer
from model.backend import PATCH_BATCH_TOKENS, ForwardRequest, sweep_chunks
from model.patching import PatchSite

from .catalogue.models import ModelEntry, encode_prompt
from .checks import UserError, check_choice, quoted
from .downloads import Export, to_csv
from .pairs import pairs_for
from .server.files import model_stem
from .text import used_rows

METRICS = {"logit_diff": "logit difference of two answer tokens", "prob": "probability of one answer token"}
DIRECTIONS = {
    "denoising": "clean into corrupted: run B and put in one activation from A; 1 = that activation alone "
                 "brings A's answer back (it is enough to carry the difference)",
    "noising": "corrupted into clean: run A and put in one activation from B; 1 = that activation alone turns "
               "A's answer into B's (A's answer needs it)",
}
SWEEPS = {"heads": "head outputs (layer × head)", "resid": "residual stream (layer × position)",
          "attn": "attention output (layer × position)", "mlp": "MLP output (layer × position)"}
VALUE_NAMES = {"denoising": "share of the A→B difference restored", "noising": "share of the A→B difference made"}
MIN_DIFFERENCE = {"logit_diff": 1e-3, "prob": 1e-4}  # |m_A − m_B| below this: nothing to restore
# A difference small next to what changes it: the sweep's patched runs spread over more than NOISE_RATIO times
# |m_A − m_B| (max − min of the cells' metric), so its shares span more than NOISE_RATIO × 100 percentage points.
# When A and B really differ in what the metric reads, each cell lands between B's value and A's (shares 0 … 1,
# an overshoot or a negative cell a fraction of the difference): every sweep of the built-ins' minimal pairs
# spreads 0.78-1.14 times its difference. A difference that single patches overshoot twice over is one those
# patches' own effects drown (issue 36: a random GPT-2's 0.506 vs 0.543 gave shares from −358 % to +443 %).
NOISE_RATIO = 2.0
# a session's sweep at most: GPT-2 small's layer × head sweep of 16 tokens is 224 GFLOP (bench/RESULTS.md, 10 s)
MAX_SWEEP_GFLOP = 600
BATCH_TOKENS = PATCH_BATCH_TOKENS  # patched runs per batch × tokens: a sweep's batch (bench/patching.py)
CSV_COLUMNS = ["sweep", "direction", "row", "layer", "head", "position", "token_a", "token_b", "metric_patched", "share"]


@dataclass(frozen=True)
class Metric:
    """What is measured at the last position: kind "logit_diff" (logit[answer] − logit[other]) or
    "prob" (softmax probability of `answer` over the model's used rows)."""

    kind: str
    answer: int
    other: int | None
    answer_piece: str
    other_piece: str | None

    @property
    def label(self) -> str:
        if self.kind == "prob":
            return f"P({self.answer_piece})"
        return f"logit({self.answer_piece}) − logit({self.other_piece})"

    @property
    def difference_name(self) -> str:
        """How a summary names the difference: "she/he", or "P(she)"."""
        if self.kind == "prob":
            return self.label
        return f"{self.answer_piece.strip('␣ ')}/{self.other_piece.strip('␣ ')}"

    def of(self, last_logits: torch.Tensor, entry: ModelEntry) -> np.ndarray:
        """The metric of each row of `last_logits` (N, V): float64 (N,)."""
        z = used_rows(last_logits.double(), entry)
        if self.kind == "prob":
            return torch.softmax(z, dim=-1)[:, self.answer].numpy()
        return (z[:, self.answer] - z[:, self.other]).numpy()


def answer_token(entry: ModelEntry, value, which: str) -> int:
    """One token of the model from text (" she") or its display piece ("␣she"); refuses anything else."""
    if not isinstance(value, str) or not value:
        raise UserError(f"Type the {which} answer token (for example “ she”).")
    tok = entry.tokenizer
    # the answer continues the prompt: its own tokens, without the BOS a Llama-style tokenizer puts first
    enc = tok.encode_verbose(value, add_special_tokens=False) if isinstance(tok, HFFileTokenizer) else \
        tok.encode_verbose(value)
    if not enc.unknown and len(enc.ids) == 1:
        return enc.ids[0]
    pieces = {p: i for i, p in enumerate(entry.pieces)}
    if value in pieces and pieces[value] < (entry.cfg.vocab_used or entry.cfg.vocab_size):
        return pieces[value]
    raise UserError(f"The {which} answer {quoted(value, 30)} is {len(enc.ids)} tokens for this model; the metric "
                    "needs a single token (a whole word for a word-level model, one character for a "
                    "character-level one).")


def make_metric(entry: ModelEntry, kind, answer, other=None) -> Metric:
    kind = check_choice("metric", kind, METRICS)
    a = answer_token(entry, answer, "first")
    b = None
    if kind == "logit_diff":
        b = answer_token(entry, other, "second")
        if a == b:
            raise UserError("The two answer tokens are the same token: a logit difference needs two different ones.")
    piece = entry.pieces
    return Metric(kind, a, b, piece[a], None if b is None else piece[b])


@dataclass
class PatchSetup:
    """Two prompts of the same length on one model, the metric, and its value on each (m_A, m_B)."""

    entry: ModelEntry
    ids_a: list[int]
    ids_b: list[int]
    metric: Metric
    clean: float  # m_A
    corrupted: float  # m_B
    notes: list[str] = field(default_factory=list)

    @property
    def tokens_a(self) -> list[str]:
        return [self.entry.pieces[i] for i in self.ids_a]

    @property
    def tokens_b(self) -> list[str]:
        return [self.entry.pieces[i] for i in self.ids_b]

    @property
    def difference(self) -> float:
        return self.clean - self.corrupted

    def aligned_tokens(self) -> list[str]:
        """One label per position: the token, or "a→b" where the prompts differ."""
        return [a if a == b else f"{a}→{b}" for a, b in zip(self.tokens_a, self.tokens_b)]


def _last_logits(entry: ModelEntry, ids: list[int]) -> torch.Tensor:
    """The last position's logits (1, V) of the entry's backend's forward over `ids` (all the metric needs)."""
    return entry.backend.forward(ForwardRequest(tuple(ids), logits="last")).logits[-1:]


def prepare_sweep(entry: ModelEntry, prompt_a, prompt_b, metric="logit_diff", answer=None, other=None) -> PatchSetup:
    """Check two prompts and a metric, run A and B once each (the last position alone) and
    measure the metric on both; refuses prompts of different lengths or a difference of about 0."""
    ids_a, notes_a = encode_prompt(prompt_a, entry)
    ids_b, notes_b = encode_prompt(prompt_b, entry)
    if len(ids_a) != len(ids_b):
        made = pairs_for(entry)  # a pair made for this model's tokenizer, never another model's
        such = f", such as “{made[0].a}” ⇄ “{made[0].b}”" if made else ""
        raise UserError(
            f"Patching swaps activations position by position, so both prompts need the same number of tokens: "
            f"A has {len(ids_a)}, B has {len(ids_b)}. Use a minimal pair, two prompts that differ only in words "
            f"of as many tokens (Compare A / B lists pairs made for this model{such}; its “Which words keep the "
            "token count” finds more).")
    m = make_metric(entry, metric, answer, other)
    clean, corrupted = (float(m.of(_last_logits(entry, ids), entry)[0]) for ids in (ids_a, ids_b))
    if abs(clean - corrupted) < MIN_DIFFERENCE[m.kind]:
        made = pairs_for(entry)
        such = f" such as “{made[0].a}” ⇄ “{made[0].b}”" if made else ""
        raise UserError(
            f"{m.label} is {clean:.4g} on A and {corrupted:.4g} on B: there is no difference for a patch to "
            f"restore. Choose prompts whose answer changes (a minimal pair{such}) or answer tokens whose scores "
            "the change moves.")
    notes = [f"Prompt A: {n}" for n in notes_a] + [f"Prompt B: {n}" for n in notes_b]
    return PatchSetup(entry=entry, ids_a=ids_a, ids_b=ids_b, metric=m, clean=clean, corrupted=corrupted, notes=notes)


def grid(entry: ModelEntry, what: str, n_positions: int) -> tuple[list[str], list[str], list[PatchSite]]:
    """Row labels, column labels and one site per cell (row-major) of a sweep."""
    cfg = entry.cfg
    L, H, T = cfg.n_layers, cfg.n_heads, n_positions
    if what == "heads":
        sites = [PatchSite("head", l, head=h) for l in range(L) for h in range(H)]
        return [f"L{l}" for l in range(L)], [f"H{h}" for h in range(H)], sites
    if what == "mlp" and cfg.ff_dim == 0:
        raise UserError("This model has no MLP (feed-forward) layers: patch the heads, the residual stream "
                        "or the attention output instead.")
    if what == "resid":
        rows = ["embedding"] + [f"after L{l}" for l in range(L)]
        sites = [PatchSite("resid", r, positions=(p,)) for r in range(L + 1) for p in range(T)]
    else:
        rows = [f"L{l}" for l in range(L)]
        sites = [PatchSite(what, l, positions=(p,)) for l in range(L) for p in range(T)]
    return rows, [str(p) for p in range(T)], sites


@dataclass
class PatchResult:
    """One sweep: `metric` (R, C) the metric of each patched run, `values` (R, C) its share (see the
    module docstring), NaN where a stopped sweep did not get to; rows/columns name the cells."""

    setup: PatchSetup
    what: str
    direction: str
    rows: list[str]
    columns: list[str]
    metric: np.ndarray
    values: np.ndarray
    done: int
    stopped: bool = False

    @property
    def value_name(self) -> str:
        return VALUE_NAMES[self.direction]

    def best(self, k: int = 3) -> list[tuple[int, int, float]]:
        """The `k` cells of largest share: (row, column, share), largest first."""
        flat = np.where(np.isfinite(self.values), self.values, -np.inf).ravel()
        order = np.argsort(-flat, kind="stable")[:k]
        R, C = self.values.shape
        return [(int(i) // C, int(i) % C, float(flat[i])) for i in order if np.isfinite(flat[i])]

    def spread(self) -> tuple[float, float] | None:
        """(lowest, highest) metric of the patched runs computed (None before any)."""
        done = self.metric[np.isfinite(self.metric)]
        return (float(done.min()), float(done.max())) if done.size else None

    def small_difference(self) -> bool:
        """Whether the A/B difference is small next to what the sweep's patches do to the metric (NOISE_RATIO)."""
        span = self.spread()
        return span is not None and span[1] - span[0] > NOISE_RATIO * abs(self.setup.difference)

    def wrong_sign(self) -> bool:
        """Whether the metric is lower on A than on B: the answer tokens say it is A's answer that is higher."""
        return self.setup.difference < 0

    def cautions(self) -> list[str]:
        """What a reader of the map must know first: a difference of the wrong sign, one too small to read."""
        s, out = self.setup, []
        m = s.metric
        if self.wrong_sign():
            what = (f"A gives {m.answer_piece} a lower probability than B does" if m.kind == "prob" else
                    f"A favours {m.answer_piece} over {m.other_piece} less than B does")
            out.append(f"Wrong sign: the answer tokens put A's answer first, but {m.label} is lower on A "
                       f"({s.clean:.3f}) than on B ({s.corrupted:.3f}): {what}. A share here measures a move "
                       "away from A's answer.")
        if self.small_difference():
            low, high = self.spread()
            out.append(f"The A/B difference ({s.difference:+.3f}) is small next to what single patches do: the "
                       f"patched runs' {m.label} spreads from {low:.3f} to {high:.3f}, "
                       f"{(high - low) / abs(s.difference):.1f} times the difference (this lab warns above "
                       f"{NOISE_RATIO:g}). Shares from {100 * np.nanmin(self.values):.0f} % to "
                       f"{100 * np.nanmax(self.values):.0f} % come from dividing by a small number: read this map "
                       "as noise, and choose a pair whose answer changes more.")
        return out

    def cell_name(self, r: int, c: int) -> str:
        if self.what == "heads":
            return f"{self.rows[r]}{self.columns[c]}"
        token = self.setup.aligned_tokens()[c]
        part = {"resid": "the residual stream", "attn": "the attention output", "mlp": "the MLP output"}[self.what]
        where = "after the embedding" if r == 0 and self.what == "resid" else (
            self.rows[r] if self.what == "resid" else f"of {self.rows[r]}")
        return f"{part} {where} at “{token}” ({c})"

    def summary(self) -> str:
        """One line on the best cell: "L1H0 restores 84 % of the she/he difference"."""
        top = self.best(1)
        if not top:
            return "No cell was computed."
        r, c, v = top[0]
        verb = "restores" if self.direction == "denoising" else "makes"
        line = f"{self.cell_name(r, c)} {verb} {100 * v:.0f} % of the {self.setup.metric.difference_name} difference"
        flags = [f"of the wrong sign ({self.setup.difference:+.3f})"] if self.wrong_sign() else []
        flags += ["too small to read (see the warning)"] if self.small_difference() else []
        return line + (", a difference " + " and ".join(flags) if flags else "")  # the headline says it too

    def to_json(self) -> dict:
        s = self.setup

        def num(x):
            return float(x) if np.isfinite(x) else None
        return {"what": "patching", "model": s.entry.name, "sweep": self.what, "sweep_is": SWEEPS[self.what],
                "direction": self.direction, "direction_is": DIRECTIONS[self.direction],
                "metric": s.metric.kind, "metric_is": s.metric.label, "answer": s.metric.answer_piece,
                "other": s.metric.other_piece, "metric_a": s.clean, "metric_b": s.corrupted,
                "tokens_a": s.tokens_a, "tokens_b": s.tokens_b, "rows": self.rows, "columns": self.columns,
                "value_is": self.value_name, "values": [[num(v) for v in row] for row in self.values],
                "metric_patched": [[num(v) for v in row] for row in self.metric],
                "done": self.done, "cells": int(self.values.size), "stopped": self.stopped,
                "summary": self.summary(), "cautions": self.cautions(), "notes": s.notes}


@dataclass
class PatchProgress:
    """Where a sweep is: `done` of `total` cells; `result` is set on the last one (also when stopped)."""

    done: int
    total: int
    result: PatchResult | None = None


def sweep_steps(setup: PatchSetup, what, direction, stop: threading.Event | None = None,
                batch_tokens: int | None = None) -> Iterator[PatchProgress]:
    """Run a sweep a batch at a time, yielding progress after each batch and the result at the end
    (a set `stop` ends it after the batch running: the cells not computed are NaN)."""
    what = check_choice("what to patch", what, SWEEPS)
    direction = check_choice("direction", direction, DIRECTIONS)
    entry = setup.entry
    T = len(setup.ids_a)
    rows, cols, sites = grid(entry, what, T)
    # the patched run's input and the run its activations come from; the backend runs the sweep a chunk at a
    # time (the own engine: a batch of one layer's sites, run from that layer on), so Stop ends it between two
    base, source = (setup.ids_b, setup.ids_a) if direction == "denoising" else (setup.ids_a, setup.ids_b)
    out = np.full(len(sites), np.nan)
    done, stopped = 0, False
    chunks = entry.backend.patch_steps(base, source, sites, batch_tokens=batch_tokens or BATCH_TOKENS)
    while True:
        if stop is not None and stop.is_set():
            stopped = True
            break
        logits = next(chunks, None)
        if logits is None:
            break
        out[done:done + len(logits)] = setup.metric.of(logits, entry)
        done += len(logits)
        if done < len(sites):
            yield PatchProgress(done, len(sites))
    metric = out.reshape(len(rows), len(cols))
    if direction == "denoising":
        values = (metric - setup.corrupted) / setup.difference
    else:
        values = (setup.clean - metric) / setup.difference
    yield PatchProgress(done, len(sites), PatchResult(setup=setup, what=what, direction=direction, rows=rows,
                                                      columns=cols, metric=metric, values=values, done=done,
                                                      stopped=stopped))


def sweep(setup: PatchSetup, what, direction, progress: Callable[[int, int], None] | None = None,
          stop: threading.Event | None = None, batch_tokens: int | None = None) -> PatchResult:
    """`sweep_steps` to the end, calling progress(done, total) after each batch."""
    for p in sweep_steps(setup, what, direction, stop, batch_tokens):
        if p.result is not None:
            return p.result
        if progress is not None:
            progress(p.done, p.total)
    raise AssertionError("a sweep always ends with its result")


# ------------------------------------------------------------------------ what a sweep costs


def sweep_flops(entry: ModelEntry, what: str, T: int) -> float:
    """Floating-point operations of a sweep as `sweep_steps` batches it: each batch runs its rows through
    the blocks from its layer on (2 per multiply-add of the projections, feed-forward and attention)
    and reads out the last position."""
    cfg = entry.cfg
    C, hs, F = cfg.d_model, cfg.head_dim, cfg.ff_dim
    proj = C * (cfg.n_heads + 2 * cfg.kv_heads) * hs + cfg.attn_dim * C + C * F * (3 if cfg.gated else 2)
    per_token_block = 2 * proj + 4 * T * cfg.n_heads * hs
    _, _, sites = grid(entry, what, T)
    flops = 0.0
    for start, stop in sweep_chunks(tuple(sites), max(1, BATCH_TOKENS // T)):
        rows, first = stop - start, sites[start].layer
        flops += rows * (T * (cfg.n_layers - first) * per_token_block + 2 * C * cfg.vocab_size)
    return flops


def sweep_bytes(entry: ModelEntry, T: int) -> int:
    """Memory a sweep holds while it runs (float32): the two recorded runs, and one batch's
    activations (residual, q/k/v, feed-forward, the last position's logits)."""
    cfg = entry.cfg
    per_batch = max(1, BATCH_TOKENS // T)
    recorded = 2 * (cfg.n_layers * 3 + 1) * T * cfg.d_model
    batch = per_batch * T * (8 * cfg.d_model + 2 * max(cfg.ff_dim, 1)) + per_batch * cfg.vocab_size
    return 4 * (recorded + batch)


def export(result: PatchResult) -> Export:
    """The sweep's numbers to download: one CSV line per cell, the JSON of `PatchResult.to_json`."""
    s = result.setup
    rows = []
    for r in range(len(result.rows)):
        for c in range(len(result.columns)):
            head = c if result.what == "heads" else None
            pos = None if result.what == "heads" else c
            layer = r - 1 if result.what == "resid" else r  # resid: -1 is the embedding
            metric, value = result.metric[r, c], result.values[r, c]
            rows.append([result.what, result.direction, result.rows[r], layer, head, pos,
                         None if pos is None else s.tokens_a[pos], None if pos is None else s.tokens_b[pos],
                         float(metric) if np.isfinite(metric) else None,
                         float(value) if np.isfinite(value) else None])
    name = "_".join([model_stem(s.entry.name), "patching", result.what, result.direction, f"{len(s.ids_a)}tokens"])
    return Export(name, to_csv(CSV_COLUMNS, rows), result.to_json())
