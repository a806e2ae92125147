"""Circuit methods of "A Mathematical Framework for Transformer Circuits" (Elhage et al., 2021) on the
engine's models: head composition scores, each head's OV and QK circuits, and direct logit attribution
(model/circuits_dla.py, re-exported here).

Conventions (model/circuits_weights.py): row vectors, W_QK^h = W_Q^h (W_K^h)ᵀ and W_OV^h = W_V^h W_O^h
(C × C), a query head's key and value weights those of its key/value head under grouped-query attention.
fold=True (the default) multiplies each norm's weight (and LayerNorm's centring) into the weights next to
it and leaves out the norms' per-token scales and all biases, as TransformerLens's folded weights do;
fold=False reads the raw weights, as the paper's definitions (written for models without norms) do.

* Composition (`composition_scores`): for a head i of layer l1 and a head j of a later layer l2,
  ||A B||_F / (||A||_F ||B||_F) with A = W_OV^i and B = W_QK^j (Q-composition: i writes what j's
  queries read), W_QK^jᵀ (K-composition: what j's keys read) or W_OV^j (V-composition). The paper
  defines them on models without norms; with fold=True the norms' weights are in (the default, as
  TransformerLens scores a folded model), fold=False ignores the norms as the paper does. The C × C
  products are never formed: for a C × hs factor X = Q_X R_X (QR; R_Xᵀ R_X = XᵀX, the hs × hs Gram
  matrix), ||X Z||_F = ||R_X Z||_F, so each numerator is the norm of an hs × hs block of one product of
  small factors, e.g. Q: ||R_V^i W_O^i W_Q^j R_K^jᵀ||_F; one (H·hs × C) @ (C × 3·H·hs) product per pair
  of layers (GPT-2 small: 66 of them, 180 GFLOP in float64, ~4 s of one core).
* OV circuit (`ov_circuit`): W_E W_OV^h W_U (vocabulary × vocabulary; W_E times embed_scale, W_U with the
  final norm folded when fold=True), its copying score Σ Re λ / Σ |λ| over its eigenvalues λ: the nonzero
  ones are those of the hs × hs matrix W_O W_U W_E W_V (AB and BA share them), so nothing vocabulary-sized
  is squared. Only the rows the tokenizer uses (vocab_used) take part; the unembedding is not centred over
  the vocabulary (TransformerLens's center_unembed), as the paper's is not. The top tokens each given
  input token makes the head write are the largest entries of its row.
* QK circuit (`qk_circuit`): the bilinear scores x_i W_QK^h x_jᵀ (times the layer's score scale, before
  any soft-cap and mask; W_QK with the layer's input norm and q/k norm weights folded, and qk_gain, when
  fold=True) between the prompt's tokens, x the token embedding (times embed_scale) alone, and with the
  prompt's positions: the learned or sinusoidal position added to x, or the queries and keys turned by
  the layer's rotary (the model's own tables) at their positions 0..T-1. Without norms and biases, layer
  0's positional circuit is exactly the scores the forward computes there.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .attention import apply_rope, causal_mask
from .circuits_dla import DirectLogitAttribution, direct_logit_attribution, stream_coefficients  # noqa: F401
from .circuits_weights import (F64, LayerFactors, embed_fold, fold_read, fold_write, layer_factors,
                               unembed_fold, used_vocab)

KINDS = ("q", "k", "v")
CHUNK = 4096  # vocabulary rows turned into float64 at a time (4096 × 768 × 8 bytes: 25 MB for GPT-2)


@dataclass(frozen=True)
class CompositionScores:
    """Q-, K- and V-composition scores (see the module docstring): q, k, v each (L, H, L, H), indexed
    [earlier layer, earlier head, later layer, later head]; NaN where the later layer is not after the
    earlier one, and where a stopped computation did not get to. folded: fold was on; stopped: a stop
    ended it early (`done` of `total` later layers were computed)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    folded: bool
    done: int
    total: int
    stopped: bool = False

    def of(self, kind: str) -> np.ndarray:
        if kind not in KINDS:
            raise ValueError(f"composition kind must be one of {', '.join(KINDS)}; got {kind!r:.20}")
        return getattr(self, kind)

    def top(self, kind: str, n: int = 10) -> list[tuple[int, int, int, int, float]]:
        """The n strongest pairs of one kind: (earlier layer, head, later layer, head, score), largest first."""
        s = self.of(kind)
        flat = np.where(np.isfinite(s), s, -np.inf).ravel()
        order = np.argsort(-flat, kind="stable")[: max(0, int(n))]
        return [(*map(int, np.unravel_index(i, s.shape)), float(flat[i])) for i in order if np.isfinite(flat[i])]


def _r(x: torch.Tensor) -> torch.Tensor:
    """R of x = Q R (x (.., C, hs), Q with orthonormal columns): ||x Z||_F == ||R Z||_F for every Z."""
    return torch.linalg.qr(x, mode="r")[1]


class _Side:
    """One layer's small factors: as the earlier head (p: R_V W_O, (H, k, C), and ||W_OV||) and as the later
    one (s: the C × k right factor of each kind, and the norm of its W_QK or W_OV)."""

    def __init__(self, f: LayerFactors):
        H = f.q.shape[0]
        kv = [f.kv(h) for h in range(H)]
        rq, rk, rv = _r(f.q), _r(f.k), _r(f.v)
        ro = _r(f.o.transpose(1, 2))  # W_O^T = Q R, so ||Z W_O|| = ||Z Rᵀ||
        self.p = rv[kv] @ f.o  # (H, k, C)
        self.ov_norm = torch.linalg.matrix_norm(self.p)  # ||W_V W_O|| = ||R_V W_O||
        qk_norm = torch.linalg.matrix_norm(rq @ rk[kv].transpose(1, 2))  # ||W_Q W_Kᵀ|| = ||R_Q R_Kᵀ||
        self.s = {"q": f.q @ rk[kv].transpose(1, 2),  # W_Q R_Kᵀ: ||A W_Q W_Kᵀ|| = ||A W_Q R_Kᵀ||
                  "k": f.k[kv] @ rq.transpose(1, 2),  # W_K R_Qᵀ (K-composition reads A W_K W_Qᵀ)
                  "v": f.v[kv] @ ro.transpose(1, 2)}  # W_V R_Oᵀ
        self.norm = {"q": qk_norm, "k": qk_norm, "v": self.ov_norm}


@torch.no_grad()
def composition_scores(model, fold: bool = True, progress: Callable[[int, int], None] | None = None,
                       stop: threading.Event | None = None) -> CompositionScores:
    """Every Q-, K- and V-composition score between heads of different layers (see the module docstring).

    One product of small factors per pair of layers, (H·hs × C) @ (C × 3·H·hs), in float64. progress(done,
    total) is called after each later layer; a set `stop` ends the work after the layer running (the
    scores not computed are NaN, stopped=True)."""
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    out = {kind: np.full((L, H, L, H), np.nan) for kind in KINDS}
    sides: list[_Side] = []
    done, stopped = 0, False
    for l2 in range(L):
        if stop is not None and stop.is_set():
            stopped = True
            break
        sides.append(_Side(layer_factors(model, l2, fold)))
        later = sides[l2]
        right = torch.cat([later.s[kind] for kind in KINDS], dim=-1)  # (H, C, 3k): heads, then kinds
        right = right.permute(1, 0, 2).reshape(cfg.d_model, -1)  # (C, H·3k)
        k = later.s["q"].shape[-1]
        for l1 in range(l2):
            early = sides[l1]
            n = early.p.reshape(-1, cfg.d_model) @ right  # (H·k', H·3k): every numerator's block
            sq = (n * n).reshape(H, -1, H, 3, k).sum(dim=(1, 4))  # (H early, H later, 3)
            for i, kind in enumerate(KINDS):
                denom = early.ov_norm[:, None] * later.norm[kind][None, :]
                out[kind][l1, :, l2, :] = (sq[..., i].sqrt() / denom).numpy()
        done = l2 + 1
        if progress is not None:
            progress(done, L)
    return CompositionScores(out["q"], out["k"], out["v"], fold, done, L, stopped)


def _head_ov(model, f: LayerFactors, head: int, fold: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(V', O'): the head's value weights (C, hs) with the embedding's scale (and norm) folded on the left,
    and its output weights (hs, C) with the final norm folded on the right, so that W_E V' O' W_Uᵀ is the
    OV circuit (W_E, W_U the raw embedding and unembedding rows). f: the head's layer_factors."""
    scale, emb = embed_fold(model, fold)
    v = fold_read(f.v[f.kv(head)], emb) * scale  # x = e·scale, then the embedding norm's map
    o = fold_write(f.o[head], unembed_fold(model, fold))
    return v, o


def _rows64(weight: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return weight.detach()[start:stop].to(F64)


@dataclass(frozen=True)
class OVCircuit:
    """One head's OV circuit W_E W_OV W_U (see the module docstring).

    copying: Σ Re λ / Σ |λ| (NaN for a head whose circuit is zero); eigenvalues: its nonzero spectrum (the
    hs × hs factor's, complex). inputs: the input tokens asked about; top_ids, top_values (n, k): the k
    tokens each input makes the head write most, largest first; own_value, own_rank (n,): each input's
    entry for itself and its rank in its own row (0: it is the top token)."""

    layer: int
    head: int
    copying: float
    eigenvalues: np.ndarray
    inputs: tuple[int, ...]
    top_ids: np.ndarray
    top_values: np.ndarray
    own_value: np.ndarray
    own_rank: np.ndarray
    folded: bool


def copying_score(eigenvalues: np.ndarray) -> float:
    """Σ Re λ / Σ |λ| (Elhage et al.): 1 for a circuit whose spectrum is all positive, NaN if all zero."""
    total = float(np.abs(eigenvalues).sum())
    return float(eigenvalues.real.sum()) / total if total > 0 else float("nan")


@torch.no_grad()
def ov_circuit(model, layer: int, head: int, inputs=(), top_k: int = 10, fold: bool = True) -> OVCircuit:
    """One head's OV circuit: copying score, spectrum, and the top tokens written for each of `inputs`.

    The hs × hs factor W_O' W_Uᵀ W_E V' is summed over the vocabulary in float64 chunks (two passes of
    hs × C × vocab: 5 G multiply-adds for GPT-2 small's shape)."""
    _check_head(model, layer, head)
    v, o = _head_ov(model, layer_factors(model, layer, fold), head, fold)
    n_used = used_vocab(model)
    inputs = tuple(_check_tokens(inputs, n_used))
    top_k = max(1, min(int(top_k), n_used))
    E, U = model.tok_emb.weight, model.head.weight
    m = torch.zeros(o.shape[0], v.shape[1], dtype=F64)
    for a in range(0, n_used, CHUNK):
        b = min(a + CHUNK, n_used)
        u = _rows64(U, a, b)
        e = u if E is U else _rows64(E, a, b)
        m += (o @ u.T) @ (e @ v)  # (hs, chunk) @ (chunk, hs)
    lam = np.linalg.eigvals(m.numpy())
    x = (_rows64(E, 0, 0) if not inputs else E.detach()[list(inputs)].to(F64)) @ v @ o  # (n, C)
    ids, vals, own = _top_rows(x, U, n_used, top_k, inputs)
    own_value = np.array([own[i, 0] for i in range(len(inputs))])
    own_rank = np.array([int(own[i, 1]) for i in range(len(inputs))], dtype=np.int64)
    return OVCircuit(layer, head, copying_score(lam), lam, inputs, ids, vals, own_value, own_rank, fold)


def _top_rows(x: torch.Tensor, U: torch.Tensor, n_used: int, k: int, inputs):
    """The k largest entries of each row of x W_Uᵀ (over the used vocabulary, W_U turned into float64 a
    chunk at a time), and each input's own entry with its rank in its row (entries strictly above it)."""
    n = x.shape[0]
    if n == 0:
        return np.zeros((0, k), dtype=np.int64), np.zeros((0, k)), np.zeros((0, 2))
    z = torch.cat([x @ _rows64(U, a, min(a + CHUNK, n_used)).T for a in range(0, n_used, CHUNK)], dim=-1)
    vals, ids = z.topk(k, dim=-1)
    own = z[torch.arange(n), torch.tensor(inputs)]
    above = (z > own[:, None]).sum(-1)
    return ids.numpy(), vals.numpy(), torch.stack([own, above.to(F64)], -1).numpy()


@torch.no_grad()
def copying_scores(model, fold: bool = True, progress: Callable[[int, int], None] | None = None,
                   stop: threading.Event | None = None) -> np.ndarray:
    """Every head's OV copying score (L, H), through G = W_Uᵀ W_E (C × C, summed over the used vocabulary
    in float64 chunks once), then W_O' G V' per head. NaN where a set `stop` ended it first; progress(done,
    total) after each layer."""
    cfg = model.cfg
    n_used = used_vocab(model)
    E, U = model.tok_emb.weight, model.head.weight
    g = torch.zeros(cfg.d_model, cfg.d_model, dtype=F64)
    for a in range(0, n_used, CHUNK):
        b = min(a + CHUNK, n_used)
        u = _rows64(U, a, b)
        g += u.T @ (u if E is U else _rows64(E, a, b))
        if stop is not None and stop.is_set():
            return np.full((cfg.n_layers, cfg.n_heads), np.nan)
    scores = np.full((cfg.n_layers, cfg.n_heads), np.nan)
    for layer in range(cfg.n_layers):
        if stop is not None and stop.is_set():
            break
        f = layer_factors(model, layer, fold)
        for head in range(cfg.n_heads):
            v, o = _head_ov(model, f, head, fold)
            scores[layer, head] = copying_score(np.linalg.eigvals((o @ g @ v).numpy()))
        if progress is not None:
            progress(layer + 1, cfg.n_layers)
    return scores


@dataclass(frozen=True)
class QKCircuit:
    """One head's QK circuit on a prompt's tokens (see the module docstring): plain and positional (T, T),
    rows the query token i, columns the key token j; allowed (T, T): the keys the layer's mask lets
    query i read (the scores themselves are given for every pair); positions: how the positional
    version places them ("learned", "sinusoidal", "rope", or "none": then it equals plain)."""

    layer: int
    head: int
    tokens: tuple[int, ...]
    plain: np.ndarray
    positional: np.ndarray
    allowed: np.ndarray
    positions: str
    folded: bool


@torch.no_grad()
def qk_circuit(model, layer: int, head: int, tokens, fold: bool = True) -> QKCircuit:
    """The head's bilinear query-key scores between the prompt's tokens, without and with their positions."""
    _check_head(model, layer, head)
    cfg = model.cfg
    tokens = tuple(_check_tokens(tokens, cfg.vocab_size))
    T = len(tokens)
    if not 0 < T <= cfg.block_size:
        raise ValueError(f"the QK circuit takes 1 to {cfg.block_size} tokens (the context), got {T}")
    f = layer_factors(model, layer, fold)
    scale, emb = embed_fold(model, fold)
    wq, wk = f.q[head], f.k[f.kv(head)]
    x = model.tok_emb.weight.detach()[list(tokens)].to(F64) * scale  # (T, C)
    plain = _scores(fold_write(x, emb), wq, wk, f.scale)
    kind = cfg.pos_encoding
    if kind in ("learned", "sinusoidal"):
        table = model.pos_emb.weight if kind == "learned" else model.pe_table
        positional = _scores(fold_write(x + table.detach()[:T].to(F64), emb), wq, wk, f.scale)
    elif kind == "rope" and model.rope_at(layer, slice(0, T)) is not None:
        cos, sin = (t.to(F64) for t in model.rope_at(layer, slice(0, T)))
        xe = fold_write(x, emb)
        q, k = apply_rope(xe @ wq, cos, sin), apply_rope(xe @ wk, cos, sin)
        positional = (q @ k.T * f.scale).numpy()
    else:
        kind, positional = "none", plain.copy()
    if cfg.mask == "causal":
        allowed = (~causal_mask(T, T, window=cfg.window(layer))).numpy()
    else:
        allowed = np.ones((T, T), dtype=bool)
    return QKCircuit(layer, head, tokens, plain, positional, allowed, kind, fold)


def _scores(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, scale: float) -> np.ndarray:
    return ((x @ wq) @ (x @ wk).T * scale).numpy()


def _check_head(model, layer, head) -> None:
    cfg = model.cfg
    for name, value, top in (("layer", layer, cfg.n_layers), ("head", head, cfg.n_heads)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < top:
            raise ValueError(f"{name} must be a whole number from 0 to {top - 1}, got {value!r:.40}")


def _check_tokens(tokens, n: int) -> list[int]:
    out = []
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < n:
            raise ValueError(f"token ids must be whole numbers from 0 to {n - 1}, got {t!r:.40}")
        out.append(int(t))
    return out
