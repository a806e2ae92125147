"""What every tokenizer shares: the interface, the limits on tokens, and the checks on untrusted values.

`Tokenizer` is the interface of the character and word tokenizers (model/tokenizers.py) and of
BPE (model/bpe.py): a vocabulary of token strings, `encode`/`decode`, display pieces and
`to_dict`. The limits here bound every kind alike (vocabulary size, bytes per token); the
checks below run on plain JSON values from files a person gave us, so every kind's loading
refuses bad data with the same sentences and never echoes more than a short preview of it.
"""

from __future__ import annotations

import json
import unicodedata
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Iterator

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
TOKENIZER_KINDS = ("char", "word", "bpe")  # the kinds the app trains
# The kinds a Decoder Lab file holds: those, and a converted pretrained model's tokenizer.json
# (model/hf_tokenizer.py), whose vocabulary may be larger than MAX_VOCAB.
STORED_TOKENIZER_KINDS = (*TOKENIZER_KINDS, "hf")
MAX_PRETRAINED_VOCAB = 300_000

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


@dataclass(frozen=True)
class Encoded:
    """Result of :meth:`Tokenizer.encode_verbose`."""

    ids: list[int]
    pieces: list[str]  # display string per token
    unknown: list[str]  # out-of-vocabulary input, first-seen order, no repeats


def dedup(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


# ---------------------------------------------------------------- untrusted data
#
# Everything below runs on plain JSON values (dict, list, str, int, ...) and refuses what
# the project never writes. Messages name the field and never echo more than a short
# preview of a value: a hostile value can be megabytes long.


def json_type(x: Any) -> str:
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


def preview(x: Any, limit: int = 24) -> str:
    """Short preview of a value for a message."""
    if isinstance(x, str):
        return repr(x) if len(x) <= limit else repr(x[:limit]) + "…"
    if x is None or (isinstance(x, (bool, int)) and abs(x) < 10**limit):
        return json.dumps(x)
    return json_type(x)


def utf8_len(s: str) -> int:
    # surrogatepass: in-memory text never fails here; untrusted text is checked by check_piece
    return len(s.encode("utf-8", "surrogatepass"))


def storable(piece: str) -> bool:
    """Whether a trained token passes :func:`check_piece` (training leaves others out)."""
    return utf8_len(piece) <= MAX_TOKEN_BYTES and not any("\ud800" <= c <= "\udfff" for c in piece)


def check_piece(piece: Any, field: str) -> str:
    """A token string: non-empty, valid Unicode, at most MAX_TOKEN_BYTES bytes of UTF-8."""
    if not isinstance(piece, str):
        raise ValueError(f"{field} must be a string, not {json_type(piece)}")
    if not piece:
        raise ValueError(f"{field} is an empty string")
    # Length in characters first: a longer string is over the byte limit anyway, and a
    # 900 KB token should not be encoded just to learn that.
    if len(piece) > MAX_TOKEN_BYTES or utf8_len(piece) > MAX_TOKEN_BYTES:
        raise ValueError(f"{field} is longer than {MAX_TOKEN_BYTES} bytes ({preview(piece)})")
    if any("\ud800" <= c <= "\udfff" for c in piece):
        raise ValueError(f"{field} is not valid Unicode text (a lone surrogate)")
    return piece


def check_keys(d: Any, field: str, required: set[str], optional: frozenset[str] = frozenset()) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"{field} must be an object, not {json_type(d)}")
    for key in d:
        if key not in required and key not in optional:
            raise ValueError(f"{field} has an unknown key {preview(key)}")
    for key in sorted(required):
        if key not in d:
            raise ValueError(f"{field} is missing the {key!r} key")


def check_same(value: Any, expected: Any, field: str) -> None:
    """Require ``value`` to equal ``expected`` exactly, types included (so false ≠ 0)."""
    if isinstance(expected, dict):
        check_keys(value, field, set(expected))
        for key, sub in expected.items():
            check_same(value[key], sub, f"{field}.{key}")
    elif isinstance(expected, list):
        if not isinstance(value, list) or len(value) != len(expected):
            raise ValueError(f"{field} must be {json.dumps(expected)}")
        for i, (v, e) in enumerate(zip(value, expected)):
            check_same(v, e, f"{field}[{i}]")
    elif type(value) is not type(expected) or value != expected:
        raise ValueError(f"{field} must be {json.dumps(expected)}")


def checked_list(d: dict[str, Any], key: str, max_len: int) -> list[Any]:
    items = d[key]
    if not isinstance(items, list):
        raise ValueError(f"tokenizer {key!r} must be an array, not {json_type(items)}")
    if len(items) > max_len:
        raise ValueError(f"tokenizer {key!r} has {len(items):,} entries; the limit is {max_len:,}")
    return items


class Tokenizer(ABC):
    """Common interface of all tokenizers."""

    kind: ClassVar[str]

    def __init__(self, vocab: list[str]) -> None:
        if len(vocab) > MAX_VOCAB:
            raise ValueError(f"vocabulary has {len(vocab)} entries; the limit is {MAX_VOCAB}")
        index: dict[str, int] = {}
        for i, piece in enumerate(vocab):
            check_piece(piece, f"vocabulary entry {i}")
            if piece in index:
                raise ValueError(f"duplicate vocabulary entry {preview(piece)}")
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
                raise ValueError(f"token id must be an integer, not {json_type(i)}") from None
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
