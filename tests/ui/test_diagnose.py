"""The server's report of what it is doing (ui/diagnose.py), read from the app's own page, gradio's queue
and the door, with one call held in the queue by the test."""

from __future__ import annotations

import tempfile

from fastapi import Request
from gradio.queueing import Event

from ui import diagnose
from ui.door import Door
from ui.lanes import handler_name


def test_the_report_names_each_lane_the_held_call_the_door_and_every_thread():
    import app

    demo = app.build_demo()
    demo.queue()
    step = next(f for f in demo.fns.values() if f.queue and handler_name(f) == "step")
    demo._queue.create_event_queue_for_fn(step)
    scope = {"type": "http", "method": "POST", "path": "/", "client": ("203.0.113.9", 1), "headers": []}
    event = Event("session-abc123", step, Request(scope), None)
    demo._queue.event_ids_to_events[event._id] = event
    demo._queue.pending_event_ids_session["session-abc123"] = {event._id}
    door = Door(demo)
    diagnose.watch(demo, door)
    with tempfile.TemporaryFile("w+") as out:  # faulthandler writes to a file descriptor
        diagnose.report(out)
        out.seek(0)
        text = out.read()
    assert "explore: 0 / 4, 0 waiting" in text  # the Step's lane: none running, its limit, none waiting
    assert "events held (1):" in text and "step (lane explore) session session-" in text and "alive True" in text
    assert "session-: events" in text and "messages waiting" in text
    assert "door: admitted {}, waiting {}, joining {}" in text
    assert "Current thread 0x" in text and "test_the_report_names_each_lane" in text  # this thread's stack
    assert text.rstrip().endswith(diagnose.END_MARK)
