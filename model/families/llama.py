"""Llama (Touvron et al. 2023; Llama 3.x, SmolLM2, TinyLlama) into the engine, and the pieces the
Llama-like families (qwen2.py, qwen3.py, smollm3.py) share with it.

Behaviour in the config: RMSNorm with its epsilon, rotary positions on the whole head with the
file's theta (SmolLM2: 100,000) and its frequency change (Llama 3.1/3.2's "llama3", or "linear"),
grouped-query attention (num_key_value_heads key/value heads shared by groups of query heads,
kept as groups), a gated SiLU MLP, no biases unless the config asks, a tied or untied head.
Re-laid weights: q, k, v join the engine's one projection; each query and key head goes from
rotate-half order to consecutive pairs (common.pairs_from_halves), and so does a per-head q/k
norm's weight; gate and up join the engine's `up` (gate rows first).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..config import ModelConfig
from .common import (Family, embedding_and_head, flag, head_width, pairs_from_halves, real, refuse_unless, rope_settings,
                     short, whole)

# The rope types transformers' Llama-like models apply as the engine does (a fixed change of the
# inverse frequencies, the cos/sin unscaled); yarn, dynamic, longrope and the rest are refused.
SCALINGS = ("linear", "llama3")
LAYER_TYPES = ("full_attention", "sliding_attention")


def llama_like(hf: dict, name: str, tie_default: bool = False, theta_default: float = 10000.0) -> dict[str, Any]:
    """The ModelConfig fields every Llama-like family reads the same way: the sizes, RMSNorm, a
    gated SiLU MLP, the rotary with its scaling (in transformers' float32), the tied or untied head."""
    act = hf.get("hidden_act", "silu")
    refuse_unless(act == "silu", f"{name} activation {short(act)} is not supported (only silu)")
    theta, fraction, scaling = rope_settings(hf, (), (), 1.0, SCALINGS, theta_default)
    refuse_unless(fraction == 1.0, f"a partial rotary factor in a {name} config is not supported")
    H = whole(hf, "num_attention_heads")
    return dict(
        vocab_size=whole(hf, "vocab_size"), block_size=whole(hf, "max_position_embeddings"),
        n_layers=whole(hf, "num_hidden_layers"), n_heads=H, n_kv_heads=whole(hf, "num_key_value_heads", H),
        d_model=whole(hf, "hidden_size"), d_ff=whole(hf, "intermediate_size"),
        pos_encoding="rope", pe_base=theta, rope_scaling=scaling, rope_precision="float32",
        norm_kind="rmsnorm", norm_eps=real(hf, "rms_norm_eps", 1e-6), activation="swiglu",
        bias=False, norm_bias=False, tie_weights=flag(hf, "tie_word_embeddings", tie_default), init="torch",
    )


def head_size(hf: dict, default: int | None = None) -> int | None:
    """config.json's head_dim as ModelConfig.head_size (None: hidden_size / num_attention_heads). The
    Qwen and SmolLM3 attentions read head_dim whenever the file has it; Qwen3's own default is 128."""
    if "head_dim" not in hf and default is None:
        return None
    d, H = whole(hf, "hidden_size"), whole(hf, "num_attention_heads")
    hs = head_width(hf, d, H, default)
    return None if hs * H == d else hs


def attention_windows(hf: dict, name: str, n_layers: int, slides: Callable[[int], bool]) -> tuple[int, ...]:
    """ModelConfig.attn_window from layer_types, or in a file without them from the family's rule
    `slides(layer)` when use_sliding_window is on (as transformers 5 fills layer_types in). A sliding
    layer's query sees the keys after query - sliding_window: its last sliding_window keys, its own
    included, which is the engine's window. Sliding layers with use_sliding_window off are refused:
    transformers' eager mask slides there and its other attention kernels do not."""
    use = flag(hf, "use_sliding_window", False)
    window = hf.get("sliding_window")
    if window is not None:
        window = whole(hf, "sliding_window")
    types = hf.get("layer_types")
    if types is None:
        sliding = [use and window is not None and slides(i) for i in range(n_layers)]
    else:
        refuse_unless(isinstance(types, list) and len(types) == n_layers and all(t in LAYER_TYPES for t in types),
                      f"config.json's layer_types must name full_attention or sliding_attention for each of "
                      f"the {n_layers} layers, got {short(types)}")
        sliding = [t == "sliding_attention" for t in types]
    if not any(sliding):
        return ()
    refuse_unless(use, f"config.json's layer_types has sliding layers but use_sliding_window is false, "
                       f"which {name}'s attention kernels read differently")
    refuse_unless(window is not None, "config.json's layer_types has sliding layers but no sliding_window")
    return tuple(window if s else 0 for s in sliding)


def model_config(hf: dict) -> ModelConfig:
    for option in ("sliding_window", "layer_types", "attn_logit_softcapping", "final_logit_softcapping"):
        refuse_unless(hf.get(option) is None, f"the Llama option {option} is not supported")
    refuse_unless(hf.get("pretraining_tp", 1) == 1, "Llama's pretraining_tp other than 1 is not supported")
    fields = llama_like(hf, "Llama")
    d, H = fields["d_model"], fields["n_heads"]
    head_dim = hf.get("head_dim")
    refuse_unless(head_dim is None or (d % H == 0 and head_dim == d // H),
                  f"a Llama head_dim ({short(head_dim)}) other than hidden_size / num_attention_heads is not supported")
    bias = flag(hf, "attention_bias", False)
    return ModelConfig(**fields, qkv_bias=bias, attn_out_bias=bias, mlp_bias=flag(hf, "mlp_bias", False))


def expected_shapes(hf: dict, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, f, V, hs, a = cfg.d_model, cfg.ff_dim, cfg.vocab_size, cfg.head_dim, cfg.attn_dim
    kv = cfg.kv_heads * hs
    shapes = {"embed_tokens.weight": (V, d), "norm.weight": (d,), "lm_head.weight": (V, d)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (a, d), p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, a),
            p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f),
        })
        if cfg.part_bias("qkv"):
            shapes.update({p + "self_attn.q_proj.bias": (a,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if cfg.part_bias("attn_out"):
            shapes[p + "self_attn.o_proj.bias"] = (d,)
        if cfg.qk_norm == "head":  # one weight per head dimension, shared by every head (Qwen3)
            shapes.update({p + "self_attn.q_norm.weight": (hs,), p + "self_attn.k_norm.weight": (hs,)})
        if cfg.part_bias("mlp"):
            shapes.update({p + "mlp.gate_proj.bias": (f,), p + "mlp.up_proj.bias": (f,), p + "mlp.down_proj.bias": (d,)})
    return shapes


def convert(hf: dict, cfg: ModelConfig, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    H, Hkv, hs = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    state = embedding_and_head(cfg, t)  # tok_emb, norm_f and an untied head (checked against the file)
    for i in range(cfg.n_layers):
        p, b = f"layers.{i}.self_attn.", f"blocks.{i}."
        m = f"layers.{i}.mlp."

        def qkv(kind: str) -> torch.Tensor:  # (H + 2 Hkv) * hs rows: queries, keys, values
            q = pairs_from_halves(t[p + f"q_proj.{kind}"], H, hs, cfg.rope_dim)
            k = pairs_from_halves(t[p + f"k_proj.{kind}"], Hkv, hs, cfg.rope_dim)
            return torch.cat([q, k, t[p + f"v_proj.{kind}"]]).contiguous()

        state.update({
            b + "norm1.weight": t[f"layers.{i}.input_layernorm.weight"],
            b + "norm2.weight": t[f"layers.{i}.post_attention_layernorm.weight"],
            b + "attn.qkv.weight": qkv("weight"), b + "attn.proj.weight": t[p + "o_proj.weight"],
            b + "ffn.up.weight": torch.cat([t[m + "gate_proj.weight"], t[m + "up_proj.weight"]]),
            b + "ffn.down.weight": t[m + "down_proj.weight"],
        })
        if cfg.part_bias("qkv"):
            state[b + "attn.qkv.bias"] = qkv("bias")
        if cfg.part_bias("attn_out"):
            state[b + "attn.proj.bias"] = t[p + "o_proj.bias"]
        if cfg.qk_norm == "head":
            # the norm scales each head dimension by its weight: the weight moves with the dimensions
            for which in ("q_norm", "k_norm"):
                state[b + f"attn.{which}.weight"] = pairs_from_halves(t[p + f"{which}.weight"], 1, hs, cfg.rope_dim)
        if cfg.part_bias("mlp"):
            state[b + "ffn.up.bias"] = torch.cat([t[m + "gate_proj.bias"], t[m + "up_proj.bias"]])
            state[b + "ffn.down.bias"] = t[m + "down_proj.bias"]
    return state


FAMILY = Family("Llama", ("llama",), model_config, expected_shapes, convert, prefixes=("model.",),
                ignored=("rotary_emb.inv_freq",), optional=("lm_head.weight",), adds_bos=True)
