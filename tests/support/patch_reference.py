"""A float64 forward written out from the weights, with activation patching done by hand: the reference
the patching tests hold the engine's `patch=` argument and the lab's sweeps to.

Nothing here calls the engine's forward, blocks, attention or patch code: every step (positions and the
embedding's scale, each layer's rotary (its base and frequency change, recomputed by
tests/support/inside_ref.rope_angles; none on a NoPE layer), norms (RMSNorm times offset + w), q/k/v and
the q/k norms, grouped keys, the score scale, soft-caps, masks and local windows, softmax, heads,
projections, feed-forward (GELU, ReLU, ReLU², SwiGLU, GeGLU), residual order (pre, post, parallel,
sandwich, post_branch), final norm, head, the logits' cap) is computed from the model's parameters in
float64. `reference` returns the logits and every activation a patch may replace (by hand, as plain dicts),
and replaces the ones a `sites` list names with those of another reference run. nanochat's own options are
not written out (inside_ref refuses a model with one).

The random family folders the patching tests open live in tests/support/family_folders.py (re-exported).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.support.family_folders import FAMILIES, FAMILY_VOCAB, family_folder  # noqa: F401 (re-exported)
from tests.support.inside_ref import refuse_unwritten, rope_angles


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Small float64 products on one thread: on a loaded machine a second thread's wait costs more than it gives.
    A test module that imports this fixture runs on one thread."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _norm(cfg, module, x):
    """A block's, the final or a q/k norm, by hand (Identity, which has no weight, where the model has none)."""
    if module is None or not hasattr(module, "weight"):
        return x
    w = None if module.weight is None else module.weight.double()  # None: a parameter-free RMSNorm
    if cfg.norm_kind == "rmsnorm":
        normed = x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps)
        return normed if w is None else normed * (cfg.norm_offset + w)  # Gemma stores w, multiplies by 1 + w
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + cfg.norm_eps) * w
    return y + module.bias.double() if getattr(module, "bias", None) is not None else y


def _linear(layer, x):
    y = x @ layer.weight.double().T
    return y + layer.bias.double() if layer.bias is not None else y


def _rotate(cfg, t, angle):
    """RoPE on (T, hs): pairs (2i, 2i+1) of the first rope_dim dimensions turn by `angle` (T, rd/2), the
    layer's own (inside_ref.rope_angles: p times each pair's frequency)."""
    rd = cfg.rope_dim
    c, s = torch.cos(angle), torch.sin(angle)
    x1, x2 = t[:, 0:rd:2], t[:, 1:rd:2]
    out = t.clone()
    out[:, 0:rd:2], out[:, 1:rd:2] = x1 * c - x2 * s, x1 * s + x2 * c
    return out


def _gelu(cfg, h):
    if cfg.gelu_approximate == "tanh":
        return 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    return 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))


def _act(cfg, h):
    if cfg.activation in ("swiglu", "geglu"):  # the gate's rows, then the value's
        gate, value = h.chunk(2, dim=-1)
        return (gate * torch.sigmoid(gate) if cfg.activation == "swiglu" else _gelu(cfg, gate)) * value
    if cfg.activation == "relu":
        return torch.relu(h)
    if cfg.activation == "relu2":
        return torch.relu(h) ** 2
    return _gelu(cfg, h)


def _cap(x, cap):
    """cap · tanh(x / cap) (Gemma 2's soft-cap); x itself without a cap."""
    return x if cap is None else cap * torch.tanh(x / cap)


def _swap(x, kind, layer, sites, source, head=None):
    """x with the positions `sites` name for (kind, layer[, head]) taken from `source`."""
    for s in sites:
        if s[0] != kind or s[1] != layer or (kind == "head" and s[2] != head):
            continue
        positions = s[3] if s[3] is not None else range(x.shape[0])
        x = x.clone()
        src = source[kind][layer] if kind != "head" else source["head"][layer][head]
        for p in positions:
            x[p] = src[p]
    return x


def _embed(model, ids):
    """The stream before the first block (T, C): token embeddings times embed_scale, plus learned or
    sinusoidal positions."""
    cfg, T = model.cfg, len(ids)
    x = model.tok_emb.weight.double()[ids] * cfg.embed_scale  # Gemma: times sqrt(d_model)
    if cfg.pos_encoding == "learned":
        x = x + model.pos_emb.weight.double()[:T]
    elif cfg.pos_encoding == "sinusoidal":
        pos = torch.arange(T, dtype=torch.float64)[:, None]
        angle = pos / cfg.pe_base ** (torch.arange(0, cfg.d_model, 2, dtype=torch.float64) / cfg.d_model)
        table = torch.zeros(T, cfg.d_model, dtype=torch.float64)
        table[:, 0::2], table[:, 1::2] = torch.sin(angle), torch.cos(angle)
        x = x + table.float().double()  # the engine keeps its table in float32
    return x


def _scores(cfg, layer, q, k, angle):
    """One head's scores (T, T) from its normed queries and keys (T, hs): the layer's rotary (angle None: none),
    q · k, the scale (1/sqrt(query_scale_dim or hs), or none), the soft-cap, then the mask."""
    if angle is not None:
        q, k = _rotate(cfg, q, angle), _rotate(cfg, k, angle)
    s = q @ k.T
    if cfg.attn_scale == "inverse_sqrt":
        s = s / math.sqrt(cfg.query_scale_dim or cfg.head_dim)
    s = _cap(s, cfg.attn_softcap)  # before the mask
    if cfg.mask == "causal":  # key j after query i, or (a local layer) w or more before it
        T = s.shape[0]
        w, i, j = cfg.window(layer), torch.arange(T)[:, None], torch.arange(T)[None, :]
        s = s.masked_fill((j > i) | ((j <= i - w) if w else torch.zeros_like(j > i)), float("-inf"))
    return s


@torch.no_grad()
def reference(model, ids, sites=(), source=None):
    """Float64 forward of one text `ids` (a list): (logits (T, V), activations).

    activations: {"head": [layer][head] (T, hs), "attn": [layer] (T, C), "mlp": [layer] (T, C) or None,
    "resid": [index] (T, C), index 0 the embedding, l + 1 after block l}. `sites`: (kind, layer, head or
    None, positions or None) tuples, replaced with `source`'s (another reference run's activations).
    """
    cfg = model.cfg
    refuse_unwritten(cfg)
    T, H, Hkv, hs = len(ids), cfg.n_heads, cfg.kv_heads, cfg.head_dim
    acts = {"head": [], "attn": [], "mlp": [], "resid": []}
    x = _swap(_embed(model, ids), "resid", 0, sites, source)
    acts["resid"].append(x)
    for layer, blk in enumerate(model.blocks):
        att = blk.attn
        angle = rope_angles(cfg, layer, range(T))  # None: this layer does not rotate
        angle = None if angle is None else torch.from_numpy(angle)

        def attention(inp, post=None):
            qkv = _linear(att.qkv, inp)
            q_all, k_all, v_all = qkv.split((H * hs, Hkv * hs, Hkv * hs), dim=-1)
            if cfg.qk_norm == "whole":  # OLMo 2: every head of a position normed together
                q_all, k_all = _norm(cfg, att.q_norm, q_all), _norm(cfg, att.k_norm, k_all)
            heads = []
            for h in range(H):
                g = h // (H // Hkv)  # the key/value head this query head reads
                q, k = q_all[:, h * hs : (h + 1) * hs], k_all[:, g * hs : (g + 1) * hs]
                v = v_all[:, g * hs : (g + 1) * hs]
                if cfg.qk_norm == "head":  # Qwen3, Gemma 3: each head's vector on its own, one weight for all
                    q, k = _norm(cfg, att.q_norm, q), _norm(cfg, att.k_norm, k)
                o = torch.softmax(_scores(cfg, layer, q, k, angle), dim=-1) @ v  # (T, hs): the head's output before W_O
                heads.append(_swap(o, "head", layer, sites, source, head=h))
            acts["head"].append(heads)
            y = torch.cat(heads, dim=-1)
            y = _linear(att.proj, y) if att.proj is not None else y
            y = _norm(cfg, post, y)  # the branch's own norm, where the model has one: the "attn" site is after it
            y = _swap(y, "attn", layer, sites, source)
            acts["attn"].append(y)
            return y

        def mlp(inp, post=None):
            if blk.ffn is None:
                acts["mlp"].append(None)
                return 0.0
            m = _linear(blk.ffn.down, _act(cfg, _linear(blk.ffn.up, inp)))
            m = _norm(cfg, post, m)
            m = _swap(m, "mlp", layer, sites, source)
            acts["mlp"].append(m)
            return m

        if cfg.parallel_residual:
            a = attention(_norm(cfg, blk.norm1, x))
            x = mlp(_norm(cfg, blk.norm2, x)) + a + x
        elif cfg.norm == "post":
            x = _norm(cfg, blk.norm1, x + attention(x))
            if blk.ffn is not None:
                x = _norm(cfg, blk.norm2, x + mlp(x))
            else:
                mlp(x)
        elif cfg.norm in ("sandwich", "post_branch"):  # each branch's output normed before it joins the stream
            reads = cfg.norm == "sandwich"  # OLMo 2's branches read x itself
            x = x + attention(_norm(cfg, blk.norm1, x) if reads else x, blk.post_norm1)
            x = x + mlp(_norm(cfg, blk.norm2, x) if reads else x, getattr(blk, "post_norm2", None))
        else:  # pre-norm, or no norm at all (Identity norms)
            x = x + attention(_norm(cfg, blk.norm1, x))
            x = x + mlp(_norm(cfg, blk.norm2, x))
        x = _swap(x, "resid", layer + 1, sites, source)
        acts["resid"].append(x)
    final = _norm(cfg, model.norm_f, x) if cfg.norm in ("pre", "sandwich", "post_branch") else x
    logits = final @ model.head.weight.double().T
    if model.head.bias is not None:
        logits = logits + model.head.bias.double()
    return _cap(logits, cfg.logit_softcap), acts


def metric_of(logits_last: torch.Tensor, kind: str, answer: int, other: int | None, n_used: int) -> float:
    """The lab's metric on a float64 (V,) row: logit difference, or softmax probability over the used rows."""
    z = logits_last[:n_used]
    if kind == "prob":
        return float(F.softmax(z, dim=-1)[answer])
    return float(z[answer] - z[other])
