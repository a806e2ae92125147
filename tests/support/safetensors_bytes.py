"""Byte helpers for crafting safetensors files (hostile checkpoints in the tests)."""

from __future__ import annotations

import json
import struct


def safetensors_split(data: bytes) -> tuple[dict, bytes]:
    """A safetensors file's JSON header and the bytes after it (for crafting hostile files)."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def safetensors_join(header: dict, body: bytes) -> bytes:
    """The inverse of safetensors_split: a header (padded to 8 bytes) and the tensor bytes."""
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + body
