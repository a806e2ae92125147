"""Qwen3 (Qwen team 2025) into the engine: Llama's layout (llama.py) with heads of their own width
(head_dim, 128 unless the file says: 16 heads x 128 = 2048 for d_model 1024 in Qwen3-0.6B), an
RMSNorm over each head's query and key before the rotary step (one weight of head_dim shared by
every head: ModelConfig.qk_norm="head"), biases on all four attention projections when
attention_bias is on, and the sliding-window layers of layer_types (as Qwen2's; none in the
released models). BOS: as the tokenizer's files say (as for Qwen2).
"""

from __future__ import annotations

from ..config import ModelConfig
from .common import Family, flag, whole
from .llama import attention_windows, convert, expected_shapes, head_size, llama_like

# transformers' Qwen3Config head_dim when config.json gives none (not hidden_size / heads)
DEFAULT_HEAD_DIM = 128


def model_config(hf: dict) -> ModelConfig:
    fields = llama_like(hf, "Qwen3")
    full_first = whole(hf, "max_window_layers", 28, minimum=0)
    windows = attention_windows(hf, "Qwen3", fields["n_layers"], lambda i: i >= full_first)
    bias = flag(hf, "attention_bias", False)
    return ModelConfig(**fields, head_size=head_size(hf, DEFAULT_HEAD_DIM), qk_norm="head", attn_window=windows,
                       qkv_bias=bias, attn_out_bias=bias, mlp_bias=False)


FAMILY = Family("Qwen3", ("qwen3",), model_config, expected_shapes, convert, prefixes=("model.",),
                ignored=("rotary_emb.inv_freq",), optional=("lm_head.weight",), adds_bos=True)
