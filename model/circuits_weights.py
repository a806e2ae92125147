"""Each head's weight matrices as the circuit methods (model/circuits.py) read them, in float64.

Row-vector convention, as the engine multiplies (x @ W): a head h of a layer reads the residual stream x
(a row of C = d_model numbers) into its query x W_Q^h, key x W_K^h and value x W_V^h (C × hs each), and
writes o W_O^h (hs × C) back. So W_QK^h = W_Q^h (W_K^h)ᵀ and W_OV^h = W_V^h W_O^h are C × C, and the
attention score of query x_q and key x_k is x_q W_QK x_kᵀ (times the score scale).

The engine keeps one fused qkv matrix (model/attention.py): the query rows of every head, then the key
rows of every key/value head, then the value rows; query head h reads key/value head h // (H / Hkv)
(grouped-query attention). The output projection maps the heads side by side (H·hs) to C; a model
without one adds the heads side by side to the stream, so its W_O^h is the identity on head h's slice.

Folding the norms (fold=True), as TransformerLens does for its circuit scores (fold_ln with centred
weights): a norm is x -> (x - mean x) / σ(x) ⊙ s (+ b) for LayerNorm, x / rms(x) ⊙ s for RMSNorm, with
s the weight (offset + weight under Gemma's stored form, 1 for a parameter-free norm). Its per-token
scale 1/σ depends on the whole stream, so it is left out, and so are biases: what remains is the linear
map x -> x P diag(s), P = I - 11ᵀ/C the centring for LayerNorm (the identity for RMSNorm). That map is
multiplied into the weights that read after the norm (a block's input norm into W_Q, W_K, W_V; the final
norm into the unembedding; the q/k norms into W_Q, W_K on the hs side) and into those that write before
it (a branch's output norm, sandwich / post_branch, into W_O). In a LayerNorm model every reader removes
the mean, so each writer is centred too (W_O P), as TransformerLens centres writing weights. fold=False
reads the raw weights, as Elhage et al. (2021) define the circuits for models without norms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from .norms import RMSNorm

F64 = torch.float64


def norm_map(module: nn.Module | None) -> tuple[torch.Tensor | None, bool]:
    """(s, centred) of a norm frozen as the linear map x -> x P diag(s) (σ and bias left out): s None
    means all ones; centred is True for LayerNorm. (None, False) for no norm (None or Identity)."""
    if isinstance(module, nn.LayerNorm):
        return (None if module.weight is None else module.weight.detach().to(F64)), True
    if isinstance(module, RMSNorm):
        if module.weight is None:
            return None, False
        return module.weight.detach().to(F64) + module.offset, False
    return None, False


def fold_read(x: torch.Tensor, norm: tuple[torch.Tensor | None, bool]) -> torch.Tensor:
    """P diag(s) X for reading weights X (.., C, k) that act after the norm (rows are the norm's features)."""
    s, centred = norm
    if s is not None:
        x = x * s[:, None]
    return x - x.mean(-2, keepdim=True) if centred else x


def fold_write(y: torch.Tensor, norm: tuple[torch.Tensor | None, bool]) -> torch.Tensor:
    """Y P diag(s) for writing weights Y (.., k, C) whose output the norm reads (columns are its features)."""
    s, centred = norm
    if centred:
        y = y - y.mean(-1, keepdim=True)
    return y if s is None else y * s


def centres_stream(cfg) -> bool:
    """Whether every reader of the residual stream removes its mean (a LayerNorm model with norms)."""
    return cfg.norm_kind == "layernorm" and cfg.norm != "none"


def reading_norm(model, layer: int) -> nn.Module | None:
    """The norm the attention of block `layer` reads the stream through (None where it reads x itself:
    post-norm, post_branch and no norm)."""
    return model.blocks[layer].norm1 if model.cfg.norm in ("pre", "sandwich") else None


def final_norm(model) -> nn.Module | None:
    return model.norm_f if model.cfg.has_final_norm else None


@dataclass(frozen=True)
class LayerFactors:
    """One layer's head matrices in float64: q (H, C, hs), k and v (Hkv, C, hs), o (H, hs, C); `group` =
    H / Hkv (query head h reads key/value head h // group); `scale` the score multiplier the layer
    applies to q·k (1/sqrt(hs) unless the config says otherwise; folded, q and k carry qk_gain too)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    group: int
    scale: float

    def kv(self, head: int) -> int:
        return head // self.group


def layer_factors(model, layer: int, fold: bool = True) -> LayerFactors:
    """W_Q, W_K, W_V, W_O of every head of block `layer` (see the module docstring; fold: the norms)."""
    cfg, attn = model.cfg, model.blocks[layer].attn
    H, Hkv, hs, C = cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.d_model
    w = attn.qkv.weight.detach().to(F64)  # (rows, C): queries, keys, values
    q = w[: H * hs].reshape(H, hs, C).transpose(1, 2)
    k = w[H * hs : (H + Hkv) * hs].reshape(Hkv, hs, C).transpose(1, 2)
    v = w[(H + Hkv) * hs :].reshape(Hkv, hs, C).transpose(1, 2)
    if attn.proj is not None:
        o = attn.proj.weight.detach().to(F64).T.reshape(H, hs, C)
    else:  # the heads side by side are the branch's output (H·hs = C)
        o = torch.eye(C, dtype=F64).reshape(H, hs, C)
    scale = float(attn.score_scale)
    if not fold:
        return LayerFactors(q, k, v, o, H // Hkv, scale)
    read = norm_map(reading_norm(model, layer))
    q, k, v = fold_read(q, read), fold_read(k, read), fold_read(v, read)
    if cfg.qk_norm != "none":
        q, k = _fold_qk(attn.q_norm, q, H, cfg.qk_norm), _fold_qk(attn.k_norm, k, Hkv, cfg.qk_norm)
    q, k = q * attn.qk_gain, k * attn.qk_gain
    block = model.blocks[layer]
    if cfg.norm in ("sandwich", "post_branch"):  # the branch's output norm, before it joins the stream
        o = fold_write(o, norm_map(block.post_norm1))
    if centres_stream(cfg):
        o = o - o.mean(-1, keepdim=True)
    return LayerFactors(q, k, v, o, H // Hkv, scale)


def _fold_qk(norm: nn.Module, x: torch.Tensor, heads: int, kind: str) -> torch.Tensor:
    """The q/k norm's map (applied after the projection, on the hs side) folded into x (heads, C, hs)."""
    s, centred = norm_map(norm)
    if kind == "whole" and centred:
        raise ValueError("a LayerNorm over all heads' queries or keys at once centres across heads, so no "
                         "single head has a W_Q or W_K of its own; the circuit is not defined per head here")
    if s is not None and kind == "whole":  # one weight per head's slice of the H·hs (Hkv·hs) features
        s = s.reshape(heads, 1, -1)
    if centred:
        x = x - x.mean(-1, keepdim=True)
    return x if s is None else x * s


def embed_fold(model, fold: bool) -> tuple[float, tuple[torch.Tensor | None, bool]]:
    """(embed_scale, the embedding norm's map) the token embedding passes through before the stream."""
    if not fold or model.embed_norm is None:
        return float(model.cfg.embed_scale), (None, False)
    return float(model.cfg.embed_scale), norm_map(model.embed_norm)


def unembed_fold(model, fold: bool) -> tuple[torch.Tensor | None, bool]:
    """The final norm's map that reads the stream before the unembedding ((None, False) unfolded)."""
    return norm_map(final_norm(model)) if fold else (None, False)


def used_vocab(model) -> int:
    """Rows of the embedding the tokenizer uses (padding rows past vocab_used are never tokens)."""
    cfg = model.cfg
    return cfg.vocab_size if cfg.vocab_used is None else cfg.vocab_used
