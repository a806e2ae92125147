"""Item 6: start-up, `python app.py` until the page answers HTTP 200 (median of N cold starts).

Each start is a new process (tests/conftest.py AppServer env: offline, 127.0.0.1, free port),
polled every 50 ms with urllib; the process is stopped (by its PID group) before the next one.
"Cold" means a new interpreter; the OS file cache is warm after the first start.

    python bench/startup.py [--starts 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import urllib.request

from common import ROOT, emit


def one_start(timeout: float = 90) -> float:
    from conftest import AppServer

    server = AppServer()
    log = open(server.log_path, "wb")
    t0 = time.perf_counter()
    server.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=server.env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server.log = log
    try:
        while True:
            try:
                with urllib.request.urlopen(server.url, timeout=2) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                pass
            if server.proc.poll() is not None or time.perf_counter() - t0 > timeout:
                raise RuntimeError("app did not start: " + server.output()[-2000:])
            time.sleep(0.05)
    finally:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--starts", type=int, default=5)
    args = p.parse_args()
    times = [one_start() for _ in range(args.starts)]
    emit("startup_http200", starts=args.starts, median_s=round(statistics.median(times), 2),
         min_s=round(min(times), 2), max_s=round(max(times), 2), all_s=[round(t, 2) for t in times])


if __name__ == "__main__":
    main()
