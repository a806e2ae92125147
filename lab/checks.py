"""Turning values from a form or the API into checked Python values, with messages for people.

Everything a person (or a client of the API) sends arrives here first; what passes is a plain
int, float or str inside the limits of `lab.limits`, and what fails raises `UserError`, whose
message is shown to the person as is.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

from model.generate import Sampling
# model/'s one copy of these checks of untrusted values serves lab/ and ui/ too (imported from here)
from model.json_bounds import is_int, is_whole, short, unique_keys  # noqa: F401

from .limits import SEED_RANGE, TEMPERATURE_RANGE, TOP_K_RANGE, TOP_P_RANGE


class UserError(ValueError):
    """A problem with what the person asked for; its message is shown to them as is."""


def quoted(text: Any, limit: int = 40) -> str:
    """Text someone sent, as a message repeats it: cut to `limit` characters (the last one "…") and
    quoted as Python writes a string, so that every character that is not printable (NUL and other
    controls, line breaks, direction overrides, a lone surrogate that arrived as JSON's \\udfff) is an
    escape such as \\x00 or \\udfff. The message stays one line of valid UTF-8, which a browser shows
    and gradio can send (it cannot send a lone surrogate at all)."""
    text = text if isinstance(text, str) else str(text)
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def _shown(value: Any) -> str:
    """What was sent, for a message: short scalars as they are, anything else by its kind only
    (a message never echoes a structure back, nor a Python type name)."""
    if value is None:
        return "nothing"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    if is_int(value) and abs(value) > 10**12:
        return "a number that is far too large"
    if not isinstance(value, (str, int, float, bool)):
        return "a value of the wrong kind"
    if isinstance(value, str):
        return quoted(value)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "…"


# A number written as text, the one way the lab reads one: ASCII digits with an optional sign, decimal
# point and exponent ("3", " -2 ", "0.5", "1e3"). Python's own int() and float() also take other scripts'
# digits ("٣"), underscores ("1_000"), "nan" and "inf", and str.isdigit() is true of "①" and "²", which
# int() then refuses with a Python message: none of that reaches a check here.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
MAX_NUMBER_CHARS = 40


def number_from_text(text: Any) -> float | None:
    """The number `text` writes (see _NUMBER), or None when it is not text that writes one."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if len(text) > MAX_NUMBER_CHARS or not _NUMBER.fullmatch(text):
        return None
    return float(text)


def whole_numbers(text: Any, sep: str, count: int) -> list[int] | None:
    """`count` whole numbers of at least 0 written as text between `sep` ("1,0,4,2"; "1366x900"), as the
    page sends a clicked cell or a window's size; None when `text` is anything else."""
    parts = text.split(sep) if isinstance(text, str) else []
    numbers = [number_from_text(p) for p in parts]
    if len(numbers) != count or any(n is None or n < 0 or not n.is_integer() for n in numbers):
        return None
    return [int(n) for n in numbers]


def check_text(name: str, value: Any, *, optional: bool = False) -> str | None:
    """`value` when it is text (or None, when `optional`); refused by name otherwise."""
    if isinstance(value, str) or (optional and value is None):
        return value
    raise UserError(f"{name} must be text; got {_shown(value)}.")


def check_int(name: str, value: Any, lo: int, hi: int) -> int:
    """A whole number in [lo, hi], from a UI/API value that may be a float, a numeric string or junk."""
    if isinstance(value, str):
        number = number_from_text(value)
        if number is None:
            raise UserError(f"{name} must be a whole number between {lo} and {hi}; got {_shown(value)}")
        value = number
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{name} must be a whole number between {lo} and {hi}; got {_shown(value)}")
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise UserError(f"{name} must be a whole number between {lo} and {hi}; got {_shown(value)}")
    if not lo <= value <= hi:
        raise UserError(f"{name} must be a whole number between {lo} and {hi}; got {_shown(value)}")
    return int(value)


def check_float(name: str, value: Any, lo: float, hi: float) -> float:
    """A finite number in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{name} must be a number between {lo} and {hi}; got {_shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # a huge int
        raise UserError(f"{name} must be a number between {lo} and {hi}; got a number that is far too large") from None
    if not math.isfinite(number) or not lo <= number <= hi:
        raise UserError(f"{name} must be a number between {lo} and {hi}; got {_shown(value)}")
    return number


def check_choice(name: str, value: Any, options: Iterable[str]) -> str:
    """One of `options` (strings only)."""
    options = list(options)
    if isinstance(value, str) and len(value) > 60:
        value = value[:57] + "…"
    if not isinstance(value, str) or value not in options:
        raise UserError(f"{name} must be one of {', '.join(map(str, options))}; got {_shown(value)}")
    return value


def check_sampling(temperature: Any, top_k: Any, top_p: Any, seed: Any) -> Sampling:
    """The sampling settings of a Step or Generate, inside the limits."""
    return Sampling(
        temperature=check_float("temperature", temperature, *TEMPERATURE_RANGE),
        top_k=check_int("top-k", top_k, *TOP_K_RANGE),
        top_p=check_float("top-p", top_p, *TOP_P_RANGE),
        seed=check_int("seed", seed, *SEED_RANGE),
    )
