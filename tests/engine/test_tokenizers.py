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


# ---------------------------------------------------------------- bounded BPE (long runs, big text)
#
# HF's BPE trainer took minutes on one long pre-tokenized piece (320,000 identical letters,
# 1.2 MB of "abab…"), and could not be interrupted. The split now cuts every run into pieces of
# at most 16 characters, merges are learned on a bounded sample, and encoding goes part by part.

# Characters of every class of the split, the special token and its fragments, characters whose
# class differs between Python and the regex (superscript two, a combining accent) and runs.
_FRAGMENTS = ["a", "b", "Z", "1", "9", "²", "!", ",", "_", "'", " ", "\n", "\t", "\r\n", "\u00a0", "\u3000",
              "\u2028", "é", "\u0301", "日", "<unk>", "<", "unk", ">", "<un", "k>", " a", "a "]


def _run_text(draw_parts) -> str:
    return "".join(frag * n for frag, n in draw_parts)


@pytest.fixture(scope="module")
def run_bpe() -> BPETokenizer:
    sample = "".join(f * 3 for f in _FRAGMENTS) * 30 + "aaaaaaaaaaaaaaaaaaaa 1111111111111111 !!!!!!!!!!!!!!!!!! " * 20
    return BPETokenizer.train(sample, vocab_size=300)


def _whole(tok: BPETokenizer, text: str) -> list[int]:
    return tok._hf.encode(text, add_special_tokens=False).ids  # the reference: HF on the whole text


@pytest.mark.parametrize("text", ["a" * 5000, "ab" * 3000, "1" * 4000, "!" * 4000, " " * 4000, "\n" * 4000,
                                  "日本" * 2000, "x" + " " * 3000 + "y", "word " * 1000])
def test_bpe_split_pieces_are_at_most_16_characters(run_bpe, text):
    pieces = run_bpe._hf.pre_tokenizer.pre_tokenize_str(text)
    assert "".join(p for p, _ in pieces) == text
    assert max(len(p) for p, _ in pieces) <= 16


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(st.tuples(st.sampled_from(_FRAGMENTS),
                                st.one_of(st.integers(1, 4), st.sampled_from([15, 16, 17, 40, 300, 700]))),
                      min_size=1, max_size=12),
       chunk=st.sampled_from([1, 2, 7, 50, 333]))
def test_bpe_encode_chunks_join_to_the_whole_encoding(run_bpe, parts, chunk):
    text = _run_text(parts)
    chunks = list(run_bpe.encode_chunks(text, chunk))
    assert [i for part in chunks for i in part] == _whole(run_bpe, text) == run_bpe.encode(text)


def test_bpe_encode_chunks_cut_long_runs_of_one_class(run_bpe):
    for text in ["x" + "a" * 5000, "1" * 5000, "!" * 5000, "x" + " " * 5000 + "y", "ab1!" * 1500]:
        chunks = list(run_bpe.encode_chunks(text, 1000))
        assert len(chunks) >= 4, text[:8]
        assert [i for part in chunks for i in part] == _whole(run_bpe, text)
    with pytest.raises(ValueError):
        list(run_bpe.encode_chunks("abc", 0))


def test_bpe_train_on_long_text_samples_it_but_keeps_every_character():
    from model.tokenizers import BPE_TRAIN_SAMPLE_CHARS

    n = 3 * BPE_TRAIN_SAMPLE_CHARS
    # between the first two training slices, so only the alphabet can bring it in
    text = "ab " * (BPE_TRAIN_SAMPLE_CHARS // 60) + "€" + "cd " * (n // 3)
    tok = BPETokenizer.train(text, vocab_size=50)
    assert "€" in tok.vocab
    assert tok.encode_verbose("ab € cd").unknown == []
    assert tok.decode(tok.encode(text)) == text


def test_bpe_lone_surrogates_are_unknown_not_errors():
    tok = BPETokenizer.train("ab \ud800 cd " * 50, vocab_size=30)
    assert "\ud800" not in tok.vocab
    enc = tok.encode_verbose("ab\ud800cd\udfff")
    assert enc.ids == tok.encode("ab\ud800cd\udfff")
    assert enc.ids.count(tok.unk_id) == 2 and enc.unknown == ["\ud800", "\udfff"]
    assert tok.decode(enc.ids) == "ab<unk>cd<unk>"


def test_bpe_tokenizer_with_the_old_unbounded_split_still_loads():
    from model.bpe import _BPE_SPLIT, _BPE_SPLIT_V1

    tok = BPETokenizer.train(TEXT, vocab_size=120)
    doc = json.loads(tok.to_dict()["tokenizer"])
    assert doc["pre_tokenizer"]["pattern"] == {"Regex": _BPE_SPLIT}
    doc["pre_tokenizer"]["pattern"] = {"Regex": _BPE_SPLIT_V1}
    old = tokenizer_from_dict({"kind": "bpe", "tokenizer": json.dumps(doc)})
    assert json.loads(old.to_dict()["tokenizer"])["pre_tokenizer"]["pattern"] == {"Regex": _BPE_SPLIT_V1}
    long_word = "a" * 40 + " " + "b" * 3000 + "!" * 20
    assert old._hf.pre_tokenizer.pre_tokenize_str(long_word)[0][0] == "a" * 40  # its pieces stay unbounded
    assert old.decode(old.encode(long_word)) == long_word
    assert [i for p in old.encode_chunks(long_word, 100) for i in p] == _whole(old, long_word)
    for other in (_BPE_SPLIT + "|x", _BPE_SPLIT_V1.replace("+", "*")):
        doc["pre_tokenizer"]["pattern"] = {"Regex": other}
        with pytest.raises(ValueError, match="pre_tokenizer.pattern.Regex"):
            tokenizer_from_dict({"kind": "bpe", "tokenizer": json.dumps(doc)})


def test_word_train_ranking_is_count_then_alphabetical():
    tok = WordTokenizer.train("b a c b a d b e", max_vocab=5)
    assert tok.vocab == ["b", "a", "c", "<EOS>", "<unk>"]
    assert WordTokenizer.train("z y x <EOS> <eos>").vocab == ["x", "y", "z", "<EOS>", "<unk>"]
