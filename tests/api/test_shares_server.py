"""Per-address shares seen from outside: an abusive address at the allowed rates, and a victim.

One server with its real rates behind a pretend proxy (each client its own address by
X-Forwarded-For), buckets that refill ~never (`DECODER_LAB_RATE_WINDOW_SCALE=1000`), a queue share
of 3 calls per address and an upload share of 1 MB. What is asserted is admissions (a join's answer:
a call is in gradio's queue once its join was answered 200) and order, which the test controls.
The raw calls go as the page sends them (`join`); tests/api/test_shares_queue.py uses these helpers.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from gradio_client import Client, handle_file

from tests.support.server import AppServer
from tests.support.shares_server import (
    ABUSER, GRAMMAR, LONG_TRAIN, Listener, P, PLACES, STEP, VICTIM, function, join, refused,
)

UPLOAD_MB = 1
PAGE = ["linear", False, "1280x720", 0, "all", "weights"]  # what the page sends on load (after the session)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shares")
    env = {"DECODER_LAB_RATE_SCALE": "1", "DECODER_LAB_RATE_WINDOW_SCALE": "1000", "DECODER_LAB_BEHIND_PROXY": "1",
           "DECODER_LAB_CLIENT_QUEUE": str(PLACES), "DECODER_LAB_TRAIN_SECONDS": "3600",
           "DECODER_LAB_CLIENT_UPLOAD_MB": str(UPLOAD_MB)}
    s = AppServer(env, tmp).start()
    s.tmp = tmp
    yield s
    s.stop()


def client(server, address: str) -> Client:
    return Client(server.url, verbose=False, download_files=False, headers={"X-Forwarded-For": address})


def completed(server, session_hash: str, address: str) -> dict:
    listener = Listener(server, session_hash, address)
    try:
        return listener.wait("process_completed")
    finally:
        listener.close()


def stop(server, session_hash: str, address: str) -> None:
    """Stop the session's training, as the page's Stop button does (a direct call, outside the queue)."""
    r = httpx.post(f"{server.url}gradio_api/run/predict", json={
        "fn_index": function(server, "stop"), "data": [None], "session_hash": session_hash},
        headers={"X-Forwarded-For": address}, timeout=120)
    assert r.status_code == 200, r.text[:300]


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
    from lab.server.rates import replay_cost
    from lab.session import Session
    from lab.sessionfile import model_work

    gen = {"do": "generate", "sampling": [1.0, 0, 1.0], "tokens": [5, 6, 7, 8, 9, 10, 11]}
    actions = [gen, {"do": "undo"}] * 512  # 1,024 actions: 4,096 Steps, and the model's work past the context
    heavy = session_file(server.tmp, actions)
    cost = replay_cost(actions, model_work(Session().entry_for(GRAMMAR), P))
    assert cost > 4096
    with pytest.raises(Exception, match=f"This would take {cost:,} Steps' worth of replay"):
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


@pytest.mark.slow
def test_one_training_per_address_waits_or_runs_and_the_victim_s_is_next(server):
    """The abuser's second training is refused when it joins; the victim's joins, and runs as soon as
    the abuser's one has ended: it was queued behind no more than the abuser's share."""
    train = function(server, "train")
    assert join(server, train, [None, *LONG_TRAIN], "t-abuser-0", ABUSER).status_code == 200
    abuser = Listener(server, "t-abuser-0", ABUSER)
    abuser.wait("process_generating")  # it is training
    refused(join(server, train, [None, *LONG_TRAIN], "t-abuser-1", ABUSER), 429,
            "Your address already has a training waiting or running")
    assert join(server, train, [None, *LONG_TRAIN], "t-victim", VICTIM).status_code == 200
    victim = Listener(server, "t-victim", VICTIM)
    stop(server, "t-abuser-0", ABUSER)
    abuser.wait("process_completed")
    victim.wait("process_generating")  # next in line: the victim's
    stop(server, "t-victim", VICTIM)
    done = victim.wait("process_completed")
    assert done["success"] and "Training stopped by you" in done["output"]["data"][1], str(done)[:300]
    abuser.close()
    victim.close()


@pytest.mark.slow
def test_link_replays_are_paid_when_the_page_load_joins_the_queue(server):
    """A flood of page loads of a `steps=256` link: each load's Steps are taken when it joins, so past
    the address's replay burst the next load is refused at the door (429), never queued; another
    address's load with a link is admitted and opens it."""
    from lab.limits import RATE_LIMITS

    load, flooder = function(server, event="load"), "203.0.113.77"
    cheap = "?prompt=zzz+qqq&steps=256"  # words the model does not know: the replay stops at once, paid in full
    loads = RATE_LIMITS["replay"][0] // 256
    for i in range(loads):
        r = join(server, load, [None, *PAGE], f"flood-{i}", flooder, cheap)
        assert r.status_code == 200, r.text[:300]
        done = completed(server, f"flood-{i}", flooder)
        assert done["success"] and "The link's text stopped" in json.dumps(done["output"]["data"]), str(done)[:300]
    refused(join(server, load, [None, *PAGE], "flood-extra", flooder, cheap), 429,
            "Slow down: too many Steps were replayed")
    query = "?prompt=anna+found+the+key+.&steps=3&seed=4"
    assert join(server, load, [None, *PAGE], "link-victim", VICTIM, query).status_code == 200
    done = completed(server, "link-victim", VICTIM)
    assert done["success"], str(done)[:300]
    tokens = json.dumps(done["output"]["data"][5])  # the text: the prompt's tokens, then the three generated
    assert tokens.count('"generated"') == 3, tokens


def upload(server, address: str, nbytes: int) -> httpx.Response:
    return httpx.post(f"{server.url}gradio_api/upload", files={"files": ("text.txt", b"a" * nbytes, "text/plain")},
                      headers={"X-Forwarded-For": address}, timeout=120)


@pytest.mark.slow
def test_bytes_sent_to_gradio_s_upload_route_come_out_of_the_address_s_share(server):
    """Uploads land in gradio's cache, outside the disk budget: an address may send `UPLOAD_MB` (here)
    per hour, and is told so past it; another address still uploads."""
    uploader = "203.0.113.88"
    size = 300 * 1024
    for _ in range(UPLOAD_MB * 2**20 // (size + 1024)):  # each with room for its form's own bytes
        r = upload(server, uploader, size)
        assert r.status_code == 200 and len(r.json()) == 1, r.text[:300]
    refused(upload(server, uploader, size), 429, "Slow down: too many megabytes were uploaded")
    assert upload(server, VICTIM, size).status_code == 200
    chunked = httpx.post(f"{server.url}gradio_api/upload", content=iter([b"a" * 10]),
                         headers={"X-Forwarded-For": VICTIM, "content-type": "multipart/form-data; boundary=x"})
    refused(chunked, 411, "Send the file with its length")
