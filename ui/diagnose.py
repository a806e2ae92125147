"""What the server is doing right now, written to its log when asked: `kill -USR1 <pid>`.

For the person running the app (a page that waits for an answer that never comes) and for the test suite
(tests/conftest.py asks for it when a test that used the shared server fails): gradio's queue lane by lane
(running, limit, waiting), every event it holds (its handler, how long ago it joined, whether its page is
still there), the sessions with answers not yet read from their event stream, what the door holds
(ui/door.py), then the stack of every thread. Nothing is changed; the reading is not locked, so a number may
be a moment old. The report ends with `END_MARK`.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import time
import weakref

END_MARK = "== end of the server's state =="
_WATCHED: list = []  # weak references to (blocks, door) pairs: one per app of this process


def watch(blocks, door) -> None:
    """Report on `blocks`'s queue and `door` when the signal comes."""
    _WATCHED.append((weakref.ref(blocks), weakref.ref(door)))


def _name(fn) -> str:
    return getattr(getattr(fn, "fn", None), "__name__", None) or str(getattr(fn, "api_name", "?"))


def _event_line(event, now: float) -> str:
    return (f"  {_name(event.fn)} (lane {event.concurrency_id}) session {str(event.session_hash)[:8]} "
            f"joined {now - event.enqueue_time:.1f} s ago, alive {event.alive}, closed {event.closed}")


def queue_report(blocks) -> list[str]:
    """The lines that describe gradio's queue of `blocks`."""
    queue = getattr(blocks, "_queue", None)
    if queue is None:
        return ["no queue"]
    now = time.monotonic()
    lines = ["lanes (running / limit, waiting):"]
    for lane, q in list(queue.event_queue_per_concurrency_id.items()):
        lines.append(f"  {lane}: {q.current_concurrency} / {q.concurrency_limit}, {len(q.queue)} waiting")
    running = [e for job in list(queue.active_jobs) if job for e in job]
    lines.append(f"running ({len(running)}; workers free {sum(j is None for j in queue.active_jobs)}):")
    lines += [_event_line(e, now) for e in running]
    held = list(queue.event_ids_to_events.values())
    lines.append(f"events held ({len(held)}):")
    lines += [_event_line(e, now) for e in held]
    unread = {s: ids for s, ids in list(queue.pending_event_ids_session.items()) if ids}
    lines.append(f"sessions with answers not yet read ({len(unread)}):")
    for session, ids in unread.items():
        messages = queue.pending_messages_per_session.get(session)
        size = messages.qsize() if messages is not None else "no message queue"
        lines.append(f"  {session[:8]}: events {[i[:8] for i in ids]}, messages waiting {size}")
    return lines


def report(out=None) -> None:
    """Write the report to `out` (the process's stderr)."""
    out = out or sys.stderr
    lines = ["== the server's state (SIGUSR1) =="]
    for blocks_ref, door_ref in _WATCHED:
        blocks, door = blocks_ref(), door_ref()
        try:  # read while the server goes on: a raised error here would end the main thread, and the app
            if blocks is not None:
                lines += queue_report(blocks)
            if door is not None:
                lines.append(door.state())
        except Exception as exc:  # noqa: BLE001 - a report, never a crash
            lines.append(f"(could not read it just now: {type(exc).__name__})")
    out.write("\n".join(lines) + "\nthreads:\n")
    out.flush()
    faulthandler.dump_traceback(file=out, all_threads=True)
    out.write(END_MARK + "\n")
    out.flush()


def install() -> None:
    """Answer SIGUSR1 with the report (on systems that have it; in the main thread only, as Python wants)."""
    if not hasattr(signal, "SIGUSR1"):
        return
    try:
        signal.signal(signal.SIGUSR1, lambda *_: report())
    except ValueError:  # not the main thread (the app started by another program): no report, nothing else lost
        pass
