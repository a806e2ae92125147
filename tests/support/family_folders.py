"""Small random folders of every family model.families imports, one each, for the tool tests that loop over
the families (tests/engine/test_patching.py, test_inside.py, test_last_logits.py; re-exported by
tests/support/patch_reference.py).

`FAMILIES[name]` is (transformers config class, model class, options): the options a config of that class
takes besides the vocabulary and the BOS/EOS ids, so a test may build the model itself. `family_folder`
builds it with the family's own test builder where one exists (tests/support/llamalike.py for Llama 3,
Qwen and SmolLM3; tests/support/olmo_phi.py for OLMo 2 and Phi-3: each makes the random weights far from
uniform in the way that family needs), and saves it beside a byte-level BPE tokenizer.

Each new family's shape exercises what is its own: the llama3 rotary table (Llama 3), biases on q, k, v
only and GQA 7:1 (Qwen2), heads wider than d / heads with per-head q/k norms (Qwen3), layers without rotary
(SmolLM3), soft-capped scores and logits, local windows shorter than the prompts, RMSNorm times (1 + w),
four norms per layer, GeGLU and the embedding's scale (Gemma 2), a rotary base per layer type with linear
scaling and per-head q/k norms (Gemma 3), norms after each branch with q/k norms over the whole projection
(OLMo 2), partial rotary and a window (Phi-3). Every shape has at least 2 layers and 4 query heads (the
patching tests patch head 3 of layer 1).
"""

from __future__ import annotations

from pathlib import Path

import torch

FAMILY_VOCAB = 300
# Llama 3's rotary: head size 8 gives wavelengths 6.3, 167, 4,443 and 118,000 at theta 500,000; against an
# original context of 256 the first is kept, the second blended, the last two slowed 8 times
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256, "rope_theta": 500000.0}

FAMILIES = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=16, n_layer=2, n_head=4, n_positions=40)),
    "neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                         intermediate_size=48, rotary_pct=0.25,
                                                         max_position_embeddings=40)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=6,
                                                      num_key_value_heads=2, intermediate_size=40,
                                                      max_position_embeddings=40)),
    "neo": ("GPTNeoConfig", "GPTNeoForCausalLM", dict(hidden_size=16, num_layers=2, num_heads=4, window_size=3,
                                                      attention_types=[[["global", "local"], 1]],
                                                      max_position_embeddings=40)),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                       num_key_value_heads=2, intermediate_size=48,
                                                       tie_word_embeddings=True, max_position_embeddings=1024,
                                                       rope_parameters=dict(LLAMA3))),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(hidden_size=28, num_hidden_layers=2, num_attention_heads=7,
                                                      num_key_value_heads=1, intermediate_size=40,
                                                      rope_theta=1000000.0, max_position_embeddings=40)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2, head_dim=8, intermediate_size=24,
                                                      max_position_embeddings=40)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(hidden_size=16, num_hidden_layers=2,
                                                            num_attention_heads=4, num_key_value_heads=2,
                                                            intermediate_size=16, no_rope_layers=[1, 0],
                                                            rope_theta=10000.0, pad_token_id=None,
                                                            max_position_embeddings=40)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(hidden_size=24, num_hidden_layers=3, num_attention_heads=4,
                                                         num_key_value_heads=1, head_dim=10, intermediate_size=40,
                                                         query_pre_attn_scalar=24, sliding_window=3,
                                                         attn_logit_softcapping=5.0, final_logit_softcapping=8.0,
                                                         pad_token_id=0, max_position_embeddings=64)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=24, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=10,
        intermediate_size=40, query_pre_attn_scalar=24, sliding_window=3, sliding_window_pattern=2,
        final_logit_softcapping=4.0, pad_token_id=0, max_position_embeddings=64,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 50000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2, intermediate_size=40, head_dim=10,
                                                      attention_bias=True, rope_theta=500000.0, pad_token_id=0,
                                                      max_position_embeddings=64)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                   num_key_value_heads=2, intermediate_size=40,
                                                   partial_rotary_factor=0.75, sliding_window=4, pad_token_id=0,
                                                   max_position_embeddings=64)),
}
# the families added for issue 39 (the first four are tests/support/patch_reference's older ones)
NEWER = ("llama3", "qwen2", "qwen3", "smollm3", "gemma2", "gemma3", "olmo2", "phi3")
BOS = ("llama3", "gemma2", "gemma3")  # tokenizers that put <s> first, as these families' own do


def family_folder(name: str, folder: Path) -> Path:
    """A random model of family `name` saved in `folder / name`; returns the folder (open it with
    model.families.open_folder)."""
    return build_family(name, folder)[1]


def build_family(name: str, folder: Path, seed: int | None = None, **changes):
    """(transformers model, its folder) of family `name` in `folder / name`; seed: the weights' (by default
    one of the family's own); changes: config options over FAMILIES' (e.g. another number of layers)."""
    import transformers

    from tests.support import llamalike, olmo_phi
    from tests.support.families import save_reference, sharpen

    config_name, model_name, options = FAMILIES[name]
    seed = len(name) if seed is None else seed
    options = {**options, **changes}
    config_cls, model_cls = getattr(transformers, config_name), getattr(transformers, model_name)
    out = folder / name
    if name in ("llama3", "qwen2", "qwen3", "smollm3"):
        positions = options.pop("max_position_embeddings")
        return llamalike.build(model_cls, config_cls, out, seed=seed, bos=name in BOS, max_positions=positions,
                               **options)
    if name in ("olmo2", "phi3"):
        options.pop("pad_token_id")  # the builders set it
        build = olmo_phi.olmo2_reference if name == "olmo2" else olmo_phi.phi3_reference
        return build(out, seed=seed, **options)
    cfg = config_cls(vocab_size=FAMILY_VOCAB, bos_token_id=1, eos_token_id=0, attn_implementation="eager", **options)
    torch.manual_seed(0)
    ref = model_cls(cfg).eval()
    sharpen(ref, seed=seed, conv1d=name == "gpt2")
    if name.startswith("gemma"):
        _gemma_scales(ref)
    return ref, save_reference(ref, out, FAMILY_VOCAB, bos=name in BOS)


def _gemma_scales(ref: torch.nn.Module) -> None:
    """Gemma multiplies each norm by (1 + w) and the embedding by sqrt(d): stored norm weights around 0 and
    embedding rows around 1/sqrt(d) keep both near the scales the other families have, so every layer's
    output still counts beside the embedding."""
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.sub_(1.0)
            elif "embed_tokens" in name:
                p.mul_(ref.config.hidden_size ** -0.5)
