"""Character-level BPE, trained locally with HF ``tokenizers``, and the check of its stored form.

`BPETokenizer` learns merges over characters (not bytes): characters never seen in training
become ``<unk>`` and are reported, as with the character and word tokenizers. `encode_chunks`
cuts a long text only where its encoding cannot change (see "cutting text" below), so a caller
can stop between parts. A stored BPE tokenizer is HF JSON from a file a person gave us:
`BPETokenizer.from_json` accepts exactly the structure `train` writes (an allow-list of every
field) and builds the HF object from the checked values only.
"""

from __future__ import annotations

import itertools
import json
import re
from functools import lru_cache
from typing import Any, Iterable, Iterator

from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models as hf_models
from tokenizers import pre_tokenizers as hf_pre
from tokenizers import trainers as hf_trainers

from .json_bounds import unique_keys
from .tokenizer_core import (
    MAX_LOADED_VOCAB, MAX_TOKEN_BYTES, MAX_VOCAB, UNK, Encoded, Tokenizer, check_keys, check_piece, check_same,
    dedup, display_piece, json_type, preview,
)

# BPE training counts token length in characters; a character is at most 4 bytes of UTF-8,
# so this many characters always stays within MAX_TOKEN_BYTES.
_BPE_TRAIN_MAX_CHARS = MAX_TOKEN_BYTES // 4
# Bound on the HF JSON string checked before it is parsed: MAX_LOADED_VOCAB vocabulary
# entries and as many merges, each at most 64 bytes escaped 6 characters per byte, fit
# in about 3.3 million characters.
MAX_BPE_JSON_CHARS = 4_000_000
# GPT-2-like split with a leading space kept on words, but over characters, and no piece
# longer than _BPE_TRAIN_MAX_CHARS (16) characters: a run of letters, digits, other marks or
# whitespace is cut into chunks (a leading space plus at most 15, or 16 whitespace). HF's BPE
# trainer is very slow on long pieces (a text of 320,000 identical letters without a space is
# one piece under an unbounded split), and no token can be longer than 16 characters anyway.
_BPE_SPLIT = r" ?\p{L}{1,15}| ?\p{N}{1,15}| ?[^\s\p{L}\p{N}]{1,15}|\s{1,16}(?!\S)|\s{1,16}"
# The unbounded split that BPE tokenizers trained before carry; they still load (and keep it).
_BPE_SPLIT_V1 = r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# BPE merges are learned on at most this many characters of a longer text: evenly spaced
# slices of it, so that training takes a bounded time (HF's trainer cannot be interrupted).
# Every character of the whole text still enters the vocabulary, and the whole text is encoded.
BPE_TRAIN_SAMPLE_CHARS = 200_000
_BPE_TRAIN_SLICES = 32
# Lone surrogates (possible in text that arrived as JSON) cannot be passed to the HF library.
_SURROGATE = re.compile("[\ud800-\udfff]")


class BPETokenizer(Tokenizer):
    """Character-level BPE trained locally with HF ``tokenizers``.

    Text is pre-split GPT-2 style (a word keeps its leading space), merges are
    learned over characters, and unseen characters map to ``<unk>``. Decoding
    concatenates token strings, so in-vocabulary text round-trips exactly.
    """

    kind = "bpe"

    def __init__(self, hf: HFTokenizer) -> None:
        vocab = hf.get_vocab(with_added_tokens=True)
        if len(vocab) > MAX_VOCAB:
            raise ValueError(f"vocabulary has {len(vocab)} entries; the limit is {MAX_VOCAB}")
        itos = [""] * len(vocab)
        for piece, i in vocab.items():
            if not 0 <= i < len(vocab) or itos[i]:
                raise ValueError("BPE vocabulary ids must be unique and contiguous from 0")
            itos[i] = piece
        super().__init__(itos)
        self._hf = hf
        # Only the bounded split lets encode_chunks cut inside a long run of one kind of character.
        try:
            self._bounded_split = json.loads(hf.pre_tokenizer.__getstate__()) == _BPE_PRE_TOKENIZER
        except Exception:  # no pre-tokenizer, or an unexpected library state: cut only where safe anyway
            self._bounded_split = False

    @classmethod
    def train(cls, text: str, vocab_size: int = 256) -> BPETokenizer:
        """Learn merges on ``text`` (on evenly spaced slices of it when it is longer than
        :data:`BPE_TRAIN_SAMPLE_CHARS`); every character of ``text`` is in the vocabulary."""
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 2 <= vocab_size <= MAX_VOCAB:
            raise ValueError(f"vocab_size must be an integer from 2 to {MAX_VOCAB}, got {preview(vocab_size)}")
        alphabet = sorted(set(_SURROGATE.sub("", text)) if _SURROGATE.search(text) else set(text))
        if len(alphabet) + 1 > MAX_VOCAB:
            raise ValueError(f"the text has {len(alphabet):,} distinct characters; "
                             f"a BPE vocabulary holds at most {MAX_VOCAB - 1:,} besides {UNK}")
        hf = HFTokenizer(hf_models.BPE(unk_token=UNK))
        hf.pre_tokenizer = hf_pre.Split(Regex(_BPE_SPLIT), behavior="isolated")
        trainer = hf_trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[UNK], show_progress=False,
            max_token_length=_BPE_TRAIN_MAX_CHARS,  # keeps every merged token within MAX_TOKEN_BYTES
            initial_alphabet=alphabet,  # characters outside the sampled slices are not <unk>
        )
        parts = [seg for part in _training_sample(text) for seg in _SURROGATE.split(part) if seg]
        hf.train_from_iterator(parts, trainer=trainer)
        return cls(hf)

    @classmethod
    def from_json(cls, data: Any, max_vocab: int = MAX_LOADED_VOCAB) -> BPETokenizer:
        """Rebuild from an HF tokenizer JSON string (untrusted input).

        The string must describe exactly what :meth:`train` writes (see
        :func:`_checked_bpe_doc`); the HF tokenizer is then built from the checked values
        only, so nothing unchecked ever reaches the library.
        """
        doc = _checked_bpe_doc(data, max_vocab)
        try:
            hf = HFTokenizer.from_str(json.dumps(doc))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # Rust panics surface as BaseException subclasses
            raise ValueError("the BPE tokenizer data could not be loaded") from None
        return cls(hf)

    def _segments(self, text: str) -> list[tuple[int, str]]:
        """``(start, segment)`` pieces of ``text`` for HF: a lone surrogate (which HF cannot
        take) becomes a segment of its own, encoded here as ``<unk>``."""
        if not _SURROGATE.search(text):
            return [(0, text)]
        out, start = [], 0
        for m in _SURROGATE.finditer(text):
            out += [(start, text[start:m.start()]), (m.start(), m.group())]
            start = m.end()
        return [*out, (start, text[start:])]

    def encode_verbose(self, text: str) -> Encoded:
        ids: list[int] = []
        unknown: list[str] = []
        unk = self.unk_id
        for start, seg in self._segments(text):
            if _SURROGATE.fullmatch(seg):
                ids.append(unk)
                unknown.append(seg)
                continue
            enc = self._hf.encode(seg, add_special_tokens=False)
            ids += enc.ids
            unknown += (text[start + a:start + b] for i, (a, b) in zip(enc.ids, enc.offsets) if i == unk)
        return Encoded(ids=ids, pieces=[display_piece(self._itos[i]) for i in ids], unknown=dedup(unknown))

    def encode(self, text: str) -> list[int]:
        return [i for part in self.encode_chunks(text, chunk_chars=len(text) + 1) for i in part]

    def encode_chunks(self, text: str, chunk_chars: int = 100_000) -> Iterator[list[int]]:
        if chunk_chars < 1:
            raise ValueError("chunk_chars must be positive")
        for _, seg in self._segments(text):
            if _SURROGATE.fullmatch(seg):
                yield [self.unk_id]
                continue
            start = 0
            for cut in itertools.chain(_bpe_cuts(seg, chunk_chars, self._bounded_split), [len(seg)]):
                if cut > start:
                    # encode_batch_fast skips the offsets: about half the time of encode on a long text
                    yield self._hf.encode_batch_fast([seg[start:cut]], add_special_tokens=False)[0].ids
                start = cut

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self._raw(ids))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "tokenizer": self._hf.to_str()}


# ------------------------------------------------------------ cutting text for BPE encoding
#
# HF encodes a text by splitting it at occurrences of the special token <unk>, splitting each
# part with the pre-tokenizer regex into pieces, and encoding every piece on its own. So
# encoding text[:p] and text[p:] gives exactly the ids of the whole text when p is a piece
# boundary of the whole text that both halves also see as one. The regex has no look-behind,
# so matching from a boundary p depends only on text[p:]; the cuts below also leave the pieces
# before p unchanged:
#
# * Class change: the character before p is not whitespace and the one at p is of another
#   class (letter, number, other, whitespace; see _piece_class). Every alternative of the
#   regex matches characters of one class (after an optional leading space), so the piece
#   holding text[p-1] ends at p in the whole text and in text[:p] alike.
# * Inside a long run of one class (no class change near the target): the split's own pieces
#   of text[b:end], where b is a known boundary and no <unk> occurs. With the bounded split a
#   match looks at most 17 characters ahead, so a piece start at least that far from `end` is
#   a boundary of the whole text; it is cut at when the piece before it stopped at its length
#   limit (_full_piece), so that piece did not look at text[p:] (a whitespace piece that
#   stopped before a letter did: "\n\n" + "a" is "\n", "\n", "a" but "\n\n" alone one
#   piece). The old unbounded split could look arbitrarily far ahead: no such cuts there.
# * Never inside an occurrence of "<unk>".
#
# tests/engine/test_tokenizers.py holds the chunked encoding to the whole one on adversarial text.

_CUT_SCAN = 256  # characters searched for a class change after a target position
_CUT_BACK = 4096  # ... and before it, for a known boundary to split a long run from
_PIECE_LOOKAHEAD = 17  # most characters one match of the bounded split looks at
_PIECE_SPLIT = hf_pre.Split(Regex(_BPE_SPLIT), behavior="isolated")


@lru_cache(maxsize=65536)
def _piece_class(c: str) -> str:
    """Class of ``c`` under the BPE split, asked of the split itself: ``"L"`` letter,
    ``"N"`` number, ``"P"`` anything else but whitespace, ``"S"`` whitespace."""
    for probe, cls in (("a", "L"), ("1", "N"), ("!", "P")):
        if len(_PIECE_SPLIT.pre_tokenize_str(probe + c + probe)) == 1:
            return cls
    return "S"


def _class_change(text: str, p: int) -> bool:
    """Whether ``p`` is a class-change cut (see above)."""
    before = _piece_class(text[p - 1])
    if before == "S" or before == _piece_class(text[p]):
        return False
    q = text.find(UNK, max(0, p - len(UNK) + 1), p + len(UNK) - 1)  # an occurrence holding p
    return q == -1


def _full_piece(piece: str) -> bool:
    """Whether the bounded split's ``piece`` stopped at its length limit (16 whitespace, or 15
    of one other class after an optional space), not at what follows it."""
    return len(piece) == 16 or (len(piece) == 15 and piece[0] != " " and _piece_class(piece[-1]) != "S")


def _bpe_cuts(text: str, chunk_chars: int, bounded: bool) -> Iterator[int]:
    """Positions, about ``chunk_chars`` apart, where ``text`` (no lone surrogates) can be cut
    without changing its BPE encoding (see above). Each costs time in proportion to
    ``chunk_chars`` at most, so a caller encoding part by part can stop between parts."""
    n, known = len(text), 0  # known: the last position known to be a piece boundary
    target = chunk_chars
    while target < n:
        end = min(target + _CUT_SCAN, n)
        cut = next((p for p in range(max(target, known + 1), end) if _class_change(text, p)), None)
        if cut is None and bounded and end < n:
            base = next((p for p in range(target - 1, max(known, target - _CUT_BACK), -1) if _class_change(text, p)),
                        known)
            if text.find(UNK, base, end + len(UNK) - 1) == -1:  # none inside, none across the end
                before = ""
                for piece, (a, _) in _PIECE_SPLIT.pre_tokenize_str(text[base:end]):
                    p = base + a
                    if p + _PIECE_LOOKAHEAD > end:
                        break
                    if p >= target and _full_piece(before):
                        cut = p
                        break
                    before = piece
        if cut is None:
            target = end  # no cut here: the part grows
            continue
        yield cut
        known = cut
        target = cut + chunk_chars


def _training_sample(text: str) -> list[str]:
    """``text``, or evenly spaced slices of it totalling :data:`BPE_TRAIN_SAMPLE_CHARS`."""
    n = len(text)
    if n <= BPE_TRAIN_SAMPLE_CHARS:
        return [text]
    width = BPE_TRAIN_SAMPLE_CHARS // _BPE_TRAIN_SLICES
    return [text[s:s + width] for s in ((n - width) * i // (_BPE_TRAIN_SLICES - 1) for i in range(_BPE_TRAIN_SLICES))]


# What BPETokenizer.train writes with the installed HF library, field by field (a test holds
# a freshly trained tokenizer to these). Fields whose HF default equals the project's value
# may be absent (older library versions omit some); anything else must match exactly.
_BPE_ADDED_TOKENS = [
    {"id": 0, "content": UNK, "single_word": False, "lstrip": False, "rstrip": False,
     "normalized": False, "special": True},
]
_BPE_PRE_TOKENIZER = {"type": "Split", "pattern": {"Regex": _BPE_SPLIT}, "behavior": "Isolated", "invert": False}
# Accepted when loading: what train writes now, or exactly what it wrote before (the unbounded split).
_BPE_PRE_TOKENIZERS = (_BPE_PRE_TOKENIZER, {**_BPE_PRE_TOKENIZER, "pattern": {"Regex": _BPE_SPLIT_V1}})
_BPE_TOP_FIXED: dict[str, Any] = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": _BPE_ADDED_TOKENS,
    "normalizer": None,
    "pre_tokenizer": _BPE_PRE_TOKENIZER,
    "post_processor": None,
    "decoder": None,
}
_BPE_TOP_OPTIONAL = frozenset({"truncation", "padding", "normalizer", "post_processor", "decoder"})
_BPE_MODEL_FIXED: dict[str, Any] = {
    "type": "BPE",
    "dropout": None,
    "unk_token": UNK,
    "continuing_subword_prefix": None,
    "end_of_word_suffix": None,
    "fuse_unk": False,
    "byte_fallback": False,
    "ignore_merges": False,
}
_BPE_MODEL_OPTIONAL = frozenset(set(_BPE_MODEL_FIXED) - {"type", "unk_token"})


def _checked_bpe_vocab(vocab: Any, max_vocab: int) -> dict[str, int]:
    field = "BPE tokenizer model.vocab"
    if not isinstance(vocab, dict):
        raise ValueError(f"{field} must be an object, not {json_type(vocab)}")
    n = len(vocab)
    if not 1 <= n <= max_vocab:
        raise ValueError(f"{field} has {n:,} entries; it must have 1 to {max_vocab:,}")
    ids: set[int] = set()
    for piece, i in vocab.items():
        check_piece(piece, f"{field} entry {preview(piece)}")
        if isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"{field} id of {preview(piece)} must be an integer, not {json_type(i)}")
        if not 0 <= i < n:
            raise ValueError(f"{field} id of {preview(piece)} is {preview(i)}; ids must run from 0 to {n - 1}")
        if i in ids:
            raise ValueError(f"{field} uses id {i} twice; ids must be unique")
        ids.add(i)
    # n distinct ids in range(n): they are exactly 0..n-1.
    if vocab.get(UNK) != 0:
        raise ValueError(f"{field} must give {UNK!r} the id 0")
    return vocab


def _checked_bpe_merges(merges: Any, vocab: dict[str, int]) -> list[list[str]]:
    field = "BPE tokenizer model.merges"
    if not isinstance(merges, list):
        raise ValueError(f"{field} must be an array, not {json_type(merges)}")
    if len(merges) > len(vocab):  # each merge adds one token, so a real one has fewer
        raise ValueError(f"{field} has {len(merges):,} entries; the limit is the vocabulary size {len(vocab):,}")
    seen: set[tuple[str, str]] = set()
    for i, pair in enumerate(merges):
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(p, str) for p in pair):
            raise ValueError(f"{field}[{i}] must be an array of two strings")
        a, b = pair
        for part in (a, b):
            if part not in vocab:
                raise ValueError(f"{field}[{i}] uses {preview(part)}, which is not in the vocabulary")
        if a + b not in vocab:
            raise ValueError(f"{field}[{i}] makes {preview(a + b)}, which is not in the vocabulary")
        if (a, b) in seen:
            raise ValueError(f"{field}[{i}] repeats an earlier merge")
        seen.add((a, b))
    return merges


def _checked_bpe_doc(data: Any, max_vocab: int) -> dict[str, Any]:
    """Check an untrusted HF tokenizer JSON string; return the canonical document to build.

    Only the vocabulary and merges come from ``data``; every other field must equal what
    :meth:`BPETokenizer.train` writes (or be absent where that is the HF default) and is
    then taken from the constants above.
    """
    if not isinstance(data, str):
        raise ValueError(f"BPE tokenizer data must be a JSON string, not {json_type(data)}")
    if len(data) > MAX_BPE_JSON_CHARS:
        raise ValueError(f"BPE tokenizer data is {len(data):,} characters; the limit is {MAX_BPE_JSON_CHARS:,}")
    try:
        doc = json.loads(data, object_pairs_hook=unique_keys("BPE tokenizer JSON"))
    except RecursionError:
        raise ValueError("BPE tokenizer data is nested too deeply") from None
    except ValueError as exc:
        if "duplicate key" in str(exc):
            raise
        raise ValueError("BPE tokenizer data is not valid JSON") from None
    check_keys(doc, "BPE tokenizer data", set(_BPE_TOP_FIXED) - _BPE_TOP_OPTIONAL | {"model"}, _BPE_TOP_OPTIONAL)
    for key, expected in _BPE_TOP_FIXED.items():
        if key in doc and key != "pre_tokenizer":
            check_same(doc[key], expected, f"BPE tokenizer {key}")
    pre_tokenizer = _checked_bpe_pre_tokenizer(doc["pre_tokenizer"])
    model = doc["model"]
    check_keys(model, "BPE tokenizer model", {"type", "unk_token", "vocab", "merges"}, _BPE_MODEL_OPTIONAL)
    for key, expected in _BPE_MODEL_FIXED.items():
        if key in model:
            check_same(model[key], expected, f"BPE tokenizer model.{key}")
    vocab = _checked_bpe_vocab(model["vocab"], max_vocab)
    merges = _checked_bpe_merges(model["merges"], vocab)
    return {**_BPE_TOP_FIXED, "pre_tokenizer": pre_tokenizer,
            "model": {**_BPE_MODEL_FIXED, "vocab": vocab, "merges": merges}}


def _checked_bpe_pre_tokenizer(value: Any) -> dict[str, Any]:
    """Exactly one of :data:`_BPE_PRE_TOKENIZERS`; returns that constant, not ``value``."""
    field = "BPE tokenizer pre_tokenizer"
    try:
        check_same(value, _BPE_PRE_TOKENIZER, field)
    except ValueError as exc:
        for older in _BPE_PRE_TOKENIZERS[1:]:
            try:
                check_same(value, older, field)
            except ValueError:
                continue
            return older
        raise exc  # names the field that differs from what train writes now
    return _BPE_PRE_TOKENIZER
