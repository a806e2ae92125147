"""lab/server/rates.py's burst cap: however long an address was quiet, it may send at most `burst` calls at once.

A token bucket refills at `count` per `window_s` and holds at most `burst`: without the cap a quiet hour
(or day) would be saved up and spent in one burst, and the bound each rate promises (README's Limits)
would only hold for a client that never paused. The clock is the test's (tests.support.budget_fakes.Clock);
nothing waits.
"""

from __future__ import annotations

import pytest

from lab import limits
from lab.checks import UserError
from lab.server.rates import Rate, RateLimiter
from tests.support.budget_fakes import Clock

DAY = 86_400.0


def calls_at_once(rl: RateLimiter, client: str, action: str, cost: int = 1, most: int = 10_000) -> int:
    """How many calls of `cost` pass one after the other without the clock moving."""
    for n in range(most):
        try:
            rl.check(client, action, cost)
        except UserError as exc:
            assert str(exc).startswith("Slow down: ")
            return n
    return most


def test_a_small_bucket_idle_for_a_day_still_gives_only_its_burst():
    clock = Clock()
    rl = RateLimiter({"act": (3, 1, 60.0)}, clock=clock)
    assert calls_at_once(rl, "1.2.3.4", "act") == 3  # a new client: a full bucket
    clock.advance(DAY)  # a day of refill at one a minute would be 1,440 calls
    assert calls_at_once(rl, "1.2.3.4", "act") == 3
    clock.advance(60.0)  # then one per window, as ever
    assert calls_at_once(rl, "1.2.3.4", "act") == 1


def test_a_bucket_used_partly_then_idle_refills_to_its_burst_and_no_further():
    clock = Clock()
    rl = RateLimiter({"act": (5, 10, 60.0)}, clock=clock)
    rl.check("1.2.3.4", "act")
    rl.check("1.2.3.4", "act")
    for idle in (60.0, 3600.0, DAY):  # a window refills 10, more than the 3 missing
        clock.advance(idle)
        assert calls_at_once(rl, "1.2.3.4", "act") == 5
    clock.advance(DAY)
    rl.check("1.2.3.4", "act", 4)  # a cost of 4 out of the 5, then one more, then none
    rl.check("1.2.3.4", "act")
    with pytest.raises(UserError, match="^Slow down: "):
        rl.check("1.2.3.4", "act")


@pytest.mark.parametrize("action", sorted(limits.RATE_LIMITS))
def test_every_server_rate_caps_its_burst_after_a_long_quiet_spell(action):
    """The server's own rates: after an hour and after a day of nothing, `burst` and not one call more."""
    rate = Rate(*limits.RATE_LIMITS[action])
    cost = max(1, rate.burst // 8)  # eight calls of an eighth fill it (bytes of uploads in large pieces)
    clock = Clock()
    rl = RateLimiter(clock=clock)
    full = calls_at_once(rl, "5.6.7.8", action, cost)
    assert full == rate.burst // cost
    for idle in (3600.0, DAY, 30 * DAY):
        clock.advance(idle)
        assert calls_at_once(rl, "5.6.7.8", action, cost) == full


def test_a_quiet_address_s_burst_cap_is_its_own():
    """Another address's quiet day gives nothing to this one, and this one's burst nothing to it."""
    clock = Clock()
    rl = RateLimiter({"act": (2, 1, 60.0)}, clock=clock)
    assert calls_at_once(rl, "1.1.1.1", "act") == 2
    clock.advance(DAY)
    assert calls_at_once(rl, "2.2.2.2", "act") == 2
    assert calls_at_once(rl, "1.1.1.1", "act") == 2
