"""Small random models and float64 references for the circuit tests (tests/engine/test_circuits*.py).

Nothing here calls model/circuits*.py: each head's W_Q, W_K, W_V, W_O is cut out of the fused qkv and the
output projection by hand, as explicit matrices, and the norms' folding (TransformerLens-style: weight and
centring multiplied in, per-token scale and bias left out) is written as explicit C × C (or hs × hs)
matrices P diag(s), P = I - 11ᵀ/n for LayerNorm, so every reference product is the dense definition.
"""

from __future__ import annotations

import torch

from model.config import ModelConfig
from model.transformer import DecoderLM

CONFIGS = {
    # GPT-2: learned positions, LayerNorm with biases, tanh GELU, tied embedding
    "gpt2": dict(gelu_approximate="tanh", tie_weights=True),
    # GPT-NeoX / Pythia: parallel residual, part of each head rotated (half of 4 here), untied, an output bias
    "neox": dict(pos_encoding="rope", rope_fraction=0.5, parallel_residual=True, head_bias=True),
    # Llama: RMSNorm, SwiGLU, no biases, grouped keys (2 key/value heads for 4 query heads)
    "llama": dict(pos_encoding="rope", norm_kind="rmsnorm", activation="swiglu", n_kv_heads=2, bias=False),
    # Gemma 2-like sandwich: RMSNorm times (1 + w), q/k norm, one key/value head, logit soft-cap, embed scale
    "sandwich": dict(pos_encoding="rope", norm="sandwich", norm_kind="rmsnorm", norm_offset=1.0, bias=False,
                     activation="geglu", qk_norm="head", n_kv_heads=1, embed_scale=4.0, logit_softcap=3.0),
    # sandwich with LayerNorm and biases: the branch norms' means and biases
    "sandwich-ln": dict(norm="sandwich", vocab_used=17),
    # OLMo 2-like: norms only after each branch, q/k norm over all heads, sinusoidal positions here
    "post-branch": dict(pos_encoding="sinusoidal", norm="post_branch", norm_kind="rmsnorm", bias=False,
                        qk_norm="whole", n_kv_heads=2),
}
VOCAB = 20


def make(name: str, dtype=torch.float64, seed: int = 0, **extra) -> DecoderLM:
    """A 3-layer, 4-head, d_model 16 model of config `name`, every weight (norms and biases too) moved off its
    initial value so that no fold or bias is trivially 1 or 0."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=VOCAB, block_size=16, n_layers=3, n_heads=4, d_model=16,
                      **{**CONFIGS.get(name, {}), **extra})
    model = DecoderLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.2))
    return model.to(dtype)


def w64(t) -> torch.Tensor:
    return t.detach().double()


def norm_matrix(module, width: int) -> torch.Tensor:
    """The norm frozen without its scale and bias, as a (width, width) matrix M with x_norm ≈ x M."""
    eye = torch.eye(width, dtype=torch.float64)
    if module is None or not hasattr(module, "weight"):  # Identity: no norm
        return eye
    if isinstance(module, torch.nn.LayerNorm):
        centre = eye - torch.full((width, width), 1.0 / width, dtype=torch.float64)
        return centre @ torch.diag(w64(module.weight))
    if module.weight is None:  # a parameter-free RMSNorm
        return eye
    return torch.diag(w64(module.weight) + module.offset)


def dense_heads(model, layer: int, fold: bool) -> dict:
    """{"q": [H] (C, hs), "k": [H] (C, hs) (each query head's own key/value head), "v": [H], "o": [H] (hs, C)}."""
    cfg, blk = model.cfg, model.blocks[layer]
    H, Hkv, hs, C = cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.d_model
    w = w64(blk.attn.qkv.weight)
    out = {"q": [], "k": [], "v": [], "o": []}
    read = norm_matrix(blk.norm1 if cfg.norm in ("pre", "sandwich") else None, C) if fold else torch.eye(C)
    read = read.double()
    for h in range(H):
        g = h // (H // Hkv)
        q = read @ w[h * hs : (h + 1) * hs].T
        k = read @ w[(H + g) * hs : (H + g + 1) * hs].T
        v = read @ w[(H + Hkv + g) * hs : (H + Hkv + g + 1) * hs].T
        if fold and cfg.qk_norm == "head":
            q, k = q @ norm_matrix(blk.attn.q_norm, hs), k @ norm_matrix(blk.attn.k_norm, hs)
        elif fold and cfg.qk_norm == "whole":  # the head's block of the all-heads norm
            q = q @ norm_matrix(blk.attn.q_norm, H * hs)[h * hs : (h + 1) * hs, h * hs : (h + 1) * hs]
            k = k @ norm_matrix(blk.attn.k_norm, Hkv * hs)[g * hs : (g + 1) * hs, g * hs : (g + 1) * hs]
        if blk.attn.proj is None:  # the heads side by side are the branch's output: head h's slice of C
            o = torch.eye(C, dtype=torch.float64)[h * hs : (h + 1) * hs]
        else:
            o = w64(blk.attn.proj.weight)[:, h * hs : (h + 1) * hs].T
        if fold and cfg.norm in ("sandwich", "post_branch"):
            o = o @ norm_matrix(blk.post_norm1, C)
        if fold and cfg.norm_kind == "layernorm":  # every reader centres: so is each writer
            o = o @ (torch.eye(C, dtype=torch.float64) - 1.0 / C)
        out["q"].append(q)
        out["k"].append(k)
        out["v"].append(v)
        out["o"].append(o)
    return out


def frozen(module, x: torch.Tensor, eps: float):
    """A norm frozen at the scale of its input x (1-D): (c -> the norm's linear part of c, its bias or None)."""
    if module is None or not hasattr(module, "weight"):
        return (lambda c: c), None
    if isinstance(module, torch.nn.LayerNorm):
        sigma = torch.sqrt(((x - x.mean()) ** 2).mean() + eps)
        wt = w64(module.weight)
        return (lambda c: (c - c.mean()) / sigma * wt), (None if module.bias is None else w64(module.bias))
    rms = torch.sqrt((x * x).mean() + eps)
    s = 1.0 if module.weight is None else w64(module.weight) + module.offset
    return (lambda c: c / rms * s), None


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pairs (2i, 2i + 1) of x (T, hs) turned by the angles whose cos and sin (T, r) are given; the rest kept."""
    out = x.clone()
    for i in range(cos.shape[1]):
        a, b = x[:, 2 * i], x[:, 2 * i + 1]
        out[:, 2 * i], out[:, 2 * i + 1] = a * cos[:, i] - b * sin[:, i], a * sin[:, i] + b * cos[:, i]
    return out
