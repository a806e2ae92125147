"""`kill -USR1` on the running app writes its state to its log and changes nothing (ui/diagnose.py): the
report the suite puts in a failed test's report (tests/conftest.py)."""

from __future__ import annotations

import urllib.request


def test_sigusr1_writes_the_queue_the_door_and_the_threads_to_the_log_and_the_app_goes_on(app_server):
    state = app_server.state()
    assert state.startswith("== the server's state (SIGUSR1) ==")
    assert "lanes (running / limit, waiting):" in state and "door: admitted" in state
    assert "Thread 0x" in state and "uvicorn" in state  # every thread's stack, the server's among them
    assert state.endswith("== end of the server's state ==")
    with urllib.request.urlopen(app_server.url, timeout=30) as page:
        assert page.status == 200
