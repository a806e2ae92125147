"""A session's event stream kept open while a call of that session is on its way into gradio's queue.

The page reads every answer from one event stream per session (`GET …/queue/data`). gradio's stream route
closes it once an answer leaves no event of the session pending (`pending_event_ids_session`), and the page's
client opens a new one only for a call whose reply it reads after it read that close. A call that waits at
the door (ui/door.py: for its session's turn, or its address's) joins moments after the call it waited for
ended, so its reply and the close that call's answer brought cross on their way to the page: read in that
order, the page kept listening on a stream about to end, and the answer was never read (a page load or a
redraw left loading for good, seen on busy machines). While a call is at the door, its session has a mark
among its pending events, so the stream stays open until the call has joined (its own event then keeps it
open) or has been refused.
"""

from __future__ import annotations

import contextlib
import uuid


@contextlib.contextmanager
def kept_open(blocks, session_hash):
    """Mark `session_hash` as having an event pending in `blocks`'s queue until the block ends."""
    pending = getattr(getattr(blocks, "_queue", None), "pending_event_ids_session", None)
    if not isinstance(pending, dict) or not isinstance(session_hash, str) or not session_hash:
        yield
        return
    mark, created = f"door-{uuid.uuid4().hex}", session_hash not in pending
    pending.setdefault(session_hash, set()).add(mark)
    try:
        yield
    finally:
        ids = pending.get(session_hash)
        if ids is not None:
            ids.discard(mark)
            if created and not ids:
                del pending[session_hash]
