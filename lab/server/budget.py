"""What one visitor may take of the memory and disk everyone shares.

Two guards, each thread-safe, each with an injectable clock (tests pass a fake one):

- `ModelBudget`: bytes of people's own models (trained or uploaded), server-wide. `hold(owner,
  nbytes)` states what a session will hold; to make room it empties the least recently used idle
  sessions first, or refuses.
- `DiskBudget`: bytes of model files under `lab.server.files.RUNS`, server-wide and per session;
  `room(owner, nbytes)` makes room before a save (folders of gone sessions first, oldest first,
  then idle sessions', least recently used first) or refuses.

What the budgets need of a session (`Tenant`) is small: when it last acted (`touched`, on the
`time.monotonic` clock), whether it is acting now (`busy`), and two ways to give something up,
`drop_own_models(reason)` and `drop_files(reason)`, which return False when the session became
busy meanwhile (then nothing is taken). "Idle" (`is_idle`) means: not busy, and no action for
`IDLE_S` seconds. An idle session loses things only when the server is full, the least recently
used first; the session asking for room never loses anything to its own request. The budgets hold
sessions weakly, and a closed session counts for nothing. A session's client share is the one
lab/server/rates.py names (`client_of`); the sessions themselves live in lab/server/sessionstore.py.

Nothing here imports gradio or the session module (the session imports this).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Protocol, runtime_checkable

from ..checks import UserError
from ..limits import (
    CLIENT_FILES_BYTES, CLIENT_MEMORY_BYTES, IDLE_S, MEMORY_MAX_BYTES, RUN_FILES_MAX_BYTES, RUN_FILES_SESSION_MAX_BYTES,
)
from . import files
from .rates import Clock, client_of, wait_words

__all__ = ["Tenant", "is_idle", "ModelBudget", "DiskBudget", "model_bytes", "MODEL_BUDGET", "DISK_BUDGET"]


@runtime_checkable
class Tenant(Protocol):
    """What the budgets read and ask of a session (lab.session.Session implements it)."""

    touched: float  # time.monotonic() of its last action (the start or end of one)
    closed: bool
    # Optionally `client: str | None`, the address it counts against (lab.server.rates.client_key;
    # lab.server.sessionstore.SessionStore sets it when it admits the session). Without one it counts for no
    # client's share.
    run_dir: Path | None  # its folder under files.RUNS, if it saved anything

    @property
    def busy(self) -> bool:
        """Acting now (holding its turn) or training."""
        ...

    def drop_own_models(self, reason: str) -> bool:
        """Remove its own models (its text too, if on one) and keep `reason` to tell the person.
        Return False, taking nothing, if it is busy. Must not wait for the session's turn."""
        ...

    def drop_files(self, reason: str) -> bool:
        """Delete its folder of model files, as drop_own_models."""
        ...

    def close(self) -> None:
        ...


def is_idle(owner, now: float, idle_s: float) -> bool:
    """Not busy, and no action for `idle_s` seconds."""
    return not owner.busy and now - owner.touched >= idle_s


def _mb(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MB"


# ------------------------------------------------------------------------- own models


def model_bytes(model) -> int:
    """Bytes a torch module keeps: its parameters and buffers, a tensor shared twice (tied weights) once."""
    seen: dict[tuple[int, int], int] = {}
    for t in (*model.parameters(), *model.buffers()):
        n = t.numel() * t.element_size()
        seen[(t.data_ptr(), n) if n else (id(t), 0)] = n
    return sum(seen.values())


class _Held:
    __slots__ = ("ref", "nbytes")

    def __init__(self, owner, nbytes: int):
        self.ref = weakref.ref(owner)
        self.nbytes = nbytes


class ModelBudget:
    """Bytes held by sessions (their own models and their texts): at most `limit_bytes` for the whole
    server and `client_limit_bytes` for the sessions of one client."""

    def __init__(self, limit_bytes: int = MEMORY_MAX_BYTES, client_limit_bytes: int = CLIENT_MEMORY_BYTES, *,
                 idle_s: float = IDLE_S, clock: Clock = time.monotonic):
        self.limit_bytes, self.client_limit_bytes, self.idle_s, self.clock = limit_bytes, client_limit_bytes, idle_s, clock
        self._held: dict[int, _Held] = {}
        self._lock = threading.RLock()  # a drop_own_models may call release() back

    def _live(self) -> list[tuple[object, _Held]]:
        """Forget sessions that are gone or closed; the others with what they hold."""
        live = []
        for k, h in list(self._held.items()):
            owner = h.ref()
            if owner is None or owner.closed:
                del self._held[k]
            else:
                live.append((owner, h))
        return live

    def _get(self, owner) -> _Held | None:
        h = self._held.get(id(owner))
        return h if h is not None and h.ref() is owner else None

    @property
    def total(self) -> int:
        with self._lock:
            return sum(h.nbytes for _, h in self._live())

    def held(self, owner) -> int:
        with self._lock:
            h = self._get(owner)
            return 0 if h is None else h.nbytes

    def hold(self, owner, nbytes: int) -> None:
        """`owner` will hold `nbytes` of own models in all (after the change it is about to make).

        More than before needs room: first within the owner's client's share (its other idle
        sessions' models go, least recently used first), then within the server's bound (any
        client's idle sessions, least recently used first), via `drop_own_models`; never `owner`'s
        or a busy or recently active session's. If that cannot make room, raise UserError and take
        nothing from anyone. Less always succeeds.
        """
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError("nbytes must be ≥ 0")
        with self._lock:
            live = self._live()
            mine = self._get(owner)
            before = 0 if mine is None else mine.nbytes
            client = client_of(owner)
            if nbytes > before:
                if nbytes > self.limit_bytes:
                    raise UserError(f"Your models would take {_mb(nbytes)} of memory; the server allows "
                                    f"{_mb(self.limit_bytes)} for everyone's own models together.")
                if client is not None:
                    ours = [(o, h) for o, h in live if client_of(o) == client]
                    need = sum(h.nbytes for _, h in ours) - before + nbytes - self.client_limit_bytes
                    if need > 0:
                        self._make_room(owner, ours, need, UserError(
                            f"The sessions from your address would hold {_mb(need + self.client_limit_bytes)} of "
                            f"models and texts; one address may hold {_mb(self.client_limit_bytes)} (the server is "
                            "shared). Reset texts or remove models you no longer use, or try again in a few minutes."))
                        live = self._live()
                need = sum(h.nbytes for _, h in live) - before + nbytes - self.limit_bytes
                if need > 0:
                    self._make_room(owner, live, need, UserError(
                        "The server is full right now: the memory for people's models and texts is in use by "
                        "people who are using them. Try again in a few minutes."))
            if nbytes == 0:
                self._held.pop(id(owner), None)
            elif mine is not None:
                mine.nbytes = nbytes
            else:
                self._held[id(owner)] = _Held(owner, nbytes)

    def _make_room(self, owner, candidates: list[tuple[object, _Held]], need: int, refusal: UserError) -> None:
        """Drop the models of idle sessions among `candidates` (never `owner`), least recently used
        first, until `need` bytes are free; raise `refusal` first if they cannot free that much."""
        now = self.clock()
        idle = sorted(((o.touched, id(o), o, h) for o, h in candidates
                       if o is not owner and h.nbytes > 0 and is_idle(o, now, self.idle_s)), key=lambda x: x[:2])
        if sum(h.nbytes for *_, h in idle) < need:
            raise refusal
        reason = ("Your own models and text were removed to make room for other people after more than "
                  f"{wait_words(self.idle_s)} without activity. Train or upload them again "
                  "(a downloaded file loads back).")
        for _, _, o, h in idle:
            if need <= 0:
                break
            freed = h.nbytes
            if o.drop_own_models(reason):
                self._held.pop(id(o), None)
                need -= freed
        if need > 0:  # sessions became busy meanwhile
            raise UserError("The server is full right now; try again in a minute.")

    @contextmanager
    def borrow(self, owner, nbytes: int) -> Iterator[None]:
        """`owner` holds `nbytes` more while the body runs (a computation's working memory, such as a
        patching sweep's batch), granted or refused as `hold` grants more; given back at the end."""
        with self._lock:
            self.hold(owner, self.held(owner) + int(nbytes))
        try:
            yield
        finally:
            with self._lock:
                self.hold(owner, max(0, self.held(owner) - int(nbytes)))

    def release(self, owner) -> None:
        """`owner` holds nothing any more (it closed, or dropped its models)."""
        with self._lock:
            if self._get(owner) is not None:
                del self._held[id(owner)]


# ---------------------------------------------------------------------------- disk


def _folder(path: Path) -> tuple[int, float]:
    """(bytes of the files under `path`, newest mtime of it and them)."""
    size, newest = 0, path.stat().st_mtime
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                st = os.stat(os.path.join(root, name), follow_symlinks=False)
            except OSError:
                continue
            size += st.st_size
            newest = max(newest, st.st_mtime)
    return size, newest


class DiskBudget:
    """Bytes of model files under `files.RUNS` (read at each call): at most `limit_bytes` in all,
    `client_limit_bytes` for the sessions of one client and `session_limit_bytes` per session."""

    def __init__(self, limit_bytes: int = RUN_FILES_MAX_BYTES, session_limit_bytes: int = RUN_FILES_SESSION_MAX_BYTES,
                 client_limit_bytes: int = CLIENT_FILES_BYTES, *, idle_s: float = IDLE_S, clock: Clock = time.monotonic):
        self.limit_bytes, self.session_limit_bytes = limit_bytes, session_limit_bytes
        self.client_limit_bytes = client_limit_bytes
        self.idle_s, self.clock = idle_s, clock
        self._owners: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.RLock()

    def folders(self) -> dict[Path, tuple[int, float]]:
        """Every session folder under files.RUNS: (bytes, newest mtime)."""
        out = {}
        try:
            entries = list(os.scandir(files.RUNS))
        except OSError:
            return out
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    path = Path(e.path).resolve()
                    out[path] = _folder(path)
            except OSError:
                continue
        return out

    @property
    def total(self) -> int:
        return sum(size for size, _ in self.folders().values())

    @contextmanager
    def room(self, owner, nbytes: int) -> Iterator[None]:
        """Make room for `owner` to write `nbytes` more under its folder, then hold the budget while
        the body writes (so two saves cannot both take the last room).

        First the owner's own oldest files go if it would pass its per-session bound; then, if its
        client would pass its share, the folders of that client's other idle sessions (least
        recently used first, via `drop_files`); then, if the server would pass its bound, folders of
        sessions that are gone (oldest first), then folders of idle sessions (least recently used
        first). If that cannot make room, raise UserError before deleting anything of anyone else.
        """
        nbytes = int(nbytes)
        with self._lock:
            self._owners.add(owner)
            if nbytes > self.session_limit_bytes:
                raise UserError(f"This model file would be {_mb(nbytes)}; a session may keep "
                                f"{_mb(self.session_limit_bytes)} of files.")
            own = Path(owner.run_dir).resolve() if owner.run_dir is not None else None
            folders = self.folders()
            if own is not None and own in folders:
                self._trim_own(own, self.session_limit_bytes - nbytes)
                folders[own] = _folder(own)
            if client_of(owner) is not None:
                self._client_room(owner, own, folders, nbytes)
            need = sum(size for size, _ in folders.values()) + nbytes - self.limit_bytes
            if need > 0:
                self._free(owner, own, folders, need)
            yield

    def _client_room(self, owner, own: Path | None, folders: dict[Path, tuple[int, float]], nbytes: int) -> None:
        """Keep the owner's client within its share: its other idle sessions' folders go first (the
        folders they held are taken out of `folders`), or raise UserError deleting nothing."""
        client, now = client_of(owner), self.clock()
        ours = [(o, Path(o.run_dir).resolve()) for o in list(self._owners)
                if not o.closed and o is not owner and client_of(o) == client and o.run_dir is not None]
        ours = [(o, p) for o, p in ours if p in folders and p != own]
        used = (folders[own][0] if own in folders else 0) + sum(folders[p][0] for _, p in ours)
        need = used + nbytes - self.client_limit_bytes
        if need <= 0:
            return
        idle = sorted(((o.touched, str(p), p, o) for o, p in ours if is_idle(o, now, self.idle_s)), key=lambda x: x[:2])
        if sum(folders[p][0] for *_, p, _ in idle) < need:
            raise UserError(f"The files of the sessions from your address would take {_mb(used + nbytes)}; one "
                            f"address may keep {_mb(self.client_limit_bytes)} (the server is shared). Try again "
                            "in a few minutes.")
        reason = ("Your model files were deleted to make room for newer files from your address after a while "
                  "without activity; your models are still here: train again to download one.")
        for _, _, p, o in idle:
            if need <= 0:
                return
            if o.drop_files(reason):
                need -= folders.pop(p)[0]
        if need > 0:
            raise UserError("The disk for files from your address is full right now; try again in a minute.")

    def _trim_own(self, own: Path, keep: int) -> None:
        """Delete the oldest files of the owner's folder until it holds at most `keep` bytes."""
        listed = []
        for p in own.iterdir():
            try:
                if p.is_file() and not p.is_symlink():
                    st = p.stat()
                    listed.append((st.st_mtime, p.name, p, st.st_size))
            except OSError:
                continue
        size = sum(x[3] for x in listed)
        for _, _, p, n in sorted(listed):
            if size <= keep:
                break
            try:
                p.unlink()
                size -= n
            except OSError:
                pass

    def _free(self, owner, own: Path | None, folders: dict[Path, tuple[int, float]], need: int) -> None:
        now = self.clock()
        live = {}
        for o in list(self._owners):
            if not o.closed and o.run_dir is not None:
                live[Path(o.run_dir).resolve()] = o
        orphans, idle = [], []
        for path, (size, mtime) in folders.items():
            if path == own or size == 0:
                continue
            o = live.get(path)
            if o is None:
                orphans.append((mtime, str(path), path, size))
            elif o is not owner and is_idle(o, now, self.idle_s):
                idle.append((o.touched, str(path), path, size, o))
        if sum(x[3] for x in orphans) + sum(x[3] for x in idle) < need:
            raise UserError("The server's disk for trained models is full right now, with files of people who "
                            "are using them. Try again in a few minutes.")
        for _, _, path, size in sorted(orphans):
            if need <= 0:
                return
            files.remove_dir(path)
            need -= size
        reason = ("Your model files were deleted to make room for other people's after a while without "
                  "activity; your models are still here: train again to download one.")
        for _, _, path, size, o in sorted(idle, key=lambda x: x[:2]):
            if need <= 0:
                return
            if o.drop_files(reason):
                need -= size
        if need > 0:
            raise UserError("The server's disk for trained models is full right now; try again in a minute.")


# The server's own budgets (one process, one of each).
MODEL_BUDGET = ModelBudget()
DISK_BUDGET = DiskBudget()
