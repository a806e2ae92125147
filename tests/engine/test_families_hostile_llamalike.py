"""Hostile config.json values of the fields the Llama-like importers read (Llama 3's rope scaling, Qwen2's
and Qwen3's sliding windows, head_dim and attention_bias, SmolLM3's no_rope_layers), each refused with one
sentence naming the field before any weight is read: wrong types, negative or zero, huge, NaN written as a
string, rope types the engine does not compute (yarn, dynamic, longrope), windows whose meaning the
reference's own kernels disagree on. Also weights that disagree with such a config, and the command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.support.llamalike import NULL, ROOT, build, edit_config
from model.families import open_folder

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

SMALL = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=24)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16, "rope_theta": 500000.0}


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """One small folder per family (every hostile folder below is a changed copy of one)."""
    t = transformers
    root = tmp_path_factory.mktemp("good")
    made = {
        "llama": (t.LlamaForCausalLM, t.LlamaConfig, dict(rope_parameters=dict(LLAMA3))),
        "qwen2": (t.Qwen2ForCausalLM, t.Qwen2Config, dict(use_sliding_window=True, sliding_window=3, max_window_layers=1)),
        "qwen3": (t.Qwen3ForCausalLM, t.Qwen3Config, dict(head_dim=8, attention_bias=True)),
        "smollm3": (t.SmolLM3ForCausalLM, t.SmolLM3Config, dict(no_rope_layers=[1, 0], pad_token_id=None)),
    }
    return {name: build(model, config, root / name, **SMALL, **extra)[1] for name, (model, config, extra) in made.items()}


def copy_of(good, family, tmp_path):
    folder = tmp_path / family
    shutil.copytree(good[family], folder)
    return folder


def refused(folder, pattern):
    with pytest.raises(ValueError, match=pattern) as info:
        open_folder(folder)
    sentence = str(info.value)
    assert "\n" not in sentence and "Traceback" not in sentence and len(sentence) < 300
    return sentence


def test_the_good_folders_open(good):
    cfgs = {name: open_folder(folder)[0].cfg for name, folder in good.items()}
    assert cfgs["llama"].rope_scaling == ("llama3", 8.0, 1.0, 4.0, 16)
    assert cfgs["qwen2"].attn_window == (0, 3) and cfgs["qwen3"].qk_norm == "head"
    assert cfgs["smollm3"].rope_off_layers == (1,)


def rope(**changes):
    """Llama 3's rope_parameters with `changes` (None removes a key)."""
    out = dict(LLAMA3)
    for key, value in changes.items():
        if value is None:
            out.pop(key)
        else:
            out[key] = value
    return out


ROPE = [
    ({"rope_parameters": rope(factor="NaN")}, r"rope_parameters\.factor must be a positive number, got 'NaN'"),
    ({"rope_parameters": rope(factor=-8.0)}, r"rope_parameters\.factor must be a positive number"),
    ({"rope_parameters": rope(factor=None)}, r"config\.json has no rope_parameters\.factor"),
    ({"rope_parameters": rope(low_freq_factor=[1])}, r"rope_parameters\.low_freq_factor must be a positive number"),
    ({"rope_parameters": rope(high_freq_factor=True)}, r"rope_parameters\.high_freq_factor must be a positive"),
    ({"rope_parameters": rope(high_freq_factor=1.0)}, r"high_freq_factor \(1\.0\) must be above its low_freq_factor"),
    ({"rope_parameters": rope(original_max_position_embeddings=2**40)},
     r"original_max_position_embeddings must be a whole number from 1"),
    ({"rope_parameters": rope(original_max_position_embeddings="8192")},
     r"original_max_position_embeddings must be a whole number"),
    ({"rope_parameters": rope(original_max_position_embeddings=0)},
     r"original_max_position_embeddings must be a whole number from 1"),
    ({"rope_parameters": rope(original_max_position_embeddings=16.5)},
     r"original_max_position_embeddings must be a whole number"),
    ({"rope_parameters": rope(), "original_max_position_embeddings": 8}, r"original_max_position_embeddings \(8\) differs from the one"),
    ({"rope_parameters": rope(rope_type="yarn")}, r"RoPE scaling type 'yarn' is not supported; only the default "
                                                  r"rotary, linear, llama3 are"),
    ({"rope_parameters": rope(rope_type="dynamic")}, r"RoPE scaling type 'dynamic' is not supported"),
    ({"rope_parameters": rope(rope_type="longrope")}, r"RoPE scaling type 'longrope' is not supported"),
    ({"rope_parameters": rope(rope_type=None, type="yarn")}, r"RoPE scaling type 'yarn' is not supported"),
    ({"rope_parameters": rope(rope_type=["llama3"])}, r"RoPE scaling type \['llama3'\] is not supported"),
    ({"rope_parameters": {"rope_type": None}}, r"RoPE scaling type None is not supported"),
    ({"rope_parameters": "llama3"}, r"rope_parameters must be an object"),
    ({"rope_parameters": None, "rope_scaling": ["llama3", 8]}, r"rope_scaling must be an object"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, r"both rope_parameters and rope_scaling, and they differ"),
    ({"rope_parameters": {"full_attention": rope(), "sliding_attention": {"rope_type": "yarn"}}},
     r"rope_parameters gives layer types their own rotary"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 0, "rope_theta": 1e4}}, r"rope_parameters\.factor must be"),
    ({"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": "Infinity"}},
     r"rope_scaling\.factor must be a positive number, got 'Infinity'"),
    ({"rope_parameters": rope(rope_theta="NaN")}, r"rope_theta must be a positive number"),
    ({"rope_parameters": rope(rope_theta=0.5)}, r"rope theta must be above 1"),
]


@pytest.mark.parametrize("family", ["llama", "qwen2", "smollm3"])
@pytest.mark.parametrize("changes, pattern", ROPE, ids=[str(i) for i in range(len(ROPE))])
def test_rope_fields(good, family, changes, pattern, tmp_path):
    folder = copy_of(good, family, tmp_path)
    edit_config(folder, **changes)
    refused(folder, pattern)


WINDOWS = [
    ({"use_sliding_window": "yes"}, r"use_sliding_window must be true or false"),
    ({"sliding_window": -3}, r"sliding_window must be a whole number from 1"),
    ({"sliding_window": 0}, r"sliding_window must be a whole number from 1"),
    ({"sliding_window": "4096"}, r"sliding_window must be a whole number"),
    ({"sliding_window": 2**40}, r"sliding_window must be a whole number"),
    ({"sliding_window": None}, r"layer_types has sliding layers but no sliding_window"),
    ({"use_sliding_window": False}, r"layer_types has sliding layers but use_sliding_window is false"),
    ({"layer_types": ["full_attention"]}, r"layer_types must name full_attention or sliding_attention for each of"),
    ({"layer_types": ["full_attention", "chunked_attention"]}, r"layer_types must name full_attention"),
    ({"layer_types": "sliding_attention"}, r"layer_types must name full_attention"),
    ({"layer_types": None, "max_window_layers": -1}, r"max_window_layers must be a whole number from 0"),
    ({"layer_types": None, "max_window_layers": "NaN"}, r"max_window_layers must be a whole number"),
    ({"hidden_act": "gelu"}, r"activation 'gelu' is not supported"),
    ({"head_dim": "8"}, r"head_dim must be a whole number"),
    ({"head_dim": -4}, r"head_dim must be a whole number"),
    ({"num_key_value_heads": 3}, r"n_kv_heads must divide n_heads"),
    ({"partial_rotary_factor": 0.5}, r"partial rotary factor in a Qwen2 config is not supported"),
]


@pytest.mark.parametrize("changes, pattern", WINDOWS, ids=[str(i) for i in range(len(WINDOWS))])
def test_qwen_window_and_shape_fields(good, changes, pattern, tmp_path):
    folder = copy_of(good, "qwen2", tmp_path)
    edit_config(folder, **changes)
    refused(folder, pattern)


@pytest.mark.parametrize("family, changes, pattern", [
    ("qwen3", {"head_dim": NULL}, r"head_dim must be a whole number"),
    ("qwen3", {"head_dim": 0}, r"head_dim must be a whole number from 1"),
    ("qwen3", {"head_dim": 2**31}, r"head_dim must be a whole number"),
    ("qwen3", {"attention_bias": "true"}, r"attention_bias must be true or false"),
    ("qwen3", {"layer_types": ["sliding_attention", "full_attention"]}, r"use_sliding_window is false"),
    ("qwen3", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}},
     r"RoPE scaling type 'yarn' is not supported"),
    ("smollm3", {"no_rope_layers": [1]}, r"no_rope_layers must hold 1 \(rotary\) or 0 \(none\) for each of the 2"),
    ("smollm3", {"no_rope_layers": [1, 2]}, r"no_rope_layers must hold 1"),
    ("smollm3", {"no_rope_layers": [1, "0"]}, r"no_rope_layers must hold 1"),
    ("smollm3", {"no_rope_layers": [True, False]}, r"no_rope_layers must hold 1"),
    ("smollm3", {"no_rope_layers": "1,0"}, r"no_rope_layers must hold 1"),
    ("smollm3", {"no_rope_layers": None, "no_rope_layer_interval": 0}, r"no_rope_layer_interval must be a whole number"),
    ("smollm3", {"no_rope_layers": None, "no_rope_layer_interval": "NaN"}, r"no_rope_layer_interval must be"),
    ("smollm3", {"mlp_bias": "no"}, r"mlp_bias must be true or false"),
    ("smollm3", {"tie_word_embeddings": 1}, r"tie_word_embeddings must be true or false"),
    ("smollm3", {"use_sliding_window": True, "sliding_window": 2, "layer_types": ["full_attention", "sliding_attention"],
                 "hidden_act": "relu"}, r"SmolLM3 activation 'relu' is not supported"),
    ("smollm3", {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 2},
     r"use_sliding_window is false"),
    ("llama", {"sliding_window": 4}, r"the Llama option sliding_window is not supported"),
])
def test_other_fields(good, family, changes, pattern, tmp_path):
    folder = copy_of(good, family, tmp_path)
    edit_config(folder, **changes)
    refused(folder, pattern)


def edit_tensors(folder, change):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)


def test_weights_that_disagree_with_the_config(good, tmp_path):
    # Qwen2 has no output-projection bias: a file with one is another model
    folder = copy_of(good, "qwen2", tmp_path)
    edit_tensors(folder, lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": torch.zeros(16)}))
    refused(folder, r"a tensor 'model\.layers\.0\.self_attn\.o_proj\.bias' that a Qwen2 model .* does not have")
    # Qwen2 always has q, k, v biases, whatever an attention_bias key says
    folder = copy_of(good, "qwen2", tmp_path / "b")
    edit_config(folder, attention_bias=False)
    edit_tensors(folder, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
    refused(folder, r"the weights lack the tensor layers\.1\.self_attn\.k_proj\.bias")
    # Qwen3's per-head norms: missing, or as wide as the whole projection
    folder = copy_of(good, "qwen3", tmp_path)
    edit_tensors(folder, lambda t: t.pop("model.layers.0.self_attn.q_norm.weight"))
    refused(folder, r"lack the tensor layers\.0\.self_attn\.q_norm\.weight")
    folder = copy_of(good, "qwen3", tmp_path / "c")
    edit_tensors(folder, lambda t: t.update({"model.layers.1.self_attn.k_norm.weight": torch.ones(16)}))
    refused(folder, r"k_norm\.weight' has shape \[16\] but this config\.json needs \[8\]")
    # a Qwen3 file without head_dim means 128-wide heads: these weights are not that
    folder = copy_of(good, "qwen3", tmp_path / "d")
    edit_config(folder, head_dim=None)
    refused(folder, r"has shape .* but this config\.json needs \[(512|256|128)")


def test_the_command_line_refuses_with_one_sentence(good, tmp_path):
    folder = copy_of(good, "llama", tmp_path)
    edit_config(folder, rope_parameters=rope(rope_type="yarn"))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "model.generate", "--checkpoint", str(folder), "--prompt", "a"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert "RoPE scaling type 'yarn' is not supported" in lines[0]
