"""Run the app as a child process for tests and benchmarks: `python app.py` on loopback, offline.

`AppServer` starts the repository's `app.py` on 127.0.0.1 at a free port with Gradio's analytics,
server-side rendering and the Hugging Face hub turned off, waits until the page answers HTTP 200,
and stops the whole process group by its id. The same module holds the headless-Chromium launch
settings the browser tests and the browser benchmark share, and one reader of a process's resident
memory (VmRSS from /proc, so psutil is not needed).

Nothing here imports gradio or torch; the repository root is found from this file's location
(the project is installed in editable mode, so that is the checkout).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app.py"

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--no-first-run", "--disable-sync", "--disable-quic",
]

OFFLINE_ENV = {
    "GRADIO_SERVER_NAME": "127.0.0.1",
    "GRADIO_ANALYTICS_ENABLED": "False",
    "GRADIO_SSR_MODE": "False",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "PYTHONUNBUFFERED": "1",
    # an empty hub cache: the app offers the README's preloaded hub models found in the cache when it is given
    # none (lab.catalogue.preloaded), so a machine whose own cache holds them would see other model lists
    "HF_HUB_CACHE": str(Path(tempfile.gettempdir()) / "decoder-lab-tests-no-hub-cache"),
}
# Every client of a test or benchmark comes from 127.0.0.1, where a visitor's rate limits would
# count them all as one person: scale the limits up unless a caller sets its own (the rate-limit
# tests pass DECODER_LAB_RATE_SCALE=1).
LOCAL_ENV = {"DECODER_LAB_RATE_SCALE": "1000"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    """`python app.py` in a child process on 127.0.0.1, offline settings, stopped by its process group.

    `extra_env` is added to the child's environment (e.g. DECODER_LAB_THREADS); with `tmp`, Gradio's
    upload folder and the child's TMPDIR live there, and so does the log. After `start()`,
    `start_seconds` is the time from launching the process to the first HTTP 200.
    """

    def __init__(self, extra_env: dict[str, str] | None = None, tmp: Path | None = None, args: list[str] = (),
                 app: Path = APP):
        self.args = list(args)  # command-line options of app.py (e.g. --model SRC)
        self.app = Path(app)  # another checkout's app.py for a benchmark's before/after (bench/startup.py)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.env = {**os.environ, **LOCAL_ENV, **OFFLINE_ENV, "GRADIO_SERVER_PORT": str(self.port), **(extra_env or {})}
        if tmp is not None:
            self.env["GRADIO_TEMP_DIR"] = str(tmp / "gradio")
            self.env["TMPDIR"] = str(tmp)
        self.log_path = (tmp or Path(tempfile.gettempdir())) / f"app-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.log = None
        self.start_seconds: float | None = None

    def start(self, timeout: float = 90, poll: float = 0.2) -> AppServer:
        """Launch the app and wait (polling every `poll` s) until its page answers HTTP 200."""
        self.log = open(self.log_path, "wb")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, str(self.app), *self.args], cwd=self.app.parent, env=self.env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        while True:
            try:
                with urllib.request.urlopen(self.url, timeout=2) as r:
                    if r.status == 200:
                        self.start_seconds = time.perf_counter() - t0
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.perf_counter() - t0 > timeout:
                self.stop()
                raise RuntimeError(f"app did not start:\n{self.output()[-4000:]}")
            time.sleep(poll)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def output(self) -> str:
        """Everything the app printed so far (stdout and stderr together)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def state(self, timeout: float = 10.0) -> str:
        """What the running app is doing (its queue, its door, every thread's stack: ui/diagnose.py), asked for
        with SIGUSR1 and read back from its log ("" once it has stopped or if no report came within `timeout`)."""
        if self.proc is None or self.proc.poll() is not None:
            return ""
        start = len(self.output())
        os.kill(self.proc.pid, signal.SIGUSR1)
        end = "== end of the server's state =="
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.output()[start:]
            if end in text:
                return text[text.find("== the server's state"):text.find(end) + len(end)]
            time.sleep(0.1)
        return ""

    def stop(self) -> None:
        """SIGTERM the app's process group, SIGKILL after 10 s; close the log."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.log is not None:
            self.log.close()
            self.log = None

    def __enter__(self) -> AppServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def _rss_kb(pid: int | str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise OSError(f"no VmRSS for process {pid}")


def _children(pid: int | str) -> list[int]:
    pid = os.getpid() if pid == "self" else pid
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def rss_mb(pid: int | str = "self", *, tree: bool = False) -> float:
    """Resident memory (VmRSS) of a process in MB, one decimal; `tree` adds its child processes.

    Raises OSError when the process is gone (a child that exits while the tree is read is skipped).
    """
    kb = _rss_kb(pid)
    if tree:
        stack = _children(pid)
        while stack:
            child = stack.pop()
            try:
                kb += _rss_kb(child)
            except OSError:
                continue
            stack.extend(_children(child))
    return round(kb / 1024, 1)
