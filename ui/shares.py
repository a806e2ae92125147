"""Calls admitted at the door (ui/http.py's middleware), before they take a place in gradio's queue.

Three things are decided when a call joins, not when it runs:

- its address's share of the queue: one address has at most `CLIENT_QUEUE` calls waiting or running
  (gradio's whole queue holds `QUEUE_SIZE`), so one visitor cannot fill it and others' calls are
  queued behind at most that many of its calls;
- its rate: a handler with a `rate` (ui/common.py `handler`) takes its token here, and the call
  carries a header saying so (`CHARGED`, which the door removes from every request that arrives);
- its session's turn: a call of a session whose previous action is still running waits here, in
  the event loop, holding no worker, and joins the queue once that action has ended. So waiting
  for one's own session never holds a worker another visitor needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter

from lab.budget import LIMITER, client_key
from lab.checks import UserError
from lab.limits import CLIENT_QUEUE, QUEUE_SIZE
from lab.session import BUSY_WAIT_S, SESSIONS

CHARGED = b"x-decoder-lab-charged"  # the rate a call's token was taken for at the door


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def scope_client(scope) -> str:
    """The client (lab.budget.client_key) a raw ASGI request counts against."""
    host = (scope.get("client") or (None,))[0]
    return client_key(host, _header(scope, b"x-forwarded-for"))


def without_charge(scope):
    """The request without a `CHARGED` header of its own: only the door sets it."""
    headers = scope.get("headers", [])
    if any(k.lower() == CHARGED for k, _ in headers):
        scope = dict(scope, headers=[(k, v) for k, v in headers if k.lower() != CHARGED])
    return scope


def _event_client(event) -> str | None:
    request = getattr(event, "request", None)
    if request is None or request.client is None:
        return None
    return client_key(request.client.host, request.headers.get("x-forwarded-for"))


def _exclusive(fn) -> bool:
    return bool(getattr(getattr(fn, "fn", None), "exclusive", False))


class Door:
    """Admission of the calls of one app (`blocks`); see the module's docstring."""

    def __init__(self, blocks, *, places: int = CLIENT_QUEUE, wait_s: float = BUSY_WAIT_S, poll_s: float = 0.02):
        self.blocks, self.places, self.wait_s, self.poll_s = blocks, places, wait_s, poll_s
        self.waiting: Counter[str] = Counter()  # calls per client waiting here for their session's turn
        self.joining: Counter[str] = Counter()  # calls per session hash between this door and gradio's queue

    def _events(self) -> list:
        queue = getattr(self.blocks, "_queue", None)
        return list(getattr(queue, "event_ids_to_events", {}).values())

    def _fn(self, api_name: str | None, payload: dict):
        fns, index = self.blocks.fns, payload.get("fn_index")
        if index is not None or api_name is None:
            return fns.get(index) if isinstance(index, int) and not isinstance(index, bool) else None
        return next((f for f in fns.values() if f.api_name == api_name), None)

    def _session_busy(self, session_hash: str) -> bool:
        """Whether an action of this session holds its turn, or is queued to take it."""
        if self.joining[session_hash]:
            return True
        if any(e.session_hash == session_hash and _exclusive(e.fn) for e in self._events()):
            return True
        session = SESSIONS.get(session_hash)
        turn = getattr(session, "_turn", None)
        return turn is not None and turn.locked()

    @contextlib.asynccontextmanager
    async def admit(self, scope, api_name: str | None, body: bytes):
        """Yields None when the call may go on (`scope`'s headers then say what was charged), or
        (status, message) when it is refused."""
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        fn = self._fn(api_name, payload) if isinstance(payload, dict) else None
        if fn is None:  # not a call of ours: the guard's checks answer it
            yield None
            return
        client = scope_client(scope)
        mine = sum(_event_client(e) == client for e in self._events()) + self.waiting[client]
        if mine >= self.places:
            yield 429, (f"Your address has {mine} calls waiting or running; one address may have {self.places} at "
                        f"once (the server's queue holds {QUEUE_SIZE} for everyone). Wait for them to finish.")
            return
        rate = getattr(fn.fn, "rate", None)
        if rate is not None:
            try:
                LIMITER.check(client, rate)
            except UserError as exc:
                yield 429, str(exc)
                return
            scope["headers"] = [*scope.get("headers", []), (CHARGED, rate.encode())]
        session_hash = payload.get("session_hash")
        if not (_exclusive(fn) and isinstance(session_hash, str) and session_hash):
            yield None
            return
        self.waiting[client] += 1
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.wait_s
            busy = self._session_busy(session_hash)
            while busy and loop.time() < deadline:
                await asyncio.sleep(self.poll_s)
                busy = self._session_busy(session_hash)
        finally:
            self.waiting[client] -= 1
            if not self.waiting[client]:
                del self.waiting[client]
        if busy:
            yield 409, "This session is still busy with your previous action; try again in a moment."
            return
        self.joining[session_hash] += 1
        try:
            yield None
        finally:
            self.joining[session_hash] -= 1
            if not self.joining[session_hash]:
                del self.joining[session_hash]
