"""Shared fixtures: a real app server on a free loopback port, and a real headless Chromium."""

from __future__ import annotations

import json
import os
import signal
import struct
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--no-first-run", "--disable-sync", "--disable-quic",
]


def safetensors_split(data: bytes) -> tuple[dict, bytes]:
    """A safetensors file's JSON header and the bytes after it (for crafting hostile files)."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def safetensors_join(header: dict, body: bytes) -> bytes:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    """`python app.py` in a child process on 127.0.0.1, offline settings, stopped by PID."""

    def __init__(self, extra_env: dict[str, str] | None = None, tmp: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.env = dict(
            os.environ,
            GRADIO_SERVER_NAME="127.0.0.1",
            GRADIO_SERVER_PORT=str(self.port),
            GRADIO_ANALYTICS_ENABLED="False",
            GRADIO_SSR_MODE="False",
            HF_HUB_OFFLINE="1",
            PYTHONUNBUFFERED="1",
            **(extra_env or {}),
        )
        if tmp is not None:
            self.env["GRADIO_TEMP_DIR"] = str(tmp / "gradio")
            self.env["TMPDIR"] = str(tmp)
        self.log_path = (tmp or Path("/tmp")) / f"app-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90) -> "AppServer":
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=self.env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.url, timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"app did not start:\n{self.output()[-4000:]}")
            time.sleep(0.2)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()


@pytest.fixture(scope="session")
def app_server(tmp_path_factory):
    server = AppServer({"DECODER_LAB_TRAIN_SECONDS": "60"}, tmp_path_factory.mktemp("app")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run `python tests/setup_browser.py` (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()
