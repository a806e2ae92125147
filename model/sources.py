"""Where a model comes from, checked before anything is read: the source's name, the links in its
folder, and the one line a command prints when it refuses a model.

Every importer (model.convert's `open_source`, which `python -m model.generate` and
`python -m model.convert` use; `python -m model.film`'s revision folders; the app's --model and
DECODER_LAB_MODELS sources in lab.catalogue.external) goes through these:

* `local_path(text)`: a source's name as a path. A name no file system can hold (a NUL character,
  one part longer than NAME_MAX_BYTES, the whole longer than PATH_MAX_BYTES) is refused in a
  sentence before the operating system is asked, which would answer with an OSError
  ("File name too long"); `kind_of(path)` says what is there, and an error asking is a sentence too.
* `check_links(folder)`: the files an importer reads from a model folder (MODEL_FILES, and every
  .safetensors file) may be links only when they lead to a file inside the folder: a link to
  anything outside it (another person's file, /etc/passwd) is refused, not followed. A Hugging Face
  cache snapshot keeps its files as links into the repo's `blobs/` folder, so there the folder a
  link must stay in is the repo's cache folder (models--owner--name).
* `refuse(parser, sentence)`: the command line's answer to a model it cannot open: one line on
  stderr, `prog: error: sentence`, and exit status 2 (argparse's own for a usage error).
"""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path
from typing import NoReturn

NAME_MAX_BYTES = 255  # one file or folder name (Linux's NAME_MAX)
PATH_MAX_BYTES = 4096  # a whole path (Linux's PATH_MAX)
# the files an importer reads from a model folder, besides its .safetensors weights
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json",
               "README.md", "meta.pkl")


def shown_name(text: str, limit: int = 40) -> str:
    """A source's name for a sentence: quoted, cut to `limit` characters, control characters escaped."""
    quoted = repr(str(text))
    return quoted if len(quoted) <= limit else quoted[: limit - 1] + "…"


def shortened(text: str, limit: int = 120) -> str:
    """A path for a sentence: as it is when short, else its last `limit` characters after an ellipsis."""
    text = str(text)
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def local_path(text: str | Path, what: str = "the model source") -> Path:
    """`text` as a local path (a leading ~ expanded), or a ValueError when no file can have that name."""
    text = str(text)
    if "\x00" in text:
        raise ValueError(f"{what} {shown_name(text)} has a NUL character, which no file name can hold")
    raw = os.fsencode(text)
    if len(raw) > PATH_MAX_BYTES:
        raise ValueError(f"{what} {shown_name(text)} is {len(text):,} characters long; a path here has at "
                         f"most {PATH_MAX_BYTES:,} bytes")
    longest = max(len(part) for part in raw.split(b"/"))
    if longest > NAME_MAX_BYTES:
        raise ValueError(f"{what} {shown_name(text)} has a name of {longest:,} bytes; a file or folder name "
                         f"here has at most {NAME_MAX_BYTES}")
    try:
        return Path(text).expanduser()
    except RuntimeError:  # ~name of a user this system does not have: the name as written
        return Path(text)


def kind_of(path: Path) -> str | None:
    """"folder", "file", "other" or None (nothing there); a ValueError when the system cannot say."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # permission denied, a loop of links, a name too long after ~ expanded
        raise ValueError(f"{shown_name(str(path))} cannot be read here ({exc.strerror or 'error'})") from None
    except ValueError:  # os.stat's own refusal of a name it cannot pass on
        raise ValueError(f"{shown_name(str(path))} is not a name a file can have") from None
    if stat.S_ISDIR(mode):
        return "folder"
    return "file" if stat.S_ISREG(mode) else "other"


def link_root(folder: Path) -> Path:
    """The folder a model folder's links must stay in: the folder itself (resolved), or for a Hugging
    Face cache snapshot (models--owner--name/snapshots/<commit>), the repo's cache folder."""
    real = folder.resolve()
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        return real.parent.parent
    return real


def check_links(folder: Path, names: tuple[str, ...] = MODEL_FILES) -> None:
    """Refuse a model folder in which a file an importer reads is a link leading outside it."""
    folder = Path(folder)
    root = link_root(folder)
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        raise ValueError(f"the folder {folder.name} cannot be read ({exc.strerror or 'error'})") from None
    for entry in entries:
        if not entry.is_symlink() or not (entry.name in names or entry.name.endswith(".safetensors")):
            continue
        target = Path(entry.path).resolve()
        if not target.is_relative_to(root):
            raise ValueError(f"{entry.name} in the folder {folder.name} is a link to a file outside the model's "
                             "folder, which is not followed; copy the file into the folder instead")


def refuse(parser: argparse.ArgumentParser, sentence: str) -> NoReturn:
    """Exit with status 2 after one line on stderr: `prog: error: sentence`."""
    parser.exit(2, f"{parser.prog}: error: {' '.join(str(sentence).split())}\n")
