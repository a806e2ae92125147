"""The Circuits view's methods on a text and on a model, as records for the wiring: direct logit attribution
on the text, and the head composition scores of a model (computed once per model and kept in `COMPOSITION`).
The methods are model/circuits.py's; this module checks what a person asks, says what each number is, and
turns the engine's results into plain records with their JSON and their downloads (CSV / JSON). One head's
OV and QK circuits are lab.circuits_heads'; attribution patching beside exact patching lab.circuits_atp's;
the person's part that holds the last records and runs one long job at a time lab.circuits'.

Positions are window positions (0 = the first token shown), as everywhere on the page. The text's forward for
direct logit attribution is the model's own: the head tools' changes (ablation, an edited row) are not in it.
It is run once per text and window and kept (`RECORDED`, bounded), so another token or answer costs the
attribution alone (~3 ms on GPT-2 small's shape), not a forward.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass, field, fields
from typing import Callable

import numpy as np
import torch

from model.circuits import (KINDS, CompositionScores, DirectLogitAttribution, composition_scores, copying_scores,
                            direct_logit_attribution)

from .catalogue.models import ModelEntry
from .checks import UserError
from .downloads import Export, to_csv
from .headsettings import head_label, need_text, position
from .patching import answer_token
from .server.files import file_name, model_stem
from .text import Text, used_rows

KIND_NAMES = {"q": "Q-composition: the earlier head writes what the later head's queries read",
              "k": "K-composition: the earlier head writes what the later head's keys read",
              "v": "V-composition: the earlier head writes what the later head's values read"}
DIRECT_ONLY = ("Direct effect only: each part's share of the logit along its own path straight to the read-out, "
               "through the final norm frozen at this forward's scale; what a head changes in later layers is "
               "not counted (patching counts it).")
POST_NORM = ("Direct logit attribution is not defined for this post-norm model: it normalises the whole residual "
             "stream after every branch, so no head or MLP reaches the logits along a linear path.")
TOP_PARTS = 8  # the parts a DLA record lists as its largest
TOP_PAIRS = 10  # the strongest pairs a composition record lists per kind
DLA_KEEP_BYTES = 16 * 2**20  # a text's recorded forward larger than this is not kept (GPT-2 small at 64 tokens: 10 MB)
DLA_KEEP_TOTAL_BYTES = 64 * 2**20  # all texts' kept forwards together
COMPOSITION_CACHE_BYTES = 64 * 2**20  # all models' kept composition scores together (GPT-2 small's: 0.6 MB)


@dataclass
class CircuitsProgress:
    """Where a long job (composition, attribution patching) is: `done` of `total` steps of `phase`; `result`
    is set on the last one, also when stopped."""

    phase: str
    done: int
    total: int
    result: object | None = None


def json_number(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def json_grid(a: np.ndarray) -> list:
    """An array as nested lists, None where a value is not finite."""
    a = np.asarray(a, dtype=np.float64)
    return [json_grid(row) for row in a] if a.ndim > 1 else [json_number(v) for v in a]


def engine_refusal(exc: ValueError) -> UserError:
    """An engine's refusal (a model a method cannot read) as one sentence for the person."""
    text = str(exc).strip().rstrip(".")
    return UserError(text[:1].upper() + text[1:] + ".")


def _versions(model) -> tuple[int, ...]:
    """The weights' in-place version counters: a model trained further (a run in progress) has new ones."""
    return tuple(p._version for p in model.parameters())


# ------------------------------------------------------------------------------ direct logit attribution


@dataclass(frozen=True, kw_only=True)
class DLARecord(DirectLogitAttribution):
    """Direct logit attribution at one window position: the engine's terms (model.circuits_dla's
    DirectLogitAttribution: heads (L, H), mlps (L,), embedding, biases, cap; direct_sum + remainder equals actual,
    the logit (difference) the model reads out there; answer / other: token ids, other None: one logit) and what
    the person's view names them by: the model, the window's tokens, the pieces of the answers."""

    model: str
    tokens: list[str]
    text_offset: int
    answer_piece: str
    other_piece: str | None
    default_answer: bool = False  # the answer was the model's own top prediction there

    @property
    def label(self) -> str:
        if self.other is None:
            return f"logit({self.answer_piece})"
        return f"logit({self.answer_piece}) − logit({self.other_piece})"

    @property
    def gap(self) -> float:
        """actual − (direct_sum + remainder): zero up to the forward's float rounding."""
        return self.actual - (self.direct_sum + self.remainder)

    def parts(self) -> list[tuple[str, float]]:
        """Every part with its direct term: heads ("L1H0"), MLPs ("MLP L1") and the embedding's."""
        L, H = self.heads.shape
        out = [(head_label(layer, h), float(self.heads[layer, h])) for layer in range(L) for h in range(H)]
        out += [(f"MLP L{layer}", float(self.mlps[layer])) for layer in self.mlp_layers]
        return out + [(f"embedding ({k})" if k != "embedding" else "embedding", float(v))
                      for k, v in self.embedding.items()]

    def top(self, n: int = TOP_PARTS) -> list[tuple[str, float]]:
        """The n parts of largest |direct term|, largest first."""
        return sorted(self.parts(), key=lambda p: -abs(p[1]))[:n]

    def summary(self) -> str:
        name, value = self.top(1)[0]
        at = f"“{self.tokens[self.position]}” ({self.position})"
        return (f"{name} adds {value:+.3f} to {self.label} at {at} directly; "
                f"all parts {self.direct_sum:+.3f}, remainder {self.remainder:+.3f}, actual {self.actual:+.3f}")

    def to_json(self) -> dict:
        return {"what": "direct logit attribution", "model": self.model, "tokens": self.tokens,
                "text_offset": self.text_offset, "position": self.position, "token": self.tokens[self.position],
                "answer": self.answer_piece, "answer_id": self.answer, "other": self.other_piece,
                "other_id": self.other,
                "answer_is_prediction": self.default_answer, "metric_is": self.label,
                "heads": json_grid(self.heads), "mlps": json_grid(self.mlps), "mlp_layers": list(self.mlp_layers),
                "embedding": {k: json_number(v) for k, v in self.embedding.items()},
                "biases": {k: json_number(v) for k, v in self.biases.items()}, "softcap_share": json_number(self.cap),
                "direct_sum": json_number(self.direct_sum), "remainder": json_number(self.remainder),
                "actual": json_number(self.actual), "before_softcap": json_number(self.uncapped),
                "final_norm_scale": json_number(self.scale), "gap": json_number(self.gap),
                "top": [[n, json_number(v)] for n, v in self.top()], "summary": self.summary(),
                "direct_only": DIRECT_ONLY}


def dla_bytes(entry: ModelEntry, T: int) -> int:
    """Memory of the recorded forward direct logit attribution reads (float32): every head's output, each
    branch and the residual stream at every position, and one position's logits."""
    cfg = entry.cfg
    per_token = cfg.n_layers * (cfg.n_heads * cfg.head_dim + 3 * cfg.d_model) + cfg.d_model
    return 4 * (T * per_token + cfg.vocab_size)


@dataclass
class _Recorded:
    key: tuple
    out: object
    size: int
    used: int


class RecordedForwards:
    """The recorded forward of each text's window that direct logit attribution reads (the model's own, every
    activation kept), held as long as the text itself (weakly keyed) and only while its window and the
    model's weights stay: another token or answer of the same text then costs no forward. A forward larger
    than `max_one` is not kept; past `max_bytes` in all the least recently used goes (as lab.inside's memo)."""

    def __init__(self, max_bytes: int = DLA_KEEP_TOTAL_BYTES, max_one: int = DLA_KEEP_BYTES) -> None:
        self.max_bytes, self.max_one = max_bytes, max_one
        self._kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Text → _Recorded
        self._lock = threading.Lock()
        self._clock = 0

    def get(self, text: Text):
        """The ForwardOutput of `model(window, record=True, logits="last")` for the text as it stands."""
        model, window = text.entry.model, list(text.decoder.window)
        key = (id(text.entry), id(text.decoder), tuple(window), _versions(model))
        with self._lock:
            kept = self._kept.get(text)
            if kept is not None and kept.key == key:
                self._clock += 1
                kept.used = self._clock
                return kept.out
        with torch.inference_mode():
            out = model(torch.tensor([window], device=model.head.weight.device), record=True, logits="last")
        acts = out.activations
        size = sum(t.numel() * t.element_size() for group in (acts.heads, acts.attn, acts.mlp, acts.residuals)
                   for t in group if t is not None)
        with self._lock:
            self._kept.pop(text, None)
            if size <= self.max_one:
                self._clock += 1
                self._kept[text] = _Recorded(key, out, size, self._clock)
                total = sum(k.size for k in list(self._kept.values()))
                for t, k in sorted(list(self._kept.items()), key=lambda e: e[1].used):
                    if total <= self.max_bytes:
                        break
                    total -= self._kept.pop(t).size
        return out

    def nbytes(self) -> int:
        with self._lock:
            return sum(k.size for k in list(self._kept.values()))


RECORDED = RecordedForwards()


def dla(text: Text, index=None, answer=None, other=None) -> DLARecord:
    """Direct logit attribution at window position `index` (default: the selected token, else the last) of
    logit(answer) − logit(other): the answer given as text (" tom") or its piece, None for the model's own top
    prediction there; other None for the answer's logit alone. Checks everything before the forward."""
    need_text(text)
    entry = text.entry
    if entry.cfg.norm == "post":
        raise UserError(POST_NORM)
    t = position(text, index)
    a = None if answer is None or answer == "" else answer_token(entry, answer, "first")
    b = None if other is None or other == "" else answer_token(entry, other, "second")
    if b is not None and a is None:
        raise UserError("Give the first answer token too: the difference is logit(first) − logit(second).")
    if a is not None and a == b:
        raise UserError("The two answer tokens are the same token: a logit difference needs two different ones.")
    window = list(text.decoder.window)
    model = entry.model
    out = RECORDED.get(text)
    with torch.inference_mode():
        if a is None:  # the model's own prediction at t: the read-out of the stream there
            z = used_rows(model.read_out(out.activations.residuals[-1][:, t:t + 1])[0, 0].double().cpu(), entry)
            a = int(z.argmax())
    try:
        d = direct_logit_attribution(model, out, t, a, b)
    except ValueError as exc:
        raise engine_refusal(exc) from None
    pieces = entry.pieces
    return DLARecord(**{f.name: getattr(d, f.name) for f in fields(d)}, model=entry.name,
                     tokens=[pieces[i] for i in window], text_offset=int(text.decoder.start), answer_piece=pieces[a],
                     other_piece=None if b is None else pieces[b], default_answer=answer is None or answer == "")


DLA_COLUMNS = ["part", "layer", "head", "value"]


def dla_export(r: DLARecord) -> Export:
    """One CSV line per part (heads, MLPs, the embedding's terms, the remainder's pieces) and the totals."""
    L, H = r.heads.shape
    rows = [["head", layer, h, float(r.heads[layer, h])] for layer in range(L) for h in range(H)]
    rows += [["mlp", layer, None, float(r.mlps[layer])] for layer in r.mlp_layers]
    rows += [[f"embedding {k}" if k != "embedding" else k, None, None, v] for k, v in r.embedding.items()]
    rows += [[f"remainder: {k}", None, None, v] for k, v in r.biases.items()]
    rows += [["remainder: soft-cap", None, None, r.cap], ["direct sum", None, None, r.direct_sum],
             ["remainder", None, None, r.remainder], ["actual", None, None, r.actual]]
    name = file_name(model_stem(r.model), "dla", f"pos{r.position}", r.answer_piece, r.other_piece)
    return Export(name, to_csv(DLA_COLUMNS, rows), r.to_json())


# ------------------------------------------------------------------------------ head composition


@dataclass
class _Kept:
    versions: tuple[int, ...]
    scores: CompositionScores
    copying: np.ndarray
    used: int


class CompositionCache:
    """The composition and copying scores of every model computed so far, shared by all sessions: keyed weakly
    by the model object (they go when the model does: a person's own model removed, a cooled import) and by
    fold, kept while the weights stay unchanged (a model still training is computed again), at most
    `max_bytes` in all (the least recently used go first). One computation per model at a time (`claim`)."""

    def __init__(self, max_bytes: int = COMPOSITION_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → {fold: _Kept}
        self._busy: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → {fold} being computed
        self._lock = threading.Lock()
        self._clock = 0

    @staticmethod
    def nbytes_of(kept: _Kept) -> int:
        s = kept.scores
        return s.q.nbytes + s.k.nbytes + s.v.nbytes + kept.copying.nbytes

    def get(self, model, fold: bool) -> tuple[CompositionScores, np.ndarray] | None:
        with self._lock:
            kept = self._kept.get(model, {}).get(fold)
            if kept is None or kept.versions != _versions(model):
                return None
            self._clock += 1
            kept.used = self._clock
            return kept.scores, kept.copying

    def put(self, model, fold: bool, scores: CompositionScores, copying: np.ndarray) -> None:
        """Keep a complete result (a stopped one is never kept)."""
        if scores.stopped or scores.done < scores.total:
            return
        for a in (scores.q, scores.k, scores.v, copying):  # every session's record reads these very arrays
            a.setflags(write=False)
        with self._lock:
            self._clock += 1
            self._kept.setdefault(model, {})[fold] = _Kept(_versions(model), scores, copying, self._clock)
            entries = sorted(((k.used, m, f) for m, by in list(self._kept.items()) for f, k in by.items()),
                             key=lambda e: e[0])
            total = sum(self.nbytes_of(self._kept[m][f]) for _, m, f in entries)
            for _, m, f in entries:
                if total <= self.max_bytes:
                    break
                total -= self.nbytes_of(self._kept[m].pop(f))

    def forget(self, model) -> None:
        """Drop a model's kept scores (both folds)."""
        with self._lock:
            self._kept.pop(model, None)

    def nbytes(self) -> int:
        with self._lock:
            return sum(self.nbytes_of(k) for by in list(self._kept.values()) for k in by.values())

    def claim(self, model, fold: bool) -> Callable[[], None]:
        """Mark this model's scores as being computed (refused while another session computes them); returns
        the release."""
        with self._lock:
            busy = self._busy.setdefault(model, set())
            if fold in busy:
                raise UserError("The composition scores of this model are being computed for another session "
                                "right now; try again in a few seconds.")
            busy.add(fold)

        def release() -> None:
            with self._lock:
                self._busy.get(model, set()).discard(fold)
        return release


COMPOSITION = CompositionCache()


def composition_flops(entry: ModelEntry) -> float:
    """Floating-point operations of the composition scores (model.circuits.composition_scores: one
    (H·k × C) @ (C × 3·H·k) product per pair of layers, k = min(hs, C), and each layer's QR factors) and of
    every head's copying score (W_Uᵀ W_E over the used vocabulary once, then W_O G W_V per head)."""
    cfg = entry.cfg
    L, H, C, hs = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.head_dim
    k = min(hs, C)
    pairs = L * (L - 1) / 2 * 2 * (H * k) * C * (3 * H * k)
    layers = L * H * (4 * 2 * C * hs * hs + 2 * k * hs * C + 3 * 2 * C * k * k)
    vocab = cfg.vocab_used or cfg.vocab_size
    copying = 2 * C * C * vocab + L * H * (2 * hs * C * C + 2 * hs * hs * C)
    return pairs + layers + copying


def composition_bytes(entry: ModelEntry) -> int:
    """Memory while the scores are computed (float64): every layer's small factors (kept until the last
    layer is done), one layer's weights, the three (L, H, L, H) results, W_Uᵀ W_E and a vocabulary chunk."""
    cfg = entry.cfg
    L, H, C, hs = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.head_dim
    k = min(hs, C)
    return 8 * (L * H * 4 * k * C + 4 * H * hs * C + 3 * (L * H) ** 2 + C * C + 2 * 4096 * C)


@dataclass
class HeadPair:
    """One pair of heads of a composition kind: the earlier head writes what the later one reads."""

    kind: str
    earlier: tuple[int, int]
    later: tuple[int, int]
    score: float

    @property
    def name(self) -> str:
        return f"{head_label(*self.earlier)} → {head_label(*self.later)}"


@dataclass
class CompositionRecord:
    """Q-, K- and V-composition scores of one model (model.circuits.CompositionScores: (L, H, L, H) each,
    [earlier layer, head, later layer, head], NaN where the later layer is not after the earlier one or a
    stop came first) and every head's OV copying score (L, H). cached: read from `COMPOSITION`."""

    model: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    copying: np.ndarray
    folded: bool
    done: int
    total: int
    stopped: bool = False
    cached: bool = False
    top: dict[str, list[HeadPair]] = field(default_factory=dict)

    def of(self, kind: str) -> np.ndarray:
        return {"q": self.q, "k": self.k, "v": self.v}[kind]

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1]

    def summary(self) -> str:
        if self.stopped:
            return f"Stopped after {self.done} of {self.total} layers: the scores not computed are left blank."
        best = [self.top[k][0] for k in KINDS if self.top.get(k)]
        if not best:
            return "This model has one layer: no head has an earlier head to compose with."
        return "Strongest pairs: " + "; ".join(f"{p.kind.upper()} {p.name} {p.score:.2f}" for p in best)

    def to_json(self) -> dict:
        return {"what": "head composition", "model": self.model, "folded": self.folded,
                "kinds": KIND_NAMES, "q": json_grid(self.q), "k": json_grid(self.k), "v": json_grid(self.v),
                "index_order": ["earlier layer", "earlier head", "later layer", "later head"],
                "copying": json_grid(self.copying), "done": self.done, "total": self.total, "stopped": self.stopped,
                "top": {k: [{"earlier": head_label(*p.earlier), "later": head_label(*p.later), "score": p.score}
                            for p in pairs] for k, pairs in self.top.items()},
                "summary": self.summary()}


def composition_record(entry: ModelEntry, scores: CompositionScores, copying: np.ndarray,
                       cached: bool) -> CompositionRecord:
    top = {k: [HeadPair(k, (a, b), (c, d), s) for a, b, c, d, s in scores.top(k, TOP_PAIRS)] for k in KINDS}
    return CompositionRecord(entry.name, scores.q, scores.k, scores.v, copying, scores.folded, scores.done,
                             scores.total, scores.stopped, cached, top)


def compute_composition(entry: ModelEntry, fold: bool, progress: Callable[[str, int, int], None],
                        stop: threading.Event) -> CompositionRecord:
    """The scores of the engine (composition, then copying: progress(phase, done, total) after each layer),
    kept in `COMPOSITION` when complete. Runs unchecked: the part checks the budget and claims the model."""
    model, L = entry.model, entry.cfg.n_layers
    try:
        scores = composition_scores(model, fold, lambda d, t: progress("composition", d, 2 * t), stop)
        copying = np.full((L, model.cfg.n_heads), np.nan)
        if not scores.stopped:
            copying = copying_scores(model, fold, lambda d, t: progress("copying", L + d, 2 * t), stop)
            if stop.is_set() and np.isnan(copying).any():  # stopped in the copying phase
                scores = CompositionScores(scores.q, scores.k, scores.v, scores.folded, scores.done, scores.total,
                                           stopped=True)
    except ValueError as exc:
        raise engine_refusal(exc) from None
    COMPOSITION.put(model, fold, scores, copying)
    return composition_record(entry, scores, copying, cached=False)


COMPOSITION_COLUMNS = ["kind", "earlier_layer", "earlier_head", "later_layer", "later_head", "score"]


def composition_export(r: CompositionRecord) -> Export:
    """One CSV line per pair of heads in different layers and kind, then one per head's copying score."""
    L, H = r.shape
    rows = [[kind, l1, h1, l2, h2, float(r.of(kind)[l1, h1, l2, h2])] for kind in KINDS
            for l1 in range(L) for h1 in range(H) for l2 in range(l1 + 1, L) for h2 in range(H)]
    rows += [["copying", layer, h, None, None, float(r.copying[layer, h])] for layer in range(L) for h in range(H)]
    name = file_name(model_stem(r.model), "composition", "folded" if r.folded else "raw")
    return Export(name, to_csv(COMPOSITION_COLUMNS, rows), r.to_json())
