"""Tokenizers for Decoder Lab: character, word and (character-level) BPE.

All three share the :class:`Tokenizer` interface. Unknown input never raises:
it maps to ``<unk>``, which every vocabulary contains, and is reported in
:attr:`Encoded.unknown`. Tokenizers serialise to plain JSON dicts, which
checkpoints carry in their metadata; since those may come from uploaded files,
:func:`tokenizer_from_dict` validates everything and only ever raises ``ValueError``.

Design decisions:

* ``decode`` turns the unknown id into the literal text ``"<unk>"``.
* Words: newlines are ordinary whitespace (no implicit ``<EOS>``); write
  ``<EOS>`` literally in the text to get that token.
* BPE is character-level (not byte-level): characters never seen in training
  become ``<unk>`` and are reported, exactly like the other two tokenizers.
"""

from __future__ import annotations

import re
import unicodedata
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable

from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models as hf_models
from tokenizers import pre_tokenizers as hf_pre
from tokenizers import trainers as hf_trainers

__all__ = [
    "UNK",
    "EOS",
    "MAX_VOCAB",
    "TOKENIZER_KINDS",
    "Encoded",
    "Tokenizer",
    "CharTokenizer",
    "WordTokenizer",
    "BPETokenizer",
    "display_piece",
    "normalise",
    "split_words",
    "tokenizer_from_dict",
]

UNK = "<unk>"
EOS = "<EOS>"
MAX_VOCAB = 50_000
MAX_BPE_JSON_CHARS = 20_000_000  # bound on the HF JSON string of an untrusted BPE tokenizer
TOKENIZER_KINDS = ("char", "word", "bpe")

# Punctuation that word decoding glues to the preceding word.
_ATTACHED_PUNCT = frozenset(".,;:!?")
# <EOS> (any case), runs of letters/digits/apostrophes, or any other single
# non-space character (punctuation, symbols, underscore).
_WORD_RE = re.compile(r"<eos>|(?:[^\W_]|')+|\S", re.IGNORECASE)
# GPT-2-like split with a leading space kept on words, but over characters.
_BPE_SPLIT = r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

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
    return [EOS if tok == "<eos>" else tok for tok in _WORD_RE.findall(text.lower())]


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
            if not isinstance(piece, str) or not piece:
                raise ValueError(f"vocabulary entry {i} must be a non-empty string, got {piece!r}")
            if piece in index:
                raise ValueError(f"duplicate vocabulary entry {piece!r}")
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

    @abstractmethod
    def encode_verbose(self, text: str) -> Encoded: ...

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str: ...

    def _check_id(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, int):
            try:
                i = int(i)  # accept numpy / torch integer scalars
            except (TypeError, ValueError):
                raise ValueError(f"token id must be an integer, got {i!r}") from None
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
    """One token per character; id 0 is ``<unk>``."""

    kind = "char"

    def __init__(self, chars: list[str]) -> None:
        for c in chars:
            if not isinstance(c, str) or len(c) != 1:
                raise ValueError(f"character vocabulary entries must be single characters, got {c!r}")
        super().__init__([UNK, *chars])

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        get, unk = self._stoi.get, self.unk_id
        return [get(c, unk) for c in text]

    def encode_verbose(self, text: str) -> Encoded:
        ids = self.encode(text)
        unk = self.unk_id
        return Encoded(
            ids=ids,
            pieces=[display_piece(self._itos[i]) for i in ids],
            unknown=_dedup(c for c, i in zip(text, ids) if i == unk),
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
            if not isinstance(w, str) or split_words(w) != [w]:
                raise ValueError(f"{w!r} is not a single lowercase word or punctuation token")
        for special in (EOS, UNK):
            if special not in vocab:
                vocab.append(special)
        super().__init__(vocab)

    @classmethod
    def train(cls, text: str, min_count: int = 1, max_vocab: int | None = None) -> WordTokenizer:
        """Vocabulary of the most frequent words (ties alphabetical).

        ``max_vocab`` bounds the total size including ``<EOS>`` and ``<unk>``.
        """
        if min_count < 1:
            raise ValueError("min_count must be at least 1")
        if max_vocab is not None and max_vocab < 2:
            raise ValueError("max_vocab must be at least 2 (room for <EOS> and <unk>)")
        counts = Counter(w for w in split_words(text) if w != EOS)
        ranked = sorted((w for w, n in counts.items() if n >= min_count), key=lambda w: (-counts[w], w))
        limit = min(MAX_VOCAB, max_vocab if max_vocab is not None else MAX_VOCAB) - 2
        return cls(ranked[:limit])

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

    @classmethod
    def train(cls, text: str, vocab_size: int = 256) -> BPETokenizer:
        if not 2 <= vocab_size <= MAX_VOCAB:
            raise ValueError(f"vocab_size must be between 2 and {MAX_VOCAB}, got {vocab_size}")
        hf = HFTokenizer(hf_models.BPE(unk_token=UNK))
        hf.pre_tokenizer = hf_pre.Split(Regex(_BPE_SPLIT), behavior="isolated")
        trainer = hf_trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[UNK], show_progress=False)
        hf.train_from_iterator([text], trainer=trainer)
        return cls(hf)

    @classmethod
    def from_json(cls, data: str) -> BPETokenizer:
        """Rebuild from an HF tokenizer JSON string (untrusted input)."""
        if not isinstance(data, str):
            raise ValueError("BPE tokenizer data must be a JSON string")
        try:
            hf = HFTokenizer.from_str(data)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # Rust panics surface as BaseException subclasses
            raise ValueError(f"invalid BPE tokenizer data: {exc}") from None
        if not isinstance(hf.model, hf_models.BPE):
            raise ValueError("BPE tokenizer data does not describe a BPE model")
        if hf.model.unk_token != UNK:
            raise ValueError(f"BPE model must use {UNK!r} as its unknown token")
        return cls(hf)

    def encode_verbose(self, text: str) -> Encoded:
        enc = self._hf.encode(text, add_special_tokens=False)
        unk = self.unk_id
        return Encoded(
            ids=list(enc.ids),
            pieces=[display_piece(self._itos[i]) for i in enc.ids],
            unknown=_dedup(text[a:b] for i, (a, b) in zip(enc.ids, enc.offsets) if i == unk),
        )

    def encode(self, text: str) -> list[int]:
        return list(self._hf.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self._raw(ids))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "tokenizer": self._hf.to_str()}


def _string_list(d: dict[str, Any], key: str) -> list[str]:
    if key not in d:
        raise ValueError(f"tokenizer data is missing the {key!r} key")
    items = d[key]
    if not isinstance(items, list):
        raise ValueError(f"tokenizer {key!r} must be a list, got {type(items).__name__}")
    if len(items) > MAX_VOCAB:
        raise ValueError(f"tokenizer {key!r} has {len(items)} entries; the limit is {MAX_VOCAB}")
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"tokenizer {key!r} entries must be strings, got {type(item).__name__}")
    if len(set(items)) != len(items):
        dup = next(s for s, n in Counter(items).items() if n > 1)
        raise ValueError(f"tokenizer {key!r} contains duplicate entry {dup!r}")
    return items


def tokenizer_from_dict(d: Any) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`Tokenizer.to_dict` output.

    Treats ``d`` as untrusted; any problem raises ``ValueError``.
    """
    if not isinstance(d, dict):
        raise ValueError(f"tokenizer data must be a JSON object, got {type(d).__name__}")
    kind = d.get("kind")
    if not isinstance(kind, str) or kind not in TOKENIZER_KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {', '.join(TOKENIZER_KINDS)}")
    try:
        if kind == "char":
            return CharTokenizer(_string_list(d, "chars"))
        if kind == "word":
            return WordTokenizer(_string_list(d, "words"))
        if "tokenizer" not in d:
            raise ValueError("tokenizer data is missing the 'tokenizer' key")
        if isinstance(d["tokenizer"], str) and len(d["tokenizer"]) > MAX_BPE_JSON_CHARS:
            raise ValueError("BPE tokenizer data is too large")
        return BPETokenizer.from_json(d["tokenizer"])
    except ValueError:
        raise
    except Exception as exc:  # defensive: untrusted data must only yield ValueError
        raise ValueError(f"invalid {kind} tokenizer data: {exc}") from None

