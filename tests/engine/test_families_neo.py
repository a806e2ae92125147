"""GPT-Neo folders (the TinyStories models' family) held to transformers' GPTNeoForCausalLM on random
small models: no attention scale, local layers, q/k/v without bias."""

from __future__ import annotations

import pytest
import torch

from tests.support.families import PROMPTS, check_against_reference, save_reference, sharpen
from model.families import open_folder
from model.interventions import AttentionEdit, Intervention

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

VOCAB = 300
CASES = {
    # head size 4; a local layer of window 3 after a global one; tied head
    "local3": dict(hidden_size=16, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=3),
    # local first, window 1 (each token sees only itself), exact GELU, untied head, padded vocabulary
    "local1_untied": dict(hidden_size=12, num_layers=3, num_heads=2, attention_types=[[["local", "global", "local"], 1]],
                          window_size=1, activation_function="gelu", tie_word_embeddings=False, vocab_size=310),
}


def build(name: str, folder):
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    options = {"vocab_size": VOCAB, **CASES[name]}
    cfg = GPTNeoConfig(max_position_embeddings=40, bos_token_id=1, eos_token_id=0, attn_implementation="eager", **options)
    torch.manual_seed(0)
    ref = GPTNeoForCausalLM(cfg).eval()
    sharpen(ref, seed=len(name))
    return ref, save_reference(ref, folder / name, VOCAB)


@pytest.mark.parametrize("name", list(CASES))
def test_gpt_neo_matches_transformers(name, tmp_path):
    ref, folder = build(name, tmp_path)
    check_against_reference(ref, folder)


def test_local_layers_see_only_their_window(tmp_path):
    _, folder = build("local3", tmp_path)
    model, tok = open_folder(folder)
    assert model.cfg.attn_window == (0, 3) and model.cfg.attn_scale == "none"
    ids = tok.encode(PROMPTS[2])
    with torch.no_grad():
        att = model(torch.tensor([ids]), return_attention=True).attentions
    T = len(ids)
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    assert torch.all(att[1][0][:, (k <= q - 3).expand(T, T)] == 0)  # the local layer: keys out of the window are exactly 0
    assert torch.all(att[0][0][:, :, 0] > 0)  # the global layer still reads the first token from every query
    # a uniform edit of a local row spreads over the window only; a key outside it is refused
    edited = model(torch.tensor([ids]), return_attention=True,
                   intervention=Intervention(edits=[AttentionEdit(1, 0, T - 1, None)])).attentions[1][0, 0, T - 1]
    assert torch.allclose(edited[-3:], torch.full((3,), 1 / 3)) and torch.all(edited[:-3] == 0)
    with pytest.raises(ValueError, match="local window"):
        model(torch.tensor([ids]), intervention=Intervention(edits=[AttentionEdit(1, 0, T - 1, 0)]))
