"""A float64 forward written out from the weights, with activation patching done by hand: the reference
the patching tests hold the engine's `patch=` argument and the lab's sweeps to.

Nothing here calls the engine's forward, blocks, attention or patch code: every step (positions, rotary,
norms, q/k/v, grouped keys, masks and local windows, softmax, heads, projections, feed-forward, residual
order, final norm, head) is computed from the model's parameters in float64. `reference` returns the
logits and every activation a patch may replace (by hand, as plain dicts), and replaces the ones a
`sites` list names with those of another reference run.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Small float64 products on one thread: on a loaded machine a second thread's wait costs more than it gives.
    A test module that imports this fixture runs on one thread."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _norm(cfg, module, x):
    """The block's or the final norm, by hand (Identity when the model has none)."""
    if cfg.norm == "none" or not hasattr(module, "weight"):
        return x
    w = module.weight.double()
    if cfg.norm_kind == "rmsnorm":
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps) * w
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + cfg.norm_eps) * w
    return y + module.bias.double() if getattr(module, "bias", None) is not None else y


def _linear(layer, x):
    y = x @ layer.weight.double().T
    return y + layer.bias.double() if layer.bias is not None else y


def _rotate(cfg, t):
    """RoPE on (T, hs): pairs (2i, 2i+1) of the first rope_dim dimensions turn by p * base^(-2i/rope_dim)."""
    T, rd = t.shape[0], cfg.rope_dim
    angle = torch.arange(T, dtype=torch.float64)[:, None] * cfg.pe_base ** (
        -torch.arange(0, rd, 2, dtype=torch.float64) / rd)  # (T, rd/2)
    c, s = torch.cos(angle), torch.sin(angle)
    x1, x2 = t[:, 0:rd:2], t[:, 1:rd:2]
    out = t.clone()
    out[:, 0:rd:2], out[:, 1:rd:2] = x1 * c - x2 * s, x1 * s + x2 * c
    return out


def _act(cfg, h):
    if cfg.activation == "swiglu":
        gate, value = h.chunk(2, dim=-1)
        return gate * torch.sigmoid(gate) * value
    if cfg.activation == "relu":
        return torch.relu(h)
    if cfg.gelu_approximate == "tanh":
        return 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    return 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))


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


@torch.no_grad()
def reference(model, ids, sites=(), source=None):
    """Float64 forward of one text `ids` (a list): (logits (T, V), activations).

    activations: {"head": [layer][head] (T, hs), "attn": [layer] (T, C), "mlp": [layer] (T, C) or None,
    "resid": [index] (T, C), index 0 the embedding, l + 1 after block l}. `sites`: (kind, layer, head or
    None, positions or None) tuples, replaced with `source`'s (another reference run's activations).
    """
    cfg = model.cfg
    T, H, Hkv, hs = len(ids), cfg.n_heads, cfg.kv_heads, cfg.head_dim
    x = model.tok_emb.weight.double()[ids]
    if cfg.pos_encoding == "learned":
        x = x + model.pos_emb.weight.double()[:T]
    elif cfg.pos_encoding == "sinusoidal":
        pos = torch.arange(T, dtype=torch.float64)[:, None]
        angle = pos / cfg.pe_base ** (torch.arange(0, cfg.d_model, 2, dtype=torch.float64) / cfg.d_model)
        table = torch.zeros(T, cfg.d_model, dtype=torch.float64)
        table[:, 0::2], table[:, 1::2] = torch.sin(angle), torch.cos(angle)
        x = x + table.float().double()  # the engine keeps its table in float32
    acts = {"head": [], "attn": [], "mlp": [], "resid": []}
    x = _swap(x, "resid", 0, sites, source)
    acts["resid"].append(x)
    for layer, blk in enumerate(model.blocks):
        att = blk.attn

        def attention(inp):
            qkv = _linear(att.qkv, inp)
            q_all, k_all, v_all = qkv.split((H * hs, Hkv * hs, Hkv * hs), dim=-1)
            heads = []
            for h in range(H):
                g = h // (H // Hkv)  # the key/value head this query head reads
                q, k = q_all[:, h * hs : (h + 1) * hs], k_all[:, g * hs : (g + 1) * hs]
                v = v_all[:, g * hs : (g + 1) * hs]
                if cfg.pos_encoding == "rope":
                    q, k = _rotate(cfg, q), _rotate(cfg, k)
                s = q @ k.T
                if cfg.attn_scale == "inverse_sqrt":
                    s = s / math.sqrt(hs)
                if cfg.mask == "causal":  # key j after query i, or (a local layer) w or more before it
                    w, i, j = cfg.window(layer), torch.arange(T)[:, None], torch.arange(T)[None, :]
                    s = s.masked_fill((j > i) | ((j <= i - w) if w else torch.zeros_like(j > i)), float("-inf"))
                o = torch.softmax(s, dim=-1) @ v  # (T, hs): this head's output before W_O
                heads.append(_swap(o, "head", layer, sites, source, head=h))
            acts["head"].append(heads)
            y = torch.cat(heads, dim=-1)
            y = _linear(att.proj, y) if att.proj is not None else y
            y = _swap(y, "attn", layer, sites, source)
            acts["attn"].append(y)
            return y

        def mlp(inp):
            if blk.ffn is None:
                acts["mlp"].append(None)
                return 0.0
            m = _linear(blk.ffn.down, _act(cfg, _linear(blk.ffn.up, inp)))
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
        else:
            x = x + attention(_norm(cfg, blk.norm1, x))
            x = x + mlp(_norm(cfg, blk.norm2, x))
        x = _swap(x, "resid", layer + 1, sites, source)
        acts["resid"].append(x)
    final = _norm(cfg, model.norm_f, x) if cfg.norm == "pre" else x
    logits = final @ model.head.weight.double().T
    if model.head.bias is not None:
        logits = logits + model.head.bias.double()
    return logits, acts


def metric_of(logits_last: torch.Tensor, kind: str, answer: int, other: int | None, n_used: int) -> float:
    """The lab's metric on a float64 (V,) row: logit difference, or softmax probability over the used rows."""
    z = logits_last[:n_used]
    if kind == "prob":
        return float(F.softmax(z, dim=-1)[answer])
    return float(z[answer] - z[other])


# Small random folders of the real families (transformers' own classes, saved with save_pretrained beside a
# byte-level BPE tokenizer), one per layout the engine imports: GPT-2, GPT-NeoX (partial rotary, parallel
# residual), Llama (RMSNorm, SwiGLU, grouped keys), GPT-Neo (a local layer, unscaled scores).
FAMILIES = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=16, n_layer=2, n_head=4, n_positions=40)),
    "neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                         intermediate_size=48, rotary_pct=0.25,
                                                         max_position_embeddings=40)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=6,
                                                      num_key_value_heads=2, intermediate_size=40,
                                                      max_position_embeddings=40)),
    "neo": ("GPTNeoConfig", "GPTNeoForCausalLM", dict(hidden_size=16, num_layers=2, num_heads=4, window_size=3,
                                                      attention_types=[[["global", "local"], 1]],
                                                      max_position_embeddings=40)),
}
FAMILY_VOCAB = 300


def family_folder(name: str, folder):
    """A random model of family `name` saved in `folder / name`; returns the folder (open it with
    model.families.open_folder)."""
    import transformers

    from tests.support.families import save_reference, sharpen

    config_cls, model_cls, options = FAMILIES[name]
    cfg = getattr(transformers, config_cls)(vocab_size=FAMILY_VOCAB, bos_token_id=1, eos_token_id=0,
                                            attn_implementation="eager", **options)
    torch.manual_seed(0)
    ref = getattr(transformers, model_cls)(cfg).eval()
    sharpen(ref, seed=len(name), conv1d=name == "gpt2")
    return save_reference(ref, folder / name, FAMILY_VOCAB)
