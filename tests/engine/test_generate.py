"""Behaviour of model.generate: sampling rules, the incremental Decoder, generate() and its CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from model.config import ModelConfig
from model.checkpoint import load_checkpoint
from model.cli import generate_main, generate_parser
from model.generate import GENERATE_ATTENTION, SEED_RANGE, Decoder, Sampling, adjust_probs, generate
from model.transformer import DecoderLM

SORT = Path(__file__).resolve().parents[2] / "assets" / "sort.safetensors"

VOCAB = 11
BLOCK = 8


def make_model(pos: str = "learned", seed: int = 0, init: str = "torch", **kw) -> DecoderLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=VOCAB, block_size=BLOCK, n_layers=2, n_heads=2, d_model=16,
                      pos_encoding=pos, init=init, **kw)
    return DecoderLM(cfg).eval()


@pytest.fixture(scope="module")
def model() -> DecoderLM:
    return make_model()


def full_forward(model: DecoderLM, ids: list[int]):
    with torch.no_grad():
        return model(torch.tensor([ids]), return_attention=True)


# ------------------------------------------------------------------------------ Sampling


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=float("nan")),
        dict(temperature=float("inf")),
        dict(temperature=-0.1),
        dict(temperature=2.01),
        dict(temperature="1"),
        dict(top_k=-1),
        dict(top_k=True),
        dict(top_k=2.0),
        dict(top_p=0.0),
        dict(top_p=0.04),
        dict(top_p=1.01),
        dict(top_p=float("nan")),
        dict(seed=-1),
        dict(seed=SEED_RANGE[1] + 1),
        dict(seed=True),
        dict(seed=1.5),
    ],
)
def test_sampling_rejects_bad_values(kw):
    with pytest.raises(ValueError):
        Sampling(**kw)


@pytest.mark.parametrize(
    "kw", [dict(temperature=0), dict(temperature=2.0), dict(top_k=0), dict(top_k=50), dict(top_p=0.05),
           dict(top_p=1.0), dict(seed=0), dict(seed=SEED_RANGE[1])]
)
def test_sampling_accepts_boundaries(kw):
    s = Sampling(**kw)
    for k, v in kw.items():
        assert getattr(s, k) == v


# ------------------------------------------------------------------------------ adjust_probs


def softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, 3.0, -1.0])
    for t in (0.5, 1.0, 1.7, 2.0):
        got = adjust_probs(logits, Sampling(temperature=t))
        want = softmax([x / t for x in logits.tolist()])
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-7)
    # hand-computed: T=0.5 on [0, ln 2] -> softmax([0, 2 ln 2]) = [1/5, 4/5]
    got = adjust_probs(torch.tensor([0.0, math.log(2)]), Sampling(temperature=0.5))
    np.testing.assert_allclose(got.numpy(), [0.2, 0.8], rtol=1e-5)


def test_lower_temperature_sharpens():
    logits = torch.tensor([0.3, 1.0, 2.0])
    p_cold = adjust_probs(logits, Sampling(temperature=0.3))
    p_hot = adjust_probs(logits, Sampling(temperature=2.0))
    assert p_cold[2] > p_hot[2]
    assert p_cold[0] < p_hot[0]


def test_greedy_is_one_hot_at_argmax():
    logits = torch.tensor([0.1, 5.0, -3.0, 4.9])
    got = adjust_probs(logits, Sampling(temperature=0, top_k=2, top_p=0.5))
    assert got.tolist() == [0.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("t", [1e-6, 1e-30, 1e-40, 1e-300])
def test_tiny_temperature_is_nearly_greedy_not_nan(t):
    logits = torch.tensor([1.0, 2.0, 3.0, 2.5])
    got = adjust_probs(logits, Sampling(temperature=t))
    assert torch.isfinite(got).all()
    assert got.tolist() == [0.0, 0.0, 1.0, 0.0]


def test_top_k_keeps_exactly_k():
    logits = torch.tensor([1.0, 2.0, 3.0, 0.0, -1.0])
    got = adjust_probs(logits, Sampling(temperature=1.0, top_k=2))
    e2, e3 = math.exp(2), math.exp(3)
    np.testing.assert_allclose(got.numpy(), [0, e2 / (e2 + e3), e3 / (e2 + e3), 0, 0], rtol=1e-5, atol=1e-7)
    for k in (1, 3, 4):
        assert int((adjust_probs(logits, Sampling(temperature=1.0, top_k=k)) > 0).sum()) == k


def test_top_k_larger_than_vocab_is_off():
    logits = torch.tensor([1.0, 2.0, 3.0])
    a = adjust_probs(logits, Sampling(temperature=1.0, top_k=10))
    b = adjust_probs(logits, Sampling(temperature=1.0))
    assert torch.equal(a, b)


def test_top_k_with_ties_keeps_the_best():
    logits = torch.tensor([1.0, 1.0, 1.0, 0.0])
    got = adjust_probs(logits, Sampling(temperature=1.0, top_k=2))
    kept = got > 0
    assert int(kept.sum()) >= 2
    assert not kept[3]


@pytest.mark.parametrize(
    "top_p, kept",
    [(0.05, [0]), (0.45, [0]), (0.75, [0, 1]), (0.85, [0, 1, 2]), (0.97, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3])],
)
def test_top_p_keeps_smallest_set_reaching_p(top_p, kept):
    p = [0.5, 0.3, 0.15, 0.05]
    order = [2, 0, 3, 1]  # shuffle positions so sorting matters
    logits = torch.empty(4)
    for rank, pos in enumerate(order):
        logits[pos] = math.log(p[rank])
    got = adjust_probs(logits, Sampling(temperature=1.0, top_p=top_p))
    kept_pos = sorted(order[r] for r in kept)
    assert sorted(torch.nonzero(got).flatten().tolist()) == kept_pos
    mass = sum(p[r] for r in kept)
    for r in kept:
        assert got[order[r]].item() == pytest.approx(p[r] / mass, rel=1e-5)


def test_top_k_then_top_p_combine():
    p = [0.4, 0.3, 0.2, 0.1]
    logits = torch.tensor([math.log(x) for x in p])
    # top-k 3 renormalises to [4/9, 3/9, 2/9]; top-p 0.7 then needs the first two (7/9 >= 0.7).
    got = adjust_probs(logits, Sampling(temperature=1.0, top_k=3, top_p=0.7))
    np.testing.assert_allclose(got.numpy(), [4 / 7, 3 / 7, 0, 0], rtol=1e-5, atol=1e-7)


@settings(max_examples=60, deadline=None)
@given(
    logits=st.lists(st.floats(-20, 20, allow_nan=False), min_size=1, max_size=30),
    t=st.floats(0.0, 2.0),
    k=st.integers(0, 40),
    p=st.floats(0.05, 1.0),
)
def test_adjusted_is_a_distribution_and_keeps_the_top(logits, t, k, p):
    x = torch.tensor(logits)
    got = adjust_probs(x, Sampling(temperature=t, top_k=k, top_p=p))
    assert got.shape == x.shape
    assert torch.isfinite(got).all() and (got >= 0).all()
    assert got.sum().item() == pytest.approx(1.0, abs=1e-5)
    plain = adjust_probs(x, Sampling(temperature=max(t, 1e-3)))
    assert bool(((got > 0) & (plain == plain.max())).any())  # a most likely token always survives
    if k:
        assert int((got > 0).sum()) >= min(1, k)


# ------------------------------------------------------------------------------ Decoder


def tokens_of(model, prompt, sampling, n, **kw):
    dec = Decoder(model, list(prompt), sampling, **kw)
    return [dec.step().token_id for _ in range(n)], dec


def test_same_seed_same_tokens_different_seed_different_tokens():
    m = make_model(seed=3, init="gpt2")  # nearly uniform next-token distribution
    s = Sampling(temperature=1.0, seed=123)
    a, _ = tokens_of(m, [1, 2], s, 20)
    b, _ = tokens_of(m, [1, 2], s, 20)
    c, _ = tokens_of(m, [1, 2], Sampling(temperature=1.0, seed=124), 20)
    assert a == b
    assert a != c
    assert len(set(a)) > 3  # actually sampling, not stuck on one token


def test_decoder_never_touches_global_rng(model):
    torch.manual_seed(999)
    before = torch.random.get_rng_state().clone()
    tokens_of(model, [1, 2, 3], Sampling(temperature=1.0, top_k=5, top_p=0.9, seed=7), 20)
    tokens_of(model, [1, 2, 3], Sampling(temperature=1.0, seed=8), 20, use_cache=False)
    assert torch.equal(before, torch.random.get_rng_state())


def test_empty_prompt_rejected(model):
    with pytest.raises(ValueError):
        Decoder(model, [])


@pytest.mark.parametrize("pos", ["learned", "rope", "sinusoidal", "none"])
def test_attention_grows_and_equals_full_forward(pos):
    m = make_model(pos)
    prompt = [3, 1, 4]
    dec = Decoder(m, list(prompt), Sampling(temperature=1.0, seed=5))
    full = full_forward(m, dec.window)
    for layer, a in enumerate(dec.attention):
        np.testing.assert_allclose(a, full.attentions[layer][0].numpy(), atol=1e-5)
    for _ in range(BLOCK - len(prompt)):
        old = [a.copy() for a in dec.attention]
        before = list(dec.window)
        step = dec.step()
        assert not step.cropped
        full_before = full_forward(m, before)
        np.testing.assert_allclose(step.probs, torch.softmax(full_before.logits[0, -1], -1).numpy(), atol=1e-6)
        assert step.probs.sum() == pytest.approx(1.0, abs=1e-5)
        T = len(dec.window)
        assert dec.window == before + [step.token_id]
        assert step.position == T - 1
        full = full_forward(m, dec.window)
        for layer, a in enumerate(dec.attention):
            assert a.shape == (2, T, T)
            assert np.array_equal(a[:, : T - 1, : T - 1], old[layer])  # earlier rows untouched
            np.testing.assert_allclose(a, full.attentions[layer][0].numpy(), atol=1e-5)
            assert np.all(a[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0.0)  # exactly 0
            np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-5)
            assert step.rows[layer].shape == (2, 1, T)
            np.testing.assert_array_equal(step.rows[layer][:, 0], a[:, -1])


def test_without_cache_same_tokens_and_probs(model):
    s = Sampling(temperature=1.0, top_k=6, seed=11)
    a = Decoder(model, [1, 2], s)
    b = Decoder(model, [1, 2], s, use_cache=False)
    for _ in range(12):  # runs past block_size too
        sa, sb = a.step(), b.step()
        assert sa.token_id == sb.token_id
        assert sa.cropped == sb.cropped
        np.testing.assert_allclose(sa.probs, sb.probs, atol=1e-6)
        np.testing.assert_allclose(sa.adjusted, sb.adjusted, atol=1e-6)
        for x, y in zip(a.attention, b.attention):
            np.testing.assert_allclose(x, y, atol=1e-5)
    assert a.ids == b.ids


def test_adjusted_is_what_was_sampled(model):
    dec = Decoder(model, [1], Sampling(temperature=0.7, top_k=3, seed=2))
    for _ in range(10):
        step = dec.step()
        assert (step.adjusted > 0).sum() <= 3
        assert step.adjusted[step.token_id] > 0
        np.testing.assert_allclose(
            step.adjusted, adjust_probs(torch.log(torch.from_numpy(step.probs)), dec.sampling).numpy(), atol=1e-5
        )


def test_greedy_follows_argmax(model):
    dec = Decoder(model, [5, 6], Sampling(temperature=0))
    for _ in range(10):
        step = dec.step()
        assert step.token_id == int(np.argmax(step.probs))


def test_cropping_past_block_size(model):
    prompt = [1, 2, 3, 4, 5]
    dec = Decoder(model, list(prompt), Sampling(temperature=1.0, seed=4))
    assert not dec.cropped_prompt
    flags = []
    for i in range(10):
        step = dec.step()
        flags.append(step.cropped)
        assert len(dec.window) == min(BLOCK, len(prompt) + i + 1)
        assert dec.window == dec.ids[-len(dec.window):]
        assert step.position == len(prompt) + i
        full = full_forward(model, dec.window)
        for layer, a in enumerate(dec.attention):
            np.testing.assert_allclose(a, full.attentions[layer][0].numpy(), atol=1e-5)
            if step.cropped:
                assert step.rows[layer].shape == (2, BLOCK, BLOCK)
    assert flags == [False, False, False] + [True] * 7
    assert len(dec.ids) == len(prompt) + 10


def test_probs_after_crop_come_from_the_window(model):
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]  # exactly fills the window
    dec = Decoder(model, list(prompt), Sampling(temperature=0))
    first = dec.step()
    assert first.cropped  # a 9th token does not fit: the window slides
    assert dec.window == prompt[1:] + [first.token_id]
    np.testing.assert_allclose(first.probs, torch.softmax(full_forward(model, prompt).logits[0, -1], -1).numpy(),
                               atol=1e-6)
    second = dec.step()
    assert second.cropped
    full = full_forward(model, dec.ids[-BLOCK - 1 : -1])  # the window the second token was chosen from
    np.testing.assert_allclose(second.probs, torch.softmax(full.logits[0, -1], -1).numpy(), atol=1e-6)


def test_long_prompt_keeps_its_last_tokens(model):
    prompt = list(range(VOCAB)) + [3, 2]  # 13 tokens > block_size 8
    dec = Decoder(model, list(prompt), Sampling(temperature=0))
    assert dec.cropped_prompt
    assert dec.window == prompt[-BLOCK:]
    assert dec.attention[0].shape == (2, BLOCK, BLOCK)
    step = dec.step()
    full = full_forward(model, prompt[-BLOCK:])
    np.testing.assert_allclose(step.probs, torch.softmax(full.logits[0, -1], -1).numpy(), atol=1e-6)
    assert step.position == len(prompt)
    assert dec.ids[: len(prompt)] == prompt


def test_capture_attention_off(model):
    dec = Decoder(model, [1, 2], Sampling(temperature=0), capture_attention=False)
    ref = Decoder(model, [1, 2], Sampling(temperature=0))
    for _ in range(8):
        s, r = dec.step(), ref.step()
        assert s.token_id == r.token_id
        assert s.rows == []
    assert dec.attention == [] and dec.scores == []


# ------------------------------------------------------------------------------ generate()


def ids_of(steps) -> list[int]:
    return [s.token_id for s in steps]


def test_generate_stops_at_max_new_tokens(model):
    s = Sampling(temperature=1.0, seed=1)
    assert len(list(generate(Decoder(model, [1, 2], s), 5))) == 5
    assert list(generate(Decoder(model, [1, 2], s), 0)) == []


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None])
def test_generate_rejects_bad_max_new_tokens_when_called(model, bad):
    dec = Decoder(model, [1, 2])
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(dec, bad)  # at the call, before any next()
    assert dec.ids == [1, 2]


def test_generate_rejects_unknown_attention_naming_it(model):
    assert GENERATE_ATTENTION == ("all", "last", "none")
    with pytest.raises(ValueError, match="'every'"):
        generate(Decoder(model, [1, 2]), 3, attention="every")


def test_generate_stops_at_eos(model):
    s = Sampling(temperature=1.0, seed=9)
    free = ids_of(generate(Decoder(model, [1, 2], s), 15))
    # choose as EOS a token that first appears after a few steps
    idx = next(i for i in range(2, 15) if free[i] not in free[:i])
    eos = free[idx]
    steps = list(generate(Decoder(model, [1, 2], s, eos_id=eos, piece=lambda i: f"<{i}>"), 15))
    assert ids_of(steps) == free[: idx + 1]
    assert steps[-1].eos and not any(x.eos for x in steps[:-1])
    assert steps[-1].piece == f"<{eos}>"


def test_generate_does_not_mutate_prompt(model):
    prompt = [1, 2, 3]
    dec = Decoder(model, prompt, Sampling(temperature=0))
    list(generate(dec, 4))
    assert prompt == [1, 2, 3]
    assert len(dec.ids) == 7


def test_generate_continues_the_decoders_text(model):
    s = Sampling(temperature=1.0, top_k=5, seed=21)
    whole = ids_of(generate(Decoder(model, [4, 5], s), 9))
    dec = Decoder(model, [4, 5], s)
    parts = ids_of(generate(dec, 4)) + ids_of(generate(dec, 1)) + ids_of(generate(dec, 4))
    assert parts == whole
    assert dec.ids == [4, 5] + whole


def test_generate_sampling_overrides_the_decoders(model):
    dec = Decoder(model, [1, 2], Sampling(temperature=2.0, seed=3))
    for step in generate(dec, 6, Sampling(temperature=0)):
        assert step.token_id == int(np.argmax(step.probs))


def attention_run(m, prompt, n, attention, **kw):
    dec = Decoder(m, list(prompt), Sampling(temperature=1.0, seed=17), **kw)
    return ids_of(generate(dec, n, attention=attention)), dec


def assert_same_attention(a: Decoder, b: Decoder, exact: bool) -> None:
    assert len(a.attention) == len(b.attention) == 2 and len(a.scores) == len(b.scores) == 2
    for x, y in [*zip(a.attention, b.attention), *zip(a.scores, b.scores)]:
        if exact:
            assert np.array_equal(x, y)
        else:  # incremental rows and a one-off recompute differ only by float rounding
            np.testing.assert_allclose(x, y, atol=1e-6)


@pytest.mark.parametrize("pos", ["learned", "rope"])
@pytest.mark.parametrize("n", [3, 9])  # inside the window, and past it (the window slides)
def test_last_without_cache_equals_all_exactly(pos, n):
    # Without a cache "all" recomputes the window at every step, so its final attention is the
    # same computation "last" does once at the end: bit-for-bit equal.
    m = make_model(pos)
    all_ids, all_dec = attention_run(m, [1, 2, 3], n, "all", use_cache=False)
    last_ids, last_dec = attention_run(m, [1, 2, 3], n, "last", use_cache=False)
    assert last_ids == all_ids
    assert last_dec.capture_attention
    assert_same_attention(all_dec, last_dec, exact=True)


@pytest.mark.parametrize("pos", ["learned", "rope", "sinusoidal", "none"])
def test_last_with_cache_matches_all(pos):
    m = make_model(pos)
    all_ids, all_dec = attention_run(m, [1, 2], 4, "all")
    last_ids, last_dec = attention_run(m, [1, 2], 4, "last")
    assert last_ids == all_ids
    assert_same_attention(all_dec, last_dec, exact=False)
    # once the window has slid on the final step, "all" recomputed it too: exactly equal again
    all_ids, all_dec = attention_run(m, [1, 2], 10, "all")
    last_ids, last_dec = attention_run(m, [1, 2], 10, "last")
    assert last_ids == all_ids
    assert_same_attention(all_dec, last_dec, exact=True)


def test_last_steps_carry_no_rows_and_the_final_step_sees_attention(model):
    dec = Decoder(model, [1, 2], Sampling(temperature=1.0, seed=2))
    seen = []
    for step in generate(dec, 4, attention="last"):
        assert step.rows == []
        seen.append([a.shape for a in dec.attention])
    # during the loop nothing is captured; the final step already sees the whole window
    assert seen[:-1] == [[]] * 3 and seen[-1] == [(2, 6, 6)] * 2
    full = full_forward(model, dec.window)
    for a, f in zip(dec.attention, full.attentions):
        np.testing.assert_allclose(a, f[0].numpy(), atol=1e-5)


def test_last_restores_attention_when_closed_early(model):
    # use_cache=False makes "all" a recompute per step, so the comparison can be exact
    ref = Decoder(model, [3, 1], Sampling(temperature=1.0, seed=8), use_cache=False)
    list(generate(ref, 3))
    dec = Decoder(model, [3, 1], Sampling(temperature=1.0, seed=8), use_cache=False)
    gen = generate(dec, 10, attention="last")
    got = [next(gen).token_id for _ in range(3)]
    assert dec.attention == [] and not dec.capture_attention  # still decoding without capture
    gen.close()
    assert got == ref.ids[2:] and dec.ids == ref.ids
    assert dec.capture_attention
    assert_same_attention(ref, dec, exact=True)
    # a decoder that was not capturing still gets the final attention, and its setting back
    off = Decoder(model, [3, 1], Sampling(temperature=1.0, seed=8), use_cache=False, capture_attention=False)
    gen = generate(off, 10, attention="last")
    next(gen), next(gen), next(gen)
    gen.close()
    assert not off.capture_attention
    assert_same_attention(ref, off, exact=True)


def test_last_restores_the_previous_capture_setting(model):
    dec = Decoder(model, [1, 2], Sampling(temperature=0), capture_attention=False)
    list(generate(dec, 3, attention="last"))
    assert not dec.capture_attention  # back to off, but the final window's attention is there
    full = full_forward(model, dec.window)
    for a, f in zip(dec.attention, full.attentions):
        np.testing.assert_allclose(a, f[0].numpy(), atol=1e-5)


def test_all_captures_even_on_a_decoder_without_capture(model):
    dec = Decoder(model, [1, 2], Sampling(temperature=0), capture_attention=False)
    steps = list(generate(dec, 3, attention="all"))
    assert all(len(s.rows) == 2 for s in steps)
    assert not dec.capture_attention and dec.attention[0].shape == (2, 5, 5)


def test_none_never_captures_and_gives_the_same_tokens(model):
    all_ids, _ = attention_run(model, [1, 2], 10, "all")
    dec = Decoder(model, [1, 2], Sampling(temperature=1.0, seed=17))
    steps = list(generate(dec, 10, attention="none"))
    assert ids_of(steps) == all_ids
    assert all(s.rows == [] for s in steps)
    assert not dec.capture_attention and dec.attention == [] and dec.scores == []


# ------------------------------------------------------------------------------ CLI


def cli(capsys, *args: str) -> str:
    assert generate_main(["--checkpoint", str(SORT), "--prompt", "503124=", *args]) == 0
    return capsys.readouterr().out


def direct(n: int, sampling: Sampling) -> list[int]:
    ck = load_checkpoint(SORT)
    dec = Decoder(ck.model, ck.tokenizer.encode("503124="), sampling, eos_id=ck.tokenizer.eos_id)
    return ids_of(generate(dec, n))


def test_cli_prints_what_generate_gives(capsys):
    tok = load_checkpoint(SORT).tokenizer
    out = cli(capsys, "--temperature", "0", "--max-new-tokens", "6")
    assert out == "012345\n"
    assert out.strip() == tok.decode(direct(6, Sampling(temperature=0)))
    # sampled: the CLI's tokens are the loop's tokens for the same seed and settings
    s = Sampling(temperature=1.5, top_k=4, top_p=0.9, seed=5)
    out = cli(capsys, "--temperature", "1.5", "--top-k", "4", "--top-p", "0.9", "--seed", "5", "--max-new-tokens", "12")
    assert out == tok.decode(direct(12, s)) + "\n"


def test_cli_json_has_one_line_per_step(capsys):
    lines = cli(capsys, "--temperature", "0", "--max-new-tokens", "6", "--json").splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["token_id"] for r in records] == direct(6, Sampling(temperature=0))
    assert "".join(r["text"] for r in records) == "012345"
    assert [r["position"] for r in records] == list(range(7, 13))
    assert all(0 < r["prob"] <= 1 and r["sampled_prob"] == 1.0 and not r["eos"] for r in records)


@pytest.mark.parametrize("args", [["--temperature", "2.5"], ["--temperature", "nan"], ["--top-p", "0"],
                                  ["--top-k", "-1"], ["--max-new-tokens", "-2"], ["--prompt", ""]])
def test_cli_refuses_bad_values(capsys, args):
    with pytest.raises(SystemExit) as exc:
        generate_main(["--checkpoint", str(SORT), "--prompt", "503124=", *args])
    assert exc.value.code == 2


def test_cli_help_covers_every_flag():
    from model.generate import TEMPERATURE_RANGE, TOP_P_RANGE

    parser = generate_parser()
    text = " ".join(parser.format_help().split())
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and action.help.strip(), action.option_strings
    assert f"[{TEMPERATURE_RANGE[0]}, {TEMPERATURE_RANGE[1]}]" in text
    assert f"[{TOP_P_RANGE[0]}, {TOP_P_RANGE[1]}]" in text


@pytest.mark.parametrize("prompt", [[1, 2, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9]])  # the second starts cropped
def test_a_cooled_decoder_computes_its_window_again_and_samples_on_exactly(model, prompt):
    """Decoder.cool drops the cache, logits, attention and scores; the next use runs the window again: the
    same numbers within float32 rounding of another batch shape, and the same tokens (the sampler stays)."""
    s = Sampling(temperature=1.0, seed=4)
    cooled, plain = Decoder(model, prompt, s), Decoder(model, prompt, s)
    for _ in range(3):
        assert cooled.step().token_id == plain.step().token_id
    held = cooled.warm_nbytes
    cooled.cool()
    assert not cooled.warm and cooled.warm_nbytes == 0 < held
    assert cooled.cache is None and cooled.attention == [] and cooled.scores == []
    cooled.rewarm()
    assert cooled.warm and cooled.window == plain.window
    torch.testing.assert_close(cooled.logits, plain.logits, atol=1e-6, rtol=0)
    for a, b in zip(cooled.attention + cooled.scores, plain.attention + plain.scores):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)  # -inf where masked, in both
    for _ in range(4):  # cooled before every Step: each rewarms first
        cooled.cool()
        x, y = cooled.step(), plain.step()
        assert x.token_id == y.token_id and x.sampling == y.sampling == s
        np.testing.assert_allclose(x.probs, y.probs, atol=1e-6, rtol=0)
    assert cooled.ids == plain.ids and cooled.undo() and plain.undo()
    assert cooled.step().token_id == plain.step().token_id  # undo restored the same sampler state


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_a_prefill_cache_holds_its_keys_and_values_alone(pos):
    """The cache after a prefill keeps no view into the tensor of queries, keys and values together, so
    what a text holds is what the memory budget counts for its cache."""
    d = Decoder(make_model(pos), [1, 2, 3, 4, 5], Sampling(temperature=0.0, seed=0))
    for layer in d.cache.layers:
        for t in (layer.k, layer.v):
            assert t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()
