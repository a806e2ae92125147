"""The server's warm texts: which sessions' texts keep their heavy part in memory, within one byte bound.

A text's heavy part is what it can compute again from the model's weights (lab.text: the window's
attention and scores, its key/value cache and next-token logits, the distributions of its older
tokens). A session tells the store after each action what its text's heavy part holds (`used`); the
store keeps the sessions most recently used last, and while they hold more than `limit_bytes`
together it asks the least recently used to give theirs up (`cool_text`: dropped now, computed again
when next used, so the person loses nothing but the time of one forward pass). A busy session says
no and keeps it until a later action asks again. The session that just acted is never asked: one
text larger than the bound stays warm while it is the newest (what one text may hold at all is the
memory budget's question, lab.server.budget). Nor is a text whose heavy part is under `COOL_FROM_BYTES`
(a short text on a small built-in model): cooling it would save less than it costs. It is decided by
bytes, not by model. Sessions are held weakly; a closed one counts for nothing.

Each address has a share of the bound (`client_limit_bytes`, lab.limits.CLIENT_WARM_BYTES): the texts of
an address that holds more than its share cool first, its least recently used first, and only then the
least recently used of all. So one address's many texts cool its own, not another visitor's, whose next
Step would otherwise wait for a forward pass over its whole window.

Nothing here imports gradio or the session module (the session calls this).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from collections import OrderedDict
from typing import Protocol

from ..limits import CLIENT_WARM_BYTES, WARM_MAX_BYTES
from .rates import client_of

__all__ = ["WarmTenant", "WarmTexts", "WARM", "COOL_FROM_BYTES", "map_large_blocks", "release_freed_memory"]

COOL_FROM_BYTES = 64 * 1024  # a heavy part smaller than this stays (a GPT-2 text's is ~5 MB after one Step)

log = logging.getLogger("decoder_lab")
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MAP_FROM_BYTES = 128 * 1024  # glibc's own starting threshold, kept from then on


class WarmTenant(Protocol):
    """What the store reads and asks of a session (lab.session.Session implements it)."""

    closed: bool
    text: object  # a lab.text.Text: heavy_nbytes() is what its heavy part holds now (0 when cooled)

    def cool_text(self) -> bool:
        """Drop its text's heavy part and tell its memory budget; False, taking nothing, if busy. Must not
        wait for the session's turn."""
        ...


class WarmTexts:
    """Sessions whose texts hold a heavy part, least recently used first, at most `limit_bytes` together
    (but the newest)."""

    def __init__(self, limit_bytes: int = WARM_MAX_BYTES, cool_from_bytes: int = COOL_FROM_BYTES,
                 client_limit_bytes: int = CLIENT_WARM_BYTES):
        self.limit_bytes, self.cool_from_bytes = limit_bytes, cool_from_bytes
        self.client_limit_bytes = client_limit_bytes
        self._held: OrderedDict[int, tuple[weakref.ref, int]] = OrderedDict()  # id → (session, bytes)
        self._lock = threading.Lock()

    def _live(self) -> list[tuple[int, object, int]]:
        """Forget sessions that are gone or closed; the others, least recently used first."""
        live = []
        for k, (ref, nbytes) in list(self._held.items()):
            owner = ref()
            if owner is None or owner.closed:
                del self._held[k]
            else:
                live.append((k, owner, nbytes))
        return live

    @property
    def total(self) -> int:
        """Bytes the warm texts hold, as their sessions last told."""
        with self._lock:
            return sum(n for _, _, n in self._live())

    def held(self, owner) -> int:
        with self._lock:
            ref, nbytes = self._held.get(id(owner), (None, 0))
            return nbytes if ref is not None and ref() is owner else 0

    def used(self, owner: WarmTenant) -> None:
        """`owner` has just acted: it becomes the most recently used, with what its text holds now; then
        the least recently used others cool until the rest fits the bound (those that are busy stay)."""
        nbytes = owner.text.heavy_nbytes()
        with self._lock:
            self._held.pop(id(owner), None)
            if nbytes > 0:
                self._held[id(owner)] = (weakref.ref(owner), nbytes)
            live = self._live()
            over = sum(n for _, _, n in live) - self.limit_bytes
            asked = self._to_cool(live, owner, over)
        cooled = False
        for k, o in asked:  # outside the lock: a session's cool_text tells its memory budget
            try:
                gave = o.cool_text()
            except Exception:  # noqa: BLE001 - another person's text must never fail this one's action
                log.exception("cooling a text failed")
                continue
            if gave:
                self._told(k, o, o.text.heavy_nbytes())
                cooled = True
        if cooled:
            # glibc keeps what the texts freed for later allocations of its own (in each thread's arena, and
            # at sizes its moving mmap threshold no longer maps): hand it back, or the bound saves nothing
            release_freed_memory()

    def _to_cool(self, live: list, owner, over: int) -> list:
        """The sessions to ask, until `over` bytes are given up: first those of an address past its share
        (until it is back within it), then any; least recently used first (lock held)."""
        held: dict = {}
        for _, o, n in live:
            held[client_of(o)] = held.get(client_of(o), 0) + n
        asked, chosen = [], set()
        for past_share in (True, False):
            for k, o, n in live:  # least recently used first
                if over <= 0:
                    return asked
                client = client_of(o)
                if o is owner or n < self.cool_from_bytes or k in chosen:
                    continue
                if past_share and (client is None or held[client] <= self.client_limit_bytes):
                    continue
                asked.append((k, o))
                chosen.add(k)
                held[client] -= n
                over -= n
        return asked

    def _told(self, k: int, owner, nbytes: int) -> None:
        """What a cooled session holds now, keeping its place in the order."""
        with self._lock:
            entry = self._held.get(k)
            if entry is None or entry[0]() is not owner:
                return
            if nbytes > 0:
                self._held[k] = (entry[0], nbytes)
            else:
                del self._held[k]

    def forget(self, owner) -> None:
        with self._lock:
            entry = self._held.get(id(owner))
            if entry is not None and entry[0]() is owner:
                del self._held[id(owner)]


def map_large_blocks(threshold: int = MAP_FROM_BYTES) -> None:
    """Have glibc map every block of `threshold` bytes or more on its own, and give it back when freed.

    By default glibc raises that threshold to the largest block freed so far, and then serves blocks
    below it from its heaps, where what a cooled text frees stays as fragments that later blocks seldom
    fit: the bound on warm texts would then save little (bench/RESULTS.md, issue 28). The app's start
    calls this (not an import: it changes the whole process). A no-op where the C library is not glibc.
    """
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, threshold)
    except (OSError, AttributeError):
        pass


def release_freed_memory() -> None:
    """Hand memory freed by dropped models and cooled texts back to the system (glibc keeps it otherwise);
    no-op elsewhere. The session calls it when its own models go, the store after it cools texts."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# The server's own store (one process, one store).
WARM = WarmTexts()
