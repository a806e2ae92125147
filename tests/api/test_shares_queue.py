"""An address's share of queue places, seen from outside: its calls beyond the share are refused when
they join, and a victim's Step is admitted and answered while the abuser's calls are all held.

Its own server (tests/api/test_shares_server.py's settings, with three trainings allowed per address):
the abuser's places are held by trainings, one running and two waiting behind it, that last until
the server stops. A call holds a place once its join was answered 200 (gradio has queued it), so
what is asserted is admissions and order, which the test controls, never times.
"""

from __future__ import annotations

import pytest
from gradio_client import Client

from tests.support.server import AppServer
from tests.support.shares_server import ABUSER, LONG_TRAIN, PLACES, STEP, VICTIM, Listener, function, join, refused


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {"DECODER_LAB_RATE_SCALE": "1", "DECODER_LAB_RATE_WINDOW_SCALE": "1000", "DECODER_LAB_BEHIND_PROXY": "1",
           "DECODER_LAB_CLIENT_QUEUE": str(PLACES), "DECODER_LAB_CLIENT_TRAININGS": str(PLACES),
           "DECODER_LAB_TRAIN_SECONDS": "3600"}
    s = AppServer(env, tmp_path_factory.mktemp("queue")).start()
    yield s
    s.stop()  # ends the trainings that hold the places


@pytest.mark.slow
def test_an_address_holds_its_share_of_queue_places_and_the_victim_is_not_queued_behind_it(server):
    train, step = function(server, "train"), function(server, "step")
    held = []  # each session's stream stays open: its calls stay in the queue (a closed page's go)
    for i in range(PLACES):  # one trains, the others wait for it: every one holds a place
        assert join(server, train, [None, *LONG_TRAIN], f"abuser-{i}", ABUSER).status_code == 200
        held.append(Listener(server, f"abuser-{i}", ABUSER))
    held[0].wait("process_generating")
    extra = [None, *STEP]
    refused(join(server, step, extra, "abuser-extra", ABUSER), 429, f"Your address has {PLACES} calls waiting or running")
    victim = Client(server.url, verbose=False, download_files=False, headers={"X-Forwarded-For": VICTIM})
    tokens = victim.predict(*STEP, api_name="/step")[0]
    assert tokens and tokens[-1]["class_or_confidence"] == "generated"
    # order: the victim was answered while all of the abuser's calls were still held (its places still are)
    refused(join(server, step, extra, "abuser-extra", ABUSER), 429, f"Your address has {PLACES} calls waiting or running")
    assert not any(h.ended or any(m.get("msg") == "process_completed" for m in h.messages) for h in held)
