"""Bad OLMo 2 and Phi-3 folders are refused with one sentence naming what is wrong, before anything
large is allocated: every config.json field the two importers read given the wrong type, a negative,
zero, huge or NaN value (as a string and as JSON's NaN), the rotary scalings neither engine nor family
computes (Phi-3's longrope under each of its names), and weights whose fused or per-head shapes
disagree with the config.
"""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from model.families import open_folder
from tests.support.olmo_phi import edit_config, olmo2_reference, phi3_reference, run

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

HUGE = 2**40
REMOVE = "(removed)"  # the key taken out of config.json (None writes JSON's null)
SHARED = [  # fields both importers read, and how each bad value is answered
    ({"hidden_act": "gelu"}, "activation 'gelu' is not supported"),
    ({"hidden_act": REMOVE}, None),  # absent: silu, transformers' default
    ({"num_key_value_heads": 3}, r"num_key_value_heads \(3\) must divide num_attention_heads \(4\)"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be a whole number from 1"),
    ({"num_key_value_heads": "2"}, "num_key_value_heads must be a whole number"),
    ({"num_attention_heads": -4}, "num_attention_heads must be a whole number from 1"),
    ({"hidden_size": 2.5}, "hidden_size must be a whole number"),
    ({"hidden_size": HUGE}, "hidden_size must be a whole number from 1 to 2,147,483,647"),
    ({"vocab_size": "NaN"}, "vocab_size must be a whole number"),
    ({"intermediate_size": 10**9}, "parameters; the limit is"),
    ({"num_hidden_layers": 1000}, "1,000 layers; at most 256"),
    ({"max_position_embeddings": 10**9}, "positions; at most 131,072"),
    ({"max_position_embeddings": True}, "max_position_embeddings must be a whole number"),
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps must be a positive number, got '1e-6'"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps must be a positive number"),
    ({"rms_norm_eps": 0}, "rms_norm_eps must be a positive number"),
    ({"rms_norm_eps": 2.0}, "rms_norm_eps must be below 1"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ({"head_dim": -8}, "head_dim must be a whole number from 1"),
    ({"head_dim": "8"}, "head_dim must be a whole number"),
    ({"head_dim": 7}, "7 dimensions wide .*needs an even width"),
    ({"head_dim": HUGE}, "head_dim must be a whole number from 1 to"),
    ({"head_dim": 2**24}, "parameters; the limit is"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}}, "'yarn'.* not supported"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
     "'dynamic'.* not supported"),
    ({"rope_parameters": {"rope_type": "bogus", "rope_theta": 10000.0}}, "'bogus'.* not supported"),
    ({"rope_parameters": "default"}, "rope_parameters must be an object"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
     "rope_parameters gives layer types their own rotary"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "NaN"}}, "rope_theta must be a positive number"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -10000.0}}, "rope_theta must be a positive number"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1.0}}, "rope theta must be above 1"),
    ({"rope_parameters": REMOVE, "rope_theta": 1e400}, "rope_theta must be a positive number"),  # JSON's Infinity
    ({"rope_parameters": REMOVE, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "'dynamic'.* not supported"),
]
OLMO2 = [
    ({"attention_bias": "yes"}, "attention_bias must be true or false"),
    ({"attention_bias": 1}, "attention_bias must be true or false"),
    ({"head_dim": None}, "head_dim must be a whole number, got null"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
     r"partial rotary factor \(0.5\) in an OLMo 2 config is not supported; OLMo 2 rotates the whole head"),
    ({"model_type": "olmo"}, "model_type 'olmo' is not a supported architecture"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                          "original_max_position_embeddings": 16, "rope_theta": 10000.0}},
     r"high_freq_factor \(1.0\) must be above its low_freq_factor \(4.0\)"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": -16, "rope_theta": 10000.0}},
     "original_max_position_embeddings must be a whole number from 1"),
    ({"rope_parameters": {"rope_type": "linear", "factor": "NaN", "rope_theta": 10000.0}},
     "rope_parameters.factor must be a positive number"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0}}, "no rope_parameters.factor"),
]
PHI3 = [
    # LongRoPE opens within its original context (tests/engine/test_families_phi3.py); its numbers are checked
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 3, "long_factor": [2.0] * 3}}, None),
    ({"rope_scaling": {"type": "su", "short_factor": [1.0] * 3, "long_factor": [2.0] * 3}}, None),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}},
     "longrope short_factor must list 3 numbers"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0, "x", 1.0]}}, "short_factor must be a positive"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 3, "attention_factor": -1}},
     "attention_factor must be a positive"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0}}, "'yarn' .*is not supported"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 10000.0}},
     "RoPE scaling type 'llama3' is not supported for Phi-3"),
    ({"rope_scaling": "longrope"}, "rope_scaling must be an object"),
    ({"sliding_window": 0}, "sliding_window must be a whole number from 1"),
    ({"sliding_window": -4}, "sliding_window must be a whole number from 1"),
    ({"sliding_window": "4"}, "sliding_window must be a whole number"),
    ({"sliding_window": 4.5}, "sliding_window must be a whole number"),
    ({"sliding_window": True}, "sliding_window must be a whole number"),
    ({"sliding_window": HUGE}, "sliding_window must be a whole number from 1 to 2,147,483,647"),
    ({"sliding_window": None}, None),  # null: no window, every key
    ({"sliding_window": REMOVE}, None),
    ({"partial_rotary_factor": 0.375, "rope_parameters": REMOVE}, "partial_rotary_factor 0.375 rotates 3 of each"),
    ({"partial_rotary_factor": 0.1, "rope_parameters": REMOVE}, "rotates 0 of each head's 8 dimensions"),
    ({"partial_rotary_factor": 1.5, "rope_parameters": REMOVE}, "rotary fraction must be at most 1"),
    ({"partial_rotary_factor": "0.75", "rope_parameters": REMOVE}, "partial_rotary_factor must be a positive number"),
    ({"partial_rotary_factor": 0, "rope_parameters": REMOVE}, "partial_rotary_factor must be a positive number"),
    ({"partial_rotary_factor": -0.5, "rope_parameters": REMOVE}, "partial_rotary_factor must be a positive number"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1e400}},
     "partial_rotary_factor must be a positive number"),
]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("good")
    return {"olmo2": olmo2_reference(root / "olmo2", attention_bias=True)[1],
            "phi3": phi3_reference(root / "phi3", partial_rotary_factor=0.75, sliding_window=4)[1]}


def copy_of(folder, tmp_path):
    shutil.copytree(folder, tmp_path / "copy")
    return tmp_path / "copy"


def refused(folder, pattern):
    with pytest.raises(ValueError, match=pattern) as info:
        open_folder(folder)
    sentence = str(info.value)
    assert "\n" not in sentence and "Traceback" not in sentence and len(sentence) < 300
    return sentence


def check(good, family, changes, pattern, tmp_path):
    folder = copy_of(good[family], tmp_path)
    path = folder / "config.json"
    hf = json.loads(path.read_text())
    for key, value in changes.items():
        if value == REMOVE:
            hf.pop(key, None)
        else:
            hf[key] = value
    path.write_text(json.dumps(hf))
    if pattern is None:
        model, _ = open_folder(folder)
        assert model.cfg.activation == "swiglu"
    else:
        refused(folder, pattern)


@pytest.mark.parametrize("changes, pattern", SHARED + OLMO2)
def test_olmo2_config_fields_are_refused_by_name(good, changes, pattern, tmp_path):
    check(good, "olmo2", changes, pattern, tmp_path)


@pytest.mark.parametrize("changes, pattern", SHARED + PHI3)
def test_phi3_config_fields_are_refused_by_name(good, changes, pattern, tmp_path):
    check(good, "phi3", changes, pattern, tmp_path)


def test_nan_written_as_json_nan_is_refused(good, tmp_path):
    """Python's json writes and reads NaN and Infinity bare; they are numbers no field may hold."""
    for family, key in (("olmo2", "rms_norm_eps"), ("phi3", "partial_rotary_factor"), ("phi3", "sliding_window")):
        folder = copy_of(good[family], tmp_path / f"{family}-{key}")
        hf = json.loads((folder / "config.json").read_text())
        hf[key] = float("nan")
        if key == "partial_rotary_factor":  # read from the top level when there is no rope_parameters
            del hf["rope_parameters"]
        (folder / "config.json").write_text(json.dumps(hf))
        assert "NaN" in (folder / "config.json").read_text()
        refused(folder, f"{key} must be a (positive|whole) number")


def edit_weights(folder, change):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)


def test_weights_that_disagree_with_the_config_are_refused(good, tmp_path):
    # OLMo 2: a missing q/k norm, a k norm as wide as the queries' (H*hs, not Hkv*hs)
    folder = copy_of(good["olmo2"], tmp_path / "a")
    edit_weights(folder, lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    refused(folder, "lack the tensor layers.1.self_attn.k_norm.weight")
    folder = copy_of(good["olmo2"], tmp_path / "b")
    edit_weights(folder, lambda t: t.update({"model.layers.0.self_attn.k_norm.weight":
                                             t["model.layers.0.self_attn.q_norm.weight"].clone()}))
    refused(folder, r"k_norm.weight' has shape \[24\] but this config.json needs \[12\]")
    # OLMo 2 without attention biases in the config but with them in the file
    folder = copy_of(good["olmo2"], tmp_path / "c")
    edit_config(folder, attention_bias=False)
    refused(folder, "_proj.bias' that a OLMo 2 model with this config.json does not have")
    # Phi-3: a fused projection laid out for another number of key/value heads; a missing gate_up
    folder = copy_of(good["phi3"], tmp_path / "d")
    edit_config(folder, num_key_value_heads=1)
    refused(folder, r"qkv_proj.we.* has shape \[64, 32\] but this config.json needs \[48, 32\]")
    folder = copy_of(good["phi3"], tmp_path / "e")
    edit_weights(folder, lambda t: t.pop("model.layers.0.mlp.gate_up_proj.weight"))
    refused(folder, "lack the tensor layers.0.mlp.gate_up_proj.weight")


@pytest.mark.slow
def test_the_command_line_refuses_in_one_line(good, tmp_path):
    folder = copy_of(good["phi3"], tmp_path)
    edit_config(folder, rope_scaling={"type": "yarn", "factor": 2.0})
    done = run("model.generate", "--checkpoint", str(folder), "--prompt", "Once upon", "--max-new-tokens", "2")
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "RoPE scaling type 'yarn' is not supported for Phi-3" in lines[0], done.stderr
