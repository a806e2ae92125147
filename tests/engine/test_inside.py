"""model.inside against an independent float64 path (tests/support/inside_ref.py) and the engine's forward.

Every number of a cell (x_i to the residual) and of a head (Q, K, V, QKᵀ raw / scaled / masked, softmax,
the rows used, value-weighted attention) is recomputed from the weights in numpy float64; the head's
output and the attention sublayer's output are held to what the engine's own forward produced (1e-6),
read where the forward passes them on (the input and output of the layer's output projection).
Covered: the built-ins, every positional encoding, norm placement and kind, GELU kind, unscaled
attention, a local window, grouped key/value heads, partial rotary, parallel residual, no output
projection, a bidirectional mask, the 2024-26 families' options (heads wider than d / heads, q/k norms per
head and over the whole projection, RMSNorm times 1 + w, the query_pre_attn_scalar scale, soft-capped
scores and logits, the embedding's scale, sandwich and post-branch norms, GeGLU and ReLU², a rotary base
for local layers, linear and llama3 frequency changes, a layer without rotary), the imported families
(every one of tests/support/family_folders.py), and ablated / edited heads.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lab.catalogue.models import BUILTINS
from model.config import ModelConfig
from model.generate import Decoder, Sampling
from model.inside import RebuildMismatch, inside_cell, inside_head, layer_inputs, run_forward, value_weighted
from model.interventions import AttentionEdit, Intervention
from model.transformer import DecoderLM
from tests.support.family_folders import NEWER, family_folder
from tests.support.inside_ref import reference

ENGINE_TOL = 1e-6  # the head's output against the engine's forward (float32 against float32)
VOCAB = 23
IDS = [3, 7, 1, 12, 7, 3, 19, 4, 7, 11]


REL = {"": 2e-5}  # float32 against float64, relative; a model without a norm amplifies it (set per test)


def close(got, want, what: str, rel: float | None = None) -> None:
    """float32 arithmetic against float64: within rel of the largest magnitude involved (and -inf alike)."""
    rel = REL[""] if rel is None else rel
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.array_equal(np.isneginf(got), np.isneginf(want)), f"{what}: masked entries differ"
    g, w = np.where(np.isinf(got), 0.0, got), np.where(np.isinf(want), 0.0, want)
    bound = rel * max(1.0, float(np.abs(w).max(initial=0.0)))
    diff = float(np.abs(g - w).max(initial=0.0))
    assert diff <= bound, f"{what}: differs by {diff:.3g} (allowed {bound:.3g})"


def engine_outputs(model: DecoderLM, ids, intervention) -> tuple[list, list]:
    """What the engine's forward passed on in each layer: the heads' concatenated outputs (the output
    projection's input) and the attention sublayer's output, read by forward hooks on this test's model."""
    heads, outs, handles = [], [], []
    for block in model.blocks:
        attn = block.attn
        if attn.proj is not None:
            handles.append(attn.proj.register_forward_pre_hook(lambda m, a: heads.append(a[0][0].clone())))
        else:
            handles.append(attn.register_forward_hook(lambda m, a, o: heads.append(o[0][0].clone())))
        handles.append(attn.register_forward_hook(lambda m, a, o: outs.append(o[0][0].clone())))
    try:
        run_forward(model, ids, intervention)
    finally:
        for h in handles:
            h.remove()
    return heads, outs


def check_model(model: DecoderLM, ids, intervention=None, cells_per_head: int = 3) -> None:
    """Every layer and head of `model` on `ids`: cells and matrices against the float64 path, the head
    outputs against the engine's forward."""
    model.eval()
    cfg = model.cfg
    T, hs = len(ids), cfg.head_dim
    ref = reference(model, ids, intervention)
    heads_engine, outs_engine = engine_outputs(model, ids, intervention)
    fwd = run_forward(model, ids, intervention)
    rng = np.random.default_rng(T)
    for layer, r in enumerate(ref):
        close(value_weighted(model, ids, layer, intervention, forward=fwd), vw_ref(model, layer, r), "value-weighted")
        for head in range(cfg.n_heads):
            check_head(inside_head(model, ids, layer, head, intervention, forward=fwd), r, head)
            cells = {(T - 1, int(np.argmax(r.used[head, T - 1]))), (T - 1, 0), (0, T - 1)}
            cells |= {(int(rng.integers(T)), int(rng.integers(T))) for _ in range(cells_per_head)}
            for query, key in sorted(cells):
                c = inside_cell(model, ids, layer, head, query, key, intervention, forward=fwd)
                check_cell(c, r, head, query, key)
                # the head's output and the sublayer's output are what the engine's forward passed on
                engine_head = heads_engine[layer][query, head * hs:(head + 1) * hs].double().numpy()
                assert np.abs(c.head_value - engine_head).max() <= ENGINE_TOL * max(1.0, np.abs(engine_head).max())
                engine_out = outs_engine[layer][query].double().numpy()
                assert np.abs(c.attn_out - engine_out).max() <= ENGINE_TOL * max(1.0, np.abs(engine_out).max())
    if intervention is None and cfg.mask == "causal":
        check_cached(model, ids)


def check_cached(model: DecoderLM, ids) -> None:
    """A text as the app holds it (its last token generated through the key/value cache): each cell from
    the decoder's cache, running only the query's and the key's tokens, against the float64 path."""
    dec = Decoder(model, ids[:-1], Sampling(temperature=0.0))
    dec.step()
    T = len(dec.ids)
    first = layer_inputs(model, dec.ids, 0, dec.cache, dec.attention)  # carried in two goes: the same
    inputs = layer_inputs(model, dec.ids, model.cfg.n_layers - 1, dec.cache, dec.attention, known=first)
    for layer, r in enumerate(reference(model, dec.ids)):
        close(inputs[layer].double().numpy(), r.x, "layer input carried up from the cache")
        c = inside_cell(model, dec.ids, layer, 0, T - 1, 1, cache=dec.cache, attention=dec.attention, inputs=inputs)
        check_cell(c, r, 0, T - 1, 1)
        vw = value_weighted(model, dec.ids, layer, cache=dec.cache, attention=dec.attention)
        close(vw, vw_ref(model, layer, r), "value-weighted from the cache")
        for head in range(model.cfg.n_heads):
            check_head(inside_head(model, dec.ids, layer, head, cache=dec.cache, attention=dec.attention), r, head)
            for query, key in ((T - 1, int(np.argmax(r.used[head, T - 1]))), (T - 1, 0), (3, T - 1), (0, 0)):
                c = inside_cell(model, dec.ids, layer, head, query, key, cache=dec.cache, attention=dec.attention)
                check_cell(c, r, head, query, key)


def vw_ref(model, layer: int, r) -> np.ndarray:
    """‖a_ij v_j W_O,h‖ from the float64 path: each key's vector through the head's columns, times its share."""
    cfg = model.cfg
    hs = cfg.head_dim
    proj = model.blocks[layer].attn.proj
    out = np.zeros_like(r.used)
    for h in range(cfg.n_heads):
        vo = r.v[h] if proj is None else r.v[h] @ proj.weight.detach().double().numpy()[:, h * hs:(h + 1) * hs].T
        out[h] = r.used[h] * np.linalg.norm(vo, axis=-1)[None, :]
        if not np.allclose(r.values[h], r.used[h] @ r.v[h]):  # an ablated head: zeroed, or its mean over queries
            out[h] = 0.0 if not r.values[h].any() else out[h].mean(0, keepdims=True)
    return out


def check_head(w, r, head: int) -> None:
    for name, want in (("q_proj", r.q_proj[head]), ("k_proj", r.k_proj[head]), ("q_raw", r.q_raw[head]),
                       ("k_raw", r.k_raw[head]), ("q", r.q[head]), ("k", r.k[head]), ("v", r.v[head]),
                       ("raw", r.raw[head]), ("scaled", r.raw[head] * r.scale), ("capped", r.capped[head]),
                       ("masked", r.scores[head])):
        close(getattr(w, name), want, f"head {head} {name}")
    # a softmax passes its scores' absolute error on to the weights (times at most 1/4): the weights' bound
    # is the scores' (large without a norm: 2.9e-5 on an AMD EPYC with scores near 3)
    finite = r.scores[head][np.isfinite(r.scores[head])]
    rel = REL[""] * max(1.0, float(np.abs(finite).max(initial=0.0)))
    for name, want in (("weights", r.weights[head]), ("used", r.used[head])):
        close(getattr(w, name), want, f"head {head} {name}", rel=rel)
    assert w.scale == pytest.approx(r.scale, rel=1e-12)
    assert np.array_equal(w.allowed, r.allowed)


def check_cell(c, r, head: int, i: int, j: int) -> None:
    want = {
        "x_i": r.x[i], "x_j": r.x[j], "xn_i": r.xn[i], "xn_j": r.xn[j], "q_proj": r.q_proj[head, i],
        "k_proj": r.k_proj[head, j], "q_raw": r.q_raw[head, i],
        "k_raw": r.k_raw[head, j], "q": r.q[head, i], "k": r.k[head, j], "products": r.q[head, i] * r.k[head, j],
        "scores_row": r.scores[head, i], "softmax_row": r.weights[head, i], "used_row": r.used[head, i],
        "v": r.v[head], "weighted": r.used[head, i] @ r.v[head], "head_value": r.values[head, i],
        "head_out": r.heads_out[head, i], "heads_out": r.heads_out[:, i], "attn_out": r.attn_out[i],
        "residual_after": r.residual_after[i],
    }
    if r.attn_normed is not None:  # a block that normalises its branches' outputs (sandwich, post_branch)
        want["attn_normed"] = r.attn_normed[i]
    else:
        assert c.attn_normed is None
    for name, value in want.items():
        close(getattr(c, name), value, f"cell ({i}, {j}) of head {head}: {name}")
    s = r.scores[head, i]
    m = s.max()
    e = np.exp(s - m)
    close(c.exp_row, e, "exp row")
    for name, value in (("dot", r.raw[head, i, j]), ("score", r.raw[head, i, j] * r.scale),
                        ("capped", r.capped[head, i, j]), ("row_max", m),
                        ("exp_sum", e.sum()), ("weight", r.weights[head, i, j]), ("used_weight", r.used[head, i, j])):
        close(getattr(c, name), value, name)
    assert c.dot == pytest.approx(float(np.sum(c.products)), rel=1e-5, abs=1e-5)  # the sum of the shown products
    assert c.softmax_row == pytest.approx(c.exp_row / c.exp_sum, abs=1e-6)  # the shares are exp over the sum
    assert c.masked == (not r.allowed[i, j]) and np.array_equal(c.allowed, r.allowed[i])
    if c.masked:
        assert c.weight == 0.0 and c.scores_row[j] == -np.inf
    assert c.scale == pytest.approx(r.scale, rel=1e-12)
    if c.out_bias is not None:
        close(c.out_bias, r.out_bias, "b_O")
        close(c.heads_out.sum(0) + c.out_bias, c.attn_out, "heads + b_O")


# --------------------------------------------------------------------------- configurations


def sharpened(cfg: ModelConfig, seed: int = 0) -> DecoderLM:
    """A random model whose attention is far from uniform: N(0, 1/fan_in) weights, queries and keys at gain 3."""
    torch.manual_seed(seed)
    model = DecoderLM(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1:
                p.copy_(1.0 + 0.3 * noise if "norm" in name and name.endswith("weight") else 0.2 * noise)
            elif "emb" in name:
                p.copy_(noise)
            else:
                gain = 3.0 if "qkv" in name else 1.0
                p.copy_(noise * gain / math.sqrt(p.shape[1]))
    return model


BASE = dict(vocab_size=VOCAB, block_size=16, n_layers=2, n_heads=2, d_model=16)
CONFIGS = {
    "learned_pre_gelu": {},
    "sinusoidal": dict(pos_encoding="sinusoidal"),
    "rope": dict(pos_encoding="rope"),
    "rope_partial": dict(pos_encoding="rope", rope_fraction=0.5),
    "none": dict(pos_encoding="none"),
    "post_norm": dict(norm="post"),
    "no_norm": dict(norm="none"),
    "rmsnorm": dict(norm_kind="rmsnorm", norm_bias=False),
    "gelu_tanh": dict(gelu_approximate="tanh"),
    "relu": dict(activation="relu"),
    "swiglu_no_bias": dict(activation="swiglu", bias=False),
    "unscaled": dict(attn_scale="none"),
    "local_window": dict(attn_window=(0, 3)),
    "gqa": dict(n_heads=4, n_kv_heads=2, pos_encoding="rope"),
    "mqa": dict(n_heads=4, n_kv_heads=1),
    "parallel": dict(parallel_residual=True, pos_encoding="rope", rope_fraction=0.5),
    "no_out_proj": dict(attn_out_proj=False, d_ff=0, n_layers=1, n_heads=1, d_model=4, pos_encoding="sinusoidal",
                        norm="none", bias=False),
    "bidirectional": dict(mask="bidirectional"),
    # the 2024-26 families' options, several to a model (RMSNorm, rotary, no biases as those families)
    "gemma2_like": dict(pos_encoding="rope", norm="sandwich", norm_kind="rmsnorm", norm_offset=1.0, bias=False,
                        activation="geglu", gelu_approximate="tanh", embed_scale=4.0, n_heads=4, n_kv_heads=1,
                        head_size=6, query_scale_dim=10, attn_softcap=3.0, logit_softcap=5.0, attn_window=(3, 0)),
    "gemma3_like": dict(pos_encoding="rope", norm="sandwich", norm_kind="rmsnorm", norm_offset=1.0, bias=False,
                        activation="geglu", qk_norm="head", n_heads=4, n_kv_heads=2, head_size=10,
                        query_scale_dim=12, attn_window=(3, 0), local_rope_base=100.0, rope_scaling=("linear", 4.0)),
    "olmo2_like": dict(pos_encoding="rope", norm="post_branch", norm_kind="rmsnorm", bias=False, qkv_bias=True,
                       activation="swiglu", qk_norm="whole", n_heads=4, n_kv_heads=2, head_size=6),
    "llama3_nope_relu2": dict(pos_encoding="rope", norm_kind="rmsnorm", norm_bias=False, activation="relu2",
                              pe_base=500000.0, rope_scaling=("llama3", 8.0, 1.0, 4.0, 256), rope_off_layers=(1,)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_option_against_the_float64_path(name, monkeypatch):
    if name == "no_norm":  # no norm: the stream grows layer by layer and float32's error with it (3e-5 on an EPYC)
        monkeypatch.setitem(REL, "", 1e-4)
    check_model(sharpened(ModelConfig(**{**BASE, **CONFIGS[name]})), IDS)


INTERVENTIONS = {
    "zero": Intervention(((0, 1), (1, 0)), "zero"),
    "mean": Intervention(((1, 1),), "mean"),
    "uniform": Intervention(((0, 0),), "uniform"),
    "keep_only": Intervention(((1, 0),), "zero", keep_only=True),
    "edit_key": Intervention(edits=[AttentionEdit(1, 1, 8, 2)]),
    "edit_uniform_with_ablation": Intervention(((0, 1),), "mean", edits=[AttentionEdit(1, 0, 9, None)]),
}


@pytest.mark.parametrize("name", list(INTERVENTIONS))
def test_ablated_and_edited_heads_show_the_numbers_used(name):
    iv = INTERVENTIONS[name]
    model = sharpened(ModelConfig(**BASE, pos_encoding="rope"))
    check_model(model, IDS, iv)
    for e in iv.edits:  # the edited row is the one that multiplied V, the model's own softmax beside it
        c = inside_cell(model, IDS, e.layer, e.head, e.query, 0, iv)
        assert c.row_source == ("edit: uniform" if e.key is None else f"edit: key {e.key}")
        assert not np.allclose(c.used_row, c.softmax_row)
    for layer, head in iv.ablated_heads(model.cfg):
        c = inside_cell(model, IDS, layer, head, 5, 2, iv)
        assert c.ablation == iv.mode
        if iv.mode == "zero":
            assert not c.head_value.any() and not c.head_out.any()
        if iv.mode == "uniform":
            assert c.row_source == "uniform" and c.used_row[:6] == pytest.approx([1 / 6] * 6)


@pytest.mark.parametrize("name", BUILTINS.names)
def test_builtins(name):
    entry = BUILTINS.get(name)
    ids = entry.tokenizer.encode(entry.examples[0])[: entry.model.cfg.block_size]
    check_model(entry.model, ids, cells_per_head=1)


def test_the_grammar_models_pronoun_head_matches_the_hover():
    entry = BUILTINS.get("grammar (built-in)")
    ids = entry.tokenizer.encode("anna found the key . she gave it to tom because he")
    c = inside_cell(entry.model, ids, 1, 0, 11, 9)
    assert round(c.weight, 3) == 0.756  # README: the hover of "he" → "tom" in layer 1, head 0
    assert c.weight == pytest.approx(float(run_forward(entry.model, ids).attentions[1][0, 0, 11, 9]), abs=0)


def test_rotary_fields_and_group():
    model = sharpened(ModelConfig(**{**BASE, "n_heads": 4, "n_kv_heads": 2, "pos_encoding": "rope",
                                     "rope_fraction": 0.5}))
    c = inside_cell(model, IDS, 1, 3, 6, 2)
    assert c.rotary and c.rotary_dims == 2 and c.kv_head == 1 and len(c.rope_cos_i) == 1
    assert c.rope_cos_i[0] == pytest.approx(math.cos(6.0)) and c.rope_sin_j[0] == pytest.approx(math.sin(2.0))
    assert np.array_equal(c.q[2:], c.q_raw[2:])  # the unrotated dimensions pass through
    plain = inside_cell(sharpened(ModelConfig(**BASE)), IDS, 0, 0, 3, 1)
    assert not plain.rotary and plain.rope_cos_i is None and np.array_equal(plain.q, plain.q_raw)


def test_a_cache_of_other_settings_is_caught():
    model = sharpened(ModelConfig(**BASE))
    dec = Decoder(model, IDS, Sampling(temperature=0.0), intervention=Intervention(((0, 1),), "zero"))
    with pytest.raises(RebuildMismatch):  # layer 1's keys and values were computed with L0H1 zeroed
        inside_cell(model, IDS, 1, 0, 5, 2, cache=dec.cache, attention=dec.attention)
    with pytest.raises(ValueError, match="the cache holds 9 positions"):
        inside_cell(model, IDS, 1, 0, 5, 2, cache=Decoder(model, IDS[:-1]).cache)


def test_a_forward_run_with_other_settings_is_caught():
    model = sharpened(ModelConfig(**BASE))
    edited = run_forward(model, IDS, Intervention(edits=[AttentionEdit(1, 0, 5, 1)]))
    with pytest.raises(RebuildMismatch):  # its attention is not what these settings compute
        inside_cell(model, IDS, 1, 0, 5, 2, forward=edited)
    with pytest.raises(ValueError, match="residual streams of these ids"):
        inside_cell(model, IDS, 1, 0, 5, 2, forward=run_forward(model, IDS[:-1]))


@pytest.mark.parametrize("args", [(2, 0, 0, 0), (0, 2, 0, 0), (0, 0, 10, 0), (0, 0, 0, -1), (0, 0, True, 0),
                                  (0.5, 0, 0, 0)])
def test_out_of_range_is_refused(args):
    model = sharpened(ModelConfig(**BASE))
    with pytest.raises(ValueError, match="must be a whole number"):
        inside_cell(model, IDS, *args)


FAMILIES = {  # small random models of each imported family, in transformers' own classes
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_positions=40, n_embd=16, n_layer=2, n_head=4), True),
    "neo_local": ("GPTNeoConfig", "GPTNeoForCausalLM", dict(max_position_embeddings=40, hidden_size=16, num_layers=2,
                  num_heads=4, attention_types=[[["global", "local"], 1]], window_size=3), False),
    "neox_rotary_quarter": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(max_position_embeddings=40, hidden_size=32,
                            num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, rotary_pct=0.25), False),
    "llama_gqa": ("LlamaConfig", "LlamaForCausalLM", dict(max_position_embeddings=40, hidden_size=24,
                  num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=40), False),
}


@pytest.mark.slow  # builds and saves a transformers model per family
@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_models(name, tmp_path):
    import transformers
    from model.families import open_folder
    from tests.support.families import save_reference, sharpen

    config, cls, options, conv1d = FAMILIES[name]
    cfg = getattr(transformers, config)(vocab_size=300, bos_token_id=1, eos_token_id=0, **options)
    torch.manual_seed(0)
    ref = getattr(transformers, cls)(cfg).eval()
    sharpen(ref, seed=len(name), conv1d=conv1d)
    model, tok = open_folder(save_reference(ref, tmp_path / name, 300))
    ids = tok.encode("Once upon a time there was a little fox")
    check_model(model, ids, cells_per_head=1)
    check_model(model, ids, Intervention(((1, 1),), "mean", edits=[AttentionEdit(0, 2, len(ids) - 1, 1)]),
                cells_per_head=1)


@pytest.mark.slow  # builds and saves a transformers model per family
@pytest.mark.parametrize("name", NEWER)
def test_newer_family_models(name, tmp_path):
    """The families of issue 39, built by their own tests' builders (tests/support/family_folders.py); the
    prompt is longer than every local window."""
    from model.families import open_folder

    model, tok = open_folder(family_folder(name, tmp_path))
    ids = tok.encode("Once upon a time there was a little fox")
    assert len(ids) > max(model.cfg.attn_window, default=0) + 2
    check_model(model, ids, cells_per_head=1)
    # the edited row keeps a key of every window (the one before the query)
    edit = AttentionEdit(0, 2, len(ids) - 1, len(ids) - 2)
    check_model(model, ids, Intervention(((1, 1),), "mean", edits=[edit]), cells_per_head=1)
