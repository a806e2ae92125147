"""Building a corpus from hostile text: refused early, or built in bounded, stoppable steps.

An independent fuzz of the Train tab found a BPE tokenizer trained on 320,000 identical
characters holding the one training slot for 40 s, and 1.2 MB of "abab…" for 1,044 s with Stop
doing nothing. Each case here must now build or be refused within seconds, with
``should_stop`` asked often enough for a Stop to take effect at once.
"""

import random
import string
import time

import pytest
import torch

import model.corpora as corpora
from model.corpora import MAX_TEXT_CHARS, Corpus, Stopped, build_corpus, check_trainable
from model.tokenizers import MAX_VOCAB

_rng = random.Random(0)
PATHOLOGICAL = {
    "320,000 identical characters": "a" * 320_000,
    "1.2 MB of abab": "ab" * (MAX_TEXT_CHARS // 2),
    "1.2 MB of random letters without spaces": "".join(_rng.choices(string.ascii_letters, k=MAX_TEXT_CHARS)),
    "1.2 MB of one repeated word": "hello " * (MAX_TEXT_CHARS // 6),
    "only 2 distinct characters": "a " * (MAX_TEXT_CHARS // 2),
    "1.2 MB of punctuation and digits": "".join(_rng.choices(string.punctuation + string.digits, k=MAX_TEXT_CHARS)),
}
NO_WORDS = {"320,000 identical characters", "1.2 MB of abab", "1.2 MB of random letters without spaces"}
BOUND_S = 5.0  # generous against a busy machine; see the report for the times measured


def timed_build(text: str, kind: str):
    """(corpus or ValueError, total seconds, longest time between two should_stop calls)."""
    marks = [time.perf_counter()]

    def should_stop() -> bool:
        marks.append(time.perf_counter())
        return False

    try:
        result = build_corpus("text", kind, text=text, should_stop=should_stop)
    except ValueError as exc:
        result = exc
    marks.append(time.perf_counter())
    return result, marks[-1] - marks[0], max(b - a for a, b in zip(marks, marks[1:])), len(marks) - 2


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["char", "word", "bpe"])
@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_hostile_text_builds_or_is_refused_quickly(name, kind):
    text = PATHOLOGICAL[name]
    result, total, longest_step, checks = timed_build(text, kind)
    assert total < BOUND_S, f"{name} / {kind}: {total:.1f} s"
    assert longest_step < BOUND_S / 2, f"{name} / {kind}: {longest_step:.1f} s without a should_stop check"
    if kind == "word" and name in NO_WORDS:
        assert isinstance(result, ValueError)
        assert "word token" in str(result) and "char or bpe" in str(result)
        return
    assert isinstance(result, Corpus), result
    assert result.tokenizer.kind == kind and checks >= 3
    n = len(result.train) + len(result.val)
    assert n >= 20 and len(result.val) >= 2
    if kind == "bpe":
        assert checks >= 4  # the encoding of a long text is asked about part by part
        assert result.tokenizer.unk_id not in torch.cat([result.train.x, result.val.x]).tolist()


def test_bpe_corpus_of_long_runs_decodes_to_the_text():
    text = "x" + "ab" * 60_000 + " " + "!" * 3000 + "  \n" + "9" * 5000
    c = build_corpus("text", "bpe", text=text)
    assert c.tokenizer.decode(torch.cat([c.train.x, c.val.x]).tolist()) == text


def test_refusal_comes_before_any_tokenizer_is_trained(monkeypatch):
    def no_training(*args):
        raise AssertionError("a tokenizer was trained for text that is refused anyway")

    monkeypatch.setattr(corpora, "_train_tokenizer", no_training)
    with pytest.raises(ValueError, match="gives only 1 word token; at least 20"):
        build_corpus("text", "word", text="a" * 320_000)
    with pytest.raises(ValueError, match="short enough"):
        build_corpus("text", "word", text=("x" * 70 + " ") * 40)


MANY_CHARS = "".join(map(chr, range(0x20000, 0x20000 + MAX_VOCAB)))  # one more than a vocabulary holds
CHECKS = {
    "one giant word": ("a" * 320_000, "word", "only 1 word token;"),
    "no spaces": ("ab" * 600_000, "word", "char or bpe tokenizer"),
    "words": ("hello world " * 100, "word", None),
    "only overlong words": (("x" * 70 + " ") * 40, "word", "only 0 of the text's word tokens are short enough"),
    "too many characters for char": (MANY_CHARS, "char", "distinct characters"),
    "too many characters for bpe": (MANY_CHARS, "bpe", "distinct characters"),
    "many characters are fine for word": (MANY_CHARS, "word", None),
    "only lone surrogates": ("\ud800" * 2000, "char", "no usable characters"),
    "too short": ("x" * 1000, "char", "too short"),
    "too long": ("x" * (MAX_TEXT_CHARS + 1), "bpe", "too long"),
    "unknown kind": ("x" * 2000, "sentencepiece", "unknown tokenizer kind"),
    "not text": (None, "char", "needs text"),
}


@pytest.mark.parametrize("case", list(CHECKS))
def test_check_trainable_names_what_is_wrong(case):
    text, kind, match = CHECKS[case]
    if match is None:
        assert check_trainable(text, kind) is text
        return
    t = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        check_trainable(text, kind)
    assert time.perf_counter() - t < 1.0


def test_check_trainable_bpe_vocab_size():
    text = "hello world " * 100
    for bad in (1, MAX_VOCAB + 1, 2.5, True):
        with pytest.raises(ValueError, match="BPE vocabulary size"):
            check_trainable(text, "bpe", bad)
    assert check_trainable(text, "bpe", 2) is text


def test_should_stop_ends_the_build_between_phases(monkeypatch):
    assert not issubclass(Stopped, ValueError)
    text = PATHOLOGICAL["1.2 MB of random letters without spaces"]
    with pytest.raises(Stopped):
        build_corpus("text", "bpe", text=text, should_stop=lambda: True)

    calls = []

    def stop_during_encoding() -> bool:
        calls.append(time.perf_counter())
        return len(calls) == 4  # checked, trained, two parts encoded: stop now

    t = time.perf_counter()
    with pytest.raises(Stopped):
        build_corpus("text", "bpe", text=text, should_stop=stop_during_encoding)
    assert len(calls) == 4 and time.perf_counter() - calls[-1] < 0.5
    assert time.perf_counter() - t < BOUND_S

    with pytest.raises(Stopped):
        build_corpus("grammar", "word", should_stop=lambda: True)
    assert build_corpus("sort", should_stop=lambda: True).kind == "examples"  # nothing slow to stop there
