"""An independent float64 path through a DecoderLM's weights, written out in numpy: every number the
cell view shows (model.inside), recomputed without the engine's attention code.

It reads the weights (state_dict) and the config only: the norms, rotary positions, masks, GELU kinds,
grouped key/value heads, interventions and the output projection are all redone here, step by step.
`reference(model, ids, intervention)` returns one `Layer` per layer with every intermediate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)


@dataclass
class Layer:
    x: np.ndarray  # (T, C) residual input
    xn: np.ndarray  # (T, C) what the attention reads
    q_raw: np.ndarray  # (H, T, hs)
    k_raw: np.ndarray  # (H, T, hs) keys each query head reads (its group's)
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray  # (H, T, hs)
    raw: np.ndarray  # (H, T, T) q · k
    scale: float
    allowed: np.ndarray  # (T, T) bool
    scores: np.ndarray  # (H, T, T) scaled, -inf where masked
    weights: np.ndarray  # (H, T, T) softmax
    used: np.ndarray  # (H, T, T) rows that multiplied V
    values: np.ndarray  # (H, T, hs) what each head passed on
    heads_out: np.ndarray  # (H, T, C)
    out_bias: np.ndarray | None
    attn_out: np.ndarray  # (T, C)


def _params(model) -> dict[str, np.ndarray]:
    return {k: v.detach().double().cpu().numpy() for k, v in model.state_dict().items()}


def _norm(cfg, p: dict, name: str, x: np.ndarray) -> np.ndarray:
    if cfg.norm == "none":
        return x
    w = p[f"{name}.weight"]
    if cfg.norm_kind == "rmsnorm":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * w
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + cfg.norm_eps) * w + p.get(f"{name}.bias", 0.0)


def _linear(p: dict, name: str, x: np.ndarray) -> np.ndarray:
    return x @ p[f"{name}.weight"].T + p.get(f"{name}.bias", 0.0)


def _act(cfg, h: np.ndarray) -> np.ndarray:
    if cfg.activation == "relu":
        return np.maximum(h, 0.0)
    if cfg.activation == "swiglu":
        gate, value = np.split(h, 2, axis=-1)
        return gate / (1.0 + np.exp(-gate)) * value
    if cfg.gelu_approximate == "tanh":
        return 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))
    return 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)).astype(np.float64))


def _rotate(cfg, t: np.ndarray) -> np.ndarray:
    """RoPE on (..., T, hs): pairs (2d, 2d+1) of the first rope_dim dimensions of position p turn by
    p · base^(-2d / rope_dim); the rest pass through."""
    rd = cfg.rope_dim
    T = t.shape[-2]
    ang = np.arange(T)[:, None] * cfg.pe_base ** (-np.arange(0, rd, 2) / rd)[None, :]  # (T, rd/2)
    c, s = np.cos(ang), np.sin(ang)
    out = t.copy()
    x1, x2 = t[..., 0:rd:2], t[..., 1:rd:2]
    out[..., 0:rd:2] = x1 * c - x2 * s
    out[..., 1:rd:2] = x1 * s + x2 * c
    return out


def embed(model, ids: list[int]) -> np.ndarray:
    cfg, p = model.cfg, _params(model)
    T = len(ids)
    x = p["tok_emb.weight"][ids]
    if cfg.pos_encoding == "learned":
        x = x + p["pos_emb.weight"][:T]
    elif cfg.pos_encoding == "sinusoidal":
        pos, two_i = np.arange(T)[:, None], np.arange(0, cfg.d_model, 2)[None, :]
        ang = pos / cfg.pe_base ** (two_i / cfg.d_model)
        pe = np.zeros((T, cfg.d_model))
        pe[:, 0::2], pe[:, 1::2] = np.sin(ang), np.cos(ang)
        x = x + pe
    return x


def _attention(model, p: dict, layer: int, x: np.ndarray, intervention) -> Layer:
    cfg = model.cfg
    T, C = x.shape
    H, Hkv, hs = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    pre = f"blocks.{layer}"
    xn = x if cfg.norm == "post" else _norm(cfg, p, f"{pre}.norm1", x)
    qkv = _linear(p, f"{pre}.attn.qkv", xn)  # (T, (H + 2 Hkv) hs)
    group = H // Hkv
    q_raw = np.stack([qkv[:, h * hs:(h + 1) * hs] for h in range(H)])
    k_raw = np.stack([qkv[:, (H + h // group) * hs:(H + h // group + 1) * hs] for h in range(H)])
    v = np.stack([qkv[:, (H + Hkv + h // group) * hs:(H + Hkv + h // group + 1) * hs] for h in range(H)])
    q, k = (_rotate(cfg, q_raw), _rotate(cfg, k_raw)) if cfg.pos_encoding == "rope" else (q_raw, k_raw)
    raw = q @ k.transpose(0, 2, 1)
    scale = 1.0 / math.sqrt(hs) if cfg.attn_scale == "inverse_sqrt" else 1.0
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = np.ones((T, T), dtype=bool)
    if cfg.mask == "causal":
        allowed = j <= i
        if cfg.window(layer):
            allowed &= j > i - cfg.window(layer)
    scores = np.where(allowed, raw * scale, -np.inf)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    weights = e / e.sum(-1, keepdims=True)
    used = weights.copy()
    ablated = set() if intervention is None else {h for (l, h) in intervention.ablated_heads(cfg) if l == layer}
    mode = None if intervention is None else intervention.mode
    uniform = allowed / allowed.sum(-1, keepdims=True)
    for h in ablated:
        if mode == "uniform":
            used[h] = uniform
    for ed in (intervention.edits if intervention is not None else ()):
        if ed.layer == layer:
            used[ed.head, ed.query] = uniform[ed.query] if ed.key is None else np.eye(T)[ed.key]
    values = used @ v  # (H, T, hs)
    for h in ablated:
        if mode == "zero":
            values[h] = 0.0
        elif mode == "mean":
            values[h] = values[h].mean(0, keepdims=True)
    if f"{pre}.attn.proj.weight" in p:
        w_o = p[f"{pre}.attn.proj.weight"]  # (C, H hs)
        heads_out = np.stack([values[h] @ w_o[:, h * hs:(h + 1) * hs].T for h in range(H)])
        out_bias = p.get(f"{pre}.attn.proj.bias")
    else:
        heads_out = np.zeros((H, T, C))
        for h in range(H):
            heads_out[h, :, h * hs:(h + 1) * hs] = values[h]
        out_bias = None
    attn_out = heads_out.sum(0) + (out_bias if out_bias is not None else 0.0)
    return Layer(x, xn, q_raw, k_raw, q, k, v, raw, scale, allowed, scores, weights, used, values, heads_out,
                 out_bias, attn_out)


def reference(model, ids: list[int], intervention=None) -> list[Layer]:
    """Every layer's attention arithmetic in float64, with the residual stream carried through the blocks."""
    cfg, p = model.cfg, _params(model)
    x = embed(model, ids)
    layers = []
    for layer in range(cfg.n_layers):
        pre = f"blocks.{layer}"
        a = _attention(model, p, layer, x, intervention)
        layers.append(a)
        has_ffn = f"{pre}.ffn.up.weight" in p

        def ffn(h):
            return _linear(p, f"{pre}.ffn.down", _act(cfg, _linear(p, f"{pre}.ffn.up", h)))
        if cfg.parallel_residual:
            x = x + a.attn_out + (ffn(_norm(cfg, p, f"{pre}.norm2", x)) if has_ffn else 0.0)
        elif cfg.norm == "post":
            x = _norm(cfg, p, f"{pre}.norm1", x + a.attn_out)
            if has_ffn:
                x = _norm(cfg, p, f"{pre}.norm2", x + ffn(x))
        else:
            x = x + a.attn_out
            if has_ffn:
                x = x + ffn(_norm(cfg, p, f"{pre}.norm2", x))
    return layers
