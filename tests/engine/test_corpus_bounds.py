"""Building a corpus from hostile text: refused early, or built in bounded, stoppable steps.

An independent fuzz of the Train tab found a BPE tokenizer trained on 320,000 identical
characters holding the one training slot for 40 s, and 1.2 MB of "abab…" for 1,044 s with Stop
doing nothing. Each case here must now be refused before any tokenizer trains, or build in
steps of bounded size (a tokenizer trained on a bounded sample, then the text encoded part by
part), with ``should_stop`` asked between every two, so that a Stop takes effect at once. What is
asserted is the size of each step and the number of checks, never the time they take: that is
``python -m bench.corpus_build``'s measurement.
"""

import math

import pytest
import torch

import model.bpe as bpe
import model.corpora as corpora
import model.tokenizers as tk
from bench.corpus_build import NO_WORDS
from bench.corpus_build import TEXTS as PATHOLOGICAL
from model.corpora import ENCODE_CHUNK_CHARS, MAX_TEXT_CHARS, Corpus, Stopped, build_corpus, check_trainable
from model.tokenizers import BPE_TRAIN_SAMPLE_CHARS, MAX_VOCAB

# A BPE part ends at the first place it can be cut after ENCODE_CHUNK_CHARS: within this many more
LONGEST_PART = ENCODE_CHUNK_CHARS + bpe._CUT_SCAN


def watched_build(monkeypatch, text: str, kind: str) -> tuple[Corpus | ValueError, dict]:
    """Build a "text" corpus, recording what each step did: (corpus or ValueError, {"checks": should_stop
    calls, "trained": tokenizers trained, "sample": characters BPE merges were learned on, "parts": the
    character length of every part encoded on its own (None for a tokenizer that encodes the text whole)})."""
    seen = {"checks": 0, "trained": 0, "sample": None, "parts": None}
    train, sample, cuts = corpora._train_tokenizer, bpe._training_sample, bpe._bpe_cuts

    def counted_train(*args):
        seen["trained"] += 1
        return train(*args)

    def measured_sample(body: str) -> list[str]:
        slices = sample(body)
        seen["sample"] = sum(map(len, slices))
        return slices

    def measured_cuts(seg: str, chunk_chars: int, bounded: bool):
        at = list(cuts(seg, chunk_chars, bounded))
        ends = [0, *at, len(seg)]
        seen["parts"] = (seen["parts"] or []) + [b - a for a, b in zip(ends, ends[1:]) if b > a]
        return iter(at)

    monkeypatch.setattr(corpora, "_train_tokenizer", counted_train)
    monkeypatch.setattr(bpe, "_training_sample", measured_sample)
    monkeypatch.setattr(bpe, "_bpe_cuts", measured_cuts)

    def should_stop() -> bool:
        seen["checks"] += 1
        return False

    try:
        return build_corpus("text", kind, text=text, should_stop=should_stop), seen
    except ValueError as exc:
        return exc, seen


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["char", "word", "bpe"])
@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_hostile_text_builds_or_is_refused_in_bounded_steps(monkeypatch, name, kind):
    text = PATHOLOGICAL[name]
    result, seen = watched_build(monkeypatch, text, kind)
    if kind == "word" and name in NO_WORDS:
        assert isinstance(result, ValueError)
        assert "word token" in str(result) and "char or bpe" in str(result)
        assert seen["trained"] == 0 and seen["checks"] == 0  # refused by the check, before anything is built
        return
    assert isinstance(result, Corpus), result
    assert result.tokenizer.kind == kind and seen["trained"] == 1
    n = len(result.train) + len(result.val)
    assert n >= 20 and len(result.val) >= 2
    if kind != "bpe":
        # checked, tokenizer trained, the text encoded whole: a check after each
        assert seen["checks"] == 3 and seen["sample"] is None and seen["parts"] is None
        return
    # merges learned on a bounded sample, the text encoded in parts of bounded length, a check after each
    parts = seen["parts"]
    assert seen["sample"] == min(len(text), BPE_TRAIN_SAMPLE_CHARS)
    assert sum(parts) == len(text) and max(parts) <= LONGEST_PART, max(parts)
    assert len(parts) >= math.ceil(len(text) / LONGEST_PART)
    assert seen["checks"] == 2 + len(parts)
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


@pytest.fixture
def no_tokenizer_trains(monkeypatch):
    """Any tokenizer training fails the test: the checks before it must not need one."""
    def no_training(*args, **kwargs):
        raise AssertionError("a tokenizer was trained while checking the text")

    for cls in (tk.CharTokenizer, tk.WordTokenizer, tk.BPETokenizer):
        monkeypatch.setattr(cls, "train", no_training)


@pytest.mark.parametrize("case", list(CHECKS))
def test_check_trainable_names_what_is_wrong(case, no_tokenizer_trains):
    text, kind, match = CHECKS[case]
    if match is None:
        assert check_trainable(text, kind) is text
        return
    with pytest.raises(ValueError, match=match):
        check_trainable(text, kind)


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

    calls, encoded = [], []
    chunks = bpe.BPETokenizer.encode_chunks

    def counted_chunks(self, *args, **kwargs):
        for part in chunks(self, *args, **kwargs):
            encoded.append(len(calls))  # the checks made before this part was encoded
            yield part

    monkeypatch.setattr(bpe.BPETokenizer, "encode_chunks", counted_chunks)

    def stop_during_encoding() -> bool:
        calls.append(len(encoded))
        return len(calls) == 4  # checked, trained, two parts encoded: stop now

    with pytest.raises(Stopped):
        build_corpus("text", "bpe", text=text, should_stop=stop_during_encoding)
    # a check after every phase and part, and nothing encoded (nor asked) after the one that said stop
    assert calls == [0, 0, 1, 2] and encoded == [2, 3]

    with pytest.raises(Stopped):
        build_corpus("grammar", "word", should_stop=lambda: True)
    assert build_corpus("sort", should_stop=lambda: True).kind == "examples"  # nothing slow to stop there
