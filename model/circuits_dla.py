"""Direct logit attribution: how much each head, each MLP and the embedding add to one logit (or to the
difference of two) at one position, along their direct path into the read-out.

The residual stream the final norm reads at position t is a sum of what each part wrote there: the
embedding (token, plus the learned or sinusoidal position), every head's o_h W_O^h, every attention
output bias, every MLP's output (and, under nanochat's x0 mix and backout, fixed multiples of these: each
part's coefficient in the final stream is taken into its term, so those models decompose exactly too).
The final norm is frozen at the scale of this very forward at t, which makes the read-out linear in the
parts:

* LayerNorm: x -> (x - mean x) / σ ⊙ w + b, σ = sqrt(var(x) + eps) of the final stream at t. The mean is
  linear, so each part is centred on its own ((c - mean c) / σ ⊙ w); the bias b is its own term.
* RMSNorm: x -> x / rms ⊙ s, rms = sqrt(mean(x²) + eps) at t, s = offset + weight (1 without weight).
* No final norm: the identity.

Then a part c contributes (norm(c) · (u_a - u_b)), u the unembedding rows of the answer and the other
token (u_a alone for one logit). A branch with its own output norm (sandwich, post_branch) is frozen the
same way at its own forward scale at t: the attention's output norm at the σ (rms) of the attention
output there, so each head's share is its o_h W_O^h through that frozen norm; the MLP's whole normed
output is one part. What is not any head's, MLP's or the embedding's is the remainder, each piece named:
the attention output biases, the branch norms' and the final norm's biases, the output head's bias, and
the logits' soft-cap (Gemma 2): the parts decompose the logit before the cap; the cap is applied after,
and its nonlinearity (cap(z) - z, differenced) is counted in the remainder. So, as defined,

    sum(heads) + sum(mlps) + sum(embedding) + remainder == actual,

exactly in exact arithmetic, to the float rounding of the forward in practice. This is the direct effect
only: a head's output also changes what later layers read, which this does not count (patching does).

Refused by name: norm="post" (every block normalises the whole stream, so no part reaches the logits along
a linear path). Read from a forward with record=True (model.patching.Activations): nothing is re-run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from .circuits_weights import F64, final_norm
from .norms import RMSNorm

NOT_DEFINED = ("post-norm models (norm='post') normalise the whole residual stream after every branch, so no "
               "head or MLP reaches the logits along a linear path: direct logit attribution is not defined there")


@dataclass(frozen=True)
class DirectLogitAttribution:
    """Direct logit attribution at one position (see the module docstring).

    heads (L, H) and mlps (L,): each part's direct term (0.0 for a block without an MLP: `mlp_layers`
    lists those with one); embedding: {"token": .., "position": ..} (learned or sinusoidal positions; the
    token alone under rotary or none), or {"embedding": ..}, the whole stream after the embedding, where a
    norm of the embedding or nanochat's smear makes it one part. biases: the remainder's named pieces
    ("attn_out L{l}", "post_attn_norm L{l}", "post_mlp_norm L{l}", "final_norm", "head"); cap: the soft-cap's
    share. direct_sum = heads + mlps + embedding; remainder = biases + cap; uncapped: the logit (difference)
    before the soft-cap; actual: the model's read-out of the final stream at t, in its own dtype (the
    forward's logits are this, rounded to float32). scale: the final norm's σ (LayerNorm) or rms at t
    (1.0 without a final norm); branch_scales (L, 2): each block's attention and MLP output norm's σ or
    rms at t (sandwich, post_branch), else None. coefficients: each part's multiple in the final stream
    ([embedding, block 0, ..]: all 1.0 unless nanochat's x0 mix or backout)."""

    position: int
    answer: int
    other: int | None
    heads: np.ndarray
    mlps: np.ndarray
    mlp_layers: tuple[int, ...]
    embedding: dict[str, float]
    biases: dict[str, float]
    cap: float
    direct_sum: float
    remainder: float
    uncapped: float
    actual: float
    scale: float
    branch_scales: np.ndarray | None = None
    coefficients: tuple[float, ...] = field(default=())


def _scalar(p) -> float:
    return float(p.detach().double().reshape(-1)[0])


def stream_coefficients(model) -> list[float]:
    """Each part's multiple in the stream the final norm reads: [embedding, block 0's branches, ...].

    Block l reads resid_lambda_l · x + x0_lambda_l · x0 under the x0 mix (x0 the stream after the
    embedding) and adds its branches; the backout then takes backout_lambda times the stream after block
    b away (nanochat). Without either every coefficient is 1."""
    cfg = model.cfg
    coef = [1.0] + [0.0] * cfg.n_layers
    kept = None
    for layer, block in enumerate(model.blocks):
        if cfg.x0_mix:
            r, g = _scalar(block.resid_lambda), _scalar(block.x0_lambda)
            coef = [c * r for c in coef]
            coef[0] += g
        coef[layer + 1] = 1.0
        if layer == cfg.backout_layer:
            kept = list(coef)
    if kept is not None:
        lam = _scalar(model.backout_lambda)
        coef = [c - lam * k for c, k in zip(coef, kept)]
    return coef


class _Frozen:
    """A norm frozen at the scale of one vector x (its forward input): `direction(d)` is the vector e with
    c · e == frozen_norm(c) · d for every part c (bias left out), `bias(d)` the bias's b · d."""

    def __init__(self, module: nn.Module | None, x: torch.Tensor, eps: float):
        self.scale, self.centred, self.s, self.b = 1.0, False, None, None
        if isinstance(module, nn.LayerNorm):
            mu = x.mean()
            self.scale = float(torch.sqrt(((x - mu) ** 2).mean() + eps))
            self.centred = True
            self.s = None if module.weight is None else module.weight.detach().to(F64)
            self.b = None if module.bias is None else module.bias.detach().to(F64)
        elif isinstance(module, RMSNorm):
            self.scale = float(torch.sqrt((x * x).mean() + eps))
            self.s = None if module.weight is None else module.weight.detach().to(F64) + module.offset

    def direction(self, d: torch.Tensor) -> torch.Tensor:
        # (c - mean c) ⊙ s · d == c · (s ⊙ d - mean(s ⊙ d)): centring moves onto the direction
        e = d if self.s is None else self.s * d
        if self.centred:
            e = e - e.mean()
        return e / self.scale

    def bias(self, d: torch.Tensor) -> float:
        return 0.0 if self.b is None else float(self.b @ d)


def _token_rows(model, answer: int, other: int | None) -> tuple[torch.Tensor, float, list[int]]:
    """The unembedding direction (C,) float64: u_answer (- u_other), its head-bias share, the rows read."""
    V = model.cfg.vocab_size
    ids = [answer] if other is None else [answer, other]
    for t in ids:
        if not isinstance(t, (int, np.integer)) or isinstance(t, bool) or not 0 <= t < V:
            raise ValueError(f"token ids must be whole numbers from 0 to {V - 1}, got {t!r:.40}")
    w = model.head.weight.detach()[ids].to(F64)
    b = model.head.bias.detach()[ids].to(F64) if model.head.bias is not None else torch.zeros(len(ids), dtype=F64)
    if other is None:
        return w[0], float(b[0]), ids
    return w[0] - w[1], float(b[0] - b[1]), ids


def _matvec(weight: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """weightᵀ e in the weight's own precision (float32 for 16-bit weights), as float64: one pass over
    the weight, no float64 copy of it."""
    dt = weight.dtype if weight.dtype in (torch.float32, F64) else torch.float32
    return (weight.detach().to(dt).T @ e.to(dt)).to(F64)


@torch.no_grad()
def direct_logit_attribution(model, out, position: int, answer: int, other: int | None = None,
                             row: int = 0) -> DirectLogitAttribution:
    """Direct logit attribution of logit[answer] (- logit[other]) at `position` (see the module docstring).

    out: the ForwardOutput of `model(ids, record=True)` (its activations are read, nothing is re-run);
    position: an index of that forward's tokens (negative counts from the end); row: the batch row."""
    cfg = model.cfg
    if cfg.norm == "post":
        raise ValueError(NOT_DEFINED)
    acts = getattr(out, "activations", None)
    if acts is None:
        raise ValueError("direct logit attribution reads a recorded forward: call the model with record=True")
    B, T = acts.shape
    if not (isinstance(position, (int, np.integer)) and -T <= position < T) or isinstance(position, bool):
        raise ValueError(f"position must be a whole number from {-T} to {T - 1}, got {position!r:.40}")
    if not (isinstance(row, (int, np.integer)) and 0 <= row < B):
        raise ValueError(f"row must be a whole number from 0 to {B - 1}, got {row!r:.40}")
    t = int(position) % T
    start = 0 if out.cache is None else out.cache.length - T  # the absolute position of this call's first token
    d, head_bias, ids = _token_rows(model, answer, other)
    x_final = acts.residuals[-1][row, t].to(F64)
    fin = _Frozen(final_norm(model), x_final, cfg.norm_eps)
    d_res = fin.direction(d)  # a part c of the final stream adds c · d_res
    coef = stream_coefficients(model)
    biases: dict[str, float] = {}
    L, H, hs = cfg.n_layers, cfg.n_heads, cfg.head_dim
    heads, mlps = np.zeros((L, H)), np.zeros(L)
    branch = np.zeros((L, 2)) if cfg.norm in ("sandwich", "post_branch") else None
    for layer, block in enumerate(model.blocks):
        c = coef[layer + 1]
        o = acts.heads[layer][row, :, t].to(F64)  # (H, hs): each head's output before W_O
        proj = block.attn.proj
        e = d_res
        if branch is not None:  # the attention output norm, frozen at the attention output's own scale
            a = o.reshape(-1)
            if proj is not None:  # W_O o (+ b_O): the attention output the norm read
                a = _matvec(proj.weight.T, a)
                a = a if proj.bias is None else a + proj.bias.detach().to(F64)
            post = _Frozen(block.post_norm1, a, cfg.norm_eps)
            branch[layer, 0] = post.scale
            if post.b is not None:
                biases[f"post_attn_norm L{layer}"] = c * post.bias(d_res)
            e = post.direction(d_res)
        e = e * c
        per_head = e if proj is None else _matvec(proj.weight, e)  # W_Oᵀ e: (H·hs,)
        heads[layer] = (o * per_head.reshape(H, hs)).sum(-1).numpy()
        if proj is not None and proj.bias is not None:
            biases[f"attn_out L{layer}"] = float(proj.bias.detach().to(F64) @ e)
        m = acts.mlp[layer]
        if m is not None:
            m = m[row, t].to(F64)
            if branch is not None:  # m is the normed output already: one part, less its norm's bias
                branch[layer, 1] = _branch_scale(block.post_norm2, block, acts, layer, row, t, cfg.norm_eps)
                b2 = getattr(block.post_norm2, "bias", None)
                if b2 is not None:
                    m = m - b2.detach().to(F64)
                    biases[f"post_mlp_norm L{layer}"] = c * float(b2.detach().to(F64) @ d_res)
            mlps[layer] = c * float(m @ d_res)
    embedding = _embedding_terms(model, acts.residuals[0][row, t].to(F64), start + t, d_res * coef[0])
    biases["final_norm"] = fin.bias(d)
    biases["head"] = head_bias
    uncapped, actual = _read_out(model, x_final, ids)
    cap = actual - uncapped
    direct = float(heads.sum() + mlps.sum() + sum(embedding.values()))
    return DirectLogitAttribution(
        position=t, answer=int(answer), other=None if other is None else int(other), heads=heads, mlps=mlps,
        mlp_layers=tuple(i for i in range(L) if acts.mlp[i] is not None), embedding=embedding, biases=biases,
        cap=cap, direct_sum=direct, remainder=float(sum(biases.values()) + cap), uncapped=uncapped,
        actual=actual, scale=fin.scale, branch_scales=branch, coefficients=tuple(coef))


def _branch_scale(norm, block, acts, layer, row, t, eps) -> float:
    """The MLP output norm's σ (rms) at t, for the record: the recording holds the normed output only, so
    the MLP's raw output is recomputed from the recorded stream (one position, one MLP)."""
    x = acts.residuals[layer][row:row + 1, t:t + 1]
    if block.x0_mix:  # the block's own stream: nanochat's mix of x and x0
        x = block.stream_in(x, acts.residuals[0][row:row + 1, t:t + 1])
    x = x + acts.attn[layer][row:row + 1, t:t + 1]
    f = block.ffn(block.norm2(x))[0, 0].to(F64)
    return _Frozen(norm, f, eps).scale


def _embedding_terms(model, x0: torch.Tensor, pos: int, e: torch.Tensor) -> dict[str, float]:
    """The embedding's direct terms: token and position apart where the stream after the embedding is
    their plain sum, else the whole of it."""
    cfg = model.cfg
    if cfg.embed_norm or cfg.smear_width:
        return {"embedding": float(x0 @ e)}
    if cfg.pos_encoding == "learned":
        p = model.pos_emb.weight.detach()[pos].to(F64)
    elif cfg.pos_encoding == "sinusoidal":
        p = model.pe_table[pos].to(F64)
    else:
        return {"token": float(x0 @ e), "position": 0.0}
    return {"token": float((x0 - p) @ e), "position": float(p @ e)}


def _read_out(model, x: torch.Tensor, ids: list[int]) -> tuple[float, float]:
    """(before the soft-cap, after it): the logit (difference) the model reads out of the final stream x,
    with its own modules in its own dtype, for the rows `ids` only."""
    cfg = model.cfg
    dt = model.head.weight.dtype
    xt = x.to(dt)
    norm = final_norm(model)
    normed = xt if norm is None else norm(xt[None])[0]
    z = model.head.weight.detach()[ids] @ normed
    if model.head.bias is not None:
        z = z + model.head.bias.detach()[ids]
    z = z.to(F64)
    capped = z if cfg.logit_softcap is None else torch.tanh(z / cfg.logit_softcap) * cfg.logit_softcap
    if len(ids) == 1:
        return float(z[0]), float(capped[0])
    return float(z[0] - z[1]), float(capped[0] - capped[1])
