"""A Hugging Face `tokenizer.json` (byte-level BPE, or SentencePiece-style BPE) behind the app's
`Tokenizer` interface, through the `tokenizers` library.

These files come with a model folder that the person running the app chose, but a folder can be
damaged or hostile too, and a converted model's Decoder Lab file carries the tokenizer (`to_dict`: the
tokenizer.json text, BOS / EOS and `add_bos`), which may come back as a visitor's upload. Both are held
to one check (model/hf_tokenizer_checks.py), so every command and the app give a tokenizer the same
answer: `from_dict` checks the stored JSON field by field before the library parses it; `from_folder`
checks the folder file's counts (a vocabulary no larger than the model's rows) before the library
reads it, then the library's reading of it field by field (a file an older library wrote has other keys).

* Pieces are shown as people read them: GPT-2's byte alphabet (`Ġ` for a space, `Ċ` for a
  newline) and SentencePiece's `▁` are turned back into the text they stand for, then made
  visible as the app's own pieces are (`display_piece`: a space shows as `␣`).
* BOS: whether `encode` puts a beginning-of-sequence token first follows the family
  (`add_bos`): GPT-2, GPT-Neo and GPT-NeoX never do; Llama-style tokenizers do when their
  post-processor does, or when tokenizer_config.json says `add_bos_token: true`. The first-token
  ("sink") head score depends on it, so `bos_id` and `add_bos` are attributes the app can show.
* The vocabulary may be smaller than the model's embedding (padded rows): see
  ModelConfig.vocab_used.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from tokenizers import Tokenizer as HFTokenizer

from . import json_bounds
from .hf_tokenizer_checks import check_counts, checked_document
from .tokenizer_core import MAX_PRETRAINED_VOCAB, Encoded, Tokenizer, check_keys, display_piece, preview

MAX_TOKENIZER_BYTES = 50_000_000  # GPT-2's tokenizer.json is 1.4 MB, Llama 3's 9 MB


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, reversed (character -> byte)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:  # bytes that are not printable are moved past 255, in order
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class HFFileTokenizer(Tokenizer):
    """The tokenizer of a Hugging Face model folder (`kind = "hf"`)."""

    kind = "hf"

    def __init__(self, hf: HFTokenizer, add_bos: bool = False, bos_token: str | None = None,
                 eos_token: str | None = None) -> None:
        # The base class's constructor checks the app's own small vocabularies (an <unk> entry,
        # at most 50,000 tokens); a pretrained vocabulary is the model's own, so it is not called.
        self._hf = hf
        # the app encodes one prompt at a time, as transformers' tokenizer does by default
        hf.no_padding()
        hf.no_truncation()
        size = hf.get_vocab_size(with_added_tokens=True)
        if not 0 < size <= MAX_PRETRAINED_VOCAB:
            raise ValueError(f"tokenizer.json has {size:,} tokens; at most {MAX_PRETRAINED_VOCAB:,} are read")
        self._size = size
        self._byte_level = _uses(hf, "ByteLevel")
        self.bos_id = hf.token_to_id(bos_token) if bos_token else None
        self._eos = hf.token_to_id(eos_token) if eos_token else None
        # the texts of those that are tokens, for to_dict
        self._special_texts = (bos_token if self.bos_id is not None else None,
                               eos_token if self._eos is not None else None)
        self.add_bos = bool(add_bos and self.bos_id is not None)

    @classmethod
    def from_folder(cls, folder: str | Path, family_adds_bos: bool, hf_config: dict | None = None,
                    model_rows: int | None = None) -> "HFFileTokenizer":
        """The folder's tokenizer.json (with tokenizer_config.json's BOS/EOS tokens when present).

        family_adds_bos: False for families that never prepend BOS (GPT-2, Neo, NeoX); True lets the
        tokenizer's own files decide (its post-processor, or add_bos_token). model_rows: the model's
        embedding rows, which bound the vocabulary (else MAX_PRETRAINED_VOCAB does).

        The file is held to the checks a tokenizer inside a Decoder Lab file gets
        (model/hf_tokenizer_checks.py), so every command and the app give it the same answer: its
        counts before the library reads it, then the library's own reading of it, field by field."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        try:
            size = path.stat().st_size
        except OSError:
            raise ValueError("the folder has no tokenizer.json (only tokenizer.json files are read)") from None
        if size > MAX_TOKENIZER_BYTES:
            raise ValueError(f"tokenizer.json is {size:,} bytes; at most {MAX_TOKENIZER_BYTES:,} are read")
        max_vocab = min(model_rows or MAX_PRETRAINED_VOCAB, MAX_PRETRAINED_VOCAB)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise ValueError("tokenizer.json cannot be read as UTF-8 text") from None
        n = check_counts(json_bounds.parse(text, "tokenizer.json"), max_vocab)
        if model_rows and n > model_rows:
            raise ValueError(f"tokenizer.json has {n:,} tokens but the model only {model_rows:,} embedding rows; "
                             "they do not belong together")
        if n > max_vocab:
            raise ValueError(f"tokenizer.json has {n:,} tokens; at most {max_vocab:,} are read")
        try:
            hf = HFTokenizer.from_str(text)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # the Rust library reports bad files as exceptions (or panics)
            raise ValueError("tokenizer.json could not be read by the tokenizers library") from None
        checked_document(hf.to_str(), max_vocab)  # the library's reading, as a Decoder Lab file would hold it
        hf.no_padding()  # before the post-processor is probed below (a left padding would hide its BOS)
        hf.no_truncation()
        settings = _tokenizer_config(folder)
        bos = _token_text(settings.get("bos_token")) or _config_token(hf, hf_config, "bos_token_id")
        eos = _token_text(settings.get("eos_token")) or _config_token(hf, hf_config, "eos_token_id")
        add_bos = False
        if family_adds_bos and bos is not None:
            bos_id = hf.token_to_id(bos)
            by_processor = bos_id is not None and hf.encode("a", add_special_tokens=True).ids[:1] == [bos_id]
            add_bos = bool(settings.get("add_bos_token", by_processor))
        return cls(hf, add_bos, bos, eos)

    # ------------------------------------------------------------------ the Tokenizer interface

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def unk_id(self) -> int | None:  # byte-level BPE encodes every text: there is no unknown token
        return None

    @property
    def eos_id(self) -> int | None:
        return self._eos

    @property
    def vocab(self) -> list[str]:
        return [self._raw_token(i) for i in range(self._size)]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The text's ids, BOS first when the tokenizer adds one (`add_bos`) and `add_special_tokens`
        is true: False gives the text's own tokens only, as for a piece that continues a text."""
        ids = self._hf.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if self.add_bos and add_special_tokens else ids

    def encode_verbose(self, text: str, add_special_tokens: bool = True) -> Encoded:
        ids = self.encode(text, add_special_tokens)
        return Encoded(ids=ids, pieces=[self.piece(i) for i in ids], unknown=[])

    def decode(self, ids: Iterable[int]) -> str:
        return self._hf.decode([self._check_id(i) for i in ids], skip_special_tokens=False)

    def piece(self, token_id: int) -> str:
        """The token as text a person reads, whitespace made visible (`␣the`, never `Ġthe`)."""
        return display_piece(self.text_of(token_id))

    def text_of(self, token_id: int) -> str:
        """The text one token stands for (an incomplete UTF-8 sequence shows as �)."""
        raw = self._raw_token(self._check_id(token_id))
        if self._hf.id_to_token(token_id) is not None and self._is_special(token_id):
            return raw
        if self._byte_level:
            table = _byte_decoder()
            if all(c in table for c in raw):
                return bytes(table[c] for c in raw).decode("utf-8", errors="replace")
            return raw
        if raw.startswith("<0x") and raw.endswith(">") and len(raw) == 6:  # SentencePiece byte fallback
            try:
                return bytes([int(raw[3:5], 16)]).decode("utf-8", errors="replace")
            except ValueError:
                return raw
        return raw.replace("▁", " ")

    def to_dict(self) -> dict[str, Any]:
        bos, eos = self._special_texts
        return {"kind": self.kind, "tokenizer": self._hf.to_str(), "add_bos": self.add_bos, "bos": bos, "eos": eos}

    @classmethod
    def from_dict(cls, d: Any, max_vocab: int) -> "HFFileTokenizer":
        """Rebuild from `to_dict` output, which may come from a visitor's file: every field, the
        tokenizer.json text included, is checked (model/hf_tokenizer_checks.py) before the
        `tokenizers` library parses it, and the vocabulary has at most `max_vocab` tokens."""
        check_keys(d, "hf tokenizer data", {"kind", "tokenizer", "add_bos", "bos", "eos"})
        if not isinstance(d["add_bos"], bool):
            raise ValueError("hf tokenizer data 'add_bos' must be true or false")
        doc = checked_document(d["tokenizer"], max_vocab)
        tokens = doc["model"]["vocab"].keys() | {added["content"] for added in doc["added_tokens"]}
        for key in ("bos", "eos"):
            if d[key] is not None and (not isinstance(d[key], str) or d[key] not in tokens):
                raise ValueError(f"hf tokenizer data {key!r} must be null or a token, not {preview(d[key])}")
        if d["add_bos"] and d["bos"] is None:
            raise ValueError("hf tokenizer data asks for a BOS token first but names none")
        try:
            hf = HFTokenizer.from_str(json.dumps(doc))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # errors and panics of the Rust library
            raise ValueError("the hf tokenizer's tokenizer.json could not be read by the tokenizers library") from None
        return cls(hf, d["add_bos"], d["bos"], d["eos"])

    def __hash__(self) -> int:
        return hash((self.kind, self._size, self.add_bos))

    # ------------------------------------------------------------------ helpers

    def _raw_token(self, i: int) -> str:
        token = self._hf.id_to_token(i)
        return "" if token is None else token

    def _is_special(self, i: int) -> bool:
        return i in self._special_ids()

    def _special_ids(self) -> frozenset[int]:
        cached = getattr(self, "_specials", None)
        if cached is None:
            cached = frozenset(i for i, t in self._hf.get_added_tokens_decoder().items() if t.special)
            self._specials = cached
        return cached


def _uses(hf: HFTokenizer, kind: str) -> bool:
    """Whether the tokenizer's pre-tokenizer or decoder is (or contains) a `kind` step."""
    doc = json.loads(hf.to_str())
    return kind in json.dumps(doc.get("pre_tokenizer")) or kind in json.dumps(doc.get("decoder"))


def _tokenizer_config(folder: Path) -> dict[str, Any]:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    doc = json_bounds.read(path, "tokenizer config", MAX_TOKENIZER_BYTES)
    return doc if isinstance(doc, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _config_token(hf: HFTokenizer, hf_config: dict | None, key: str) -> str | None:
    """The text of config.json's bos/eos token id, when the tokenizer has it."""
    value = (hf_config or {}).get(key)
    if isinstance(value, list) and value:  # some configs list several end tokens; the first is used
        value = value[0]
    if isinstance(value, int) and not isinstance(value, bool):
        return hf.id_to_token(value)
    return None
