"""The files the fuzzer uploads: a tiny valid checkpoint per kind, checkpoints whose tokenizer, config or
meta JSON is mutated (named hostile edits and random tree edits), and training texts, valid or hostile."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

from .checks import shorten
from .values import TEXT, nested

ST_HEADER = struct.Struct("<Q")


def st_split(data: bytes) -> tuple[dict, bytes]:
    (n,) = ST_HEADER.unpack(data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def st_join(header: dict, body: bytes) -> bytes:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return ST_HEADER.pack(len(raw)) + raw + body


PADDING = {"strategy": {"Fixed": 2_000_000}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
           "pad_type_id": 0, "pad_token": "<unk>"}
BPE_ATTACKS: list[tuple[str, str, Any]] = [  # (label, dotted path in the HF document, value)
    ("padding 2,000,000", "padding", PADDING),
    ("padding with pad id 10**6", "padding", {**PADDING, "strategy": "BatchLongest", "pad_id": 10**6}),
    ("truncation", "truncation", {"direction": "Right", "max_length": 1, "strategy": "LongestFirst", "stride": 0}),
    ("normalizer multiplying text", "normalizer", {"type": "Replace", "pattern": {"Regex": "(?s)."},
                                                   "content": "x" * 10_000}),
    ("prepend normalizer", "normalizer", {"type": "Prepend", "prepend": "\u2581" * 10_000}),
    ("backtracking regex (a+)+b", "pre_tokenizer.pattern.Regex", "(a+)+b"),
    ("regex that does not compile", "pre_tokenizer.pattern.Regex", "(((("),
    ("ByteLevel pre-tokenizer", "pre_tokenizer", {"type": "ByteLevel", "add_prefix_space": False,
                                                  "trim_offsets": True, "use_regex": True}),
    ("decoder", "decoder", {"type": "Replace", "pattern": {"String": "a"}, "content": "b" * 1000}),
    ("post processor", "post_processor", {"type": "TemplateProcessing"}),
    ("WordPiece model", "model.type", "WordPiece"),
    ("BPE dropout", "model.dropout", 0.5),
    ("byte fallback", "model.byte_fallback", True),
    ("cache capacity 10**9", "model.cache_capacity", 10**9),
    ("huge token in vocab", "model.vocab.HUGE", 0),
    ("merges as object", "model.merges", {"a": "b"}),
    ("merge of three", "model.merges.0", ["a", "b", "c"]),
    ("extra special token", "added_tokens.1", {"id": 1, "content": " ", "single_word": False, "lstrip": False,
                                               "rstrip": False, "normalized": False, "special": True}),
    ("version 2.0", "version", "2.0"),
    ("unknown top key", "extra", 1),
]
TREE_JUNK = [None, True, 0, -1, 10**30, 1.5, "", "x" * 100_000, "\ud800", [], [[]], {}, {"type": "Sequence"},
             nested(50), "(a+)+b"]
CHAR_ATTACKS: list[tuple[str, Any]] = [
    ("two-character entry", "ab"), ("100,000-character entry", "x" * 100_000), ("number entry", 5),
    ("null entry", None), ("list entry", [["a"]]), ("duplicate entry", "a"), ("'<unk>' entry", "<unk>"),
    ("NUL entry", "\x00"), ("lone surrogate entry", "\ud800"), ("65-byte entry", "\u00e9" * 33),
]
# Single characters a file may legitimately carry: such a model loads and must display safely.
ODD_CHARS = ["\u202e", "<", "&", "\t", "\u0301", "\U0001f600", "\u200b", "\\", '"', "\n"]


def set_path(doc: Any, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    if isinstance(node, list):
        i = int(last)
        if i < len(node):
            node[i] = value
        else:
            node.append(value)
    elif last == "HUGE" and isinstance(node, dict):
        node["y" * 100_000] = len(node)
    else:
        node[last] = value


def tree_paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys/indexes) into a JSON document, the first 40 items of each list."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += tree_paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:40]):
            out += tree_paths(v, prefix + (i,))
    return out


def tree_edit(doc: Any, draw) -> tuple[Any, str]:
    """One random edit of a JSON document: replace a node, delete a key or add an unknown one."""
    doc = copy.deepcopy(doc)
    paths = tree_paths(doc)
    path = draw.choice(paths)
    value = draw.choice(TREE_JUNK)
    op = draw.choice(["replace", "delete", "add key"])
    if not path:
        return value, f"document replaced by {shorten(repr(value), 40)}"
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    last = path[-1]
    where = ".".join(map(str, path))
    if op == "delete" and isinstance(parent, dict):
        del parent[last]
        return doc, f"deleted {shorten(where, 60)}"
    if op == "add key" and isinstance(parent[last], dict):
        parent[last]["unknown_key"] = value
        return doc, f"unknown key under {shorten(where, 60)}"
    parent[last] = value
    return doc, f"{shorten(where, 60)} = {shorten(repr(value), 40)}"


class Files:
    """Local files the fuzzer uploads: tiny checkpoints (valid and hostile) and training texts."""

    NAMES = ["m", "<b>x<b>", "\u00fcn\u00ef c\u00f6d\u00e9", "a" * 120, "..", "-rf", " spaced ", "model.py"]

    def __init__(self, folder: Path):
        self.folder = folder
        self.n = 0
        self.bases: dict[str, tuple[bytes, dict]] = {}  # tokenizer kind -> (file bytes, info)

    def _path(self, stem: str, suffix: str) -> Path:
        self.n += 1
        d = self.folder / f"{self.n:06d}"
        d.mkdir(parents=True, exist_ok=True)
        return d / f"{stem}{suffix}"

    def base(self, kind: str) -> tuple[bytes, dict]:
        """A valid tiny checkpoint with a `kind` tokenizer: (bytes, {layers, heads, prompt})."""
        if kind not in self.bases:
            import torch

            from model.checkpoint import checkpoint_bytes
            from model.config import ModelConfig
            from model.tokenizers import BPETokenizer, CharTokenizer, WordTokenizer
            from model.transformer import DecoderLM

            tok = {"char": lambda: CharTokenizer.train(TEXT), "word": lambda: WordTokenizer.train(TEXT),
                   "bpe": lambda: BPETokenizer.train(TEXT, vocab_size=60)}[kind]()
            cfg = ModelConfig(vocab_size=tok.vocab_size, block_size=24, n_layers=1, n_heads=2, d_model=8, d_ff=16)
            torch.manual_seed(0)
            prompt = "the cat sat on the"
            data = checkpoint_bytes(DecoderLM(cfg), tok, {"examples": [prompt]})
            self.bases[kind] = (data, {"layers": 1, "heads": 2, "prompt": prompt})
        return self.bases[kind]

    def checkpoint(self, draw) -> tuple[Path, str, dict]:
        """A valid checkpoint under a drawn file name: (path, label, model info)."""
        kind = draw.choice(["char", "word", "bpe"])
        data, info = self.base(kind)
        stem = draw.choice(self.NAMES)
        path = self._path(stem, ".safetensors")
        path.write_bytes(data)
        return path, f"valid {kind} checkpoint named {stem[:20]!r}", info

    def hostile(self, draw) -> tuple[Path, str, dict]:
        """A checkpoint whose tokenizer, config or meta JSON is mutated: (path, what was done, info)."""
        what = draw.choice(["tokenizer attack", "tokenizer tree edit", "odd but valid character", "config edit",
                            "meta edit", "metadata not JSON"])
        kind = "char" if what == "odd but valid character" else draw.choice(["char", "word", "bpe"])
        data, info = self.base(kind)
        header, body = st_split(data)
        meta = header["__metadata__"]
        tok = json.loads(meta["tokenizer"])
        label = f"{kind}: {what}"
        if what == "tokenizer attack":
            if kind == "bpe":
                name, path, value = draw.choice(BPE_ATTACKS)
                doc = json.loads(tok["tokenizer"])
                set_path(doc, path, copy.deepcopy(value))
                tok["tokenizer"] = json.dumps(doc)
                label += f" {name}"
            else:
                key = "chars" if kind == "char" else "words"
                name, value = draw.choice(CHAR_ATTACKS + [("list of 5,000 entries", None), ("entries as object", None)])
                if name == "list of 5,000 entries":
                    tok[key] = [chr(0x4E00 + i) for i in range(5000)]
                elif name == "entries as object":
                    tok[key] = {"a": 1}
                else:
                    tok[key][draw.index(len(tok[key]))] = value
                label += f" {name}"
            meta["tokenizer"] = json.dumps(tok)
        elif what == "tokenizer tree edit":
            if kind == "bpe" and draw.chance(0.7):
                doc, how = tree_edit(json.loads(tok["tokenizer"]), draw)
                tok["tokenizer"] = doc if draw.chance(0.1) else json.dumps(doc)
            else:
                tok, how = tree_edit(tok, draw)
            meta["tokenizer"] = json.dumps(tok)
            label += f" {how}"
        elif what == "odd but valid character":
            ch = draw.choice(ODD_CHARS)
            chars = tok["chars"]
            if ch not in chars:
                chars[draw.index(len(chars))] = ch
            meta["tokenizer"] = json.dumps(tok)
            label += f" {ch!r}"
        elif what == "config edit":
            cfg, how = tree_edit(json.loads(meta["config"]), draw)
            meta["config"] = json.dumps(cfg)
            label += f" {how}"
        elif what == "meta edit":
            junk = draw.choice([[None, 5, "x" * 3000, "\x00", {"a": 1}], "x" * 100_000, [" "] * 1000, {"a": [1]},
                                ["<script>alert(1)</script>"]])
            meta["meta"] = json.dumps({"examples": junk, "example_prompt": junk} if draw.chance(0.8) else junk)
            label += f" examples = {shorten(repr(junk), 40)}"
        else:
            key, junk = draw.choice(["tokenizer", "config", "meta"]), draw.choice(["{", "x" * 10_000, "[" * 3000])
            meta[key] = junk
            label += f" {key} = {shorten(repr(junk), 20)}"
        path = self._path(draw.choice(self.NAMES), ".safetensors")
        path.write_bytes(st_join(header, body))
        return path, label, info

    def text(self, draw, valid: bool = False) -> tuple[Path, str]:
        """A training text file, valid or (unless `valid`) maybe hostile."""
        what = "valid" if valid else draw.choice([
            "valid", "valid", "empty", "binary", "latin-1", "NUL bytes", "BOM and CRLF", "short", "1.3 MB",
            "lone surrogate bytes", "checkpoint renamed .txt"])
        data = {"valid": TEXT.encode(), "empty": b"", "binary": bytes(range(256)) * 8,
                "latin-1": ("caf\u00e9 " * 300).encode("latin-1"), "NUL bytes": b"\0" * 2000,
                "BOM and CRLF": b"\xef\xbb\xbf" + TEXT.replace(" . ", " .\r\n").encode(), "short": b"abc",
                "1.3 MB": b"abcdefghij " * 120_000, "lone surrogate bytes": b"\xed\xa0\x80" * 500,
                "checkpoint renamed .txt": self.base("char")[0]}[what]
        path = self._path(draw.choice(self.NAMES), ".txt")
        path.write_bytes(data)
        return path, f"text file: {what}"
