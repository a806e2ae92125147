"""model.generate at the edges of its sampling rules: top-p at exactly p, and forced tokens under top-k / top-p.

A replayed text (a session file, a link) forces its recorded tokens into a Decoder; `Decoder.step` must
refuse a token the settings could not have drawn. The greedy case is tested in engine/test_generate.py;
here the sampled ones: a token outside top-k, or outside top-p's nucleus, is refused, and one inside is
taken. The model is real (a DecoderLM) with every weight 0 and its output bias set to log p, so its
next-token distribution is p exactly: probabilities of powers of two, exact in float, so top-p's
cumulative sum lands on p itself and the boundary is tested, not a neighbourhood of it.
"""

from __future__ import annotations

import pytest
import torch

from model.config import ModelConfig
from model.generate import Decoder, Sampling, adjust_probs, generate
from model.transformer import DecoderLM

# no ties among the tokens a rule keeps or drops at its edge: sorting ties may order them either way
P = [0.5, 0.25, 0.125, 0.0625, 0.0625]


def fixed_model(p: list[float]) -> DecoderLM:
    """A model whose next token is drawn from `p` whatever the text: all weights 0, output bias log p."""
    cfg = ModelConfig(vocab_size=len(p), block_size=16, n_layers=1, n_heads=1, d_model=8, head_bias=True,
                      init="torch")
    model = DecoderLM(cfg).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.head.bias.copy_(torch.log(torch.tensor(p, dtype=torch.float32)))
    return model


@pytest.fixture(scope="module")
def model() -> DecoderLM:
    return fixed_model(P)


def decoder(model: DecoderLM, sampling: Sampling) -> Decoder:
    return Decoder(model, [0, 1], sampling)


def test_the_model_s_next_token_distribution_is_p_exactly(model):
    """The premise of every boundary below: no rounding moves the cumulative sums off p."""
    step = decoder(model, Sampling(temperature=1.0)).step()
    assert step.probs.tolist() == P
    assert step.adjusted.tolist() == P


# ------------------------------------------------------------------------------ top-p at exactly p


@pytest.mark.parametrize("top_p, kept", [
    (0.5, [0]),  # token 0 alone holds 0.5: the nucleus is complete, token 1 is not needed
    (0.75, [0, 1]),  # 0.5 + 0.25 = 0.75 exactly
    (0.875, [0, 1, 2]),  # 0.5 + 0.25 + 0.125
])
def test_top_p_at_exactly_p_keeps_the_smallest_set_whose_mass_reaches_p(top_p, kept):
    """Nucleus sampling keeps the most likely tokens until their mass reaches p: a token whose more
    likely tokens already hold p (the sum equal to p, not only above it) is left out."""
    logits = torch.log(torch.tensor(P))
    got = adjust_probs(logits, Sampling(temperature=1.0, top_p=top_p))
    assert torch.nonzero(got).flatten().tolist() == kept
    mass = sum(P[i] for i in kept)
    assert got[kept].tolist() == pytest.approx([P[i] / mass for i in kept], rel=1e-6)


@pytest.mark.parametrize("top_p, kept", [(0.5 + 2**-20, [0, 1]), (0.75 + 2**-20, [0, 1, 2])])
def test_top_p_just_past_the_mass_takes_the_next_token(top_p, kept):
    logits = torch.log(torch.tensor(P))
    got = adjust_probs(logits, Sampling(temperature=1.0, top_p=top_p))
    assert torch.nonzero(got).flatten().tolist() == kept


# ------------------------------------------------------------------------------ forced tokens


def refused(model: DecoderLM, sampling: Sampling, token: int) -> None:
    dec = decoder(model, sampling)
    ids, state = list(dec.ids), dec.generator.get_state()
    with pytest.raises(ValueError, match=f"token {token} cannot come next with these sampling settings"):
        dec.step(force=token)
    assert dec.ids == ids  # nothing taken: the text and the sampler are as they were
    assert torch.equal(dec.generator.get_state(), state)


def accepted(model: DecoderLM, sampling: Sampling, token: int) -> None:
    dec = decoder(model, sampling)
    step = dec.step(force=token)
    assert step.token_id == token and dec.ids[-1] == token
    assert step.adjusted[token] > 0


@pytest.mark.parametrize("top_k, inside, outside", [(1, [0], [1, 2, 3, 4]), (2, [0, 1], [2, 3, 4]),
                                                    (3, [0, 1, 2], [3, 4])])
def test_a_forced_token_outside_top_k_is_refused_one_inside_is_taken(model, top_k, inside, outside):
    s = Sampling(temperature=1.0, top_k=top_k, seed=3)
    for token in inside:
        accepted(model, s, token)
    for token in outside:  # each has probability > 0 before top-k: only top-k rules it out
        refused(model, s, token)


@pytest.mark.parametrize("top_p, inside, outside", [
    (0.5, [0], [1, 2, 3, 4]),  # at exactly p: token 1 is outside the nucleus
    (0.6, [0, 1], [2, 3, 4]),
    (0.75, [0, 1], [2, 3, 4]),  # at exactly p again
    (0.8, [0, 1, 2], [3, 4]),
])
def test_a_forced_token_outside_top_p_is_refused_one_inside_is_taken(model, top_p, inside, outside):
    s = Sampling(temperature=1.0, top_p=top_p, seed=3)
    for token in inside:
        accepted(model, s, token)
    for token in outside:
        refused(model, s, token)


def test_without_top_k_or_top_p_every_token_may_be_forced(model):
    """The refusals above come from top-k and top-p alone: sampled plainly, the least likely token is taken."""
    for t in (0.5, 1.0, 2.0):
        accepted(model, Sampling(temperature=t, seed=1), len(P) - 1)


def test_top_k_and_top_p_together_a_forced_token_must_pass_both(model):
    """top-k 3 leaves 0.5, 0.25, 0.125 (mass 0.875); top-p 0.8 of that (0.7) needs tokens 0 and 1 only."""
    s = Sampling(temperature=1.0, top_k=3, top_p=0.8, seed=5)
    assert torch.nonzero(adjust_probs(torch.log(torch.tensor(P)), s)).flatten().tolist() == [0, 1]
    accepted(model, s, 1)
    refused(model, s, 2)  # inside top-k, outside top-p
    refused(model, s, 3)  # outside both


def test_generate_refuses_a_forced_run_with_one_token_outside_the_settings(model):
    """A replay of a Generate (several forced tokens): the first token the settings rule out stops it there."""
    s = Sampling(temperature=1.0, top_k=2, seed=9)
    dec = decoder(model, s)
    steps = generate(dec, 3, force=[1, 0, 1], attention="none")
    assert [st.token_id for st in steps] == [1, 0, 1]
    dec = decoder(model, s)
    made = []
    with pytest.raises(ValueError, match="token 2 cannot come next"):
        for st in generate(dec, 3, force=[0, 2, 1], attention="none"):
            made.append(st.token_id)
    assert made == [0] and dec.ids == [0, 1, 0]


def test_the_forced_tokens_advance_the_sampler_as_drawing_would(model):
    """After forced tokens the text goes on as if they had been drawn: the same sampler state, so the same
    next token as a decoder that drew them itself."""
    s = Sampling(temperature=1.0, top_k=3, top_p=0.8, seed=17)
    drawn = decoder(model, s)
    tokens = [drawn.step().token_id for _ in range(6)]
    forced = decoder(model, s)
    for t in tokens:
        forced.step(force=t)
    assert torch.equal(forced.generator.get_state(), drawn.generator.get_state())
    assert [forced.step().token_id for _ in range(8)] == [drawn.step().token_id for _ in range(8)]
