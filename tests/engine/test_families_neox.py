"""GPT-NeoX folders (Pythia's family) held to transformers' GPTNeoXForCausalLM on random small models:
head-major fused q/k/v, rotary on part of each head, parallel residual; a sharded folder."""

from __future__ import annotations

import pytest
import torch

from tests.support.families import check_against_reference, save_reference, sharpen
from model.families import open_folder

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

VOCAB = 300
CASES = {
    # Pythia's shape: rotary on 25 % of a head of 8 (2 dimensions), parallel residual, untied head,
    # an embedding padded past the tokenizer (Pythia's 50,304 rows for 50,277 tokens)
    "pythia": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                   rotary_pct=0.25, vocab_size=320),
    # sequential residual, rotary on the whole head of 4, no attention biases, tied head, theta 500
    "sequential": dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
                       rotary_pct=1.0, rotary_emb_base=500.0, use_parallel_residual=False, attention_bias=False,
                       tie_word_embeddings=True),
}


def build(name: str, folder, **save):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    options = {"vocab_size": VOCAB, **CASES[name]}
    cfg = GPTNeoXConfig(max_position_embeddings=40, bos_token_id=1, eos_token_id=0, attn_implementation="eager",
                        **options)
    torch.manual_seed(0)
    ref = GPTNeoXForCausalLM(cfg).eval()
    sharpen(ref, seed=len(name))
    return ref, save_reference(ref, folder / name, VOCAB, **save)


@pytest.mark.parametrize("name", list(CASES))
def test_gpt_neox_matches_transformers(name, tmp_path):
    ref, folder = build(name, tmp_path)
    check_against_reference(ref, folder)


def test_sharded_folder_opens_the_same(tmp_path):
    ref, folder = build("pythia", tmp_path, max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").is_file() and not (folder / "model.safetensors").exists()
    model, _ = open_folder(folder)
    assert (model.cfg.rope_dim, model.cfg.parallel_residual, model.cfg.vocab_used) == (2, True, VOCAB)
    check_against_reference(ref, folder)


def test_older_config_keys_read_the_same(tmp_path):
    """Pythia's files on the Hub predate transformers 5: rotary_pct / rotary_emb_base at the top
    level instead of rope_parameters. Both spellings give the same model."""
    import json

    ref, folder = build("sequential", tmp_path)
    new, _ = open_folder(folder)
    hf = json.loads((folder / "config.json").read_text())
    rope = hf.pop("rope_parameters")
    hf.update(rotary_pct=rope["partial_rotary_factor"], rotary_emb_base=rope["rope_theta"], rope_scaling=None)
    (folder / "config.json").write_text(json.dumps(hf))
    old, _ = open_folder(folder)
    assert (old.cfg.pe_base, old.cfg.rope_fraction) == (500.0, 1.0)
    x = torch.tensor([[4, 8, 15, 16, 23, 42]])
    assert torch.equal(old(x).logits, new(x).logits)
