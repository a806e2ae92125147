"""Tokenizers for Decoder Lab: character, word and (character-level) BPE.

All three share the :class:`Tokenizer` interface. Unknown input never raises:
it maps to ``<unk>``, which every vocabulary contains, and is reported in
:attr:`Encoded.unknown`. Tokenizers serialise to plain JSON dicts, which
checkpoints carry in their metadata; since those may come from uploaded files,
:func:`tokenizer_from_dict` validates everything and only ever raises ``ValueError``.

A stored tokenizer is as untrusted as stored weights. :func:`tokenizer_from_dict`
therefore accepts only the structures this module itself writes: an allow-list
of keys and values at every level (for BPE the exact HF model options,
pre-tokenizer and special token that :meth:`BPETokenizer.train` produces, or the one
unbounded pre-tokenizer it produced before; no
normalizer, decoder, post-processor, padding or truncation), with bounds on the
vocabulary size, the bytes per token and the number of merges. Everything is
checked on plain JSON values before any HF object is built, because the HF
library happily runs what it is given (a padding of millions of tokens, a
normalizer that multiplies text, a backtracking regex).

Design decisions:

* ``decode`` turns the unknown id into the literal text ``"<unk>"``.
* Words: newlines are ordinary whitespace (no implicit ``<EOS>``); write
  ``<EOS>`` literally in the text to get that token.
* BPE is character-level (not byte-level): characters never seen in training
  become ``<unk>`` and are reported, exactly like the other two tokenizers.
"""

from __future__ import annotations

import json
import re
import heapq
import itertools
import unicodedata
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, Iterable, Iterator

from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models as hf_models
from tokenizers import pre_tokenizers as hf_pre
from tokenizers import trainers as hf_trainers

__all__ = [
    "UNK",
    "EOS",
    "MAX_VOCAB",
    "MAX_LOADED_VOCAB",
    "MAX_TOKEN_BYTES",
    "TOKENIZER_KINDS",
    "BPE_TRAIN_SAMPLE_CHARS",
    "Encoded",
    "Tokenizer",
    "CharTokenizer",
    "WordTokenizer",
    "BPETokenizer",
    "count_word_tokens",
    "display_piece",
    "normalise",
    "split_words",
    "tokenizer_from_dict",
]

UNK = "<unk>"
EOS = "<EOS>"
MAX_VOCAB = 50_000  # any tokenizer built in memory (training on a person's text included)
# Largest vocabulary a stored (untrusted) tokenizer may have. This is the one home of the
# number: the checkpoint loader's Limits.max_vocab defaults to it.
MAX_LOADED_VOCAB = 4096
# Every token of every kind decodes to at most this many bytes of UTF-8. It bounds what the
# model can emit: with the lab's 256 new tokens per Generate the worst case is
# 256 × (64 + 1 joining space) = 16,640 bytes (about 16 KiB) of text, not megabytes.
MAX_TOKEN_BYTES = 64
# BPE training counts token length in characters; a character is at most 4 bytes of UTF-8,
# so this many characters always stays within MAX_TOKEN_BYTES.
_BPE_TRAIN_MAX_CHARS = MAX_TOKEN_BYTES // 4
# Bound on the HF JSON string checked before it is parsed: MAX_LOADED_VOCAB vocabulary
# entries and as many merges, each at most 64 bytes escaped 6 characters per byte, fit
# in about 3.3 million characters.
MAX_BPE_JSON_CHARS = 4_000_000
TOKENIZER_KINDS = ("char", "word", "bpe")

# Punctuation that word decoding glues to the preceding word.
_ATTACHED_PUNCT = frozenset(".,;:!?")
# <EOS> (any case), runs of letters/digits/apostrophes, or any other single
# non-space character (punctuation, symbols, underscore).
_WORD_RE = re.compile(r"<eos>|(?:[^\W_]|')+|\S", re.IGNORECASE)
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

_DISPLAY = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"}


def display_piece(text: str) -> str:
    """Visible form of a token string (whitespace/control chars made printable)."""
    out = []
    for ch in text:
        if ch in _DISPLAY:
            out.append(_DISPLAY[ch])
        elif unicodedata.category(ch)[0] in ("C", "Z"):
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def split_words(text: str) -> list[str]:
    """Lowercase ``text`` and split it into word-level tokens."""
    low = text.lower()
    words = _WORD_RE.findall(low)
    if "<eos>" not in low:
        return words
    return [EOS if tok == "<eos>" else tok for tok in words]


def count_word_tokens(text: str, enough: int) -> tuple[int, int]:
    """``(tokens, usable)``: word tokens of ``text`` and how many of them can be in a vocabulary.

    A usable token is ``<EOS>`` or a word of at most ``MAX_TOKEN_BYTES`` bytes (longer ones
    always encode as ``<unk>``). Counting stops once ``enough`` usable tokens are seen, so a
    check of a long text costs little more than finding its first few words.
    """
    tokens = usable = 0
    for m in _WORD_RE.finditer(text.lower()):
        tokens += 1
        w = m.group()
        if w == "<eos>" or _storable(w):
            usable += 1
            if usable >= enough:
                break
    return tokens, usable


def _join_words(words: Iterable[str]) -> str:
    out: list[str] = []
    for w in words:
        if out and w in _ATTACHED_PUNCT:
            out[-1] += w
        else:
            out.append(w)
    return " ".join(out)


def normalise(text: str) -> str:
    """Canonical form of ``text`` as seen by :class:`WordTokenizer`.

    Lowercases, splits into word tokens and rejoins them with single spaces,
    gluing ``.,;:!?`` to the previous word. ``WordTokenizer.decode(encode(t))``
    equals ``normalise(t)`` whenever every word of ``t`` is in the vocabulary.
    """
    return _join_words(split_words(text))


@dataclass(frozen=True)
class Encoded:
    """Result of :meth:`Tokenizer.encode_verbose`."""

    ids: list[int]
    pieces: list[str]  # display string per token
    unknown: list[str]  # out-of-vocabulary input, first-seen order, no repeats


def _dedup(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


class Tokenizer(ABC):
    """Common interface of all tokenizers."""

    kind: ClassVar[str]

    def __init__(self, vocab: list[str]) -> None:
        if len(vocab) > MAX_VOCAB:
            raise ValueError(f"vocabulary has {len(vocab)} entries; the limit is {MAX_VOCAB}")
        index: dict[str, int] = {}
        for i, piece in enumerate(vocab):
            _check_piece(piece, f"vocabulary entry {i}")
            if piece in index:
                raise ValueError(f"duplicate vocabulary entry {_show(piece)}")
            index[piece] = i
        if UNK not in index:
            raise ValueError(f"vocabulary must contain {UNK!r}")
        self._itos: list[str] = list(vocab)
        self._stoi: dict[str, int] = index

    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    @property
    def unk_id(self) -> int:
        return self._stoi[UNK]

    @property
    def eos_id(self) -> int | None:
        return self._stoi.get(EOS)

    @property
    def vocab(self) -> list[str]:
        """Raw token strings, indexed by id."""
        return list(self._itos)

    def encode(self, text: str) -> list[int]:
        return self.encode_verbose(text).ids

    def encode_chunks(self, text: str, chunk_chars: int = 100_000) -> Iterator[list[int]]:
        """``encode(text)`` in consecutive parts, each from about ``chunk_chars`` characters.

        The parts joined are exactly ``encode(text)``; a caller can stop between them. Char
        and word encoding of the largest allowed text takes well under a second, so they
        yield one part; BPE cuts the text where its pre-tokenizer splits it anyway.
        """
        yield self.encode(text)

    @abstractmethod
    def encode_verbose(self, text: str) -> Encoded: ...

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str: ...

    def _check_id(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, int):
            try:
                i = int(i)  # accept numpy / torch integer scalars
            except (TypeError, ValueError):
                raise ValueError(f"token id must be an integer, not {_json_type(i)}") from None
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"token id {i} is out of range for a vocabulary of size {self.vocab_size}")
        return i

    def _raw(self, ids: Iterable[int]) -> list[str]:
        return [self._itos[self._check_id(i)] for i in ids]

    def piece(self, token_id: int) -> str:
        """Display string of a single token id."""
        return display_piece(self._itos[self._check_id(token_id)])

    @abstractmethod
    def to_dict(self) -> dict[str, Any]: ...

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((self.kind, tuple(self._itos)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class CharTokenizer(Tokenizer):
    """One token per character; id 0 is ``<unk>``.

    The vocabulary may also hold ``<EOS>`` as one token (the sort and copy tasks end every
    example with it); then the literal text ``<EOS>`` encodes to that token and it decodes
    back to ``<EOS>``. :meth:`train` never adds it, so a tokenizer trained on text is purely
    one token per character.
    """

    kind = "char"

    def __init__(self, chars: list[str]) -> None:
        for c in chars:
            if not isinstance(c, str) or (len(c) != 1 and c != EOS):
                raise ValueError(f"character vocabulary entries must be single characters, got {_show(c)}")
        super().__init__([UNK, *chars])

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        # A lone surrogate (possible in text that arrived as JSON) could not be stored; it
        # stays out of the vocabulary and encodes as <unk>.
        return cls(sorted(c for c in set(text) if _storable(c)))

    def _units(self, text: str) -> list[str]:
        """``text`` cut into what becomes one token each: characters, and ``<EOS>`` when known."""
        if EOS not in self._stoi or EOS not in text:
            return list(text)
        units: list[str] = []
        for i, part in enumerate(text.split(EOS)):
            if i:
                units.append(EOS)
            units.extend(part)
        return units

    def encode(self, text: str) -> list[int]:
        get, unk = self._stoi.get, self.unk_id
        return [get(c, unk) for c in self._units(text)]

    def encode_verbose(self, text: str) -> Encoded:
        units = self._units(text)
        get, unk = self._stoi.get, self.unk_id
        ids = [get(c, unk) for c in units]
        return Encoded(
            ids=ids,
            pieces=[display_piece(self._itos[i]) for i in ids],
            unknown=_dedup(c for c, i in zip(units, ids) if i == unk),
        )

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self._raw(ids))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "chars": self._itos[1:]}


class WordTokenizer(Tokenizer):
    """Lowercased words and single punctuation marks (see :func:`split_words`).

    The vocabulary keeps the given order; ``<EOS>`` and then ``<unk>`` are
    appended when absent.
    """

    kind = "word"

    def __init__(self, words: list[str]) -> None:
        vocab = list(words)
        for w in vocab:
            if w in (EOS, UNK):
                continue
            _check_piece(w, "word vocabulary entry")  # bounds the regex below to a short string
            if split_words(w) != [w]:
                raise ValueError(f"{_show(w)} is not a single lowercase word or punctuation token")
        for special in (EOS, UNK):
            if special not in vocab:
                vocab.append(special)
        super().__init__(vocab)

    @classmethod
    def train(cls, text: str, min_count: int = 1, max_vocab: int | None = None) -> WordTokenizer:
        """Vocabulary of the most frequent words (ties alphabetical).

        ``max_vocab`` bounds the total size including ``<EOS>`` and ``<unk>``. Words longer
        than ``MAX_TOKEN_BYTES`` bytes (or holding a lone surrogate) stay out of the vocabulary,
        so the tokenizer can always be stored and loaded again; they encode as ``<unk>``.
        """
        if min_count < 1:
            raise ValueError("min_count must be at least 1")
        if max_vocab is not None and max_vocab < 2:
            raise ValueError("max_vocab must be at least 2 (room for <EOS> and <unk>)")
        counts = Counter(split_words(text))
        kept = {w: n for w, n in counts.items() if n >= min_count and w != EOS and _storable(w)}
        limit = min(MAX_VOCAB, max_vocab if max_vocab is not None else MAX_VOCAB) - 2
        # the `limit` first of the ranking, as sorted(...)[:limit] gives them but without sorting them all
        return cls(heapq.nsmallest(limit, kept, key=lambda w: (-kept[w], w)))

    def encode_verbose(self, text: str) -> Encoded:
        words = split_words(text)
        get, unk = self._stoi.get, self.unk_id
        ids = [get(w, unk) for w in words]
        return Encoded(
            ids=ids,
            pieces=[self._itos[i] for i in ids],
            unknown=_dedup(w for w, i in zip(words, ids) if i == unk),
        )

    def decode(self, ids: Iterable[int]) -> str:
        return _join_words(self._raw(ids))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "words": list(self._itos)}


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
            raise ValueError(f"vocab_size must be an integer from 2 to {MAX_VOCAB}, got {_show(vocab_size)}")
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
        return Encoded(ids=ids, pieces=[display_piece(self._itos[i]) for i in ids], unknown=_dedup(unknown))

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
# tests/test_tokenizers.py holds the chunked encoding to the whole one on adversarial text.

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


# ---------------------------------------------------------------- untrusted data
#
# Everything below runs on plain JSON values (dict, list, str, int, ...) and refuses what
# the project never writes. Messages name the field and never echo more than a short
# preview of a value: a hostile value can be megabytes long.


def _json_type(x: Any) -> str:
    """JSON name of a value's type, for messages (never a Python type repr)."""
    if x is None:
        return "null"
    if isinstance(x, bool):  # before int: bool is an int subclass
        return "a boolean"
    if isinstance(x, int):
        return "a number"
    if isinstance(x, float):
        return "a decimal number"
    if isinstance(x, str):
        return "a string"
    if isinstance(x, list):
        return "an array"
    if isinstance(x, dict):
        return "an object"
    return "an unsupported value"


def _show(x: Any, limit: int = 24) -> str:
    """Short preview of a value for a message."""
    if isinstance(x, str):
        return repr(x) if len(x) <= limit else repr(x[:limit]) + "…"
    if x is None or (isinstance(x, (bool, int)) and abs(x) < 10**limit):
        return json.dumps(x)
    return _json_type(x)


def _utf8_len(s: str) -> int:
    # surrogatepass: in-memory text never fails here; untrusted text is checked by _check_piece
    return len(s.encode("utf-8", "surrogatepass"))


def _storable(piece: str) -> bool:
    """Whether a trained token passes :func:`_check_piece` (training leaves others out)."""
    return _utf8_len(piece) <= MAX_TOKEN_BYTES and not any("\ud800" <= c <= "\udfff" for c in piece)


def _check_piece(piece: Any, field: str) -> str:
    """A token string: non-empty, valid Unicode, at most MAX_TOKEN_BYTES bytes of UTF-8."""
    if not isinstance(piece, str):
        raise ValueError(f"{field} must be a string, not {_json_type(piece)}")
    if not piece:
        raise ValueError(f"{field} is an empty string")
    # Length in characters first: a longer string is over the byte limit anyway, and a
    # 900 KB token should not be encoded just to learn that.
    if len(piece) > MAX_TOKEN_BYTES or _utf8_len(piece) > MAX_TOKEN_BYTES:
        raise ValueError(f"{field} is longer than {MAX_TOKEN_BYTES} bytes ({_show(piece)})")
    if any("\ud800" <= c <= "\udfff" for c in piece):
        raise ValueError(f"{field} is not valid Unicode text (a lone surrogate)")
    return piece


def _check_keys(d: Any, field: str, required: set[str], optional: frozenset[str] = frozenset()) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"{field} must be an object, not {_json_type(d)}")
    for key in d:
        if key not in required and key not in optional:
            raise ValueError(f"{field} has an unknown key {_show(key)}")
    for key in sorted(required):
        if key not in d:
            raise ValueError(f"{field} is missing the {key!r} key")


def _same(value: Any, expected: Any, field: str) -> None:
    """Require ``value`` to equal ``expected`` exactly, types included (so false ≠ 0)."""
    if isinstance(expected, dict):
        _check_keys(value, field, set(expected))
        for key, sub in expected.items():
            _same(value[key], sub, f"{field}.{key}")
    elif isinstance(expected, list):
        if not isinstance(value, list) or len(value) != len(expected):
            raise ValueError(f"{field} must be {json.dumps(expected)}")
        for i, (v, e) in enumerate(zip(value, expected)):
            _same(v, e, f"{field}[{i}]")
    elif type(value) is not type(expected) or value != expected:
        raise ValueError(f"{field} must be {json.dumps(expected)}")


def _checked_list(d: dict[str, Any], key: str, max_len: int) -> list[Any]:
    items = d[key]
    if not isinstance(items, list):
        raise ValueError(f"tokenizer {key!r} must be an array, not {_json_type(items)}")
    if len(items) > max_len:
        raise ValueError(f"tokenizer {key!r} has {len(items):,} entries; the limit is {max_len:,}")
    return items


def _checked_char(d: dict[str, Any], max_vocab: int) -> CharTokenizer:
    _check_keys(d, "char tokenizer data", {"kind", "chars"})
    chars = _checked_list(d, "chars", max_vocab - 1)  # <unk> takes id 0
    seen: set[str] = set()
    for i, c in enumerate(chars):
        _check_piece(c, f"tokenizer 'chars'[{i}]")
        if len(c) != 1 and c != EOS:
            raise ValueError(f"tokenizer 'chars'[{i}] must be a single character or {EOS!r}, got {_show(c)}")
        if c in seen:
            raise ValueError(f"tokenizer 'chars' contains duplicate entry {_show(c)}")
        seen.add(c)
    return CharTokenizer(chars)


def _checked_word(d: dict[str, Any], max_vocab: int) -> WordTokenizer:
    _check_keys(d, "word tokenizer data", {"kind", "words"})
    words = _checked_list(d, "words", max_vocab)
    seen: set[str] = set()
    for i, w in enumerate(words):
        _check_piece(w, f"tokenizer 'words'[{i}]")
        if w not in (EOS, UNK) and split_words(w) != [w]:
            raise ValueError(f"tokenizer 'words'[{i}] ({_show(w)}) is not a single lowercase word or punctuation token")
        if w in seen:
            raise ValueError(f"tokenizer 'words' contains duplicate entry {_show(w)}")
        seen.add(w)
    for special in (EOS, UNK):  # to_dict always writes both
        if special not in seen:
            raise ValueError(f"tokenizer 'words' must contain {special!r}")
    return WordTokenizer(words)


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


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads would silently keep the last of two equal keys; the HF parser might not.
    # Refusing them makes what is checked here the only reading of the data.
    d: dict[str, Any] = {}
    for key, value in pairs:
        if key in d:
            raise ValueError(f"BPE tokenizer JSON has a duplicate key {_show(key)}")
        d[key] = value
    return d


def _checked_bpe_vocab(vocab: Any, max_vocab: int) -> dict[str, int]:
    field = "BPE tokenizer model.vocab"
    if not isinstance(vocab, dict):
        raise ValueError(f"{field} must be an object, not {_json_type(vocab)}")
    n = len(vocab)
    if not 1 <= n <= max_vocab:
        raise ValueError(f"{field} has {n:,} entries; it must have 1 to {max_vocab:,}")
    ids: set[int] = set()
    for piece, i in vocab.items():
        _check_piece(piece, f"{field} entry {_show(piece)}")
        if isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"{field} id of {_show(piece)} must be an integer, not {_json_type(i)}")
        if not 0 <= i < n:
            raise ValueError(f"{field} id of {_show(piece)} is {_show(i)}; ids must run from 0 to {n - 1}")
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
        raise ValueError(f"{field} must be an array, not {_json_type(merges)}")
    if len(merges) > len(vocab):  # each merge adds one token, so a real one has fewer
        raise ValueError(f"{field} has {len(merges):,} entries; the limit is the vocabulary size {len(vocab):,}")
    seen: set[tuple[str, str]] = set()
    for i, pair in enumerate(merges):
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(p, str) for p in pair):
            raise ValueError(f"{field}[{i}] must be an array of two strings")
        a, b = pair
        for part in (a, b):
            if part not in vocab:
                raise ValueError(f"{field}[{i}] uses {_show(part)}, which is not in the vocabulary")
        if a + b not in vocab:
            raise ValueError(f"{field}[{i}] makes {_show(a + b)}, which is not in the vocabulary")
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
        raise ValueError(f"BPE tokenizer data must be a JSON string, not {_json_type(data)}")
    if len(data) > MAX_BPE_JSON_CHARS:
        raise ValueError(f"BPE tokenizer data is {len(data):,} characters; the limit is {MAX_BPE_JSON_CHARS:,}")
    try:
        doc = json.loads(data, object_pairs_hook=_no_duplicate_keys)
    except RecursionError:
        raise ValueError("BPE tokenizer data is nested too deeply") from None
    except ValueError as exc:
        if "duplicate key" in str(exc):
            raise
        raise ValueError("BPE tokenizer data is not valid JSON") from None
    _check_keys(doc, "BPE tokenizer data", set(_BPE_TOP_FIXED) - _BPE_TOP_OPTIONAL | {"model"}, _BPE_TOP_OPTIONAL)
    for key, expected in _BPE_TOP_FIXED.items():
        if key in doc and key != "pre_tokenizer":
            _same(doc[key], expected, f"BPE tokenizer {key}")
    pre_tokenizer = _checked_bpe_pre_tokenizer(doc["pre_tokenizer"])
    model = doc["model"]
    _check_keys(model, "BPE tokenizer model", {"type", "unk_token", "vocab", "merges"}, _BPE_MODEL_OPTIONAL)
    for key, expected in _BPE_MODEL_FIXED.items():
        if key in model:
            _same(model[key], expected, f"BPE tokenizer model.{key}")
    vocab = _checked_bpe_vocab(model["vocab"], max_vocab)
    merges = _checked_bpe_merges(model["merges"], vocab)
    return {**_BPE_TOP_FIXED, "pre_tokenizer": pre_tokenizer,
            "model": {**_BPE_MODEL_FIXED, "vocab": vocab, "merges": merges}}


def _checked_bpe_pre_tokenizer(value: Any) -> dict[str, Any]:
    """Exactly one of :data:`_BPE_PRE_TOKENIZERS`; returns that constant, not ``value``."""
    field = "BPE tokenizer pre_tokenizer"
    try:
        _same(value, _BPE_PRE_TOKENIZER, field)
    except ValueError as exc:
        for older in _BPE_PRE_TOKENIZERS[1:]:
            try:
                _same(value, older, field)
            except ValueError:
                continue
            return older
        raise exc  # names the field that differs from what train writes now
    return _BPE_PRE_TOKENIZER


def tokenizer_from_dict(d: Any, max_vocab: int = MAX_LOADED_VOCAB) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`Tokenizer.to_dict` output.

    Treats ``d`` as untrusted: only what ``to_dict`` writes is accepted, with at most
    ``max_vocab`` tokens of at most ``MAX_TOKEN_BYTES`` bytes each; any problem raises
    ``ValueError`` before a tokenizer is built.
    """
    if isinstance(max_vocab, bool) or not isinstance(max_vocab, int) or not 2 <= max_vocab <= MAX_VOCAB:
        raise ValueError(f"max_vocab must be an integer from 2 to {MAX_VOCAB}")
    if not isinstance(d, dict):
        raise ValueError(f"tokenizer data must be a JSON object, not {_json_type(d)}")
    kind = d.get("kind")
    if not isinstance(kind, str) or kind not in TOKENIZER_KINDS:
        raise ValueError(f"unknown tokenizer kind {_show(kind)}; expected one of {', '.join(TOKENIZER_KINDS)}")
    try:
        if kind == "char":
            return _checked_char(d, max_vocab)
        if kind == "word":
            return _checked_word(d, max_vocab)
        _check_keys(d, "bpe tokenizer data", {"kind", "tokenizer"})
        return BPETokenizer.from_json(d["tokenizer"], max_vocab)
    except ValueError:
        raise
    except Exception:  # defensive: untrusted data must only yield ValueError
        raise ValueError(f"invalid {kind} tokenizer data") from None
