"""OLMo 2 (OLMo et al. 2024, "2 OLMo 2 Furious"; allenai/OLMo-2-*) into the engine.

Behaviour in the config: the norms sit after the sub-layers instead of before them: each branch
reads the residual stream as it is and its output is RMS-normalised before it is added
(post_attention_layernorm, post_feedforward_layernorm: the engine's norm="post_branch", with the
final norm kept); queries and keys are RMS-normalised over the whole projection of a position, all
heads at once, before the rotary step (qk_norm="whole": q_norm is H*hs wide, k_norm Hkv*hs);
rotary positions on the whole head (scaled as Llama 3's or linearly when rope_parameters say so);
grouped-query attention; a gated SiLU MLP; no biases unless
attention_bias asks for them on q, k, v and the output projection (the MLP never has any).

Re-laid weights: q, k, v join the engine's one projection; each query and key head goes from
rotate-half order to consecutive pairs (common.pairs_from_halves), and so do the q/k norm weights
and the biases, which are laid out like the projection's rows (the norm's sum of squares is the
same in any order, and each weight follows its dimension); gate and up join the engine's `up`
(gate rows first).
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from .common import (Family, embedding_and_head, flag, head_width, pairs_from_halves, real, refuse_unless, rope_settings,
                     short, whole)


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "silu")
    refuse_unless(act == "silu", f"OLMo 2 activation {short(act)} is not supported (only silu)")
    # transformers' OLMo 2 turns with whichever rotary its rope_parameters name: the two the engine computes
    # exactly (linear, llama3) are taken, every other one refused by name
    theta, fraction, scaling = rope_settings(hf, (), (), 1.0, scalings=("linear", "llama3"))
    # transformers' OLMo 2 rotates every dimension of a head whatever this says: a file that asks for
    # less was not made by it, and guessing which of the two it meant would not be exact
    refuse_unless(fraction == 1.0, f"a partial rotary factor ({fraction}) in an OLMo 2 config is not supported; "
                                   "OLMo 2 rotates the whole head")
    d, H = whole(hf, "hidden_size"), whole(hf, "num_attention_heads")
    head_dim = head_width(hf, d, H)
    bias = flag(hf, "attention_bias", False)
    kv, eps = whole(hf, "num_key_value_heads", H), real(hf, "rms_norm_eps", 1e-5)
    refuse_unless(H % kv == 0, f"config.json's num_key_value_heads ({kv}) must divide num_attention_heads ({H})")
    refuse_unless(eps < 1, f"config.json's rms_norm_eps must be below 1, got {eps}")
    return ModelConfig(
        vocab_size=whole(hf, "vocab_size"),
        block_size=whole(hf, "max_position_embeddings"),
        n_layers=whole(hf, "num_hidden_layers"),
        n_heads=H,
        n_kv_heads=kv,
        d_model=d,
        d_ff=whole(hf, "intermediate_size"),
        head_size=None if head_dim * H == d else head_dim,
        pos_encoding="rope",
        pe_base=theta,
        rope_scaling=scaling,
        rope_precision="float32",  # the angles transformers computes, so logits match the reference
        norm="post_branch",
        norm_kind="rmsnorm",
        norm_eps=eps,
        qk_norm="whole",
        activation="swiglu",
        bias=False,
        qkv_bias=bias,
        attn_out_bias=bias,
        mlp_bias=False,
        norm_bias=False,
        tie_weights=flag(hf, "tie_word_embeddings", False),
        init="torch",  # every parameter is overwritten by the file, so the cheap default init will do
    )


def expected_shapes(hf: dict, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, f, V, a = cfg.d_model, cfg.ff_dim, cfg.vocab_size, cfg.attn_dim
    kv = cfg.kv_heads * cfg.head_dim
    shapes = {"embed_tokens.weight": (V, d), "norm.weight": (d,), "lm_head.weight": (V, d)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "post_attention_layernorm.weight": (d,), p + "post_feedforward_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (a, d), p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, a),
            p + "self_attn.q_norm.weight": (a,), p + "self_attn.k_norm.weight": (kv,),
            p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f),
        })
        if cfg.part_bias("qkv"):
            shapes.update({p + "self_attn.q_proj.bias": (a,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,), p + "self_attn.o_proj.bias": (d,)})
    return shapes


def convert(hf: dict, cfg: ModelConfig, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    H, Hkv, hs, r = cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.rope_dim
    state = embedding_and_head(cfg, t)  # tok_emb, norm_f and an untied head (checked against the file)
    for i in range(cfg.n_layers):
        p, b, m = f"layers.{i}.self_attn.", f"blocks.{i}.", f"layers.{i}.mlp."

        def qkv(kind: str) -> torch.Tensor:  # (H + 2 Hkv) * hs rows: queries, keys, values
            q = pairs_from_halves(t[p + f"q_proj.{kind}"], H, hs, r)
            k = pairs_from_halves(t[p + f"k_proj.{kind}"], Hkv, hs, r)
            return torch.cat([q, k, t[p + f"v_proj.{kind}"]]).contiguous()

        state.update({
            b + "post_norm1.weight": t[f"layers.{i}.post_attention_layernorm.weight"],
            b + "post_norm2.weight": t[f"layers.{i}.post_feedforward_layernorm.weight"],
            b + "attn.qkv.weight": qkv("weight"), b + "attn.proj.weight": t[p + "o_proj.weight"],
            # one weight per dimension of the whole projection: it moves with its dimension
            b + "attn.q_norm.weight": pairs_from_halves(t[p + "q_norm.weight"], H, hs, r),
            b + "attn.k_norm.weight": pairs_from_halves(t[p + "k_norm.weight"], Hkv, hs, r),
            b + "ffn.up.weight": torch.cat([t[m + "gate_proj.weight"], t[m + "up_proj.weight"]]),
            b + "ffn.down.weight": t[m + "down_proj.weight"],
        })
        if cfg.part_bias("qkv"):
            state[b + "attn.qkv.bias"] = qkv("bias")
            state[b + "attn.proj.bias"] = t[p + "o_proj.bias"]
    return state


FAMILY = Family("OLMo 2", ("olmo2",), model_config, expected_shapes, convert, prefixes=("model.",),
                ignored=("rotary_emb.inv_freq",), optional=("lm_head.weight",), adds_bos=True)
