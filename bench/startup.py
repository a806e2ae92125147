"""Start-up time: `python app.py` until its page answers HTTP 200, median of N cold starts.

Each start is a new process launched by tests.support.server.AppServer (offline, 127.0.0.1, a free port),
polled every 50 ms with urllib from the moment the process is launched; it is stopped (by its
process group) before the next start. "Cold" means a new interpreter; the OS file cache is warm
after the first start.

    python -m bench.startup [--starts 5] [--before DIR]

With `--before DIR` (another checkout, e.g. `git worktree add /tmp/before main~5`), the two checkouts' starts
alternate, so both see the same machine, and the ratio after / before is printed.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.common import emit, parser
from tests.support.server import AppServer


def one_start(timeout: float = 90, app: Path | None = None) -> float:
    """Seconds from launching `python app.py` (this checkout's, or `app`) to its first HTTP 200."""
    server = AppServer() if app is None else AppServer(app=app)
    try:
        return server.start(timeout=timeout, poll=0.05).start_seconds
    finally:
        server.stop()


def main() -> None:
    p = parser("startup", __doc__)
    p.add_argument("--starts", type=int, default=5, help="cold starts to time")
    p.add_argument("--before", type=Path, help="another checkout whose starts alternate with this one's")
    args = p.parse_args()
    if args.before is None:
        times = [one_start() for _ in range(args.starts)]
        emit("startup_http200", starts=args.starts, median_s=round(statistics.median(times), 2),
             min_s=round(min(times), 2), max_s=round(max(times), 2), all_s=[round(t, 2) for t in times])
        return
    after, before = [], []
    for _ in range(args.starts):
        before.append(one_start(app=args.before.resolve() / "app.py"))
        after.append(one_start())
    emit("startup_ab", starts=args.starts, before_median_s=round(statistics.median(before), 2),
         after_median_s=round(statistics.median(after), 2),
         ratio=round(statistics.median(after) / statistics.median(before), 3), target_s=4.0,
         before_all_s=[round(t, 2) for t in before], after_all_s=[round(t, 2) for t in after])


if __name__ == "__main__":
    main()
