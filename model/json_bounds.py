"""JSON from model files, bounded before it is parsed.

Python's `json` parses nested arrays and objects by recursion, so a file of 100,000 `[` ends in a
RecursionError, and a number of more than 4,300 digits in a ValueError that speaks of
`sys.set_int_max_str_digits`. Every JSON a model importer reads (config.json, the shard index,
tokenizer.json, tokenizer_config.json, a safetensors header) goes through `parse` or `read`:

* `read` refuses a file larger than its caller's byte cap before reading it;
* `nesting` measures how deeply the text nests, outside its strings, without parsing it (a scan
  of the bytes in blocks, so a hostile file costs memory in proportion to one block); a text
  nested deeper than MAX_DEPTH is refused (the files the importers read nest at most 6 levels);
* whatever `json` still refuses (bad syntax, a number too long) is a sentence naming the file.

It is also the one home of model/'s checks of the values such files hold (`is_int`, `is_whole`, `short`,
`unique_keys`): every model module imports these, and lab.checks passes them on to lab/ and ui/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .tokenizer_core import preview

MAX_DEPTH = 32
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string; its brackets are text, not nesting
_BLOCK = 1 << 22
_STEP = np.zeros(256, dtype=np.int64)  # what each byte does to the depth
_STEP[[ord("["), ord("{")]], _STEP[[ord("]"), ord("}")]] = 1, -1


def nesting(text: str | bytes) -> int:
    """How many arrays and objects deep `text` goes (brackets inside strings left out)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    outside = _STRING.sub(b"", data)
    depth = deepest = 0
    for start in range(0, len(outside), _BLOCK):
        block = np.frombuffer(outside, dtype=np.uint8, count=min(_BLOCK, len(outside) - start), offset=start)
        running = np.cumsum(_STEP[block]) + depth
        deepest, depth = max(deepest, int(running.max())), int(running[-1])
    return deepest


def parse(text: str | bytes, what: str, max_depth: int = MAX_DEPTH, **options: Any) -> Any:
    """`json.loads(text, **options)`, or a ValueError naming `what` (a file's name) in one sentence.
    A ValueError that an option's hook raises with `what` in its sentence passes as it is."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{what} is not UTF-8 text") from None
    if nesting(text) > max_depth:
        raise ValueError(f"{what} is nested too deeply (more than {max_depth} levels of arrays and objects; "
                         "a model file has a few), so it is not read")
    try:
        return json.loads(text, **options)
    except RecursionError:  # not reached after the scan above; kept so that no path can leak it
        raise ValueError(f"{what} is nested too deeply") from None
    except json.JSONDecodeError:
        raise ValueError(f"{what} is not valid JSON") from None
    except ValueError as exc:
        if what in str(exc):
            raise
        if "digits" in str(exc):  # Python refuses to read an integer of more than 4,300 digits
            raise ValueError(f"{what} holds a number with thousands of digits, which no model file needs") from None
        raise ValueError(f"{what} is not valid JSON") from None


def read(path: Path, what: str, max_bytes: int, max_depth: int = MAX_DEPTH, **options: Any) -> Any:
    """The JSON in the file at `path`, at most `max_bytes` long; a missing file is a ValueError too."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError:
        raise ValueError(f"the folder has no {path.name}") from None
    if size > max_bytes:
        raise ValueError(f"{path.name} is {size:,} bytes; a {what} is at most {max_bytes:,}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path.name} cannot be read ({exc.strerror or 'error'})") from None
    return parse(data, path.name, max_depth, **options)


# ---------------------------------------------------------------- Checks of untrusted values


def is_int(value: Any) -> bool:
    """An int that is not a bool (True is an int to Python, not to a file's reader)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_whole(value: Any) -> bool:
    """A whole number >= 0 (not a bool)."""
    return is_int(value) and value >= 0


def short(value: Any, limit: int = 40) -> str:
    """A value for an error message, cut to `limit` characters (it may come from an uploaded file)."""
    if is_int(value) and abs(value) > 10**limit:
        return "a number far too large"  # (repr of a huge int is slow, and refused past 4,300 digits)
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def unique_keys(what: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """A `json` object_pairs_hook refusing an object with two equal keys, the error naming `what`.

    `json` keeps the last of two equal keys and another parser (the Rust tokenizers one) might keep
    another: refusing them makes what a check read the only reading of the text."""
    def pairs_to_dict(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for key, value in pairs:
            if key in d:
                raise ValueError(f"{what} has a duplicate key {preview(key)}")
            d[key] = value
        return d
    return pairs_to_dict
