"""model.inside on the options of the 2024-26 families, against a slow float64 path written here from the formulas.

Each small random DecoderLM below (built from ModelConfig, weights made large enough that attention is far from
uniform) turns on some of: attention wider than d_model / n_heads (head_size), a q/k norm per head or over the
whole position (as RMSNorm, LayerNorm, without a weight, with 1 + w, with a gain), a query scale of the model's
own (query_scale_dim), a soft-cap of the scores, a local rotary base, linear and Llama 3 frequency changes, a
layer without rotary, sandwich and post-branch norms, an embedding scale. For every layer, head and a few cells,
each worked number of the cell (the projection, the norm's rms and weight, the rotary angles, the dot product,
the scale, the capped score, the row through the softmax, the values, W_O, the norm of the attention's output,
the residual after it) is recomputed in numpy float64 from the residual stream the forward fed the layer and
the model's weights, and the weights and the stream after the attention are held to the forward's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from model.config import ModelConfig
from model.generate import Decoder, Sampling
from model.inside import inside_cell, inside_head, run_forward
from model.transformer import DecoderLM

VOCAB = 23
IDS = [3, 7, 1, 12, 7, 3, 19, 4, 7, 11]
REL = 2e-5  # float32 arithmetic against float64, relative to the largest magnitude involved
FORWARD_TOL = 1e-6  # the cell's weights against the forward's (float32 against float32)

BASE = dict(vocab_size=VOCAB, block_size=16, n_layers=2, n_heads=4, d_model=16, pos_encoding="rope",
            norm_kind="rmsnorm", bias=False)
CONFIGS = {
    # attention 24 wide for d_model 16, grouped keys, biases on the projections only
    "head_size_gqa": dict(head_size=6, n_kv_heads=2, qkv_bias=True, activation="swiglu"),
    "qk_norm_head": dict(qk_norm="head", head_size=8, n_kv_heads=2, activation="swiglu"),  # Qwen3
    "qk_norm_whole_post_branch": dict(qk_norm="whole", norm="post_branch", n_kv_heads=2, activation="swiglu"),  # OLMo 2
    "gemma2_like": dict(norm="sandwich", norm_offset=1.0, embed_scale=4.0, query_scale_dim=12, head_size=8,
                        attn_softcap=3.0, attn_window=(4, 0), activation="geglu", gelu_approximate="tanh",
                        n_kv_heads=2),
    "gemma3_like": dict(norm="sandwich", norm_offset=1.0, qk_norm="head", local_rope_base=100.0,
                        rope_scaling=("linear", 4.0), attn_window=(4, 0, 4), n_layers=3, query_scale_dim=8,
                        head_size=8, embed_scale=4.0, n_kv_heads=1, activation="geglu"),
    "no_rope_layer_llama3": dict(rope_off_layers=(1,), rope_scaling=("llama3", 8.0, 1.0, 4.0, 64), head_size=8,
                                 n_layers=3, activation="swiglu"),  # SmolLM3's layer without rotary
    "unscaled_capped_layernorm_qk": dict(attn_scale="none", attn_softcap=5.0, qk_norm="head", norm_kind="layernorm",
                                         bias=True, rope_fraction=0.5),
    "weightless_qk_norm_gain": dict(qk_norm="head", norm_weight=False, qk_gain=1.2, activation="relu2"),  # nanochat
}


def build(name: str, seed: int = 0) -> DecoderLM:
    """A random model whose attention is far from uniform: N(0, 1/fan_in) matrices (queries and keys at gain 3),
    N(0, 1) embeddings, norms' multipliers around 1 (stored around 0 where the model multiplies by 1 + w)."""
    cfg = ModelConfig(**{**BASE, **CONFIGS[name]})
    torch.manual_seed(seed)
    model = DecoderLM(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1:
                norm_weight = "norm" in pname and pname.endswith("weight")
                p.copy_((1.0 - cfg.norm_offset) + 0.3 * noise if norm_weight else 0.2 * noise)
            elif "emb" in pname:
                p.copy_(noise)
            else:
                p.copy_(noise * (3.0 if "qkv" in pname else 1.0) / math.sqrt(p.shape[1]))
    return model


# --------------------------------------------------------------------------- the float64 path


@dataclass
class Ref:
    xn: np.ndarray  # (T, C)
    q_proj: np.ndarray  # (H, T, hs)
    k_proj: np.ndarray  # (Hkv, T, hs)
    q_rms: np.ndarray | None  # (H, T): the divisor of each query head's norm
    k_rms: np.ndarray | None  # (Hkv, T)
    q_raw: np.ndarray
    k_raw: np.ndarray
    angles: np.ndarray | None  # (T, rd/2)
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray  # (Hkv, T, hs)
    raw: np.ndarray  # (H, T, T)
    scale: float
    capped: np.ndarray  # (H, T, T)
    scores: np.ndarray  # (H, T, T): capped, -inf where masked
    weights: np.ndarray
    values: np.ndarray  # (H, T, hs)
    heads_out: np.ndarray  # (H, T, C)
    attn_out: np.ndarray  # (T, C)
    attn_normed: np.ndarray | None
    after: np.ndarray  # (T, C): the stream after the attention's addition


def _norm(cfg, p: dict, name: str, x: np.ndarray) -> np.ndarray:
    """RMSNorm x / √(mean x² + ε) · (offset + w) (no w for a weightless norm), or LayerNorm, over the last axis."""
    if cfg.norm_kind == "layernorm":
        mu = x.mean(-1, keepdims=True)
        y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + cfg.norm_eps)
        return y * p[f"{name}.weight"] + p.get(f"{name}.bias", 0.0)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps)
    return y * (cfg.norm_offset + p[f"{name}.weight"]) if f"{name}.weight" in p else y


def _divisor(cfg, x: np.ndarray) -> np.ndarray:
    """What the norm divides by, over the last axis: √(mean x² + ε), or √(variance + ε) for LayerNorm."""
    if cfg.norm_kind == "layernorm":
        x = x - x.mean(-1, keepdims=True)
    return np.sqrt((x * x).mean(-1) + cfg.norm_eps)


def _qk_norm(cfg, p: dict, name: str, t: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(heads, T, hs) through the q/k norm (each head alone, or all heads of a position joined), times the gain."""
    if cfg.qk_norm == "none":
        return t, None
    heads, T, hs = t.shape
    if cfg.qk_norm == "head":
        return _norm(cfg, p, name, t) * cfg.qk_gain, _divisor(cfg, t)
    joined = t.transpose(1, 0, 2).reshape(T, heads * hs)  # each position's heads side by side
    normed = _norm(cfg, p, name, joined).reshape(T, heads, hs).transpose(1, 0, 2)
    return normed * cfg.qk_gain, np.repeat(_divisor(cfg, joined)[None], heads, axis=0)


def rope_angles_ref(cfg, layer: int, T: int) -> np.ndarray | None:
    """Position × frequency for this layer: its base (the local one on a windowed layer of a model with one,
    unscaled), the frequency change (linear, or Llama 3's by wavelength); None for a layer that does not rotate."""
    if cfg.pos_encoding != "rope" or layer in cfg.rope_off_layers:
        return None
    local = cfg.local_rope_base is not None and cfg.window(layer) > 0
    rd = cfg.rope_dim
    inv = (cfg.local_rope_base if local else cfg.pe_base) ** (-np.arange(0, rd, 2) / rd)
    scaling = () if local else cfg.rope_scaling
    if scaling and scaling[0] == "linear":
        inv = inv / scaling[1]
    elif scaling:
        f, low, high, n0 = scaling[1:]
        wavelength = 2 * np.pi / inv
        smooth = (n0 / wavelength - low) / (high - low)
        blended = (1 - smooth) * inv / f + smooth * inv
        inv = np.where(wavelength > n0 / low, inv / f, np.where(wavelength < n0 / high, inv, blended))
    return np.arange(T)[:, None] * inv[None, :]


def _rotate(t: np.ndarray, ang: np.ndarray | None) -> np.ndarray:
    if ang is None:
        return t
    rd = 2 * ang.shape[1]
    c, s = np.cos(ang), np.sin(ang)
    out = t.copy()
    x1, x2 = t[..., 0:rd:2], t[..., 1:rd:2]
    out[..., 0:rd:2], out[..., 1:rd:2] = x1 * c - x2 * s, x1 * s + x2 * c
    return out


def reference(model: DecoderLM, layer: int, x: np.ndarray) -> Ref:
    """Layer `layer`'s attention in float64 from its residual input x (T, C), step by step from the formulas."""
    cfg = model.cfg
    p = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    pre, (T, C) = f"blocks.{layer}", x.shape
    H, Hkv, hs = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    xn = _norm(cfg, p, f"{pre}.norm1", x) if cfg.norm in ("pre", "sandwich") else x
    qkv = xn @ p[f"{pre}.attn.qkv.weight"].T + p.get(f"{pre}.attn.qkv.bias", 0.0)
    q_proj = qkv[:, : H * hs].reshape(T, H, hs).transpose(1, 0, 2)
    k_proj = qkv[:, H * hs : (H + Hkv) * hs].reshape(T, Hkv, hs).transpose(1, 0, 2)
    v = qkv[:, (H + Hkv) * hs :].reshape(T, Hkv, hs).transpose(1, 0, 2)
    q_raw, q_rms = _qk_norm(cfg, p, f"{pre}.attn.q_norm", q_proj)
    k_raw, k_rms = _qk_norm(cfg, p, f"{pre}.attn.k_norm", k_proj)
    ang = rope_angles_ref(cfg, layer, T)
    q, k = _rotate(q_raw, ang), _rotate(k_raw, ang)
    group = H // Hkv
    raw = np.stack([q[h] @ k[h // group].T for h in range(H)])
    scale = 1.0 if cfg.attn_scale == "none" else 1.0 / math.sqrt(cfg.query_scale_dim or hs)
    c = cfg.attn_softcap
    capped = raw * scale if c is None else c * np.tanh(raw * scale / c)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = (j <= i) & ((j > i - cfg.window(layer)) if cfg.window(layer) else True)
    scores = np.where(allowed, capped, -np.inf)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    weights = e / e.sum(-1, keepdims=True)
    values = np.stack([weights[h] @ v[h // group] for h in range(H)])
    w_o = p[f"{pre}.attn.proj.weight"]  # (C, H hs)
    heads_out = np.stack([values[h] @ w_o[:, h * hs : (h + 1) * hs].T for h in range(H)])
    attn_out = heads_out.sum(0) + p.get(f"{pre}.attn.proj.bias", 0.0)
    normed = _norm(cfg, p, f"{pre}.post_norm1", attn_out) if cfg.norm in ("sandwich", "post_branch") else None
    after = x + (attn_out if normed is None else normed)
    return Ref(xn, q_proj, k_proj, q_rms, k_rms, q_raw, k_raw, ang, q, k, v, raw, scale, capped, scores, weights,
               values, heads_out, attn_out, normed, after)


# --------------------------------------------------------------------------- checks


def close(got, want, what: str, rel: float = REL) -> None:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.array_equal(np.isneginf(got), np.isneginf(want)), f"{what}: masked entries differ"
    g, w = np.where(np.isinf(got), 0.0, got), np.where(np.isinf(want), 0.0, want)
    bound = rel * max(1.0, float(np.abs(w).max(initial=0.0)))
    diff = float(np.abs(g - w).max(initial=0.0))
    assert diff <= bound, f"{what}: differs by {diff:.3g} (allowed {bound:.3g})"


def check_norm_step(model, c, r: Ref, layer: int, head: int) -> None:
    """The q/k norm worked through: its rms, the weight of this head's dimensions, and q_raw from them."""
    cfg, g, hs = model.cfg, c.kv_head, model.cfg.head_dim
    if cfg.qk_norm == "none":
        assert c.q_norm is None and c.k_norm is None and c.qk_norm == "none"
        assert np.array_equal(c.q_proj, c.q_raw) and np.array_equal(c.k_proj, c.k_raw)
        return
    attn = model.blocks[layer].attn
    for step, norm, index, rms, proj, normed, heads in (
            (c.q_norm, attn.q_norm, head, r.q_rms[head, c.query], c.q_proj, c.q_raw, cfg.n_heads),
            (c.k_norm, attn.k_norm, g, r.k_rms[g, c.key], c.k_proj, c.k_raw, cfg.kv_heads)):
        at = slice(0, hs) if cfg.qk_norm == "head" else slice(index * hs, (index + 1) * hs)
        assert step.over == cfg.qk_norm and step.width == (hs if cfg.qk_norm == "head" else heads * hs)
        assert step.offset == cfg.norm_offset and step.gain == cfg.qk_gain and step.kind == cfg.norm_kind
        close(step.rms, rms, "the q/k norm's rms")
        if norm.weight is None:
            assert step.weight is None
        else:
            assert np.array_equal(step.weight, norm.weight.detach().double().numpy()[at])
        mult = 1.0 if step.weight is None else step.offset + step.weight
        centred = proj - (step.mean or 0.0)
        bias = 0.0 if step.bias is None else step.bias
        close((centred / step.rms * mult + bias) * step.gain, normed, "the normed vector from the shown numbers")


def check_cell(model, c, r: Ref, x: np.ndarray, fwd, layer: int, head: int, i: int, j: int) -> None:
    cfg, g = model.cfg, c.kv_head
    want = {"x_i": x[i], "x_j": x[j], "xn_i": r.xn[i], "xn_j": r.xn[j], "q_proj": r.q_proj[head, i],
            "k_proj": r.k_proj[g, j], "q_raw": r.q_raw[head, i], "k_raw": r.k_raw[g, j], "q": r.q[head, i],
            "k": r.k[g, j], "products": r.q[head, i] * r.k[g, j], "scores_row": r.scores[head, i],
            "softmax_row": r.weights[head, i], "used_row": r.weights[head, i], "v": r.v[g],
            "weighted": r.values[head, i], "head_value": r.values[head, i], "head_out": r.heads_out[head, i],
            "heads_out": r.heads_out[:, i], "attn_out": r.attn_out[i], "residual_after": r.after[i]}
    for name, value in want.items():
        close(getattr(c, name), value, f"L{layer}H{head} ({i}, {j}) {name}")
    for name, value in (("dot", r.raw[head, i, j]), ("score", r.raw[head, i, j] * r.scale),
                        ("capped", r.capped[head, i, j]), ("weight", r.weights[head, i, j])):
        close(getattr(c, name), value, name)
    assert c.scale == pytest.approx(r.scale, rel=1e-12) and c.softcap == cfg.attn_softcap
    assert c.scale_dim == (None if cfg.attn_scale == "none" else cfg.query_scale_dim or cfg.head_dim)
    if cfg.attn_softcap is None:
        assert c.capped == c.score
    if r.attn_normed is None:
        assert c.attn_normed is None
    else:
        close(c.attn_normed, r.attn_normed[i], "post_norm1(attn_out)")
    check_norm_step(model, c, r, layer, head)
    assert c.rotary == (r.angles is not None) and c.rope_base == cfg.rope_base(layer)
    assert c.rope_local == bool(cfg.local_rope_base and cfg.window(layer) and r.angles is not None)
    if r.angles is None:
        assert c.rope_cos_i is None and np.array_equal(c.q, c.q_raw)
    else:
        close(c.rope_cos_i, np.cos(r.angles[i]), "cos of the query's angles")
        close(c.rope_sin_j, np.sin(r.angles[j]), "sin of the key's angles")
    # the forward's own numbers: its weights and capped, masked scores, and its residual input
    # a cell from the cache is a one-row product, the forward's a whole-text one: float32 sums of hs terms in
    # another order (after a q/k norm over every head, of H * hs squares), a few units of 1e-7 each
    close(c.softmax_row, fwd.attentions[layer][0, head, i].double().numpy(), "the forward's weights", FORWARD_TOL * 10)
    close(c.scores_row, fwd.scores[layer][0, head, i].double().numpy(), "the forward's scores", FORWARD_TOL * 10)
    close(c.x_i, fwd.residuals[layer][0, i].double().numpy(), "the forward's residual input", FORWARD_TOL * 10)


def after_attention(model: DecoderLM, ids) -> list[np.ndarray]:
    """The stream each block's MLP branch starts from (what its norm2 reads): the stream after the attention's
    addition, as the forward computed it (Block.rest)."""
    seen, handles = [], []
    for block in model.blocks:
        handles.append(block.norm2.register_forward_pre_hook(lambda m, a: seen.append(a[0][0].double().numpy())))
    try:
        run_forward(model, ids)
    finally:
        for h in handles:
            h.remove()
    return seen


def cells(T: int, weights: np.ndarray) -> list[tuple[int, int]]:
    """The query's strongest key, the first key (outside a window), a key after its query, one on the diagonal."""
    return sorted({(T - 1, int(np.argmax(weights[T - 1]))), (T - 1, 0), (3, 7), (5, 5)})


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_worked_number_against_the_float64_path_and_the_forward(name):
    model = build(name)
    cfg, T = model.cfg, len(IDS)
    fwd = run_forward(model, IDS)
    after = after_attention(model, IDS)
    emb = model.tok_emb.weight.detach().double().numpy()[IDS] * cfg.embed_scale
    close(fwd.residuals[0][0].double().numpy(), emb, "the embedding times embed_scale")
    for layer in range(cfg.n_layers):
        x = fwd.residuals[layer][0].double().numpy()
        r = reference(model, layer, x)
        close(r.after, after[layer], "the float64 stream after the attention against the forward's")
        for head in range(cfg.n_heads):
            for i, j in cells(T, r.weights[head]):
                c = inside_cell(model, IDS, layer, head, i, j, forward=fwd)
                check_cell(model, c, r, x, fwd, layer, head, i, j)
                close(c.residual_after, after[layer][i], "residual_after against the forward's", FORWARD_TOL * 10)
            w = inside_head(model, IDS, layer, head, forward=fwd)
            g = w.kv_head
            for attr, want in (("q_proj", r.q_proj[head]), ("k_proj", r.k_proj[g]), ("q_raw", r.q_raw[head]),
                               ("q", r.q[head]), ("k", r.k[g]), ("raw", r.raw[head]),
                               ("scaled", r.raw[head] * r.scale), ("capped", r.capped[head]),
                               ("masked", r.scores[head]), ("weights", r.weights[head])):
                close(getattr(w, attr), want, f"head L{layer}H{head} {attr}")
            assert w.softcap == cfg.attn_softcap and w.rotary == (r.angles is not None)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cells_from_the_decoders_cache(name):
    """A text as the app holds it (the last token through the key/value cache): each layer's rows carried up
    from the cache, the q/k norm of the query's and the key's own rows, against the float64 path."""
    model = build(name, seed=1)
    dec = Decoder(model, IDS[:-1], Sampling(temperature=0.0))
    dec.step()
    ids, T = dec.ids, len(dec.ids)
    fwd = run_forward(model, ids)
    for layer in range(model.cfg.n_layers):
        x = fwd.residuals[layer][0].double().numpy()
        r = reference(model, layer, x)
        for head in range(model.cfg.n_heads):
            for i, j in cells(T, r.weights[head]):
                c = inside_cell(model, ids, layer, head, i, j, cache=dec.cache, attention=dec.attention)
                check_cell(model, c, r, x, fwd, layer, head, i, j)


def test_the_options_change_the_numbers_they_should():
    """Each step shown matters: the sandwich's post_norm1 is not the sum itself, the cap changed the scores,
    the no-rope layer left q as normed, the local layer turns by its own base, the scale is the model's own."""
    gemma = build("gemma3_like")
    local, glob = inside_cell(gemma, IDS, 0, 1, 9, 7), inside_cell(gemma, IDS, 1, 1, 9, 7)
    assert local.rope_local and local.rope_base == 100.0 and local.rope_scaling == ()
    assert not glob.rope_local and glob.rope_base == 10000.0 and glob.rope_scaling == ("linear", 4.0)
    assert local.rope_cos_i[0] == pytest.approx(math.cos(9.0)) and glob.rope_cos_i[0] == pytest.approx(math.cos(9 / 4))
    assert local.scale == pytest.approx(1 / math.sqrt(8)) and local.scale_dim == 8
    assert not np.allclose(local.residual_after, local.x_i + local.attn_out)
    capped = inside_cell(build("gemma2_like"), IDS, 1, 0, 9, 2)
    assert capped.scale_dim == 12 and abs(capped.capped) < 3.0
    assert capped.capped == pytest.approx(3.0 * math.tanh(capped.score / 3.0), rel=1e-5)
    nope = build("no_rope_layer_llama3")
    assert not inside_cell(nope, IDS, 1, 0, 9, 2).rotary and inside_cell(nope, IDS, 2, 0, 9, 2).rotary
    wide = inside_cell(build("head_size_gqa"), IDS, 1, 3, 9, 2)
    assert wide.head_dim == 6 and wide.q.shape == (6,) and wide.w_o.shape == (16, 6) and wide.kv_head == 1
    whole = inside_cell(build("qk_norm_whole_post_branch"), IDS, 0, 2, 9, 2)
    assert whole.q_norm.width == 16 and whole.k_norm.width == 8 and np.array_equal(whole.xn_i, whole.x_i)
