"""The engine options the imported families brought in, on models built from ModelConfig alone:
each is validated with a sentence, survives a config round trip, counts its parameters, and keeps
the fused kernel, the KV cache, interventions and the logit lens consistent."""

from __future__ import annotations

import copy

import pytest
import torch

from model.config import ModelConfig
from model.interventions import AttentionEdit, Intervention
from model.transformer import DecoderLM, KVCache, logit_lens

BASE = dict(vocab_size=17, block_size=16, n_layers=3, n_heads=4, d_model=16)
OPTIONS = {
    "unscaled_tanh": dict(attn_scale="none", gelu_approximate="tanh"),
    "rmsnorm": dict(norm_kind="rmsnorm", norm_eps=1e-6, norm_bias=False),
    "partial_rope": dict(pos_encoding="rope", rope_fraction=0.5, pe_base=500.0, rope_precision="float32"),
    "parallel": dict(parallel_residual=True, qkv_bias=False, mlp_bias=True, attn_out_bias=False),
    "windows": dict(attn_window=(2, 0, 1)),
    "gqa": dict(n_kv_heads=2, pos_encoding="rope", activation="swiglu", d_ff=24, bias=False, norm_kind="rmsnorm"),
    "padded": dict(vocab_used=12, tie_weights=True),
}
IDS = [[3, 9, 1, 16, 4, 4, 7, 0, 11, 2]]


def build(name: str) -> DecoderLM:
    torch.manual_seed(len(name))
    model = DecoderLM(ModelConfig(**BASE, **OPTIONS[name])).eval()
    with torch.no_grad():  # larger than the training init, so attention is far from uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    return model.double()


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_path_agrees_on_every_option(name):
    model = build(name)
    x = torch.tensor(IDS)
    with torch.no_grad():
        full = model(x, return_attention=True, return_residuals=True)
        assert torch.allclose(model(x).logits, full.logits, atol=1e-10, rtol=0)  # fused kernel
        cache = KVCache([])
        for t in range(x.shape[1]):  # one token at a time through the cache
            step = model(x[:, t : t + 1], return_attention=True, cache=cache)
            cache = step.cache
            assert torch.allclose(step.logits[0, -1], full.logits[0, t], atol=1e-10, rtol=0)
            for a, b in zip(step.attentions, full.attentions):
                assert torch.allclose(a[0, :, 0], b[0, :, t, : t + 1], atol=1e-12, rtol=0)
        # a grouped cache keeps n_kv_heads key heads
        assert cache.layers[0].k.shape[1] == model.cfg.kv_heads
        assert torch.equal(logit_lens(model, full.residuals[1:])[-1], full.logits)
        for a in full.attentions:
            assert torch.allclose(a.sum(-1), torch.ones_like(a.sum(-1)))
            assert torch.all(a.triu(1) == 0)
        # zero- and mean-ablation change the output; uniform rows spread over the allowed keys only
        for mode in ("zero", "mean", "uniform"):
            out = model(x, intervention=Intervention(heads=[(1, 2)], mode=mode)).logits
            assert not torch.allclose(out, full.logits)
        uni = model(x, return_attention=True, intervention=Intervention(heads=[(0, 1)], mode="uniform")).attentions[0]
    T, w = x.shape[1], model.cfg.window(0)
    for q in range(T):
        n = min(q + 1, w) if w else q + 1
        assert torch.allclose(uni[0, 1, q, q + 1 - n : q + 1], torch.full((n,), 1.0 / n, dtype=torch.float64))


@pytest.mark.parametrize("name", list(OPTIONS))
def test_parameter_count_and_round_trip(name):
    model = build(name)
    assert model.cfg.n_params() == model.n_params()
    again = ModelConfig.from_dict(copy.deepcopy(model.cfg.to_dict()))
    assert again == model.cfg
    if model.cfg.attn_window:  # JSON gives a list; the config holds a tuple again
        data = model.cfg.to_dict()
        data["attn_window"] = list(data["attn_window"])
        assert ModelConfig.from_dict(data).attn_window == model.cfg.attn_window


@pytest.mark.parametrize("changes, sentence", [
    ({"attn_scale": "cosine"}, "attn_scale must be one of inverse_sqrt, none"),
    ({"gelu_approximate": "fast"}, "gelu_approximate must be one of none, tanh"),
    ({"norm_kind": "batch"}, "norm_kind must be one of layernorm, rmsnorm"),
    ({"norm_eps": 0}, r"norm_eps must be a number in \(0, 1\)"),
    ({"rope_fraction": 0.5}, "rope_fraction applies to pos_encoding='rope' only"),
    ({"rope_precision": "float16"}, "rope_precision must be one of float64, float32"),
    ({"pos_encoding": "rope", "rope_fraction": 0.1}, "RoPE needs an even number of them"),
    ({"parallel_residual": True, "norm": "post"}, "parallel_residual needs norm='pre'"),
    ({"attn_window": (2, 0)}, "attn_window has 2 entries for 3 layers"),
    ({"attn_window": (2, -1, 0)}, "attn_window must be a list of whole numbers"),
    ({"attn_window": (2, 0, 0), "mask": "bidirectional"}, "a local attention window needs the causal mask"),
    ({"n_kv_heads": 3}, r"n_kv_heads must divide n_heads \(4\)"),
    ({"vocab_used": 18}, r"vocab_used must be a whole number from 1 to vocab_size \(17\)"),
    ({"qkv_bias": "yes"}, "qkv_bias must be true, false or None"),
    ({"norm_kind": "rmsnorm", "norm_bias": True}, "RMSNorm has no bias"),
])
def test_bad_options_are_refused_with_a_sentence(changes, sentence):
    with pytest.raises(ValueError, match=sentence):
        ModelConfig(**{**BASE, **changes})
