"""A fake clock and fake sessions (the `Tenant` protocol) for the budgets, without a server."""

from __future__ import annotations

from pathlib import Path

from lab.server import files


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class Fake:
    """A session as the budgets see it: when it last acted, whether it is busy, what it holds."""

    def __init__(self, clock: Clock, name: str = "", run_dir: Path | None = None):
        self.clock, self.name = clock, name
        self.touched = clock()
        self.closed = False
        self.client: str | None = None  # SessionStore sets it; the budgets count it for that client's share
        self.run_dir = run_dir
        self.is_busy = False
        self.models: dict[str, int] = {}  # name → bytes
        self.text = "some text"
        self.notices: list[str] = []
        self.dropped = 0

    @property
    def busy(self) -> bool:
        return self.is_busy

    def act(self) -> None:
        self.touched = self.clock()

    def drop_own_models(self, reason: str) -> bool:
        if self.is_busy:
            return False
        self.models.clear()
        self.text = ""
        self.notices.append(reason)
        self.dropped += 1
        return True

    def drop_files(self, reason: str) -> bool:
        if self.is_busy:
            return False
        files.remove_dir(self.run_dir)
        self.run_dir = None
        self.notices.append(reason)
        return True

    def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return f"Fake({self.name!r})"
