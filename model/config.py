"""Model configuration: one dataclass that describes every supported variant.

Every field is checked when the object is built, so a bad combination fails
early with a message that says which value to change, instead of surfacing as
a shape error deep inside a forward pass.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

POS_ENCODINGS = ("sinusoidal", "learned", "rope", "none")
NORMS = ("pre", "post", "none")
ACTIVATIONS = ("relu", "gelu", "swiglu")
MASKS = ("causal", "bidirectional")
INITS = ("gpt2", "torch")


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only transformer.

    d_ff=None means 4 * d_model; d_ff=0 removes the feed-forward sub-layer
    (as in the article 001 toy model). norm="none" removes all normalisation.
    """

    vocab_size: int
    block_size: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 64
    d_ff: int | None = None
    pos_encoding: str = "learned"
    norm: str = "pre"
    activation: str = "gelu"
    dropout: float = 0.0
    bias: bool = True
    head_bias: bool = False
    tie_weights: bool = False
    mask: str = "causal"
    attn_out_proj: bool = True
    pe_base: float = 10000.0
    init: str = "gpt2"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layers", "n_heads", "d_model"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {_short(value)}")
        if self.d_ff is not None and (
            not isinstance(self.d_ff, int) or isinstance(self.d_ff, bool) or self.d_ff < 0
        ):
            raise ValueError(f"d_ff must be a non-negative integer or None, got {_short(self.d_ff)}")
        _choice("pos_encoding", self.pos_encoding, POS_ENCODINGS)
        _choice("norm", self.norm, NORMS)
        _choice("activation", self.activation, ACTIVATIONS)
        _choice("mask", self.mask, MASKS)
        _choice("init", self.init, INITS)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}); "
                f"try d_model={self.n_heads * max(1, round(self.d_model / self.n_heads))}"
            )
        if self.pos_encoding == "rope" and self.head_dim % 2:
            raise ValueError(
                f"RoPE rotates pairs of dimensions, so the head size d_model/n_heads must be even "
                f"(it is {self.head_dim}); change d_model or n_heads"
            )
        if self.pos_encoding == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal encoding needs an even d_model, got {self.d_model}")
        if not 0.0 <= _real("dropout", self.dropout, "in [0, 1)") < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {_short(self.dropout)}")
        if not _real("pe_base", self.pe_base, "a number > 1") > 1.0:
            raise ValueError(f"pe_base must be a number > 1, got {_short(self.pe_base)}")
        for name in ("bias", "head_bias", "tie_weights", "attn_out_proj"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {_short(getattr(self, name))}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ff_dim(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "ModelConfig":
        """Build from untrusted data; unknown keys and wrong types are a ValueError."""
        if not isinstance(data, dict):
            raise ValueError(f"model config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config fields: {unknown}; known fields are {sorted(known)}")
        if "vocab_size" not in data:
            raise ValueError("model config is missing vocab_size")
        try:
            return cls(**data)
        except TypeError as exc:  # e.g. comparison of str with int inside validation
            raise ValueError(f"invalid model config: {exc}") from None

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def n_params(self) -> int:
        """Parameter count computed from the config alone (no allocation)."""
        d, v, L = self.d_model, self.vocab_size, self.n_layers
        b = 1 if self.bias else 0
        attn = 3 * (d * d + b * d) + (d * d + b * d if self.attn_out_proj else 0)
        f = self.ff_dim
        if f == 0:
            ffn = 0
        elif self.activation == "swiglu":
            ffn = 2 * (d * f + b * f) + f * d + b * d
        else:
            ffn = d * f + b * f + f * d + b * d
        norm_params = (d + b * d) if self.norm != "none" else 0
        per_layer = attn + ffn + 2 * norm_params
        total = v * d + L * per_layer
        if self.pos_encoding == "learned":
            total += self.block_size * d
        if self.norm == "pre":
            total += norm_params
        if not self.tie_weights:
            total += v * d
        if self.head_bias:
            total += v
        return total


def _short(value: Any, limit: int = 40) -> str:
    """A value for an error message, cut to `limit` characters (configs come from uploaded files)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**limit:
        return "a number far too large"  # (repr of a huge int is slow, and refused past 4,300 digits)
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _real(name: str, value: Any, rule: str) -> float:
    """A finite number (an int or a float, not a bool) as a float; anything else is a ValueError that says
    `name` must be `rule`, also a whole number too large for a float (which `float()` cannot convert)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be {rule}, got {_short(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{name} must be {rule}, got a number far too large") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be {rule}, got {_short(value)}")
    return number


def _choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}; got {_short(value)}")
