"""Turning values from a form or the API into checked Python values, with messages for people.

Everything a person (or a client of the API) sends arrives here first; what passes is a plain
int, float or str inside the limits of `lab.limits`, and what fails raises `UserError`, whose
message is shown to the person as is.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from model.generate import Sampling

from .limits import SEED_RANGE, TEMPERATURE_RANGE, TOP_K_RANGE, TOP_P_RANGE


class UserError(ValueError):
    """A problem with what the person asked for; its message is shown to them as is."""


def _shown(value: Any) -> str:
    """What was sent, for a message: short scalars as they are, anything else by its kind only
    (a message never echoes a structure back, nor a Python type name)."""
    if value is None:
        return "nothing"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**12:
        return "a number that is far too large"
    if not isinstance(value, (str, int, float, bool)):
        return "a value of the wrong kind"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "…"


def check_int(name: str, value: Any, lo: int, hi: int) -> int:
    """A whole number in [lo, hi], from a UI/API value that may be a float, a numeric string or junk."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise UserError(f"{name} must be a whole number between {lo} and {hi}; got {_shown(value)}") from None
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
