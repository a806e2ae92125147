"""Per-address shares seen from outside: an abusive address at the allowed rates, and a victim.

One server with its real rates behind a pretend proxy (each client its own address by
X-Forwarded-For), buckets that refill ~never (`DECODER_LAB_RATE_WINDOW_SCALE=1000`) and a queue share
of 3 calls per address. What is asserted is admissions and order, which the test controls: the
abuser's calls are held by trainings that run until the test stops them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from gradio_client import Client, handle_file

from lab.server import AppServer

GRAMMAR = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
STEP = (GRAMMAR, P, 0.0, 0, 1.0, 0, 0, "all", "weights")
# a training that runs far longer than the test needs (the test stops it): 2,000 steps of the largest model
LONG_TRAIN = ("grammar", "", None, "word", 4, 4, 128, 512, "learned", "pre", "gelu", 0.0, 2000, 0.003, 0)
ABUSER, VICTIM = "203.0.113.66", "198.51.100.7"
PLACES = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shares")
    env = {"DECODER_LAB_RATE_SCALE": "1", "DECODER_LAB_RATE_WINDOW_SCALE": "1000", "DECODER_LAB_BEHIND_PROXY": "1",
           "DECODER_LAB_CLIENT_QUEUE": str(PLACES), "DECODER_LAB_TRAIN_SECONDS": "3600"}
    s = AppServer(env, tmp).start()
    s.tmp = tmp
    yield s
    s.stop()


def client(server, address: str) -> Client:
    return Client(server.url, verbose=False, download_files=False, headers={"X-Forwarded-For": address})


def refusal(exc: BaseException) -> tuple[int, str] | None:
    """The door's answer (status, the start of its sentence) behind a gradio_client exception."""
    while exc is not None:
        response = getattr(exc, "response", None)
        if response is not None:
            return response.status_code, response.json()["error"][:43]
        exc = exc.__context__
    return None


def wait_for(condition, timeout: float = 180.0) -> None:
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout, "waited too long"
        time.sleep(0.2)


@pytest.mark.slow
def test_an_address_holds_its_share_of_queue_places_and_the_victim_is_not_queued_behind_it(server):
    abuser = [client(server, ABUSER) for _ in range(PLACES)]
    trains = [c.submit(*LONG_TRAIN, api_name="/train") for c in abuser]  # one trains, the others wait for it
    try:
        wait_for(lambda: len(trains[0].outputs()) > 0)  # the first is training
        extra = client(server, ABUSER)
        with pytest.raises(Exception) as refused:
            extra.predict(*STEP, api_name="/step")
        assert refusal(refused.value) == (429, f"Your address has {PLACES} calls waiting or running")
        victim = client(server, VICTIM)
        tokens = victim.predict(*STEP, api_name="/step")[0]
        assert tokens and tokens[-1]["class_or_confidence"] == "generated"
        # order: the victim was answered while every one of the abuser's calls was still held
        assert not any(t.done() for t in trains)
    finally:
        for t in trains[1:]:
            t.cancel()
        abuser[0].predict(api_name="/stop")
        wait_for(trains[0].done)


def session_file(tmp: Path, actions: list) -> Path:
    from lab.session import Session
    from lab.sessionfile import FORMAT, VERSION, builtin_checksum

    doc = {"format": FORMAT, "version": VERSION, "model": {"builtin": GRAMMAR,
                                                           "sha256": builtin_checksum(Session(), GRAMMAR)},
           "prompt": P, "seed": 0, "actions": actions, "view": {"layer": 0, "head": 0, "view": "weights"}}
    path = tmp / f"session-{len(actions)}.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.slow
def test_a_replay_over_the_bound_is_refused_before_it_runs_and_the_victim_still_opens_one(server):
    gen = {"do": "generate", "sampling": [1.0, 0, 1.0], "tokens": [5, 6, 7, 8, 9, 10, 11]}
    heavy = session_file(server.tmp, [gen, {"do": "undo"}] * 512)  # 1,024 actions that replay 4,096 Steps
    with pytest.raises(Exception, match="This would take 4,096 Steps to replay"):
        client(server, ABUSER).predict(handle_file(str(heavy)), api_name="/import_session")
    small = session_file(server.tmp, [{"do": "step", "sampling": [1.0, 0, 1.0], "tokens": [5]}])
    out = client(server, VICTIM).predict(handle_file(str(small)), api_name="/import_session")
    assert "1 generated token replayed and checked" in json.dumps(out)


@pytest.mark.slow
def test_exported_files_are_not_copied_into_gradio_s_cache(server):
    c = client(server, "192.0.2.44")
    c.predict(*STEP, api_name="/step")
    cache = server.tmp / "gradio"
    before = {p for p in cache.rglob("*") if p.is_file() and "decoder-lab-runs" not in p.parts}
    pages = [c.predict(0, "all", "weights", api_name="/export_page") for _ in range(3)]
    after = {p for p in cache.rglob("*") if p.is_file() and "decoder-lab-runs" not in p.parts}
    assert after == before  # nothing new outside the disk budget's folder…
    for page in pages:  # …where each page is, counted by the disk budget
        path = Path(page["path"] if isinstance(page, dict) else page)
        assert "decoder-lab-runs" in path.parts and path.is_relative_to(cache.resolve())
