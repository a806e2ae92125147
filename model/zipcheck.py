"""The zip archive of a torch.save file (nanoGPT's ckpt.pt), checked before a child process unpickles it.

`torch.save` writes a zip archive: each tensor's bytes and the pickle as entries, stored, never
compressed, each after a local header, with a central directory at the end that lists them all.
`torch.load` trusts that directory. A hostile file can make it lie: an entry compressed a
thousandfold (a zip bomb: a megabyte that inflates to gigabytes), an entry the directory says is
larger than the file, two entries that share bytes, local headers that disagree with the directory.
`check_torch_zip` reads only the headers (no entry is inflated, no byte of data is read) and
refuses, in a sentence naming the entry, an archive in which

* an entry is compressed (torch.save writes none, so a compressed entry is not a checkpoint's);
* the directory's sizes or name for an entry differ from its local header's, or from the sizes the
  data descriptor after its bytes records (torch writes sizes there, and zeros in the header);
* an entry's bytes run past the directory or the end of the file, or overlap another entry's;
* there are more than MAX_ENTRIES entries.

A file that is not a zip archive (torch's legacy format) is left to the child's memory and time caps.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

from .json_bounds import short

MAX_ENTRIES = 100_000  # a GPT-2 run with its optimizer state has a few hundred
_LOCAL = b"PK\x03\x04"
_DESCRIPTOR = b"PK\x07\x08"
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")


def _descriptor_end(f, end: int, info: zipfile.ZipInfo) -> int | None:
    """Where the data descriptor after an entry's bytes ends, when it records the directory's sizes."""
    f.seek(end)
    raw = f.read(24)
    sizes = (info.compress_size, info.file_size)
    signed = raw[:4] == _DESCRIPTOR
    for width in (4, 8):  # sizes of 4 bytes, or of 8 in a zip64 archive
        at = 8 if signed else 4
        if len(raw) < at + 2 * width:
            continue
        fmt = "<II" if width == 4 else "<QQ"
        if struct.unpack(fmt, raw[at: at + 2 * width]) == sizes:
            return end + at + 2 * width
    return None


def _local_sizes(csize: int, usize: int, extra: bytes) -> tuple[int, int]:
    """A local header's sizes, read from its zip64 extra field where the header says 0xFFFFFFFF."""
    if 0xFFFFFFFF not in (csize, usize):
        return csize, usize
    at = 0
    while at + 4 <= len(extra):
        tag, size = struct.unpack("<HH", extra[at: at + 4])
        if tag == 1:
            values = list(struct.unpack(f"<{min(size, 16) // 8}Q", extra[at + 4: at + 4 + min(size, 16) // 8 * 8]))
            if usize == 0xFFFFFFFF and values:
                usize = values.pop(0)
            if csize == 0xFFFFFFFF and values:
                csize = values.pop(0)
            break
        at += 4 + size
    return csize, usize


def check_torch_zip(path: Path, name: str) -> None:
    """Refuse (ValueError, one sentence) a zip archive whose directory does not describe its bytes."""
    path = Path(path)
    with path.open("rb") as f:
        if f.read(4) != _LOCAL:
            return  # not a zip archive
    try:
        with zipfile.ZipFile(path) as z:
            infos, directory = z.infolist(), z.start_dir
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, OSError, struct.error):
        raise ValueError(f"{name} is a zip archive whose directory cannot be read (truncated or damaged)") from None
    if len(infos) > MAX_ENTRIES:
        raise ValueError(f"{name} lists {len(infos):,} entries; a checkpoint has a few hundred, so it is not read")

    def lie(info: zipfile.ZipInfo, what: str) -> ValueError:
        return ValueError(f"{name}'s zip directory does not agree with its entry {short(info.filename)} ({what}), "
                          "so it is not read")

    spans = []
    with path.open("rb") as f:
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"{name} holds a compressed entry {short(info.filename)} (torch.save compresses "
                                 "nothing; a compressed entry can inflate to far more than the file), so it is not read")
            if info.compress_size != info.file_size:
                raise lie(info, "a stored entry of two sizes")
            f.seek(info.header_offset)
            raw = f.read(_LOCAL_HEADER.size)
            if len(raw) != _LOCAL_HEADER.size or raw[:4] != _LOCAL:
                raise lie(info, "no local header where the directory points")
            _, _, flags, method, _, _, _, csize, usize, nlen, elen = _LOCAL_HEADER.unpack(raw)
            local_name, extra = f.read(nlen), f.read(elen)
            if local_name.decode("utf-8" if flags & 0x800 else "cp437", "replace") != info.orig_filename:
                raise lie(info, "another name in its local header")
            if method != zipfile.ZIP_STORED:
                raise lie(info, "compressed in its local header")
            start = info.header_offset + _LOCAL_HEADER.size + nlen + elen
            end = start + info.file_size
            if end > directory:
                raise lie(info, "more bytes than the file holds before its directory")
            if flags & 0x08:  # the sizes follow the data
                end = _descriptor_end(f, end, info)
                if end is None:
                    raise lie(info, "other sizes after its data")
            elif _local_sizes(csize, usize, extra) != (info.compress_size, info.file_size):
                raise lie(info, "other sizes in its local header")
            spans.append((info.header_offset, end, info))
    spans.sort(key=lambda span: span[:2])
    for (_, end, _), (start, _, info) in zip(spans, spans[1:]):
        if start < end:
            raise lie(info, "bytes shared with another entry")
    if spans and spans[-1][1] > directory:
        raise lie(spans[-1][2], "bytes that run into the directory")
