"""Request rates: how often one client (an address) may act, and who that client is.

- `RateLimiter`: token buckets per (client, action). `check(client, action)` takes a token or
  raises `UserError("Slow down: …")` saying when to try again.
- `client_key` turns a request's address (and, behind a proxy, its X-Forwarded-For) into the client;
  `client_of(session)` is the client a session counts against (`SessionStore` sets it).
- `charge(session, action)` takes from the server's own limiter, `LIMITER`; `replay_cost` is what
  replaying a session file costs.

The other shared guards are lab/sessionstore.py (the sessions) and lab/budget.py (memory and disk).
Nothing here imports gradio or the session module.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from .checks import UserError
from .limits import BEHIND_PROXY, RATE_LIMITS, RATE_MAX_KEYS

__all__ = ["Rate", "RateLimiter", "client_key", "client_of", "wait_words", "charge", "replay_cost", "LIMITER"]

Clock = Callable[[], float]


def monotonic() -> float:
    """The rate limiter's clock when none is given (time.monotonic). In-process tests replace this
    function (`monkeypatch.setattr(lab.rates, "monotonic", fake)`) to drive `LIMITER` themselves."""
    return time.monotonic()


def _module_clock() -> float:
    return monotonic()  # looked up at each call, so a replaced `monotonic` takes effect at once


def client_of(owner) -> str | None:
    """The client a session counts against (None: no client's share)."""
    return getattr(owner, "client", None)


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
    "patch": "too many patching sweeps were run from your address",
    "train": "too many trainings were started from your address",
    "upload": "too many models were uploaded from your address",
    "import": "too many session files were opened from your address",
    "export": "too many files were made from your address",
    "replay": "too many Steps were replayed (session files and links) from your address",
    "upload_bytes": "too many megabytes were uploaded from your address",
}
_UNITS = {"replay": "Steps to replay (a Step, an Undo or a generated token each)", "upload_bytes": "MB of uploads"}
_UNIT_SIZE = {"upload_bytes": 2**20}  # a bucket of bytes speaks of MB


def wait_words(seconds: float) -> str:
    """A wait in words, rounded up: "1 second", "40 seconds", "3 minutes"."""
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
                            f"in a short time. Try again in {wait_words(refused)}.")


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
    LIMITER.check(client_of(owner), action, cost)


# The server's own limiter (one process, one limiter).
LIMITER = RateLimiter()
