"""tokenizer.json files in the layouts of the families issue 39 opens, read by the app's own reader
(model/hf_tokenizer.py, checked by model/hf_tokenizer_checks.py) and held to transformers.

* Qwen2 / Qwen2.5 / Qwen3, Llama 3.x and SmolLM3, OLMo 2 (and Phi-4), Phi-4-mini: byte-level BPE behind
  a `Split` pre-tokenizer whose regular expression is the family's own (SPLIT_REGEXES);
* Gemma 2 and 3: BPE with byte fallback over a `▁` vocabulary, the normalizer Replace(" " -> "▁"), a
  Split at the space, and the decoder Replace("▁" -> " "), ByteFallback, Fuse.

Each is built here, small and without the internet, in the family's exact layout: transformers' own
Qwen2Tokenizer and GemmaTokenizer write theirs; the others are put together from the `tokenizers`
components transformers' TikTokenConverter uses (and, for OLMo 2, the older Removed + invert spelling
its file keeps). The reader must open each folder and give the ids and text transformers' tokenizer
gives on the same folder, for texts with accents, emoji, digit runs, contractions, newlines and runs of
spaces; a Decoder Lab file's copy (to_dict / from_dict) must give them too.

A file whose pattern, cut, normalizer or decoder step differs from what the families ship is refused
with one sentence that names what is refused, from a model folder and from an uploaded file alike
(and, uploaded, before the `tokenizers` library parses any of it).

A folder whose tokenizer_config.json names GPT2Tokenizer (OLMo 2's does) is rebuilt by transformers 5
with GPT-2's own pre-tokenizer in place of the file's Split, which cuts "obj.get(x)" otherwise; the file
is what such a model was trained with, so the files put together from components here name
PreTrainedTokenizerFast, transformers' tokenizer that runs a file as written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

import model.hf_tokenizer as hf_tokenizer
from model.hf_tokenizer import HFFileTokenizer
from model.hf_tokenizer_checks import SPLIT_REGEXES
from model.tokenizers import MAX_PRETRAINED_VOCAB

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

CORPUS = ("Once upon a time there was a little fox. The fox didn't run; it's 12345 days old, we'll see.\n"
          "She said: I'M here, you're there, they've gone. Numbers 2024 and 1999 and 7.\n\n"
          "    indented code(x) == obj.get(y);\n\ttab\tand  two  spaces   three.\n"
          "café naïve émigré über Ωmega. ") * 6
TEXTS = [
    "Hello world",
    "café naïve émigré, Ωmega and Ünïcödé",
    "emoji 😀🎉 and a flag 🇫🇷!",
    "12345 then 1234567890 and 7",
    "don't, it's, we'll, I'M, they've, you're",
    "line one\nline two\n\n\tTabbed line\r\n",
    "spaces   runs    here  ",
    " leading space and trailing ",
    "obj.get(x) == y;",
    "日本語のテキスト",
]


# ------------------------------------------------------------------ the families' files


def _trained(normalizer, pre_tokenizer, specials: list[str], byte_level: bool) -> tuple[dict, list]:
    """A small vocabulary and its merges learned from CORPUS through the family's own front steps."""
    tok = HFTokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    alphabet = pre_tokenizers.ByteLevel.alphabet() if byte_level else []
    tok.train_from_iterator([CORPUS], trainers.BpeTrainer(vocab_size=420 if byte_level else 480,
                                                          special_tokens=specials, initial_alphabet=alphabet,
                                                          show_progress=False))
    doc = json.loads(tok.to_str())
    return doc["model"]["vocab"], [tuple(m) for m in doc["model"]["merges"]]


def _split_then_bytes(regex: str, behavior: str = "isolated", invert: bool = False):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior=behavior, invert=invert),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _set_class(folder: Path, name: str) -> None:
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "tokenizer_class": name}))


def build_qwen(folder: Path) -> None:
    """Qwen2 / Qwen2.5 / Qwen3: written by transformers' Qwen2Tokenizer (NFC, its Split, byte level)."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    vocab, merges = _trained(normalizers.NFC(), _split_then_bytes(PRETOKENIZE_REGEX), ["<|endoftext|>"], True)
    Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token="<|endoftext|>",
                   pad_token="<|endoftext|>").save_pretrained(folder)


def _byte_level_file(folder: Path, regex: str, behavior: str, invert: bool, specials: list[str],
                     bos: str | None, eos: str, ignore_merges: bool) -> None:
    """The layout transformers' TikTokenConverter writes (the Llama 3 / cl100k / o200k files)."""
    from transformers import PreTrainedTokenizerFast

    vocab, merges = _trained(None, _split_then_bytes(regex, behavior, invert), specials, True)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    tok.pre_tokenizer = _split_then_bytes(regex, behavior, invert)
    tok.decoder = decoders.ByteLevel()
    byte_level = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    if bos is None:
        tok.post_processor = byte_level
    else:
        template = processors.TemplateProcessing(single=f"{bos} $A:0", pair=f"{bos} $A:0 {bos}:1 $B:1",
                                                 special_tokens=[(bos, vocab[bos])])
        tok.post_processor = processors.Sequence([byte_level, template])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos).save_pretrained(folder)
    _set_class(folder, "PreTrainedTokenizerFast")


def build_llama3(folder: Path) -> None:
    """Llama 3.x and SmolLM3: cl100k's pattern (Isolated), a BOS template after the byte-level step."""
    _byte_level_file(folder, SPLIT_REGEXES["cl100k"], "isolated", False,
                     ["<|begin_of_text|>", "<|end_of_text|>"], "<|begin_of_text|>", "<|end_of_text|>", True)


def build_olmo2(folder: Path) -> None:
    """OLMo 2 (and Phi-4): cl100k's pattern spelled Removed with invert true, no post-processor step."""
    _byte_level_file(folder, SPLIT_REGEXES["cl100k"], "removed", True, ["<|endoftext|>", "<|pad|>"], None,
                     "<|endoftext|>", False)
    doc = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**doc, "post_processor": None}))


def build_phi4_mini(folder: Path) -> None:
    """Phi-4-mini: o200k's pattern (GPT-4o's encoding)."""
    _byte_level_file(folder, SPLIT_REGEXES["o200k"], "isolated", False, ["<|endoftext|>"], None,
                     "<|endoftext|>", True)


def build_gemma(folder: Path) -> None:
    """Gemma 2 / 3: written by transformers' GemmaTokenizer (▁ normalizer, Split at the space, byte
    fallback), with the <bos> template and tokenizer_config.json's add_bos_token their files have."""
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", *(f"<0x{b:02X}>" for b in range(256))]
    split = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    vocab, merges = _trained(normalizers.Replace(" ", "▁"), split, specials, False)
    GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True).save_pretrained(folder)  # the <bos> template
    path = folder / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "add_bos_token": True}))


FAMILIES: dict[str, Callable[[Path], None]] = {
    "qwen2": build_qwen, "llama3": build_llama3, "olmo2": build_olmo2, "phi4-mini": build_phi4_mini,
    "gemma": build_gemma,
}
# What each family's file must hold (so the test is of the layout the family ships)
PRE_TOKENIZER = {
    "qwen2": [("Split", {"Regex": SPLIT_REGEXES["Qwen2"]}, "Isolated", False), "ByteLevel"],
    "llama3": [("Split", {"Regex": SPLIT_REGEXES["cl100k"]}, "Isolated", False), "ByteLevel"],
    "olmo2": [("Split", {"Regex": SPLIT_REGEXES["cl100k"]}, "Removed", True), "ByteLevel"],
    "phi4-mini": [("Split", {"Regex": SPLIT_REGEXES["o200k"]}, "Isolated", False), "ByteLevel"],
    "gemma": [("Split", {"String": " "}, "MergedWithPrevious", False)],
}
BOS = {"qwen2": None, "llama3": "<|begin_of_text|>", "olmo2": None, "phi4-mini": None, "gemma": "<bos>"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    built = {}
    for name, build in FAMILIES.items():
        build(root / name)
        built[name] = root / name
    return built


def reference(folder: Path):
    """transformers' tokenizer on the folder: its own class, or the file as written (see the docstring)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = json.loads((folder / "tokenizer_config.json").read_text())
    if config["tokenizer_class"] == "PreTrainedTokenizerFast":
        return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **{
            key: config[key] for key in ("bos_token", "eos_token") if config.get(key)})
    return AutoTokenizer.from_pretrained(folder)


def steps(doc: dict) -> list:
    pre = doc["pre_tokenizer"]
    inner = pre["pretokenizers"] if pre["type"] == "Sequence" else [pre]
    return [(s["type"], s["pattern"], s["behavior"], s["invert"]) if s["type"] == "Split" else s["type"]
            for s in inner]


# ------------------------------------------------------------------ opening them


def test_the_allowed_patterns_are_the_ones_transformers_ships():
    """Each allowed pattern is, character for character, the one transformers builds the family with."""
    from transformers.convert_slow_tokenizer import TikTokenConverter
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    assert SPLIT_REGEXES["Qwen2"] == PRETOKENIZE_REGEX == GGUF_PRE_TOKENIZER_SPLITS["qwen2"]
    assert SPLIT_REGEXES["cl100k"] == TikTokenConverter().pattern == GGUF_PRE_TOKENIZER_SPLITS["llama3"]
    assert SPLIT_REGEXES["cl100k"] == GGUF_PRE_TOKENIZER_SPLITS["dbrx"]  # Phi-4's and OLMo 2's (cl100k)
    assert SPLIT_REGEXES["o200k"] == GGUF_PRE_TOKENIZER_SPLITS["gpt-4o"]  # Phi-4-mini's
    assert len(SPLIT_REGEXES) == 4


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_family_file_opens_and_gives_transformers_ids_and_text(family, folders):
    folder = folders[family]
    doc = json.loads((folder / "tokenizer.json").read_text())
    assert steps(doc) == PRE_TOKENIZER[family]
    if family == "gemma":
        assert doc["normalizer"] == {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        assert [d["type"] for d in doc["decoder"]["decoders"]] == ["Replace", "ByteFallback", "Fuse"]
        assert doc["model"]["byte_fallback"] is True
    ref = reference(folder)
    tok = HFFileTokenizer.from_folder(folder, family_adds_bos=True)
    assert tok.bos_id == (ref.convert_tokens_to_ids(BOS[family]) if BOS[family] else None)
    assert tok.add_bos == (BOS[family] is not None)
    again = HFFileTokenizer.from_dict(tok.to_dict(), MAX_PRETRAINED_VOCAB)  # a Decoder Lab file's copy
    for text in TEXTS:
        ids = ref(text)["input_ids"]
        assert tok.encode(text) == ids, (family, text)
        assert again.encode(text) == ids, (family, text)
        assert tok.decode(ids) == ref.decode(ids) == again.decode(ids), (family, text)
        own = tok.encode(text, add_special_tokens=False)
        assert tok.decode(own) == text  # byte-level and byte fallback lose nothing
        if text.isascii():  # each piece shows the text it stands for
            assert "".join(tok.text_of(i) for i in own) == text, (family, text)


def test_digit_runs_and_contractions_are_cut_as_each_family_cuts_them(folders):
    """The patterns differ where it shows: Qwen splits digits one by one, cl100k and o200k in threes,
    and only o200k keeps a contraction on its word."""
    def pieces(family: str, text: str) -> list[str]:
        tok = HFFileTokenizer.from_folder(folders[family], family_adds_bos=False)
        return [tok.text_of(i) for i in tok.encode(text)]

    for family in ("qwen2", "llama3", "olmo2", "phi4-mini"):
        cut = pieces(family, "12345")
        assert all(len(p) <= (1 if family == "qwen2" else 3) for p in cut), (family, cut)
        assert "".join(cut) == "12345"
    assert not any(p.startswith("'") for p in pieces("phi4-mini", "didn't"))
    assert any(p.startswith("'") for p in pieces("llama3", "didn't"))


def test_a_regex_split_alone_opens_too(folders):
    """A family's Split may stand alone, as Gemma's does, and not only first in a Sequence: the reader
    then runs what the library runs on that file."""
    doc = json.loads((folders["qwen2"] / "tokenizer.json").read_text())
    alone = json.dumps({**doc, "pre_tokenizer": doc["pre_tokenizer"]["pretokenizers"][0]})
    tok = HFFileTokenizer.from_dict({**_stored(folders["qwen2"]), "tokenizer": alone}, MAX_PRETRAINED_VOCAB)
    library = HFTokenizer.from_str(alone)
    for text in ("Hello world", "12345 don't"):
        assert tok.encode(text) == library.encode(text).ids


# ------------------------------------------------------------------ refusing the rest


def _stored(folder: Path) -> dict:
    return HFFileTokenizer.from_folder(folder, family_adds_bos=True).to_dict()


def _pre(doc: dict) -> dict:
    """The Split step of a file (first in its Sequence, or alone)."""
    pre = doc["pre_tokenizer"]
    return pre["pretokenizers"][0] if pre["type"] == "Sequence" else pre


def _set(path: str, value) -> Callable[[dict], None]:
    """An edit of a file: "split.KEY" a field of its Split step, "SLOT" or "SLOT.KEY" a top-level slot."""
    def edit(doc: dict) -> None:
        slot, _, key = path.partition(".")
        if slot == "split":
            _pre(doc)[key] = value
        elif key:
            doc[slot][key] = value
        else:
            doc[slot] = value
    return edit


def _decoder_step(i: int, **fields) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        doc["decoder"]["decoders"][i] = {**doc["decoder"]["decoders"][i], **fields}
    return edit


QWEN_DIGITS_IN_TWOS = SPLIT_REGEXES["Qwen2"].replace(r"\p{N}|", r"\p{N}{1,2}|")
VARIANTS = {
    # a regular expression of the file's own, or a string the families do not split at
    "qwen regex changed": ("qwen2", _set("split.pattern", {"Regex": QWEN_DIGITS_IN_TWOS}),
                           "pre_tokenizer of type 'Split', which the app does not run with the regular expression"),
    "backtracking regex": ("llama3", _set("split.pattern", {"Regex": "(a+)+b"}), "the regular expression '(a+)+b'"),
    "cl100k with a space": ("olmo2", _set("split.pattern", {"Regex": SPLIT_REGEXES["cl100k"] + " "}),
                            "which the app does not run with the regular expression"),
    "string pattern": ("llama3", _set("split.pattern", {"String": "x"}), "does not run with the string 'x'"),
    "gemma split at a letter": ("gemma", _set("split.pattern", {"String": "e"}), "does not run with the string 'e'"),
    # the right pattern, cut otherwise
    "llama3 behavior": ("llama3", _set("split.behavior", "MergedWithNext"),
                        "Split.behavior is 'MergedWithNext' with invert false"),
    "llama3 inverted": ("llama3", _set("split.invert", True), "Split.behavior is 'Isolated' with invert true"),
    "olmo2 not inverted": ("olmo2", _set("split.invert", False), "Split.behavior is 'Removed' with invert false"),
    "invert not a flag": ("qwen2", _set("split.invert", 0), "Split.behavior is 'Isolated' with invert 0"),
    "gemma behavior": ("gemma", _set("split.behavior", "Isolated"), "pre_tokenizer Split.behavior must be"),
    "gemma inverted": ("gemma", _set("split.invert", True), "pre_tokenizer Split.invert must be false"),
    "split extra key": ("qwen2", _set("split.extra", 1), "Split has an unknown key 'extra'"),
    # normalizers and decoders the families do not ship
    "unknown normalizer": ("qwen2", _set("normalizer", {"type": "NFKC"}), "a normalizer of type 'NFKC'"),
    "gemma normalizer content": ("gemma", _set("normalizer.content", "_"), "normalizer Replace.content must be"),
    "gemma normalizer pattern": ("gemma", _set("normalizer.pattern", {"Regex": " +"}),
                                 "normalizer Replace.pattern"),
    "gemma decoder content": ("gemma", _decoder_step(0, content="_"), "decoder Replace.content must be"),
    "gemma decoder pattern": ("gemma", _decoder_step(0, pattern={"String": "_"}),
                              "decoder Replace.pattern.String must be"),
    "unknown decoder step": ("gemma", _decoder_step(2, type="CTC", pad_token="<pad>", word_delimiter_token="|",
                                                    cleanup=True), "a decoder of type 'CTC'"),
    "decoder strip content": ("gemma", _decoder_step(2, type="Strip", content="x", start=1, stop=0),
                              "decoder Strip.content must be"),
}


# In a model folder the library reads the file first and its reading is checked: a value it cannot read
# is refused as unreadable, and a key it ignores is not in what it runs (None: the folder opens).
IN_A_FOLDER = {"invert not a flag": "tokenizer.json could not be read by the tokenizers library",
               "split extra key": None}


def one_sentence(msg: str, words: str) -> None:
    assert words in msg, msg
    assert "\n" not in msg and ". " not in msg.rstrip(".") and len(msg) < 300, msg
    assert "Traceback" not in msg and "<class" not in msg and "Error" not in msg, msg


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_changed_file_is_refused_with_one_sentence(name, folders, tmp_path, monkeypatch):
    family, edit, words = VARIANTS[name]
    doc = json.loads((folders[family] / "tokenizer.json").read_text())
    edit(doc)
    # from a model folder
    shutil.copytree(folders[family], tmp_path / family)
    (tmp_path / family / "tokenizer.json").write_text(json.dumps(doc))
    in_folder = IN_A_FOLDER.get(name, words)
    if in_folder is None:
        opened = HFFileTokenizer.from_folder(tmp_path / family, family_adds_bos=True)
        assert opened.to_dict()["tokenizer"] == _stored(folders[family])["tokenizer"]
    else:
        with pytest.raises(ValueError) as info:
            HFFileTokenizer.from_folder(tmp_path / family, family_adds_bos=True)
        one_sentence(str(info.value), in_folder)
    # from an uploaded Decoder Lab file: refused before the library parses a byte of it
    stored = {**_stored(folders[family]), "tokenizer": json.dumps(doc)}
    parsed: list[int] = []
    real = HFTokenizer.from_str

    class Spy:
        @staticmethod
        def from_str(text):
            parsed.append(len(text))
            return real(text)

    monkeypatch.setattr(hf_tokenizer, "HFTokenizer", Spy)
    with pytest.raises(ValueError) as info:
        HFFileTokenizer.from_dict(stored, MAX_PRETRAINED_VOCAB)
    one_sentence(str(info.value), words)
    assert parsed == []
