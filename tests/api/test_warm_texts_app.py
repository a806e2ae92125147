"""Cooled texts through the running app: a server whose store of warm texts holds nothing but the newest
(`DECODER_LAB_WARM_MB=0`), so every Step of one client cools the others' texts (lab/server/warm.py), and each
client's next Step, Undo or figure computes its text again from the model's weights.

Three gradio_client sessions take turns on the grammar model, each with its own seed and changing its
sampling settings between Steps. What each one is sent (tokens, the status with the sampled token's
probability, the attention figure, and unrounded through /export_numbers the layer's attention and the
next-token distribution) is held to an in-process session of the same model stepping the same way and
never cooled: the same tokens, and numbers equal within the figure's rounding or 1e-6 (float32 rounding
of another batch shape).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gradio_client import Client

from lab.session import Session
from model.generate import Sampling
from tests.support.api import QUANT, panels
from tests.support.server import AppServer

GRAMMAR = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
SETTINGS = [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.9)]  # temperature, top-k, top-p: changed between Steps
SEEDS = (3, 11, 29)


@pytest.fixture(scope="module")
def cold_server(tmp_path_factory):
    env = {"DECODER_LAB_WARM_MB": "0", "DECODER_LAB_BUSY_WAIT_S": "600"}
    server = AppServer(env, tmp_path_factory.mktemp("cold")).start()
    yield server
    server.stop()


ATOL = 1e-6


def exported(c: Client, what: str) -> dict:
    path = c.predict(what, "json", GRAMMAR, 0, "all", api_name="/export_numbers")
    return json.loads(Path(path).read_text(encoding="utf-8"))


def assert_same_numbers(c: Client, s: Session) -> None:
    """Layer 0's attention and the last token's distribution, unrounded, as the reference computes them."""
    values = np.array(exported(c, "weights")["values"], dtype=float)
    np.testing.assert_allclose(np.nan_to_num(values), s.attention().weights[0], atol=ATOL, rtol=0)
    rows = exported(c, "probabilities")["rows"]
    want = s.probabilities().probs
    assert rows and [r[3] for r in rows] == pytest.approx([float(want[r[1]]) for r in rows], abs=ATOL)


def sent(c: Client, seed: int, i: int):
    t, k, p = SETTINGS[i % len(SETTINGS)]
    return c.predict(GRAMMAR, P, t, k, p, seed, 0, "all", "weights", api_name="/step")


def reference(seed: int, i: int, s: Session):
    t, k, p = SETTINGS[i % len(SETTINGS)]
    return s.step(GRAMMAR, P, Sampling(temperature=t, top_k=k, top_p=p, seed=seed), view=(0, "all", "weights"))


def test_cooled_texts_step_undo_and_draw_as_texts_never_cooled(cold_server):
    clients = [Client(cold_server.url, verbose=False) for _ in SEEDS]
    refs = [Session() for _ in SEEDS]
    for i in range(4):
        for c, s, seed in zip(clients, refs, SEEDS):  # each Step cools the other two texts
            tokens, status, _probs, attn = sent(c, seed, i)
            frame = reference(seed, i, s)
            assert [t["token"] for t in tokens] == [p for p, _ in frame.tokens]
            assert status == frame.status
            np.testing.assert_allclose(np.nan_to_num(panels(attn)), frame.attention.weights[0], atol=QUANT, rtol=0)
        for c, s in zip(clients, refs):  # read after the others' Steps: computed again
            assert_same_numbers(c, s)
    # Undo on a cooled text: the token before comes back with the distribution it was drawn from
    for c, s in zip(clients, refs):
        tokens, status, _probs, attn = c.predict(0, "all", "weights", api_name="/undo")
        frame = s.undo(view=(0, "all", "weights"))
        assert [t["token"] for t in tokens] == [p for p, _ in frame.tokens] and status == frame.status
        np.testing.assert_allclose(np.nan_to_num(panels(attn)), frame.attention.weights[0], atol=QUANT, rtol=0)
    for c, s in zip(clients, refs):
        assert_same_numbers(c, s)
    # and the sampler goes on from where it was
    for c, s, seed in zip(clients, refs, SEEDS):
        tokens, status, _probs, _attn = sent(c, seed, 4)
        assert [t["token"] for t in tokens] == [p for p, _ in reference(seed, 4, s).tokens]
    for c in clients:
        c.close()
