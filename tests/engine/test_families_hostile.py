"""Bad Hugging Face folders are refused with one sentence before anything large is allocated:
unknown architectures and unsupported options by name, pickles, shapes or names that disagree with
config.json, missing tensors, NaN, huge dimensions, broken headers, shards outside the folder."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.support.families import save_reference, sharpen
from model.families import open_folder

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips


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
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0}},
     "RoPE scaling type 'yarn' is not supported"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "RoPE scaling type 'dynamic' is not supported"),
    ({"sliding_window": 4}, "option sliding_window is not supported"),
    ({"hidden_act": "gelu"}, "activation 'gelu' is not supported"),
    ({"head_dim": 8}, "head_dim .* is not supported"),
    ({"num_key_value_heads": 3}, "n_kv_heads must divide n_heads"),
    ({"hidden_size": "16"}, "hidden_size must be a whole number"),
    ({"num_hidden_layers": 100, "hidden_size": 10**5, "head_dim": None}, "parameters; the limit is"),
    # bounds the parameter count does not give: a list of tensors per layer, RoPE tables per position
    ({"num_hidden_layers": 10**6}, "1,000,000 layers; at most 256 are read"),
    ({"max_position_embeddings": 10**9}, "a context of 1,000,000,000 positions; at most 131,072 are read"),
    ({"hidden_size": int("9" * 400)}, "hidden_size must be a whole number from 1 to 2,147,483,647, got a number far"),
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
    nested = b"[" * 200_000 + b"]" * 200_000  # the one header reader (model.st_layout) bounds the nesting first
    path.write_bytes(struct.pack("<Q", len(nested)) + nested)
    refused(folder, "nested too deeply")


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


def test_links_may_stay_inside_the_folder_or_a_hub_snapshot_but_never_leave(good, tmp_path):
    """A Hugging Face cache snapshot keeps its files as links into the repo's blobs/: those open. A link
    to a file outside the folder (or outside the repo's cache folder) is refused, not followed."""
    repo = tmp_path / "models--tiny--llama"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for path in good.iterdir():
        blob = repo / "blobs" / f"blob-{path.name}"
        shutil.copy(path, blob)
        (snapshot / path.name).symlink_to(Path("../..") / "blobs" / blob.name)
    model, tok = open_folder(snapshot)
    assert model.cfg.n_kv_heads == 2 and tok.vocab_size == 300
    (snapshot / "tokenizer.json").unlink()
    (snapshot / "tokenizer.json").symlink_to(good / "tokenizer.json")  # the same file, outside the repo
    refused(snapshot, "tokenizer.json in the folder 0123abcd is a link to a file outside the model's folder")
    folder = copy_of(good, tmp_path / "plain")
    (folder / "model.safetensors").rename(tmp_path / "weights.safetensors")
    (folder / "model.safetensors").symlink_to(tmp_path / "weights.safetensors")
    refused(folder, "model.safetensors in the folder copy is a link to a file outside")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to("inside.safetensors")  # a link that stays inside the folder
    (tmp_path / "weights.safetensors").rename(folder / "inside.safetensors")
    assert open_folder(folder)[0].cfg.n_layers == 2


def test_deep_or_huge_json_anywhere_in_the_folder_is_one_sentence(good, tmp_path):
    folder = copy_of(good, tmp_path)
    (folder / "tokenizer_config.json").write_text("{\"a\": " * 50_000 + "1" + "}" * 50_000)
    refused(folder, "tokenizer_config.json is nested too deeply")
    folder = copy_of(good, tmp_path / "digits")
    (folder / "config.json").write_text((folder / "config.json").read_text().replace("{", "{\"big\": " + "7" * 5000 + ", ", 1))
    refused(folder, "config.json holds a number with thousands of digits")


def test_a_vocabulary_larger_than_the_model_is_refused_before_the_library_reads_it(good, tmp_path):
    """The tokenizer's counts are read from its JSON first: 300,000 tokens for 300 rows is refused by the
    counts, with the sentence the library's reading would have led to."""
    folder = copy_of(good, tmp_path)
    path = folder / "tokenizer.json"
    doc = json.loads(path.read_text())
    doc["model"]["vocab"].update({f"pad{i}": i for i in range(300, 300_000)})
    doc["added_tokens"] = doc["added_tokens"] * 2000  # also more added tokens than any family has
    path.write_text(json.dumps(doc))
    refused(folder, "tokenizer.json added_tokens has 4,000 entries; the limit is 300")
    doc["added_tokens"] = doc["added_tokens"][:2]
    path.write_text(json.dumps(doc))
    refused(folder, "tokenizer.json has 300,000 tokens but the model only 300 embedding rows")


def test_tensors_must_tile_the_file(good, tmp_path):
    """Offsets are checked as the safetensors format promises: bytes of their own, no gap, nothing after."""
    from tests.support.safetensors_bytes import safetensors_join, safetensors_split

    folder = copy_of(good, tmp_path)
    path = folder / "model.safetensors"
    header, body = safetensors_split(path.read_bytes())
    path.write_bytes(safetensors_join(header, body + b"\0" * 8))
    refused(folder, "model.safetensors has 8 bytes after its last tensor that belong to no tensor")
    name = next(k for k in header if k != "__metadata__")
    start, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [start, end - 4]
    path.write_bytes(safetensors_join(header, body))
    refused(folder, f"model.safetensors gives tensor '{name}' {end - 4 - start:,} bytes, but its type and shape take")


def test_neo_attention_types_are_bounded_before_they_are_expanded(tmp_path):
    from model.families.neo import layer_kinds

    with pytest.raises(ValueError, match="describe more than 256 layers"):
        layer_kinds({"attention_types": [[["global"] * 100_000, 10_000]]})
