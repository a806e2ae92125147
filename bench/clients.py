"""gradio_client helpers for the server benchmarks (memory, load): one Client = one session."""

from __future__ import annotations

import threading
import time

TRAIN_ARGS = dict(corpus="sort", pasted="", upload=None, tokenizer="char", layers=2, heads=4, d_model=64, d_ff=256,
                  pos="learned", norm="pre", activation="gelu", dropout=0.0, lr=3e-3, seed=0)


def client(url: str):
    from gradio_client import Client

    return Client(url, verbose=False, download_files=False, analytics_enabled=False)


def step(c, model: str, prompt: str, seed: int = 0):
    return c.predict(model, prompt, 0.8, 0, 1.0, seed, 0, "all", "weights", api_name="/step")


def start_training(url: str, steps: int = 2000):
    """Submit a training run in its own session; returns (client, job)."""
    c = client(url)
    a = TRAIN_ARGS
    job = c.submit(a["corpus"], a["pasted"], a["upload"], a["tokenizer"], a["layers"], a["heads"], a["d_model"],
                   a["d_ff"], a["pos"], a["norm"], a["activation"], a["dropout"], steps, a["lr"], a["seed"],
                   api_name="/train")
    return c, job


def stop_training(c, job, timeout: float = 30) -> str:
    try:
        c.predict(api_name="/stop")
    except Exception as exc:  # noqa: BLE001 - report, don't fail the benchmark
        return f"stop failed: {exc!r}"
    t0 = time.time()
    while not job.done() and time.time() - t0 < timeout:
        time.sleep(0.2)
    out = job.outputs()
    return str(out[-1][0])[:160] if out else "no output"


class Sampler(threading.Thread):
    """Samples a function every `every` seconds until stopped; keeps the maximum and all values."""

    def __init__(self, fn, every: float = 0.25):
        super().__init__(daemon=True)
        self.fn, self.every, self.values = fn, every, []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self.values.append(self.fn())
            except Exception:  # noqa: BLE001
                pass
            self._stop_event.wait(self.every)

    def stop(self) -> list:
        self._stop_event.set()
        self.join()
        return self.values
