"""The public API under a stateful fuzzer: any endpoint, any value for any argument, in any order.

A hypothesis `RuleBasedStateMachine` drives bench/fuzz's `Fuzzer` against the running app (the
`app_server` fixture): the endpoints and their parameters come from `Client.view_api`, so an endpoint
added later is fuzzed too. Hypothesis chooses the rules' order and a seed for each rule's choices.
Each example opens twin sessions; its rules send calls through
gradio_client or as hand-made HTTP (NaN, infinity, FileData naming server paths, the wrong number of
arguments) and upload hostile checkpoints (mutated tokenizer, config and meta JSON); before them, once
per run, a long training on a third session is stopped. Every call is checked (bench/fuzz/__init__.py says how):

* it succeeds, or it is refused with a clear message (not the generic error, no file path, Python
  type or exception name, traceback or cache hash, at most 400 characters);
* a refusal changes nothing: every success is replayed on the twin session, which never saw the
  refused calls, and must give the same answer; after a refusal the fuzzer often probes at once;
* the server prints no Python traceback for it (read from the server's log right after the call);
* it answers before the fuzzer's hang guard (a minute a call) gives up on it.

Defects are collected over the whole run and reported together at the end, each kind with a count
and one example (the call and what came back); `FUZZ_FAILFAST=1` fails at the first one instead, in
hypothesis's step-by-step report. Bounded by a number of calls (`FUZZ_CALLS`), however long they
take on a busy machine; the long run is `python -m bench.fuzz`.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from bench import fuzz

CALLS = int(os.environ.get("FUZZ_CALLS", "80"))  # checked calls (twin replays not counted)
FAILFAST = os.environ.get("FUZZ_FAILFAST") == "1"
HANG_GUARD_S = 1800.0  # only for a run that stopped answering: no pace is asked of the machine

# What the app cannot change, so that this test is about the app: (pattern on the defect kind, the
# reach it applies to, or None for any, and why). Only defects in gradio's own code are ever allowed.
# What the app cannot change, so that this test is about the app: (pattern on the defect kind, the
# reach it applies to, or None for any, and why). Only defects in gradio's own code may ever be
# listed here; none is needed today (ui/http.py answers malformed calls before gradio's routes).
ALLOWED: list[tuple[str, str | None, str]] = []


def allowed(defect: dict) -> str | None:
    if defect["origin"] == "app":
        return None  # the app's own messages, state, tracebacks and hangs are never excused
    for pattern, reach, why in ALLOWED:
        if re.search(pattern, defect["kind"]) and (reach is None or defect["reach"] == reach):
            return why
    return None


SEED = st.integers(0, 2**32 - 1)
RULES_RUN = itertools.count()


def draw(seed: int) -> fuzz.RandomDraw:
    """A rule's choices come from one seed that hypothesis draws (the fuzzer's choices depend on what
    the server answered, and hypothesis requires a rule to draw the same way every time it runs),
    mixed with a count of rules run, because hypothesis draws the same few seeds (0, 1, ...) often."""
    return fuzz.RandomDraw(random.Random(f"{seed}/{next(RULES_RUN)}"))


def report(summary: dict, bad: list[dict], excused: list[tuple[dict, str]]) -> str:
    lines = [f"{summary['calls']} calls ({summary['twin_replays']} replays on the twin) in {summary['wall_s']} s: "
             + ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items())]
    for title, rows in (("DEFECTS", [(d, "") for d in bad]), ("allowed (gradio's)", excused)):
        if rows:
            lines.append(f"{title}:")
        for d, why in rows:
            ex = d["example"]
            lines.append(f"  {d['count']:4d} × [{d['class']}, {d['origin']}, via {d['reach']}] {d['kind']}")
            lines.append(f"         e.g. {fuzz.shorten(ex.get('call', ''), 400)}")
            for key in ("got", "why", "exception", "difference", "refused_calls_before", "served_file", "status"):
                if ex.get(key):
                    lines.append(f"         {key}: {fuzz.shorten(json.dumps(ex[key], ensure_ascii=False), 400)}")
            if why:
                lines.append(f"         allowed: {why}")
    return "\n".join(lines)


def test_fuzz_the_api(app_server, tmp_path):
    server_tmp = app_server.env.get("TMPDIR")
    fz = fuzz.Fuzzer(app_server.url, Path(app_server.log_path), [server_tmp] if server_tmp else [],
                     workdir=tmp_path)
    guard = time.monotonic() + HANG_GUARD_S
    state = {"hung": False}

    def calls_left() -> bool:
        if time.monotonic() > guard:
            state["hung"] = True
        return fz.stats.calls < CALLS and not state["hung"]

    class APIMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            if calls_left():
                fz.new_pair()  # each example: a fresh pair of twin sessions

        @rule(seed=SEED)
        def act(self, seed):  # the fuzzer's own mix (bench/fuzz/fuzzer.py, Fuzzer.act)
            if calls_left():
                fz.act(draw(seed))

        @rule(seed=SEED)
        def call(self, seed):  # any endpoint: all valid, one bad argument, or chaos
            if calls_left():
                fz.random_call(draw(seed))

        @rule(seed=SEED)
        def valid_calls(self, seed):  # deeper states: long texts, own models
            if calls_left():
                fz.valid_calls(draw(seed))

        @rule(seed=SEED)
        def raw_call(self, seed):
            if calls_left():
                fz.random_call(draw(seed), transport="raw")

        @rule(seed=SEED)
        def hostile_upload(self, seed):
            if calls_left():
                fz.upload(draw(seed))

        @invariant()
        def no_defect(self):
            if FAILFAST:
                bad = [d for d in fz.stats.summary()["defects"] if not allowed(d)]
                assert not bad, report(fz.stats.summary(), bad, [])

    try:
        fz.train_stop(draw(0))  # once per run, first: a long training on a third session, stopped
        run_state_machine_as_test(APIMachine, settings=settings(
            max_examples=200, stateful_step_count=40, deadline=None, database=None, phases=[Phase.generate],
            suppress_health_check=list(HealthCheck)))
    finally:
        fz.close()
    summary = fz.stats.summary()
    bad = [d for d in summary["defects"] if not allowed(d)]
    excused = [(d, allowed(d)) for d in summary["defects"] if allowed(d)]
    text = report(summary, bad, excused)
    print("\n[fuzz] " + text)
    print("[fuzz] " + json.dumps({"calls": summary["calls"], "outcomes": summary["outcomes"],
                                  "per_mode": summary["per_mode"],
                                  "state_changes_on_refusal": summary["state_changes_on_refusal"],
                                  "calls_per_s": summary["calls_per_s"]}))
    assert not state["hung"], f"hang guard: {HANG_GUARD_S:.0f} s passed before {CALLS} calls\n{text}"
    assert summary["calls"] >= CALLS, text  # hypothesis ran out of steps first: raise max_examples
    assert not bad, text


# ------------------------------------------------------------------- the fuzzer's own checks


def test_the_twin_check_catches_a_change_that_only_one_session_saw(app_server, tmp_path):
    """Not vacuous: one Step that reaches session A alone (what a refused call must never do to
    the text) is caught by the next probe, and blamed on the refused call before it."""
    fz = fuzz.Fuzzer(app_server.url, Path(app_server.log_path), workdir=tmp_path)
    try:
        model, prompt = "grammar (built-in)", fuzz.BUILTINS["grammar (built-in)"].prompts[0]
        draw0 = fuzz.RandomDraw(random.Random(0))
        step = fz.with_args(fz.build(fz.endpoints["/step"], draw0, mode="valid"), "valid", "", model_name=model,
                            prompt=prompt, temperature=1.0, seed=3, layer=0, head="all", view="weights")
        assert fz.run(step) == "ok"  # both twins: the prompt and one token
        assert fz.a.call(step).status == "ok"  # A alone: one more
        fz.suspects.append("(a refused call)")
        assert fz.probe(draw0) == "state-changed"
        assert fz.stats.state_changes_on_refusal == 1
        assert fz.run(step) == "ok"  # a fresh pair of twins agrees again
    finally:
        fz.close()


def test_leak_check_and_log_reader():
    dirs = ["/tmp/pytest-of-x/app0"]
    assert fuzz.leaks("Unknown model '/etc/passwd'. Pick one from the list.", '["/etc/passwd"]', dirs) == []
    assert fuzz.leaks("cannot read /tmp/pytest-of-x/app0/gradio/abc/x.bin", "[]", dirs)
    assert fuzz.leaks("Value: '' (type: <class 'str'>) is not in the list of choices", "['']", dirs)
    assert fuzz.leaks("does not know these words: '/', 'tmp', 'pytest', '-'", "['/etc/passwd']", dirs)
    assert fuzz.leaks("got " + "1" * 400, "[1]", dirs) == ["404 characters long"]
    assert fuzz.leaks("unsupported: KeyError in step", "[]", dirs)
    log = "\n".join([
        "INFO:decoder_lab:refused step: x",
        "Traceback (most recent call last):",
        '  File "/x/site-packages/gradio/components/slider.py", line 3, in preprocess',
        "    bad()",
        "TypeError: '<' not supported",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "/x/site-packages/gradio/queueing.py", line 870, in process_events',
        "    f()",
        "gradio.exceptions.ComponentProcessingError: Could not preprocess",
        "Traceback (most recent call last):",
        '  File "/x/site-packages/gradio/queueing.py", line 870, in process_events',
    ])
    tbs, rest = fuzz.LogWatch.parse(log + "\n")
    assert [(t.exc.split(":")[0], t.raised_in, t.printed_by, t.origin, t.refusal) for t in tbs] == [
        ("TypeError", "gradio/components/slider.py:preprocess", "gradio/queueing.py:process_events", "gradio", False)]
    assert rest.startswith("Traceback (most recent call last):")  # unfinished: read again with the rest
