"""model.generate's Undo rewinds the sampler: after Undo, Step draws again the token it took back.

`Decoder.undo` removes the last token and puts the sampler's state back to what it was before that token
was drawn, so a text undone and stepped again is the text it was (a session file's replay, which records
Undo, depends on it). engine/test_generate.py compares two decoders that both undo, which agree even if
neither rewinds; here one decoder's draws are compared with themselves, on a model whose next-token
distribution is spread (all weights 0, output bias log p: p whatever the text), so a sampler that did
not rewind would draw other tokens.
"""

from __future__ import annotations

import pytest
import torch

from model.config import ModelConfig
from model.generate import Decoder, Sampling, generate
from model.transformer import DecoderLM

P = [0.2, 0.2, 0.15, 0.15, 0.1, 0.1, 0.05, 0.05]


@pytest.fixture(scope="module")
def model() -> DecoderLM:
    cfg = ModelConfig(vocab_size=len(P), block_size=64, n_layers=1, n_heads=1, d_model=8, head_bias=True,
                      init="torch")
    m = DecoderLM(cfg).eval()
    with torch.no_grad():
        for param in m.parameters():
            param.zero_()
        m.head.bias.copy_(torch.log(torch.tensor(P)))
    return m


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0, seed=4), Sampling(temperature=1.5, top_k=5, seed=8),
                                      Sampling(temperature=0.9, top_p=0.8, seed=15)])
def test_undo_then_step_draws_the_same_token_again(model, sampling):
    dec = Decoder(model, [0], sampling)
    drawn = [dec.step().token_id for _ in range(12)]
    assert len(set(drawn)) > 2  # a spread distribution: a sampler that did not rewind would show
    for n in range(12):
        state = dec.generator.get_state()
        token = dec.step().token_id
        assert dec.undo()
        assert dec.ids == [0, *drawn]
        assert dec.step().token_id == token, f"step {n}: Undo did not bring back the sampler's state"
        assert dec.undo() and torch.equal(dec.generator.get_state(), state)
        drawn.append(dec.step().token_id)


def test_undoing_a_whole_generate_and_generating_again_gives_the_same_text(model):
    dec = Decoder(model, [1, 2], Sampling(temperature=1.0, seed=23))
    first = [s.token_id for s in generate(dec, 20, attention="none")]
    for _ in range(20):
        assert dec.undo()
    assert dec.ids == [1, 2] and not dec.undo()  # the prompt never goes
    again = [s.token_id for s in generate(dec, 20, attention="none")]
    assert again == first


def test_a_text_undone_part_way_continues_as_the_first_time(model):
    """Undo 5 of 15 tokens, step 5 more: the same 15 tokens, and the text goes on as a fresh decoder's does."""
    s = Sampling(temperature=1.0, top_k=6, seed=42)
    fresh = Decoder(model, [3], s)
    expected = [fresh.step().token_id for _ in range(20)]
    dec = Decoder(model, [3], s)
    for _ in range(15):
        dec.step()
    for _ in range(5):
        dec.undo()
    assert [dec.step().token_id for _ in range(10)] == expected[10:]
    assert dec.ids == [3, *expected]
