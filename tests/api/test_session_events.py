"""One session, one action at a time: overlapping calls of the same session never collide.

Each overlap test starts a long action in one session (a Generate, or a training) and, while the server
still reports it running, sends another action of the same session, as the page sends it (`Tab`: raw
joins of gradio's queue and the session's event stream). Two servers of this file's own:

- `waiting`: an action waits for the session's previous one however slow the machine
  (DECODER_LAB_BUSY_WAIT_S=600), and a training's steps may go past any run's length
  (DECODER_LAB_MAX_STEPS) under an hour's limit, so a training the test starts runs until the test
  stops it: the Stop's answer (how the run ended, given only when it found the run going) shows the
  training was still going after the second action. A Generate cannot be held that way: the second
  action is sent as soon as gradio has queued the Generate, and a try counts only if the server had not
  reported the Generate's end by then (another try, in a new session, if it had).
- `refusing`: the wait is 0 s, so an action that meets its session busy is refused at once with the
  door's 409, the server's own word that the overlap happened; and one that is admitted met its session
  free, which is what "usable at once" means.

A Step is too short to be shown running when another action arrives: what it holds, the session's turn,
is tested in process (`test_session_turn_serialises_and_refuses_when_busy_too_long`). Every wait is for a
state the server reports; each has a hang guard that fails the test with a message.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from lab.session import Session
from tests.support.server import AppServer

GRAMMAR = "grammar (built-in)"
SORT = "sort digits (built-in)"
NEW = 200  # a Generate's tokens
MAX_STEPS = 10**9  # no machine trains this many steps within the tests' hang guards
LONG_TRAIN = ("sort", "", None, "char", 2, 4, 64, 256, "learned", "pre", "gelu", 0.0, MAX_STEPS, 3e-3, 0, True, "")
SHORT_TRAIN = LONG_TRAIN[:12] + (5,) + LONG_TRAIN[13:]
GUARD_S = 300.0  # a hang guard only: every wait ends on a state long before
TRIES = 3  # a try whose Generate ended before the second action was sent shows nothing: it is made again
BUSY = "This session is still busy with your previous action; try again in a moment."


@dataclass(frozen=True)
class Text:
    """A model and the prompt a test's text starts from, with what the page shows of them."""

    model: str
    prompt: str
    pieces: list[tuple[str, str]]  # the prompt's tokens as the page shows them
    positions: str  # what /positional says of the model

    def step(self) -> tuple:
        return (self.model, self.prompt, 1.0, 0, 1.0, 0, 0, "all", "weights")

    def generate(self) -> tuple:
        return (self.model, self.prompt, 1.0, 0, 1.0, 0, NEW, 0, "all", "weights")


P = "anna found the key . she gave it to tom because he"
ON_GRAMMAR = Text(GRAMMAR, P, [(w, "prompt") for w in P.split()],
                  f"**{GRAMMAR}** uses **learned** positions: table of 256 positions × 96 dimensions.")
# The Generates that another action is sent during run on a model of the largest size an upload may have (about
# 4 times the grammar model's time per token): the longer a Generate, the surer a second action arrives while it
# runs. A character model: its prompt's pieces are its letters.
BIG = "uploaded: big"
BIG_PROMPT = "annafoundthekey"
ON_BIG = Text(BIG, BIG_PROMPT, [(c, "prompt") for c in BIG_PROMPT],
              f"**{BIG}** uses **learned** positions: table of 256 positions × 256 dimensions.")


@pytest.fixture(scope="module")
def waiting(tmp_path_factory):
    env = {"DECODER_LAB_BUSY_WAIT_S": "600", "DECODER_LAB_MAX_STEPS": str(MAX_STEPS),
           "DECODER_LAB_TRAIN_SECONDS": "3600"}
    server = AppServer(env, tmp_path_factory.mktemp("waiting")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def refusing(tmp_path_factory):
    server = AppServer({"DECODER_LAB_BUSY_WAIT_S": "0"}, tmp_path_factory.mktemp("refusing")).start()
    yield server
    server.stop()


def checkpoint(tmp_path_factory, name: str, **sizes) -> Path:
    """A character model of these sizes (random weights) saved as a Decoder Lab checkpoint, ready to upload."""
    from model.checkpoint import save_checkpoint
    from model.config import ModelConfig
    from model.tokenizers import CharTokenizer
    from model.transformer import DecoderLM

    tok = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz")
    path = tmp_path_factory.mktemp("upload") / f"{name}.safetensors"
    return Path(save_checkpoint(path, DecoderLM(ModelConfig(vocab_size=tok.vocab_size, **sizes)), tok, {}))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    """The small model a second action uploads."""
    return checkpoint(tmp_path_factory, "tiny", block_size=16, n_layers=1, n_heads=1, d_model=8)


@pytest.fixture(scope="module")
def big_file(tmp_path_factory) -> Path:
    """A model of the largest size an upload may have (model.checkpoint's limits: 6 layers, 8 heads, d_model
    256, d_ff 1024, context 256, 5 M parameters)."""
    return checkpoint(tmp_path_factory, "big", block_size=256, n_layers=6, n_heads=8, d_model=256, d_ff=1024)


def until(condition, what: str, guard: float = GUARD_S):
    """Poll `condition` until it returns something true (returned); past the guard the test fails saying `what`."""
    t0 = time.monotonic()
    while not (found := condition()):
        assert time.monotonic() - t0 < guard, f"still waiting after {guard:.0f} s for {what}"
        time.sleep(0.002)
    return found


class Tab:
    """One page's session, driven as the page drives it: a queued call joins gradio's queue (POST
    /queue/join, which the door holds while the session is busy, or refuses), a direct one (Stop) is
    answered at once, and every message comes on the session's event stream, read in a thread. Gradio
    closes that stream whenever none of the session's calls is pending; the reader opens it again."""

    def __init__(self, server):
        self.url, self.hash = server.url, uuid.uuid4().hex
        deps = httpx.get(server.url + "config", timeout=60).json()["dependencies"]
        self.fns = {d["api_name"]: d["id"] for d in deps if d.get("api_name")}
        self.messages: list[dict] = []
        self._closed, self._response = threading.Event(), None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with httpx.Client(timeout=None) as http:
            while not self._closed.is_set():
                try:
                    with http.stream("GET", f"{self.url}gradio_api/queue/data?session_hash={self.hash}") as r:
                        self._response = r
                        if r.status_code != 200:  # no call joined yet: the session's stream does not exist
                            time.sleep(0.02)
                            continue
                        for line in r.iter_lines():
                            if line.startswith("data:"):
                                self.messages.append(json.loads(line[5:]))
                except (httpx.HTTPError, RuntimeError):  # closed by `close`, or the server stopped
                    time.sleep(0.02)

    def close(self) -> None:
        self._closed.set()
        if self._response is not None:
            self._response.close()

    def post_join(self, api: str, *args) -> httpx.Response:
        return httpx.post(f"{self.url}gradio_api/queue/join", json={
            "fn_index": self.fns[api], "data": [None, *args], "session_hash": self.hash}, timeout=GUARD_S)

    def join(self, api: str, *args) -> str:
        """Queue a call (held at the door while the session is busy); its event id."""
        r = self.post_join(api, *args)
        assert r.status_code == 200, f"{api} was not queued: {r.status_code} {r.text[:300]}"
        return r.json()["event_id"]

    def direct(self, api: str, *args):
        r = httpx.post(f"{self.url}gradio_api/run/predict", json={
            "fn_index": self.fns[api], "data": [None, *args], "session_hash": self.hash}, timeout=GUARD_S)
        assert r.status_code == 200, f"{api}: {r.status_code} {r.text[:300]}"
        return r.json()["data"]

    def cancel(self, api: str, event_id: str) -> None:
        """What the page's cancel does; gradio answers once the handler's current iteration has ended."""
        r = httpx.post(f"{self.url}gradio_api/cancel", json={
            "fn_index": self.fns[api], "session_hash": self.hash, "event_id": event_id}, timeout=GUARD_S)
        assert r.status_code == 200 and r.json() == {"success": True}, r.text[:300]

    def upload(self, path: Path) -> dict:
        """A file sent to gradio's upload route, as the page's file box sends it."""
        r = httpx.post(f"{self.url}gradio_api/upload", files=[("files", (path.name, path.read_bytes()))],
                       timeout=GUARD_S)
        assert r.status_code == 200, r.text[:300]
        return {"path": r.json()[0], "orig_name": path.name, "meta": {"_type": "gradio.FileData"}}

    def of(self, event_id: str, msg: str) -> list[dict]:
        return [m for m in list(self.messages) if m.get("event_id") == event_id and m.get("msg") == msg]

    def first_frame(self, event_id: str) -> list:
        """The first update a streaming call sent (the server was mid-call then); fails if it ended first."""
        frame = until(lambda: self.of(event_id, "process_generating") or self.of(event_id, "process_completed"),
                      f"the first update of {event_id}")[0]
        assert frame["msg"] == "process_generating", f"it ended before streaming anything: {str(frame)[:300]}"
        return frame["output"]["data"]

    def running(self, event_id: str) -> bool:
        return not self.of(event_id, "process_completed")

    def outcome(self, event_id: str) -> tuple[bool, list | str]:
        """(success, the outputs) of a call, or (False, the refusal's sentence)."""
        done = until(lambda: self.of(event_id, "process_completed"), f"the end of {event_id}")[0]
        return (True, done["output"]["data"]) if done["success"] else (False, done["output"]["error"])

    def result(self, event_id: str) -> list:
        ok, out = self.outcome(event_id)
        assert ok, f"refused: {out}"
        return out

    def call(self, api: str, *args) -> list:
        return self.result(self.join(api, *args))

    def load(self, path: Path, name: str) -> None:
        """Upload a model into this session, as the Train tab's file box does."""
        status = self.call("upload_model", self.upload(path))[1]
        assert status == f"Loaded '{name}'. It is now in the Explore model list.", status


def tokens(text: list[dict]) -> list[tuple[str, str]]:
    return [(t["token"], t["class_or_confidence"]) for t in text]


def generated(status: str) -> int:
    """How many generated tokens the Explore status says the text has."""
    return int(re.search(r"\((\d+) generated\)", status).group(1))


def second_args(tab: Tab, name: str, on: Text, model_file: Path) -> tuple:
    """The second action's arguments on text `on` (a file is uploaded first, as the page's file box does)."""
    return {"step": on.step(), "undo": (0, "all", "weights"), "reset": (on.model,), "select_model": (SORT,),
            "generate": on.generate(), "positional": (on.model,), "train": SHORT_TRAIN, "stop": (),
            "upload_model": (tab.upload(model_file),) if name == "upload_model" else ()}[name]


class Second:
    """The second action, sent at once: a queued call's join is made in a thread of its own (the door holds it
    while the session is busy); Stop is a direct call, never held (it must not wait for what it stops)."""

    def __init__(self, tab: Tab, name: str, args: tuple):
        self.tab, self.name, self.joined = tab, name, []
        if name == "stop":
            self.answer = tab.direct("stop")
            return
        sent = threading.Event()

        def join():
            sent.set()
            self.joined.append(tab.join(name, *args))

        threading.Thread(target=join, daemon=True).start()
        sent.wait()

    def queued(self) -> str:
        """Its event id, once gradio has queued it."""
        return until(lambda: self.joined, f"the join of {self.name}")[0]

    def outcome(self) -> tuple[bool, list | str]:
        """(success, its outputs), or (False, the refusal's sentence)."""
        return (True, self.answer) if self.name == "stop" else self.tab.outcome(self.queued())


def check_second(name: str, ok: bool, out, on: Text, before: list[tuple[str, str]] | None) -> None:
    """The second action's own answer, on the text the session had when it ran (`before`; None: no text yet):
    each one's normal result (never "Something went wrong"), and the one refusal an overlap may cause, a
    second training of the session."""
    if name == "train" and not ok:
        assert out == "A training run is already going in this session; stop it first.", out
        return
    assert ok, f"{name} refused: {out}"
    base = on.pieces if before is None else before  # what a Step or a Generate goes on from
    n = len(base) - len(on.pieces)  # its generated tokens
    if name in ("step", "undo", "generate", "reset", "select_model"):
        text, status = tokens(out[1]), out[2]
    if name == "step":
        assert generated(status) == n + 1 and text[:-1] == base and text[-1][1] == "generated", status
    elif name == "undo" and before is None:  # nothing to take back
        assert (text, status) == ([], ""), status
    elif name == "undo":
        assert generated(status) == n - 1 and text == before[:-1], status
    elif name == "generate":
        added = generated(status) - n
        kept = len(text) - added  # the tokens in view before the new ones (the view keeps the context's last)
        assert added > 0 and text[kept:] == [(t, "generated") for t, _ in text[kept:]], status
        assert text[:kept] == base[len(base) - kept:], "it did not go on from the text"
    elif name == "reset":
        assert text == [] and status == "", status
    elif name == "select_model":
        assert text == [] and status.startswith(f"{SORT}: 2 layers"), status
    elif name == "positional":
        assert out[2] == on.positions, out[2]
    elif name == "train":
        assert out[1].startswith("Training finished after 5 steps"), out[1]
    elif name == "upload_model":
        loaded = "uploaded: tiny"
        assert (out[1], out[2]["value"]) == (f"Loaded '{loaded}'. It is now in the Explore model list.", loaded), out


def works_after(tab: Tab, on: Text) -> None:
    """The session works afterwards: a Step from a new text is answered."""
    tab.call("reset", on.model)
    text = tokens(tab.call("step", *on.step())[1])
    assert text[:-1] == on.pieces and text[-1][1] == "generated", text


SECONDS = ["step", "undo", "reset", "select_model", "generate", "positional", "train", "stop", "upload_model"]
HELD = [name for name in SECONDS if name not in ("train", "stop")]  # the actions that hold the session's turn


def generate_then(server, second: str, big_file: Path, model_file: Path) -> tuple[Tab, str, Second]:
    """A Generate on the big model in a new session and `second` sent as soon as gradio has queued it: (the session, the
    Generate's event id, the second action), from the first try whose Generate the server had not reported ended
    once the second was on its way. A machine can end a Generate that quickly (then the try shows no overlap, and
    is made again in a new session); it fails the test after TRIES."""
    ends = []
    for _ in range(TRIES):
        tab = Tab(server)
        tab.load(big_file, BIG)
        args = second_args(tab, second, ON_BIG, model_file)
        first = tab.join("generate", *ON_BIG.generate())
        sent = Second(tab, second, args)
        if tab.running(first):
            return tab, first, sent
        # no overlap this time: both end, and the next try starts afresh
        ends.append((str(tab.outcome(first))[:200], str(sent.outcome())[:200]))
        tab.close()
    pytest.fail(f"in {TRIES} tries the Generate ended before the {second} was sent: no overlap to test: {ends}")


@pytest.mark.parametrize("second", SECONDS)
def test_an_action_sent_during_a_generate_waits_for_it_and_then_runs_on_its_text(waiting, big_file, model_file,
                                                                                 second):
    """The session's held actions wait for the Generate and then work on the whole text it made; Stop and a
    training (which hold no turn) are answered beside it; the Generate makes all of its tokens either way."""
    tab, first, sent = generate_then(waiting, second, big_file, model_file)
    try:
        ok, out = sent.outcome()
        # the held actions ran on the text the Generate left: all of its tokens, none taken or added meanwhile
        done = tab.result(first)
        text = tokens(done[1])
        assert generated(done[2]) == NEW and text == ON_BIG.pieces + [(t, "generated") for t, _ in text[-NEW:]]
        if second == "stop":
            assert (ok, out) == (True, ["Stopping…"])  # nothing to stop; the Generate went on to its end
        else:
            check_second(second, ok, out, ON_BIG, text)
        works_after(tab, ON_BIG)
    finally:
        tab.close()


@pytest.mark.parametrize("second", HELD)
def test_a_held_action_that_meets_its_session_busy_is_refused_when_the_wait_runs_out(refusing, big_file, model_file,
                                                                                     second):
    """With no time to wait (DECODER_LAB_BUSY_WAIT_S=0) an action of the session's own sent while its Generate runs
    is refused at the door, its sentence as the answer: the 409 is the server's word that the Generate was still
    going when the action arrived. It changed nothing; sent again once the Generate has ended, it runs."""
    ends = []
    for _ in range(TRIES):
        tab = Tab(refusing)
        tab.load(big_file, BIG)
        args = second_args(tab, second, ON_BIG, model_file)
        first = tab.join("generate", *ON_BIG.generate())
        r = tab.post_join(second, *args)
        if r.status_code != 200:
            break
        # admitted: the Generate had ended already (no overlap); again, afresh
        ends.append((str(tab.outcome(first))[:200], str(tab.outcome(r.json()["event_id"]))[:200]))
        tab.close()
    else:
        pytest.fail(f"in {TRIES} tries the Generate ended before the {second} arrived: no overlap to test: {ends}")
    try:
        assert (r.status_code, r.json()["error"]) == (409, BUSY), r.text[:300]
        done = tab.result(first)
        text = tokens(done[1])
        assert generated(done[2]) == NEW and len(text) == len(ON_BIG.pieces) + NEW  # the refusal took nothing
        ok, out = tab.outcome(tab.join(second, *args))
        check_second(second, ok, out, ON_BIG, text)
    finally:
        tab.close()


@pytest.mark.parametrize("second", SECONDS)
def test_an_action_sent_during_a_training_does_its_own_work_and_the_training_goes_on(waiting, model_file, second):
    """The session's actions run beside its training (a training holds no turn), a second training waits for
    the server's one training lane, and the training goes on until the test stops it."""
    tab = Tab(waiting)
    first = None
    try:
        args = second_args(tab, second, ON_GRAMMAR, model_file)
        first = tab.join("train", *LONG_TRAIN)
        progress = tab.first_frame(first)[1]
        assert progress.startswith("step ") and f"/{MAX_STEPS} " in progress, progress  # it is training
        sent = Second(tab, second, args)
        if second == "stop":  # the second is the Stop: it found the run going, and ended it
            ok, out = sent.outcome()
            assert ok and out[0].startswith("Training stopped by you after "), out
            stopped = out[0]
        else:
            if second == "train":  # one training at a time on the server (its lane): the second waits in the queue
                sent.queued()
                assert tab.running(sent.queued()), "the second training ran while the first was going"
            else:
                ok, out = sent.outcome()
                check_second(second, ok, out, ON_GRAMMAR, None)
            # the run was still going after the second action was queued or answered: only Stop ended it (it
            # cannot end on its own), and the Stop's answer is how it ended only when it found it going
            stopped = tab.direct("stop")[0]
            assert stopped.startswith("Training stopped by you after "), f"the training was not going: {stopped}"
            if second == "train":  # the first's run had ended when the second began: it trains, and finishes
                ok, out = sent.outcome()
                check_second(second, ok, out, ON_GRAMMAR, None)
        assert tab.result(first)[1] == stopped  # the run's own last update says the same
        first = None
        works_after(tab, ON_GRAMMAR)
    finally:
        if first is not None:
            tab.direct("stop")  # never leave a training running: it holds the server's one training lane
        tab.close()


def test_a_cancelled_generate_leaves_its_tokens_and_the_session_usable_at_once(refusing, tmp_path):
    """Cancelled mid-text, the Generate keeps the tokens it made (the session's log lists them, as a session
    file saves them), and the session is free as soon as the cancel is answered: on this server a busy session
    refuses a Step at once, so a Step that is answered met the session free. It goes on from the kept text."""
    piece = Session().entry_for(GRAMMAR).tokenizer.piece
    tab = Tab(refusing)
    try:
        gen = tab.join("generate", *ON_GRAMMAR.generate())
        assert generated(tab.first_frame(gen)[2]) < NEW  # mid-text when the cancel is sent
        tab.cancel("generate", gen)
        until(lambda: not tab.running(gen), "the cancelled Generate's end on the session's stream")
        r = tab.post_join("step", *ON_GRAMMAR.step())
        assert r.status_code == 200, f"the session was still busy after the cancel was answered: {r.text[:300]}"
        step = tab.result(r.json()["event_id"])
        saved = tab.call("export_session", *ON_GRAMMAR.step())[0]
        actions = json.loads(Path(saved["path"]).read_text())["actions"]
        assert [a["do"] for a in actions] == ["generate", "step"] and len(actions[1]["tokens"]) == 1, actions
        kept = actions[0]["tokens"]
        assert 1 <= len(kept) <= NEW  # the cancel ends the Generate at its next update: any number of tokens by then
        assert tokens(step[1]) == ON_GRAMMAR.pieces + [(piece(i), "generated") for i in kept + actions[1]["tokens"]]
        assert generated(step[2]) == len(kept) + 1
    finally:
        tab.close()


def test_session_turn_serialises_and_refuses_when_busy_too_long():
    s = Session()
    order = []
    holding, asking = threading.Event(), threading.Event()

    def first():
        with s.turn():
            order.append("first in")
            holding.set()
            assert asking.wait(timeout=GUARD_S)  # the second asks for the turn while this one holds it
            order.append("first out")

    def second():
        asking.set()
        with s.turn():
            order.append("second")

    a = threading.Thread(target=first)
    a.start()
    assert holding.wait(timeout=GUARD_S)  # a hang guard
    b = threading.Thread(target=second)
    b.start()
    a.join(GUARD_S)
    b.join(GUARD_S)
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
