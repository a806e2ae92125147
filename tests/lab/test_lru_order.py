"""What the shared guards forget or close first: the least recently used, never the newest.

- lab/server/rates.py's limiter remembers at most `max_keys` buckets: when full it forgets the client that
  called longest ago, so the newest client (the one calling now) is still limited. Forgetting the newest
  instead would leave every new address unlimited once the limiter is full: a flood of addresses would
  pass unchecked.
- lab/server/sessionstore.py, when full (the server's bound, or one address's share), closes the idle session
  that acted longest ago (its `touched`), whatever order the sessions were created or looked up in.

The clock is the test's (tests.support.budget_fakes); the sessions are its fakes.
"""

from __future__ import annotations

import pytest

from lab.checks import UserError
from lab.server.rates import RateLimiter
from lab.server.sessionstore import SessionStore
from tests.support.budget_fakes import Clock, Fake


def refused(rl: RateLimiter, client: str) -> bool:
    try:
        rl.check(client, "x")
    except UserError:
        return True
    return False


def test_a_full_limiter_forgets_the_client_that_called_longest_ago():
    rl = RateLimiter({"x": (1, 1, 3600.0)}, max_keys=3, clock=Clock())  # one call an hour: a second is refused
    for client in ("a", "b", "c"):
        assert not refused(rl, client)
    assert not refused(rl, "d")  # a fourth client: "a" (the least recently used) is forgotten
    assert len(rl) == 3
    assert refused(rl, "d")  # the newest client is remembered…
    assert refused(rl, "c") and refused(rl, "b")  # …and so are the two before it
    assert not refused(rl, "a")  # only "a" starts full again; that forgets "d", now the least recent
    assert not refused(rl, "d")


def test_at_a_full_limiter_every_new_address_is_still_limited():
    """A flood of new addresses past `max_keys`: each one's second call is refused, as for the first hundred."""
    rl = RateLimiter({"x": (1, 1, 3600.0)}, max_keys=100, clock=Clock())
    for i in range(1000):
        client = f"10.1.{i // 256}.{i % 256}"
        assert not refused(rl, client)
        assert refused(rl, client), f"address {i} was forgotten as soon as it called"
    assert len(rl) == 100


def store_of(clock: Clock, **kw) -> SessionStore:
    return SessionStore(lambda: Fake(clock, "fresh"), clock=clock, limiter=None, idle_s=60, **kw)


def test_a_full_store_closes_the_idle_session_that_acted_longest_ago_whatever_the_lookup_order():
    clock = Clock()
    store = store_of(clock, max_sessions=3)
    made = {}
    for name in ("a", "b", "c"):
        made[name] = store.resolve(name, None, Fake(clock, name))
        clock.advance(10)
    made["b"].act()  # acted after c: now a is the oldest, then c, then b
    clock.advance(10)
    assert store.resolve("a", None) is made["a"]  # looked up last, but it did not act: still the oldest
    clock.advance(600)  # all three idle
    store.resolve("d", None, Fake(clock, "d"))
    assert made["a"].closed and not made["b"].closed and not made["c"].closed
    store.resolve("e", None, Fake(clock, "e"))
    assert made["c"].closed and not made["b"].closed
    assert set(store._sessions) == {"b", "d", "e"}


def test_past_its_share_an_address_closes_its_own_idle_session_that_acted_longest_ago():
    clock = Clock()
    store = store_of(clock, max_sessions=100, client_sessions=3)
    other = store.resolve("o", "5.6.7.8", Fake(clock, "o"))  # another address's session, idle longest of all
    mine = []
    for i in range(3):
        clock.advance(5)
        mine.append(store.resolve(f"s{i}", "1.2.3.4", Fake(clock, f"s{i}")))
    clock.advance(5)
    mine[0].act()  # s0 acted last: s1 is now the address's oldest, then s2
    clock.advance(600)
    store.resolve("s3", "1.2.3.4", Fake(clock, "s3"))
    assert mine[1].closed and not mine[0].closed and not mine[2].closed and not other.closed
    store.resolve("s4", "1.2.3.4", Fake(clock, "s4"))
    assert mine[2].closed and not mine[0].closed


@pytest.mark.parametrize("max_sessions", [1, 2])
def test_a_store_full_of_sessions_in_use_closes_none_and_refuses(max_sessions):
    clock = Clock()
    store = store_of(clock, max_sessions=max_sessions)
    held = [store.resolve(f"s{i}", None, Fake(clock, f"s{i}")) for i in range(max_sessions)]
    clock.advance(600)
    for s in held:
        s.is_busy = True
    with pytest.raises(UserError, match="server is full"):
        store.resolve("new", None, Fake(clock, "new"))
    assert not any(s.closed for s in held)
