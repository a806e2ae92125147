"""The logit lens read from what the text's decoder keeps (lab.heads.streams_at).

Each row of the lens is the residual stream at the chosen position through the model's final norm
and head. Here it is held to a float64 by-hand forward over the whole window (tests/support/by_hand),
on a RoPE and a learned-position model, with no intervention, with heads ablated and rows edited,
before and after the window slid. A hook on the token embedding tells which path ran: none for the
newest token (its Step kept its streams), the one token against the key/value cache for an earlier
one, or the whole window where no cache fits (mean ablation, a bidirectional mask, a cooled text).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from lab.catalogue.models import ModelEntry
from lab.heads import lens_readout
from lab.text import Text
from model.config import ModelConfig
from model.generate import Decoder, Sampling, generate
from model.interventions import AttentionEdit, Intervention
from model.tokenizers import CharTokenizer
from model.transformer import DecoderLM
from tests.support.by_hand import by_hand

PROMPT = "abcabcab"  # 8 tokens; the context holds 12
BLOCK = 12
ATOL = 1e-6  # float32 against float64, on probabilities
INTERVENTIONS = {
    "none": None,
    # positions are positions in the whole text; query 9 and key 7 stay in the window after it slid
    "zero and a one-hot row": Intervention(heads=[(1, 0)], mode="zero", edits=[AttentionEdit(0, 1, 9, 7)]),
    "uniform and a uniform row": Intervention(heads=[(0, 0)], mode="uniform", edits=[AttentionEdit(1, 1, 6, None)]),
    "keep only one head": Intervention(heads=[(1, 1)], mode="zero", keep_only=True),
    "mean": Intervention(heads=[(1, 1)], mode="mean"),  # needs the whole text: no cache
}


def entry_of(pe: str, mask: str = "causal", seed: int = 0) -> ModelEntry:
    tok = CharTokenizer.train("abcdefgh|=")
    cfg = ModelConfig(vocab_size=tok.vocab_size, block_size=BLOCK, n_layers=2, n_heads=2, d_model=16,
                      pos_encoding=pe, mask=mask)
    torch.manual_seed(seed)
    model = DecoderLM(cfg).eval()
    with torch.no_grad():  # larger than the training init: attention far from uniform, heads that matter
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    return ModelEntry("mine", model, tok, {"corpus": "text"})


def text_of(entry: ModelEntry, iv: Intervention | None, steps: int, capture: bool = True) -> Text:
    """A text of PROMPT and `steps` sampled tokens, generated under `iv` as the decoder runs it."""
    t = Text()
    t.entry = entry
    t.decoder = Decoder(entry.model, entry.tokenizer.encode(PROMPT), Sampling(temperature=1.0, seed=3),
                        capture_attention=capture, intervention=iv, piece=entry.tokenizer.piece)
    for _ in generate(t.decoder, steps, attention="all" if capture else "none"):
        pass
    return t


def reference(t: Text) -> np.ndarray:
    """(L + 1, T, V): every residual stream of a float64 by-hand forward over the window, read out."""
    d = t.decoder
    model = copy.deepcopy(t.entry.model).double()
    iv = None if d.intervention is None else d.intervention.within(d.start, 0, len(d.window))
    streams = []
    with torch.no_grad():
        by_hand(model, torch.tensor([d.window]), ablate=iv.ablated_heads(model.cfg) if iv else (),
                mode=iv.mode if iv else "zero", edits=iv.edits if iv else (), streams=streams)
        logits = torch.stack([model.head(model.norm_f(s[0])) for s in streams])
    return torch.softmax(logits, -1).numpy()


def tokens_run(t: Text, index: int) -> tuple[np.ndarray, list[int]]:
    """The lens at `index`, and how many tokens each forward it made ran (a hook on the embedding)."""
    seen = []
    hook = t.entry.model.tok_emb.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    try:
        lens = lens_readout(t, index)
    finally:
        hook.remove()
    return lens.probs, seen


@pytest.mark.parametrize("pe", ["rope", "learned"])
@pytest.mark.parametrize("name", list(INTERVENTIONS))
@pytest.mark.parametrize("steps", [3, 10], ids=["growing", "slid"])
def test_lens_from_the_cache_is_the_by_hand_readout(pe, name, steps):
    t = text_of(entry_of(pe), INTERVENTIONS[name], steps)
    d = t.decoder
    assert (d.start > 0) == (steps == 10) and len(d.window) == min(len(PROMPT) + steps, BLOCK)
    cached = d.use_cache
    assert cached == (name != "mean")
    before = [(c.k.clone(), c.v.clone()) for c in d.cache.layers] if cached else []
    expect = reference(t)
    T = len(d.window)
    for index in (0, 1, T // 2, T - 2, T - 1):
        probs, seen = tokens_run(t, index)
        assert seen == ([] if index == T - 1 else [1] if cached else [T])  # kept, the token alone, the window
        np.testing.assert_allclose(probs, expect[:, index], atol=ATOL, rtol=0)
        # the tolerance tells positions apart: the neighbour's readout is far from this one's
        other = expect[:, index - 1] if index else expect[:, 1]
        assert np.abs(other - expect[:, index]).max() > 100 * ATOL
    if cached:  # the text's cache is as it was
        assert all(torch.equal(k, c.k) and torch.equal(v, c.v) for (k, v), c in zip(before, d.cache.layers))


@pytest.mark.parametrize("name", ["zero and a one-hot row", "uniform and a uniform row"])
def test_the_intervention_moves_the_lens(name):
    """The lens follows the text's intervention: the same tokens without it read out otherwise."""
    changed = text_of(entry_of("rope"), INTERVENTIONS[name], 3)
    plain = Text()
    plain.entry, plain.decoder = changed.entry, Decoder(changed.entry.model, changed.decoder.ids)
    query = INTERVENTIONS[name].edits[0].query
    assert np.abs(lens_readout(plain, query).probs - lens_readout(changed, query).probs).max() > 100 * ATOL


@pytest.mark.parametrize("capture", [True, False])
@pytest.mark.parametrize("then", ["step", "undo", "slide", "mean"])
def test_at_the_newest_token_the_last_row_is_what_the_step_drew_from(capture, then):
    """The newest token's streams and logits are the ones its Step kept (through the cache, or a prefill
    of the window after an Undo, a slide, under mean ablation): the lens runs nothing and its last row
    is the distribution the next token is drawn from, bit for bit."""
    iv = INTERVENTIONS["mean" if then == "mean" else "zero and a one-hot row"]
    t = text_of(entry_of("learned", seed=1), iv, 10 if then == "slide" else 3, capture)
    d = t.decoder
    if then == "undo":
        assert d.undo()
    probs, seen = tokens_run(t, len(d.window) - 1)
    assert seen == []
    assert np.array_equal(probs[-1], torch.softmax(d.logits.double(), -1).numpy())
    np.testing.assert_allclose(probs, reference(t)[:, -1], atol=ATOL, rtol=0)


def test_a_bidirectional_model_runs_the_whole_window():
    t = text_of(entry_of("learned", mask="bidirectional"), None, 2)
    T = len(t.decoder.window)
    probs, seen = tokens_run(t, 4)
    assert seen == [T] and t.decoder.cache is None
    np.testing.assert_allclose(probs, reference(t)[:, 4], atol=ATOL, rtol=0)


def test_a_cooled_text_runs_the_whole_window():
    """A decoder that gave up its cache and kept streams (Decoder.cool) is read from a whole-window forward."""
    t = text_of(entry_of("rope"), INTERVENTIONS["zero and a one-hot row"], 3)
    T = len(t.decoder.window)
    warm = [lens_readout(t, i).probs for i in (5, T - 1)]
    t.decoder.cool()
    expect = reference(t)
    for index, before in zip((5, T - 1), warm):
        probs, seen = tokens_run(t, index)
        assert seen == [T]
        np.testing.assert_allclose(probs, before, atol=ATOL, rtol=0)
        np.testing.assert_allclose(probs, expect[:, index], atol=ATOL, rtol=0)
