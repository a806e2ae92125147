"""The server's budgets seen from outside: one visitor's burst never costs another person anything.

A server is started with its real limits (`DECODER_LAB_RATE_SCALE=1`) behind a pretend proxy, so
clients can come from different addresses (X-Forwarded-For), and with a small session store so a
flood fills it in seconds. Its buckets refill a thousand times slower than the real ones
(`DECODER_LAB_RATE_WINDOW_SCALE=1000`: one Generate token per 2,000 s), so a bucket holds exactly
what the test took from it, however slowly the machine answers.
"""

from __future__ import annotations

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from lab.limits import RATE_LIMITS
from tests.support.server import AppServer

GRAMMAR = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
STEP = (GRAMMAR, P, 0.0, 0, 1.0, 0, 0, "all", "weights")
STORE = 12


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    env = {"DECODER_LAB_RATE_SCALE": "1", "DECODER_LAB_RATE_WINDOW_SCALE": "1000", "DECODER_LAB_BEHIND_PROXY": "1",
           "DECODER_LAB_MAX_SESSIONS": str(STORE)}
    server = AppServer(env, tmp_path_factory.mktemp("guarded")).start()
    yield server
    server.stop()


def client(server, address: str) -> Client:
    return Client(server.url, verbose=False, headers={"X-Forwarded-For": address})


def refusal(exc: AppError | httpx.HTTPStatusError) -> str:
    """The sentence of a refusal: the handler's (an error of the call) or the door's (a 429 when the
    call joined the queue, ui/door.py)."""
    return exc.response.json()["error"] if isinstance(exc, httpx.HTTPStatusError) else str(exc)


@pytest.mark.slow
def test_a_client_that_generates_too_fast_is_told_to_slow_down_and_others_are_not(guarded):
    burst = RATE_LIMITS["generate"][0]
    fast, other = client(guarded, "203.0.113.5"), client(guarded, "198.51.100.7")
    refused = []
    for i in range(burst + 3):
        try:
            fast.predict(GRAMMAR, P, 1.0, 0, 1.0, i, 1, 0, "all", "weights", api_name="/generate")
        except (AppError, httpx.HTTPStatusError) as exc:
            refused.append(refusal(exc))
    assert len(refused) == 3 and all(m.startswith("Slow down") for m in refused), refused[:2]  # the burst went through
    assert other.predict(GRAMMAR, P, 1.0, 0, 1.0, 0, 1, 0, "all", "weights", api_name="/generate")[0]


@pytest.mark.slow
def test_a_flood_of_new_sessions_leaves_an_active_session_intact(guarded):
    me = client(guarded, "192.0.2.10")
    first = me.predict(*STEP, api_name="/step")[0]
    full = 0
    for i in range(2 * STORE):  # throw-away sessions from many addresses, each acting once
        try:
            client(guarded, f"198.18.{i // 200}.{i % 200 + 1}").predict(*STEP, api_name="/step")
        except AppError as exc:
            assert "server is full" in str(exc), str(exc)
            full += 1
    assert full >= STORE  # the store stayed bounded: the later ones were refused, nobody evicted
    again = me.predict(*STEP, api_name="/step")[0]
    assert len(again) == len(first) + 1 and again[: len(first)] == first  # my text went on
