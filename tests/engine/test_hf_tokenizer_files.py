"""Decoder Lab files that carry a pretrained model's tokenizer.json (tokenizer kind "hf", written by
python -m model.convert), as the app's upload reads them: model.checkpoint.parse_checkpoint under
the upload limits (DEFAULT_LIMITS).

The tokenizers of the supported families (GPT-2's byte-level BPE, Llama's BOS template, TinyLlama's
SentencePiece-style BPE with byte fallback) come back identical. Hostile ones (huge, not JSON,
WordPiece / Unigram, an unknown pre-tokenizer, a million merges, a flood of added tokens, and
more) are each refused with one sentence, and the `tokenizers` library never parses them: a spy in
place of its `Tokenizer.from_str` counts every call.
"""

from __future__ import annotations

import json
import struct

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

import model.hf_tokenizer as hf_tokenizer
from model.checkpoint import DEFAULT_LIMITS, checkpoint_bytes, parse_checkpoint
from model.config import ModelConfig
from model.hf_tokenizer import HFFileTokenizer
from model.hf_tokenizer_checks import MAX_ADDED_TOKENS, MAX_HF_TOKEN_BYTES, MAX_JSON_CHARS_PER_TOKEN
from model.tokenizers import MAX_LOADED_VOCAB, MAX_PRETRAINED_VOCAB, tokenizer_from_dict
from model.transformer import DecoderLM

TEXT = ("Once upon a time there was a little fox. The fox liked to run in the green wood. "
        "One day the fox met a bear, and the bear said hello to the fox. 1234 ζ€\n") * 4
PROMPTS = ["Once upon a time", " the fox met 42 bears", "ζ and € and émigré\n"]


def byte_level(bos_template: bool) -> HFFileTokenizer:
    """GPT-2's scheme (and with a BOS template, Llama's): byte-level BPE, <s> and </s>."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=320, special_tokens=["</s>", "<s>"],
                                                        show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if bos_template:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", tok.token_to_id("<s>"))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return HFFileTokenizer(tok, add_bos=bos_template, bos_token="<s>", eos_token="</s>")


def sentencepiece_style() -> HFFileTokenizer:
    """TinyLlama's scheme: ▁ for a space, <0x..> byte tokens for characters it never saw."""
    tok = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=380, show_progress=False,
                                                        special_tokens=["<unk>", "<s>", "</s>", *byte_tokens]))
    return HFFileTokenizer(tok, add_bos=True, bos_token="<s>", eos_token="</s>")


def model_for(tok: HFFileTokenizer, padding: int = 0) -> DecoderLM:
    cfg = ModelConfig(vocab_size=tok.vocab_size + padding, block_size=32, n_layers=1, n_heads=2, d_model=16,
                      vocab_used=tok.vocab_size if padding else None)
    torch.manual_seed(0)
    return DecoderLM(cfg).eval()


GOOD = byte_level(bos_template=False)
FILE = checkpoint_bytes(model_for(GOOD), GOOD)
GOOD_DOC = json.loads(GOOD.to_dict()["tokenizer"])


def with_tokenizer(data: bytes, tok_dict) -> bytes:
    """The same file with its tokenizer metadata replaced (tensor offsets are relative to the body)."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8: 8 + n])
    header["__metadata__"]["tokenizer"] = json.dumps(tok_dict)
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data[8 + n:]


def hf_data(doc, **fields) -> dict:
    return {**GOOD.to_dict(), "tokenizer": doc if isinstance(doc, str) else json.dumps(doc), **fields}


def edited(**changes) -> dict:
    """A copy of the valid tokenizer.json with top-level or model (model_<key>) fields replaced."""
    doc = json.loads(json.dumps(GOOD_DOC))
    for key, value in changes.items():
        if key.startswith("model_"):
            doc["model"][key[len("model_"):]] = value
        else:
            doc[key] = value
    return doc


@pytest.fixture
def parsed(monkeypatch):
    """Calls of the tokenizers library's parser (still parsing what reaches it)."""
    calls: list[int] = []
    real = HFTokenizer.from_str

    class Spy:
        @staticmethod
        def from_str(text):
            calls.append(len(text))
            return real(text)

    monkeypatch.setattr(hf_tokenizer, "HFTokenizer", Spy)
    return calls


@pytest.mark.parametrize("make", [lambda: GOOD, lambda: byte_level(True), sentencepiece_style],
                         ids=["gpt2", "llama-bos", "tinyllama-sentencepiece"])
def test_family_tokenizers_come_back_identical(make, parsed):
    tok = make()
    ckpt = parse_checkpoint(checkpoint_bytes(model_for(tok), tok))
    again = ckpt.tokenizer
    assert len(parsed) == 1  # parsed once, after the checks
    assert again.to_dict() == tok.to_dict() and again == tok
    assert (again.vocab_size, again.bos_id, again.eos_id, again.add_bos) == (tok.vocab_size, tok.bos_id,
                                                                             tok.eos_id, tok.add_bos)
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        assert again.encode(prompt) == ids and again.decode(ids) == tok.decode(ids)
        assert [again.piece(i) for i in ids] == [tok.piece(i) for i in ids]
    assert tok.decode(tok.encode(PROMPTS[2])).endswith("ζ and € and émigré\n")


def test_padded_vocabulary_loads_and_the_tokenizer_must_match_vocab_used():
    tok = GOOD
    ckpt = parse_checkpoint(checkpoint_bytes(model_for(tok, padding=12), tok))
    assert (ckpt.model.cfg.vocab_size, ckpt.model.cfg.vocab_used) == (tok.vocab_size + 12, tok.vocab_size)
    wrong = model_for(tok, padding=12)
    wrong.cfg = wrong.cfg.replace(vocab_used=tok.vocab_size - 1)
    with pytest.raises(ValueError, match=f"tokenizer has {tok.vocab_size} tokens but the model expects "
                                         f"{tok.vocab_size - 1}"):
        parse_checkpoint(checkpoint_bytes(wrong, tok))


MERGE = list(GOOD_DOC["model"]["merges"][0])
ADDED = {"id": 0, "content": "</s>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
ATTACKS = {
    # the JSON text itself
    "not json": (hf_data("{'model': BPE"), "is not valid JSON"),
    "not a string": ({**GOOD.to_dict(), "tokenizer": GOOD_DOC}, "must be a JSON string, not an object"),
    "nested deeply": (hf_data("[" * 100_000 + "]" * 100_000), "nested too deeply"),
    "duplicate key": (hf_data('{"version": "1.0", "version": "1.0"}'), "duplicate key 'version'"),
    "NaN": (hf_data(edited(model_dropout=float("nan"))), "holds NaN, which is not JSON"),
    # the model
    "WordPiece": (hf_data(edited(model={"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0}})),
                  "model.type is 'WordPiece'; only BPE models"),
    "Unigram": (hf_data(edited(model={"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0]]})),
                "model.type is 'Unigram'; only BPE models"),
    "dropout": (hf_data(edited(model_dropout=0.5)), "model.dropout must be null"),
    "suffix": (hf_data(edited(model_end_of_word_suffix="</w>")), "model.end_of_word_suffix must be null"),
    "vocabulary over the limit": (hf_data(edited(model_vocab={f"t{i}": i for i in range(MAX_LOADED_VOCAB + 1)})),
                                  f"model.vocab has {MAX_LOADED_VOCAB + 1:,} tokens; this file may have 1 to 4,096"),
    "long token": (hf_data(edited(model_vocab={**GOOD_DOC["model"]["vocab"], "x" * (MAX_HF_TOKEN_BYTES + 1): 999})),
                   f"is longer than {MAX_HF_TOKEN_BYTES} bytes"),
    "id past the limit": (hf_data(edited(model_vocab={**GOOD_DOC["model"]["vocab"], "zz": 10**9})),
                          "id of 'zz' must be a whole number from 0 to 4,095"),
    "ids with a gap": (hf_data(edited(model_vocab={**GOOD_DOC["model"]["vocab"], "zz": 4000})),
                       "token ids must run from 0 to"),
    "merge of unknown tokens": (hf_data(edited(model_merges=[["q", "@@"]])), "model.merges[0] uses or makes '@@'"),
    "more merges than tokens": (hf_data(edited(model_merges=[MERGE] * 4000)),
                                "model.merges has 4,000 entries; the limit is 4 per token of the vocabulary's"),
    # what the library would run on every text
    "padding": (hf_data(edited(padding={"strategy": {"Fixed": 2_000_000}, "direction": "Right", "pad_id": 0,
                                        "pad_type_id": 0, "pad_token": "</s>", "pad_to_multiple_of": None})),
                "padding must be null"),
    "truncation": (hf_data(edited(truncation={"max_length": 1, "strategy": "LongestFirst", "stride": 0,
                                              "direction": "Right"})), "truncation must be null"),
    "unknown pre-tokenizer": (hf_data(edited(pre_tokenizer={"type": "Split", "pattern": {"Regex": "(a+)+b"},
                                                            "behavior": "Isolated", "invert": False})),
                              "a pre_tokenizer of type 'Split', which the app does not run"),
    "pre-tokenizer inside a sequence": (hf_data(edited(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Whitespace"}]})), "a pre_tokenizer of type 'Whitespace'"),
    "sequence in a sequence": (hf_data(edited(decoder={"type": "Sequence", "decoders": [
        {"type": "Sequence", "decoders": []}]})), "a decoder of type 'Sequence'"),
    "multiplying normalizer": (hf_data(edited(normalizer={"type": "Replace", "pattern": {"Regex": "(?s)."},
                                                          "content": "x" * 10_000})), "normalizer Replace.pattern"),
    "prepend": (hf_data(edited(normalizer={"type": "Prepend", "prepend": "▁" * 10_000})), "normalizer Prepend.prepend"),
    "lowercase": (hf_data(edited(normalizer={"type": "Lowercase"})), "a normalizer of type 'Lowercase'"),
    "decoder replace": (hf_data(edited(decoder={"type": "Replace", "pattern": {"String": "a"}, "content": "b" * 99})),
                        "decoder Replace.pattern"),
    "byte-level option": (hf_data(edited(decoder={"type": "ByteLevel", "add_prefix_space": "yes",
                                                  "trim_offsets": True, "use_regex": True})),
                          "decoder ByteLevel.add_prefix_space must be a boolean"),
    "long template": (hf_data(edited(post_processor={"type": "TemplateProcessing", "special_tokens": {},
                                                     "single": [{"Sequence": {"id": "A", "type_id": 0}}] * 9,
                                                     "pair": []})), "single must be an array of 1 to 8 pieces"),
    "template id": (hf_data(edited(post_processor={"type": "TemplateProcessing", "single": [
        {"Sequence": {"id": "A", "type_id": 0}}], "pair": [{"Sequence": {"id": "B", "type_id": 0}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [10**6], "tokens": ["<s>"]}}})), "special_tokens['<s>'].ids"),
    # added tokens
    "added tokens flood": (hf_data(edited(added_tokens=[{**ADDED, "id": 400 + i, "content": f"<x{i}>"}
                                                        for i in range(5000)])),
                           "added_tokens has 5,000 entries; the limit is"),
    "added token elsewhere": (hf_data(edited(added_tokens=[{**ADDED, "id": 5}])), "gives id 5 to '</s>'"),
    "added token option": (hf_data(edited(added_tokens=[{**ADDED, "lstrip": 1}])), "added_tokens[0].lstrip"),
    # the fields beside tokenizer.json
    "unknown key": (hf_data(GOOD_DOC, extra=1), "hf tokenizer data has an unknown key 'extra'"),
    "bos not a token": (hf_data(GOOD_DOC, bos="<nope>", add_bos=True), "'bos' must be null or a token, not '<nope>'"),
    "bos for nothing": (hf_data(GOOD_DOC, bos=None, add_bos=True), "asks for a BOS token first but names none"),
    "add_bos not a flag": (hf_data(GOOD_DOC, add_bos="yes"), "'add_bos' must be true or false"),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_hostile_tokenizer_in_an_uploaded_file_is_one_sentence(name, parsed):
    tok_dict, words = ATTACKS[name]
    built = []
    with pytest.raises(ValueError) as info:
        parse_checkpoint(with_tokenizer(FILE, tok_dict), DEFAULT_LIMITS, before_build=built.append)
    one_sentence(str(info.value), words)
    assert parsed == [] and built == [], "refused data must reach neither the tokenizers library nor the model"


def test_huge_tokenizer_json(parsed):
    """Past the upload's header limit the file is refused as a whole; below it, the tokenizer.json
    text is bounded by the vocabulary limit (MAX_JSON_CHARS_PER_TOKEN characters per token)."""
    huge = hf_data(json.dumps({**GOOD_DOC, "pad": " " * 2_000_000}))
    with pytest.raises(ValueError) as info:
        parse_checkpoint(with_tokenizer(FILE, huge))
    one_sentence(str(info.value), "its header would be")
    cap = MAX_JSON_CHARS_PER_TOKEN * 1000
    with pytest.raises(ValueError) as info:
        tokenizer_from_dict(hf_data(" " * (cap + 1)), max_vocab=1000)
    one_sentence(str(info.value), f"is {cap + 1:,} characters; the limit is {cap:,}")
    assert parsed == []


def test_a_million_merges(parsed):
    """A million merges: an upload that large is refused for its size; under the command line's largest
    vocabulary limit (where the text is within the bound), the merges are counted before any is read."""
    doc = json.dumps(edited(model_merges=[MERGE] * 10**6))
    with pytest.raises(ValueError) as info:
        parse_checkpoint(with_tokenizer(FILE, hf_data(doc)))
    one_sentence(str(info.value), f"bytes; the limit is {DEFAULT_LIMITS.max_file_bytes:,}")
    with pytest.raises(ValueError) as info:
        tokenizer_from_dict(hf_data(doc), max_vocab=MAX_PRETRAINED_VOCAB)
    one_sentence(str(info.value), "model.merges has 1,000,000 entries; the limit is 4 per token")
    assert parsed == []


def one_sentence(msg: str, words: str) -> None:
    assert words in msg, msg
    assert "\n" not in msg and ". " not in msg.rstrip(".") and len(msg) < 300, msg
    assert "Traceback" not in msg and "<class" not in msg and "Error" not in msg, msg
