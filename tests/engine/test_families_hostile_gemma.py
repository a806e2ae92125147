"""Bad Gemma 2 and Gemma 3 folders are refused with one sentence naming what is wrong, before any weight
is read: every config.json field the Gemma importer reads (wrong type, zero, negative, huge, NaN, NaN
as a string, an unknown rope type), the options it cannot reproduce exactly, Gemma 3's nested
text_config and the multimodal checkpoints, and weights that disagree with the config."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.support.families import save_reference, sharpen
from model.families import open_folder

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

SMALL = dict(vocab_size=300, max_position_embeddings=40, hidden_size=16, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=6, intermediate_size=24, sliding_window=3, bos_token_id=1, eos_token_id=0)
FULL_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A small Gemma 2 and a small Gemma 3 folder (every hostile folder below is a changed copy of one)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

    root = tmp_path_factory.mktemp("good")
    folders = {}
    for name, config_class, model_class, extra in (("gemma2", Gemma2Config, Gemma2ForCausalLM, {}),
                                                   ("gemma3", Gemma3TextConfig, Gemma3ForCausalLM,
                                                    {"sliding_window_pattern": 2})):
        torch.manual_seed(0)
        ref = model_class(config_class(**SMALL, **extra))
        sharpen(ref)
        folders[name] = save_reference(ref, root / name, 300, bos=True)
    return folders


def copy_of(good, kind, tmp_path):
    folder = tmp_path / kind
    shutil.copytree(good[kind], folder)
    return folder


def edit_config(folder, changes):
    """Set each key to its value (None: remove the key; a value wrapped in a 1-tuple: set even if None)."""
    path = folder / "config.json"
    hf = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            hf.pop(key, None)
        else:
            hf[key] = value[0] if isinstance(value, tuple) else value
    path.write_text(json.dumps(hf))


def refused(folder, pattern):
    with pytest.raises(ValueError, match=pattern) as info:
        open_folder(folder)
    sentence = str(info.value)
    assert "\n" not in sentence and "Traceback" not in sentence and len(sentence) < 300
    return sentence


def test_the_good_folders_open(good):
    for kind in ("gemma2", "gemma3"):
        model, tok = open_folder(good[kind])
        assert model.cfg.attn_window == (3, 0, 3, 0) and tok.add_bos


HUGE = 10**400  # a whole number no float holds
# changes valid for both families, each with the words its refusal must contain
BOTH = [
    ({"hidden_activation": "silu"}, "activation 'silu' is not supported"),
    ({"hidden_activation": ["gelu"]}, "activation .* is not supported"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention .* is not supported"),
    ({"use_bidirectional_attention": "no"}, "use_bidirectional_attention .* is not supported"),
    ({"head_dim": 7}, r"\(head_dim\); the rotary step needs an even width"),
    ({"head_dim": "8"}, "head_dim must be a whole number"),
    ({"head_dim": -2}, "head_dim must be a whole number"),
    ({"head_dim": (None,)}, "head_dim must be a whole number"),
    ({"head_dim": 2**40}, "head_dim must be a whole number"),
    ({"head_dim": 2**30}, "parameters; the limit is"),
    ({"num_key_value_heads": 3}, r"num_key_value_heads \(3\) must divide num_attention_heads \(4\)"),
    ({"num_key_value_heads": None}, "config.json has no num_key_value_heads"),
    ({"rms_norm_eps": 2.0}, "rms_norm_eps must be below 1"),
    ({"rms_norm_eps": "NaN"}, "rms_norm_eps must be a positive number"),
    ({"rms_norm_eps": HUGE}, "rms_norm_eps must be a positive number"),
    ({"layer_types": "sliding_attention"}, "layer_types must list one type per layer"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types must list one type per layer"),
    ({"layer_types": ["chunked_attention"] * 4}, "layer type 'chunked_attention' .* is not supported"),
    ({"layer_types": [1, 2, 3, 4]}, "layer type 1 .* is not supported"),
    ({"sliding_window": 0}, "sliding_window must be a whole number from 1"),
    ({"sliding_window": -3}, "sliding_window must be a whole number from 1"),
    ({"sliding_window": 3.5}, "sliding_window must be a whole number from 1"),
    ({"sliding_window": "NaN"}, "sliding_window must be a whole number from 1"),
    ({"sliding_window": (None,)}, "sliding_window must be a whole number from 1"),
    ({"sliding_window": 2**40}, "sliding_window must be a whole number from 1"),
    ({"query_pre_attn_scalar": 24.5}, "query_pre_attn_scalar must be a whole number"),
    ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar must be a whole number"),
    ({"query_pre_attn_scalar": "NaN"}, "query_pre_attn_scalar must be a whole number"),
    ({"final_logit_softcapping": "NaN"}, "final_logit_softcapping must be a positive number"),
    ({"final_logit_softcapping": float("nan")}, "final_logit_softcapping must be a positive number"),
    ({"final_logit_softcapping": -30.0}, "final_logit_softcapping must be a positive number"),
    ({"final_logit_softcapping": 0}, "final_logit_softcapping must be a positive number"),
    ({"final_logit_softcapping": True}, "final_logit_softcapping must be a positive number"),
    ({"final_logit_softcapping": 1e300}, "final_logit_softcapping must be null or a number from"),
    ({"final_logit_softcapping": 1e-9}, "final_logit_softcapping must be null or a number from"),
    ({"attention_bias": 1}, "attention_bias must be true or false"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
]
GEMMA2 = [
    ({"attn_logit_softcapping": "50"}, "attn_logit_softcapping must be a positive number"),
    ({"attn_logit_softcapping": -50.0}, "attn_logit_softcapping must be a positive number"),
    ({"attn_logit_softcapping": HUGE}, "attn_logit_softcapping must be a positive number"),
    ({"attn_logit_softcapping": 1e300}, "attn_logit_softcapping must be null or a number from"),
    ({"rope_parameters": {"full_attention": FULL_ROPE, "sliding_attention": FULL_ROPE}},
     "Gemma 2's rope_parameters must be one object for every layer"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
     "RoPE type 'linear' in a Gemma 2 config is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0}}, "RoPE type 'yarn'"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "RoPE type 'dynamic' in a Gemma 2 config"),
    ({"rope_scaling": "linear"}, "rope_scaling must be an object or null"),
    ({"rope_parameters": "default"}, "rope_parameters must be an object or null"),
    ({"rope_parameters": {**FULL_ROPE, "partial_rotary_factor": 0.5}}, r"partial rotary factor \(0.5\)"),
    ({"rope_parameters": {**FULL_ROPE, "rope_theta": "NaN"}}, "rope_parameters.rope_theta must be a positive number"),
    ({"rope_parameters": {**FULL_ROPE, "rope_theta": 1.0}}, "rope_parameters.rope_theta must be above 1"),
    ({"rope_parameters": None, "rope_theta": HUGE}, "rope_theta must be a positive number"),
    ({"rope_parameters": None, "rope_theta": -1}, "rope_theta must be a positive number"),
]
SLIDING_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def gemma3_rope(full=None, sliding=None):
    return {"rope_parameters": {"full_attention": full or FULL_ROPE, "sliding_attention": sliding or SLIDING_ROPE}}


GEMMA3 = [
    ({"attn_logit_softcapping": 50.0}, "Gemma 3's attn_logit_softcapping is not supported"),
    ({"attn_logit_softcapping": "NaN"}, "Gemma 3's attn_logit_softcapping is not supported"),
    ({"layer_types": None, "sliding_window_pattern": 0}, "sliding_window_pattern must be a whole number from 1"),
    ({"layer_types": None, "sliding_window_pattern": "6"}, "sliding_window_pattern must be a whole number from 1"),
    ({"layer_types": None, "sliding_window_pattern": (None,)}, "sliding_window_pattern must be a whole number"),
    ({"rope_parameters": FULL_ROPE}, "Gemma 3's rope_parameters must be given per layer type"),
    ({"rope_parameters": "x"}, "rope_parameters must be an object"),
    ({"rope_parameters": {"full_attention": "linear"}}, "rope_parameters.full_attention must be an object"),
    (gemma3_rope({"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e6}), "RoPE type 'yarn' on Gemma 3's full"),
    (gemma3_rope({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}), "RoPE type 'dynamic' on Gemma 3's"),
    (gemma3_rope({"rope_type": 7, "rope_theta": 1e6}), "RoPE type 7 on Gemma 3's full_attention layers"),
    (gemma3_rope(sliding={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
     "RoPE type 'linear' on Gemma 3's sliding_attention layers is not supported"),
    (gemma3_rope({"rope_type": "linear", "factor": 0.5, "rope_theta": 1e6}), r"full_attention.factor .* at least 1"),
    (gemma3_rope({"rope_type": "linear", "factor": "NaN", "rope_theta": 1e6}),
     "rope_parameters.full_attention.factor must be a positive number"),
    (gemma3_rope({"rope_type": "linear", "rope_theta": 1e6}), "has no rope_parameters.full_attention.factor"),
    (gemma3_rope({"rope_type": "linear", "factor": HUGE, "rope_theta": 1e6}), "factor must be a positive number"),
    (gemma3_rope({"rope_type": "default", "type": "linear", "factor": 2.0, "rope_theta": 1e6}), "two rope types"),
    (gemma3_rope({**FULL_ROPE, "rope_theta": "NaN"}), "full_attention.rope_theta must be a positive number"),
    (gemma3_rope(sliding={**SLIDING_ROPE, "rope_theta": 0.5}), "sliding_attention.rope_theta must be above 1"),
    (gemma3_rope({**FULL_ROPE, "partial_rotary_factor": 0.25}), r"partial rotary factor \(0.25\)"),
    ({"rope_parameters": None, "rope_scaling": "linear"}, "rope_scaling must be an object or null"),
    # the older form: a "type" key next to the default rope_type is read differently by transformers 4 and 5
    ({"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 2.0}}, "two rope types"),
    ({"rope_parameters": None, "rope_local_base_freq": "NaN"}, "rope_local_base_freq must be a positive number"),
    ({"rope_parameters": None, "rope_local_base_freq": 1}, "rope_local_base_freq must be above 1"),
    ({"rope_parameters": None, "rope_theta": 0.5}, "rope_theta must be above 1"),
    ({"rope_parameters": None, "rope_theta": HUGE}, "rope_theta must be a positive number"),
]


@pytest.mark.parametrize("kind, changes, pattern",
                         [(kind, c, p) for kind in ("gemma2", "gemma3") for c, p in BOTH]
                         + [("gemma2", c, p) for c, p in GEMMA2] + [("gemma3", c, p) for c, p in GEMMA3])
def test_hostile_config_fields_are_refused_by_name(good, tmp_path, kind, changes, pattern):
    folder = copy_of(good, kind, tmp_path)
    edit_config(folder, changes)
    refused(folder, pattern)


def nested(folder, **top):
    """config.json as a model_type gemma3 file: the text model's config in text_config, `top` beside it."""
    path = folder / "config.json"
    text = json.loads(path.read_text())
    path.write_text(json.dumps({"model_type": "gemma3", "text_config": text, **top}))


@pytest.mark.parametrize("top, pattern", [
    ({"vision_config": {"model_type": "siglip_vision_model"}}, "multimodal Gemma 3 folder .* text-only"),
    ({"text_config": None}, "must hold the text model's config in text_config"),
    ({"text_config": "gemma3_text"}, "must hold the text model's config in text_config"),
    ({"text_config": {"model_type": "llama"}}, "must be a gemma3_text config, got model_type 'llama'"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings and its text_config's disagree"),
])
def test_hostile_nested_gemma3_configs(good, tmp_path, top, pattern):
    folder = copy_of(good, "gemma3", tmp_path)
    nested(folder)
    path = folder / "config.json"
    hf = json.loads(path.read_text())
    hf["text_config"]["tie_word_embeddings"] = True
    path.write_text(json.dumps({**hf, **top}))
    refused(folder, pattern)


def test_a_multimodal_gemma3_checkpoint_is_refused_with_a_sentence(tmp_path):
    """A real (tiny) Gemma3ForConditionalGeneration folder: its vision tower is not read, so the folder
    is refused by name, pointing to the text-only checkpoints."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {k: v for k, v in SMALL.items() if k not in ("bos_token_id", "eos_token_id")}
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4))
    folder = save_reference(model, tmp_path / "gemma3-mm", 300, bos=True)
    sentence = refused(folder, "multimodal Gemma 3 folder")
    assert "gemma3_text" in sentence and "vision" in sentence


@pytest.mark.parametrize("kind, change, pattern", [
    ("gemma3", lambda t: t.pop("model.layers.1.self_attn.q_norm.weight"), "lack the tensor layers.1.self_attn.q_norm"),
    ("gemma3", lambda t: t.update({"model.layers.0.self_attn.k_norm.weight": torch.ones(5)}),
     r"k_norm.weight' has shape \[5\] but this config.json needs \[6\]"),
    ("gemma2", lambda t: t.update({"model.layers.0.self_attn.q_norm.weight": torch.ones(6)}),
     "a Gemma 2 model with this config.json does not have"),
    ("gemma2", lambda t: t.update({"model.layers.0.self_attn.q_proj.weight": torch.ones(16, 16)}),
     r"has shape \[16, 16\] but this config.json needs \[24, 16\]"),
])
def test_weights_that_disagree_with_the_config(good, tmp_path, kind, change, pattern):
    folder = copy_of(good, kind, tmp_path)
    path = folder / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)
    refused(folder, pattern)
