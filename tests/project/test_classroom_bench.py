"""bench/classroom.py measures what it says: each learner's lesson is the lesson, the same for the same seed,
its calls come from the learner's own address, and the per-action summary counts what happened.

The pure parts run without a server; one class of two learners runs a lesson each against the shared
app server, to hold the lesson's calls to the API as it is (every call answered, none refused). Nothing
here times anything.
"""

from __future__ import annotations

import argparse
import itertools
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from bench.classroom import (
    ACTIONS, STEPS, TARGETS, Model, action_rows, addresses, default_model, run_class, script, think_range, verdict,
)
from bench.classroom_clients import Call, kind, own_addresses

MODEL = Model("grammar (built-in)", 3, 4, ("a b", "b a", " she", " he"))
LESSON = ["select", *["step"] * STEPS, "generate", "head", "inside", "patch", "undo"]


def test_a_learners_class_is_the_same_for_the_same_seed_and_differs_between_learners():
    def clicks(seed, learner):
        return [(r, a.action, a.api, a.args, a.think_s) for r, a in script(seed, learner, MODEL, (2.0, 5.0), 2)]

    assert clicks(0, 3) == clicks(0, 3)
    assert clicks(0, 3) != clicks(0, 4)
    assert clicks(0, 3) != clicks(1, 3)


def test_a_lesson_is_the_lesson_in_order_on_one_text_with_think_times_in_range():
    clicks = list(script(7, 0, MODEL, (2.0, 5.0), 2))
    opened, *lessons = clicks
    assert opened[1].action == "open" and 0 <= opened[1].think_s <= 5.0
    assert [a.action for _, a in lessons] == LESSON * 2
    assert [r for r, _ in lessons] == [0] * len(LESSON) + [1] * len(LESSON)
    assert all(2.0 <= a.think_s <= 5.0 for _, a in lessons)
    for r in (0, 1):
        one = {a.action: a for rr, a in lessons if rr == r}
        steps = [a.args for rr, a in lessons if rr == r and a.action == "step"]
        assert all(s == steps[0] for s in steps)  # one prompt and seed: each Step continues the text
        model, prompt, *_, seed = steps[0][:6]
        assert model == MODEL.name and prompt and one["generate"].args[:6] == steps[0][:6]
        _, layer, head, view = one["head"].args
        assert 0 <= layer < MODEL.layers and 0 <= head < MODEL.heads
        assert one["inside"].args == [layer, head, None, None] and one["undo"].args == [layer, head, view]
        assert one["patch"].args[1:3] == list(MODEL.patch[:2]) and one["patch"].args[4:6] == list(MODEL.patch[2:])
    first, second = ({a.action: a for rr, a in lessons if rr == r}["step"].args for r in (0, 1))
    assert first[5] != second[5]  # a new seed: the second lesson starts a new text


def test_a_class_that_lasts_a_time_goes_on_lesson_after_lesson():
    clicks = list(itertools.islice(script(0, 0, MODEL, (0.0, 0.0), None), 1 + 5 * len(LESSON)))
    assert [a.action for _, a in clicks[1:]] == LESSON * 5 and clicks[-1][0] == 4


def test_learners_have_their_own_addresses_or_one_behind_a_nat():
    own = addresses(300, one_address=False)
    assert own[0] == "127.0.0.2" and len(set(own)) == 300 and "127.0.0.1" not in own
    assert set(addresses(30, one_address=True)) == {"127.0.0.2"}


def test_think_times_are_read_as_low_and_high():
    assert think_range("2,5") == (2.0, 5.0) and think_range("0.5") == (0.5, 0.5)
    with pytest.raises(ValueError):
        think_range("5,2")


def call(action, answer_s, outcome="ok", door_s=0.01, queue_s=0.0, rank=0):
    return Call(0, 0, action, 0.0, answer_s, 0.001, door_s, queue_s, rank, outcome)


def test_the_summary_counts_each_action_its_times_and_its_refusals_by_kind():
    steps = [call("step", s / 100) for s in range(1, 101)]  # 10 ms … 1,000 ms
    calls = [*steps, call("step", 9.0, "session busy", door_s=None, queue_s=None),
             call("step", 9.0, "rate: too many patching sweeps were run"),
             call("step", 0.5, "text ended with <EOS>"),
             call("patch", 2.0, queue_s=1.5, rank=3), call("patch", 3.0, "session busy")]
    rows = action_rows(calls)
    assert [r["action"] for r in rows] == [a for a in ACTIONS if a in ("step", "patch")]
    step, patch = rows
    assert step["calls"] == 103 and step["answer_ms"]["n"] == 100  # the times of the calls answered
    assert step["answer_ms"]["median"] == 505.0 and step["answer_ms"]["max"] == 1000.0
    assert step["errors"] == 2 and step["texts_ended"] == 1
    assert step["refusals"] == {"session busy": 1, "rate: too many patching sweeps were run": 1}
    assert step["door_ms"]["n"] == 100 and step["door_ms"]["median"] == 10.0
    assert patch["queue_ms"]["max"] == 1500.0 and patch["queue_rank_max"] == 3 and patch["errors"] == 1
    met = verdict(rows, peak_mb=400.0)
    assert met["step_p95_ms"]["measured"] == step["answer_ms"]["p95"] and not met["errors"]["met"]
    assert met["memory_mb"]["met"] and met["step_p95_ms"]["target"] == TARGETS["step_p95_ms"]
    assert verdict(action_rows(steps), peak_mb=None)["errors"]["met"]


def test_a_refusal_is_counted_by_its_kind():
    said = {
        "Slow down: too many patching sweeps were run from your address in a short time. Try again in 6 s.":
            "rate: too many patching sweeps were run",
        "Your address has 8 calls waiting or running; one address may have 8 at once": "address queue share "
                                                                                          "(CLIENT_QUEUE)",
        "Your address's earlier calls are still running; one address may have 1": "address workers busy "
                                                                                  "(CLIENT_WORKERS)",
        "This session is still busy with your previous action; try again in a moment.": "session busy",
        "The model ended this text with &lt;EOS&gt;. Undo takes that token back": "text ended with <EOS>",
    }
    assert {text: kind(RuntimeError(text)) for text in said} == said


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = self.client_address[0].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_learners_calls_come_from_its_own_loopback_address_to_the_servers():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)  # as the app: on 127.0.0.1 alone
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        with own_addresses():
            seen = [httpx.get(f"http://{a}:{port}/").text for a in ("127.0.0.7", "127.0.1.4", "127.0.0.1")]
        assert seen == ["127.0.0.7", "127.0.1.4", "127.0.0.1"]
        assert httpx.get(f"http://127.0.0.1:{port}/").text == "127.0.0.1"
        with pytest.raises(httpx.ConnectError):  # put back: 127.0.0.7 is the server's address no more
            httpx.get(f"http://127.0.0.7:{port}/")
    finally:
        server.shutdown()
        server.server_close()


def test_two_learners_take_a_lesson_each_and_every_call_is_answered(app_server):
    args = argparse.Namespace(learners=2, rounds=1, duration=None, think=(0.0, 0.0), seed=0, one_address=False,
                              env=[])
    rows = run_class(app_server, default_model(), args)
    per_action, summary = rows[:-1], rows[-1]
    assert [r["action"] for r in per_action] == list(ACTIONS)
    assert {r["action"]: r["calls"] for r in per_action} == {"open": 2, **{a: 2 * LESSON.count(a) for a in LESSON}}
    assert [r["refusals"] for r in per_action] == [{}] * len(ACTIONS)
    assert summary["action"] == "summary" and summary["calls"] == 2 * (1 + len(LESSON)) and summary["errors"] == 0
    assert summary["server_peak_rss_mb"] > 0
