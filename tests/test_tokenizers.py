"""Tokenizers: round trips, the toy vocabulary, unknown input, display forms, hostile data.

The allow-list for stored tokenizers is tested attack by attack in test_hostile_tokenizers.py.
"""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.tokenizers import (
    MAX_LOADED_VOCAB,
    BPETokenizer,
    CharTokenizer,
    Encoded,
    Tokenizer,
    WordTokenizer,
    normalise,
    tokenizer_from_dict,
)

TEXT = (
    "The quick brown fox jumps over the lazy dog.\n"
    "Pack my box with five dozen liquor jugs!  Tabs\there, too; isn't it?\n"
) * 20
TOY = ["how", "is", "living", "in", "amsterdam", "exciting", "<EOS>"]


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(TEXT, vocab_size=120)


def all_tokenizers(bpe: BPETokenizer) -> list[Tokenizer]:
    return [CharTokenizer.train(TEXT), WordTokenizer.train(TEXT), bpe]


# ---------------------------------------------------------------- round trips


def test_char_round_trip_and_vocab_layout():
    tok = CharTokenizer.train(TEXT)
    assert tok.kind == "char"
    assert tok.piece(0) == "<unk>" and tok.unk_id == 0 and tok.eos_id is None
    assert tok.vocab[1:] == sorted(set(TEXT))
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert tok.vocab_size == len(set(TEXT)) + 1


def test_char_explicit_constructor_keeps_order():
    tok = CharTokenizer(["b", "a", " "])
    assert tok.encode("ab a") == [2, 1, 3, 2]
    with pytest.raises(ValueError):
        CharTokenizer(["a", "a"])
    with pytest.raises(ValueError):
        CharTokenizer(["ab"])


def test_word_round_trip_matches_normalise():
    tok = WordTokenizer.train(TEXT)
    assert tok.kind == "word"
    assert tok.decode(tok.encode(TEXT)) == normalise(TEXT)
    assert normalise("Hello ,  World!\nIt's  (fine) .") == "hello, world! it's ( fine )."


def test_bpe_round_trip_exact(bpe):
    assert bpe.kind == "bpe"
    ids = bpe.encode(TEXT)
    assert bpe.decode(ids) == TEXT
    assert len(ids) < len(TEXT)  # merges were learned
    assert bpe.vocab_size <= 120
    assert bpe.piece(bpe.unk_id) == "<unk>"


def test_dict_round_trip_through_json_rebuilds_an_equal_tokenizer(bpe):
    # checkpoints store tokenizer.to_dict() as JSON text; rebuilding it must encode identically
    probe = "Quick dogs, zebras & jugs.\n"
    for tok in all_tokenizers(bpe):
        loaded = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
        assert type(loaded) is type(tok)
        assert loaded == tok
        assert loaded.encode(TEXT + probe) == tok.encode(TEXT + probe)
        assert loaded.encode_verbose(probe) == tok.encode_verbose(probe)


# ---------------------------------------------------------------- toy vocabulary


def test_toy_vocabulary_ids():
    tok = WordTokenizer(TOY)
    assert [tok.encode(w)[0] for w in TOY] == list(range(7))
    assert tok.unk_id == 7 and tok.eos_id == 6 and tok.vocab_size == 8
    assert tok.encode("how is living in amsterdam <EOS> exciting") == [0, 1, 2, 3, 4, 6, 5]
    assert tok.encode("<eos>") == [6]


def test_word_constructor_appends_specials():
    tok = WordTokenizer(["b", "a"])
    assert tok.vocab == ["b", "a", "<EOS>", "<unk>"]
    with pytest.raises(ValueError):
        WordTokenizer(["two words"])
    with pytest.raises(ValueError):
        WordTokenizer(["a", "a"])


def test_word_train_limits():
    tok = WordTokenizer.train("a a a b b c", min_count=2)
    assert tok.vocab == ["a", "b", "<EOS>", "<unk>"]
    tok = WordTokenizer.train("a a a b b c", max_vocab=3)
    assert tok.vocab == ["a", "<EOS>", "<unk>"]


# ---------------------------------------------------------------- unknown input


def test_unknown_chars_reported():
    tok = CharTokenizer.train("abc ")
    enc = tok.encode_verbose("abxz x")
    assert isinstance(enc, Encoded)
    assert enc.ids == [2, 3, 0, 0, 1, 0]  # vocab: <unk>, " ", a, b, c
    assert enc.unknown == ["x", "z"]
    assert enc.pieces == ["a", "b", "<unk>", "<unk>", "␣", "<unk>"]


def test_unknown_words_reported():
    tok = WordTokenizer(TOY)
    enc = tok.encode_verbose("How is Paris? Paris is how.")
    assert enc.ids == [0, 1, 7, 7, 7, 1, 0, 7]
    assert enc.unknown == ["paris", "?", "."]
    assert tok.decode(enc.ids) == "how is <unk> <unk> <unk> is how <unk>"


def test_unknown_bpe_chars_reported(bpe):
    enc = bpe.encode_verbose("the ζ fox ζ€")
    assert enc.unknown == ["ζ", "€"]
    assert enc.ids.count(bpe.unk_id) == 3
    assert "".join(p for p in enc.pieces if p != "<unk>").replace("␣", " ") == "the  fox "


# ---------------------------------------------------------------- display forms


def test_piece_display_forms(bpe):
    tok = CharTokenizer(list(" \n\ta"))
    assert [tok.piece(i) for i in range(5)] == ["<unk>", "␣", "⏎", "⇥", "a"]
    assert tok.decode([1, 2, 3, 4]) == " \n\ta"
    assert all("\n" not in p and " " not in p for p in bpe.encode_verbose(TEXT).pieces)
    for t in (tok, bpe, WordTokenizer(TOY)):
        with pytest.raises(ValueError, match="out of range"):
            t.piece(t.vocab_size)
        with pytest.raises(ValueError, match="out of range"):
            t.piece(-1)
        with pytest.raises(ValueError):
            t.decode([t.vocab_size])


# ---------------------------------------------------------------- hostile input

HOSTILE = [
    None,
    [],
    "char",
    {},
    {"kind": "nope"},
    {"kind": 3, "chars": []},
    {"kind": "char"},
    {"kind": "char", "chars": "abc"},
    {"kind": "char", "chars": ["a", "a"]},
    {"kind": "char", "chars": ["a", 1]},
    {"kind": "char", "chars": ["ab"]},
    {"kind": "char", "chars": [""]},
    {"kind": "char", "chars": [chr(0x4E00 + i) for i in range(MAX_LOADED_VOCAB)]},  # + <unk>: one too many
    {"kind": "word", "words": None},
    {"kind": "word", "words": ["a", "a"]},
    {"kind": "word", "words": ["<unk>", "<unk>"]},
    {"kind": "word", "words": [["a"]]},
    {"kind": "word", "words": [f"w{i}" for i in range(MAX_LOADED_VOCAB + 1)]},
    {"kind": "word", "words": ["Hello world"]},
    {"kind": "bpe"},
    {"kind": "bpe", "tokenizer": 5},
    {"kind": "bpe", "tokenizer": "{"},
    {"kind": "bpe", "tokenizer": "{}"},
    {"kind": "bpe", "tokenizer": '{"model": {"type": "BPE"}}'},
    {"kind": "bpe", "tokenizer": json.dumps({"model": {"type": "WordLevel", "vocab": {"<unk>": 0}, "unk_token": "<unk>"}})},
]


@pytest.mark.parametrize("data", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_dicts_raise_value_error(data):
    with pytest.raises(ValueError):
        tokenizer_from_dict(data)


def test_hostile_bpe_variants(bpe):
    good = json.loads(bpe.to_dict()["tokenizer"])
    no_unk = json.loads(json.dumps(good))
    no_unk["model"]["unk_token"] = None
    dup = json.loads(json.dumps(good))
    vocab = dup["model"]["vocab"]
    vocab[next(iter(vocab))] = 1  # two entries share id 1
    for doc in (no_unk, dup):
        with pytest.raises(ValueError):
            tokenizer_from_dict({"kind": "bpe", "tokenizer": json.dumps(doc)})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=10,
)


@settings(max_examples=50, deadline=None)
@given(
    kind=st.sampled_from(["char", "word", "bpe", "xyz"]),
    key=st.sampled_from(["chars", "words", "tokenizer", "other"]),
    value=json_values,
)
def test_from_dict_only_raises_value_error(kind, key, value):
    try:
        tok = tokenizer_from_dict({"kind": kind, key: value})
    except ValueError:
        return
    assert tok.kind == kind
    tok.decode(tok.encode("hello, world"))


CHAR = CharTokenizer.train(TEXT)
WORD = WordTokenizer.train(TEXT)
WORD_PIECES = [w for w in WORD.vocab if w != "<unk>"]


@settings(max_examples=50, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(sorted(set(TEXT))), max_size=60))
def test_char_and_bpe_round_trip_property(bpe, text):
    assert CHAR.decode(CHAR.encode(text)) == text
    assert bpe.decode(bpe.encode(text)) == text
    assert bpe.encode_verbose(text).unknown == []


@settings(max_examples=50, deadline=None)
@given(
    words=st.lists(st.sampled_from(WORD_PIECES), max_size=20),
    seps=st.lists(st.sampled_from([" ", "  ", "\n", "\t "]), min_size=20, max_size=20),
    upper=st.booleans(),
)
def test_word_round_trip_property(words, seps, upper):
    text = "".join(w + s for w, s in zip(words, seps))
    text = text.upper().replace("<EOS>", "<eos>") if upper else text
    assert WORD.encode_verbose(text).unknown == []
    assert WORD.decode(WORD.encode(text)) == normalise(text)
