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
# "sandwich": a norm before and after each branch, the branch's output normalised before it joins the
# residual (Gemma 2/3); "post_branch": only that second norm (OLMo 2); both end in a final norm as "pre" does
NORMS = ("pre", "post", "none", "sandwich", "post_branch")
# gated ones ("swiglu", "geglu") hold the gate's rows, then the value's; "relu2" is relu(x)² (nanochat)
ACTIVATIONS = ("relu", "gelu", "swiglu", "geglu", "relu2")
GATED = ("swiglu", "geglu")
MASKS = ("causal", "bidirectional")
INITS = ("gpt2", "torch")
# Options the imported families need (model/families); each default is the engine's own behaviour.
ATTN_SCALES = ("inverse_sqrt", "none")  # scores times 1/sqrt(head_dim) (Vaswani et al.), or unscaled (GPT-Neo)
GELU_APPROXIMATIONS = ("none", "tanh")  # torch's names: exact erf GELU, or GPT-2's tanh form (`gelu_new`)
NORM_KINDS = ("layernorm", "rmsnorm")  # RMSNorm (Zhang & Sennrich 2019): no mean, no bias (Llama)
ROPE_PRECISIONS = ("float64", "float32")  # how RoPE's angles position x frequency are computed
# q/k normalisation before the rotary step: RMSNorm over each head's hs dimensions (Qwen3, Gemma 3), or
# over all heads of a position at once (OLMo 2: H*hs for queries, Hkv*hs for keys)
QK_NORMS = ("none", "head", "whole")
# rope_scaling, a tuple: () none; ("linear", factor): every inverse frequency divided by factor (Gemma 3's
# global layers); ("llama3", factor, low_freq_factor, high_freq_factor, original_positions): Llama 3.1's
# fixed change of the inverse frequencies (long wavelengths slowed by factor, short ones kept, a blend between)
# ("longrope", attention_factor, f_0, ..., f_{rd/2-1}): Phi-3's LongRoPE within its original context, where
# it uses its short factors: frequency i divided by f_i, cos and sin multiplied by attention_factor
ROPE_SCALINGS = {"linear": 1, "llama3": 4, "longrope": None}  # kind: how many numbers follow it (None: 1 + rd/2)


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
    * head_size: each head's width when it is not d_model / n_heads (Qwen3: 16 heads x 128 = 2048 for
      d_model 1024; Gemma); the output projection maps n_heads * head_size back to d_model.
    * qk_norm: RMSNorm of queries and keys before the rotary step ("head" or "whole", QK_NORMS).
    * query_scale_dim: the scores are multiplied by 1/sqrt(query_scale_dim) instead of 1/sqrt(head_dim)
      (Gemma's query_pre_attn_scalar). None: head_dim.
    * attn_softcap, logit_softcap: c * tanh(x / c) on the scaled scores before the mask, and on the
      logits (Gemma 2). None: no capping.
    * embed_scale: the token embedding is multiplied by this before the first block (Gemma: sqrt(d)).
    * norm_offset: every RMSNorm multiplies by (norm_offset + weight) (Gemma stores weight - 1: offset 1).
    * rope_scaling: a change of the rotary's inverse frequencies (ROPE_SCALINGS), on the layers that use
      pe_base. local_rope_base: layers with an attention window rotate with this base instead, unscaled
      (Gemma 3's local layers); None: they use pe_base too. rope_off_layers: layers that do not rotate
      at all (SmolLM3's NoPE layers).
    nanochat's options (Karpathy's nanochat, 2026; each off by default):
    * norm_weight: False makes every norm (RMSNorm only) parameter-free: x / sqrt(mean(x²) + eps), no weight
      in the model or its files (nanochat's norms, eps = float32's machine epsilon 2^-23).
    * embed_norm: a norm of the token embedding before anything else reads it.
    * smear_width: > 0 adds to each token's (normed) embedding a share of the previous token's:
      x_t += smear_lambda * sigmoid(x_t[:smear_width] . smear_gate) * x_(t-1), x_(t-1) before its own smear;
      the first token of a text is left as it is (a cache keeps the embeddings the next step needs).
    * x0_mix: block l reads resid_lambda_l * x + x0_lambda_l * x0 (x0: the stream after the embedding).
    * value_embed_layers: layers whose values gain a second embedding of each token, gated per key/value
      head: v += value_gate_scale * sigmoid(h[:value_gate_width] . ve_gate) * value_embed[token], h the
      block's normed input.
    * backout_layer: the stream after this block, times backout_lambda, is taken away before the final norm.
    * qk_gain: queries and keys times this after the q/k norm (nanochat: 1.2 after a parameter-free norm).
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
    head_size: int | None = None
    qk_norm: str = "none"
    query_scale_dim: int | None = None
    attn_softcap: float | None = None
    logit_softcap: float | None = None
    embed_scale: float = 1.0
    norm_offset: float = 0.0
    rope_scaling: tuple = ()
    local_rope_base: float | None = None
    rope_off_layers: tuple[int, ...] = ()
    norm_weight: bool = True
    embed_norm: bool = False
    smear_width: int = 0
    x0_mix: bool = False
    value_embed_layers: tuple[int, ...] = ()
    value_gate_width: int = 0
    value_gate_scale: float = 1.0
    backout_layer: int | None = None
    qk_gain: float = 1.0

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
        if self.head_size is not None and (not is_whole(self.head_size) or self.head_size == 0):
            raise ValueError(f"head_size must be a positive whole number or None, got {short(self.head_size)}")
        if self.head_size is None and self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({short(self.d_model)}) must be divisible by n_heads ({short(self.n_heads)}); "
                f"try d_model={short(self.n_heads * max(1, _nearest(self.d_model, self.n_heads)))}"
            )
        if self.pos_encoding == "rope" and self.head_dim % 2:
            raise ValueError(
                f"RoPE rotates pairs of dimensions, so the head size must be even "
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
        self._check_newer_options()

    def _check_newer_options(self) -> None:
        """The options of the 2024-26 families (Qwen, Gemma, OLMo 2, SmolLM3, Llama 3, nanochat)."""
        _choice("qk_norm", self.qk_norm, QK_NORMS)
        qsd = self.query_scale_dim
        if qsd is not None and (not is_whole(qsd) or qsd == 0):
            raise ValueError(f"query_scale_dim must be a positive whole number or None, got {short(qsd)}")
        for name in ("attn_softcap", "logit_softcap", "local_rope_base"):
            value = getattr(self, name)
            if value is not None and not _real(name, value, "a positive number or None") > 0:
                raise ValueError(f"{name} must be a positive number or None, got {short(value)}")
        if self.local_rope_base is not None and not self.local_rope_base > 1.0:
            raise ValueError(f"local_rope_base must be a number > 1, got {short(self.local_rope_base)}")
        if not _real("embed_scale", self.embed_scale, "a positive number") > 0:
            raise ValueError(f"embed_scale must be a positive number, got {short(self.embed_scale)}")
        if self.norm_offset not in (0.0, 1.0) or isinstance(self.norm_offset, bool):
            raise ValueError(f"norm_offset must be 0 or 1, got {short(self.norm_offset)}")
        if self.norm_offset and self.norm_kind != "rmsnorm":
            raise ValueError("norm_offset applies to RMSNorm only")
        if not self.attn_out_proj and self.attn_dim != self.d_model:
            raise ValueError("without an output projection the heads side by side must be d_model wide")
        if self.norm in ("sandwich", "post_branch") and self.parallel_residual:
            raise ValueError(f"norm={self.norm!r} cannot be combined with parallel_residual")
        for name in ("rope_scaling", "rope_off_layers"):
            if isinstance(getattr(self, name), list):  # a config read from JSON holds lists
                object.__setattr__(self, name, tuple(getattr(self, name)))
        scaling = self.rope_scaling
        count = ROPE_SCALINGS.get(scaling[0], -1) if isinstance(scaling, tuple) and scaling else 0
        if count is None:  # longrope: the attention factor, then one factor per rotated pair
            count = 1 + self.rope_dim // 2
        if not isinstance(scaling, tuple) or (scaling and (
                len(scaling) != 1 + count or not all(_positive(v) for v in scaling[1:]))):
            raise ValueError(f"rope_scaling must be (), ('linear', factor), ('llama3', factor, low_freq_factor, "
                             f"high_freq_factor, original_positions) or ('longrope', attention_factor, one factor "
                             f"per rotated pair) with positive numbers, got {short(scaling)}")
        if scaling and scaling[0] == "llama3" and not scaling[3] > scaling[2]:
            raise ValueError("rope_scaling llama3 needs high_freq_factor > low_freq_factor")
        off = self.rope_off_layers
        if not isinstance(off, tuple) or any(not is_whole(i) or i >= self.n_layers for i in off) \
                or len(set(off)) != len(off):
            raise ValueError(f"rope_off_layers must list distinct layers from 0 to {self.n_layers - 1}, "
                             f"got {short(off)}")
        if (scaling or off or self.local_rope_base is not None) and self.pos_encoding != "rope":
            raise ValueError("rope_scaling, rope_off_layers and local_rope_base apply to pos_encoding='rope' only")
        self._check_nanochat_options()

    def _check_nanochat_options(self) -> None:
        """nanochat's options (see the class docstring)."""
        for name in ("norm_weight", "embed_norm", "x0_mix"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {short(getattr(self, name))}")
        if not self.norm_weight and (self.norm_kind != "rmsnorm" or self.norm_offset):
            raise ValueError("norm_weight=false (parameter-free norms) applies to RMSNorm without norm_offset only")
        if self.embed_norm and self.norm == "none":
            raise ValueError("embed_norm needs a norm (norm is 'none')")
        if not is_whole(self.smear_width) or self.smear_width > self.d_model:
            raise ValueError(f"smear_width must be a whole number from 0 to d_model ({self.d_model}), "
                             f"got {short(self.smear_width)}")
        if isinstance(self.value_embed_layers, list):  # a config read from JSON holds a list
            object.__setattr__(self, "value_embed_layers", tuple(self.value_embed_layers))
        ve = self.value_embed_layers
        if not isinstance(ve, tuple) or any(not is_whole(i) or i >= self.n_layers for i in ve) \
                or len(set(ve)) != len(ve):
            raise ValueError(f"value_embed_layers must list distinct layers from 0 to {self.n_layers - 1}, "
                             f"got {short(ve)}")
        if ve and (not is_whole(self.value_gate_width) or not 0 < self.value_gate_width <= self.d_model):
            raise ValueError(f"value_gate_width must be a whole number from 1 to d_model ({self.d_model}) when "
                             f"value_embed_layers are given, got {short(self.value_gate_width)}")
        if not is_whole(self.value_gate_width):
            raise ValueError(f"value_gate_width must be a whole number, got {short(self.value_gate_width)}")
        for name in ("value_gate_scale", "qk_gain"):
            if not _real(name, getattr(self, name), "a positive number") > 0:
                raise ValueError(f"{name} must be a positive number, got {short(getattr(self, name))}")
        b = self.backout_layer
        if b is not None and (not is_whole(b) or b >= self.n_layers):
            raise ValueError(f"backout_layer must be a layer from 0 to {self.n_layers - 1} or None, got {short(b)}")
        if b is not None and not self.has_final_norm:
            raise ValueError("backout_layer needs a final norm (a pre-norm style)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads if self.head_size is None else self.head_size

    @property
    def attn_dim(self) -> int:
        """Width of all query heads side by side (n_heads * head_dim; d_model unless head_size says)."""
        return self.n_heads * self.head_dim

    @property
    def gated(self) -> bool:
        """Whether the MLP is gated (its `up` holds the gate's rows, then the value's)."""
        return self.activation in GATED

    def rope_base(self, layer: int) -> float | None:
        """The rotary base layer `layer` turns with; None when it does not rotate."""
        if self.pos_encoding != "rope" or layer in self.rope_off_layers:
            return None
        if self.local_rope_base is not None and self.window(layer):
            return self.local_rope_base
        return self.pe_base

    def rope_scaled(self, layer: int) -> tuple:
        """The frequency change layer `layer`'s rotary uses (() for none: local layers are never scaled)."""
        return () if self.local_rope_base is not None and self.window(layer) else self.rope_scaling

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

    @property
    def has_final_norm(self) -> bool:
        """Whether a norm sits between the last block and the output head (every pre-norm style)."""
        return self.norm in ("pre", "sandwich", "post_branch")

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
        a = self.attn_dim
        attn = d * qkv_out + bq * qkv_out + (a * d + bo * d if self.attn_out_proj else 0)
        if self.qk_norm == "head" and self.norm_weight:
            attn += 2 * self.head_dim
        elif self.qk_norm == "whole" and self.norm_weight:
            attn += (self.n_heads + self.kv_heads) * self.head_dim
        f = self.ff_dim
        if f == 0:
            ffn = 0
        elif self.gated:
            ffn = 2 * (d * f + b * f) + f * d + b * d
        else:
            ffn = d * f + b * f + f * d + b * d
        bn = bn if self.norm_kind == "layernorm" else 0  # RMSNorm never has a bias
        norm_params = (d + bn * d) if self.norm != "none" and self.norm_weight else 0
        norms_per_layer = {"sandwich": 4, "none": 0}.get(self.norm, 2)
        per_layer = attn + ffn + norms_per_layer * norm_params
        total = v * d + L * per_layer
        if self.pos_encoding == "learned":
            total += self.block_size * d
        if self.has_final_norm:
            total += norm_params
        if self.embed_norm:
            total += norm_params
        if not self.tie_weights:
            total += v * d
        if self.head_bias:
            total += v
        return total + self._nanochat_params()

    def _nanochat_params(self) -> int:
        """Parameters of nanochat's options: the smear gate, the per-layer lambdas, value embeddings and
        their gates, the backout lambda."""
        n = (self.smear_width + 1 if self.smear_width else 0) + (2 * self.n_layers if self.x0_mix else 0)
        n += len(self.value_embed_layers) * self.kv_heads * (self.vocab_size * self.head_dim + self.value_gate_width)
        return n + (1 if self.backout_layer is not None else 0)


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


def _positive(value: Any) -> bool:
    """Whether value is a finite number above 0 (an int or a float, not a bool; no overflow for huge ints)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value) and value > 0
    except OverflowError:
        return False


def _choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}; got {short(value)}")
