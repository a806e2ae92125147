"""Calls admitted at the door (ui/http.py's middleware), before they take a place in gradio's queue.

Four things are decided when a call joins, not when it runs:

- its address's share of the queue: one address has at most `CLIENT_QUEUE` calls waiting or running
  (gradio's whole queue holds `QUEUE_SIZE`), so one visitor cannot fill it and others' calls are
  queued behind at most that many of its calls;
- its share of long calls: at most `CLIENT_LONG_CALLS` trainings, and replays (a session file
  opened, a page load of a link with steps), per address waiting or running, so another visitor's
  training or replay waits behind no more than that of one address's;
- its rate: a handler with a `rate` (ui/common.py `handler`) takes its token here, and so do the
  replay of a link a page load opens (the handler's `replays`) and a new session (the first call of
  a session hash); the call carries a header saying so (`CHARGED`, which the door removes from
  every request that arrives);
- its session's turn: a call of a session whose previous action is still running waits here, in
  the event loop, holding no worker, and joins the queue once that action has ended. So waiting
  for one's own session never holds a worker another visitor needs;
- its address's turn: an address has at most `CLIENT_WORKERS` calls in gradio's queue (waiting or
  running; its training besides, which has a share and a lane of its own); its further calls wait
  here too, as for the session's turn. So one address keeps at most that many workers busy whatever
  it sends, and another visitor's call waits behind at most that many of one address's, in its lane
  (ui/lanes.py: Step never waits behind a heavy call). An address that keeps its worker busy back to
  back (a call of it waited for the one before) rests after each call, while other addresses are
  active, for as long as that call ran (`REST`, at most `REST_MAX_S`): one address holds the
  interpreter at most about half of the time, so a heavy handler it repeats cannot take it from a
  victim's Step (a person's click after a finished call never rests).

Files sent to gradio's upload route are admitted here too: their bytes come out of the address's
upload share (`admit_upload`), since gradio keeps them in its cache, outside the disk budget.

Who a call counts against is ui/clients.py's: its address, or for a call gradio's MCP server makes of this
app (`python app.py --mcp`, ui/tools.py), the address of the MCP request it makes it for.

A call refused when it joins (its address's share or rate spent) is answered after `REFUSAL_PAUSE_S`,
waited in the event loop: a client that sends again as soon as it is refused costs the server a few
calls a second, not hundreds (a person sees the sentence a moment later).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections import Counter, OrderedDict
from urllib.parse import parse_qsl

import gradio as gr

from lab.checks import UserError, is_int
from lab.limits import CLIENT_LONG_CALLS, CLIENT_QUEUE, CLIENT_WORKERS, QUEUE_SIZE
from lab.server.rates import LIMITER
from lab.session import BUSY_WAIT_S, SESSIONS

from .clients import CHARGED, request_client, request_header, scope_client, without_charge  # noqa: F401 (http.py)
from .streams import kept_open

REFUSAL_PAUSE_S = float(os.environ.get("DECODER_LAB_REFUSAL_PAUSE_S", "0.5"))
REST = float(os.environ.get("DECODER_LAB_REST", "1.0"))  # a back-to-back call's rest, as a share of its run
REST_MAX_S, ACTIVE_S = 1.0, 10.0  # the longest rest; how recently another address must have called for one


def _drop_one(counter: Counter, key) -> None:
    """One call fewer under `key`; a key with none left goes."""
    counter[key] -= 1
    if not counter[key]:
        del counter[key]


def _event_client(event) -> str | None:
    return request_client(getattr(event, "request", None))


def _exclusive(fn) -> bool:
    return bool(getattr(getattr(fn, "fn", None), "exclusive", False))


def charged_at_door(request) -> set[str]:
    """What the door charged a call for when it joined (its rate, "replay"), from its request."""
    value = request.headers.get(CHARGED.decode()) if request is not None else None
    return set(value.split(",")) if value else set()


def _event_charged(event) -> set[str]:
    return charged_at_door(getattr(event, "request", None))


def _new_session(fn, session_hash) -> bool:
    """Whether a call of `fn` would make a new session of the lab (lab.server.sessionstore.SessionStore): a handler
    of a session whose hash the store does not hold."""
    takes = bool(getattr(fn, "inputs", None)) and isinstance(fn.inputs[0], gr.State)
    return takes and isinstance(session_hash, str) and bool(session_hash) and session_hash not in SESSIONS


# the kinds of long call an address has a share of (lab.limits.CLIENT_LONG_CALLS): what one is, what many are
LONG_CALLS = {"train": ("a training", "trainings"), "replay": ("a session file or link being opened", "replays")}


def _long_kind(fn, charged: set[str]) -> str | None:
    """The kind of long call a call of `fn` charged for `charged` is: a training, a replay (a session
    file opened, a link with steps), or None."""
    rate = getattr(getattr(fn, "fn", None), "rate", None)
    if rate == "train":
        return "train"
    if rate == "import" or "replay" in charged:
        return "replay"
    return None


class Door:
    """Admission of the calls of one app (`blocks`); see the module's docstring.

    What an address holds is counted exactly: the calls of its in gradio's queue (waiting or
    running) plus those this door admitted that have not reached the queue yet (waiting for their
    session's turn, or joining). Counting, admitting and joining are one step per address (a lock
    of its own, held only while gradio puts the call in its queue), so two calls from one address
    that arrive together cannot both take its last place.
    """

    MAX_NEW_HASHES = 10_000

    def __init__(self, blocks, *, places: int = CLIENT_QUEUE, long_calls: dict[str, int] | None = None,
                 workers: int = CLIENT_WORKERS, wait_s: float = BUSY_WAIT_S, poll_s: float = 0.02,
                 refusal_pause_s: float = REFUSAL_PAUSE_S, rest: float = REST, clock=None):
        self.blocks, self.places, self.wait_s, self.poll_s = blocks, places, wait_s, poll_s
        self.workers, self.refusal_pause_s, self.rest = workers, refusal_pause_s, rest
        self.clock = clock  # of the rests (None: the event loop's); a test drives its own
        self._since: dict[str, float] = {}  # client → when its calls now in the queue began joining
        self._rests: dict[str, float] = {}  # client → until when its next call rests
        self._joined: OrderedDict[str, float] = OrderedDict()  # client → its last join, the newest last
        self.long_calls = dict(CLIENT_LONG_CALLS if long_calls is None else long_calls)
        self.admitted: Counter[tuple[str, str | None]] = Counter()  # (client, kind) → admitted, not yet queued
        self.joining: Counter[str] = Counter()  # calls per session hash between this door and gradio's queue
        self.waiting: Counter[str] = Counter()  # calls per session hash at this door, not yet let through
        self._locks: dict[str, asyncio.Lock] = {}
        self._new_hashes: OrderedDict[str, None] = OrderedDict()  # new sessions' hashes charged here, newest last
        self._lock_users: Counter[str] = Counter()

    def _events(self) -> list:
        """gradio's events of the queue, waiting or running, but those whose page has gone: gradio marks an event
        not `alive` when its client disconnects, and one still running then stays listed until its handler
        returns; counted, it would hold its address's worker (and keep that address's next calls at this door)
        for a visitor who is no longer there."""
        queue = getattr(self.blocks, "_queue", None)
        return [e for e in getattr(queue, "event_ids_to_events", {}).values() if getattr(e, "alive", True)]

    def state(self) -> str:
        """What the door holds now, in one line (ui/diagnose.py's report)."""
        return (f"door: admitted {dict(self.admitted)}, waiting {dict(self.waiting)}, joining {dict(self.joining)}, "
                f"rests {self._rests}")

    def _fn(self, api_name: str | None, payload: dict):
        fns, index = self.blocks.fns, payload.get("fn_index")
        if index is not None or api_name is None:
            return fns.get(index) if is_int(index) else None
        return next((f for f in fns.values() if f.api_name == api_name), None)

    def held(self, client: str, kind: str | None = None) -> int:
        """Calls of `client` waiting or running (of one `kind` of long call, or all of them)."""
        queued = sum(_event_client(e) == client and (kind is None or _long_kind(e.fn, _event_charged(e)) == kind)
                     for e in self._events())
        return queued + self.admitted[(client, kind)]

    def working(self, client: str) -> int:
        """Calls of `client` in gradio's queue (waiting or running) that count for its workers: all but trainings."""
        return sum(_event_client(e) == client and _long_kind(e.fn, _event_charged(e)) != "train"
                   for e in self._events())

    def _session_busy(self, session_hash: str) -> bool:
        """Whether an action of this session is in gradio's queue (waiting for its turn or holding it), or
        joining it. (An action outside the queue holds the turn for milliseconds: a call that comes meanwhile
        waits for it in its handler.)"""
        if self.joining[session_hash]:
            return True
        return any(e.session_hash == session_hash and _exclusive(e.fn) for e in self._events())

    @contextlib.asynccontextmanager
    async def _counting(self, client: str):
        """The address's own lock: what it holds is counted and changed by one call at a time."""
        lock = self._locks.setdefault(client, asyncio.Lock())
        self._lock_users[client] += 1
        try:
            async with lock:
                yield
        finally:
            self._lock_users[client] -= 1
            if not self._lock_users[client]:
                del self._lock_users[client], self._locks[client]

    def _refusal(self, scope, client: str, fn, session_hash) -> tuple[tuple[int, str] | None, str | None]:
        """(Why the call may not join: status and sentence, or None once its tokens are taken; its
        kind of long call)."""
        mine = self.held(client)
        if mine >= self.places:
            return (429, f"Your address has {mine} calls waiting or running; one address may have {self.places} at "
                         f"once (the server's queue holds {QUEUE_SIZE} for everyone). Wait for them to finish."), None
        params = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
        replays = getattr(fn.fn, "replays", None)
        steps = replays(params) if replays is not None else 0
        rate = getattr(fn.fn, "rate", None)
        new = _new_session(fn, session_hash)
        charged = [c for c in (rate, "replay" if steps else None, "session" if new else None) if c is not None]
        kind = _long_kind(fn, set(charged))
        if kind is not None and self.held(client, kind) >= self.long_calls[kind]:
            what = LONG_CALLS[kind]
            return (429, f"Your address already has {what[0]} waiting or running; one address may have "
                         f"{self.long_calls[kind]} at once, so that others' {what[1]} wait behind no more than that. "
                         "Wait for it to finish."), kind
        try:
            if new and session_hash not in self._new_hashes:  # its first call: a page's calls at once pay once
                LIMITER.check(client, "session")
                self._new_hashes[session_hash] = None
                while len(self._new_hashes) > self.MAX_NEW_HASHES:
                    self._new_hashes.popitem(last=False)
            if rate is not None:
                LIMITER.check(client, rate)
            if steps:
                LIMITER.check(client, "replay", steps)
        except UserError as exc:
            return (429, str(exc)), kind
        if charged:
            scope["headers"] = [*scope.get("headers", []), (CHARGED, ",".join(charged).encode())]
        return None, kind

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
        with kept_open(self.blocks, payload.get("session_hash")):  # ui/streams.py
            async with self._admit(scope, fn, payload) as answer:
                yield answer

    @contextlib.asynccontextmanager
    async def _admit(self, scope, fn, payload: dict):
        """`admit` of a call of ours (`fn`, its `payload`)."""
        client = scope_client(scope)
        async with self._counting(client):
            refused, kind = self._refusal(scope, client, fn, payload.get("session_hash"))
            kinds = {None, kind}
            if refused is None:
                for k in kinds:
                    self.admitted[(client, k)] += 1
        if refused is not None:
            await asyncio.sleep(self.refusal_pause_s)
            yield refused
            return
        queued, session_hash = False, payload.get("session_hash")
        self.waiting[str(session_hash)] += 1
        waits = True
        try:
            exclusive = _exclusive(fn) and isinstance(session_hash, str) and bool(session_hash)
            counted = kind != "train"  # a training has a worker of its own (one per address, one at once)
            loop = asyncio.get_running_loop()
            deadline, waited = loop.time() + self.wait_s, False
            while True:  # until its session's turn and its address's: checked and taken under the address's lock
                async with self._counting(client):
                    busy = exclusive and self._session_busy(session_hash)
                    now = self.clock() if self.clock is not None else loop.time()
                    full = counted and not self._free(client, now, waited)
                    waited = waited or (counted and self.working(client) >= self.workers)
                    if not busy and not full:
                        _drop_one(self.waiting, str(session_hash))
                        waits = False
                        self._joins(client, now, counted)
                        if exclusive:
                            self.joining[session_hash] += 1
                        try:
                            yield None
                        finally:
                            queued = True
                            self._release(client, kinds)
                            if exclusive:
                                _drop_one(self.joining, session_hash)
                        return
                if loop.time() >= deadline:
                    break
                await asyncio.sleep(self.poll_s)
            if busy:
                yield 409, "This session is still busy with your previous action; try again in a moment."
            else:
                yield 429, (f"Your address's earlier calls are still running; one address may have {self.workers} "
                            "in the queue at once, so that others are not kept waiting. Try again in a moment.")
        finally:
            if waits:
                _drop_one(self.waiting, str(session_hash))
            if not queued:
                self._release(client, kinds)

    def _free(self, client: str, now: float, waited: bool) -> bool:
        """Whether the address may have one more call in the queue now: fewer than `workers` there, and its
        rest over. Its calls there have all ended: if a call that `waited` for them sees it (so they ended
        just now) while others are active, it rests for `rest` times as long as they ran."""
        working = self.working(client)
        since = self._since.get(client)
        if working == 0 and since is not None:
            del self._since[client]
            if waited and self._others_active(client, now):
                self._rests[client] = now + min(REST_MAX_S, (now - since) * self.rest)
        if working >= self.workers:
            return False
        if now < self._rests.get(client, now):
            return False
        self._rests.pop(client, None)
        return True

    def _others_active(self, client: str, now: float) -> bool:
        for other, at in reversed(self._joined.items()):  # the newest first
            if now - at > ACTIVE_S:
                return False
            if other != client:
                return True
        return False

    def _joins(self, client: str, now: float, counted: bool) -> None:
        """A call of `client` joins the queue now."""
        if counted:
            self._since.setdefault(client, now)
        self._joined.pop(client, None)
        self._joined[client] = now
        while len(self._joined) > self.MAX_NEW_HASHES or (self._joined and now - next(iter(self._joined.values()))
                                                            > ACTIVE_S):
            self._joined.popitem(last=False)
        for kept in (self._since, self._rests):  # an address that never came back: its oldest entries go
            while len(kept) > self.MAX_NEW_HASHES:
                del kept[next(iter(kept))]

    def _release(self, client: str, kinds: set[str | None]) -> None:
        for kind in kinds:
            _drop_one(self.admitted, (client, kind))

    def admit_upload(self, scope) -> tuple[int, str] | None:
        """A file sent to gradio's upload route: its bytes are taken from the address's upload share
        (gradio keeps uploads in its cache, outside the disk budget), or (status, sentence)."""
        length = request_header(scope, b"content-length")
        if length is None or not length.strip().isdigit():
            return 411, "Send the file with its length (a Content-Length header), as browsers do."
        try:
            LIMITER.check(scope_client(scope), "upload_bytes", int(length))
        except UserError as exc:
            return 429, str(exc)
        return None
