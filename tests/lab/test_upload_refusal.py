"""An upload's refusal names its kind first, in a learner's words (lab.catalogue.uploads.upload_refusal), from the
checkpoint reader's own sentence: bytes that are no safetensors file at all, a safetensors file without a Decoder
Lab description, and a Decoder Lab file that is damaged inside."""

import struct

import pytest
import torch
from safetensors.torch import save as st_save

from lab.catalogue.uploads import upload_refusal
from model.checkpoint import checkpoint_bytes, parse_checkpoint
from model.config import ModelConfig
from model.tokenizers import CharTokenizer
from model.transformer import DecoderLM

NOT_SAFETENSORS = "This file is not a Decoder Lab model (.safetensors): it is not a safetensors file at all."
NOT_OURS = "This file is a safetensors file, but not a Decoder Lab model"
DAMAGED = "This file is not a Decoder Lab model this app can load (.safetensors): part of it is damaged."


def refusal(data: bytes) -> str:
    with pytest.raises(ValueError) as info:
        parse_checkpoint(data)
    return upload_refusal(str(info.value))


@pytest.mark.parametrize("data", [
    b"",  # empty
    b"\x01" * 7,  # shorter than the header's length
    b"\x80\x04\x95" + bytes(range(256)) * 2,  # a pickle's first bytes: a header length of exabytes
    struct.pack("<Q", 50) + b"{}",  # the header runs past the end
    struct.pack("<Q", 8) + b"\xff" * 8,  # the header is not UTF-8
    struct.pack("<Q", 8) + b"not json",  # not JSON
    struct.pack("<Q", 2_000) + b"[" * 1_000 + b"]" * 1_000,  # nested too deeply
    struct.pack("<Q", 2) + b"[]",  # JSON, but not an object
], ids=["empty", "seven-bytes", "pickle", "header-past-end", "not-utf8", "not-json", "nested", "array"])
def test_bytes_that_are_no_safetensors_file_are_told_so(data):
    assert refusal(data).startswith(NOT_SAFETENSORS)


def test_a_safetensors_file_without_our_description_is_told_the_converter():
    message = refusal(st_save({"w": torch.zeros(3)}))
    assert message.startswith(NOT_OURS) and "model.convert" in message


def test_a_damaged_decoder_lab_file_is_told_it_is_damaged():
    tok = CharTokenizer(list("abcdefghij"))
    model = DecoderLM(ModelConfig(vocab_size=tok.vocab_size, block_size=12, n_layers=1, n_heads=2, d_model=16))
    good = checkpoint_bytes(model, tok)
    (n,) = struct.unpack("<Q", good[:8])
    cut = good[: 8 + n + 4]  # the header is whole; the tensors' bytes are not
    assert refusal(cut).startswith(DAMAGED)
