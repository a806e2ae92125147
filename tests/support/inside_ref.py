"""An independent float64 path through a DecoderLM's weights, written out in numpy: every number the
cell view shows (model.inside), recomputed without the engine's attention code.

It reads the weights (state_dict) and the config only: the norms (RMSNorm times offset + w included), the
q/k norms (per head or over the whole projection), rotary positions (each layer's base and frequency
change recomputed here, `rope_angles`), the score scale, soft-caps, masks and local windows, GELU kinds,
grouped key/value heads, interventions, the output projection and where each block's norms sit
(pre, post, sandwich, post_branch) are all redone here, step by step.
`reference(model, ids, intervention)` returns one `Layer` per layer with every intermediate.
nanochat's options (smear, x0 mix, value embeddings, backout, q/k gain, embedding norm) are not written
out here: a model with one is refused (`refuse_unwritten`).
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
    q_proj: np.ndarray  # (H, T, hs) the projections, before any q/k norm
    k_proj: np.ndarray  # (H, T, hs) the keys' projections each query head reads (its group's)
    q_raw: np.ndarray  # (H, T, hs) after the q/k norm (the projections without one), before the rotary step
    k_raw: np.ndarray  # (H, T, hs)
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray  # (H, T, hs)
    raw: np.ndarray  # (H, T, T) q · k
    scale: float
    capped: np.ndarray  # (H, T, T) raw × scale, soft-capped where the model caps (before the mask)
    allowed: np.ndarray  # (T, T) bool
    scores: np.ndarray  # (H, T, T) capped, -inf where masked
    weights: np.ndarray  # (H, T, T) softmax
    used: np.ndarray  # (H, T, T) rows that multiplied V
    values: np.ndarray  # (H, T, hs) what each head passed on
    heads_out: np.ndarray  # (H, T, C)
    out_bias: np.ndarray | None
    attn_out: np.ndarray  # (T, C)
    attn_normed: np.ndarray | None = None  # (T, C) attn_out through the branch's own norm (sandwich, post_branch)
    residual_after: np.ndarray | None = None  # (T, C) the stream once the attention's output joined it


def _params(model) -> dict[str, np.ndarray]:
    return {k: v.detach().double().cpu().numpy() for k, v in model.state_dict().items()}


def _norm(cfg, p: dict, name: str, x: np.ndarray, always: bool = False) -> np.ndarray:
    """The norm `name` of the model (of its kind, eps and offset) on x; x itself when the model has no norms,
    unless `always` (the q/k norms, which a model has whatever its blocks' norm style)."""
    if cfg.norm == "none" and not always:
        return x
    w = p.get(f"{name}.weight")  # None: a parameter-free RMSNorm
    if cfg.norm_kind == "rmsnorm":
        normed = x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps)
        return normed if w is None else normed * (cfg.norm_offset + w)  # Gemma stores w, multiplies by 1 + w
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + cfg.norm_eps) * w + p.get(f"{name}.bias", 0.0)


def _linear(p: dict, name: str, x: np.ndarray) -> np.ndarray:
    return x @ p[f"{name}.weight"].T + p.get(f"{name}.bias", 0.0)


def _gelu(cfg, h: np.ndarray) -> np.ndarray:
    if cfg.gelu_approximate == "tanh":
        return 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))
    return 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)).astype(np.float64))


def _act(cfg, h: np.ndarray) -> np.ndarray:
    if cfg.activation == "relu":
        return np.maximum(h, 0.0)
    if cfg.activation == "relu2":
        return np.maximum(h, 0.0) ** 2
    if cfg.activation in ("swiglu", "geglu"):  # the gate's rows first, then the value's
        gate, value = np.split(h, 2, axis=-1)
        return (gate / (1.0 + np.exp(-gate)) if cfg.activation == "swiglu" else _gelu(cfg, gate)) * value
    return _gelu(cfg, h)


def rope_angles(cfg, layer: int, positions) -> np.ndarray | None:
    """The angles (P, rope_dim/2) layer `layer` turns the pairs of its queries and keys by at `positions`,
    in float64 from the config alone; None for a layer that does not rotate (no rotary, or a NoPE layer).

    Pair d turns by p · f_d, f_d = base^(-2d / rope_dim), base the layer's own (a windowed layer's
    local_rope_base, else pe_base). On the layers that use pe_base the frequencies change first:
    ("linear", s) divides each by s; ("llama3", s, lo, hi, n0) judges each by its wavelength λ = 2π / f
    against n0: λ < n0 / hi keeps f, λ > n0 / lo gives f / s, and between the two the share
    r = (n0 / λ - lo) / (hi - lo) of f is kept and 1 - r of f / s taken."""
    if cfg.pos_encoding != "rope" or layer in cfg.rope_off_layers:
        return None
    rd = cfg.rope_dim
    local = cfg.local_rope_base is not None and cfg.window(layer) > 0
    freq = (cfg.local_rope_base if local else cfg.pe_base) ** (-np.arange(0, rd, 2) / rd)
    scaling = () if local else tuple(cfg.rope_scaling)
    if scaling and scaling[0] == "linear":
        freq = freq / scaling[1]
    elif scaling:
        s, lo, hi, n0 = (float(v) for v in scaling[1:])
        changed = []
        for f in freq:
            wavelength = 2 * math.pi / f
            if wavelength < n0 / hi:
                changed.append(f)
            elif wavelength > n0 / lo:
                changed.append(f / s)
            else:
                r = (n0 / wavelength - lo) / (hi - lo)
                changed.append(r * f + (1 - r) * f / s)
        freq = np.array(changed)
    return np.asarray(positions, dtype=np.float64)[:, None] * freq[None, :]


def _rotate(cfg, t: np.ndarray, layer: int) -> np.ndarray:
    """RoPE on (..., T, hs): pairs (2d, 2d+1) of the first rope_dim dimensions of position p turn by the
    layer's angle (`rope_angles`); the rest pass through. t itself on a layer that does not rotate."""
    ang = rope_angles(cfg, layer, range(t.shape[-2]))  # (T, rd/2)
    if ang is None:
        return t
    rd = cfg.rope_dim
    c, s = np.cos(ang), np.sin(ang)
    out = t.copy()
    x1, x2 = t[..., 0:rd:2], t[..., 1:rd:2]
    out[..., 0:rd:2] = x1 * c - x2 * s
    out[..., 1:rd:2] = x1 * s + x2 * c
    return out


def refuse_unwritten(cfg) -> None:
    """nanochat's options are not written out here: a reference that skipped them would be wrong."""
    unwritten = [name for name, on in (("smear_width", cfg.smear_width), ("x0_mix", cfg.x0_mix),
                                       ("value_embed_layers", cfg.value_embed_layers),
                                       ("backout_layer", cfg.backout_layer is not None),
                                       ("qk_gain", cfg.qk_gain != 1.0), ("embed_norm", cfg.embed_norm)) if on]
    assert not unwritten, f"tests/support/inside_ref.py does not write out {unwritten}"


def embed(model, ids: list[int]) -> np.ndarray:
    cfg, p = model.cfg, _params(model)
    refuse_unwritten(cfg)
    T = len(ids)
    x = p["tok_emb.weight"][ids] * cfg.embed_scale  # Gemma: times sqrt(d_model)
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
    # a post-norm block, and one that normalises only its branches' outputs (OLMo 2), read x itself
    xn = x if cfg.norm in ("post", "post_branch") else _norm(cfg, p, f"{pre}.norm1", x)
    qkv = _linear(p, f"{pre}.attn.qkv", xn)  # (T, (H + 2 Hkv) hs)
    group = H // Hkv
    q_all, k_all = qkv[:, : H * hs], qkv[:, H * hs:(H + Hkv) * hs]  # (T, H hs), (T, Hkv hs)
    q_proj = np.stack([q_all[:, h * hs:(h + 1) * hs] for h in range(H)])
    k_proj = np.stack([k_all[:, (h // group) * hs:(h // group + 1) * hs] for h in range(H)])
    v = np.stack([qkv[:, (H + Hkv + h // group) * hs:(H + Hkv + h // group + 1) * hs] for h in range(H)])
    if cfg.qk_norm == "head":  # each head's vector normed on its own, one weight for every head
        q_raw = _norm(cfg, p, f"{pre}.attn.q_norm", q_proj, always=True)
        k_raw = _norm(cfg, p, f"{pre}.attn.k_norm", k_proj, always=True)
    elif cfg.qk_norm == "whole":  # all heads of a position normed together, as the projection lays them out
        qn = _norm(cfg, p, f"{pre}.attn.q_norm", q_all, always=True)
        kn = _norm(cfg, p, f"{pre}.attn.k_norm", k_all, always=True)
        q_raw = np.stack([qn[:, h * hs:(h + 1) * hs] for h in range(H)])
        k_raw = np.stack([kn[:, (h // group) * hs:(h // group + 1) * hs] for h in range(H)])
    else:
        q_raw, k_raw = q_proj, k_proj
    q, k = _rotate(cfg, q_raw, layer), _rotate(cfg, k_raw, layer)
    raw = q @ k.transpose(0, 2, 1)
    scale = 1.0 / math.sqrt(cfg.query_scale_dim or hs) if cfg.attn_scale == "inverse_sqrt" else 1.0
    capped = raw * scale
    if cfg.attn_softcap is not None:  # Gemma 2: c · tanh(s / c), before the mask
        capped = cfg.attn_softcap * np.tanh(capped / cfg.attn_softcap)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = np.ones((T, T), dtype=bool)
    if cfg.mask == "causal":
        allowed = j <= i
        if cfg.window(layer):
            allowed &= j > i - cfg.window(layer)
    scores = np.where(allowed, capped, -np.inf)
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
    attn_normed = _norm(cfg, p, f"{pre}.post_norm1", attn_out) if cfg.norm in ("sandwich", "post_branch") else None
    return Layer(x, xn, q_proj, k_proj, q_raw, k_raw, q, k, v, raw, scale, capped, allowed, scores, weights, used,
                 values, heads_out, out_bias, attn_out, attn_normed,
                 x + (attn_out if attn_normed is None else attn_normed))


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
        elif cfg.norm in ("sandwich", "post_branch"):  # each branch's output normed before it joins the stream
            x = a.residual_after
            if has_ffn:
                h = _norm(cfg, p, f"{pre}.norm2", x) if cfg.norm == "sandwich" else x
                x = x + _norm(cfg, p, f"{pre}.post_norm2", ffn(h))
        elif cfg.norm == "post":
            x = _norm(cfg, p, f"{pre}.norm1", x + a.attn_out)
            if has_ffn:
                x = _norm(cfg, p, f"{pre}.norm2", x + ffn(x))
        else:
            x = x + a.attn_out
            if has_ffn:
                x = x + ffn(_norm(cfg, p, f"{pre}.norm2", x))
    return layers
