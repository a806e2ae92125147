"""GPT-NeoX (Black et al. 2022; the Pythia suite) into the engine.

Behaviour in the config: rotary positions on the first `rotary_pct` of each head (Pythia: 25 %,
theta 10,000), a parallel residual x + attn(ln1 x) + mlp(ln2 x), exact GELU, an untied head.
Re-laid weights: the fused query_key_value matrix is head-major (for each head its q, k and v
rows) and is regrouped into the engine's q-of-all-heads, k, v order; the rotated part of each
query and key head goes from rotate-half order to consecutive pairs (common.pairs_from_halves).
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from .common import HF_ACTIVATIONS, Family, flag, pairs_from_halves, real, refuse_unless, rope_settings, whole, short


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_act", "gelu")  # NeoX's default "gelu" is the exact one, unlike GPT-2's "gelu_new"
    refuse_unless(act in HF_ACTIVATIONS, f"GPT-NeoX activation {short(act)} is not supported")
    # NeoX's configs name the base and the rotated share their own way; 25 % is Pythia's default
    theta, fraction = rope_settings(hf, ("rotary_emb_base",), ("rotary_pct",), 0.25)
    # newer configs may drop the attention's biases (q/k/v and the output projection alike); the
    # MLP and the norms keep theirs, hence bias=True with the two attention parts overridden below
    bias = flag(hf, "attention_bias", True)
    return ModelConfig(
        vocab_size=whole(hf, "vocab_size"),
        block_size=whole(hf, "max_position_embeddings"),
        n_layers=whole(hf, "num_hidden_layers"),
        n_heads=whole(hf, "num_attention_heads"),
        d_model=whole(hf, "hidden_size"),
        d_ff=whole(hf, "intermediate_size"),
        pos_encoding="rope",
        pe_base=theta,
        rope_fraction=fraction,
        rope_precision="float32",  # the angles transformers computes, so logits match the reference
        parallel_residual=flag(hf, "use_parallel_residual", True),
        activation="relu" if act == "relu" else "gelu",
        gelu_approximate="none" if act == "relu" else HF_ACTIVATIONS[act],
        norm_eps=real(hf, "layer_norm_eps", 1e-5),
        bias=True,
        qkv_bias=bias,
        attn_out_bias=bias,
        tie_weights=flag(hf, "tie_word_embeddings", False),
        init="torch",  # every parameter is overwritten by the file, so the cheap default init will do
    )


def expected_shapes(hf: dict, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, f, V = cfg.d_model, cfg.ff_dim, cfg.vocab_size
    # names after the "gpt_neox." prefix is stripped; files call the head embed_out (FAMILY's alias)
    shapes = {"embed_in.weight": (V, d), "final_layer_norm.weight": (d,), "final_layer_norm.bias": (d,),
              "lm_head.weight": (V, d)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (d,), p + "input_layernorm.bias": (d,),
            p + "post_attention_layernorm.weight": (d,), p + "post_attention_layernorm.bias": (d,),
            # nn.Linear layout (out, in); the fused q/k/v rows are interleaved per head (see _qkv)
            p + "attention.query_key_value.weight": (3 * d, d), p + "attention.dense.weight": (d, d),
            p + "mlp.dense_h_to_4h.weight": (f, d), p + "mlp.dense_h_to_4h.bias": (f,),
            p + "mlp.dense_4h_to_h.weight": (d, f), p + "mlp.dense_4h_to_h.bias": (d,),
        })
        if cfg.part_bias("qkv"):  # attention_bias=false: these two are absent from the file
            shapes.update({p + "attention.query_key_value.bias": (3 * d,), p + "attention.dense.bias": (d,)})
    return shapes


def _qkv(w: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Head-major (H, [q k v], hs, ...) rows -> (3, H, hs, ...), queries and keys in pair order.

    Works for the weight (3C, C) and the bias (3C,) alike: `...` is whatever follows the rows."""
    H, hs = cfg.n_heads, cfg.head_dim
    # (3C, ..) -> (H, 3, hs, ..) -> swap to (3, H, hs, ..) -> three (C, ..) blocks: all queries, keys, values
    q, k, v = w.reshape(H, 3, hs, *w.shape[1:]).transpose(0, 1).reshape(3, H * hs, *w.shape[1:])
    # only queries and keys are rotated; values never are, so they keep their order
    q, k = (pairs_from_halves(x, H, hs, cfg.rope_dim) for x in (q, k))
    return torch.cat([q, k, v]).contiguous()


def convert(hf: dict, cfg: ModelConfig, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state = {"tok_emb.weight": t["embed_in.weight"],
             "norm_f.weight": t["final_layer_norm.weight"], "norm_f.bias": t["final_layer_norm.bias"]}
    # Pythia unties the head; a tied config may still repeat the embedding as the head, which must agree
    if cfg.tie_weights:
        head = t.get("lm_head.weight")
        refuse_unless(head is None or torch.equal(head, t["embed_in.weight"]),
                      "config.json ties the output head to the embedding but the weights hold a different one")
    else:
        refuse_unless("lm_head.weight" in t, "config.json has an untied output head but the weights lack embed_out.weight")
        state["head.weight"] = t["lm_head.weight"]
    for i in range(cfg.n_layers):
        p, b = f"layers.{i}.", f"blocks.{i}."
        state.update({
            b + "norm1.weight": t[p + "input_layernorm.weight"], b + "norm1.bias": t[p + "input_layernorm.bias"],
            b + "norm2.weight": t[p + "post_attention_layernorm.weight"],
            b + "norm2.bias": t[p + "post_attention_layernorm.bias"],
            b + "attn.qkv.weight": _qkv(t[p + "attention.query_key_value.weight"], cfg),
            b + "attn.proj.weight": t[p + "attention.dense.weight"],
            b + "ffn.up.weight": t[p + "mlp.dense_h_to_4h.weight"], b + "ffn.up.bias": t[p + "mlp.dense_h_to_4h.bias"],
            b + "ffn.down.weight": t[p + "mlp.dense_4h_to_h.weight"], b + "ffn.down.bias": t[p + "mlp.dense_4h_to_h.bias"],
        })
        if cfg.part_bias("qkv"):  # the bias is re-laid exactly like the weight's rows
            state[b + "attn.qkv.bias"] = _qkv(t[p + "attention.query_key_value.bias"], cfg)
            state[b + "attn.proj.bias"] = t[p + "attention.dense.bias"]
    return state


# "gpt_neox." is the prefix GPTNeoXForCausalLM writes; the ignored names are the causal-mask and
# rotary-frequency buffers older files saved, which the engine recomputes
FAMILY = Family("GPT-NeoX", ("gpt_neox",), model_config, expected_shapes, convert, prefixes=("gpt_neox.",),
                ignored=(".attention.bias", ".attention.masked_bias", "rotary_emb.inv_freq"),
                optional=("lm_head.weight",), aliases={"embed_out.weight": "lm_head.weight"})
