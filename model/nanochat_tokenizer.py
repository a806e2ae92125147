"""nanochat's tokenizer.pkl, read without running it, and the app's tokenizer built from it.

nanochat (Karpathy's "train your own ChatGPT", 2025-26) saves its tokenizer with `pickle.dump` of a
`tiktoken.core.Encoding`. A pickle is a program: loading one may import and call anything. This reader
runs none of it:

* the file is at most MAX_TOKENIZER_PICKLE_BYTES (sized below) and every opcode is read first
  (pickletools reads without running) against the short list such a file uses, with at most a
  vocabulary's worth of values, before anything is loaded;
* the loader's `find_class` answers only ("tiktoken.core", "Encoding"), with a harmless local stand-in
  that keeps the state it is given; any other class or function is refused by name;
* the state must be exactly what `Encoding.__getstate__` writes: {"name", "pat_str", "mergeable_ranks"
  (bytes -> rank), "special_tokens" (text -> id)}, its pattern nanochat's own (NANOCHAT_PATTERN, never a
  file's own regular expression), its ranks 0 .. n-1 once each with every single byte among them, its
  special tokens (<|bos|> among them) the ids after the ranks.

The app's tokenizer is then a byte-level BPE run by the `tokenizers` library (model/hf_tokenizer.py): the
pattern as a `Split` pre-tokenizer, the ranks as the vocabulary, each token's merge the pair tiktoken's
own rule makes it from (rank order, lowest first, among the tokens before it), and `ignore_merges`, since
tiktoken takes a piece that is a token whole. The special tokens are ordinary entries of that vocabulary:
as nanochat's `encode_ordinary`, text that spells "<|bos|>" stays text. Prompts get <|bos|> first, as
nanochat's base-model sampling and evaluation put it; generation ends at <|bos|>, where nanochat's engine
ends a row (the next document begins).
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from .hf_tokenizer import HFFileTokenizer
from .json_bounds import short
from .tokenizer_core import MAX_PRETRAINED_VOCAB

# nanochat's split pattern (nanochat/tokenizer.py SPLIT_PATTERN, unchanged since its first commit): GPT-4's,
# with numbers in runs of at most two digits; possessive quantifiers (?+, ++), which the library's regex runs
NANOCHAT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
                    r"""|\s*[\r\n]|\s+(?!\S)|\s+""")
BOS = "<|bos|>"
# A 65,536-token nanochat tokenizer.pkl is about 0.85 MB: each rank costs its token's bytes plus 6 bytes of
# opcodes (a length, a memo mark, the rank). 24 bytes a token, for as many tokens as any pretrained
# vocabulary here may have (MAX_PRETRAINED_VOCAB), is 7.2 MB.
MAX_TOKENIZER_PICKLE_BYTES = 24 * MAX_PRETRAINED_VOCAB
MAX_RANK_BYTES = 256  # a token's bytes (GPT-4's longest is 128); the tokenizer.json check allows 512 characters
MAX_SPECIAL_TOKENS = 64  # nanochat has 9
MAX_NAME_CHARS = 100
# a special token's text: <|name|>, as all of nanochat's are. The pattern always cuts such a text into
# several pieces ("<|", the name, "|>"), so no typed text is ever one piece that spells it whole
SPECIAL_TEXT = re.compile(r"<\|[a-z][a-z0-9_]{0,49}\|>")
STATE_KEYS = {"name", "pat_str", "mergeable_ranks", "special_tokens"}
# the opcodes pickle (protocols 4 and 5) writes for an Encoding's state: strings, bytes, small ints, dicts, the
# class by name (STACK_GLOBAL), its instance (EMPTY_TUPLE, NEWOBJ) and its state (BUILD); nothing that calls.
# The memo is filled by MEMOIZE only, which appends: BINPUT and LONG_BINPUT (protocols 0-3) name any index, and
# an index of 2^31 would have the loader allocate a memo of gigabytes
_OPCODES = frozenset("""
    PROTO FRAME STOP MARK MEMOIZE BINGET LONG_BINGET
    SHORT_BINUNICODE BINUNICODE SHORT_BINBYTES BINBYTES BININT1 BININT2 BININT
    EMPTY_DICT SETITEM SETITEMS STACK_GLOBAL EMPTY_TUPLE NEWOBJ BUILD
""".split())
_COUNTED = frozenset("SHORT_BINUNICODE BINUNICODE SHORT_BINBYTES BINBYTES BININT1 BININT2 BININT MEMOIZE".split())
# the values (keys and values of both dicts, a few names) and their memo entries: a vocabulary's worth
MAX_VALUES = 4 * (MAX_PRETRAINED_VOCAB + MAX_SPECIAL_TOKENS) + 32


class _Encoding:
    """What the loader makes of tiktoken.core.Encoding: an object that only keeps its state."""

    state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _Refused(pickle.UnpicklingError):
    """A class or function the file names, other than the one allowed."""


class _OneClass(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("tiktoken.core", "Encoding"):
            return _Encoding
        raise _Refused(short(f"{module}.{name}", 80))


def read_encoding(data: bytes, what: str = "tokenizer.pkl") -> dict[str, Any]:
    """The checked state of a pickled tiktoken Encoding (see the module docstring); a ValueError sentence."""
    if len(data) > MAX_TOKENIZER_PICKLE_BYTES:
        raise ValueError(f"{what} is {len(data):,} bytes; a tokenizer.pkl is read up to {MAX_TOKENIZER_PICKLE_BYTES:,}")
    values = 0
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name not in _OPCODES:
                raise ValueError(f"{what} holds pickle opcode {op.name}, which a saved tiktoken encoding never "
                                 "has (it imports, calls or builds other objects); nothing in it was run")
            values += op.name in _COUNTED
            if values > MAX_VALUES:
                raise ValueError(f"{what} holds more values than a vocabulary of {MAX_PRETRAINED_VOCAB:,} "
                                 "tokens needs; it was not loaded")
    except ValueError as exc:
        if what in str(exc):
            raise
        raise ValueError(f"{what} is not a valid pickle (truncated or another format)") from None
    except Exception:  # genops raises several types on malformed input
        raise ValueError(f"{what} is not a valid pickle (truncated or another format)") from None
    try:
        obj = _OneClass(io.BytesIO(data)).load()
    except _Refused as exc:
        raise ValueError(f"{what} asks to import {exc}, which a saved tiktoken encoding never needs; "
                         "nothing in it was run") from None
    except Exception:  # an unhashable key, a stack underflow, a BUILD on something else
        raise ValueError(f"{what} is not a valid pickle (truncated or another format)") from None
    if not isinstance(obj, _Encoding):
        raise ValueError(f"{what} is not a saved tiktoken Encoding (nanochat's tokenizer)")
    return check_state(obj.state, what)


def check_state(state: Any, what: str) -> dict[str, Any]:
    """An Encoding's state as nanochat writes it, every field checked."""
    if not isinstance(state, dict) or set(state) != STATE_KEYS:
        keys = sorted(map(short, state)) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{what}'s encoding state must hold exactly {sorted(STATE_KEYS)}, not {short(keys, 120)}")
    name, pattern = state["name"], state["pat_str"]
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
        raise ValueError(f"{what}'s encoding name must be a short text, got {short(name)}")
    if pattern != NANOCHAT_PATTERN:
        raise ValueError(f"{what} splits text with the pattern {short(pattern, 80)}, not nanochat's; the app runs "
                         "only nanochat's own pattern, never a file's regular expression")
    ranks = state["mergeable_ranks"]
    if not isinstance(ranks, dict) or not 256 <= len(ranks) <= MAX_PRETRAINED_VOCAB:
        raise ValueError(f"{what}'s mergeable_ranks must map 256 to {MAX_PRETRAINED_VOCAB:,} tokens to ranks")
    for token, rank in ranks.items():
        if not isinstance(token, bytes) or not 0 < len(token) <= MAX_RANK_BYTES:
            raise ValueError(f"{what}'s mergeable_ranks has the key {short(token)}; each must be 1 to "
                             f"{MAX_RANK_BYTES} bytes")
        if type(rank) is not int or not 0 <= rank < len(ranks):
            raise ValueError(f"{what}'s mergeable_ranks gives {short(token)} the rank {short(rank)}; ranks run "
                             f"from 0 to {len(ranks) - 1:,}")
    if len(set(ranks.values())) != len(ranks):
        raise ValueError(f"{what}'s mergeable_ranks gives one rank to two tokens")
    if any(bytes([b]) not in ranks for b in range(256)):
        raise ValueError(f"{what}'s mergeable_ranks lacks a single byte, so some texts could not be encoded")
    specials = state["special_tokens"]
    n = len(ranks)
    if not isinstance(specials, dict) or not 0 < len(specials) <= MAX_SPECIAL_TOKENS:
        raise ValueError(f"{what}'s special_tokens must map 1 to {MAX_SPECIAL_TOKENS} texts to ids")
    for text in specials:
        if not isinstance(text, str) or not SPECIAL_TEXT.fullmatch(text):
            raise ValueError(f"{what}'s special_tokens has the key {short(text)}; each must be written <|name|> "
                             "(lowercase letters, digits, underscores), as nanochat's are")
    if sorted(specials.values()) != list(range(n, n + len(specials))):
        raise ValueError(f"{what}'s special tokens must take the ids right after the ranks ({n:,} onwards), "
                         "each once")
    if BOS not in specials:
        raise ValueError(f"{what} has no {BOS} token, which nanochat puts before every text")
    return state


def merges_of(ranks: dict[bytes, int], what: str = "tokenizer.pkl") -> list[tuple[bytes, bytes]]:
    """Each token's merge, in rank order: the two tokens tiktoken's rule joins into it, found by running
    that rule (lowest-ranked adjacent pair first) on its bytes with the tokens ranked before it only.
    Single bytes have none. A token that rule cannot make from two earlier ones is refused: a byte-level
    BPE could not reach it, so the app could not encode as tiktoken does."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        splits = [i for i in range(1, len(token))
                  if ranks.get(token[:i], rank) < rank and ranks.get(token[i:], rank) < rank]
        parts = [token[: splits[0]], token[splits[0]:]] if len(splits) == 1 else _bpe(ranks, token, rank)
        if len(parts) != 2:
            raise ValueError(f"{what}: the token of rank {rank:,} ({short(token)}) is not the merge of two tokens "
                             "ranked before it, so it is not a byte-level BPE vocabulary the app can run exactly")
        merges.append((parts[0], parts[1]))
    return merges


def _bpe(ranks: dict[bytes, int], token: bytes, below: int) -> list[bytes]:
    """tiktoken's merging of `token`'s bytes with the tokens ranked below `below` only."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, at = below, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1], below)
            if r < best:
                best, at = r, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts


def _byte_text(data: bytes) -> str:
    """Bytes in GPT-2's byte alphabet (a space is Ġ), as a byte-level tokenizer.json writes a token."""
    table = byte_alphabet()
    return "".join(table[b] for b in data)


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (the `tokenizers` library's ByteLevel step): the printable
    Latin-1 characters stand for themselves, every other byte for a character from 256 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b], extra = chr(256 + extra), extra + 1
    return table


def tokenizer_json(state: dict[str, Any], what: str = "tokenizer.pkl") -> str:
    """The tokenizer.json (byte-level BPE) that encodes and decodes as the Encoding's `encode_ordinary` and
    `decode` do (see the module docstring)."""
    ranks, specials = state["mergeable_ranks"], state["special_tokens"]
    vocab = {_byte_text(token): rank for token, rank in ranks.items()}
    for text, i in specials.items():
        shown = _byte_text(text.encode("utf-8"))
        if shown in vocab:
            raise ValueError(f"{what}'s special token {short(text)} spells a token of the vocabulary")
        vocab[shown] = i
    merges = [[_byte_text(a), _byte_text(b)] for a, b in merges_of(ranks, what)]
    split = {"type": "Split", "pattern": {"Regex": NANOCHAT_PATTERN}, "behavior": "Isolated", "invert": False}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, byte_level]},
        "post_processor": None, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }
    return json.dumps(doc, ensure_ascii=False)


def nanochat_tokenizer(path: str | Path, vocab_size: int | None = None) -> HFFileTokenizer:
    """The app's tokenizer for a nanochat tokenizer.pkl; vocab_size: the model's, which it must equal."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_TOKENIZER_PICKLE_BYTES:
            raise ValueError(f"{path.name} is {size:,} bytes; a tokenizer.pkl is read up to "
                             f"{MAX_TOKENIZER_PICKLE_BYTES:,}")
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path.name} cannot be read ({exc.strerror or 'error'})") from None
    state = read_encoding(data, path.name)
    n_vocab = len(state["mergeable_ranks"]) + len(state["special_tokens"])
    if vocab_size is not None and n_vocab != vocab_size:
        raise ValueError(f"{path.name} has {n_vocab:,} tokens but the model's meta file says vocab_size "
                         f"{vocab_size:,}; they do not belong together")
    try:
        hf = HFTokenizer.from_str(tokenizer_json(state, path.name))
    except ValueError:
        raise
    except Exception:  # errors and panics of the Rust library
        raise ValueError(f"{path.name}'s vocabulary could not be run by the tokenizers library") from None
    return HFFileTokenizer(hf, add_bos=True, bos_token=BOS, eos_token=BOS)
