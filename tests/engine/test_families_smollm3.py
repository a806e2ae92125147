"""SmolLM3 folders held to transformers' SmolLM3ForCausalLM on small random models: layers without
rotary (no_rope_layers, or every no_rope_layer_interval-th layer in a file without the list), sliding
windows on those layers, attention and MLP biases, heads wider than d_model / heads, theta 2,000,000
when the file names none, a tied head by default, and BOS as the tokenizer's files say."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.families import PROMPTS, check_against_reference
from tests.support.llamalike import build, check_cli, check_convert, edit_config
from model.families import open_folder, smollm3

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

CASES = {
    # layers 1 and 3 without rotary, GQA 2:1, the tied head of SmolLM3's own default, <s> first
    "nope": dict(hidden_size=16, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=16, no_rope_layers=[1, 0, 1, 0], rope_theta=10000.0),
    # every 2nd layer without rotary and sliding over 3 keys, one key/value head, heads 8 wide for
    # d_model 16, biases everywhere, an untied head, no BOS
    "sliding_bias": dict(hidden_size=16, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=8, intermediate_size=24, no_rope_layer_interval=2, use_sliding_window=True,
                         sliding_window=3, attention_bias=True, mlp_bias=True, tie_word_embeddings=False),
}
BOS = {"nope": True, "sliding_bias": False}


def smol(name, folder):
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    # pad_token_id: SmolLM3Config's default (128004) is past this vocabulary
    return build(SmolLM3ForCausalLM, SmolLM3Config, folder / name, seed=len(name), bos=BOS[name], pad_token_id=None,
                 **CASES[name])


@pytest.mark.parametrize("name", list(CASES))
def test_smollm3_matches_transformers(name, tmp_path):
    ref, folder = smol(name, tmp_path)
    check_against_reference(ref, folder)


def test_layers_without_rotary_and_their_windows(tmp_path):
    ref, folder = smol("sliding_bias", tmp_path)
    model, tok = open_folder(folder)
    cfg = model.cfg
    assert ref.config.no_rope_layers == [1, 0, 1] and cfg.rope_off_layers == (1,)
    assert cfg.attn_window == (0, 3, 0) and ref.config.layer_types[1] == "sliding_attention"
    assert cfg.pe_base == 2_000_000.0 and not cfg.tie_weights and not tok.add_bos  # SmolLM3's default theta
    assert (cfg.head_dim, cfg.attn_dim) == (8, 16) and cfg.part_bias("attn_out") and cfg.part_bias("mlp")
    assert model.rope_at(1, slice(0, 4)) is None and model.rope_at(0, slice(0, 4)) is not None
    # a layer without rotary sees no position: with its window off, its attention over a repeated token
    # is uniform, where a rotating layer's is not
    smol("nope", tmp_path)
    nope, nope_tok = open_folder(tmp_path / "nope")
    ids = [nope_tok.encode(" fox")[-1]] * 3
    with torch.no_grad():
        att = nope(torch.tensor([ids]), return_attention=True).attentions
    assert torch.allclose(att[1][0, :, -1], torch.full((3,), 1 / 3), atol=1e-6)
    assert not torch.allclose(att[0][0, :, -1], torch.full((3,), 1 / 3), atol=1e-3)


def test_older_config_file(tmp_path):
    """A file without no_rope_layers and layer_types (older transformers wrote them out; a hand-written
    one may not): every no_rope_layer_interval-th layer goes without rotary and slides, as transformers reads it."""
    from transformers import AutoConfig

    ref, folder = smol("sliding_bias", tmp_path)
    new, tok = open_folder(folder)
    hf = edit_config(folder, no_rope_layers=None, layer_types=None, rope_parameters=None)
    assert AutoConfig.from_pretrained(folder).layer_types == ref.config.layer_types
    old, _ = open_folder(folder)
    assert old.cfg == new.cfg
    ids = torch.tensor([tok.encode(PROMPTS[2])])
    with torch.no_grad():
        assert torch.equal(old(ids).logits, new(ids).logits)
    assert smollm3.model_config({**hf, "no_rope_layer_interval": 3}).rope_off_layers == (2,)
    assert json.loads((folder / "config.json").read_text()).get("rope_theta") is None


@pytest.mark.parametrize("name", list(CASES))
def test_command_lines(name, tmp_path):
    ref, folder = smol(name, tmp_path)
    check_cli(ref, folder, PROMPTS[2])
    check_convert(folder, tmp_path / f"{name}.safetensors", PROMPTS[2])
