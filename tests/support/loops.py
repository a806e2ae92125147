"""Running a coroutine from a test, whatever else the test's worker has run before it."""

from __future__ import annotations

import asyncio
import threading


def run_alone(coro):
    """asyncio.run in a thread of its own, its result or exception handed back: a pytest worker that ran a
    browser test keeps Playwright's loop running in its main thread, where asyncio.run refuses to start."""
    out: dict = {}

    def body() -> None:
        try:
            out["value"] = asyncio.run(coro)
        except BaseException as exc:  # re-raised in the test's thread
            out["error"] = exc

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")
