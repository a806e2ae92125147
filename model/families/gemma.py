"""Gemma 2 (Gemma Team 2024) and Gemma 3 text models (Gemma Team 2025) into the engine.

Behaviour in the config, read from config.json as transformers' Gemma2ForCausalLM / Gemma3ForCausalLM
read it (their class defaults where a key is absent):

* RMSNorm that multiplies by (1 + w): the files store w, the engine keeps it and says norm_offset=1;
* the token embedding times sqrt(hidden_size) (embed_scale), rounded to the weights' dtype as they do;
* four norms per layer (norm="sandwich"): before and after the attention, before and after the MLP;
* heads head_dim wide whatever hidden_size is (head_size), scores scaled by 1/sqrt(query_pre_attn_scalar)
  (query_scale_dim) instead of 1/sqrt(head_dim);
* local and global layers: each layer's type comes from layer_types, or from the older keys (Gemma 2
  alternates, local first; Gemma 3 has sliding_window_pattern - 1 local layers, then a global one); a
  local layer sees its last sliding_window keys, its own included (attn_window);
* Gemma 2: tanh soft-capping of the scores (attn_logit_softcapping) and of the logits
  (final_logit_softcapping); Gemma 3 caps the logits only when its config asks;
* Gemma 3: RMSNorm of each head's query and key before the rotary step (qk_norm="head"), and a rotary
  base per layer type: the global layers' rope_theta with an optional linear scaling (pe_base,
  rope_scaling), the local layers' own base unscaled (local_rope_base; rope_local_base_freq in the
  older files);
* GeGLU (gelu_pytorch_tanh: activation="geglu", gelu_approximate="tanh"), tied embeddings, a BOS
  token the tokenizer puts first.

Anything transformers' classes would compute differently, or that they do not compute at all (a
bidirectional mask, another rope type, Gemma 3's score soft-cap, which transformers ignores), is
refused by name. config.json may be transformers 5's (rope_parameters, per layer type for Gemma 3;
layer_types) or the older one (rope_theta, rope_scaling, rope_local_base_freq, sliding_window_pattern).
A model_type "gemma3" folder nests the text model's config in text_config; it is read when the folder
holds the text model alone (names under language_model.model. or model.language_model.); the
multimodal checkpoints, which also hold a vision tower, are refused with a sentence.

Re-laid weights: q, k, v join the engine's one projection; each query and key head goes from
rotate-half order to consecutive pairs (common.pairs_from_halves), and so do the q/k norm weights (the
norm's mean of squares is the same in any order; each weight follows its dimension) and the biases;
gate and up join the engine's `up` (gate rows first).
"""

from __future__ import annotations

import math

import torch

from ..config import ModelConfig
from .common import Family, embedding_and_head, flag, pairs_from_halves, refuse_unless, short, whole

SLIDING, FULL = "sliding_attention", "full_attention"
# transformers' activation names -> the GELU form of the engine's GeGLU gate (both exact in torch)
GELU_FORMS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}
# Soft-caps Gemma uses are 30 and 50; far outside this range float32 turns the cap into 0 or infinity,
# which neither the engine nor the reference can compute with
SOFTCAP_RANGE = (1e-3, 1e6)
# transformers' class defaults for keys a config.json may leave out (Gemma2Config, Gemma3TextConfig)
DEFAULTS = {
    "gemma2": {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    "gemma3": {"attn_logit_softcapping": None, "final_logit_softcapping": None},
}


def text_config(hf: dict) -> dict:
    """The text model's config: config.json itself, or a model_type "gemma3" file's text_config."""
    if hf.get("model_type") != "gemma3":
        return hf
    refuse_unless(hf.get("vision_config") is None,
                  "this is a multimodal Gemma 3 folder (its config.json has a vision_config and its weights a "
                  "vision tower, which Decoder Lab does not read); open a text-only Gemma 3 checkpoint "
                  "(model_type gemma3_text, such as gemma-3-270m or gemma-3-1b) instead")
    text = hf.get("text_config")
    refuse_unless(isinstance(text, dict), "a model_type gemma3 config.json must hold the text model's config "
                                          "in text_config")
    kind = text.get("model_type", "gemma3_text")
    refuse_unless(kind == "gemma3_text", f"the text_config of a Gemma 3 folder must be a gemma3_text config, "
                                         f"got model_type {short(kind)}")
    top, inner = hf.get("tie_word_embeddings"), text.get("tie_word_embeddings")
    refuse_unless(top is None or inner is None or top == inner,
                  "config.json's tie_word_embeddings and its text_config's disagree")
    tie = top if top is not None else inner
    return {**text, "model_type": "gemma3_text", **({} if tie is None else {"tie_word_embeddings": tie})}


def gemma2_config(hf: dict) -> ModelConfig:
    return gemma_config(hf, gemma3=False)


def gemma3_config(hf: dict) -> ModelConfig:
    return gemma_config(text_config(hf), gemma3=True)


def gemma_config(hf: dict, gemma3: bool) -> ModelConfig:
    """The engine's config from a Gemma 2 or Gemma 3 text config (see the module docstring)."""
    name = "Gemma 3" if gemma3 else "Gemma 2"
    act = hf.get("hidden_activation", "gelu_pytorch_tanh")  # hidden_act, if present, is ignored by both
    refuse_unless(isinstance(act, str) and act in GELU_FORMS,
                  f"{name} activation {short(act)} is not supported (supported: {', '.join(GELU_FORMS)})")
    both_ways = hf.get("use_bidirectional_attention")
    refuse_unless(both_ways is None or both_ways is False,
                  f"{name}'s use_bidirectional_attention ({short(both_ways)}) is not supported: Decoder Lab "
                  "shows causal decoders")
    d, H = whole(hf, "hidden_size"), whole(hf, "num_attention_heads")
    n_layers = whole(hf, "num_hidden_layers")
    head_dim = whole(hf, "head_dim", 256)
    refuse_unless(head_dim % 2 == 0, f"each head is {head_dim} dimensions wide (head_dim); the rotary step needs "
                                     "an even width")
    kv = whole(hf, "num_key_value_heads")  # transformers' default (4) is no reading of the model's own sizes
    refuse_unless(H % kv == 0, f"config.json's num_key_value_heads ({kv}) must divide num_attention_heads ({H})")
    eps = number(hf, "rms_norm_eps", default=1e-6)
    refuse_unless(eps < 1.0, f"config.json's rms_norm_eps must be below 1, got {eps}")
    sliding = local_layers(hf, n_layers, gemma3)
    window = whole(hf, "sliding_window", 4096) if any(sliding) else 0
    defaults = DEFAULTS["gemma3" if gemma3 else "gemma2"]
    if gemma3:
        # transformers' Gemma 3 never passes this cap to its attention: a file asking for it describes
        # a computation the reference does not run
        refuse_unless(hf.get("attn_logit_softcapping") is None,
                      "Gemma 3's attn_logit_softcapping is not supported (transformers' Gemma 3 does not apply it)")
        pe_base, scaling, local_base = gemma3_rope(hf)
    else:
        pe_base, scaling, local_base = gemma2_rope(hf), (), None
    bias = flag(hf, "attention_bias", False)
    return ModelConfig(
        vocab_size=whole(hf, "vocab_size"),
        block_size=whole(hf, "max_position_embeddings"),
        n_layers=n_layers,
        n_heads=H,
        n_kv_heads=kv,
        d_model=d,
        d_ff=whole(hf, "intermediate_size"),
        head_size=head_dim,
        pos_encoding="rope",
        pe_base=pe_base,
        rope_scaling=scaling,
        local_rope_base=local_base,
        rope_precision="float32",  # the angles transformers computes, so logits match the reference
        attn_window=tuple(window if s else 0 for s in sliding),
        norm="sandwich",
        norm_kind="rmsnorm",
        norm_eps=eps,
        norm_offset=1.0,
        qk_norm="head" if gemma3 else "none",
        query_scale_dim=whole(hf, "query_pre_attn_scalar", 256),
        attn_softcap=softcap(hf, "attn_logit_softcapping", defaults["attn_logit_softcapping"]),
        logit_softcap=softcap(hf, "final_logit_softcapping", defaults["final_logit_softcapping"]),
        embed_scale=d**0.5,  # as transformers computes it; the forward rounds it to the weights' dtype
        activation="geglu",
        gelu_approximate=GELU_FORMS[act],
        bias=False,
        qkv_bias=bias,
        attn_out_bias=bias,
        mlp_bias=False,
        norm_bias=False,
        tie_weights=flag(hf, "tie_word_embeddings", True),
        init="torch",  # every parameter is overwritten by the file, so the cheap default init will do
    )


def local_layers(hf: dict, n_layers: int, gemma3: bool) -> list[bool]:
    """Whether each layer is local (a sliding window) rather than global, as transformers reads it:
    layer_types when given, else Gemma 2's alternation (local first) or Gemma 3's sliding_window_pattern
    (every pattern-th layer global, the others local)."""
    types = hf.get("layer_types")
    if types is not None:
        refuse_unless(isinstance(types, list) and len(types) == n_layers,
                      f"config.json's layer_types must list one type per layer ({n_layers})")
        for kind in types:
            refuse_unless(kind in (SLIDING, FULL), f"layer type {short(kind)} in config.json's layer_types is not "
                                                   f"supported (only {SLIDING} and {FULL})")
        return [kind == SLIDING for kind in types]
    pattern = whole(hf, "sliding_window_pattern", 6) if gemma3 else 2
    return [bool((i + 1) % pattern) for i in range(n_layers)]


def softcap(hf: dict, key: str, default: float | None) -> float | None:
    """A soft-cap from config.json: None (null) for none, else a positive number in SOFTCAP_RANGE."""
    value = hf.get(key, default)
    if value is None:
        return None
    cap = number(hf, key, default=default)
    lo, hi = SOFTCAP_RANGE
    refuse_unless(lo <= cap <= hi, f"config.json's {key} must be null or a number from {lo} to {hi:,.0f}, got {cap}")
    return cap


def gemma2_rope(hf: dict) -> float:
    """Gemma 2's one rotary base (every layer turns with it, unscaled), gathered as transformers does: an
    older rope_scaling object takes the place of rope_parameters; rope_theta (else 10,000) where it gives
    no base."""
    scaling, params = hf.get("rope_scaling"), hf.get("rope_parameters")
    for key, value in (("rope_scaling", scaling), ("rope_parameters", params)):
        refuse_unless(value is None or isinstance(value, dict), f"config.json's {key} must be an object or null")
    p = scaling or params or {}
    refuse_unless(not ({SLIDING, FULL} & set(p)),
                  "Gemma 2's rope_parameters must be one object for every layer, not one per layer type")
    for key in ("rope_type", "type"):
        refuse_unless(p.get(key, "default") == "default",
                      f"RoPE type {short(p.get(key))} in a Gemma 2 config is not supported; only the default rotary is")
    check_whole_head(p.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    if p.get("rope_theta") is not None:
        theta, name = number(p, "rope_theta", "rope_parameters"), "rope_parameters.rope_theta"
    else:
        theta = number(hf, "rope_theta") if hf.get("rope_theta") is not None else 10_000.0
        name = "rope_theta"
    refuse_unless(theta > 1.0, f"config.json's {name} must be above 1, got {theta}")
    return theta


def check_whole_head(fraction) -> None:
    """transformers' Gemma rotates the whole head whatever a partial rotary factor says (or fails on it)."""
    refuse_unless(fraction == 1.0 and not isinstance(fraction, bool),
                  f"a partial rotary factor ({short(fraction)}) in a Gemma config is not supported; "
                  "Gemma rotates the whole head")


def gemma3_rope(hf: dict) -> tuple[float, tuple, float]:
    """(global base, global scaling, local base), gathered as transformers' Gemma3TextConfig does: the
    per-layer-type rope_parameters, updated by an older top-level rope_scaling, with rope_theta and
    rope_local_base_freq (else 1,000,000 and 10,000) where they give no base."""
    params = hf.get("rope_parameters")
    if params is None:
        params = {}
    refuse_unless(isinstance(params, dict), "config.json's rope_parameters must be an object")
    # a flat object (no layer types) is ignored by transformers' Gemma 3: which base was meant is unknown
    refuse_unless(set(params) <= {SLIDING, FULL}, "Gemma 3's rope_parameters must be given per layer type "
                                                  f"({FULL} and {SLIDING})")
    for kind in (FULL, SLIDING):
        refuse_unless(params.get(kind) is None or isinstance(params[kind], dict),
                      f"config.json's rope_parameters.{kind} must be an object")
    full = dict(params.get(FULL) or {"rope_type": "default"})
    local = dict(params.get(SLIDING) or {"rope_type": "default"})
    scaling = hf.get("rope_scaling")
    refuse_unless(scaling is None or isinstance(scaling, dict), "config.json's rope_scaling must be an object or null")
    full.update(scaling or {})
    # the older top-level bases (each named in a refusal by its own key), where the layer type gives none
    named = {}  # where each base was read, for a refusal to name
    for kind, p, key, default in ((FULL, full, "rope_theta", 1_000_000.0),
                                  (SLIDING, local, "rope_local_base_freq", 10_000.0)):
        named[kind] = f"rope_parameters.{kind}.rope_theta"
        if "rope_theta" not in p:
            p["rope_theta"] = number(hf, key) if hf.get(key) is not None else default
            named[kind] = key
    scaled = ()
    for kind, p in ((FULL, full), (SLIDING, local)):
        where = f"rope_parameters.{kind}"
        rope_type = p.get("rope_type", p.get("type", "default"))
        refuse_unless(p.get("type", rope_type) == rope_type,
                      f"the {kind} layers' rope parameters name two rope types ({short(rope_type)} and "
                      f"{short(p.get('type'))}); which one applies is unclear")
        allowed = ("default", "linear") if kind == FULL else ("default",)
        refuse_unless(rope_type in allowed, f"RoPE type {short(rope_type)} on Gemma 3's {kind} layers is not "
                                            f"supported (only {' and '.join(allowed)})")
        check_whole_head(p.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
        if rope_type == "linear":
            factor = number(p, "factor", where)
            refuse_unless(factor >= 1.0, f"config.json's {where}.factor (linear rope scaling) must be at least 1, "
                                         f"got {factor}")
            scaled = ("linear", factor)
        base = number(p, "rope_theta", where)
        refuse_unless(base > 1.0, f"config.json's {named[kind]} must be above 1, got {base}")
    return float(full["rope_theta"]), scaled, float(local["rope_theta"])


def number(p: dict, key: str, where: str = "", default: float | None = None) -> float:
    """p[key] (default when absent) as a positive finite number, or a ValueError naming where in
    config.json it sits. Unlike common.real, a whole number too large for a float is refused in words too."""
    value = p.get(key, default)
    name = f"{where}.{key}" if where else key
    if value is None:
        raise ValueError(f"config.json has no {name}")
    try:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    except OverflowError:  # an integer past float's range
        ok = False
    refuse_unless(ok, f"config.json's {name} must be a positive number, got {short(value)}")
    return float(value)


def expected_shapes(hf: dict, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, f, V, a, hs = cfg.d_model, cfg.ff_dim, cfg.vocab_size, cfg.attn_dim, cfg.head_dim
    kv = cfg.kv_heads * hs
    shapes = {"embed_tokens.weight": (V, d), "norm.weight": (d,), "lm_head.weight": (V, d)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
            p + "pre_feedforward_layernorm.weight": (d,), p + "post_feedforward_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (a, d), p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, a),
            p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f),
        })
        if cfg.qk_norm == "head":
            shapes.update({p + "self_attn.q_norm.weight": (hs,), p + "self_attn.k_norm.weight": (hs,)})
        if cfg.part_bias("qkv"):
            shapes.update({p + "self_attn.q_proj.bias": (a,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,), p + "self_attn.o_proj.bias": (d,)})
    return shapes


def convert(hf: dict, cfg: ModelConfig, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    H, Hkv, hs, r = cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.rope_dim
    state = embedding_and_head(cfg, t)  # tok_emb, norm_f and an untied head (checked against the file)
    for i in range(cfg.n_layers):
        n, p, b, m = f"layers.{i}.", f"layers.{i}.self_attn.", f"blocks.{i}.", f"layers.{i}.mlp."

        def qkv(kind: str) -> torch.Tensor:  # (H + 2 Hkv) * hs rows: queries, keys, values
            q = pairs_from_halves(t[p + f"q_proj.{kind}"], H, hs, r)
            k = pairs_from_halves(t[p + f"k_proj.{kind}"], Hkv, hs, r)
            return torch.cat([q, k, t[p + f"v_proj.{kind}"]]).contiguous()

        state.update({
            b + "norm1.weight": t[n + "input_layernorm.weight"],
            b + "post_norm1.weight": t[n + "post_attention_layernorm.weight"],
            b + "norm2.weight": t[n + "pre_feedforward_layernorm.weight"],
            b + "post_norm2.weight": t[n + "post_feedforward_layernorm.weight"],
            b + "attn.qkv.weight": qkv("weight"), b + "attn.proj.weight": t[p + "o_proj.weight"],
            b + "ffn.up.weight": torch.cat([t[m + "gate_proj.weight"], t[m + "up_proj.weight"]]),
            b + "ffn.down.weight": t[m + "down_proj.weight"],
        })
        if cfg.qk_norm == "head":  # one weight per dimension, shared by every head: re-laid as one head's
            state[b + "attn.q_norm.weight"] = pairs_from_halves(t[p + "q_norm.weight"], 1, hs, r).contiguous()
            state[b + "attn.k_norm.weight"] = pairs_from_halves(t[p + "k_norm.weight"], 1, hs, r).contiguous()
        if cfg.part_bias("qkv"):
            state[b + "attn.qkv.bias"] = qkv("bias")
            state[b + "attn.proj.bias"] = t[p + "o_proj.bias"]
    return state


# Gemma 3's multimodal layout (model_type "gemma3") puts the text model under language_model: its files
# (also those transformers 5 writes) name language_model.model.layers... and language_model.lm_head,
# transformers 5's modules model.language_model.layers...; the longer prefixes are tried first
GEMMA2 = Family("Gemma 2", ("gemma2",), gemma2_config, expected_shapes, convert, prefixes=("model.",),
                ignored=("inv_freq",), optional=("lm_head.weight",), adds_bos=True)
GEMMA3 = Family("Gemma 3", ("gemma3_text", "gemma3"), gemma3_config, expected_shapes, convert,
                prefixes=("model.language_model.", "language_model.model.", "language_model.", "model."),
                ignored=("inv_freq",), optional=("lm_head.weight",), adds_bos=True)
