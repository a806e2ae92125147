"""Files a session makes (trained models to download), where they live and when they go.

Each session gets one folder under `RUNS`, inside gradio's own file cache: a file a handler returns
from there is served as it is, where a file from anywhere else would be copied into the cache
(5-8 MB a web page) and kept there for an hour, outside every budget. So the disk budget
(lab.server.budget.DiskBudget) counts every byte a download takes. A folder is deleted when its session
closes, and folders left by sessions that never closed (a killed server) are swept once they are
older than `RUN_FILES_MAX_AGE_S`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import unicodedata
import uuid
from pathlib import Path

from ..limits import RUN_FILES_MAX_AGE_S

STEM_MAX = 40  # characters of one part of a file name

# gradio's cache folder, as gradio.utils.get_upload_folder() finds it (lab/ does not import gradio)
GRADIO_CACHE = Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio").resolve()
RUNS = GRADIO_CACHE / "decoder-lab-runs"


def new_session_dir() -> Path:
    path = RUNS / uuid.uuid4().hex
    path.mkdir(parents=True, exist_ok=True)
    return path


def safe_file_stem(name: str) -> str:
    """A display name as a file name: ASCII letters, digits and "_", the rest as '-' (at most 100)."""
    return "".join(c if (c.isascii() and c.isalnum()) or c == "_" else "-" for c in name).strip("-")[:100] or "model"


def remove_dir(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def sweep_runs(max_age_s: float = RUN_FILES_MAX_AGE_S) -> None:
    """Delete session folders untouched for `max_age_s` (at start-up and before each training)."""
    if not RUNS.exists():
        return
    now = time.time()
    for d in RUNS.iterdir():
        try:
            if now - d.stat().st_mtime > max_age_s:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass


# ------------------------------------------------------------------ names of downloads


def slug(text: str, limit: int = STEM_MAX) -> str:
    """`text` as part of a file stem: ASCII letters and digits, the rest as "-"."""
    text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:limit].strip("-")


def model_stem(name: str) -> str:
    """A model's name in a file stem: "grammar (built-in)" → "grammar", "my sort model" → "my-sort-model"."""
    return slug(name.removesuffix(" (built-in)")) or "model"


def file_name(*parts) -> str:
    """A figure's download name: the parts (model, layer, head, step…) as ASCII, joined by "_"."""
    return "_".join(p for p in (slug(str(x)) for x in parts if x is not None) if p)
