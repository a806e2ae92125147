"""Hostile tokenizer data: only what the project itself writes may be loaded.

An uploaded checkpoint carries its tokenizer as JSON, and the HF ``tokenizers`` library runs
whatever such JSON describes: a padding of millions of tokens, a normalizer that multiplies
each character, a backtracking pre-tokenizer regex, a megabyte-long token the model then
emits. These tests send each of those (and malformed variants at every level) and require a
ValueError that names the field, quickly, before any tokenizer object is built. They also
hold every tokenizer the project makes to a lossless round trip through the same door.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

import model.bpe as bpe
from model.checkpoint import DEFAULT_LIMITS
from model.tokenizers import (
    EOS,
    MAX_BPE_JSON_CHARS,
    MAX_LOADED_VOCAB,
    MAX_TOKEN_BYTES,
    UNK,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    WordTokenizer,
    tokenizer_from_dict,
)

ROOT = Path(__file__).resolve().parents[2]
TEXT = (
    "The quick brown fox jumps over the lazy dog.\n"
    "Pack my box with five dozen liquor jugs!  Tabs\there, too; isn't it? 1234 €5\n"
) * 10
PROBE = TEXT + "Unseen: ζ, 日本, <EOS> and émigré.\n"

BPE = BPETokenizer.train(TEXT, vocab_size=90)
GOOD_DOC = json.loads(BPE.to_dict()["tokenizer"])


def bpe_data(doc) -> dict:
    return {"kind": "bpe", "tokenizer": json.dumps(doc)}


def edited(path: str, value=None, *, delete: bool = False) -> dict:
    """A copy of the valid BPE document with the field at dotted ``path`` set (or deleted)."""
    doc = copy.deepcopy(GOOD_DOC)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        last = int(last)
    if delete:
        del node[last]
    else:
        node[last] = value
    return doc


@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test if a tokenizer (ours or HF's) is constructed."""
    built: list[str] = []

    class NoHF:
        @staticmethod
        def from_str(_data):
            built.append("HF tokenizer")
            raise AssertionError("an HF tokenizer was built from refused data")

    original_init = Tokenizer.__init__

    def spy_init(self, vocab):
        built.append(type(self).__name__)
        original_init(self, vocab)

    monkeypatch.setattr(bpe, "HFTokenizer", NoHF)
    monkeypatch.setattr(Tokenizer, "__init__", spy_init)
    return built


def refuse(data, field: str, built: list[str], max_vocab: int = MAX_LOADED_VOCAB) -> str:
    with pytest.raises(ValueError) as info:
        tokenizer_from_dict(data, max_vocab)
    msg = str(info.value)
    assert field in msg, msg
    assert built == [], "refused data must not build anything"
    assert "<class" not in msg and "/" not in msg.replace(" / ", "") and len(msg) < 400, msg
    return msg


# ------------------------------------------------------------- the fuzz's findings, and more

PADDING = {"strategy": {"Fixed": 2_000_000}, "direction": "Right", "pad_to_multiple_of": None,
           "pad_id": 0, "pad_type_id": 0, "pad_token": UNK}

BPE_ATTACKS = {
    # padding every encoding to millions of tokens
    "padding": (edited("padding", PADDING), "padding"),
    "padding batch longest": (edited("padding", {**PADDING, "strategy": "BatchLongest"}), "padding"),
    # a pad id outside the vocabulary
    "pad id out of range": (edited("padding", {**PADDING, "strategy": "BatchLongest", "pad_id": 10**6}), "padding"),
    "truncation": (edited("truncation", {"direction": "Right", "max_length": 1, "strategy": "LongestFirst",
                                          "stride": 0}), "truncation"),
    # normalizers that multiply each character
    "replace normalizer": (edited("normalizer", {"type": "Replace", "pattern": {"Regex": "(?s)."},
                                                 "content": "x" * 10_000}), "normalizer"),
    "prepend normalizer": (edited("normalizer", {"type": "Prepend", "prepend": "▁" * 10_000}), "normalizer"),
    "normalizer sequence": (edited("normalizer", {"type": "Sequence", "normalizers": []}), "normalizer"),
    # catastrophic backtracking, and other pre-tokenizers
    "backtracking regex": (edited("pre_tokenizer.pattern.Regex", "(a+)+b"), "pre_tokenizer.pattern.Regex"),
    "regex plus one char": (edited("pre_tokenizer.pattern.Regex", bpe._BPE_SPLIT + "|(a+)+b"),
                            "pre_tokenizer.pattern.Regex"),
    "string pattern": (edited("pre_tokenizer.pattern", {"String": " "}), "pre_tokenizer.pattern"),
    "other pre-tokenizer": (edited("pre_tokenizer", {"type": "ByteLevel", "add_prefix_space": False,
                                                     "trim_offsets": True, "use_regex": True}), "pre_tokenizer"),
    "no pre-tokenizer": (edited("pre_tokenizer", None), "pre_tokenizer"),
    "behavior": (edited("pre_tokenizer.behavior", "MergedWithNext"), "pre_tokenizer.behavior"),
    "invert": (edited("pre_tokenizer.invert", True), "pre_tokenizer.invert"),
    "decoder": (edited("decoder", {"type": "Replace", "pattern": {"String": "a"}, "content": "b" * 1000}),
                "decoder"),
    "post processor": (edited("post_processor", {"type": "TemplateProcessing"}), "post_processor"),
    "version": (edited("version", "2.0"), "version"),
    # the model
    "model type": (edited("model.type", "WordPiece"), "model.type"),
    "unigram": (edited("model", {"type": "Unigram", "unk_id": 0, "vocab": [[UNK, 0.0]]}), "model"),
    "unk token": (edited("model.unk_token", "a"), "model.unk_token"),
    "no unk token": (edited("model.unk_token", None), "model.unk_token"),
    "dropout": (edited("model.dropout", 0.5), "model.dropout"),
    "prefix": (edited("model.continuing_subword_prefix", "##"), "model.continuing_subword_prefix"),
    "suffix": (edited("model.end_of_word_suffix", "</w>"), "model.end_of_word_suffix"),
    "byte fallback": (edited("model.byte_fallback", True), "model.byte_fallback"),
    "ignore merges": (edited("model.ignore_merges", True), "model.ignore_merges"),
    # bool is not an int, and 0 is not false
    "fuse_unk as 0": (edited("model.fuse_unk", 0), "model.fuse_unk"),
    "added id as bool": (edited("added_tokens.0.id", False), "added_tokens[0].id"),
    "special as 1": (edited("added_tokens.0.special", 1), "added_tokens[0].special"),
    "vocab id as bool": (edited(f"model.vocab.{UNK}", False), "model.vocab"),
    "vocab id as float": (edited("model.vocab.a", float(GOOD_DOC["model"]["vocab"]["a"])), "model.vocab"),
    "vocab id as string": (edited("model.vocab.a", "3"), "model.vocab"),
    # added tokens: only <unk>, exactly as training adds it
    "extra special": (edited("added_tokens", GOOD_DOC["added_tokens"] + [
        {**GOOD_DOC["added_tokens"][0], "id": 1, "content": " "}]), "added_tokens"),
    "added token normalized": (edited("added_tokens.0.normalized", True), "added_tokens[0].normalized"),
    "added token content": (edited("added_tokens.0.content", "a"), "added_tokens[0].content"),
    "no added tokens": (edited("added_tokens", [], ), "added_tokens"),
    # unknown keys at every level
    "unknown top key": (edited("extra", 1), "unknown key 'extra'"),
    "unknown model key": (edited("model.cache_capacity", 10**9), "unknown key 'cache_capacity'"),
    "unknown pre-tokenizer key": (edited("pre_tokenizer.extra", 1), "unknown key 'extra'"),
    "unknown pattern key": (edited("pre_tokenizer.pattern.String", "a"), "unknown key 'String'"),
    "unknown added-token key": (edited("added_tokens.0.extra", 1), "unknown key 'extra'"),
    # missing required keys
    "no model": (edited("model", delete=True), "'model'"),
    "no vocab": (edited("model.vocab", delete=True), "'vocab'"),
    "no merges": (edited("model.merges", delete=True), "'merges'"),
    "no pre-tokenizer key": (edited("pre_tokenizer", delete=True), "'pre_tokenizer'"),
    # nested junk types
    "vocab as array": (edited("model.vocab", [[UNK, 0]]), "model.vocab"),
    "merges as object": (edited("model.merges", {"a": "b"}), "model.merges"),
    "merge as string": (edited("model.merges.0", "a b"), "model.merges[0]"),
    "merge of three": (edited("model.merges.0", ["a", "b", "c"]), "model.merges[0]"),
    "merge of numbers": (edited("model.merges.0", [1, 2]), "model.merges[0]"),
    "merge of objects": (edited("model.merges.0", [{}, []]), "model.merges[0]"),
    "model as array": (edited("model", [1, [2, [3]]]), "model"),
    "added tokens as object": (edited("added_tokens", {"0": {}}), "added_tokens"),
    "pattern as nested arrays": (edited("pre_tokenizer.pattern", [[[["(a+)+b"]]]]), "pre_tokenizer.pattern"),
    "document is an array": ([GOOD_DOC], "object"),
    "document is a number": (3, "object"),
    # merges that do not fit the vocabulary
    "merge of unknown part": (edited("model.merges.0", ["a", "ζ"]), "model.merges[0]"),
    "merge makes unknown token": (edited("model.merges.0", ["z", "z"]), "model.merges[0]"),
    "repeated merge": (edited("model.merges", GOOD_DOC["model"]["merges"] + GOOD_DOC["model"]["merges"][:1]),
                       "model.merges"),
}


@pytest.mark.parametrize("name", list(BPE_ATTACKS))
def test_bpe_attack_refused_naming_the_field(name, nothing_built):
    doc, field = BPE_ATTACKS[name]
    refuse(bpe_data(doc), field, nothing_built)


def _vocab_with(extra: dict[str, int]) -> dict:
    doc = copy.deepcopy(GOOD_DOC)
    doc["model"]["vocab"].update(extra)
    return doc


def test_900_kb_token_refused(nothing_built):
    n = len(GOOD_DOC["model"]["vocab"])
    huge = "ab" * 450_000
    msg = refuse(bpe_data(_vocab_with({huge: n})), "model.vocab", nothing_built)
    assert f"{MAX_TOKEN_BYTES} bytes" in msg
    refuse({"kind": "word", "words": [huge, EOS, UNK]}, "'words'[0]", nothing_built)
    refuse({"kind": "char", "chars": ["a", huge]}, "'chars'[1]", nothing_built)


def test_token_byte_bound_is_in_bytes_not_characters(nothing_built):
    n = len(GOOD_DOC["model"]["vocab"])
    wide = "€" * 22  # 22 characters, 66 bytes of UTF-8
    refuse(bpe_data(_vocab_with({wide: n})), "model.vocab", nothing_built)
    refuse({"kind": "word", "words": ["é" * 33, EOS, UNK]}, "'words'[0]", nothing_built)
    # exactly at the bound is fine
    tok = tokenizer_from_dict({"kind": "word", "words": ["é" * 32, EOS, UNK]})
    assert tok.decode([0]) == "é" * 32


def test_huge_merges_list_refused(nothing_built):
    merges = GOOD_DOC["model"]["merges"]
    v = len(GOOD_DOC["model"]["vocab"])
    many = (merges * (v // len(merges) + 2))[: v + 1]
    refuse(bpe_data(edited("model.merges", many)), "model.merges", nothing_built)
    # millions of merges do not even get parsed: the JSON is over its size bound
    text = json.dumps(edited("model.merges", [["a", "b"]] * 2_000_000))
    assert len(text) > MAX_BPE_JSON_CHARS
    refuse({"kind": "bpe", "tokenizer": text}, "characters", nothing_built)


def test_vocabulary_size_bound(nothing_built):
    n = MAX_LOADED_VOCAB
    vocab = {UNK: 0, **{chr(0x4E00 + i): i + 1 for i in range(n)}}  # n + 1 entries
    refuse(bpe_data(edited("model.vocab", vocab)), "model.vocab", nothing_built)
    refuse({"kind": "char", "chars": [chr(0x4E00 + i) for i in range(n)]}, "'chars'", nothing_built)
    refuse({"kind": "word", "words": [f"w{i}" for i in range(n - 1)] + [EOS, UNK]}, "'words'", nothing_built)
    # a smaller limit, as the checkpoint loader passes its own
    refuse({"kind": "char", "chars": list("abcdefghij")}, "'chars'", nothing_built, max_vocab=10)
    refuse(bpe_data(GOOD_DOC), "model.vocab", nothing_built, max_vocab=len(GOOD_DOC["model"]["vocab"]) - 1)


def test_checkpoint_limit_and_tokenizer_limit_are_one_number():
    assert DEFAULT_LIMITS.max_vocab == MAX_LOADED_VOCAB


def test_non_contiguous_and_duplicate_ids_refused(nothing_built):
    vocab = GOOD_DOC["model"]["vocab"]
    n = len(vocab)
    refuse(bpe_data(edited("model.vocab.a", n + 5)), "model.vocab", nothing_built)
    refuse(bpe_data(edited("model.vocab.a", -1)), "model.vocab", nothing_built)
    refuse(bpe_data(edited("model.vocab.a", vocab["b"])), "twice", nothing_built)
    refuse(bpe_data(edited(f"model.vocab.{UNK}", vocab["a"])), "model.vocab", nothing_built)
    refuse(bpe_data(_vocab_with({"zz": 10**30})), "model.vocab", nothing_built)
    # <unk> must be id 0, like the added token says
    swapped = copy.deepcopy(GOOD_DOC)
    sv = swapped["model"]["vocab"]
    sv[UNK], sv["a"] = sv["a"], sv[UNK]
    refuse(bpe_data(swapped), "model.vocab", nothing_built)


def test_duplicate_tokens_refused(nothing_built):
    # json.loads would keep only the second of two equal keys; the raw text must be refused
    text = json.dumps(GOOD_DOC).replace('"vocab": {', '"vocab": {"a": 0, ', 1)
    refuse({"kind": "bpe", "tokenizer": text}, "duplicate key 'a'", nothing_built)
    text = json.dumps(GOOD_DOC).replace('"padding": null', '"padding": null, "padding": null', 1)
    refuse({"kind": "bpe", "tokenizer": text}, "duplicate key 'padding'", nothing_built)
    refuse({"kind": "char", "chars": ["a", "b", "a"]}, "duplicate", nothing_built)
    refuse({"kind": "word", "words": ["a", "a", EOS, UNK]}, "duplicate", nothing_built)
    refuse({"kind": "word", "words": ["a", EOS, UNK, UNK]}, "duplicate", nothing_built)


def test_outer_dict_allow_list(nothing_built):
    refuse({"kind": "bpe", "tokenizer": json.dumps(GOOD_DOC), "extra": 1}, "unknown key 'extra'", nothing_built)
    refuse({"kind": "char", "chars": ["a"], "pad": 9}, "unknown key 'pad'", nothing_built)
    refuse({"kind": "word", "words": [EOS, UNK], "x" * 10_000: 1}, "unknown key", nothing_built)
    refuse({"kind": "bpe", "tokenizer": GOOD_DOC}, "string", nothing_built)  # not a JSON string
    refuse({"kind": "bpe"}, "'tokenizer'", nothing_built)
    refuse({"kind": True, "chars": []}, "kind", nothing_built)
    refuse({"kind": "char", "chars": [True]}, "'chars'[0]", nothing_built)
    refuse({"kind": "char", "chars": [["a"]]}, "'chars'[0]", nothing_built)
    refuse({"kind": "char", "chars": {"a": 1}}, "'chars'", nothing_built)
    refuse({"kind": "char", "chars": ["ab"]}, "'chars'[0]", nothing_built)
    refuse({"kind": "char", "chars": ["\ud800"]}, "'chars'[0]", nothing_built)
    refuse({"kind": "word", "words": [1, EOS, UNK]}, "'words'[0]", nothing_built)
    refuse({"kind": "word", "words": ["two words", EOS, UNK]}, "'words'[0]", nothing_built)
    refuse({"kind": "word", "words": ["a"]}, "'words'", nothing_built)  # to_dict always writes the specials


def test_malformed_json_refused(nothing_built):
    refuse({"kind": "bpe", "tokenizer": "{"}, "JSON", nothing_built)
    refuse({"kind": "bpe", "tokenizer": "[" * 200_000 + "]" * 200_000}, "BPE tokenizer", nothing_built)
    refuse({"kind": "bpe", "tokenizer": "9" * 5000}, "BPE tokenizer", nothing_built)
    refuse({"kind": "bpe", "tokenizer": json.dumps(GOOD_DOC).replace("null", "NaN", 1)}, "BPE tokenizer",
           nothing_built)


def test_refusal_messages_are_short_even_for_huge_values(nothing_built):
    key = "k" * 1_000_000
    msg = refuse(bpe_data(edited(key, 1)), "unknown key", nothing_built)
    assert len(msg) < 200


# ------------------------------------------------------------- the project's own tokenizers


def _asset_tokenizers() -> list[tuple[str, dict]]:
    out = []
    for path in sorted((ROOT / "assets").glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out.append((path.name, json.loads(f.metadata()["tokenizer"])))
    return out


def _own_tokenizers() -> list[Tokenizer]:
    long_words = "a " + "x" * 200 + " " + "é" * 40 + " b. <EOS> " + "internationalisation " * 30
    return [
        CharTokenizer.train(TEXT),
        CharTokenizer.train(long_words + "日本語\ud800"),
        WordTokenizer.train(TEXT),
        WordTokenizer.train(long_words),
        WordTokenizer(["how", "is", "living", "in", "amsterdam", "exciting", EOS]),
        BPE,
        BPETokenizer.train(TEXT, vocab_size=300),
        BPETokenizer.train(long_words * 5 + "日本語 " * 40, vocab_size=400),
    ]


@pytest.mark.parametrize("index", range(len(_own_tokenizers())))
def test_own_tokenizers_round_trip(index):
    tok = _own_tokenizers()[index]
    assert all(len(p.encode("utf-8")) <= MAX_TOKEN_BYTES for p in tok.vocab)  # training keeps the bound
    loaded = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert type(loaded) is type(tok) and loaded == tok
    assert loaded.vocab == tok.vocab
    assert loaded.encode(PROBE) == tok.encode(PROBE)
    assert loaded.encode_verbose(PROBE) == tok.encode_verbose(PROBE)
    assert loaded.decode(loaded.encode(PROBE)) == tok.decode(tok.encode(PROBE))


def test_long_words_are_left_out_of_trained_vocabularies():
    word = WordTokenizer.train("a " + "x" * 65 + " b")
    assert word.vocab == ["a", "b", EOS, UNK]
    assert word.encode_verbose("x" * 65).unknown == ["x" * 65]
    bpe = BPETokenizer.train(("supercalifragilisticexpialidocious " + "€" * 50 + " ") * 50, vocab_size=200)
    assert max(len(p.encode("utf-8")) for p in bpe.vocab) <= MAX_TOKEN_BYTES


@pytest.mark.parametrize("name,data", _asset_tokenizers(), ids=lambda x: x if isinstance(x, str) else "")
def test_asset_tokenizers_load_and_round_trip(name, data):
    tok = tokenizer_from_dict(data)
    again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again == tok and again.encode(PROBE) == tok.encode(PROBE)


def test_trained_bpe_writes_exactly_the_allow_listed_structure():
    """If the HF library starts writing something else, this names it (rather than uploads failing)."""
    doc = json.loads(BPETokenizer.train(TEXT, vocab_size=70).to_dict()["tokenizer"])
    model = doc.pop("model")
    assert doc == bpe._BPE_TOP_FIXED
    vocab, merges = model.pop("vocab"), model.pop("merges")
    assert model == bpe._BPE_MODEL_FIXED
    assert all(isinstance(m, list) and len(m) == 2 for m in merges)
    assert sorted(vocab.values()) == list(range(len(vocab)))


def test_optional_fields_may_be_absent_where_that_is_the_hf_default():
    doc = copy.deepcopy(GOOD_DOC)
    for key in ("truncation", "padding", "normalizer", "post_processor", "decoder"):
        del doc[key]
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", "byte_fallback",
                "ignore_merges"):
        del doc["model"][key]
    tok = tokenizer_from_dict(bpe_data(doc))
    assert tok == BPE and tok.encode(PROBE) == BPE.encode(PROBE)


def test_worst_case_generate_output_is_small():
    """Every token decodes to at most MAX_TOKEN_BYTES bytes, so 256 new tokens stay tiny."""
    top = "é" * (MAX_TOKEN_BYTES // 2)
    for data in ({"kind": "word", "words": [top, EOS, UNK]},
                 {"kind": "char", "chars": ["€"]}):
        tok = tokenizer_from_dict(data)
        longest = max(range(tok.vocab_size), key=lambda i: len(tok.decode([i]).encode("utf-8")))
        out = tok.decode([longest] * 256)
        assert len(out.encode("utf-8")) <= 256 * (MAX_TOKEN_BYTES + 1)


# ------------------------------------------------------------- random mutations

SMALL = BPETokenizer.train("the cat sat on the mat. a bat! 12 ", vocab_size=40)
SMALL_DOC = json.loads(SMALL.to_dict()["tokenizer"])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=False, width=32)
    | st.sampled_from(["", "a", "t", "th", UNK, "BPE", "Split", "##", "(a+)+b", "x" * 100]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "type", "id", "x"]), inner,
                                                                 max_size=3),
    max_leaves=8,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


ALL_PATHS = list(_paths(SMALL_DOC))


@st.composite
def mutated_docs(draw):
    doc = copy.deepcopy(SMALL_DOC)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(ALL_PATHS))
        parent, node = None, doc
        try:
            for key in path:
                parent, node = node, node[key]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
        op = draw(st.sampled_from(["replace", "delete", "add", "swap ids"]))
        if op == "replace" and path:
            parent[path[-1]] = draw(json_values)
        elif op == "delete" and path:
            del parent[path[-1]]
        elif op == "add" and isinstance(node, dict):
            node[draw(st.sampled_from(["extra", "a", "zz", "type", "pad_id"]))] = draw(json_values)
        elif op == "add" and isinstance(node, list):
            node.append(draw(json_values))
        elif op == "swap ids":
            model = doc.get("model")
            vocab = model.get("vocab") if isinstance(model, dict) else None  # a mutation may have removed either
            if isinstance(vocab, dict) and len(vocab) > 1:
                a, b = draw(st.lists(st.sampled_from(sorted(vocab)), min_size=2, max_size=2, unique=True))
                vocab[a], vocab[b] = vocab[b], vocab[a]
    return doc


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=mutated_docs())
def test_mutated_bpe_loads_or_raises_value_error(doc):
    try:
        tok = tokenizer_from_dict(bpe_data(doc))
    except ValueError:
        return
    assert tok.kind == "bpe" and 1 <= tok.vocab_size <= MAX_LOADED_VOCAB
    ids = tok.encode("the cat sat on a hat, 12!")
    assert all(0 <= i < tok.vocab_size for i in ids)
    text = tok.decode(ids)
    assert len(text.encode("utf-8")) <= len(ids) * MAX_TOKEN_BYTES
