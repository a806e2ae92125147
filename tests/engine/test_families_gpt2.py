"""GPT-2 folders (and distilgpt2's shape) opened by model.families, held to transformers' GPT2LMHeadModel
on random small models: logits, every head's attention, cached steps, greedy text, tokenizer."""

from __future__ import annotations

import pytest
import torch

from tests.support.families import check_against_reference, save_reference, sharpen
from model.families import gpt2 as gpt2_family
from model.families import open_folder

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

VOCAB = 300  # the tokenizer's tokens
CASES = {
    # head size 4, tied head, GPT-2's tanh GELU
    "gpt2": dict(n_embd=16, n_layer=2, n_head=4),
    # distilgpt2 is GPT-2 with fewer layers; here: one layer, exact GELU, untied head
    "distil_untied_gelu": dict(n_embd=24, n_layer=1, n_head=3, activation_function="gelu", tie_word_embeddings=False),
    # no attention scale, a wider MLP, an embedding padded past the tokenizer's 300 tokens
    "unscaled_padded": dict(n_embd=16, n_layer=2, n_head=2, n_inner=40, scale_attn_weights=False, vocab_size=320),
}


def build(name: str, folder):
    from transformers import GPT2Config, GPT2LMHeadModel

    options = {"vocab_size": VOCAB, **CASES[name]}
    cfg = GPT2Config(n_positions=40, bos_token_id=1, eos_token_id=0, attn_implementation="eager", **options)
    torch.manual_seed(0)
    ref = GPT2LMHeadModel(cfg).eval()
    sharpen(ref, seed=len(name), conv1d=True)
    return ref, save_reference(ref, folder / name, VOCAB)


@pytest.mark.parametrize("name", list(CASES))
def test_gpt2_matches_transformers(name, tmp_path):
    ref, folder = build(name, tmp_path)
    check_against_reference(ref, folder)


def test_padded_rows_are_never_sampled(tmp_path):
    ref, folder = build("unscaled_padded", tmp_path)
    model, tok = open_folder(folder)
    assert (model.cfg.vocab_size, model.cfg.vocab_used, tok.vocab_size) == (320, VOCAB, VOCAB)
    from model.generate import Decoder, Sampling, generate

    # make a padded row the model's favourite (50 times the likeliest real token's row): sampling
    # still never picks it
    favourite = int(Decoder(model, tok.encode("Once upon")).logits.argmax())
    with torch.no_grad():
        model.head.weight[310] = model.head.weight[favourite] * 50
    dec = Decoder(model, tok.encode("Once upon"), Sampling(temperature=1.0, seed=3))
    assert int(dec.logits.argmax()) == 310
    steps = list(generate(dec, 5))
    assert all(s.token_id < VOCAB for s in steps)
    assert all(s.probs[VOCAB:].sum() == 0 and s.adjusted[VOCAB:].sum() == 0 for s in steps)


def test_from_state_builds_gpt2_from_named_tensors(tmp_path):
    """The entry point the nanoGPT importer uses: GPT-2-named tensors (Conv1D layout) in, the
    same model out as the folder gives."""
    ref, folder = build("gpt2", tmp_path)
    hf_config = ref.config.to_dict()
    tensors = {k: v.clone() for k, v in ref.state_dict().items() if k != "lm_head.weight"}
    model = gpt2_family.from_gpt2_state(hf_config, tensors)
    same, _ = open_folder(folder)
    x = torch.tensor([[5, 9, 2, 77, 3]])
    assert torch.equal(model(x).logits, same(x).logits)
    with torch.no_grad():
        assert torch.allclose(model(x).logits, ref(x).logits, atol=1e-5, rtol=0)
    # a missing tensor is refused with a sentence naming it
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    with pytest.raises(ValueError, match="h.1.mlp.c_fc.bias"):
        gpt2_family.from_gpt2_state(hf_config, tensors)


def test_pieces_read_as_text(tmp_path):
    _, folder = build("gpt2", tmp_path)
    _, tok = open_folder(folder)
    ids = tok.encode("Once upon a time\n")
    pieces = [tok.piece(i) for i in ids]
    assert "".join(pieces) == "Once␣upon␣a␣time⏎"  # spaces and newlines visible, never Ġ / Ċ
    assert not any("Ġ" in p or "Ċ" in p for p in pieces)
    assert tok.add_bos is False and ids[0] != tok.bos_id  # GPT-2 never puts a BOS token first


def test_hub_layout_without_prefix_and_with_mask_buffers(tmp_path):
    """gpt2's own model.safetensors names tensors without `transformer.` and carries each layer's
    causal-mask buffer (`h.0.attn.bias`); both are read (the buffers skipped)."""
    from safetensors.torch import load_file, save_file

    ref, folder = build("gpt2", tmp_path)
    before, _ = open_folder(folder)
    tensors = {k.removeprefix("transformer."): v for k, v in load_file(folder / "model.safetensors").items()}
    for i in range(2):
        tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 40, 40))
    save_file(tensors, folder / "model.safetensors")
    after, _ = open_folder(folder)
    x = torch.tensor([[5, 9, 2, 77, 3]])
    assert torch.equal(after(x).logits, before(x).logits)
