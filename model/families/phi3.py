"""Phi-3 (Abdin et al. 2024; model_type phi3: microsoft/Phi-3-mini-4k-instruct, and Phi-4-mini's shape) into
the engine.

Behaviour in the config: a Llama-like pre-norm block (RMSNorm, a gated SiLU MLP, no biases),
grouped-query attention, rotary positions on the first partial_rotary_factor of each head (Phi-4-mini:
0.75) with the file's theta, and config.json's sliding_window, which transformers' Phi3 applies to every
layer (each query reads the last sliding_window keys, its own included: the engine's attn_window on
every layer). LongRoPE (the 128k Phi-3 models, Phi-3.5, Phi-4-mini; older name su) turns by
angles that depend on the whole text's length: its short factors up to original_max_position_embeddings
tokens, its long ones past that, for every position at once. The engine's tables are fixed, so such a
model opens with its original context (Phi-4-mini: 4,096 tokens), where the short factors and the
attention factor are exact (ModelConfig.rope_scaling "longrope"); the long factors are never used.

Re-laid weights: the fused qkv_proj holds all query rows, then the key rows, then the value rows, as
the engine's projection does; only each query and key head's rotated part goes from rotate-half order
to consecutive pairs (common.pairs_from_halves). The fused gate_up_proj holds the gate's rows, then the
up rows (transformers chunks it in two and gates with the first half): the engine's `up` as it is.
"""

from __future__ import annotations

import math

import torch

from ..config import ModelConfig
from .common import (Family, embedding_and_head, flag, head_width, pairs_from_halves, real, refuse_unless, rope_settings,
                     short, whole)

# transformers' Phi3Config reads the older name su as longrope
_LONGROPE_NAMES = ("longrope", "su")


def _longrope(hf: dict) -> tuple[dict, dict | None]:
    """(config.json without its longrope entry, that entry or None). Phi-3 knows the default rotary and
    longrope only; any other type is refused by name."""
    found, plain = None, dict(hf)
    for key in ("rope_parameters", "rope_scaling"):
        where = hf.get(key)
        if not isinstance(where, dict):
            continue  # absent, or not an object: common.rope_settings says which
        kind = where.get("rope_type", where.get("type"))
        if kind in (None, "default"):
            continue
        if kind not in _LONGROPE_NAMES:
            raise ValueError(f"RoPE scaling type {short(kind)} is not supported for Phi-3; only the default "
                             "rotary and longrope are")
        found = where
        # what rope_settings still reads from it: the base and the rotary fraction
        plain[key] = {k: where[k] for k in ("rope_theta", "partial_rotary_factor") if k in where}
    return plain, found


def _longrope_scaling(hf: dict, params: dict, rotated: int, block: int) -> tuple[tuple, int]:
    """(ModelConfig.rope_scaling, the context) of a longrope entry: the short factors, one per rotated pair,
    and the attention factor (the file's, else sqrt(1 + ln(factor) / ln(original)) for factor =
    max_position_embeddings / original, as transformers); the context is the original one."""
    named = {f"rope {k}": v for k, v in params.items()}
    top = hf.get("original_max_position_embeddings")
    original = whole(named, "rope original_max_position_embeddings") if "original_max_position_embeddings" in params \
        else whole(hf, "original_max_position_embeddings")
    refuse_unless(top is None or top == original, "config.json gives two different original_max_position_embeddings")
    factors = params.get("short_factor")
    refuse_unless(isinstance(factors, list) and len(factors) == rotated // 2,
                  f"config.json's longrope short_factor must list {rotated // 2} numbers (one per rotated pair)")
    shorts = tuple(real({"short_factor": f}, "short_factor") for f in factors)
    factor = real(named, "rope factor") if params.get("factor") is not None else block / original
    if params.get("attention_factor") is not None:
        gain = real(named, "rope attention_factor")
    else:
        gain = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return ("longrope", gain, *shorts), min(block, original)


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "silu")
    refuse_unless(act == "silu", f"Phi-3 activation {short(act)} is not supported (only silu)")
    plain, longrope = _longrope(hf)
    theta, fraction = rope_settings(plain, (), (), 1.0)
    d, H = whole(hf, "hidden_size"), whole(hf, "num_attention_heads")
    head_dim = head_width(hf, d, H)
    # transformers spaces its frequencies for int(head_dim * factor) dimensions but turns them in pairs, so an
    # odd count turns one dimension more at frequencies no even count has; the engine turns exactly
    # int(head_dim * fraction), which must be even and at least 2
    rotated = int(head_dim * fraction)
    refuse_unless(rotated >= 2 and rotated % 2 == 0,
                  f"config.json's partial_rotary_factor {fraction} rotates {rotated} of each head's {head_dim} "
                  "dimensions; only an even number of at least 2 is supported")
    L, block = whole(hf, "num_hidden_layers"), whole(hf, "max_position_embeddings")
    scaling = ()
    if longrope is not None:
        scaling, block = _longrope_scaling(hf, longrope, rotated, block)
    # None: every key; a window at least as long as the context never leaves a key out (Phi-4-mini's
    # 262,144 for 131,072 positions), so it is the same attention as none
    window = hf.get("sliding_window")
    window = 0 if window is None else whole(hf, "sliding_window")
    kv, eps = whole(hf, "num_key_value_heads", H), real(hf, "rms_norm_eps", 1e-5)
    refuse_unless(H % kv == 0, f"config.json's num_key_value_heads ({kv}) must divide num_attention_heads ({H})")
    refuse_unless(eps < 1, f"config.json's rms_norm_eps must be below 1, got {eps}")
    return ModelConfig(
        vocab_size=whole(hf, "vocab_size"),
        block_size=block,
        n_layers=L,
        n_heads=H,
        n_kv_heads=kv,
        d_model=d,
        d_ff=whole(hf, "intermediate_size"),
        head_size=None if head_dim * H == d else head_dim,
        pos_encoding="rope",
        pe_base=theta,
        rope_fraction=fraction,
        rope_scaling=scaling,
        rope_precision="float32",  # the angles transformers computes, so logits match the reference
        attn_window=(window,) * L if 0 < window < block else (),
        norm_kind="rmsnorm",
        norm_eps=eps,
        activation="swiglu",
        bias=False,
        norm_bias=False,
        tie_weights=flag(hf, "tie_word_embeddings", False),
        init="torch",  # every parameter is overwritten by the file, so the cheap default init will do
    )


def expected_shapes(hf: dict, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, f, V, a = cfg.d_model, cfg.ff_dim, cfg.vocab_size, cfg.attn_dim
    qkv = a + 2 * cfg.kv_heads * cfg.head_dim
    shapes = {"embed_tokens.weight": (V, d), "norm.weight": (d,), "lm_head.weight": (V, d)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.qkv_proj.weight": (qkv, d), p + "self_attn.o_proj.weight": (d, a),
            p + "mlp.gate_up_proj.weight": (2 * f, d), p + "mlp.down_proj.weight": (d, f),
        })
    return shapes


def convert(hf: dict, cfg: ModelConfig, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    H, Hkv, hs, r = cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.rope_dim
    state = embedding_and_head(cfg, t)  # tok_emb, norm_f and an untied head (checked against the file)
    for i in range(cfg.n_layers):
        p, b = f"layers.{i}.", f"blocks.{i}."
        q, k, v = t[p + "self_attn.qkv_proj.weight"].split((H * hs, Hkv * hs, Hkv * hs))
        state.update({
            b + "norm1.weight": t[p + "input_layernorm.weight"],
            b + "norm2.weight": t[p + "post_attention_layernorm.weight"],
            b + "attn.qkv.weight": torch.cat([pairs_from_halves(q, H, hs, r), pairs_from_halves(k, Hkv, hs, r), v]),
            b + "attn.proj.weight": t[p + "self_attn.o_proj.weight"],
            b + "ffn.up.weight": t[p + "mlp.gate_up_proj.weight"],  # gate rows, then up rows: already the engine's
            b + "ffn.down.weight": t[p + "mlp.down_proj.weight"],
        })
    return state


FAMILY = Family("Phi-3", ("phi3",), model_config, expected_shapes, convert, prefixes=("model.",),
                ignored=("rotary_emb.inv_freq",), optional=("lm_head.weight",), adds_bos=True)
