"""Request rates: how often one client (an address) may act, and who that client is.

- `RateLimiter`: token buckets per (client, action). `check(client, action)` takes a token or
  raises `UserError("Slow down: …")` saying when to try again.
- `client_key` turns a request's address (and, behind a proxy, its X-Forwarded-For) into the client;
  `client_of(session)` is the client a session counts against (`SessionStore` sets it).
- `charge(session, action)` takes from the server's own limiter, `LIMITER`; `replay_cost` is what
  replaying a text costs (a session file's, a link's), counted before the replay starts: its Steps,
  and with its model (`ModelWork`) the model's work, so a replay's time is bounded on any model.

The other shared guards are lab/server/sessionstore.py (the sessions) and lab/server/budget.py (memory and disk).
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

from ..checks import UserError
from ..limits import BEHIND_PROXY, RATE_LIMITS, RATE_MAX_KEYS

__all__ = ["Rate", "RateLimiter", "client_key", "client_of", "wait_words", "charge", "replay_cost", "ModelWork",
           "TOKEN_WORK", "LIMITER"]

Clock = Callable[[], float]


def monotonic() -> float:
    """The rate limiter's clock when none is given (time.monotonic). In-process tests replace this
    function (`monkeypatch.setattr(lab.server.rates, "monotonic", fake)`) to drive `LIMITER` themselves."""
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
_UNITS = {"replay": "Steps' worth of replay (a Step, an Undo or a generated token each, more on a larger model, "
                    "for an Undo and past the context)", "upload_bytes": "MB of uploads"}
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


# The model's work that costs a replay as much as a Step's own work (its distributions, its attention rows,
# its bookkeeping): 2**26 parameter-tokens, a token through 67 M parameters (measured on 2 vCPUs: ~7 ms a
# Step's own work, ~0.1 ms a token through a million parameters). A Step of a built-in model costs about 1.
TOKEN_WORK = 2**26


@dataclass(frozen=True)
class ModelWork:
    """What a replay's model costs: its parameters, its context (block size) and the prompt's tokens."""

    params: int
    block_size: int
    prompt_tokens: int

    def tokens(self, actions: list) -> int:
        """Tokens the model runs for `actions` replayed one after the other (as lab.session and the
        engine's Decoder do): the prompt's window before the first Step, then one token a Step while the
        window has room, the whole window when it slides past the context, the whole window for an Undo,
        and for a Generate once more at its end (its attention, computed for the last token only)."""
        length, window, started, ran = self.prompt_tokens, max(1, self.block_size), False, 0
        for a in actions:
            do = a.get("do") if isinstance(a, dict) else None
            if do == "undo":
                if started and length > self.prompt_tokens:
                    length -= 1
                    ran += min(length, window)
                continue
            tokens = a.get("tokens") if do == "generate" else None
            for _ in range(len(tokens) if isinstance(tokens, list) and tokens else 1):
                if not started:
                    started, ran = True, ran + min(length, window)
                length += 1
                ran += window if length > window else 1
            if do == "generate":
                ran += min(length, window)
        return ran


def replay_cost(actions, model: ModelWork | None = None) -> int:
    """What replaying a text's actions costs, in Steps: one per Step and Undo, one per token a Generate
    makes, and with its `model` the model's work besides, its parameters times the tokens it runs
    (`ModelWork.tokens`) over `TOKEN_WORK`: a larger model, an Undo (the window again) and a text past
    the context cost more. (What is not a list of actions costs nothing: the file is refused for it later.)"""
    if not isinstance(actions, list):
        return 0
    cost = 0
    for a in actions:
        tokens = a.get("tokens") if isinstance(a, dict) and a.get("do") == "generate" else None
        cost += len(tokens) if isinstance(tokens, list) and tokens else 1
    if model is not None:
        cost += math.ceil(model.params * model.tokens(actions) / TOKEN_WORK)
    return cost


def charge(owner, action: str, cost: int = 1) -> None:
    """Take `cost` of `action` from the share of the client `owner` (a session) counts against."""
    LIMITER.check(client_of(owner), action, cost)


# The server's own limiter (one process, one limiter).
LIMITER = RateLimiter()
