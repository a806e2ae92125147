"""The server's sessions by gradio's session hash: the one home of a person's session.

The page's gr.State holds only a `SessionKey` into a `SessionStore`. Gradio's own state store drops
the least recently used session once more than `state_session_capacity` exist, whatever it holds,
and it makes a session for any new hash before any handler runs, so a burst of new hashes evicts
people. Sessions kept here survive that; new ones are rate-limited per client (lab/server/rates.py), and
when `MAX_SESSIONS` are held only an idle one (lab.server.budget.is_idle) makes room (else "the server is
full").

Nothing here imports gradio or the session module (the session imports this).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, Generic, TypeVar

from ..checks import UserError
from ..limits import CLIENT_SESSIONS, IDLE_S, MAX_SESSIONS, STATE_TTL_S
from .budget import is_idle
from .rates import Clock, RateLimiter, client_of

__all__ = ["SessionStore", "SessionKey"]

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
        self._sessions: dict[str, T] = {}  # by hash; which to close is decided by `touched`, not order
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
                    return kept
                self._sessions.pop(session_hash, None)
                if self.limiter is not None and not paid:
                    self.limiter.check(client, "session")
                if client is not None:
                    own = [(s.touched, h) for h, s in self._sessions.items() if client_of(s) == client]
                    if len(own) >= self.client_sessions:
                        idle = [x for x in own if is_idle(self._sessions[x[1]], now, self.idle_s)]
                        if not idle:
                            raise UserError(
                                f"Your address already has {len(own)} sessions of this app in use; one address may "
                                f"hold {self.client_sessions} (the server is shared). Close tabs you no longer "
                                "use, or try again in a few minutes.")
                        to_close.append(self._sessions.pop(min(idle)[1]))
                while len(self._sessions) >= self.max_sessions:
                    idle = [(s.touched, h) for h, s in self._sessions.items() if is_idle(s, now, self.idle_s)]
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
