"""Qwen2 and Qwen2.5 (Qwen team 2024) into the engine: Llama's layout (llama.py) with biases on the
query, key and value projections but none on the output projection or the MLP, grouped-query
attention (7 query heads per key/value head in Qwen2.5-0.5B), and the sliding-window layers of
layer_types (none in the released models, whose use_sliding_window is false).

transformers' Qwen2 attention always has those three biases (config.json has no switch for them),
and reads head_dim when the file gives one. BOS: as the tokenizer's files say (Qwen's released
tokenizers put none first; transformers follows a tokenizer.json that does).
"""

from __future__ import annotations

from ..config import ModelConfig
from .common import Family, whole
from .llama import attention_windows, convert, expected_shapes, head_size, llama_like


def model_config(hf: dict) -> ModelConfig:
    fields = llama_like(hf, "Qwen2")
    # older files say which layers slide by a count: the first max_window_layers attend to everything
    full_first = whole(hf, "max_window_layers", 28, minimum=0)
    windows = attention_windows(hf, "Qwen2", fields["n_layers"], lambda i: i >= full_first)
    return ModelConfig(**fields, head_size=head_size(hf), attn_window=windows,
                       qkv_bias=True, attn_out_bias=False, mlp_bias=False)


FAMILY = Family("Qwen2", ("qwen2",), model_config, expected_shapes, convert, prefixes=("model.",),
                ignored=("rotary_emb.inv_freq",), optional=("lm_head.weight",), adds_bos=True)
