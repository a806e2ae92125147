"""The hub models the README's front matter preloads on a Space (`preload_from_hub`), offered when whoever runs
the app names no model of their own (neither --model nor DECODER_LAB_MODELS).

A Space's build downloads each `preload_from_hub` line's files into the Hugging Face cache before the app starts,
but the app offers only what it is told to. Without this, an operator would have to repeat the README's list in
DECODER_LAB_MODELS, at the same commits, and a Space whose variable was forgotten would preload two models and
show neither. So the README's list is the default: each repo whose files are in this machine's cache at the
line's commit becomes the source `owner/name@commit`, the same text DECODER_LAB_MODELS would hold, and is read
through the same path (lab.catalogue.external). Nothing is downloaded: the cache is only looked at
(huggingface_hub's `try_to_load_from_cache`). A repo that is not there (a machine that is not a Space, or a
build that did not fetch it) is left out with one log line, so a local `python app.py` still starts on the
built-ins alone.

A line is `owner/name file1,file2,... commit`, as the hub reads it; the files and the commit may be left out
(then every file at `main`). The front matter is read the way huggingface_hub reads a card's: the YAML block
between the first two `---` lines.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
KEY = "preload_from_hub"
# what tells that a repo was preloaded when its line lists no files: every model folder has one
CONFIG_FILE = "config.json"

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Preload:
    """One `preload_from_hub` line: the repo, the files the build fetches (none: all of them) and the commit."""

    repo: str
    files: tuple[str, ...] = ()
    commit: str | None = None

    @property
    def source(self) -> str:
        """The line as a model source, as DECODER_LAB_MODELS writes it (`main` when no commit is pinned)."""
        return f"{self.repo}@{self.commit or 'main'}"


def front_matter(readme: Path | None = None) -> dict:
    """The README's YAML header as the hub reads it ({} when there is none); a ValueError when it is not YAML
    or not a mapping."""
    from huggingface_hub.repocard import metadata_load

    readme = Path(readme) if readme is not None else README
    try:
        data = metadata_load(readme)
    except OSError:
        return {}
    except Exception as exc:  # yaml's own errors, and metadata_load's refusal of a header that is not a mapping
        raise ValueError(f"the front matter of {readme.name} cannot be read ({type(exc).__name__})") from None
    return data or {}


def parse_line(line) -> Preload:
    """One `preload_from_hub` entry, `repo [files [commit]]`; a ValueError for anything else."""
    parts = line.split() if isinstance(line, str) else []
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"{KEY} entry {line!r} is not 'owner/name file1,file2,... commit'")
    files = tuple(f for f in parts[1].split(",") if f) if len(parts) > 1 else ()
    return Preload(parts[0], files, parts[2] if len(parts) > 2 else None)


def preloads(readme: Path | None = None) -> list[Preload]:
    """Every `preload_from_hub` line of the README's front matter, in order."""
    lines = front_matter(readme).get(KEY) or []
    if not isinstance(lines, list):
        raise ValueError(f"{KEY} must be a list of lines")
    return [parse_line(line) for line in lines]


def first_missing(preload: Preload, cache_dir: str | Path | None = None) -> str | None:
    """The first of the line's files (config.json when it lists none) that this machine's hub cache lacks at
    the line's revision; None when every one is there. Reads the cache only."""
    from huggingface_hub import try_to_load_from_cache

    for name in preload.files or (CONFIG_FILE,):
        try:
            found = try_to_load_from_cache(preload.repo, name, cache_dir=cache_dir, revision=preload.commit)
        except Exception:  # a name the hub would refuse: it cannot be in the cache either
            return name
        if not isinstance(found, str):
            return name
    return None


def preloaded_sources(readme: Path | None = None, cache_dir: str | Path | None = None) -> list[str]:
    """The README's (`readme`, else the app's) preloaded repos that are in the hub cache (`cache_dir`, else
    huggingface_hub's), each as `owner/name@commit`; one log line naming those left out, and one for a front
    matter that cannot be read."""
    readme = Path(readme) if readme is not None else README
    try:
        lines = preloads(readme)
    except ValueError as exc:
        _log.warning("Decoder Lab offers no preloaded model: %s.", exc)
        return []
    found, missing = [], []
    for preload in lines:
        file = first_missing(preload, cache_dir)
        if file is None:
            found.append(preload.source)
        else:
            missing.append(f"{preload.source} (its {file})")
    if missing:  # one line for all: a local `python app.py` says it once at each start
        _log.warning("Decoder Lab does not offer %s, preloaded by %s: not in this machine's Hugging Face cache "
                     "(nothing is downloaded while the app runs).", ", ".join(missing), readme.name)
    return found
