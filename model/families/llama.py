"""Llama (Touvron et al. 2023; SmolLM2, TinyLlama) into the engine.

Behaviour in the config: RMSNorm with its epsilon, rotary positions on the whole head with the
file's theta (SmolLM2: 100,000), grouped-query attention (num_key_value_heads key/value heads
shared by groups of query heads, kept as groups), a gated SiLU MLP, no biases unless the config
asks, a tied or untied head. Re-laid weights: q, k, v join the engine's one projection; each
query and key head goes from rotate-half order to consecutive pairs (common.pairs_from_halves);
gate and up join the engine's `up` (gate rows first).
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from .common import Family, flag, pairs_from_halves, real, refuse_unless, rope_settings, whole, short


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "silu")
    refuse_unless(act == "silu", f"Llama activation {short(act)} is not supported (only silu)")
    for option in ("sliding_window", "layer_types", "attn_logit_softcapping", "final_logit_softcapping"):
        refuse_unless(hf.get(option) is None, f"the Llama option {option} is not supported")
    refuse_unless(hf.get("pretraining_tp", 1) == 1, "Llama's pretraining_tp other than 1 is not supported")
    theta, fraction = rope_settings(hf, (), (), 1.0)
    refuse_unless(fraction == 1.0, "a partial rotary factor in a Llama config is not supported")
    d, H = whole(hf, "hidden_size"), whole(hf, "num_attention_heads")
    head_dim = hf.get("head_dim")
    refuse_unless(head_dim is None or (d % H == 0 and head_dim == d // H),
                  f"a Llama head_dim ({short(head_dim)}) other than hidden_size / num_attention_heads is not supported")
    bias = flag(hf, "attention_bias", False)
    return ModelConfig(
        vocab_size=whole(hf, "vocab_size"),
        block_size=whole(hf, "max_position_embeddings"),
        n_layers=whole(hf, "num_hidden_layers"),
        n_heads=H,
        n_kv_heads=whole(hf, "num_key_value_heads", H),
        d_model=d,
        d_ff=whole(hf, "intermediate_size"),
        pos_encoding="rope",
        pe_base=theta,
        rope_precision="float32",
        norm_kind="rmsnorm",
        norm_eps=real(hf, "rms_norm_eps", 1e-6),
        activation="swiglu",
        bias=False,
        qkv_bias=bias,
        attn_out_bias=bias,
        mlp_bias=flag(hf, "mlp_bias", False),
        norm_bias=False,
        tie_weights=flag(hf, "tie_word_embeddings", False),
        init="torch",
    )


def expected_shapes(hf: dict, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, f, V, hs = cfg.d_model, cfg.ff_dim, cfg.vocab_size, cfg.head_dim
    kv = cfg.kv_heads * hs
    shapes = {"embed_tokens.weight": (V, d), "norm.weight": (d,), "lm_head.weight": (V, d)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, d),
            p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f),
        })
        if cfg.part_bias("qkv"):
            shapes.update({p + "self_attn.q_proj.bias": (d,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,), p + "self_attn.o_proj.bias": (d,)})
        if cfg.part_bias("mlp"):
            shapes.update({p + "mlp.gate_proj.bias": (f,), p + "mlp.up_proj.bias": (f,), p + "mlp.down_proj.bias": (d,)})
    return shapes


def convert(hf: dict, cfg: ModelConfig, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    H, Hkv, hs = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    state = {"tok_emb.weight": t["embed_tokens.weight"], "norm_f.weight": t["norm.weight"]}
    if cfg.tie_weights:
        head = t.get("lm_head.weight")
        refuse_unless(head is None or torch.equal(head, t["embed_tokens.weight"]),
                      "config.json ties the output head to the embedding but the weights hold a different lm_head")
    else:
        refuse_unless("lm_head.weight" in t, "config.json has an untied output head but the weights lack lm_head.weight")
        state["head.weight"] = t["lm_head.weight"]
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
            state[b + "attn.proj.bias"] = t[p + "o_proj.bias"]
        if cfg.part_bias("mlp"):
            state[b + "ffn.up.bias"] = torch.cat([t[m + "gate_proj.bias"], t[m + "up_proj.bias"]])
            state[b + "ffn.down.bias"] = t[m + "down_proj.bias"]
    return state


FAMILY = Family("Llama", ("llama",), model_config, expected_shapes, convert, prefixes=("model.",),
                ignored=("rotary_emb.inv_freq",), optional=("lm_head.weight",), adds_bos=True)
