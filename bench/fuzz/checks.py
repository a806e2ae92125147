"""How an answer is judged: a refusal's message must carry no internal detail (`leaks`), and twin
answers are compared with file paths and timings masked (`normalized`, `first_difference`)."""

from __future__ import annotations

import re
from typing import Any

OUTCOMES = ("ok", "refused-clean", "refused-leaky", "unexpected", "state-changed", "hang")
GENERIC = ("Something went wrong", "has not enabled verbose error reporting")
MAX_MESSAGE_CHARS = 400  # the app's own messages stay under this (tests/engine/test_hostile_tokenizers.py)
# A twin's replay refused for one of these reasons says nothing about its state (the pair starts afresh).
INCONCLUSIVE = r"^Slow down|still busy|server is full"

# -------------------------------------------------------------------------- messages


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


# ---------------------------------------------------------------- twin answers compared

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
