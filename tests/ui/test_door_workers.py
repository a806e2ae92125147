"""One address keeps at most one worker busy (ui/door.py's door), rests after back-to-back calls while others
are active, and the queue's lanes (ui/lanes.py) keep a visitor's call from waiting behind another address's,
in process.

The app's own page (app.build_demo, its lanes assigned), gradio's own queue and events, and the door the
middleware puts in front of gradio's queue. A call "in the queue" is a gradio Event the test puts there
(as gradio does when the door lets a join through) and takes away again (the call has ended: released).
What is asserted is which calls are admitted and which the scheduler starts, with calls held until the
test releases them, never how long anything takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from fastapi import Request
from gradio.queueing import Event

from lab.limits import CONCURRENCY
from tests.support.budget_fakes import Clock
from ui.lanes import LANES, assign, handler_name
from ui.door import CHARGED, Door
from tests.support.loops import run_alone

A, B, V = "203.0.113.31", "203.0.113.32", "198.51.100.31"
GUARD_S = 60.0  # only ends a hang if the door were wrong


@pytest.fixture(scope="module")

def demo():
    import app

    d = app.build_demo()
    d.queue()
    return d


def fn_of(demo, name: str):
    return next(f for f in demo.fns.values() if f.queue and handler_name(f) == name)


def scope_of(address: str, charged: str = "") -> dict:
    headers = [(CHARGED, charged.encode())] if charged else []
    return {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "client": (address, 50000),
            "headers": headers, "query_string": b""}


def body(demo, fn, session_hash: str) -> bytes:
    index = next(i for i, f in demo.fns.items() if f is fn)
    return json.dumps({"fn_index": index, "data": [], "session_hash": session_hash}).encode()


@contextlib.contextmanager
def in_queue(demo, address: str, fn, session_hash: str, charged: str = ""):
    """A call of `address` in gradio's queue until the block ends (then it has ended)."""
    event = Event(session_hash, fn, Request(scope_of(address, charged)), None)
    demo._queue.event_ids_to_events[event._id] = event
    try:
        yield event
    finally:
        demo._queue.event_ids_to_events.pop(event._id, None)


async def admitted(door, demo, address: str, fn, session_hash: str):
    """What the door answers a join of `fn` from `address`: None (let through) or (status, sentence)."""
    async with door.admit(scope_of(address), None, body(demo, fn, session_hash)) as refused:
        return refused


def test_every_queued_event_is_in_a_lane_and_step_s_lane_has_no_heavy_handler(demo):
    assert assign(demo) == []
    lanes = {f.concurrency_id for f in demo.fns.values() if f.queue and f.fn is not None}
    assert lanes <= set(LANES) and all(lane in CONCURRENCY for lane in LANES)
    step = fn_of(demo, "step")
    assert step.concurrency_id == "explore" and step.concurrency_limit == CONCURRENCY["explore"] >= 2
    for heavy in ("draw_matrices", "open_panel", "selected_token", "pick_cell", "inside", "compare", "regenerate",
                  "upload_model", "make_link", "page_load", "open_session", "generate", "train_model", "patch"):
        assert fn_of(demo, heavy).concurrency_id != "explore", heavy
    assert CONCURRENCY["replay"] >= 2  # session files of different addresses open side by side


def test_an_address_s_next_call_waits_at_the_door_while_another_address_s_goes_on(demo):
    step, matrices = fn_of(demo, "step"), fn_of(demo, "draw_matrices")

    async def scenario():
        door = Door(demo, workers=1, wait_s=GUARD_S, poll_s=0.002)
        through = asyncio.Event()

        async def second():  # the address's next call, of another lane (a worker is a worker)
            async with door.admit(scope_of(A), None, body(demo, matrices, "a-2")) as refused:
                assert refused is None
                through.set()  # here gradio would take it into its queue

        with in_queue(demo, A, step, "a-1"):  # the address's first call, running
            task = asyncio.create_task(second())
            assert await asyncio.wait_for(admitted(door, demo, V, step, "v-1"), GUARD_S) is None
            for _ in range(50):  # the door looks again and again: the address's call is still there
                await asyncio.sleep(0.002)
            assert not through.is_set() and door.held(A) == 2
        await asyncio.wait_for(task, GUARD_S)  # released: the next call goes through
        assert through.is_set() and not door.admitted

    run_alone(scenario())


def test_a_call_that_waited_its_time_is_refused_in_a_sentence_and_holds_nothing(demo):
    step = fn_of(demo, "step")

    async def scenario():
        door = Door(demo, workers=1, wait_s=0.05, poll_s=0.002)
        with in_queue(demo, A, step, "a-3"):  # never released while the next one waits
            status, sentence = await asyncio.wait_for(admitted(door, demo, A, step, "a-4"), GUARD_S)
        assert status == 429 and sentence.startswith("Your address's earlier calls are still running; one address may "
                                                     "have 1 in the queue at once")
        assert not door.admitted

    run_alone(scenario())


def test_a_training_has_a_worker_of_its_own(demo):
    train, step = fn_of(demo, "train_model"), fn_of(demo, "step")

    async def scenario():
        door = Door(demo, workers=1, wait_s=GUARD_S, poll_s=0.002)
        with in_queue(demo, A, train, "a-train", charged="train"):
            assert door.working(A) == 0
            assert await asyncio.wait_for(admitted(door, demo, A, step, "a-5"), GUARD_S) is None

    run_alone(scenario())


def test_a_second_address_s_import_is_not_behind_the_first_address_s(demo):
    """The first address's import is running, held until the test releases it; the second address's is let
    through by the door and started by gradio's own scheduler while the first still runs."""
    importer = fn_of(demo, "open_session")
    queue = demo._queue
    queue.create_event_queue_for_fn(importer)
    lane = queue.event_queue_per_concurrency_id[importer.concurrency_id]

    async def scenario():
        door = Door(demo, workers=1, wait_s=GUARD_S, poll_s=0.002)
        with in_queue(demo, A, importer, "a-import", charged="import") as first:
            lane.queue.append(first)
            assert queue.get_events()[0] == [first]
            lane.current_concurrency += 1  # gradio started it: it runs until released
            try:
                assert await asyncio.wait_for(admitted(door, demo, B, importer, "b-import"), GUARD_S) is None
                with in_queue(demo, B, importer, "b-import", charged="import") as second:
                    lane.queue.append(second)
                    assert queue.get_events()[0] == [second]  # started beside the first, not behind it
                refused = await asyncio.wait_for(admitted(door, demo, A, importer, "a-import-2"), GUARD_S)
                assert refused[0] == 429 and "already has a session file or link being opened" in refused[1]
            finally:
                lane.current_concurrency -= 1

    run_alone(scenario())


def test_an_address_calling_back_to_back_rests_as_long_as_its_call_ran_a_person_never(demo):
    """The door's own clock is the test's: the address's first call runs 0.4 s while its next one waits, and
    another address is active meanwhile. The next one then rests 0.4 s; a call sent after the address's
    calls have ended (as a person clicks) goes on at once."""
    step, matrices = fn_of(demo, "step"), fn_of(demo, "draw_matrices")
    clock = Clock()

    async def scenario():
        door = Door(demo, workers=1, wait_s=GUARD_S, poll_s=0.002, clock=clock)
        through = asyncio.Event()

        async def second():
            async with door.admit(scope_of(A), None, body(demo, matrices, "a-7")) as refused:
                assert refused is None
                through.set()

        assert await admitted(door, demo, A, step, "a-6") is None  # its first call joins…
        with in_queue(demo, A, step, "a-6"):  # …and runs
            task = asyncio.create_task(second())
            assert await admitted(door, demo, V, step, "v-6") is None  # another address is active
            for _ in range(20):
                await asyncio.sleep(0.002)
            clock.advance(0.4)
        for _ in range(50):  # it ended, seen by the call that waited: that one rests 0.4 s from now
            await asyncio.sleep(0.002)
        assert not through.is_set()
        clock.advance(0.39)
        for _ in range(20):
            await asyncio.sleep(0.002)
        assert not through.is_set()
        clock.advance(0.02)
        await asyncio.wait_for(task, GUARD_S)
        with in_queue(demo, A, matrices, "a-7"):  # (the call that joined, running till the test ends it)
            clock.advance(5.0)
        assert await admitted(door, demo, A, step, "a-8") is None  # after its calls ended: no rest

    run_alone(scenario())


def test_a_call_waiting_for_its_session_s_turn_keeps_the_session_s_event_stream_open(demo):
    """gradio closes a session's event stream once an answer leaves none of its events pending (its stream
    route's own rule, on `pending_event_ids_session`), and the page reads a call's answer only from a stream
    it opened after the call's reply or before it. A call that waits here for its session's turn joins just
    as the call before it ends: were the stream closed then, its answer could be sent where nobody reads.
    While the call is at the door the session has a pending mark besides its events; it goes once the call
    has joined (its own event is then pending) or has been refused."""
    step, redraw = fn_of(demo, "step"), fn_of(demo, "redraw_view")
    pending = demo._queue.pending_event_ids_session

    async def scenario():
        door = Door(demo, wait_s=GUARD_S, poll_s=0.002)
        joined = asyncio.Event()

        async def second():  # the session's next call: it waits for the running Step
            async with door.admit(scope_of(A), None, body(demo, redraw, "s-1")) as refused:
                assert refused is None
                pending["s-1"].add("event-of-the-redraw")  # gradio's push, as the door lets it through
                joined.set()

        with in_queue(demo, A, step, "s-1") as running:
            pending.setdefault("s-1", set()).add(running._id)  # as gradio's push records it
            task = asyncio.create_task(second())
            while not door.admitted:  # the next call is at the door
                await asyncio.sleep(0.002)
            assert door.waiting == {"s-1": 1}  # as the server's report says it (ui/diagnose.py)
            pending["s-1"].discard(running._id)  # the Step's answer, as the stream sends it: does it close?
            assert pending["s-1"], "the stream would close with the next call still on its way"
            assert not joined.is_set()
        await asyncio.wait_for(task, GUARD_S)
        assert pending["s-1"] == {"event-of-the-redraw"}  # only its own event keeps the stream open now
        assert not door.waiting
        del pending["s-1"]

        door = Door(demo, wait_s=0.02, poll_s=0.002)  # refused after waiting: nothing of it is left
        with in_queue(demo, A, step, "s-2"):
            status, _ = await asyncio.wait_for(admitted(door, demo, A, redraw, "s-2"), GUARD_S)
        assert status == 409 and "s-2" not in pending

    run_alone(scenario())
