"""Model configuration: one dataclass that describes every supported variant.

Every field is checked when the object is built, so a bad combination fails
early with a message that says which value to change, instead of surfacing as
a shape error deep inside a forward pass.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .json_bounds import is_whole, short

POS_ENCODINGS = ("sinusoidal", "learned", "rope", "none")
NORMS = ("pre", "post", "none")
ACTIVATIONS = ("relu", "gelu", "swiglu")
MASKS = ("causal", "bidirectional")
INITS = ("gpt2", "torch")
# Options the imported families need (model/families); each default is the engine's own behaviour.
ATTN_SCALES = ("inverse_sqrt", "none")  # scores times 1/sqrt(head_dim) (Vaswani et al.), or unscaled (GPT-Neo)
GELU_APPROXIMATIONS = ("none", "tanh")  # torch's names: exact erf GELU, or GPT-2's tanh form (`gelu_new`)
NORM_KINDS = ("layernorm", "rmsnorm")  # RMSNorm (Zhang & Sennrich 2019): no mean, no bias (Llama)
ROPE_PRECISIONS = ("float64", "float32")  # how RoPE's angles position x frequency are computed


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only transformer.

    d_ff=None means 4 * d_model; d_ff=0 removes the feed-forward sub-layer
    (as in the article 001 toy model). norm="none" removes all normalisation.

    Options of the imported families (every default is the engine's behaviour before them):

    * attn_scale: "inverse_sqrt" multiplies the scores by 1/sqrt(head_dim); "none" leaves them
      unscaled (GPT-Neo).
    * gelu_approximate: "none" is the exact GELU, "tanh" the tanh form GPT-2 calls gelu_new.
    * norm_kind, norm_eps: LayerNorm or RMSNorm, and the epsilon added to the variance.
    * rope_fraction: with pos_encoding="rope", the share of each head's dimensions that rotate
      (the first int(head_dim * rope_fraction), in consecutive pairs; the rest pass through).
      Pythia rotates 25 %. The base theta is pe_base.
    * rope_precision: "float64" computes the angles in double precision, then rounds them (the
      engine's own models); "float32" computes frequencies and angles in float32 as transformers
      does, so imported models turn by exactly the angles they were trained and are checked with
      (at position 8,000 the two differ by up to 5e-4 in a cosine).
    * parallel_residual: x + attn(norm1(x)) + mlp(norm2(x)) instead of one after the other
      (GPT-NeoX / Pythia); needs norm="pre".
    * attn_window: empty, or one number per layer: 0 attends to every earlier key, w > 0 only to
      the last w keys, the query's own included (GPT-Neo's local layers).
    * qkv_bias, attn_out_bias, mlp_bias, norm_bias: biases of each part; None follows `bias`.
    * n_kv_heads: key/value heads, shared by groups of n_heads / n_kv_heads query heads
      (grouped-query attention); None means one per query head. Attention is still one
      (T, T) map per query head, which is what the model multiplies V with.
    * vocab_used: the tokenizer's vocabulary when the embedding has more rows (padding); the
      rows from vocab_used on are never sampled. None means all of vocab_size.
    Tied or untied output head: tie_weights. A gated SiLU MLP (Llama): activation="swiglu".
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
    attn_scale: str = "inverse_sqrt"
    gelu_approximate: str = "none"
    norm_kind: str = "layernorm"
    norm_eps: float = 1e-5
    rope_fraction: float = 1.0
    rope_precision: str = "float64"
    parallel_residual: bool = False
    attn_window: tuple[int, ...] = ()
    qkv_bias: bool | None = None
    attn_out_bias: bool | None = None
    mlp_bias: bool | None = None
    norm_bias: bool | None = None
    n_kv_heads: int | None = None
    vocab_used: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layers", "n_heads", "d_model"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {short(value)}")
        if self.d_ff is not None and (
            not isinstance(self.d_ff, int) or isinstance(self.d_ff, bool) or self.d_ff < 0
        ):
            raise ValueError(f"d_ff must be a non-negative integer or None, got {short(self.d_ff)}")
        _choice("pos_encoding", self.pos_encoding, POS_ENCODINGS)
        _choice("norm", self.norm, NORMS)
        _choice("activation", self.activation, ACTIVATIONS)
        _choice("mask", self.mask, MASKS)
        _choice("init", self.init, INITS)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({short(self.d_model)}) must be divisible by n_heads ({short(self.n_heads)}); "
                f"try d_model={short(self.n_heads * max(1, _nearest(self.d_model, self.n_heads)))}"
            )
        if self.pos_encoding == "rope" and self.head_dim % 2:
            raise ValueError(
                f"RoPE rotates pairs of dimensions, so the head size d_model/n_heads must be even "
                f"(it is {self.head_dim}); change d_model or n_heads"
            )
        if self.pos_encoding == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal encoding needs an even d_model, got {self.d_model}")
        if not 0.0 <= _real("dropout", self.dropout, "in [0, 1)") < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {short(self.dropout)}")
        if not _real("pe_base", self.pe_base, "a number > 1") > 1.0:
            raise ValueError(f"pe_base must be a number > 1, got {short(self.pe_base)}")
        for name in ("bias", "head_bias", "tie_weights", "attn_out_proj", "parallel_residual"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {short(getattr(self, name))}")
        self._check_family_options()

    def _check_family_options(self) -> None:
        """The options the imported families brought in (see the class docstring)."""
        _choice("attn_scale", self.attn_scale, ATTN_SCALES)
        _choice("gelu_approximate", self.gelu_approximate, GELU_APPROXIMATIONS)
        _choice("norm_kind", self.norm_kind, NORM_KINDS)
        _choice("rope_precision", self.rope_precision, ROPE_PRECISIONS)
        if not 0.0 < _real("norm_eps", self.norm_eps, "a number in (0, 1)") < 1.0:
            raise ValueError(f"norm_eps must be a number in (0, 1), got {short(self.norm_eps)}")
        if not 0.0 < _real("rope_fraction", self.rope_fraction, "in (0, 1]") <= 1.0:
            raise ValueError(f"rope_fraction must be in (0, 1], got {short(self.rope_fraction)}")
        if self.rope_fraction != 1.0:
            if self.pos_encoding != "rope":
                raise ValueError("rope_fraction applies to pos_encoding='rope' only")
            if self.rope_dim == 0 or self.rope_dim % 2:
                raise ValueError(
                    f"rope_fraction {self.rope_fraction} rotates {self.rope_dim} of the head's {self.head_dim} "
                    "dimensions; RoPE needs an even number of them, at least 2"
                )
        for name in ("qkv_bias", "attn_out_bias", "mlp_bias", "norm_bias"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be true, false or None (follow bias), got {short(value)}")
        if self.parallel_residual and self.norm != "pre":
            raise ValueError("parallel_residual needs norm='pre' (each branch reads its own norm of x)")
        if self.norm_kind == "rmsnorm" and self.norm_bias:
            raise ValueError("RMSNorm has no bias; set norm_bias to false")
        window = self.attn_window
        if isinstance(window, list):  # JSON has no tuples: a config read from a file holds a list
            window = tuple(window)
            object.__setattr__(self, "attn_window", window)
        if not isinstance(window, tuple) or any(not is_whole(w) for w in window):
            raise ValueError(f"attn_window must be a list of whole numbers >= 0, got {short(window)}")
        if window and len(window) != self.n_layers:
            raise ValueError(f"attn_window has {len(window)} entries for {self.n_layers} layers; give one per layer")
        if window and any(window) and self.mask != "causal":
            raise ValueError("a local attention window needs the causal mask")
        kv = self.n_kv_heads
        if kv is not None and (not is_whole(kv) or kv == 0 or self.n_heads % kv):
            raise ValueError(f"n_kv_heads must divide n_heads ({self.n_heads}), got {short(kv)}")
        used = self.vocab_used
        if used is not None and (not is_whole(used) or not 0 < used <= self.vocab_size):
            raise ValueError(f"vocab_used must be a whole number from 1 to vocab_size ({self.vocab_size}), "
                             f"got {short(used)}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ff_dim(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def rope_dim(self) -> int:
        """Dimensions of each head that RoPE rotates (the first ones)."""
        if self.head_dim >= 2**53:  # a float would round it, or overflow: exact arithmetic
            return int(Fraction(self.head_dim) * Fraction(self.rope_fraction))
        return int(self.head_dim * self.rope_fraction)

    @property
    def kv_heads(self) -> int:
        """Key/value heads per layer (n_heads unless grouped-query attention)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    def part_bias(self, part: str) -> bool:
        """Whether `part` (qkv, attn_out, mlp or norm) has a bias: its own field, else `bias`."""
        own = getattr(self, f"{part}_bias")
        return self.bias if own is None else own

    def window(self, layer: int) -> int:
        """Keys layer `layer` may see, the query's own included; 0 means every earlier key."""
        return self.attn_window[layer] if self.attn_window else 0

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
        qkv_out = (self.n_heads + 2 * self.kv_heads) * self.head_dim
        bq, bo = int(self.part_bias("qkv")), int(self.part_bias("attn_out"))
        b, bn = int(self.part_bias("mlp")), int(self.part_bias("norm"))
        attn = d * qkv_out + bq * qkv_out + (d * d + bo * d if self.attn_out_proj else 0)
        f = self.ff_dim
        if f == 0:
            ffn = 0
        elif self.activation == "swiglu":
            ffn = 2 * (d * f + b * f) + f * d + b * d
        else:
            ffn = d * f + b * f + f * d + b * d
        norm_params = (d + bn * d) if self.norm != "none" else 0
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


def _nearest(a: int, b: int) -> int:
    """round(a / b) in whole numbers (ties to even, as round does), for numbers of any size."""
    q, r = divmod(a, b)
    return q + (2 * r > b or (2 * r == b and q % 2 == 1))


def _real(name: str, value: Any, rule: str) -> float:
    """A finite number (an int or a float, not a bool) as a float; anything else is a ValueError that says
    `name` must be `rule`, also a whole number too large for a float (which `float()` cannot convert)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be {rule}, got {short(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{name} must be {rule}, got a number far too large") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be {rule}, got {short(value)}")
    return number


def _choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}; got {short(value)}")
