"""`DecoderLM.forward(logits="last")` reads out the last position only, and `read_out_rows` reads a few
residual streams with the head's weight on the left: the same numbers as the forward's own readout
(float32 rounds a product of another shape a few units of its last place apart: 1e-6 absolute and
relative), with everything else the forward returns unchanged, for the built-in checkpoints and a
model of each imported family. The decoder's prefill samples from that last row and keeps the last
token's residual streams (the logit lens reads the newest token from them), as its Steps do."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from lab.catalogue.models import BUILTIN_MODELS
from model.checkpoint import load_checkpoint
from model.config import ModelConfig
from model.families import open_folder
from model.generate import Decoder, Sampling, generate
from model.interventions import AttentionEdit, Intervention
from model.transformer import DecoderLM, KVCache, read_out_rows
from tests.support.families import PROMPTS, save_reference, sharpen
from tests.support.family_folders import NEWER, family_folder
from tests.support.patch_reference import FAMILIES as PATCH_FAMILIES

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TOL = 1e-6
VOCAB = 300
# one small model per family importer (the shapes their own tests use): GPT-2, Pythia (partial rotary,
# parallel residual, padded vocabulary), Llama (grouped keys and values), GPT-Neo (a local layer)
# the families of tests/support/patch_reference, NeoX with a vocabulary of its own size (320)
FAMILIES = {**PATCH_FAMILIES, "neox": (*PATCH_FAMILIES["neox"][:2], {**PATCH_FAMILIES["neox"][2], "vocab_size": 320})}


def check_last(model, ids: list[int]) -> None:
    x = torch.tensor([ids, ids[::-1]])  # a batch of two
    V = model.cfg.vocab_size
    with torch.inference_mode():
        full = model(x, return_attention=True, return_residuals=True)
        last = model(x, return_attention=True, return_residuals=True, logits="last")
        assert last.logits.shape == (2, 1, V)
        torch.testing.assert_close(last.logits[:, 0], full.logits[:, -1], atol=TOL, rtol=TOL)
        # the blocks ran as before: the same attention and residual streams, bit for bit
        assert all(torch.equal(a, b) for a, b in zip(last.attentions, full.attentions))
        assert all(torch.equal(a, b) for a, b in zip(last.residuals, full.residuals))
        # after a cache, under an intervention, on the fused path
        cache = model(x[:, :3], cache=KVCache([])).cache
        L, H = model.cfg.n_layers, model.cfg.n_heads
        edits = [AttentionEdit(L - 1, H - 1, 4, 3)] if L * H > 1 else []  # the toy has one head
        iv = Intervention(heads=[(0, 0)], mode="zero", edits=edits)
        a = model(x[:, 3:], cache=cache, intervention=iv)
        b = model(x[:, 3:], cache=cache, intervention=iv, logits="last")
        torch.testing.assert_close(b.logits[:, 0], a.logits[:, -1], atol=TOL, rtol=TOL)
        assert torch.equal(b.cache.layers[-1].k, a.cache.layers[-1].k)
        fused = model(x, logits="last").logits
        torch.testing.assert_close(fused[:, 0], model(x).logits[:, -1], atol=TOL, rtol=TOL)
        # a few residual streams through the final norm and the head, the head's weight on the left
        rows = torch.cat([r[0, -1:] for r in full.residuals])  # (L + 1, C)
        torch.testing.assert_close(read_out_rows(model, rows), model.read_out(rows[None])[0], atol=TOL, rtol=TOL)
        one = model(x[:1], return_attention=True, return_residuals=True)
    # a decoder's first logits (what its first Step samples from) are the whole forward's last row, and it
    # keeps that row's residual streams
    dec = Decoder(model, ids, Sampling(temperature=0.0))
    torch.testing.assert_close(dec.logits, one.logits[0, -1], atol=TOL, rtol=TOL)
    assert all(torch.equal(torch.from_numpy(a.copy()), b[0]) for a, b in zip(dec.attention, one.attentions))
    assert all(torch.equal(a, b[:, -1:]) for a, b in zip(dec.streams, one.residuals))
    # after a Step through the cache: the new token's streams, as a forward over the whole text has them
    # (in float64, where the two orders of the same sums agree far below any wrong position or token)
    exact = copy.deepcopy(model).double()
    dec = Decoder(exact, ids, Sampling(temperature=0.0))
    next(generate(dec, 1))
    with torch.inference_mode():
        again = exact(torch.tensor([dec.window]), return_residuals=True)
    assert len(dec.streams) == L + 1
    for a, b in zip(dec.streams, again.residuals):
        torch.testing.assert_close(a, b[:, -1:], atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", list(BUILTIN_MODELS))
def test_builtin_models(name):
    ck = load_checkpoint(ASSETS / BUILTIN_MODELS[name].file)
    ids = ck.tokenizer.encode(BUILTIN_MODELS[name].examples[0])
    assert len(ids) >= 6
    check_last(ck.model, ids)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_models(family, tmp_path):
    import transformers
    if family in NEWER:  # their own builders keep the logits near the older families' (tied heads, Gemma's scales)
        model, tok = open_folder(family_folder(family, tmp_path))
        check_last(model, tok.encode(PROMPTS[2]))
        return
    config_class, model_class, options = FAMILIES[family]
    cfg = getattr(transformers, config_class)(**{"vocab_size": VOCAB, **options}, bos_token_id=1, eos_token_id=0)
    torch.manual_seed(0)
    ref = getattr(transformers, model_class)(cfg).eval()
    sharpen(ref, seed=len(family), conv1d=family == "gpt2")
    model, tok = open_folder(save_reference(ref, tmp_path / family, VOCAB))
    check_last(model, tok.encode(PROMPTS[2]))


def test_a_head_with_a_bias():
    """A model whose output head has a bias (ModelConfig.head_bias), random weights of its own."""
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(vocab_size=40, block_size=16, n_layers=2, n_heads=2, d_model=16,
                                  head_bias=True, tie_weights=False)).eval()
    with torch.no_grad():
        model.head.bias.normal_(0.0, 1.0)
    check_last(model, [3, 9, 1, 16, 4, 4, 7, 0, 11, 2])


def test_other_readouts_are_refused():
    ck = load_checkpoint(ASSETS / BUILTIN_MODELS["grammar (built-in)"].file)
    with pytest.raises(ValueError, match='logits must be "all" or "last"'):
        ck.model(torch.tensor([[1, 2]]), logits="first")
