"""SmolLM3 (Hugging Face 2025) into the engine: Llama's layout (llama.py) in which some layers do
not rotate at all (NoPE, Kazemnejad et al. 2023): no_rope_layers holds one number per layer, 1
where the layer uses the rotary and 0 where it does not (ModelConfig.rope_off_layers); a file
without the list leaves every no_rope_layer_interval-th layer unrotated (every 4th, as
transformers does). Biases on all four attention projections (attention_bias) and on the MLP
(mlp_bias) when asked, a tied head unless the file says otherwise, theta 2,000,000 when the file
names none, and sliding windows only where layer_types says (as transformers fills them in: on
the layers without rotary when use_sliding_window is on). BOS: as its tokenizer files say.
"""

from __future__ import annotations

from ..config import ModelConfig
from .common import Family, flag, refuse_unless, short, whole
from .llama import attention_windows, convert, expected_shapes, head_size, llama_like

DEFAULT_THETA = 2_000_000.0  # transformers' SmolLM3Config.default_theta


def rotating_layers(hf: dict, n_layers: int) -> list[bool]:
    """Whether each layer uses the rotary, from no_rope_layers (or no_rope_layer_interval)."""
    flags = hf.get("no_rope_layers")
    if flags is None:
        every = whole(hf, "no_rope_layer_interval", 4)
        return [(i + 1) % every != 0 for i in range(n_layers)]
    refuse_unless(isinstance(flags, list) and len(flags) == n_layers
                  and all(type(v) is int and v in (0, 1) for v in flags),
                  f"config.json's no_rope_layers must hold 1 (rotary) or 0 (none) for each of the {n_layers} "
                  f"layers, got {short(flags)}")
    return [v == 1 for v in flags]


def model_config(hf: dict) -> ModelConfig:
    fields = llama_like(hf, "SmolLM3", tie_default=True, theta_default=DEFAULT_THETA)
    rotates = rotating_layers(hf, fields["n_layers"])
    windows = attention_windows(hf, "SmolLM3", fields["n_layers"], lambda i: not rotates[i])
    bias = flag(hf, "attention_bias", False)
    return ModelConfig(**fields, head_size=head_size(hf), attn_window=windows,
                       rope_off_layers=tuple(i for i, r in enumerate(rotates) if not r),
                       qkv_bias=bias, attn_out_bias=bias, mlp_bias=flag(hf, "mlp_bias", False))


FAMILY = Family("SmolLM3", ("smollm3",), model_config, expected_shapes, convert, prefixes=("model.",),
                ignored=("rotary_emb.inv_freq",), optional=("lm_head.weight",), adds_bos=True)
