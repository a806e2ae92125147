"""Pretrained models the person running the app adds to the list (`python app.py --model SRC`, or
the DECODER_LAB_MODELS environment variable): Hugging Face model folders, nanoGPT ckpt.pt files, nanochat
checkpoint folders (or one model_<step>.pt of one), Decoder
Lab .safetensors files (what model.convert and model.film write) and Hugging Face repo ids pinned to a revision, read from the local hub cache (nothing is downloaded).
When neither names a model, the README's preloaded hub repos found in that cache (lab.catalogue.preloaded).

`EXTERNAL` holds them: each is loaded on first use, under a lock, and then shared read-only by every
session, like the built-ins. Its files' SHA-256 is recorded on the first load (`HASHES_FILE`) and
checked on every later load: a changed file is refused with a sentence, not loaded. What each model
is (family, size, tokenizer, source, licence), its example prompts and the head it opens on are
read from its own files and computed on its own weights (lab.catalogue.realmodels).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from model.checkpoint import atomic_write
from model.sources import check_links, kind_of, local_path, shortened

from ..checks import UserError
from .models import ModelEntry

ENV_VAR = "DECODER_LAB_MODELS"
SEPARATOR = ";"  # between the sources in ENV_VAR: never part of a repo id (a path with it needs --model)
HASHES_ENV = "DECODER_LAB_MODEL_HASHES"
_CACHE_HOME = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
HASHES_FILE = Path(os.environ.get(HASHES_ENV) or _CACHE_HOME / "decoder-lab" / "model_hashes.json")
# owner/name@revision: the names the hub allows, and a branch, tag or commit
_REPO = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")
_REVISION = re.compile(r"[\w./-]{1,100}")
# the files of a folder that make the model: what the hash covers
_FOLDER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json")


@dataclass(frozen=True)
class Source:
    """Where a model comes from: a local folder or ckpt.pt (path), or a hub repo at a revision."""

    # "folder", "nanogpt", "nanochat" (a checkpoint folder or model_<step>.pt), "file" (a Decoder Lab
    # .safetensors) or "hub"
    kind: str
    path: Path | None = None
    repo: str | None = None
    revision: str | None = None
    # What runs it: the own engine, or nnsight (`--backend nnsight`), in this process (with `device_map`:
    # spread over the GPUs and the CPU) or on NDIF (`remote`, kind "remote": a Hub repo id NDIF hosts)
    backend: str = "own"
    device_map: str | None = None
    remote: bool = False

    @property
    def label(self) -> str:
        """The source as the server knows it (the record of hashes is keyed by it)."""
        if self.kind == "remote":
            return f"{self.repo} on NDIF"
        return f"{self.repo}@{self.revision}" if self.kind == "hub" else str(self.path)

    @property
    def shown(self) -> str:
        """The source as visitors see it (status, refusals, session files): no server path."""
        if self.kind in ("hub", "remote"):
            return self.label
        if self.kind == "nanogpt" or (self.kind == "nanochat" and self.path.suffix == ".pt"):
            return f"local file {self.path.parent.name}/{self.path.name}"
        if self.kind == "file":
            return f"local file {self.path.name}"
        return f"local folder {self.path.name}"

    @property
    def name(self) -> str:
        """A short display name for the model list ("(nnsight)" after one that nnsight runs here)."""
        if self.kind == "remote":
            return f"{self.repo} (NDIF)"
        return self._name + (" (nnsight)" if self.backend == "nnsight" else "")

    @property
    def _name(self) -> str:
        if self.kind == "hub":
            rev = self.revision if len(self.revision) <= 12 else self.revision[:12]
            return f"{self.repo}@{rev}"
        if self.kind == "nanogpt":
            return f"{self.path.parent.name}/{self.path.name} (nanoGPT)"
        if self.kind == "nanochat":
            shown = f"{self.path.parent.name}/{self.path.name}" if self.path.suffix == ".pt" else self.path.name
            return f"{shown} (nanochat)"
        if self.kind == "file":
            return f"{self.path.stem} (file)"
        return f"{self.path.name} (folder)"


def parse_source(text: str) -> Source:
    """A source as given on the command line: an existing folder, .pt or .safetensors file, or owner/name@revision.
    Anything else is a ValueError with one sentence."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a model source is empty")
    text = text.strip()
    path = local_path(text)  # a name no file can have (3,000 characters, a NUL) is a sentence, not an OSError
    kind = kind_of(path)
    from model.nanochat import is_nanochat

    if kind is not None and is_nanochat(path):
        return Source("nanochat", path=path.resolve())
    if kind == "folder":
        return Source("folder", path=path.resolve())
    if path.suffix in (".pt", ".safetensors"):
        if kind != "file":
            raise ValueError(f"there is no file {shortened(text)}")
        return Source("nanogpt" if path.suffix == ".pt" else "file", path=path.resolve())
    repo, at, revision = text.partition("@")
    if _REPO.fullmatch(repo) and not at:
        raise ValueError(f"{shortened(text)} is not a folder here; as a Hugging Face repo id it needs a pinned revision "
                         f"({text}@main, or a commit)")
    if _REPO.fullmatch(repo) and _REVISION.fullmatch(revision) and ".." not in revision:
        return Source("hub", repo=repo, revision=revision)
    raise ValueError(f"{shortened(text)} is neither a model folder, a nanoGPT .pt file, a Decoder Lab .safetensors "
                     "file nor a repo id as owner/name@revision")


BACKENDS = ("own", "nnsight")  # what may run a --model source (model.backend's contract)


def run_by(text: str, backend: str = "own", device_map: str | None = None, remote: bool = False) -> Source:
    """A --model source as `parse_source` reads it, run by `backend`: "nnsight" opens a Hugging Face folder (or
    a cached hub repo) through nnsight, spread with `device_map`, or with `remote` a Hub repo id on NDIF.
    A combination that cannot run is a ValueError with one sentence."""
    if backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {shortened(str(backend))}")
    if backend == "own":
        if device_map is not None or remote:
            raise ValueError("--device-map and --remote go with --backend nnsight: the own engine runs a model in "
                             "this process")
        return parse_source(text)
    if remote:
        if device_map is not None:
            raise ValueError("a remote model is placed by NDIF: --device-map is for a model run on this machine")
        repo = text.strip().partition("@")[0] if isinstance(text, str) else ""
        if not _REPO.fullmatch(repo):
            raise ValueError(f"{shortened(str(text))} is not a Hub repo id (owner/name), which NDIF knows its "
                             "models by")
        return Source("remote", repo=repo, backend="nnsight", remote=True)
    source = parse_source(text)
    if source.kind not in ("folder", "hub"):
        raise ValueError(f"{source.shown} is a {source.kind} file: nnsight runs Hugging Face models (a folder or a "
                         "cached hub repo)")
    return dataclasses.replace(source, backend="nnsight", device_map=device_map)


def sources_from(args: list[str] | None, env: str | None, backend: str = "own", device_map: str | None = None,
                 remote: bool = False) -> list[Source]:
    """The sources of --model (in order, run by `backend`: see `run_by`), then those of the environment
    variable (the own engine's), each once. When neither names one, the README's `preload_from_hub` repos
    that are in the hub cache (lab.catalogue.preloaded): what a Space's build fetched is what it offers."""
    if (backend != "own" or device_map is not None or remote) and not args:
        raise ValueError("--backend, --device-map and --remote apply to the models given with --model; name one")
    found: list[Source] = []
    for text in args or []:
        source = run_by(text, backend, device_map, remote)
        if source not in found:
            found.append(source)
    given = [s for s in (env or "").split(SEPARATOR) if s.strip()]
    if not given and not found:
        from .preloaded import preloaded_sources

        given = preloaded_sources()
    for text in given:
        source = parse_source(text)
        if source not in found:
            found.append(source)
    return found


# ------------------------------------------------------------------------------------ the files


def hub_folder(source: Source) -> Path:
    """The cached snapshot of a hub source; a sentence when it is not in this machine's cache."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(source.repo, revision=source.revision, local_files_only=True))
    except Exception:  # not cached, an unknown revision, an invalid id: the same answer for the person
        raise UserError(f"'{source.label}' is not in this server's Hugging Face cache, and the app downloads "
                        f"nothing while it runs. Whoever runs the app can fetch it once with: "
                        f"hf download {source.repo} --revision {source.revision}") from None


def model_files(source: Source, folder: Path | None) -> list[Path]:
    """The files a model is made of (what its hash covers), in a fixed order. A folder's files are
    read only when none of them is a link out of it (model.sources.check_links): a ValueError."""
    if source.kind == "nanochat":  # its model file, meta file and tokenizer.pkl (links kept inside: a ValueError)
        from model.nanochat import locate

        return locate(source.path).all
    if source.kind == "nanogpt":
        meta = source.path.parent / "meta.pkl"
        if not meta.is_file():
            return [source.path]
        check_links(source.path.parent, ("meta.pkl",))
        return [source.path, meta]
    if source.kind == "file":
        return [source.path]
    check_links(folder)
    names = [n for n in _FOLDER_FILES if (folder / n).is_file()]
    names += sorted(p.name for p in folder.glob("*.safetensors"))
    return [folder / n for n in names]


def files_hash(files: list[Path]) -> str:
    """SHA-256 over the files' names and contents, read a megabyte at a time."""
    total = hashlib.sha256()
    for path in files:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(2**20):
                h.update(chunk)
        total.update(f"{path.name}\0{h.hexdigest()}\n".encode())
    return total.hexdigest()


class HashRecord:
    """The SHA-256 each source had when it was first loaded here, kept in a small JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _read(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}

    def check(self, label: str, digest: str, shown: str) -> None:
        """Record a new source's hash (by its label); refuse (UserError) one whose files changed since."""
        known = self._read()
        if label not in known:
            known[label] = digest
            try:
                atomic_write(self.path, json.dumps(known, indent=1, sort_keys=True).encode("utf-8"))
            except OSError:
                pass  # nowhere to write: the model still loads, unchecked next time
            return
        if known[label] != digest:
            raise UserError(f"The files of '{shown}' have changed since this server first loaded them (their "
                            "SHA-256 differs from the one recorded then), so they are not loaded. If the change "
                            "was intended, whoever runs the app can remove the model's line from the record of "
                            "model hashes.")


# ---------------------------------------------------------------------------------- the registry


class ExternalModels:
    """The models the person running the app chose, by display name; each loaded on first use."""

    def __init__(self, sources: list[Source] = (), hashes: Path = HASHES_FILE) -> None:
        self.record = HashRecord(hashes)
        self._lock = threading.Lock()
        self.configure(sources)

    def configure(self, sources: list[Source]) -> None:
        """Offer these sources (replacing any before); names are made unique in order."""
        with self._lock:
            self.sources: dict[str, Source] = {}
            for s in sources:
                name, n = s.name, 2
                while name in self.sources:
                    name, n = f"{s.name} ({n})", n + 1
                self.sources[name] = s
            self._loaded: dict[str, ModelEntry] = {}
            self._refused: dict[str, UserError] = {}  # refused after its files were read

    @property
    def names(self) -> list[str]:
        return list(self.sources)

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in self.sources

    def by_label(self, label: str) -> str | None:
        """The display name of the source a session file names, if this app offers it."""
        return next((n for n, s in self.sources.items() if s.shown == label), None)

    def get(self, name: str) -> ModelEntry:
        """The shared entry, loaded (and its hash checked) on first use; a refusal is a UserError."""
        loaded = self._loaded.get(name)  # a loaded model does not wait while another one loads
        if loaded is not None:
            return loaded
        with self._lock:
            if name in self._refused:
                raise self._refused[name]
            if name not in self._loaded:
                source = self.sources[name]
                folder = hub_folder(source) if source.kind == "hub" else source.path  # may be cached later
                try:
                    self._loaded[name] = self._open(name, source, folder)
                except UserError as exc:  # files that are there but wrong: not read again until a restart
                    self._refused[name] = exc
                    raise
            return self._loaded[name]

    def _open(self, name: str, source: Source, folder: Path | None) -> ModelEntry:
        from .realmodels import open_external, open_on_backend  # the engine's importers load on first use

        if source.kind == "remote":  # no weights here: NDIF's copy is the model
            return open_on_backend(name, source, "")
        try:
            files = model_files(source, folder)
        except ValueError as exc:  # a link out of the folder: refused as the importers refuse it
            raise UserError(f"'{source.shown}' cannot be opened: {str(exc).rstrip('.')}.") from None
        if not files or not all(p.is_file() for p in files):
            raise UserError(f"'{source.shown}' has no model files here.")
        digest = files_hash(files)
        self.record.check(source.label, digest, source.shown)
        if source.backend == "nnsight":
            return open_on_backend(name, dataclasses.replace(source, path=folder), digest)
        return open_external(name, source, folder, digest)


EXTERNAL = ExternalModels()
