"""The tally of a fuzz run: outcomes per endpoint and per mode, refusals by kind, and each defect
kind counted once with one example; `summary()` is what the run prints."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from .checks import OUTCOMES


@dataclass
class Defect:
    kind: str
    outcome: str
    origin: str
    reach: str
    count: int = 0
    example: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "class": self.outcome, "origin": self.origin, "reach": self.reach,
                "count": self.count, "example": self.example}


class Stats:
    def __init__(self):
        self.t0 = time.perf_counter()
        self.calls = 0
        self.replays = 0
        self.outcomes: Counter = Counter()
        self.per_endpoint: dict[str, Counter] = {}
        self.per_mode: dict[str, Counter] = {}  # valid / one-bad / chaos / probe / upload / scenario
        self.refusals: Counter = Counter()  # clean refusal messages by signature
        self.defects: dict[str, Defect] = {}
        self.tracebacks: Counter = Counter()
        self.state_changes_on_refusal = 0
        self.inconclusive = 0  # twin replays turned away by a rate limit or a full server
        self.seconds: list[float] = []

    def defect(self, kind: str, outcome: str, origin: str, reach: str, example: dict) -> None:
        d = self.defects.get(kind)
        if d is None:
            d = self.defects[kind] = Defect(kind, outcome, origin, reach, example=example)
        d.count += 1

    def summary(self) -> dict:
        wall = time.perf_counter() - self.t0
        return {
            "calls": self.calls, "twin_replays": self.replays,
            "outcomes": {k: self.outcomes.get(k, 0) for k in OUTCOMES},
            "per_endpoint": {k: dict(v) for k, v in sorted(self.per_endpoint.items())},
            "per_mode": {k: dict(v) for k, v in sorted(self.per_mode.items())},
            "state_changes_on_refusal": self.state_changes_on_refusal, "inconclusive_replays": self.inconclusive,
            "tracebacks": dict(self.tracebacks.most_common()),
            "defect_kinds": dict(Counter(f"{d.origin} via {d.reach}" for d in self.defects.values())),
            "defects": sorted((d.as_dict() for d in self.defects.values()), key=lambda d: -d["count"]),
            "clean_refusal_kinds": len(self.refusals), "top_clean_refusals": dict(self.refusals.most_common(12)),
            "wall_s": round(wall, 1), "calls_per_s": round(self.calls / wall, 2) if wall else None,
            "median_call_ms": round(1000 * sorted(self.seconds)[len(self.seconds) // 2], 1) if self.seconds else None,
        }
