"""Stateful fuzzer of the app's public API: every endpoint, any value for any argument, in any order.

    python -m bench.fuzz                          # 10,000 calls against its own server (~35 min on 2 vCPUs)
    python -m bench.fuzz --calls 2000 --seed 7
    python -m bench.fuzz --url http://127.0.0.1:7860/ --log app.log   # an app you started (--log: its output)

The endpoints and their parameters are read from the running app (`Client.view_api`), so an
endpoint added later is fuzzed with no change here. Each argument gets a valid value (from the
parameter's choices, examples and range, narrowed by lab.limits, and coherent with the model the
call names), an edge value of the right type (bounds, just past them, 10**400, 2**63, 2.5 for a
whole number, NaN and ±inf), or a value of the wrong type (None, lists, dicts, 200-deep nesting,
long strings, lone surrogates, FileData-shaped dicts). Calls go through gradio_client, or as
hand-made HTTP (`POST /gradio_api/call/<name>` with the same session hash) for what the client
cannot send: NaN and infinity (JSON has no literal for them; gradio_client refuses them before
sending), 5,000-deep nesting, FileData naming server paths, the wrong number of arguments.
Uploads: a valid tiny checkpoint, checkpoints whose tokenizer, config or meta JSON is mutated
(padding, pad ids, normalizers, backtracking regexes, huge tokens, unknown keys, wrong types,
random tree edits) and hostile text files for training.

How "a refusal changes nothing" is checked: twin sessions. Every call goes to session A; every
call that succeeds on A is replayed on session B, which never sees the refused calls, and both
answers must be equal (file paths and timings masked). A refused call that changed A shows as a
difference at A's next success; after each refusal the fuzzer often sends such a success at once
(a probe: a Step that continues the current text with random sampling, or an Undo), so the
refusal to blame is the one just before. After a difference or a hang the pair starts afresh.

Outcome of each call:
  ok             it succeeded
  refused-clean  refused with a clear message
  refused-leaky  refused, but the message carries a file path, a Python type or exception name, a
                 traceback, a cache hash, or is over 400 characters (what the caller sent is not a leak)
  unexpected     the generic error (gradio's "error": null, or "Something went wrong"), an HTTP
                 error, or the client failing
  state-changed  a refused call changed the session (the twin differs), or a call deleted a file the
                 server had served to a session
  hang           no answer within the time limit
Every Python traceback the server prints is read from its log right after the call, and every
defect (each class but ok and refused-clean, and each kind of traceback) is counted by kind with
one example: the call (endpoint, arguments, transport) and what came back. Each kind says whose
code it is ("app": app.py, lab/, model/, viz/; "gradio": gradio's preprocessing or routing, before
any handler runs) and how it is reached ("client": gradio_client can send it; "raw-http": only a
hand-made request). tests/test_fuzz.py runs the same machinery, bounded, under hypothesis.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import random
import re
import shutil
import signal
import struct
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from bench.common import emit, parser
from lab.limits import (
    MAX_NEW_TOKENS, MAX_PROMPT_CHARS, SEED_RANGE, TEMPERATURE_RANGE, TEXT_CHARS, TOP_K_RANGE, TOP_P_RANGE,
    TRAIN_LIMITS,
)
from lab.models import ASSETS, BUILTIN_MODELS
from tests.support.server import ROOT, AppServer

OUTCOMES = ("ok", "refused-clean", "refused-leaky", "unexpected", "state-changed", "hang")
GENERIC = ("Something went wrong", "has not enabled verbose error reporting")
MAX_MESSAGE_CHARS = 400  # the app's own messages stay under this (tests/test_hostile_tokenizers.py)
# A twin's replay refused for one of these reasons says nothing about its state (the pair starts afresh).
INCONCLUSIVE = r"^Slow down|still busy|server is full"
CALL_TIMEOUT_S = 60.0  # hang guards (no answer at all), far above any call on a busy machine
TRAIN_TIMEOUT_S = 120.0

# ----------------------------------------------------------------------------------- values

HUGE = 10**400


class RawJSON:
    """A piece of JSON text spliced into a hand-made request as is (e.g. 5,000-deep nesting)."""

    def __init__(self, text: str, label: str):
        self.text, self.label = text, label

    def __repr__(self) -> str:
        return f"<json {self.label}>"


def nested(depth: int) -> list:
    x: list = []
    for _ in range(depth):
        x = [x]
    return x


FILEDATA_META = {"_type": "gradio.FileData"}
# Wrong types and hostile values for any argument, all JSON that gradio_client can send.
JUNK: list[tuple[str, Any]] = [
    ("None", None), ("True", True), ("False", False), ("0", 0), ("-1", -1), ("0.5", 0.5), ("2.5", 2.5),
    ("10**400", HUGE), ("-10**400", -HUGE), ("2**63", 2**63), ("1e308", 1e308), ("-1e308", -1e308),
    ("5e-324", 5e-324), ("-0.0", -0.0),
    ("''", ""), ("'   '", "   "), ("'1'", "1"), ("'0.5'", "0.5"), ("'1e400'", "1e400"), ("'nan'", "nan"),
    ("'-inf'", "-inf"), ("arabic-indic 3", "\u0663"), ("'1_0'", "1_0"), ("'0x10'", "0x10"),
    ("[]", []), ("[1, 2]", [1, 2]), ("[[['x']]]", [[["x"]]]), ("{}", {}), ("{'a': 1}", {"a": 1}),
    ("gradio update dict", {"__type__": "update", "value": 0}), ("200-deep list", nested(200)),
    ("10k chars", "x" * 10_000), ("NUL", "\x00"), ("lone surrogate", "\ud800"), ("RTL override", "\u202egnp.exe"),
    ("emoji ZWJ", "\U0001f469\u200d\U0001f469\u200d\U0001f467"), ("format string", "{0} %s %n {__class__}"),
    ("html", "<script>alert(1)</script>"), ("relative path", "../../../../etc/passwd"),
    ("absolute path", "/etc/passwd"), ("windows path", "C:\\Windows\\win.ini"),
    ("FileData /etc/passwd (client uploads its own copy)", {"path": "/etc/passwd", "meta": FILEDATA_META}),
]
# What only a hand-made request can carry.
RAW_JUNK: list[tuple[str, Any]] = [
    ("NaN", float("nan")), ("Infinity", float("inf")), ("-Infinity", float("-inf")),
    ("5000-deep list", RawJSON("[" * 5000 + "]" * 5000, "5000-deep list")),
]
# FileData naming files on the server that nobody uploaded (hand-made requests only).
SERVER_PATHS = ["/etc/passwd", str(ROOT / "app.py"), "app.py", str(ASSETS / "sort.safetensors"),
                "../../../../etc/passwd", "/proc/self/environ", "/dev/zero", "", "http://127.0.0.1:9/x.safetensors",
                "/tmp"]

_LINE = ("the cat sat on the mat . the dog ran to the park and the bird sang in the tree . "
         "a girl read a book while a boy played with a ball near the river . ")
TEXT = _LINE * (TEXT_CHARS[0] // len(_LINE) + 1)  # a training text just over the shortest allowed
# example prompts of a model trained on each corpus (the learned ones from /select_model win)
CORPUS_PROMPTS = {"sort": "503124=", "copy": "hcbpadlk|", "toy": "how is living in amsterdam <EOS>",
                  "grammar": "anna found the key . she", "text": "the cat sat on the"}
SEEDS = [0, 1, 2, 3, 42, 2**31 - 1]

# The app's own knowledge of its numbers (lab.limits), by parameter name; the API's declared
# range narrows them (e.g. the Steps slider starts at 10 while the lab accepts 1).
LIMITS: dict[str, tuple[float, float]] = {
    "temperature": TEMPERATURE_RANGE, "top_k": TOP_K_RANGE, "top_p": TOP_P_RANGE, "seed": SEED_RANGE,
    "max_new": (1, MAX_NEW_TOKENS), "layers": TRAIN_LIMITS["layers"], "heads": TRAIN_LIMITS["heads"],
    "d_model": TRAIN_LIMITS["d_model"], "d_ff": TRAIN_LIMITS["d_ff"], "dropout": TRAIN_LIMITS["dropout"],
    "steps": TRAIN_LIMITS["steps"], "lr": TRAIN_LIMITS["learning rate"],
}
INTEGERS = {"top_k", "seed", "max_new", "layers", "heads", "d_model", "d_ff", "steps", "layer"}
# Valid training settings are kept tiny so that a run takes well under a second.
TINY = {"layers": [1, 2], "heads": [1, 2], "d_model": [8, 16], "d_ff": [0, 16, 32], "dropout": [0.0, 0.1],
        "lr": [1e-3, 3e-3, 0.01]}


class RandomDraw:
    """The fuzzer's source of choices: random.Random here, hypothesis in tests/test_fuzz.py."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def index(self, n: int) -> int:
        return self.rng.randrange(n)

    def uniform(self, lo: float, hi: float) -> float:
        return self.rng.uniform(lo, hi)

    def choice(self, seq):
        seq = list(seq)
        return seq[self.index(len(seq))]

    def chance(self, p: float) -> bool:
        return self.index(1000) < p * 1000

    def integer(self, lo: int, hi: int) -> int:
        return lo + self.index(hi - lo + 1)


# ------------------------------------------------------------------------------ the API


@dataclass
class Param:
    name: str
    label: str
    component: str
    type: str
    enum: list | None
    lo: float | None
    hi: float | None
    default: Any
    example: Any


@dataclass
class Endpoint:
    name: str  # "/step"
    params: list[Param]
    returns: list[str]  # labels of the outputs


def discover(client) -> dict[str, Endpoint]:
    """Every named endpoint with its parameters, from the app's own API description."""
    api = client.view_api(return_format="dict", print_info=False)
    out = {}
    for name, ep in api["named_endpoints"].items():
        params = []
        for p in ep["parameters"]:
            t = p.get("type") or {}
            lo = hi = None
            m = re.search(r"between (-?[\d.e+-]+) and (-?[\d.e+-]+)", str(t.get("description", "")))
            if m:
                lo, hi = float(m.group(1)), float(m.group(2))
            params.append(Param(p.get("parameter_name") or p.get("label", "?"), p.get("label", ""),
                                p.get("component", ""), str(t.get("type", "")), t.get("enum"), lo, hi,
                                p.get("parameter_default"), p.get("example_input")))
        out[name] = Endpoint(name, params, [r.get("label", "") for r in ep.get("returns", [])])
    return out


# -------------------------------------------------------------------------------- files

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


# --------------------------------------------------------------------------- messages


def shorten(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


LEAK_RES = [
    ("file path", re.compile(r"(?<![\w.])/(?:tmp|work|etc|root|home|usr|proc|var|opt|srv)\b[^\s'\",)]*")),
    ("site-packages", re.compile(r"(?:site|dist)-packages")),
    ("Python type repr", re.compile(r"<class '|\btype:|<(?:function|bound method|module) ")),
    ("traceback", re.compile(r"Traceback \(most recent call last\)|File \"[^\"]+\", line \d+")),
    ("exception name", re.compile(r"\b(?:[A-Z][a-z0-9]+)+(?:Error|Exception)\b|\bStopIteration\b")),
    ("source file name", re.compile(r"\b\w+\.py\b")),
    ("cache hash", re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{40,}\b")),
]


def words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9]+", text)


def leaks(message: str, sent: str, server_dirs: list[str]) -> list[str]:
    """What in a refusal message tells about the server's insides (what the caller sent is not)."""
    found = []
    for name, rx in LEAK_RES:
        for m in rx.finditer(message):
            if m.group(0) not in sent:
                found.append(f"{name}: {shorten(m.group(0), 60)!r}")
                break
    mw, sw = words(message), " ".join(words(sent))
    for d in server_dirs:  # a server folder spelled as separate words, e.g. a prompt's unknown pieces
        dw = words(d)[:2]
        if len(dw) == 2 and " ".join(dw) not in sw and any(mw[i : i + 2] == dw for i in range(len(mw) - 1)):
            found.append(f"server folder {d!r} spelled out")
    if len(message) > MAX_MESSAGE_CHARS:
        found.append(f"{len(message):,} characters long")
    return found


def signature(message: str) -> str:
    """A message with its particulars masked, to group refusals and defects by kind."""
    s = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message)
    s = re.sub(r"\d[\d,._e+-]*", "N", s)
    return shorten(s, 110)


# ---------------------------------------------------------------------------- the log


@dataclass
class Traceback:
    exc: str  # first line of the root exception, e.g. "TypeError: '<' not supported ..."
    raised_in: str  # the root exception's last frame, e.g. "gradio/components/slider.py:preprocess"
    printed_by: str  # the outermost catcher, e.g. "gradio/queueing.py:process_events"
    origin: str  # "app" when any frame is in this repository, else "gradio" (its preprocessing, routing)
    refusal: bool  # a gr.Error (a refusal with a message), printed only because print_exception is on

    @property
    def kind(self) -> str:
        what = "refusal (gr.Error)" if self.refusal else self.exc.split(":")[0]
        return f"traceback: {what} raised in {self.raised_in}, printed by {self.printed_by}"


FRAME_RE = re.compile(r'^\s+File "([^"]+)", line (\d+), in (\S+)')


def short_frame(path: str, func: str) -> str:
    p = Path(path)
    try:
        return f"{p.resolve().relative_to(ROOT)}:{func}"
    except ValueError:
        pass
    m = re.search(r"(?:site|dist)-packages/(.*)$", path)
    return f"{m.group(1) if m else p.name}:{func}"


def frame_origin(path: str) -> str:
    if "-packages/" in path:
        return path.split("-packages/")[1].split("/")[0]
    try:
        Path(path).resolve().relative_to(ROOT)
        return "app"
    except ValueError:
        return "python"


class LogWatch:
    """Reads what the server printed since the last read and finds the Python tracebacks in it."""

    CHAIN = ("During handling of the above exception", "The above exception was the direct cause")

    def __init__(self, path: Path | None):
        self.path = path
        self.offset = path.stat().st_size if path is not None and path.exists() else 0
        self.pending = ""

    def read(self) -> list[Traceback]:
        if self.path is None or not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        self.offset += len(chunk)
        text = self.pending + chunk.decode("utf-8", errors="replace")
        tbs, self.pending = self.parse(text)
        return tbs

    @classmethod
    def parse(cls, text: str) -> tuple[list[Traceback], str]:
        """The complete tracebacks in `text`, and the unfinished tail to read again with more text."""
        lines = text.split("\n")
        tail = lines.pop()  # an unfinished line
        out: list[Traceback] = []
        i, n = 0, len(lines)
        while i < n:
            if not lines[i].startswith("Traceback (most recent call last):"):
                i += 1
                continue
            start, hint = i, lines[i - 1] if i else ""
            blocks = []  # (frames, exception line) of a chain, innermost first
            while True:
                frames, j = [], i + 1
                while j < n and (lines[j].startswith(" ") or not lines[j]):
                    m = FRAME_RE.match(lines[j])
                    if m:
                        frames.append((m.group(1), m.group(3)))
                    j += 1
                if j >= n:
                    return out, "\n".join(lines[start:] + [tail])
                blocks.append((frames, lines[j]))
                k = j + 1
                while k < n and (not lines[k] or lines[k].startswith(" ")):
                    k += 1  # the rest of a multi-line exception message
                if k < n and lines[k].startswith(cls.CHAIN):
                    k += 1
                    while k < n and not lines[k]:
                        k += 1
                    if k < n and lines[k].startswith("Traceback (most recent call last):"):
                        i = k
                        continue
                    if k >= n:
                        return out, "\n".join(lines[start:] + [tail])
                i = k
                break
            root_frames, root_exc = blocks[0]
            outer_frames = blocks[-1][0]
            raised = root_frames[-1] if root_frames else ("?", "?")
            ours = [f for b in blocks for f in b[0] if frame_origin(f[0]) == "app"]
            raised_in = short_frame(*raised)
            if ours and frame_origin(raised[0]) != "app":
                raised_in += f" (called from {short_frame(*ours[-1])})"
            if hint.startswith(("ERROR:", "--- Logging error")):
                printer = "a log line " + repr(shorten(hint, 70))
            elif outer_frames:
                printer = short_frame(*outer_frames[0])
            else:
                printer = "?"
            exc = root_exc.strip()
            out.append(Traceback(exc=shorten(exc, 300), raised_in=raised_in, printed_by=printer,
                                 origin="app" if ours else "gradio",
                                 refusal=exc.split(":")[0] == "gradio.exceptions.Error"))
        return out, tail


# --------------------------------------------------------------------------- calling


@dataclass
class Call:
    api: str
    args: list
    transport: str = "client"  # "client" (gradio_client) or "raw" (hand-made HTTP)
    mode: str = "valid"  # valid / one-bad / chaos / probe / upload / scenario
    note: str = ""  # what is special about it (which argument is bad, what the file is)
    timeout: float = CALL_TIMEOUT_S
    replay: bool = True  # replay on the twin when it succeeds
    info: Any = None  # the ModelInfo of a model file this call uploads
    served: list = field(default_factory=list)  # served files named in the arguments (urls)

    def describe(self, n: int = 160) -> str:
        args = ", ".join(shorten(repr(a), n) for a in self.args)
        return f"{self.api}({args}) via {self.transport}" + (f" [{self.note}]" if self.note else "")

    def sent_text(self) -> str:
        return json.dumps(self.args, default=repr, ensure_ascii=False) + " " + self.note


@dataclass
class Result:
    status: str  # "ok", "error", "hang", "transport"
    outputs: Any = None
    message: str | None = None
    seconds: float = 0.0


def json_body(data: list, session_hash: str) -> str:
    """A request body with NaN/Infinity literals and RawJSON pieces spliced in (what the client cannot send)."""
    raws: dict[str, str] = {}

    def sub(x):
        if isinstance(x, RawJSON):
            key = f"@@raw{len(raws)}@@"
            raws[key] = x.text
            return key
        if isinstance(x, list):
            return [sub(v) for v in x]
        if isinstance(x, dict):
            return {k: sub(v) for k, v in x.items()}
        return x

    text = json.dumps({"data": sub(data), "session_hash": session_hash}, allow_nan=True)
    for key, raw in raws.items():
        text = text.replace(json.dumps(key), raw)
    return text


def client_can_send(args: list) -> bool:
    """Whether gradio_client can carry these arguments (it refuses NaN and infinity, and it sends UTF-8
    without escapes, so a lone surrogate fails on this side before anything is sent)."""
    try:
        json.dumps(args, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
        return False
    return not any(isinstance(a, RawJSON) for a in args)


class Side:
    """One session of the app: a gradio_client Client, and its session hash for hand-made requests."""

    def __init__(self, url: str):
        from gradio_client import Client

        self.url = url
        self.client = Client(url, verbose=False, download_files=False, analytics_enabled=False)
        self.hash = self.client.session_hash
        self.http = httpx.Client()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        self.http.close()

    def call(self, call: Call) -> Result:
        t0 = time.perf_counter()
        try:
            if call.transport == "raw":
                r = self._raw(call)
            else:
                r = self._client(call)
        except Exception as exc:  # noqa: BLE001 - every failure is classified
            r = Result("transport", message=f"{type(exc).__name__}: {shorten(str(exc), 300)}")
        r.seconds = time.perf_counter() - t0
        return r

    def _client(self, call: Call) -> Result:
        from gradio_client.exceptions import AppError

        job = self.client.submit(*call.args, api_name=call.api)
        try:
            out = job.result(timeout=call.timeout)
        except TimeoutError:
            with contextlib.suppress(Exception):
                job.cancel()
            return Result("hang", message=f"no answer in {call.timeout:.0f} s")
        except AppError as exc:
            return Result("error", message=str(exc))
        except httpx.HTTPStatusError as exc:  # the app refused the request itself (ui/http.py): read its message
            if 400 <= exc.response.status_code < 500:
                try:
                    msg = exc.response.json().get("error")
                except ValueError:
                    msg = None
                return Result("error", message=msg if isinstance(msg, str) else f"HTTP {exc.response.status_code}")
            raise
        return Result("ok", outputs=list(out) if isinstance(out, tuple) else [out])

    def _raw(self, call: Call) -> Result:
        """POST /gradio_api/call/<name> with this session's hash, then read the event stream to its end."""
        name = call.api.lstrip("/")
        deadline = time.monotonic() + call.timeout
        r = self.http.post(f"{self.url}gradio_api/call/{name}", content=json_body(call.args, self.hash),
                           headers={"content-type": "application/json"}, timeout=call.timeout)
        if 400 <= r.status_code < 500:  # a refusal of the request itself: its message is checked too
            try:
                body = r.json()
                msg = body.get("error") or body.get("detail") if isinstance(body, dict) else None
            except ValueError:
                msg = None
            return Result("error", message=msg if isinstance(msg, str) else f"HTTP {r.status_code}: {r.text}")
        if r.status_code != 200:
            return Result("transport", message=f"HTTP {r.status_code}: {shorten(r.text, 200)}")
        event_id = r.json()["event_id"]
        event = data = None
        with self.http.stream("GET", f"{self.url}gradio_api/call/{name}/{event_id}", timeout=call.timeout) as s:
            for line in s.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event in ("complete", "error"):
                    data = line[5:].strip()
                    break
                if time.monotonic() > deadline:
                    return Result("hang", message=f"no answer in {call.timeout:.0f} s")
        if event == "complete":
            return Result("ok", outputs=json.loads(data))
        if event == "error":
            try:
                payload = json.loads(data)
            except (TypeError, ValueError):
                payload = data
            msg = payload.get("error") if isinstance(payload, dict) else payload
            return Result("error", message=msg if isinstance(msg, str) else None)
        return Result("transport", message="the event stream ended without a result")


TIME_RE = re.compile(r"\d[\d,.]*\s*(?:s\b|ms\b|tokens/s)")
PATH_RE = re.compile(r"(?:/[\w.@%+-]+){2,}")


def normalized(x: Any) -> Any:
    """An answer with what may differ between two sessions masked: file paths, urls, timings."""
    if isinstance(x, dict):
        if "path" in x and ("url" in x or "meta" in x):
            return "<file>"
        return {k: normalized(v) for k, v in x.items() if k not in ("url", "path")}
    if isinstance(x, (list, tuple)):
        return [normalized(v) for v in x]
    if isinstance(x, str):
        return PATH_RE.sub("<path>", TIME_RE.sub("<t>", x))
    return x


def first_difference(a: Any, b: Any, where: str = "") -> str:
    if type(a) is not type(b):
        return f"{where or 'answer'}: {shorten(repr(a), 120)} vs {shorten(repr(b), 120)}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b), key=str):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{where}.{k}")
    elif isinstance(a, list):
        if len(a) != len(b):
            return f"{where or 'answer'}: {len(a)} items vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return first_difference(x, y, f"{where}[{i}]")
    elif isinstance(a, str) and a != b:
        i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return f"{where}: …{a[max(0, i - 40) : i + 60]!r} vs …{b[max(0, i - 40) : i + 60]!r}"
    return f"{where}: {shorten(repr(a), 120)} vs {shorten(repr(b), 120)}"


# -------------------------------------------------------------------------- knowledge


@dataclass
class ModelInfo:
    layers: int
    heads: int
    prompts: list[str]


def builtin_models() -> dict[str, ModelInfo]:
    """The shipped models' shapes, from their files' config metadata (no weights are read)."""
    out = {}
    for name, b in BUILTIN_MODELS.items():
        try:
            with open(ASSETS / b.file, "rb") as f:
                (n,) = ST_HEADER.unpack(f.read(8))
                cfg = json.loads(json.loads(f.read(n))["__metadata__"]["config"])
            out[name] = ModelInfo(cfg["n_layers"], cfg["n_heads"], list(b.examples))
        except (OSError, ValueError, KeyError, struct.error):  # e.g. not there yet: /select_model tells later
            out[name] = ModelInfo(1, 1, list(b.examples))
    return out


BUILTINS = builtin_models()


class Knowledge:
    """What the fuzzer knows about its twin sessions: their models and the current text."""

    def __init__(self):
        self.models: dict[str, ModelInfo] = copy.deepcopy(BUILTINS)
        self.text: dict[str, Any] | None = None  # model_name, prompt, seed of the current text
        self.view: dict[str, Any] | None = None

    def learn(self, ep: Endpoint, call: Call, outputs: list) -> None:
        """Update from a successful call (the same answer came back on both twins)."""
        if call.transport == "raw":  # hand-made requests get the state outputs back too (as null)
            outputs = list(outputs)
            while len(outputs) > len(ep.returns) and None in outputs:
                outputs.remove(None)
        named = {p.name: a for p, a in zip(ep.params, call.args)}
        by_label = dict(zip(ep.returns, outputs))
        model = named.get("model_name")
        dd = by_label.get("Model")
        if isinstance(dd, dict) and isinstance(dd.get("choices"), list):
            names = [c[1] if isinstance(c, (list, tuple)) else c for c in dd["choices"]]
            for gone in set(self.models) - set(names):
                del self.models[gone]
            new = dd.get("value")
            if isinstance(new, str) and (new not in self.models or ep.name.endswith(("train", "upload_model"))):
                info = ModelInfo(1, 1, [])  # (a name can come back for another model once the first was dropped)
                if ep.name.endswith("train"):
                    with contextlib.suppress(TypeError, ValueError):
                        info = ModelInfo(int(named["layers"]), int(named["heads"]),
                                         [CORPUS_PROMPTS.get(named.get("corpus_name"), "a")])
                elif call.info is not None:
                    info = call.info
                self.models[new] = info
        if ep.name.endswith("select_model") and isinstance(model, str) and model in self.models:
            info = self.models[model]
            layer, head, prompt = by_label.get("Layer"), by_label.get("Head"), by_label.get("Prompt")
            if isinstance(layer, dict) and isinstance(layer.get("choices"), list):
                info.layers = len(layer["choices"])
            if isinstance(head, dict) and isinstance(head.get("choices"), list):
                info.heads = max(1, len(head["choices"]) - 1)
            if isinstance(prompt, dict) and isinstance(prompt.get("value"), str) and prompt["value"].strip():
                if prompt["value"] not in info.prompts:
                    info.prompts.insert(0, prompt["value"])
        if ep.name.endswith(("/step", "/generate")):
            self.text = {k: named.get(k) for k in ("model_name", "prompt", "seed")}
            self.view = {k: named.get(k) for k in ("layer", "head", "view")}
        elif ep.name.endswith(("/reset", "/select_model")):
            self.text = None


# ---------------------------------------------------------------------------- the stats


@dataclass
class Defect:
    kind: str
    outcome: str
    origin: str
    reach: str
    count: int = 0
    example: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "class": self.outcome, "origin": self.origin, "reach": self.reach,
                "count": self.count, "example": self.example}


class Stats:
    def __init__(self):
        self.t0 = time.perf_counter()
        self.calls = 0
        self.replays = 0
        self.outcomes: Counter = Counter()
        self.per_endpoint: dict[str, Counter] = {}
        self.per_mode: dict[str, Counter] = {}  # valid / one-bad / chaos / probe / upload / scenario
        self.refusals: Counter = Counter()  # clean refusal messages by signature
        self.defects: dict[str, Defect] = {}
        self.tracebacks: Counter = Counter()
        self.state_changes_on_refusal = 0
        self.inconclusive = 0  # twin replays turned away by a rate limit or a full server
        self.seconds: list[float] = []

    def defect(self, kind: str, outcome: str, origin: str, reach: str, example: dict) -> None:
        d = self.defects.get(kind)
        if d is None:
            d = self.defects[kind] = Defect(kind, outcome, origin, reach, example=example)
        d.count += 1

    def summary(self) -> dict:
        wall = time.perf_counter() - self.t0
        return {
            "calls": self.calls, "twin_replays": self.replays,
            "outcomes": {k: self.outcomes.get(k, 0) for k in OUTCOMES},
            "per_endpoint": {k: dict(v) for k, v in sorted(self.per_endpoint.items())},
            "per_mode": {k: dict(v) for k, v in sorted(self.per_mode.items())},
            "state_changes_on_refusal": self.state_changes_on_refusal, "inconclusive_replays": self.inconclusive,
            "tracebacks": dict(self.tracebacks.most_common()),
            "defect_kinds": dict(Counter(f"{d.origin} via {d.reach}" for d in self.defects.values())),
            "defects": sorted((d.as_dict() for d in self.defects.values()), key=lambda d: -d["count"]),
            "clean_refusal_kinds": len(self.refusals), "top_clean_refusals": dict(self.refusals.most_common(12)),
            "wall_s": round(wall, 1), "calls_per_s": round(self.calls / wall, 2) if wall else None,
            "median_call_ms": round(1000 * sorted(self.seconds)[len(self.seconds) // 2], 1) if self.seconds else None,
        }


# ---------------------------------------------------------------------------- the fuzzer

WEIGHTS = {"/step": 24, "/generate": 10, "/undo": 10, "/reset": 5, "/select_model": 7, "/positional": 5,
           "/train": 6, "/stop": 4, "/upload_model": 5}
NEW_ENDPOINT_WEIGHT = 6  # an endpoint not listed above (added later) still gets its share


class Fuzzer:
    """Sends calls to twin sessions of a running app, checks each answer, counts outcomes and defects."""

    def __init__(self, url: str, log_path: Path | None = None, server_dirs: list[str] | None = None,
                 workdir: Path | None = None, stats: Stats | None = None):
        self.url = url
        self.log = LogWatch(log_path)
        self.server_dirs = [str(ROOT), *(server_dirs or [])]
        self.own_tmp = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="fz-uploads-")) if workdir is None else workdir
        self.files = Files(self.workdir)
        self.stats = stats or Stats()
        self.a: Side | None = None
        self.b: Side | None = None
        self.endpoints: dict[str, Endpoint] = {}
        self.know = Knowledge()
        self.suspects: list[str] = []  # refused calls since the twins last agreed
        self.served: list[dict] = []  # files the server served (FileData), for cross-session probes
        self.previous: tuple[Call | None, dict] = (None, {"call": "(before the first call)"})
        self.last: Result | None = None
        self.new_pair()
        self.endpoints = discover(self.a.client)

    # -- sessions

    def new_pair(self) -> None:
        for s in (self.a, self.b):
            if s is not None:
                s.close()
        self.a, self.b = Side(self.url), Side(self.url)
        self.know = Knowledge()
        self.suspects = []

    def close(self) -> None:
        for s in (self.a, self.b):
            if s is not None:
                s.close()
        time.sleep(0.3)
        self.attribute(self.log.read())
        if self.own_tmp:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- values

    def numeric_range(self, p: Param) -> tuple[float, float] | None:
        lo, hi = LIMITS.get(p.name, (p.lo, p.hi))
        if lo is None or hi is None:
            return None
        if p.lo is not None:
            lo, hi = max(lo, p.lo), min(hi, p.hi)
        return lo, hi

    def is_int(self, p: Param) -> bool:
        return p.name in INTEGERS or p.type == "integer"

    def file_value(self, p: Param, draw, call: Call) -> Any:
        from gradio_client import handle_file

        if p.name == "path" or "safetensors" in p.label.lower() or "model" in p.label.lower():
            path, label, info = self.files.checkpoint(draw)
            call.info = ModelInfo(info["layers"], info["heads"], [info["prompt"]])
        else:
            path, label = self.files.text(draw, valid=True)
        call.note = (call.note + "; " if call.note else "") + label
        return handle_file(str(path))

    def valid_value(self, p: Param, draw, call: Call, ctx: dict) -> Any:
        name, info = p.name, ctx.get("info")
        if name == "model_name":
            return ctx["model"]
        if name == "prompt":
            prompts = info.prompts if info and info.prompts else [p.default or "a"]
            prompt = draw.choice(prompts)
            if draw.chance(0.1):  # longer than the context: cropped with a notice
                prompt = (prompt + " ") * 12 if " " in prompt else prompt * 12
            return prompt[:MAX_PROMPT_CHARS]
        if name == "layer":
            return draw.integer(0, max(0, (info.layers if info else 1) - 1))
        if name == "head":
            n = info.heads if info else 1
            return "all" if draw.chance(0.4) else draw.integer(0, max(0, n - 1))
        if name == "seed":
            return draw.choice(SEEDS) if draw.chance(0.8) else draw.integer(*SEED_RANGE)
        if name == "max_new":
            return draw.integer(1, 12) if draw.chance(0.9) else MAX_NEW_TOKENS
        if name == "temperature" and draw.chance(0.25):
            return 0.0
        if name == "steps":
            lo = int(self.numeric_range(p)[0])
            return draw.integer(lo, lo + 2)
        if name in TINY:
            return draw.choice(TINY[name])
        if name == "corpus_name":
            return ctx.setdefault("corpus", draw.choice(p.enum or ["sort"]))
        if name == "pasted":
            return TEXT if ctx.get("corpus") == "text" or draw.chance(0.2) else ""
        if p.component == "File":
            if ctx.get("corpus") == "text" and draw.chance(0.3) or p.name == "path":
                return self.file_value(p, draw, call)
            return None
        if p.enum:
            return draw.choice(p.enum)
        rng = self.numeric_range(p)
        if rng is not None:
            lo, hi = rng
            if self.is_int(p):
                return draw.integer(int(math.ceil(lo)), int(math.floor(hi)))
            return draw.choice([lo, hi, round(draw.uniform(lo, hi), 4)])
        if p.type in ("number", "integer"):
            return p.default if isinstance(p.default, (int, float)) else 0
        if p.type == "boolean":
            return draw.chance(0.5)
        return p.default if p.default is not None else p.example

    def edge_value(self, p: Param, draw, raw: bool) -> tuple[Any, str]:
        """A value of about the right type at or past the edge of what is allowed."""
        rng = self.numeric_range(p)
        if rng is not None or p.type in ("number", "integer"):
            lo, hi = rng or (0, 1)
            options = [(lo, "low bound"), (hi, "high bound"), (lo - 1, "below low"), (hi + 1, "above high"),
                       (hi + 0.001, "just above high"), (lo - 1e-9, "just below low"), (HUGE, "10**400"),
                       (-HUGE, "-10**400"), (2**63, "2**63"), (1e308, "1e308"), (0, "0"), (-1, "-1"), (True, "True")]
            if self.is_int(p):
                options += [(2.5, "2.5 for a whole number"), (lo + 0.5, "low + 0.5"), (float(hi), "float high"),
                            (str(int(lo)), "whole number as text"), (" 1 ", "padded text number")]
            if raw:
                options += [(float("nan"), "NaN"), (float("inf"), "Infinity"), (float("-inf"), "-Infinity")]
            return draw.choice(options)
        if p.enum:
            e = draw.choice(p.enum)
            options = [(str(e).upper(), "choice in upper case"), (f" {e} ", "choice with spaces"),
                       (str(e) + "\x00", "choice + NUL"), ([e], "choice in a list"), ("", "empty"),
                       (str(e) if not isinstance(e, str) else e + "x", "near choice")]
            if p.name == "model_name":
                options += [("my sort model", "someone's trained model"), ("uploaded: m", "someone's upload"),
                            ("grammar (built-in) ", "trailing space")]
            if p.name in ("layer", "head"):
                options += [(99, "99"), (-1, "-1"), ("1", "number as text"), (1.0, "1.0")]
            return draw.choice(options)
        if p.name == "prompt" or p.component == "Textbox":
            options = [("", "empty"), ("  \n\t ", "blank"), ("a" * (MAX_PROMPT_CHARS + 1), "limit + 1"),
                       ("a" * MAX_PROMPT_CHARS, "at the limit"), ("zebra qqq", "unknown words"),
                       ("\u0000\u0001\u001f", "control characters"), ("\ud83d", "lone surrogate"),
                       ("x" * 1_000_000, "1 MB"), ("\u202e\u200b\ufeff", "format characters"),
                       ("<EOS>", "<EOS> alone"), (TEXT * 3, "3 training texts")]
            return draw.choice(options)
        if p.component == "File":
            if raw:
                return self.raw_filedata(draw)
            from gradio_client import handle_file

            what = draw.choice(["hostile checkpoint", "text file", "checkpoint"])
            if what == "hostile checkpoint":
                path, label, _ = self.files.hostile(draw)
            elif what == "text file":
                path, label = self.files.text(draw)
            else:
                path, label, _ = self.files.checkpoint(draw)
            return handle_file(str(path)), label
        label, value = draw.choice(JUNK)
        return value, label

    def raw_filedata(self, draw) -> tuple[Any, str]:
        """FileData naming a server path nobody uploaded, or a file the server served to a session."""
        if self.served and draw.chance(0.4):
            f, name = draw.choice(self.served), draw.choice(["x.safetensors", "x.txt"])
            return ({"path": f["path"], "meta": FILEDATA_META, "orig_name": name},
                    f"a served file's path, named {name!r}")
        p = draw.choice(SERVER_PATHS)
        fd = {"path": p, "meta": FILEDATA_META}
        if p.startswith("http"):
            fd = {"path": "x.safetensors", "url": p, "meta": FILEDATA_META}
        return fd, f"FileData naming {p!r}"

    def junk_value(self, draw, raw: bool) -> tuple[Any, str]:
        label, value = draw.choice(JUNK + (RAW_JUNK if raw else []))
        return value, label

    def build(self, ep: Endpoint, draw, mode: str | None = None, transport: str | None = None) -> Call:
        """A call of `ep`: all valid, one argument bad, or every argument from anywhere."""
        mode = mode or draw.choice(["valid", "valid", "valid", "one-bad", "one-bad", "one-bad", "chaos"])
        raw = transport == "raw" or (transport is None and draw.chance(0.12))
        call = Call(ep.name, [], "raw" if raw else "client", mode,
                    timeout=TRAIN_TIMEOUT_S if ep.name.endswith("train") else CALL_TIMEOUT_S)
        ctx: dict = {}
        if any(p.name == "model_name" for p in ep.params):
            t = self.know.text
            if t and t.get("model_name") in self.know.models and draw.chance(0.5):
                ctx["model"] = t["model_name"]
            else:
                ctx["model"] = draw.choice(sorted(self.know.models))
            ctx["info"] = self.know.models[ctx["model"]]
        elif self.know.text and self.know.text.get("model_name") in self.know.models:
            ctx["info"] = self.know.models[self.know.text["model_name"]]
        bad = draw.index(len(ep.params)) if mode == "one-bad" and ep.params else -1
        notes = []
        for i, p in enumerate(ep.params):
            if mode == "chaos":
                kind = draw.choice(["valid", "edge", "junk"])
            else:
                kind = "valid" if i != bad else draw.choice(["edge", "edge", "junk"])
            if kind == "valid":
                v = self.valid_value(p, draw, call, ctx)
                if p.name == "prompt" and self.know.text and self.know.text.get("model_name") == ctx.get("model") \
                        and draw.chance(0.6):
                    v = self.know.text["prompt"]  # continue the current text more often than not
                if p.name == "seed" and self.know.text and draw.chance(0.6):
                    v = self.know.text["seed"]
            elif kind == "edge":
                v, label = self.edge_value(p, draw, raw)
                notes.append(f"{p.name}: {label}")
            else:
                v, label = self.junk_value(draw, raw)
                notes.append(f"{p.name}: {label}")
            call.args.append(v)
        if raw and draw.chance(0.05):  # the wrong number of arguments
            if call.args and draw.chance(0.5):
                call.args.pop()
                notes.append("one argument too few")
            else:
                call.args.append(0)
                notes.append("one argument too many")
        if raw and any(isinstance(a, dict) and str(a.get("path", "")).startswith(str(self.workdir)) for a in call.args):
            call.transport = "client"  # a local file needs gradio_client to upload it
        if not raw and not client_can_send(call.args):
            call.transport = "raw"
        for a in call.args:
            if isinstance(a, dict) and any(a.get("path") == f["path"] for f in self.served):
                call.served.append(next(f for f in self.served if f["path"] == a.get("path")))
                call.replay = False
        call.note = "; ".join(filter(None, [*notes, call.note]))
        return call

    # -- one call, checked

    def run(self, call: Call, side: Side | None = None, twin: bool = True) -> str:
        """Send `call` to session A (or `side`), check the answer, replay a success on the twin."""
        side = side or self.a
        self.attribute(self.log.read())  # printed after the previous call had its answer (e.g. an HTTP 500)
        res = self.last = side.call(call)
        if res.status == "transport":
            time.sleep(0.3)  # a server error's traceback may be printed after the answer went out
        tbs = self.log.read()
        self.stats.calls += 1
        self.stats.seconds.append(res.seconds)
        outcome, reasons = self.classify(call, res)
        example = {"call": call.describe(), "mode": call.mode, "got": shorten(res.message or "", 300),
                   "seconds": round(res.seconds, 3)}
        ep = self.endpoints.get(call.api)
        if res.status == "ok":
            self.collect_served(res.outputs, call)
            if twin and side is self.a and call.replay and ep is not None:
                rb = self.b.call(call)
                tbs += self.log.read()
                self.stats.replays += 1
                same = rb.status == "ok" and normalized(res.outputs) == normalized(rb.outputs)
                if rb.status == "error" and re.search(INCONCLUSIVE, rb.message or ""):
                    self.stats.inconclusive += 1  # the twin was turned away for load, not for its state
                    self.new_pair()
                elif rb.status == "hang":
                    outcome = "hang"
                    res = Result("hang", message=f"the twin's replay: {rb.message}")
                elif not same:
                    outcome = "state-changed"
                    diff = (first_difference(normalized(res.outputs), normalized(rb.outputs)) if rb.status == "ok"
                            else f"the twin got {rb.status}: {shorten(rb.message or '', 200)}")
                    if self.suspects:
                        self.stats.state_changes_on_refusal += 1
                        kind = f"state-changed: {call.api} answered differently after refused calls"
                    else:
                        kind = (f"state-changed: {call.api} answered differently with no refused call before "
                                "(nondeterminism?)")
                    self.stats.defect(kind, outcome, "app", call.transport, {
                        **example, "difference": diff, "refused_calls_before": self.suspects[-5:]})
                    self.new_pair()
                else:
                    self.suspects.clear()
                    self.know.learn(ep, call, res.outputs)
            elif not call.replay and side is self.a:
                self.new_pair()  # A now has what B has not (a call that could not be replayed)
        elif res.status == "error":
            self.suspects.append(call.describe(100))
        if call.served and not self.check_served(call, example):
            outcome = "state-changed"
        self.previous = (call, example)
        self.attribute(tbs)
        if outcome in ("refused-leaky", "unexpected", "hang"):
            cause = next((tb for tb in tbs if not tb.refusal), None) or next(iter(tbs), None)
            origin = cause.origin if cause else "app"
            detail = f" <- {cause.exc.split(':')[0]} in {cause.raised_in}" if cause else ""
            if outcome == "refused-leaky":
                what = "; ".join(r.split(":")[0] for r in reasons)
            elif res.status == "error":
                what = "generic error" if res.message else "error: null"
            else:
                what = signature(res.message or res.status)
            kind = f"{outcome}: {call.api} {what}{detail}"
            self.stats.defect(kind, outcome, origin, call.transport, {**example, "why": reasons,
                                                                      "exception": cause.exc if cause else None})
            if outcome == "hang":
                self.new_pair()
        elif outcome == "refused-clean":
            self.stats.refusals[f"{call.api}: {signature(res.message)}"] += 1
        self.stats.outcomes[outcome] += 1
        self.stats.per_endpoint.setdefault(call.api, Counter())[outcome] += 1
        self.stats.per_mode.setdefault(f"{call.mode} via {call.transport}", Counter())[outcome] += 1
        return outcome

    def attribute(self, tbs: list[Traceback]) -> None:
        """Count the tracebacks the server printed, each with the call that made it."""
        call, example = self.previous
        for tb in tbs:
            self.stats.tracebacks[tb.kind] += 1
            self.stats.defect(tb.kind, "traceback", tb.origin, call.transport if call else "?",
                              {**example, "exception": tb.exc})

    def classify(self, call: Call, res: Result) -> tuple[str, list[str]]:
        if res.status == "ok":
            return "ok", []
        if res.status == "hang":
            return "hang", [res.message]
        if res.status == "transport":
            return "unexpected", [res.message]
        msg = res.message
        if not msg or any(g in msg for g in GENERIC):
            return "unexpected", ["generic message" if msg else "no message (error: null)"]
        sent = call.sent_text() + " " + " ".join(self.know.models)  # a choices list names the session's models
        found = leaks(msg, sent, self.server_dirs)
        return ("refused-leaky", found) if found else ("refused-clean", [])

    def collect_served(self, outputs: Any, call: Call) -> None:
        def walk(x):
            if isinstance(x, dict):
                if isinstance(x.get("path"), str) and isinstance(x.get("url"), str) and x["url"].startswith("http"):
                    self.served.append({"path": x["path"], "url": x["url"], "by": call.api})
                    del self.served[:-8]
                else:
                    for v in x.values():
                        walk(v)
            elif isinstance(x, list):
                for v in x:
                    walk(v)

        walk(outputs)

    def check_served(self, call: Call, example: dict) -> bool:
        """True when every served file the call named is still served (HTTP 200)."""
        kept = True
        for f in call.served:
            try:
                code = httpx.get(f["url"], timeout=10).status_code
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            if code != 200:
                kept = False
                self.stats.defect(f"state-changed: {call.api} deleted a file the server had served to a session",
                                  "state-changed", "app", call.transport,
                                  {**example, "served_file": f["path"], "download_now": f"HTTP {code}"})
            self.served = [s for s in self.served if s is not f]
        return kept

    # -- actions

    def endpoint(self, draw) -> Endpoint:
        names = sorted(self.endpoints)
        weights = [WEIGHTS.get(n, NEW_ENDPOINT_WEIGHT) for n in names]
        k = draw.index(sum(weights))
        for n, w in zip(names, weights):
            if k < w:
                return self.endpoints[n]
            k -= w
        return self.endpoints[names[-1]]

    def random_call(self, draw, transport: str | None = None) -> str:
        ep = self.endpoint(draw)
        outcome = self.run(self.build(ep, draw, transport=transport))
        if outcome.startswith("refused") and draw.chance(0.5):
            self.probe(draw)
        return outcome

    def valid_calls(self, draw, n: int = 3) -> None:
        """A few valid calls in a row: long texts, trained and uploaded models, deeper states."""
        for _ in range(n):
            self.run(self.build(self.endpoint(draw), draw, mode="valid"))

    def probe(self, draw) -> str | None:
        """A call that shows the session's state: a Step continuing the current text, or an Undo."""
        t, v = self.know.text, self.know.view
        step, undo = self.endpoints.get("/step"), self.endpoints.get("/undo")
        if t is None or step is None or t.get("model_name") not in self.know.models:
            return None
        ep = undo if undo is not None and draw.chance(0.3) else step
        return self.run(self.with_args(self.build(ep, draw, mode="valid", transport="client"), "probe", "", **t, **v))

    def with_args(self, call: Call, mode: str, note: str, **named) -> Call:
        """`call` with the arguments of these names set (those its endpoint has)."""
        index = {p.name: i for i, p in enumerate(self.endpoints[call.api].params)}
        for k, value in named.items():
            if k in index and index[k] < len(call.args):
                call.args[index[k]] = value
        call.mode, call.note = mode, note
        call.transport = "client" if client_can_send(call.args) else "raw"
        return call

    def upload(self, draw) -> str | None:
        """A hostile (or sometimes valid) checkpoint through the upload endpoint."""
        ep = self.endpoints.get("/upload_model")
        if ep is None:
            return None
        from gradio_client import handle_file

        if draw.chance(0.85):
            path, label, info = self.files.hostile(draw)
        else:
            path, label, info = self.files.checkpoint(draw)
        call = Call(ep.name, [handle_file(str(path))], "client", "upload", note=label)
        call.info = ModelInfo(info["layers"], info["heads"], [info["prompt"]])
        outcome = self.run(call)
        if outcome.startswith("refused") and draw.chance(0.7):
            self.probe(draw)
        return outcome

    def train_stop(self, draw) -> None:
        """A long run on a third session: Explore works meanwhile, another session's Stop leaves it
        alone, its own Stop ends it within seconds and keeps the model."""
        train, stop, step = (self.endpoints.get(n) for n in ("/train", "/stop", "/step"))
        if not (train and stop and step):
            return
        c, d = Side(self.url), Side(self.url)
        try:
            call = self.build(train, draw, mode="valid", transport="client")
            named = {p.name: i for i, p in enumerate(train.params)}
            call.args[named["steps"]] = int(self.numeric_range(train.params[named["steps"]])[1])
            call.args[named["corpus_name"]] = "sort"
            call.args[named["d_model"]], call.args[named["d_ff"]] = 32, 64
            call.mode, call.note = "scenario", "train-stop: a long run"
            job = c.client.submit(*call.args, api_name=call.api)
            t0 = time.perf_counter()
            while not job.outputs() and not job.done() and time.perf_counter() - t0 < 30:
                time.sleep(0.05)
            if job.done():  # finished before it could be stopped: nothing to check
                with contextlib.suppress(Exception):
                    job.result(timeout=60)
                return
            self.run(self.with_args(self.build(step, draw, mode="valid", transport="client"), "scenario",
                                    "train-stop: Explore while training", model_name="sort digits (built-in)",
                                    prompt="503124=", layer=0, head="all"), side=c, twin=False)
            self.run(Call("/stop", [], mode="scenario", note="train-stop: another session's Stop"), side=d, twin=False)
            time.sleep(1.2)
            if job.done():
                with contextlib.suppress(Exception):
                    status = str(job.result(timeout=5)[0])
                    if "stopped" in status:
                        self.stats.defect("state-changed: /stop in one session stopped another session's training",
                                          "state-changed", "app", "client",
                                          {"call": call.describe(), "status": shorten(status, 200)})
                return  # finished (or stopped) before its own Stop: nothing more to check
            self.run(Call("/stop", [], mode="scenario", note="train-stop: its own Stop"), side=c, twin=False)
            t1 = time.perf_counter()
            try:
                out = job.result(timeout=TRAIN_TIMEOUT_S)  # a hang guard: how soon it ends depends on the machine
            except Exception as exc:  # noqa: BLE001
                self.stats.defect(f"unexpected: training did not end after Stop ({type(exc).__name__})", "hang",
                                  "app", "client", {"call": call.describe(), "got": shorten(str(exc), 200)})
                return
            waited = time.perf_counter() - t1
            status, model = out[0], out[2].get("value") if isinstance(out[2], dict) else None
            if not str(status).startswith(("Training stopped by you", "Training finished")):
                self.stats.defect("unexpected: Stop did not end the run with 'stopped by you'",
                                  "unexpected", "app", "client",
                                  {"call": call.describe(), "status": shorten(str(status), 200),
                                   "waited_s": round(waited, 2)})
            if model:
                self.run(self.with_args(self.build(step, draw, mode="valid", transport="client"), "scenario",
                                        "train-stop: the stopped run's model", model_name=model, prompt="503124=",
                                        layer=0, head="all"), side=c, twin=False)
        finally:
            c.close()
            d.close()

    def act(self, draw) -> None:
        """One action of the fuzzer, chosen by `draw`."""
        k = draw.index(1000)
        if k < 80:
            self.upload(draw)
        elif k < 83:
            self.train_stop(draw)
        elif k < 130:
            self.random_call(draw, transport="raw")
        elif k < 200:
            self.valid_calls(draw)
        else:
            self.random_call(draw)


# --------------------------------------------------------------------------------- main


def run_fuzz(url: str, calls: int, seed: int, log_path: Path | None, server_dirs: list[str],
             progress: Callable[[dict], None] | None = None, every: int = 500) -> dict:
    fz = Fuzzer(url, log_path, server_dirs)
    draw = RandomDraw(random.Random(seed))
    next_report = every
    try:
        while fz.stats.calls < calls:
            fz.act(draw)
            if progress and fz.stats.calls >= next_report:
                next_report += every
                s = fz.stats
                progress({"calls": s.calls, "outcomes": dict(s.outcomes), "defect_kinds": len(s.defects),
                          "calls_per_s": round(s.calls / (time.perf_counter() - s.t0), 1)})
        time.sleep(0.5)
    finally:
        fz.close()
    out = fz.stats.summary()
    out["endpoints"] = {name: [p.name for p in ep.params] for name, ep in sorted(fz.endpoints.items())}
    return out


def main() -> None:
    p = parser("fuzz", __doc__)
    p.add_argument("--calls", type=int, default=10_000, help="calls to send (twin replays not counted)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random choices")
    p.add_argument("--url", default=None, help="fuzz an app that is already running (default: start one)")
    p.add_argument("--log", default=None, help="with --url: the file the app writes its output to")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the app it started
    server = None
    tmp = Path(tempfile.mkdtemp(prefix="fuzz-app-"))
    try:
        if args.url:
            url, log_path, dirs = args.url, Path(args.log) if args.log else None, []
        else:
            server = AppServer({"DECODER_LAB_TRAIN_SECONDS": "60"}, tmp).start()
            url, log_path, dirs = server.url, server.log_path, [str(tmp)]

        def progress(row):
            print(json.dumps({"bench": "fuzz_progress", **row}), file=sys.stderr, flush=True)

        out = run_fuzz(url, args.calls, args.seed, log_path, dirs, progress)
        if server is not None:
            log = server.output()
            out["server_log"] = {"traceback_lines": log.count("Traceback (most recent call last)"),
                                 "unexpected_error_lines": log.count("unexpected error in"),
                                 "refused_lines": log.count(":refused ")}
        emit("fuzz", seed=args.seed, **out)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
