"""What one visitor may take of what everyone shares: request rates, sessions, memory and disk.

Four guards, each thread-safe, each with an injectable clock (tests pass a fake one):

- `RateLimiter`: token buckets per (client, action). `check(client, action)` takes a token or
  raises `UserError("Slow down: …")` saying when to try again. `client_key` turns a request's
  address (and, behind a proxy, its X-Forwarded-For) into the client.
- `SessionStore`: the server's sessions by gradio's session hash, the one home of a person's
  session; the page's gr.State holds only a `SessionKey` into it. Gradio's own state store drops
  the least recently used session once more than `state_session_capacity` exist, whatever it
  holds, and it makes a session for any new hash before any handler runs, so a burst of new hashes
  evicts people. Sessions kept here survive that; new ones are rate-limited per client, and when
  `MAX_SESSIONS` are held only an idle one makes room (else "the server is full").
- `ModelBudget`: bytes of people's own models (trained or uploaded), server-wide. `hold(owner,
  nbytes)` states what a session will hold; to make room it empties the least recently used idle
  sessions first, or refuses.
- `DiskBudget`: bytes of model files under `lab.files.RUNS`, server-wide and per session;
  `room(owner, nbytes)` makes room before a save (folders of gone sessions first, oldest first,
  then idle sessions', least recently used first) or refuses.

What the budgets need of a session (`Tenant`) is small: when it last acted (`touched`, on the
`time.monotonic` clock), whether it is acting now (`busy`), and two ways to give something up,
`drop_own_models(reason)` and `drop_files(reason)`, which return False when the session became
busy meanwhile (then nothing is taken). "Idle" means: not busy, and no action for `IDLE_S`
seconds. An idle session loses things only when the server is full, the least recently used
first; the session asking for room never loses anything to its own request. The budgets hold
sessions weakly, and a closed session counts for nothing.

Nothing here imports gradio or the session module (the session imports this).
"""

from __future__ import annotations

import ipaddress
import math
import os
import threading
import time
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, Iterator, Protocol, TypeVar, runtime_checkable

from . import files
from .checks import UserError
from .limits import (
    BEHIND_PROXY, CLIENT_FILES_BYTES, CLIENT_MEMORY_BYTES, CLIENT_SESSIONS, IDLE_S, MAX_SESSIONS, MEMORY_MAX_BYTES,
    RATE_LIMITS, RATE_MAX_KEYS, RUN_FILES_MAX_BYTES, RUN_FILES_SESSION_MAX_BYTES, STATE_TTL_S,
)

__all__ = [
    "Tenant", "Rate", "RateLimiter", "client_key", "SessionStore", "SessionKey", "ModelBudget", "DiskBudget",
    "model_bytes",
    "charge", "replay_cost",
    "LIMITER", "MODEL_BUDGET", "DISK_BUDGET",
]

Clock = Callable[[], float]


def monotonic() -> float:
    """The rate limiter's clock when none is given (time.monotonic). In-process tests replace this
    function (`monkeypatch.setattr(lab.budget, "monotonic", fake)`) to drive `LIMITER` themselves."""
    return time.monotonic()


def _module_clock() -> float:
    return monotonic()  # looked up at each call, so a replaced `monotonic` takes effect at once


@runtime_checkable
class Tenant(Protocol):
    """What the budgets read and ask of a session (lab.session.Session implements it)."""

    touched: float  # time.monotonic() of its last action (the start or end of one)
    closed: bool
    # Optionally `client: str | None`, the address it counts against (`client_key`; `SessionStore`
    # sets it when it admits the session). Without one it counts for no client's share.
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


def _idle(owner, now: float, idle_s: float) -> bool:
    return not owner.busy and now - owner.touched >= idle_s


def _client(owner) -> str | None:
    return getattr(owner, "client", None)


def _mb(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MB"


# ------------------------------------------------------------------------- request rates


@dataclass(frozen=True)
class Rate:
    """`burst` requests at once, then `count` per `window_s` seconds."""

    burst: int
    count: int
    window_s: float

    @property
    def per_s(self) -> float:
        return self.count / self.window_s


_SLOW_DOWN = {
    "session": "too many new sessions were opened from your address",
    "generate": "Generate was pressed too often from your address",
    "train": "too many trainings were started from your address",
    "upload": "too many models were uploaded from your address",
    "import": "too many session files were opened from your address",
    "export": "too many files were made from your address",
    "replay": "too many Steps were replayed (session files and links) from your address",
    "upload_bytes": "too many megabytes were uploaded from your address",
}
_UNITS = {"replay": "Steps to replay (a Step, an Undo or a generated token each)", "upload_bytes": "MB of uploads"}
_UNIT_SIZE = {"upload_bytes": 2**20}  # a bucket of bytes speaks of MB


def _after(seconds: float) -> str:
    s = max(1, math.ceil(seconds - 1e-9))
    if s < 120:
        return "1 second" if s == 1 else f"{s} seconds"
    return f"{math.ceil(s / 60)} minutes"


class RateLimiter:
    """Token buckets per (client, action); at most `max_keys` buckets (least recently used forgotten:
    a forgotten bucket starts full again, which only gives back what a client that stopped had)."""

    def __init__(self, rates: dict[str, tuple[int, int, float]] | None = None, *, max_keys: int = RATE_MAX_KEYS,
                 clock: Clock = _module_clock):
        self.rates = {a: Rate(*r) for a, r in (RATE_LIMITS if rates is None else rates).items()}
        self.max_keys = max_keys
        self.clock = clock
        self._buckets: OrderedDict[tuple[str, str], tuple[float, float]] = OrderedDict()  # → (tokens, at)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buckets)

    def check(self, client: str | None, action: str, cost: int = 1) -> None:
        """Take `cost` tokens of `action` for `client`, or raise UserError("Slow down: …") changing nothing.

        `client` None (a direct call, no request) is not limited. A cost over the bucket's `burst`
        can never be paid: refused at once, saying the bound.
        """
        rate = self.rates[action]  # an unknown action is a programming error: KeyError
        if client is None:
            return
        if cost > rate.burst:
            size = _UNIT_SIZE.get(action, 1)
            raise UserError(f"This would take {math.ceil(cost / size):,} {_UNITS.get(action, action)}; one address "
                            f"may take at most {rate.burst // size:,} at once (the server is shared).")
        key = (client, action)
        with self._lock:
            now = self.clock()
            tokens, at = self._buckets.pop(key, (float(rate.burst), now))
            tokens = min(float(rate.burst), tokens + max(0.0, now - at) * rate.per_s)
            if tokens >= cost:
                tokens -= cost
                refused = None
            else:
                refused = (cost - tokens) / rate.per_s
            self._buckets[key] = (tokens, now)  # most recently used last
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        if refused is not None:
            raise UserError(f"Slow down: {_SLOW_DOWN.get(action, f'too many {action} requests')} "
                            f"in a short time. Try again in {_after(refused)}.")


def _normal(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _key(ip) -> str:
    if isinstance(ip, ipaddress.IPv6Address):  # one subscriber has a whole /64
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def client_key(host: str | None, forwarded_for: str | None = None, *, behind_proxy: bool = BEHIND_PROXY) -> str:
    """The client a request counts against: its address, an IPv6 address by its /64.

    Behind a proxy (`behind_proxy`; on Spaces `request.client.host` is the proxy's internal
    address), the client is the rightmost public address of X-Forwarded-For: proxies append the
    address they saw, so entries left of it may be forged, those right of it are the proxies'.
    Without a proxy X-Forwarded-For is ignored: anyone could send one.
    """
    if behind_proxy and forwarded_for:
        hops = [ip for ip in map(_normal, str(forwarded_for).split(",")[-32:]) if ip is not None]
        public = [ip for ip in hops if ip.is_global]
        if public:
            return _key(public[-1])
        if hops:
            return _key(hops[0])
    ip = _normal(host) if host else None
    return _key(ip) if ip is not None else str(host or "unknown")[:100]


# ------------------------------------------------------------------------------ sessions

T = TypeVar("T")


class SessionStore(Generic[T]):
    """The server's sessions by gradio's session hash, so gradio's state store can drop a tab's
    state without losing the person's session.

    `resolve(hash, client, given)` returns the session kept for `hash`; for a new hash it keeps
    `given` (a fresh session a caller made; `factory()` if there is none or that one is closed), after
    `limiter.check(client, "session")`, and sets its `client`. One client holds at most
    `client_sessions`: past that its own least recently used idle session is closed to make room,
    or the new one is refused if all of its sessions are in use. At `max_sessions`, the least
    recently used idle session is closed to make room; if none is idle the new one is refused.
    Sessions idle for `ttl_s` are closed (swept at most once a second).
    """

    def __init__(self, factory: Callable[[], T], *, max_sessions: int = MAX_SESSIONS,
                 client_sessions: int = CLIENT_SESSIONS, idle_s: float = IDLE_S, ttl_s: float = STATE_TTL_S,
                 limiter: RateLimiter | None = None, clock: Clock = time.monotonic):
        self.factory = factory
        self.max_sessions, self.client_sessions, self.idle_s, self.ttl_s = max_sessions, client_sessions, idle_s, ttl_s
        self.limiter = limiter
        self.clock = clock
        self._sessions: OrderedDict[str, T] = OrderedDict()  # most recently resolved last
        self._lock = threading.Lock()
        self._swept = -math.inf

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_hash) -> bool:
        return session_hash in self._sessions

    def get(self, session_hash: str) -> T | None:
        return self._sessions.get(session_hash)

    def _sweep(self, now: float) -> list[T]:
        gone = []
        for h, s in list(self._sessions.items()):
            if s.closed:
                del self._sessions[h]
            elif not s.busy and now - s.touched > self.ttl_s:
                del self._sessions[h]
                gone.append(s)
        return gone

    def resolve(self, session_hash: str | None, client: str | None, given: T | None = None, *,
                paid: bool = False) -> T:
        """The session of this tab (see the class); raises UserError for a new one that is refused.
        `paid`: the new session's rate token was taken already (when its first call joined the queue).
        Without a hash nothing is kept: the session is `given`, or a new one."""
        if not session_hash:
            return given if given is not None else self.factory()
        to_close: list[T] = []
        try:
            with self._lock:
                now = self.clock()
                if now - self._swept >= 1.0:
                    self._swept = now
                    to_close += self._sweep(now)
                kept = self._sessions.get(session_hash)
                if kept is not None and not kept.closed:
                    self._sessions.move_to_end(session_hash)
                    return kept
                self._sessions.pop(session_hash, None)
                if self.limiter is not None and not paid:
                    self.limiter.check(client, "session")
                if client is not None:
                    own = [(s.touched, h) for h, s in self._sessions.items() if _client(s) == client]
                    if len(own) >= self.client_sessions:
                        idle = [x for x in own if _idle(self._sessions[x[1]], now, self.idle_s)]
                        if not idle:
                            raise UserError(
                                f"Your address already has {len(own)} sessions of this app in use; one address may "
                                f"hold {self.client_sessions} (the server is shared). Close tabs you no longer "
                                "use, or try again in a few minutes.")
                        to_close.append(self._sessions.pop(min(idle)[1]))
                while len(self._sessions) >= self.max_sessions:
                    idle = [(s.touched, h) for h, s in self._sessions.items() if _idle(s, now, self.idle_s)]
                    if not idle:
                        raise UserError("The server is full right now: every session in it is in use. "
                                        "Try again in a few minutes.")
                    to_close.append(self._sessions.pop(min(idle)[1]))
                session = self.factory() if given is None or given.closed or \
                    any(s is given for s in self._sessions.values()) else given
                session.client = client
                self._sessions[session_hash] = session
                return session
        finally:
            for s in to_close:  # outside the lock: closing stops a run and deletes files
                s.close()


    def close(self, session_hash: str) -> None:
        """Forget the session kept for `session_hash` and close it (its tab's state was deleted)."""
        with self._lock:
            session = self._sessions.pop(session_hash, None)
        if session is not None:  # outside the lock, as in resolve
            session.close()


class SessionKey:
    """What a page's gr.State holds: no session, only the way to its session in a `SessionStore`.

    The handler wrapper (ui/common.py) trades it for the store's session of the call's session hash
    and writes that hash here; when gradio deletes the tab's state (it expired, or the tab closed),
    `close` closes that session. gr.State deep-copies its initial value for every visitor: each copy
    is a new key to the same store.
    """

    __slots__ = ("store", "session_hash")

    def __init__(self, store: SessionStore):
        self.store = store
        self.session_hash: str | None = None

    def __deepcopy__(self, memo) -> SessionKey:
        return SessionKey(self.store)

    def close(self) -> None:
        if self.session_hash:
            self.store.close(self.session_hash)


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
            client = _client(owner)
            if nbytes > before:
                if nbytes > self.limit_bytes:
                    raise UserError(f"Your models would take {_mb(nbytes)} of memory; the server allows "
                                    f"{_mb(self.limit_bytes)} for everyone's own models together.")
                if client is not None:
                    ours = [(o, h) for o, h in live if _client(o) == client]
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
                       if o is not owner and h.nbytes > 0 and _idle(o, now, self.idle_s)), key=lambda x: x[:2])
        if sum(h.nbytes for *_, h in idle) < need:
            raise refusal
        reason = ("Your own models and text were removed to make room for other people after more than "
                  f"{_after(self.idle_s)} without activity. Train or upload them again "
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
            if _client(owner) is not None:
                self._client_room(owner, own, folders, nbytes)
            need = sum(size for size, _ in folders.values()) + nbytes - self.limit_bytes
            if need > 0:
                self._free(owner, own, folders, need)
            yield

    def _client_room(self, owner, own: Path | None, folders: dict[Path, tuple[int, float]], nbytes: int) -> None:
        """Keep the owner's client within its share: its other idle sessions' folders go first (the
        folders they held are taken out of `folders`), or raise UserError deleting nothing."""
        client, now = _client(owner), self.clock()
        ours = [(o, Path(o.run_dir).resolve()) for o in list(self._owners)
                if not o.closed and o is not owner and _client(o) == client and o.run_dir is not None]
        ours = [(o, p) for o, p in ours if p in folders and p != own]
        used = (folders[own][0] if own in folders else 0) + sum(folders[p][0] for _, p in ours)
        need = used + nbytes - self.client_limit_bytes
        if need <= 0:
            return
        idle = sorted(((o.touched, str(p), p, o) for o, p in ours if _idle(o, now, self.idle_s)), key=lambda x: x[:2])
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
            elif o is not owner and _idle(o, now, self.idle_s):
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


def replay_cost(actions) -> int:
    """What replaying a session file's actions costs, in Steps: one per Step and Undo, one per token
    a Generate makes (what is not a list of actions costs nothing: the file is refused for it later)."""
    if not isinstance(actions, list):
        return 0
    cost = 0
    for a in actions:
        tokens = a.get("tokens") if isinstance(a, dict) and a.get("do") == "generate" else None
        cost += len(tokens) if isinstance(tokens, list) and tokens else 1
    return cost


def charge(owner, action: str, cost: int = 1) -> None:
    """Take `cost` of `action` from the share of the client `owner` (a session) counts against."""
    LIMITER.check(_client(owner), action, cost)


# The server's own guards (one process, one of each).
LIMITER = RateLimiter()
MODEL_BUDGET = ModelBudget()
DISK_BUDGET = DiskBudget()
