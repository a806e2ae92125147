"""Start-up time: `python app.py` until its page answers HTTP 200, median of N cold starts.

Each start is a new process launched by tests.support.server.AppServer (offline, 127.0.0.1, a free port),
polled every 50 ms with urllib from the moment the process is launched; it is stopped (by its
process group) before the next start. "Cold" means a new interpreter; the OS file cache is warm
after the first start.

    python -m bench.startup [--starts 5]
"""

from __future__ import annotations

import statistics

from bench.common import emit, parser
from tests.support.server import AppServer


def one_start(timeout: float = 90) -> float:
    """Seconds from launching `python app.py` to its first HTTP 200."""
    server = AppServer()
    try:
        return server.start(timeout=timeout, poll=0.05).start_seconds
    finally:
        server.stop()


def main() -> None:
    p = parser("startup", __doc__)
    p.add_argument("--starts", type=int, default=5, help="cold starts to time")
    args = p.parse_args()
    times = [one_start() for _ in range(args.starts)]
    emit("startup_http200", starts=args.starts, median_s=round(statistics.median(times), 2),
         min_s=round(min(times), 2), max_s=round(max(times), 2), all_s=[round(t, 2) for t in times])


if __name__ == "__main__":
    main()
