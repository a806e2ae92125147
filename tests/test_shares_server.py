"""Per-address shares seen from outside: an abusive address at the allowed rates, and a victim.

One server with its real rates behind a pretend proxy (each client its own address by
X-Forwarded-For), buckets that refill ~never (`DECODER_LAB_RATE_WINDOW_SCALE=1000`) and a queue share
of 3 calls per address. What is asserted is admissions, which the test controls.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gradio_client import Client, handle_file

from lab.server import AppServer

GRAMMAR = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
STEP = (GRAMMAR, P, 0.0, 0, 1.0, 0, 0, "all", "weights")
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
