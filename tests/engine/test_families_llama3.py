"""Llama 3.x folders (Llama 3.1/3.2's "llama3" rotary: a fixed change of the inverse frequencies) and
the "linear" rope scaling, held to transformers' LlamaForCausalLM: the rotary tables bit for bit at every
position, and logits and attention over a text long enough for the change to matter, in transformers 5's
config.json form and in the older one."""

from __future__ import annotations

import pytest
import torch

from tests.support.families import PROMPTS, check_against_reference
from tests.support.llamalike import VOCAB, build, check_cli, check_convert, edit_config
from model.families import open_folder

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

POSITIONS = 1024
# head size 8: four frequencies with wavelengths 6.3, 167, 4,443 and 118,000 positions at theta 500,000.
# Against an original context of 256 (high_freq_factor 4: 64; low_freq_factor 1: 256) the first is
# kept, the second blended, the last two slowed 8 times: every branch of the rule is taken.
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256, "rope_theta": 500000.0}
SHAPE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, tie_word_embeddings=True)


def llama(folder, rope: dict, positions: int = POSITIONS):
    from transformers import LlamaConfig, LlamaForCausalLM

    return build(LlamaForCausalLM, LlamaConfig, folder, seed=3, bos=True, max_positions=positions,
                 rope_parameters=dict(rope), **SHAPE)


def test_llama3_matches_transformers(tmp_path):
    ref, folder = llama(tmp_path / "llama3", LLAMA3)
    check_against_reference(ref, folder)
    model, tok = open_folder(folder)
    assert model.cfg.rope_scaling == ("llama3", 8.0, 1.0, 4.0, 256) and model.cfg.pe_base == 500000.0
    assert tok.add_bos and tok.encode("Once")[0] == 1  # Llama 3 puts <|begin_of_text|> first


@pytest.mark.parametrize("rope", [LLAMA3, {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}],
                         ids=["llama3", "linear"])
def test_scaled_rotary_over_a_long_text(rope, tmp_path):
    """The tables equal transformers' cos and sin bit for bit at all 1,024 positions; the logits and
    attention of a 1,000-token text agree, where the unscaled rotary gives other numbers."""
    ref, folder = llama(tmp_path / rope["rope_type"], rope)
    model, _ = open_folder(folder)
    cos, sin = ref.model.rotary_emb(torch.zeros(1, dtype=torch.float32), torch.arange(POSITIONS)[None])
    half = model.cfg.rope_dim // 2
    assert torch.equal(model.rope_cos, cos[0, :, :half]) and torch.equal(model.rope_sin, sin[0, :, :half])
    edit_config(folder, rope_parameters={"rope_type": "default", "rope_theta": rope["rope_theta"]})
    plain, _ = open_folder(folder)
    changed = (plain.rope_cos - model.rope_cos).abs().amax(0)  # per frequency, over all positions
    # llama3 keeps the fastest frequency; linear slows them all (the slowest turns little in 1,024 positions)
    assert (changed[0] == 0) == (rope["rope_type"] == "llama3") and (changed[1:] > 0).all() and changed.max() > 0.5
    ids = torch.randint(2, VOCAB, (1, 1000), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = ref(ids, output_attentions=True), model(ids, return_attention=True)
        other = plain(ids).logits
    # float32 over 1,000 positions: a few dozen ulps of the largest logit (see test_families_llama.py)
    top = want.logits.abs().max()
    assert (got.logits - want.logits).abs().max() <= 3e-6 * top
    assert max((a - b).abs().max() for a, b in zip(got.attentions, want.attentions)) <= 1e-6
    assert (other - want.logits).abs().max() > 1e-2 * top


def test_older_config_file(tmp_path):
    """Llama 3.2's config.json as published (transformers 4's form): rope_scaling and rope_theta at the top
    level, and without its own original_max_position_embeddings the rule reads max_position_embeddings, as
    transformers does."""
    from transformers import AutoConfig

    ref, folder = llama(tmp_path / "old", LLAMA3, positions=256)
    new, _ = open_folder(folder)
    scaling = {k: v for k, v in LLAMA3.items() if k != "rope_theta"}
    edit_config(folder, rope_parameters=None, rope_theta=500000.0, rope_scaling=scaling)
    old, _ = open_folder(folder)
    assert old.cfg == new.cfg and torch.equal(old.rope_cos, new.rope_cos)
    del scaling["original_max_position_embeddings"]
    edit_config(folder, rope_scaling=scaling, max_position_embeddings=512)
    longer, _ = open_folder(folder)
    assert longer.cfg.rope_scaling[4] == 512
    assert AutoConfig.from_pretrained(folder).rope_parameters["original_max_position_embeddings"] == 512


def test_command_lines(tmp_path):
    ref, folder = llama(tmp_path / "cli", LLAMA3, positions=256)  # the app's upload limit on positions
    check_cli(ref, folder, PROMPTS[2])
    check_convert(folder, tmp_path / "llama3.safetensors", PROMPTS[2])
