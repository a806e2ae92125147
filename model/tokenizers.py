"""Tokenizers for Decoder Lab: character, word and (character-level) BPE, and reading any of them back
(and a converted pretrained model's tokenizer.json, kind "hf": model/hf_tokenizer.py).

This module holds the character and word tokenizers and `tokenizer_from_dict`; the interface, limits
and value checks they share are in model/tokenizer_core.py, BPE in model/bpe.py. Every public name of
the three is importable from here (`from model.tokenizers import BPETokenizer, EOS`), the one path
callers use.

All three share the :class:`Tokenizer` interface. Unknown input never raises:
it maps to ``<unk>``, which every vocabulary contains, and is reported in
:attr:`Encoded.unknown`. Tokenizers serialise to plain JSON dicts, which
checkpoints carry in their metadata; since those may come from uploaded files,
:func:`tokenizer_from_dict` validates everything and only ever raises ``ValueError``.

A stored tokenizer is as untrusted as stored weights. :func:`tokenizer_from_dict`
therefore accepts only the structures these modules write: an allow-list
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

import heapq
import re
from collections import Counter
from typing import Any, Iterable

from .bpe import BPE_TRAIN_SAMPLE_CHARS, MAX_BPE_JSON_CHARS, BPETokenizer
from .hf_tokenizer import HFFileTokenizer
from .tokenizer_core import (
    EOS, MAX_LOADED_VOCAB, MAX_PRETRAINED_VOCAB, MAX_TOKEN_BYTES, MAX_VOCAB, STORED_TOKENIZER_KINDS, TOKENIZER_KINDS,
    UNK, Encoded, Tokenizer, check_keys, check_piece, checked_list, dedup, display_piece, json_type, preview, storable,
)

__all__ = [
    "UNK",
    "EOS",
    "MAX_VOCAB",
    "MAX_LOADED_VOCAB",
    "MAX_TOKEN_BYTES",
    "MAX_BPE_JSON_CHARS",
    "TOKENIZER_KINDS",
    "STORED_TOKENIZER_KINDS",
    "MAX_PRETRAINED_VOCAB",
    "BPE_TRAIN_SAMPLE_CHARS",
    "Encoded",
    "Tokenizer",
    "CharTokenizer",
    "WordTokenizer",
    "BPETokenizer",
    "HFFileTokenizer",
    "count_word_tokens",
    "display_piece",
    "normalise",
    "split_words",
    "tokenizer_from_dict",
]

# Punctuation that word decoding glues to the preceding word.
_ATTACHED_PUNCT = frozenset(".,;:!?")
# <EOS> (any case), runs of letters/digits/apostrophes, or any other single
# non-space character (punctuation, symbols, underscore).
_WORD_RE = re.compile(r"<eos>|(?:[^\W_]|')+|\S", re.IGNORECASE)


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
        if w == "<eos>" or storable(w):
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
                raise ValueError(f"character vocabulary entries must be single characters, got {preview(c)}")
        super().__init__([UNK, *chars])

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        # A lone surrogate (possible in text that arrived as JSON) could not be stored; it
        # stays out of the vocabulary and encodes as <unk>.
        return cls(sorted(c for c in set(text) if storable(c)))

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
            unknown=dedup(c for c, i in zip(units, ids) if i == unk),
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
            check_piece(w, "word vocabulary entry")  # bounds the regex below to a short string
            if split_words(w) != [w]:
                raise ValueError(f"{preview(w)} is not a single lowercase word or punctuation token")
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
        kept = {w: n for w, n in counts.items() if n >= min_count and w != EOS and storable(w)}
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
            unknown=dedup(w for w, i in zip(words, ids) if i == unk),
        )

    def decode(self, ids: Iterable[int]) -> str:
        return _join_words(self._raw(ids))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "words": list(self._itos)}


def _checked_char(d: dict[str, Any], max_vocab: int) -> CharTokenizer:
    check_keys(d, "char tokenizer data", {"kind", "chars"})
    chars = checked_list(d, "chars", max_vocab - 1)  # <unk> takes id 0
    seen: set[str] = set()
    for i, c in enumerate(chars):
        check_piece(c, f"tokenizer 'chars'[{i}]")
        if len(c) != 1 and c != EOS:
            raise ValueError(f"tokenizer 'chars'[{i}] must be a single character or {EOS!r}, got {preview(c)}")
        if c in seen:
            raise ValueError(f"tokenizer 'chars' contains duplicate entry {preview(c)}")
        seen.add(c)
    return CharTokenizer(chars)


def _checked_word(d: dict[str, Any], max_vocab: int) -> WordTokenizer:
    check_keys(d, "word tokenizer data", {"kind", "words"})
    words = checked_list(d, "words", max_vocab)
    seen: set[str] = set()
    for i, w in enumerate(words):
        check_piece(w, f"tokenizer 'words'[{i}]")
        if w not in (EOS, UNK) and split_words(w) != [w]:
            raise ValueError(f"tokenizer 'words'[{i}] ({preview(w)}) is not a single lowercase word or punctuation token")
        if w in seen:
            raise ValueError(f"tokenizer 'words' contains duplicate entry {preview(w)}")
        seen.add(w)
    for special in (EOS, UNK):  # to_dict always writes both
        if special not in seen:
            raise ValueError(f"tokenizer 'words' must contain {special!r}")
    return WordTokenizer(words)


def tokenizer_from_dict(d: Any, max_vocab: int = MAX_LOADED_VOCAB) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`Tokenizer.to_dict` output.

    Treats ``d`` as untrusted: only what ``to_dict`` writes is accepted, with at most
    ``max_vocab`` tokens of at most ``MAX_TOKEN_BYTES`` bytes each; any problem raises
    ``ValueError`` before a tokenizer is built. A pretrained model's tokenizer (kind "hf") may
    have up to MAX_PRETRAINED_VOCAB tokens when ``max_vocab`` allows; the app's own kinds never
    more than MAX_VOCAB.
    """
    if isinstance(max_vocab, bool) or not isinstance(max_vocab, int) or not 2 <= max_vocab <= MAX_PRETRAINED_VOCAB:
        raise ValueError(f"max_vocab must be an integer from 2 to {MAX_PRETRAINED_VOCAB}")
    if not isinstance(d, dict):
        raise ValueError(f"tokenizer data must be a JSON object, not {json_type(d)}")
    kind = d.get("kind")
    if not isinstance(kind, str) or kind not in STORED_TOKENIZER_KINDS:
        raise ValueError(f"unknown tokenizer kind {preview(kind)}; expected one of {', '.join(STORED_TOKENIZER_KINDS)}")
    if kind == "hf":
        return _checked_hf(d, max_vocab)
    max_vocab = min(max_vocab, MAX_VOCAB)
    try:
        if kind == "char":
            return _checked_char(d, max_vocab)
        if kind == "word":
            return _checked_word(d, max_vocab)
        check_keys(d, "bpe tokenizer data", {"kind", "tokenizer"})
        return BPETokenizer.from_json(d["tokenizer"], max_vocab)
    except ValueError:
        raise
    except Exception:  # defensive: untrusted data must only yield ValueError
        raise ValueError(f"invalid {kind} tokenizer data") from None


def _checked_hf(d: dict[str, Any], max_vocab: int) -> HFFileTokenizer:
    try:
        return HFFileTokenizer.from_dict(d, max_vocab)
    except ValueError:
        raise
    except Exception:  # defensive: untrusted data must only yield ValueError
        raise ValueError("invalid hf tokenizer data") from None
