"""Bad Hugging Face folders are refused with one sentence before anything large is allocated:
unknown architectures and unsupported options by name, pickles, shapes or names that disagree with
config.json, missing tensors, NaN, huge dimensions, broken headers, shards outside the folder."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.support.families import save_reference, sharpen
from model.families import open_folder

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A small Llama folder (every hostile folder below is a changed copy of it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=300, max_position_embeddings=40, hidden_size=16, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=24, bos_token_id=1, eos_token_id=0)
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg)
    sharpen(ref)
    return save_reference(ref, tmp_path_factory.mktemp("good") / "llama", 300, bos=True)


def copy_of(good, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(good, folder)
    return folder


def edit_config(folder, **changes):
    path = folder / "config.json"
    hf = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            hf.pop(key, None)
        else:
            hf[key] = value
    path.write_text(json.dumps(hf))


def edit_tensors(folder, change):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)


def refused(folder, pattern):
    with pytest.raises(ValueError, match=pattern) as info:
        open_folder(folder)
    sentence = str(info.value)
    assert "\n" not in sentence and "Traceback" not in sentence and len(sentence) < 300
    return sentence


def test_the_good_folder_opens(good):
    model, tok = open_folder(good)
    assert model.cfg.n_kv_heads == 2 and tok.vocab_size == 300


@pytest.mark.parametrize("changes, pattern", [
    ({"model_type": "mistral"}, "model_type 'mistral' is not a supported architecture"),
    ({"model_type": None}, "model_type missing is not a supported architecture"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
     "RoPE scaling type 'linear' is not supported"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "RoPE scaling type 'dynamic' is not supported"),
    ({"sliding_window": 4}, "option sliding_window is not supported"),
    ({"hidden_act": "gelu"}, "activation 'gelu' is not supported"),
    ({"head_dim": 8}, "head_dim .* is not supported"),
    ({"num_key_value_heads": 3}, "n_kv_heads must divide n_heads"),
    ({"hidden_size": "16"}, "hidden_size must be a whole number"),
    ({"num_hidden_layers": 10**6, "hidden_size": 10**5, "head_dim": None}, "parameters; the limit is"),
])
def test_unsupported_or_bad_configs_are_refused_by_name(good, tmp_path, changes, pattern):
    folder = copy_of(good, tmp_path)
    edit_config(folder, **changes)
    refused(folder, pattern)


def test_config_that_disagrees_with_the_weights(good, tmp_path):
    folder = copy_of(good, tmp_path)
    edit_config(folder, intermediate_size=32)
    refused(folder, r"has shape \[16, 24\] but this config.json needs \[16, 32\]; the config and the weights disagree")
    edit_config(folder, intermediate_size=24, num_hidden_layers=1)
    refused(folder, "a Llama model with this config.json does not have; the config and the weights disagree")
    edit_config(folder, num_hidden_layers=3)
    refused(folder, "the weights lack the tensor layers.2")


def test_missing_nan_and_odd_dtype_tensors(good, tmp_path):
    folder = copy_of(good, tmp_path)
    edit_tensors(folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    refused(folder, "the weights lack the tensor layers.1.mlp.up_proj.weight")
    folder = copy_of(good, tmp_path / "nan")
    edit_tensors(folder, lambda t: t["model.norm.weight"].__setitem__(3, float("nan")))
    refused(folder, "tensor norm.weight holds NaN or infinite values")
    folder = copy_of(good, tmp_path / "int")
    edit_tensors(folder, lambda t: t.__setitem__("model.norm.weight", t["model.norm.weight"].to(torch.int32)))
    refused(folder, "is stored as 'I32'")


def test_tied_config_with_a_different_head(good, tmp_path):
    folder = copy_of(good, tmp_path)
    edit_config(folder, tie_word_embeddings=True)
    refused(folder, "ties the output head to the embedding but the weights hold a different lm_head")


def test_pickles_are_refused_with_a_pointer_to_safetensors(good, tmp_path):
    folder = copy_of(good, tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not unpickled")
    sentence = refused(folder, "PyTorch pickle weights")
    assert "safetensors" in sentence


def test_broken_headers_are_refused_before_reading(good, tmp_path):
    folder = copy_of(good, tmp_path)
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 10**15) + data[8:])  # a header length of a petabyte
    refused(folder, "not a sound safetensors file")
    path.write_bytes(data[: len(data) // 2])  # truncated: the offsets point past the end
    refused(folder, "truncated")
    path.write_bytes(b"abc")
    refused(folder, "not a safetensors file")


def test_shards_must_be_files_of_the_folder(good, tmp_path):
    folder = copy_of(good, tmp_path)
    (folder / "model.safetensors").rename(tmp_path / "outside.safetensors")
    names = load_file(tmp_path / "outside.safetensors").keys()
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {n: "../outside.safetensors" for n in names}}))
    refused(folder, "is not a .safetensors file in the folder")


def test_a_tokenizer_larger_than_the_model(good, tmp_path):
    folder = copy_of(good, tmp_path)
    edit_config(folder, vocab_size=200)
    refused(folder, "tokenizer.json has 300 tokens but the model only 200 embedding rows")


def test_missing_files_and_bad_json(good, tmp_path):
    folder = copy_of(good, tmp_path)
    (folder / "tokenizer.json").unlink()
    refused(folder, "the folder has no tokenizer.json")
    (folder / "config.json").write_text("{not json")
    refused(folder, "config.json is not valid JSON")
    refused(tmp_path / "nowhere", "is not a folder")
