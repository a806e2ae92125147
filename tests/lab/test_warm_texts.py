"""Warm and cold texts (lab/server/warm.py, lab.text.Text.cool, model.generate.Decoder.cool): a text whose heavy
part (attention and scores, key/value cache, older distributions) was dropped computes it again from the
same weights when used, and then shows the same numbers (allclose 1e-6: float32 rounding of another
batch shape), gives back the same distributions, and samples the same next tokens; the server's store
of warm texts keeps the most recently used within its bytes, and the memory budget holds what each text
holds, warm or cold.

In process, on real lab Sessions: a built-in model, and a random GPT-2 folder with a 50,257-row output
(a small tokenizer: the rest is padding rows, never sampled) opened as the app opens a --model folder.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lab import session as session_mod
from lab.catalogue.external import ExternalModels, parse_source
from lab.server import budget
from lab.server.warm import COOL_FROM_BYTES, WarmTexts
from lab.session import Session
from model.generate import Sampling
from tests.support.families import save_reference

ATOL = 1e-6  # float32 rounding of another batch shape (Decoder.rewarm, Text._restored)
# the pre-softmax scores are not bounded by 1 (|s| up to ~10 here): the same rounding reaches a few 1e-6
SCORES_TOL = 1e-5
GRAMMAR = "grammar (built-in)"
SETTINGS = [Sampling(temperature=0.8, seed=7), Sampling(temperature=1.2, top_k=5, seed=7),
            Sampling(temperature=0.9, top_p=0.8, seed=7)]  # one text, the settings changed between Steps


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A random GPT-2 with 12 heads and GPT-2's 50,257-row output, shared by every session as a --model is."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tmp = tmp_path_factory.mktemp("warm")
    torch.manual_seed(0)
    ref = GPT2LMHeadModel(GPT2Config(n_positions=128, vocab_size=50_257, n_embd=48, n_layer=2, n_head=12,
                                     bos_token_id=1, eos_token_id=0, attn_implementation="eager")).eval()
    folder = save_reference(ref, tmp / "gpt2-12-heads", 300)
    return ExternalModels([parse_source(str(folder))], tmp / "hashes.json")


@pytest.fixture
def store(monkeypatch):
    """A store of warm texts of the test's own, in place of the server's (no bound unless a test sets one)."""
    s = WarmTexts(limit_bytes=2**40)
    monkeypatch.setattr(session_mod, "WARM", s)
    return s


def session_on(external=None) -> Session:
    s = Session()
    if external is not None:
        s.external = external
    return s


def model_and_prompt(external):
    if external is None:
        return GRAMMAR, Session().entry_for(GRAMMAR).examples[0]
    return external.names[0], "Once upon a time there was a little fox"


def act(s: Session, fn, *args):
    """One action as the wiring runs it: inside the session's turn (which tells the store at its end)."""
    with s.turn():
        return fn(*args)


def steps(s: Session, name, prompt, n: int, offset: int = 0) -> list[int]:
    return [act(s, s.step, name, prompt, SETTINGS[(offset + i) % len(SETTINGS)]).step.token_id for i in range(n)]


def assert_same_numbers(a: Session, b: Session) -> None:
    """Tokens, every layer's attention and scores, every token's distributions: equal up to ATOL."""
    assert a.tokens() == b.tokens() and a.decoder.ids == b.decoder.ids
    att_a, att_b = act(a, a.attention), act(b, b.attention)
    for x, y in zip(att_a.weights, att_b.weights):
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y, atol=ATOL, rtol=0)
    for x, y in zip(att_a.scores, att_b.scores):  # unbounded: the same rounding, relative to their size
        np.testing.assert_allclose(x, y, atol=SCORES_TOL, rtol=SCORES_TOL)  # -inf where masked, in both
    for i in range(1, len(a.tokens())):
        p, q = act(a, a.probabilities, i), act(b, b.probabilities, i)
        assert (p.chosen, p.typed, p.resampled) == (q.chosen, q.typed, q.resampled)
        np.testing.assert_allclose(p.probs, q.probs, atol=ATOL, rtol=0)
        if p.adjusted is not None:
            np.testing.assert_allclose(p.adjusted, q.adjusted, atol=ATOL, rtol=0)
    assert a.status() == b.status()


@pytest.mark.parametrize("which", ["built-in", "gpt2"])
def test_a_cooled_text_shows_the_same_numbers_and_samples_the_same_tokens(which, gpt2, store):
    external = gpt2 if which == "gpt2" else None
    name, prompt = model_and_prompt(external)
    cooled, plain = session_on(external), session_on(external)
    assert steps(cooled, name, prompt, 5) == steps(plain, name, prompt, 5)
    warm_bytes, kept_last = cooled.text.nbytes(), cooled.last_step
    assert cooled.text.heavy_nbytes() > 0 and cooled.cool_text()
    # what stays: tokens, the sampler's states and the last token's distributions (the status line's)
    assert cooled.text.heavy_nbytes() == 0 and not cooled.decoder.warm
    assert cooled.text.nbytes() == cooled.decoder.undo_bytes + kept_last.probs.nbytes + kept_last.adjusted.nbytes
    assert cooled.text.nbytes() < warm_bytes and cooled.last_step is kept_last
    assert cooled.status() == plain.status()  # read without warming up
    assert_same_numbers(cooled, plain)  # computed again when read
    shown_a, shown_b = act(cooled, cooled.shown, 0, "all", "weights"), act(plain, plain.shown, 0, "all", "weights")
    for x, y in zip(shown_a.attention.weights, shown_b.attention.weights):
        np.testing.assert_allclose(x, y, atol=ATOL, rtol=0)
    np.testing.assert_allclose(shown_a.probs.adjusted, shown_b.probs.adjusted, atol=ATOL, rtol=0)
    # the sampler goes on from the state it had: the same next tokens, cooled before each Step
    for i in range(4):
        assert cooled.cool_text()
        assert steps(cooled, name, prompt, 1, offset=i) == steps(plain, name, prompt, 1, offset=i)
    assert_same_numbers(cooled, plain)


def test_undo_on_a_cooled_text_brings_back_the_distribution_it_was_drawn_from(store):
    name, prompt = model_and_prompt(None)
    cooled, plain = session_on(), session_on()
    steps(cooled, name, prompt, 4)
    steps(plain, name, prompt, 4)
    assert cooled.cool_text()
    assert act(cooled, cooled.undo).undone and act(plain, plain.undo).undone
    assert cooled.last_step.token_id == plain.last_step.token_id
    np.testing.assert_allclose(cooled.last_step.adjusted, plain.last_step.adjusted, atol=ATOL, rtol=0)
    assert_same_numbers(cooled, plain)
    assert steps(cooled, name, prompt, 2) == steps(plain, name, prompt, 2)  # the restored sampler state
    assert len(cooled.drawn) == len(plain.drawn) == 5
    for x, y in zip(cooled.drawn, plain.drawn):
        assert x.token_id == y.token_id and x.sampling == y.sampling
        np.testing.assert_allclose(x.probs, y.probs, atol=ATOL, rtol=0)


def test_a_busy_session_keeps_its_text_warm(store):
    name, prompt = model_and_prompt(None)
    s = session_on()
    steps(s, name, prompt, 2)
    with s.turn():
        assert not s.cool_text() and s.decoder.warm  # acting now: nothing is taken
    assert s.cool_text() and not s.decoder.warm


def test_the_store_keeps_the_most_recently_used_texts_within_its_bytes(gpt2, store):
    name, prompt = model_and_prompt(gpt2)
    crowd = [session_on(gpt2) for _ in range(6)]
    for s in crowd:
        steps(s, name, prompt, 3)
    one = crowd[0].text.heavy_nbytes()
    assert store.total == 6 * one  # no bound yet: all warm
    store.limit_bytes = 2 * one + one // 2  # room for about two
    for rnd in range(3):
        for s in crowd:
            steps(s, name, prompt, 1, offset=rnd)
            assert s.decoder.warm  # the one that just acted stays warm
            held = sum(x.text.heavy_nbytes() for x in crowd)
            assert store.total == held <= store.limit_bytes + s.text.heavy_nbytes()
        # the warm texts are the most recently used ones (the sessions acted in the crowd's order)
        warm = [x.decoder.warm for x in crowd]
        assert warm == sorted(warm) and 1 <= sum(warm) <= 3, warm
        assert all(x.text.heavy_nbytes() == 0 for x in crowd if not x.decoder.warm)
    # the cooled texts go on as texts never cooled do
    plain = session_on(gpt2)
    store.limit_bytes = 2**40
    assert steps(plain, name, prompt, 6) == [int(t) for t in crowd[0].decoder.ids[-6:]]
    for i in range(3):
        plain_next = steps(plain, name, prompt, 1, offset=i)
        assert steps(crowd[0], name, prompt, 1, offset=i) == plain_next
    assert_same_numbers(crowd[0], plain)
    for s in [*crowd, plain]:  # a closed session counts for nothing
        s.close()
    assert store.total == 0


def test_the_memory_budget_holds_what_each_text_holds_warm_or_cold(gpt2, store, monkeypatch):
    """With room for two warm texts in the store, the budget counts the others cold: more sessions step than
    their warm size would allow, and every text stays within what the budget holds for it."""
    name, prompt = model_and_prompt(gpt2)
    probe = session_on(gpt2)
    steps(probe, name, prompt, 1)
    warm, heavy = probe.text.warm_bytes(), probe.text.heavy_nbytes()  # what the budget reserves, what it holds
    probe.close()
    store.limit_bytes = 2 * heavy
    b = budget.ModelBudget(limit_bytes=4 * warm, client_limit_bytes=4 * warm)
    monkeypatch.setattr(session_mod, "MODEL_BUDGET", b)
    crowd = [session_on(gpt2) for _ in range(8)]  # 8 warm texts would be twice the budget
    for rnd in range(2):
        for s in crowd:
            steps(s, name, prompt, 1, offset=rnd)
            assert all(x.text.nbytes() <= b.held(x) for x in crowd)
            assert sum(x.text.nbytes() for x in crowd) <= b.total <= b.limit_bytes
    cold = [x for x in crowd if not x.decoder.warm]
    assert len(cold) >= 5 and all(b.held(x) == x.text.nbytes() for x in cold)  # cold: what it keeps
    # a cooled text asks the budget again before it warms up: here the budget has room
    first = crowd[0]
    before = b.held(first)
    act(first, first.attention)
    assert first.decoder.warm and b.held(first) == first.text.warm_bytes() > before


def test_a_text_too_small_to_matter_stays_warm_and_the_rest_still_cools(gpt2, store):
    """Decided by bytes: a short text on the sort model holds less than COOL_FROM_BYTES and is never asked."""
    small = session_on()
    steps(small, "sort digits (built-in)", "503124=", 1)
    assert 0 < small.text.heavy_nbytes() < COOL_FROM_BYTES
    name, prompt = model_and_prompt(gpt2)
    big = [session_on(gpt2) for _ in range(2)]
    store.limit_bytes = 0  # nothing but the newest may stay warm
    for s in big:
        steps(s, name, prompt, 2)
    assert small.decoder.warm and not big[0].decoder.warm and big[1].decoder.warm
    assert store.total == small.text.heavy_nbytes() + big[1].text.heavy_nbytes()
