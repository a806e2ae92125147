"""Qwen2 / Qwen2.5 and Qwen3 folders held to transformers' Qwen2ForCausalLM and Qwen3ForCausalLM on small
random models: biases on q, k, v only (Qwen2), heads wider than d_model / heads, a per-head q/k RMSNorm
before the rotary step (Qwen3), grouped and multi-query attention, sliding-window layers on a prompt
longer than the window, and a BOS token only where the tokenizer's files put one (as transformers does;
Qwen's released tokenizers put none)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.families import PROMPTS, check_against_reference, hf_tokenizer
from tests.support.llamalike import build, check_cli, check_convert, edit_config
from model.families import open_folder, qwen3 as qwen3_family

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

QWEN2 = {
    # GQA 7:1 as Qwen2.5-0.5B (14 heads, 2 key/value heads), its theta, an untied head
    "gqa7": dict(hidden_size=28, num_hidden_layers=2, num_attention_heads=7, num_key_value_heads=1,
                 intermediate_size=40, rope_theta=1000000.0),
    # the last two of three layers slide over 3 keys (shorter than every prompt), heads 8 wide for
    # d_model 16 (head_dim given), a tied head, a tokenizer that puts <s> first
    "sliding": dict(hidden_size=16, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=24, head_dim=8, use_sliding_window=True, sliding_window=3,
                    max_window_layers=1, tie_word_embeddings=True),
}
QWEN3 = {
    # Qwen3-0.6B's shape in small: 4 heads x 8 = 32 wide for d_model 16, 2 key/value heads, no biases
    "wide": dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=8, intermediate_size=24),
    # one key/value head, biases on all four projections, a window of 4 on layers 1 and 2, linear rope
    # scaling
    "mqa_bias_sliding": dict(hidden_size=24, num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1,
                             head_dim=6, intermediate_size=32, attention_bias=True, use_sliding_window=True,
                             sliding_window=4, max_window_layers=1,
                             rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
}


def qwen2(name, folder):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return build(Qwen2ForCausalLM, Qwen2Config, folder / name, seed=len(name), bos=name == "sliding", **QWEN2[name])


def qwen3(name, folder):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return build(Qwen3ForCausalLM, Qwen3Config, folder / name, seed=len(name), **QWEN3[name])


@pytest.mark.parametrize("name", list(QWEN2))
def test_qwen2_matches_transformers(name, tmp_path):
    ref, folder = qwen2(name, tmp_path)
    check_against_reference(ref, folder)


@pytest.mark.parametrize("name", list(QWEN3))
def test_qwen3_matches_transformers(name, tmp_path):
    ref, folder = qwen3(name, tmp_path)
    check_against_reference(ref, folder)


def test_qwen2_biases_and_windows(tmp_path):
    ref, folder = qwen2("sliding", tmp_path)
    model, tok = open_folder(folder)
    cfg = model.cfg
    assert (cfg.part_bias("qkv"), cfg.part_bias("attn_out"), cfg.part_bias("mlp")) == (True, False, False)
    assert (cfg.head_dim, cfg.attn_dim, cfg.d_model) == (8, 32, 16)
    assert cfg.attn_window == tuple(0 if t == "full_attention" else 3 for t in ref.config.layer_types) == (0, 3, 3)
    assert model.blocks[0].attn.proj.bias is None and model.blocks[0].attn.qkv.bias.shape == ((4 + 2 * 2) * 8,)
    # this tokenizer.json puts <s> first, and so do transformers' tokenizer and ours
    assert tok.add_bos and tok.encode("Once")[0] == 1 == hf_tokenizer(folder)("Once")["input_ids"][0]
    # the window is what changes the numbers: a sliding layer's attention is zero past its last 3 keys
    ids = tok.encode(PROMPTS[2])
    assert len(ids) > 4
    with torch.no_grad():
        att = model(torch.tensor([ids]), return_attention=True).attentions
    assert att[1][0, :, -1, :-3].abs().max() == 0 and att[0][0, :, -1, :-3].abs().max() > 0


def test_older_config_files_give_the_same_model(tmp_path):
    """A config.json in transformers 4's form (rope_theta and rope_scaling at the top, no layer_types:
    which layers slide follows from use_sliding_window and max_window_layers) opens as the same model,
    and transformers reads it the same way."""
    from transformers import AutoConfig

    ref, folder = qwen3("mqa_bias_sliding", tmp_path)
    new, _ = open_folder(folder)
    edit_config(folder, layer_types=None, rope_parameters=None, rope_theta=10000.0,
                rope_scaling={"type": "linear", "factor": 2.0})
    old, tok = open_folder(folder)
    assert old.cfg == new.cfg and old.cfg.rope_scaling == ("linear", 2.0) and old.cfg.attn_window == (0, 4, 4)
    assert AutoConfig.from_pretrained(folder).layer_types == ref.config.layer_types
    ids = torch.tensor([tok.encode(PROMPTS[2])])
    with torch.no_grad():
        assert torch.equal(old(ids).logits, new(ids).logits)


def test_qwen3_head_width_and_qk_norm(tmp_path):
    ref, folder = qwen3("wide", tmp_path)
    model, tok = open_folder(folder)
    cfg = model.cfg
    assert (cfg.qk_norm, cfg.head_dim, cfg.attn_dim, cfg.d_model, cfg.kv_heads) == ("head", 8, 32, 16, 2)
    assert not cfg.part_bias("qkv") and not cfg.part_bias("attn_out") and not tok.add_bos
    attn = model.blocks[0].attn
    assert attn.q_norm.weight.shape == (8,) and attn.proj.weight.shape == (16, 32)
    # the norm's weight moved with the dimensions it scales: its rotate-half order became pairs
    got = attn.q_norm.weight.detach()
    want = ref.model.layers[0].self_attn.q_norm.weight.detach()
    assert torch.equal(got, want[[0, 4, 1, 5, 2, 6, 3, 7]])
    # without head_dim a Qwen3 config.json means transformers' default, 128, not d_model / heads
    hf = json.loads((folder / "config.json").read_text())
    del hf["head_dim"]
    assert qwen3_family.model_config(hf).head_dim == 128


@pytest.mark.parametrize("family, name", [("qwen2", "gqa7"), ("qwen3", "mqa_bias_sliding")])
def test_command_lines(family, name, tmp_path):
    ref, folder = (qwen2 if family == "qwen2" else qwen3)(name, tmp_path)
    check_cli(ref, folder, PROMPTS[2])
    check_convert(folder, tmp_path / f"{name}.safetensors", PROMPTS[2])
