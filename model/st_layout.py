"""A safetensors file's header: read, bounded and checked before the safetensors library sees the file.

This is the one reader of safetensors headers (`read_header`): Decoder Lab checkpoints
(model.checkpoint) and Hugging Face weights and their shards (model.families.common) both go
through it, so a hostile header gets the same sentence wherever it arrives.

A safetensors file is an 8-byte header length, a JSON header and the tensors' bytes. The header
gives each tensor a dtype, a shape and `data_offsets` [start, end) into the bytes after the header.
`check_layout` holds a header to what the format promises, so that a hostile file is refused with a
sentence naming the tensor instead of reaching the library (whose own errors are not sentences):

* every tensor's dtype is one of the format's, its shape a list of whole numbers >= 0;
* its offsets are two whole numbers within the data, and end - start is exactly
  (number of elements) x (bytes per element of its dtype);
* taken in order, the tensors tile the data: each starts where the one before it ends, none overlaps
  another (a file whose tensors all start at 0 is refused), and the last ends where the file does.

Both checkpoint readers call it: model.checkpoint (Decoder Lab files) and model.families.common
(Hugging Face weights and their shards).
"""

from __future__ import annotations

import struct
from typing import Any, BinaryIO

from . import json_bounds
from .json_bounds import is_whole, short

# bytes per element of each dtype the safetensors format names
ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
              "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def check_layout(header: dict, data_bytes: int, what: str) -> None:
    """Refuse (ValueError naming `what`, the file) a header whose tensors do not tile the
    `data_bytes` bytes after it exactly; the "__metadata__" entry is not a tensor."""
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise ValueError(f"{what} describes tensor {short(name)} badly")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in ITEM_BYTES:
            raise ValueError(f"{what} gives tensor {short(name)} the type {short(dtype)}, which is not a "
                             "safetensors type")
        if not isinstance(shape, list) or not all(is_whole(n) for n in shape):
            raise ValueError(f"{what} gives tensor {short(name)} an invalid shape")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_whole(o) for o in offsets)
                and offsets[0] <= offsets[1] <= data_bytes):
            raise ValueError(f"{what} is truncated, or its header points tensor {short(name)} past its end")
        size = ITEM_BYTES[dtype]
        for n in shape:
            size *= n
        if offsets[1] - offsets[0] != size:
            raise ValueError(f"{what} gives tensor {short(name)} {offsets[1] - offsets[0]:,} bytes, but its "
                             f"type and shape take {size:,}")
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    end, before = 0, None
    for start, stop, name in spans:
        if start < end:
            raise ValueError(f"{what}: the bytes of tensor {short(name)} overlap those of tensor "
                             f"{short(before)}; each tensor must have bytes of its own")
        if start > end:
            raise ValueError(f"{what} has {start - end:,} bytes before tensor {short(name)} that belong to no "
                             "tensor")
        end, before = stop, name
    if end != data_bytes:
        raise ValueError(f"{what} has {data_bytes - end:,} bytes after its last tensor that belong to no tensor")


def read_header(f: BinaryIO, size: int, what: str, max_header_bytes: int) -> tuple[dict[str, Any], int]:
    """(header, offset of the first tensor byte) of the safetensors file `f` (at its start, `size`
    bytes long), reading only the header. Refused, in a sentence naming `what`: a file shorter than
    the 8-byte length, a header over `max_header_bytes` or longer than the file, a header that is not
    UTF-8 JSON (a pickle renamed, say) or nests too deeply (model.json_bounds), or not an object.
    The tensors' layout is `check_layout`'s, called once the caller's own checks of the names ran."""
    raw = f.read(8)
    if len(raw) != 8:
        raise ValueError(f"{what} is not a safetensors file: it is shorter than its 8-byte header length")
    (length,) = struct.unpack("<Q", raw)
    if length > max_header_bytes:
        raise ValueError(f"{what} is not a sound safetensors file: its header would be {length:,} bytes "
                         f"(at most {max_header_bytes:,} are allowed)")
    if 8 + length > size:
        raise ValueError(f"{what} is truncated, or not a safetensors file: its header is longer than the file")
    text = f.read(length)
    if len(text) != length:
        raise ValueError(f"{what} is truncated: its header is longer than the file")
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not a safetensors file: its header is not valid JSON "
                         "(a pickle or another format?)") from None
    header = json_bounds.parse(decoded, f"{what}'s header")  # a sentence when it is not JSON or nests too deep
    if not isinstance(header, dict):
        raise ValueError(f"{what} is not a safetensors file: its header is not a JSON object")
    return header, 8 + length
