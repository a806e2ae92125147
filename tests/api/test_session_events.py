"""One session, one action at a time: overlapping calls of the same session never collide.

Each test opens one gradio_client session, starts a long Generate and, while it streams, sends
another action of the same session. The second waits for the first instead of interleaving with
it: both end with their normal result (never "Something went wrong"), and the session works after.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest
from gradio_client import Client

from lab.session import Session

GRAMMAR = "grammar (built-in)"
SORT = "sort digits (built-in)"
P = "anna found the key . she gave it to tom because he"
STEP = (GRAMMAR, P, 1.0, 0, 1.0, 0, 0, "all", "weights")
GENERATE = (GRAMMAR, P, 1.0, 0, 1.0, 0, 200, 0, "all", "weights")
TRAIN = ("sort", "", None, "char", 2, 4, 64, 256, "learned", "pre", "gelu", 0.0, 2000, 3e-3, 0)
SECOND = {
    "step": (STEP, "/step"),
    "undo": ((0, "all", "weights"), "/undo"),
    "reset": ((GRAMMAR,), "/reset"),
    "select_model": ((SORT,), "/select_model"),
    "generate": (GENERATE, "/generate"),
    "positional": ((GRAMMAR,), "/positional"),
    "train": (TRAIN[:12] + (5,) + TRAIN[13:], "/train"),
    "stop": ((), "/stop"),
    "upload_model": (None, "/upload_model"),  # a small model file, made by the test
}
# the only refusal an overlap may cause: one training at a time per session
ALLOWED = ("A training run is already going in this session",)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> str:
    from model.checkpoint import save_checkpoint
    from model.config import ModelConfig
    from model.tokenizers import CharTokenizer
    from model.transformer import DecoderLM

    tok = CharTokenizer.train("abcdefgh ")
    path = tmp_path_factory.mktemp("upload") / "tiny.safetensors"
    model = DecoderLM(ModelConfig(vocab_size=tok.vocab_size, block_size=16, n_layers=1, n_heads=1, d_model=8))
    return str(save_checkpoint(path, model, tok, {}))


def second_call(c: Client, name: str, model_file: str):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    args, api = SECOND[name]
    if name == "upload_model":
        args = (handle_file(model_file),)
    for attempt in range(2):
        try:
            return c.predict(*args, api_name=api)
        except AppError as exc:
            # a Generate sent again (below) after the first one did run: the text is full, which is what
            # a person pressing Generate a second time is told
            again = attempt and name == "generate" and "generated tokens; Reset to start again" in str(exc)
            assert again or str(exc).startswith(ALLOWED), f"{name} collided: {exc}"
            return None
        except concurrent.futures.CancelledError:
            # gradio_client shares one event stream per session: a call sent just as another job of
            # the same client finishes had its future cancelled on the client side once in CI (no
            # error from the server), though the server ran it. Sending it again is what a person
            # pressing again does.
            if attempt:
                raise
    return None


def wait_until_streaming(job, timeout: float = 60) -> None:
    """Until the Generate job has sent its first update (it is mid-stream), or is done."""
    deadline = time.time() + timeout
    while not job.status().code.name in ("PROCESSING", "ITERATING", "FINISHED") and time.time() < deadline:
        time.sleep(0.02)


FIRST = {"generate": (GENERATE, "/generate"), "train": (TRAIN, "/train"), "step": (STEP, "/step")}


@pytest.mark.parametrize("first", sorted(FIRST))
@pytest.mark.parametrize("second", sorted(SECOND))
def test_an_action_sent_during_another_of_the_same_session_never_collides(app_server, model_file, first, second):
    c = Client(app_server.url, verbose=False)
    args, api = FIRST[first]
    job = c.submit(*args, api_name=api)
    wait_until_streaming(job)
    second_call(c, second, model_file)
    if first == "train":
        c.predict(api_name="/stop")
    outputs = job.result(timeout=300)  # a hang guard
    assert outputs is not None
    c.predict(GRAMMAR, api_name="/reset")  # two Generates of 200 fill the text's 256 tokens: start again
    after = c.predict(*STEP, api_name="/step")  # the session works afterwards
    assert after[0] and after[3]["plot"]


def test_a_cancelled_generate_leaves_the_session_usable_at_once(app_server):
    c = Client(app_server.url, verbose=False)
    gen = c.submit(*GENERATE, api_name="/generate")
    wait_until_streaming(gen)
    gen.cancel()
    for seed in range(3):  # every Step is answered, none refused as busy
        tokens = c.predict(GRAMMAR, P, 1.0, 0, 1.0, seed, 0, "all", "weights", api_name="/step")[0]
        assert tokens


def test_session_turn_serialises_and_refuses_when_busy_too_long():
    s = Session()
    order = []
    holding = threading.Event()

    def slow():
        with s.turn():
            order.append("first in")
            holding.set()
            time.sleep(0.3)  # the second asks for the turn meanwhile (or after: the order is the same)
            order.append("first out")

    t = threading.Thread(target=slow)
    t.start()
    assert holding.wait(timeout=300)  # a hang guard
    with s.turn():
        order.append("second")
    t.join()
    assert order == ["first in", "first out", "second"]
    with s.turn():
        with pytest.raises(ValueError, match="still busy"):
            with s.turn(wait_s=0.05):
                pass


def test_stop_ends_a_training_while_its_tokenizer_is_still_being_built(monkeypatch):
    """Stop pressed (from another thread) while the tokenizer trains ends the run there: no phase of the build
    begins after it, no step is trained, and nothing is added."""
    import app
    import model.corpora as corpora
    import model.tokenizers as tk

    s = Session()
    text = "ab" * 600_000  # 1.2 M characters without a space: the slowest text for BPE
    outcome, phases = {}, []
    in_tokenizer, stop_pressed = threading.Event(), threading.Event()
    train_tokenizer, encode_chunks = corpora._train_tokenizer, tk.BPETokenizer.encode_chunks

    def tokenizer_held_until_stop(*args):
        phases.append("tokenizer")
        in_tokenizer.set()
        assert stop_pressed.wait(timeout=300)  # Stop is pressed while the tokenizer trains (a hang guard)
        return train_tokenizer(*args)

    def counted_parts(self, *args, **kwargs):
        for part in encode_chunks(self, *args, **kwargs):
            phases.append("encoded part")
            yield part

    monkeypatch.setattr(corpora, "_train_tokenizer", tokenizer_held_until_stop)
    monkeypatch.setattr(tk.BPETokenizer, "encode_chunks", counted_parts)

    def run():
        try:
            list(app.train_model(s, "text", text, None, "bpe", 1, 1, 8, 0, "learned", "pre", "gelu", 0.0, 2000,
                                 3e-3, 0))
            outcome["result"] = "trained"
        except Exception as exc:  # gr.Error
            outcome["result"] = getattr(exc, "message", str(exc))

    worker = threading.Thread(target=run)
    worker.start()
    assert in_tokenizer.wait(timeout=300)  # a hang guard
    app.stop_training(s)
    stop_pressed.set()
    worker.join(timeout=300)  # a hang guard
    assert not worker.is_alive()
    assert outcome["result"] == "Training stopped by you before it began."
    assert phases == ["tokenizer"]  # the tokenizer it was training finished; nothing was encoded after the Stop
    assert s.models == {} and s.run is None
