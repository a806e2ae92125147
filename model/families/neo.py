"""GPT-Neo (Black et al. 2021; the TinyStories models) into the engine.

GPT-2's layout with three differences that live in the config: the attention scores are not
scaled by 1/sqrt(head_dim), every other layer (by `attention_types`) is local and sees only
the last `window_size` keys, and q, k, v are separate projections without bias (joined here
into the engine's one q/k/v matrix; the output projection keeps its bias). Projections are
`nn.Linear`, so nothing is transposed.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from .common import HF_ACTIVATIONS, MAX_LAYERS, Family, flag, real, refuse_unless, short, whole
from .gpt2 import ends


def layer_kinds(hf: dict) -> list[str]:
    """attention_types [[["global", "local"], 12]] -> one "global" / "local" per layer."""
    kinds: list[str] = []
    # a run-length form: each entry is a pattern of kinds and how many times it repeats
    spec = hf.get("attention_types")
    refuse_unless(isinstance(spec, list) and spec, "config.json's attention_types must be a list of [kinds, repeat]")
    for entry in spec:
        # [list of kinds, repeat count]; true/false pass isinstance(int), so they are refused apart, and the
        # repeat is capped so a damaged file cannot ask for a huge list before the layer count is checked
        ok = (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)
              and isinstance(entry[1], int) and not isinstance(entry[1], bool) and 0 < entry[1] <= 10_000)
        refuse_unless(ok, f"config.json's attention_types entry {short(entry)} is not [kinds, repeat]")
        refuse_unless(len(kinds) + len(entry[0]) * entry[1] <= MAX_LAYERS,  # before a list of them is made
                      f"config.json's attention_types describe more than {MAX_LAYERS} layers")
        for kind in entry[0]:
            refuse_unless(kind in ("global", "local"), f"GPT-Neo attention type {short(kind)} is not supported")
        kinds += entry[0] * entry[1]
    return kinds


def model_config(hf: dict) -> ModelConfig:
    act = hf.get("activation_function", "gelu_new")
    refuse_unless(act in HF_ACTIVATIONS, f"GPT-Neo activation {short(act)} is not supported")
    n_layers, d = whole(hf, "num_layers"), whole(hf, "hidden_size")
    kinds = layer_kinds(hf)
    # the pattern must name every layer exactly once, or a layer's window would be guessed
    refuse_unless(len(kinds) == n_layers, f"attention_types describe {len(kinds)} layers but num_layers is {n_layers}")
    window = whole(hf, "window_size", 256)  # keys a local layer sees, its query's own included
    inner = hf.get("intermediate_size")  # null in the config means GPT-2's 4 x d_model
    return ModelConfig(
        vocab_size=whole(hf, "vocab_size"),
        block_size=whole(hf, "max_position_embeddings"),
        n_layers=n_layers,
        n_heads=whole(hf, "num_heads"),
        d_model=d,
        d_ff=4 * d if inner is None else whole(hf, "intermediate_size"),
        pos_encoding="learned",
        activation="relu" if act == "relu" else "gelu",
        gelu_approximate="none" if act == "relu" else HF_ACTIVATIONS[act],
        norm_eps=real(hf, "layer_norm_epsilon", 1e-5),
        attn_scale="none",  # GPT-Neo was trained with unscaled q.k scores
        attn_window=tuple(window if k == "local" else 0 for k in kinds),  # 0: a global layer, no window
        bias=True,
        qkv_bias=False,  # q_proj, k_proj and v_proj have no bias; out_proj, the MLP and the norms do
        tie_weights=flag(hf, "tie_word_embeddings", True),
        init="torch",  # every parameter comes from the file, so the init is never seen
    )


def expected_shapes(hf: dict, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, f, V = cfg.d_model, cfg.ff_dim, cfg.vocab_size
    # the same outer names as GPT-2 (so gpt2.ends reads them), but nn.Linear (out, in) weights throughout
    shapes = {"wte.weight": (V, d), "wpe.weight": (cfg.block_size, d), "ln_f.weight": (d,), "ln_f.bias": (d,),
              "lm_head.weight": (V, d)}
    for i in range(cfg.n_layers):
        p, a = f"h.{i}.", f"h.{i}.attn.attention."  # a: GPT-Neo nests the projections one level deeper
        shapes.update({
            p + "ln_1.weight": (d,), p + "ln_1.bias": (d,), p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
            a + "q_proj.weight": (d, d), a + "k_proj.weight": (d, d), a + "v_proj.weight": (d, d),
            a + "out_proj.weight": (d, d), a + "out_proj.bias": (d,),
            p + "mlp.c_fc.weight": (f, d), p + "mlp.c_fc.bias": (f,),
            p + "mlp.c_proj.weight": (d, f), p + "mlp.c_proj.bias": (d,),
        })
    return shapes


def convert(hf: dict, cfg: ModelConfig, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state = ends(cfg, t)
    for i in range(cfg.n_layers):
        p, a, b = f"h.{i}.", f"h.{i}.attn.attention.", f"blocks.{i}."
        state.update({
            b + "norm1.weight": t[p + "ln_1.weight"], b + "norm1.bias": t[p + "ln_1.bias"],
            b + "norm2.weight": t[p + "ln_2.weight"], b + "norm2.bias": t[p + "ln_2.bias"],
            # (3d, d): the query rows, then the key rows, then the value rows, as the engine splits them
            b + "attn.qkv.weight": torch.cat([t[a + "q_proj.weight"], t[a + "k_proj.weight"], t[a + "v_proj.weight"]]),
            b + "attn.proj.weight": t[a + "out_proj.weight"], b + "attn.proj.bias": t[a + "out_proj.bias"],
            b + "ffn.up.weight": t[p + "mlp.c_fc.weight"], b + "ffn.up.bias": t[p + "mlp.c_fc.bias"],
            b + "ffn.down.weight": t[p + "mlp.c_proj.weight"], b + "ffn.down.bias": t[p + "mlp.c_proj.bias"],
        })
    return state


# the ignored names are the causal-mask buffers older files saved; the engine builds its own masks
FAMILY = Family("GPT-Neo", ("gpt_neo",), model_config, expected_shapes, convert, prefixes=("transformer.",),
                ignored=(".attn.attention.bias", ".attn.attention.masked_bias"), optional=("lm_head.weight",))
