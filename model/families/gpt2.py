"""GPT-2 (and distilgpt2, and nanoGPT checkpoints once their names are mapped) into the engine.

GPT-2 (Radford et al. 2019) is the engine's own architecture: learned positions, pre-LayerNorm,
a fused q/k/v projection, a 4x GELU MLP and a head tied to the embedding. Two things differ:

* GPT-2 stores its projections as `Conv1D`, whose weight is (in, out): the transpose of
  `nn.Linear`'s (out, in), so every projection is transposed here;
* its activation is the tanh form of GELU ("gelu_new"), which the config records.

Canonical tensor names are those of transformers' `GPT2Model` (`wte.weight`, `h.0.attn.c_attn.weight`,
...); files written from `GPT2LMHeadModel` put `transformer.` before them, and are read either way.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..transformer import DecoderLM
from . import common
from .common import HF_ACTIVATIONS, Family, flag, real, refuse_unless, whole


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("activation_function", "gelu_new")
    refuse_unless(act in HF_ACTIVATIONS, f"GPT-2 activation {common.short(act)} is not supported "
                                         f"(supported: {', '.join(HF_ACTIVATIONS)})")
    # options that change the arithmetic in ways the engine has no setting for are refused, never ignored:
    # running without them would give a model that loads but predicts differently
    refuse_unless(not flag(hf, "scale_attn_by_inverse_layer_idx", False),
                  "GPT-2's scale_attn_by_inverse_layer_idx option is not supported")
    refuse_unless(not flag(hf, "add_cross_attention", False), "GPT-2 with cross-attention is not a decoder-only model")
    d = whole(hf, "n_embd")
    inner = hf.get("n_inner")  # null (the usual case) means the standard 4 x d_model
    return ModelConfig(
        vocab_size=whole(hf, "vocab_size"),
        block_size=whole(hf, "n_positions"),
        n_layers=whole(hf, "n_layer"),
        n_heads=whole(hf, "n_head"),
        d_model=d,
        d_ff=4 * d if inner is None else whole(hf, "n_inner"),
        pos_encoding="learned",
        norm="pre",
        # ReLU has no GELU form, so its gelu_approximate is the unused default
        activation="relu" if act == "relu" else "gelu",
        gelu_approximate="none" if act == "relu" else HF_ACTIVATIONS[act],
        norm_eps=real(hf, "layer_norm_epsilon", 1e-5),
        attn_scale="inverse_sqrt" if flag(hf, "scale_attn_weights", True) else "none",
        bias=True,
        tie_weights=flag(hf, "tie_word_embeddings", True),
        init="torch",  # the file overwrites every parameter, so GPT-2's careful init would be wasted work
    )


def expected_shapes(hf: dict, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, f, V = cfg.d_model, cfg.ff_dim, cfg.vocab_size
    shapes = {"wte.weight": (V, d), "wpe.weight": (cfg.block_size, d), "ln_f.weight": (d,), "ln_f.bias": (d,),
              "lm_head.weight": (V, d)}  # optional when tied: some files repeat the embedding there
    for i in range(cfg.n_layers):
        p = f"h.{i}."
        shapes.update({
            p + "ln_1.weight": (d,), p + "ln_1.bias": (d,), p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
            p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),  # Conv1D: (in, out)
            p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
            p + "mlp.c_fc.weight": (d, f), p + "mlp.c_fc.bias": (f,),
            p + "mlp.c_proj.weight": (f, d), p + "mlp.c_proj.bias": (d,),
        })
    return shapes


def ends(cfg: ModelConfig, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The embeddings, the final norm and the output head of a GPT-2-named model (GPT-2, GPT-Neo)."""
    state = {"tok_emb.weight": t["wte.weight"], "pos_emb.weight": t["wpe.weight"],
             "norm_f.weight": t["ln_f.weight"], "norm_f.bias": t["ln_f.bias"]}
    if cfg.tie_weights:
        # the engine reuses the embedding as the head; a file that also stores lm_head must store the
        # same matrix, or the config and the weights disagree about which model this is
        head = t.get("lm_head.weight")
        refuse_unless(head is None or torch.equal(head, t["wte.weight"]),
                      "config.json ties the output head to the embedding but the weights hold a different lm_head")
    else:
        refuse_unless("lm_head.weight" in t, "config.json has an untied output head but the weights lack lm_head.weight")
        state["head.weight"] = t["lm_head.weight"]
    return state


def convert(hf: dict, cfg: ModelConfig, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    def linear(name: str) -> torch.Tensor:  # Conv1D (in, out) -> Linear (out, in)
        return t[name].t().contiguous()

    state = ends(cfg, t)
    for i in range(cfg.n_layers):
        p, b = f"h.{i}.", f"blocks.{i}."  # GPT-2's name prefix -> the engine's
        state.update({
            b + "norm1.weight": t[p + "ln_1.weight"], b + "norm1.bias": t[p + "ln_1.bias"],
            b + "norm2.weight": t[p + "ln_2.weight"], b + "norm2.bias": t[p + "ln_2.bias"],
            # c_attn's columns are already all queries, then keys, then values: only the transpose is needed
            b + "attn.qkv.weight": linear(p + "attn.c_attn.weight"), b + "attn.qkv.bias": t[p + "attn.c_attn.bias"],
            b + "attn.proj.weight": linear(p + "attn.c_proj.weight"), b + "attn.proj.bias": t[p + "attn.c_proj.bias"],
            b + "ffn.up.weight": linear(p + "mlp.c_fc.weight"), b + "ffn.up.bias": t[p + "mlp.c_fc.bias"],
            b + "ffn.down.weight": linear(p + "mlp.c_proj.weight"), b + "ffn.down.bias": t[p + "mlp.c_proj.bias"],
        })
    return state


FAMILY = Family("GPT-2", ("gpt2",), model_config, expected_shapes, convert, prefixes=("transformer.",),
                ignored=(".attn.bias", ".attn.masked_bias"), optional=("lm_head.weight",))


def from_gpt2_state(hf_config: dict, tensors: dict[str, torch.Tensor], tokenizer=None) -> DecoderLM:
    """A GPT-2 DecoderLM from a config.json dict and GPT-2-named tensors (Conv1D layout, with or
    without the `transformer.` prefix). A tokenizer with fewer tokens than the embedding's rows
    marks the rest as padding, never sampled (ModelConfig.vocab_used)."""
    return common.from_state(FAMILY, hf_config, tensors, None if tokenizer is None else tokenizer.vocab_size)
