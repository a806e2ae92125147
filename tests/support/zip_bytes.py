"""Byte helpers for crafting hostile zip archives (a torch.save ckpt.pt is one): a zip bomb, and
central directories that lie about an entry's size or where its local header is."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

_CENTRAL = b"PK\x01\x02"
_FIXED = 46  # bytes of a central directory record before its name


def central_records(data: bytes) -> dict[str, int]:
    """Each entry's name -> where its central directory record starts."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        at = z.start_dir
    out = {}
    while data[at: at + 4] == _CENTRAL:
        nlen, elen, clen = struct.unpack("<HHH", data[at + 28: at + 34])
        out[data[at + _FIXED: at + _FIXED + nlen].decode("utf-8")] = at
        at += _FIXED + nlen + elen + clen
    return out


def with_central(data: bytes, name: str, size: int | None = None, header_of: str | None = None) -> bytes:
    """`data` with entry `name`'s central directory record changed: both of its sizes set to `size`,
    or its local header offset set to that of the entry `header_of`."""
    records = central_records(data)
    out = bytearray(data)
    at = records[name]
    if size is not None:
        out[at + 20: at + 28] = struct.pack("<II", size, size)
    if header_of is not None:
        out[at + 42: at + 46] = data[records[header_of] + 42: records[header_of] + 46]
    return bytes(out)


def zip_bomb(src: Path, out: Path, entry: str, inflated: int) -> None:
    """A copy of the archive `src` in which `entry` is deflated and holds its bytes followed by
    `inflated` zero bytes: a few megabytes on disk that inflate to `inflated` bytes."""
    zeros = bytes(2**20)
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as new:
        for info in old.infolist():
            data = old.read(info)
            if info.filename != entry:
                new.writestr(zipfile.ZipInfo(info.filename), data)  # a ZipInfo of its own: stored, as torch stores it
                continue
            with new.open(info.filename, "w", force_zip64=True) as w:  # the archive's default: deflated
                w.write(data)
                for _ in range(inflated // len(zeros)):
                    w.write(zeros)
