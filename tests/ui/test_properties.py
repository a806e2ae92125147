"""Property-based robustness: any input an anonymous person can send gets a result or a clear gr.Error.

Two layers:
- the handlers called directly with a fresh `lab.session.Session` (fast, many cases, NaN and
  non-JSON values included);
- a smaller number through `gradio_client` against the real server on 127.0.0.1, with the server's
  resident memory (from /proc/PID/status) read before and after.

A clear error is a `gr.Error` (an `AppError` through the API) whose message has no traceback, no
source location and no filesystem path, and is not the generic "Something went wrong" that marks an
unexpected exception inside the app. How many cases ran is printed and written to
`<pytest basetemp>/robustness-counts.json` (numbers copied into tests/ROBUSTNESS.md).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path

import gradio as gr
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import app
from lab.catalogue.models import BUILTINS
from lab.limits import ATTENTION_VIEWS, MAX_PROMPT_CHARS
from tests.support.server import rss_mb
from lab.session import Session

GRAMMAR = "grammar (built-in)"
SORT = "sort digits (built-in)"
MODELS = list(BUILTINS.names)
LEAKS = ("Traceback", 'File "', "/work", "/tmp", "Something went wrong")
SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck))  # seeding: the profile in conftest.py

# --------------------------------------------------------------------------------- helpers


def record(request, name: str, **numbers) -> None:
    """Print the counts and add them to <basetemp>/robustness-counts.json."""
    base = request.config._tmp_path_factory.getbasetemp()
    path = Path(base) / "robustness-counts.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = numbers
    path.write_text(json.dumps(data, indent=1, sort_keys=True))
    print(f"[robustness] {name}: {json.dumps(numbers, sort_keys=True)}")


def run_recorded(request, name: str, prop, outcomes: dict, *, need_both: bool = True) -> None:
    """Run a hypothesis property, record how many cases ran and how they ended, and (by default)
    require that both accepted and refused inputs were drawn, so the test exercised both paths."""
    t0 = time.perf_counter()
    prop()
    record(request, name, cases=sum(outcomes.values()), ok=outcomes["ok"], refused=outcomes["error"],
           seconds=round(time.perf_counter() - t0, 1))
    if need_both:
        assert outcomes["ok"] > 0 and outcomes["error"] > 0


def check_message(msg: str, inputs) -> None:
    shown = repr(inputs)
    for leak in LEAKS:
        assert leak not in msg or leak in shown, f"leak {leak!r} in {msg[:300]!r}"
    assert len(msg) <= 4 * MAX_PROMPT_CHARS + 1000, f"message of {len(msg)} characters"


def call(fn, *args):
    """('ok', result) or ('error', message); anything but gr.Error propagates and fails the test."""
    try:
        out = fn(*args)
        if hasattr(out, "__next__"):
            out = list(out)
        return "ok", out
    except gr.Error as e:
        check_message(e.message, args[1:])
        return "error", e.message


def snapshot(ws: Session):
    d = ws.decoder
    return (id(d), None if d is None else list(d.ids), ws.prompt, list(ws.models), id(ws.entry))


# ------------------------------------------------------------------------------ strategies

# words and characters the built-in models know, so that some cases reach the model
GRAMMAR_WORDS = BUILTINS.get(GRAMMAR).examples[0].split()
unicode_text = st.text(st.characters(codec="utf-8"), max_size=80)  # any code point but surrogates
prompts = st.one_of(
    st.just(""),
    st.text(" \t\n\r\x0b\x0c\u00a0\u2028\u3000", max_size=20),  # whitespace only
    st.text(st.characters(categories=("Cc", "Cf", "Zs", "So", "Co")), max_size=40),  # control, format, emoji…
    unicode_text,
    st.lists(st.sampled_from(GRAMMAR_WORDS), min_size=1, max_size=30).map(" ".join),
    st.text("0123456789=", min_size=1, max_size=40),
    st.tuples(st.sampled_from(GRAMMAR_WORDS), unicode_text).map(" ".join),
    st.integers(MAX_PROMPT_CHARS - 5, MAX_PROMPT_CHARS + 5).map(lambda n: ("he " * n)[:n]),
)
junk = st.one_of(st.none(), st.booleans(), st.text(max_size=12), st.just("1e400"), st.just([1]))
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.floats(-1, 3),
    st.integers(-2, 60),
)
any_number = st.one_of(numbers, junk)
temperature = st.one_of(st.floats(0, 2), any_number)
top_k = st.one_of(st.integers(0, 50), any_number)
top_p = st.one_of(st.floats(0.05, 1), any_number)
seed = st.one_of(st.integers(0, 2**31 - 1), any_number)
model_names = st.one_of(st.sampled_from(MODELS), st.sampled_from(MODELS), st.text(max_size=30), st.none())
layers_ = st.one_of(st.just(0), st.integers(-1, 5), junk)
heads_ = st.one_of(st.just("all"), st.integers(-1, 9), junk)
views = st.one_of(st.sampled_from(ATTENTION_VIEWS), junk)


# ----------------------------------------------------------------------- handlers: explore

STEP_CASES = 150


VALID = dict(
    model=st.sampled_from([GRAMMAR, GRAMMAR, SORT, *MODELS]),
    t=st.floats(0, 2), k=st.integers(0, 50), p=st.floats(0.05, 1), s=st.integers(0, 2**31 - 1),
    layer=st.just(0), head=st.sampled_from(["all", 0, 1]), view=st.sampled_from(ATTENTION_VIEWS),
)
HOSTILE = dict(model=model_names, t=temperature, k=top_k, p=top_p, s=seed, layer=layers_, head=heads_, view=views)


def draw_args(data) -> dict:
    """Valid values except for a random few fields (at most 2), which may be anything."""
    bad = data.draw(st.sets(st.sampled_from(sorted(HOSTILE) + ["prompt"] * 4), max_size=2), label="hostile fields")
    args = {k: data.draw((HOSTILE if k in bad else VALID)[k], label=k) for k in VALID}
    if "prompt" in bad:
        args["prompt"] = data.draw(prompts, label="prompt")
    elif args["model"] == GRAMMAR:
        args["prompt"] = data.draw(st.lists(st.sampled_from(GRAMMAR_WORDS), min_size=1, max_size=140).map(" ".join))
    else:
        example = BUILTINS.get(args["model"]).examples[0] if args["model"] in BUILTINS.names else "x"
        args["prompt"] = example[: data.draw(st.integers(1, len(example)), label="prompt length")]
    return args


def test_step_handler_any_prompt_and_sampling(request):
    ws = Session()
    outcomes: Counter = Counter()

    @settings(max_examples=STEP_CASES, **SETTINGS)
    @given(st.data())
    def prop(data):
        a = draw_args(data)
        prompt = a["prompt"]
        before = snapshot(ws)
        kind, out = call(app.step, ws, a["model"], prompt, a["t"], a["k"], a["p"], a["s"], a["layer"], a["head"],
                         a["view"])
        outcomes[kind] += 1
        if kind == "ok":
            _, tokens, status, _, _ = out
            vocab = ws.entry.tokenizer.vocab_size
            assert all(0 <= i < vocab for i in ws.decoder.ids) and tokens and isinstance(status, str)
        elif "already has" not in out:
            assert snapshot(ws) == before, "a refused step changed the session"

    run_recorded(request, "handlers.step", prop, outcomes)


def test_step_handler_refuses_nan_and_huge_numbers_explicitly():
    ws = Session()
    p = BUILTINS.get(GRAMMAR).examples[0]
    for args in [(math.nan, 0, 1.0, 0), (1.0, math.nan, 1.0, 0), (1.0, 0, math.nan, 0), (1.0, 0, 1.0, math.nan),
                 (math.inf, 0, 1.0, 0), (1e308, 0, 1.0, 0), (1.0, 10**30, 1.0, 0), (1.0, 0, 1.0, 2**64),
                 (-0.0 - 1e-300, 0, 1.0, 0)]:
        with pytest.raises(gr.Error) as info:
            app.step(ws, GRAMMAR, p, *args, 0, "all", "weights")
        check_message(info.value.message, args)
        assert ws.decoder is None
    assert app.step(ws, GRAMMAR, p, -0.0, 0, 1.0, 0, 0, "all", "weights")[1]  # -0.0 is a valid greedy 0


GEN_CASES = 40


def test_generate_handler_any_prompt_and_max_new(request):
    ws = Session()
    outcomes: Counter = Counter()
    max_new = st.one_of(st.integers(1, 6), st.integers(-3, 0), st.integers(257, 10**12), st.floats(allow_nan=True),
                        junk)

    @settings(max_examples=GEN_CASES, **SETTINGS)
    @given(st.data())
    def prop(data):
        a = draw_args(data)
        n = data.draw(max_new if data.draw(st.integers(0, 3), label="bad max_new?") == 0 else st.integers(1, 6))
        prompt = a["prompt"]
        before = ws.decoder
        had = 0 if before is None else len(before.ids)
        kind, out = call(app.generate, ws, a["model"], prompt, a["t"], a["k"], a["p"], a["s"], n, a["layer"],
                         a["head"], a["view"])
        outcomes[kind] += 1
        if kind == "ok":
            assert out, "generate yielded nothing"
            # Generate goes on with the same text (same decoder) or starts again from the prompt
            start = had if ws.decoder is before else ws.decoder.prompt_len
            assert 1 <= len(ws.decoder.ids) - start <= int(n)

    run_recorded(request, "handlers.generate", prop, outcomes, need_both=False)


# -------------------------------------------------------------------------- handlers: train

TRAIN_CASES = 45
small_int = lambda lo, hi: st.one_of(st.integers(lo, hi), st.integers(lo, hi), any_number)  # noqa: E731


def test_train_handler_any_architecture(request):
    """Layers/heads/d_model/d_ff/steps/lr/dropout/pos/norm/activation/tokenizer, valid or not (steps tiny)."""
    outcomes: Counter = Counter()
    errors: Counter = Counter()

    valid = dict(
        corpus=st.sampled_from(["sort", "toy", "copy", "sort", "toy"]), tok=st.sampled_from(["char", "word", "bpe"]),
        layers=st.integers(1, 4), heads=st.integers(1, 4), d_model=st.sampled_from([8, 16, 24, 32, 48, 64, 128]),
        d_ff=st.sampled_from([0, 16, 64, 512]), pos=st.sampled_from(["learned", "sinusoidal", "rope", "none"]),
        norm=st.sampled_from(["pre", "post", "none"]), act=st.sampled_from(["gelu", "relu", "swiglu"]),
        dropout=st.sampled_from([0.0, 0.1, 0.5]), steps=st.integers(1, 3), lr=st.sampled_from([3e-3, 0.1, 1e-5]),
        seed=st.integers(0, 2**31 - 1),
    )
    hostile = dict(
        corpus=st.one_of(st.sampled_from(["text", "nope", ""]), junk),
        tok=junk, layers=st.one_of(st.sampled_from([0, 5, -1, 2.5, "3"]), any_number),
        heads=st.one_of(st.sampled_from([0, 3, 5, "2"]), any_number),
        d_model=st.one_of(st.sampled_from([12, 30, 36, 6, 129, 4096, 2**40]), any_number),
        d_ff=st.one_of(st.sampled_from([513, -1, 10**9]), any_number),
        pos=st.one_of(st.sampled_from(["rope", "ROPE", "alibi", ""]), junk),
        norm=st.one_of(st.sampled_from(["PRE", "layer"]), junk), act=st.one_of(st.sampled_from(["tanh"]), junk),
        dropout=st.one_of(st.sampled_from([0.51, -0.1, 1.0]), any_number),
        steps=st.one_of(st.sampled_from([0, 2001, 10**9, "2", 2.5, -1]), any_number),
        lr=st.one_of(st.sampled_from([1e-6, 0.2, 0.0]), any_number), seed=st.one_of(st.just(-1), any_number),
    )

    @settings(max_examples=TRAIN_CASES, **SETTINGS)
    @given(st.data())
    def prop(data):
        bad = data.draw(st.sets(st.sampled_from(sorted(hostile)), max_size=2), label="hostile fields")
        v = {k: data.draw((hostile if k in bad else valid)[k], label=k) for k in valid}
        corpus, tok, layers, heads, d_model, d_ff, pos, norm, act, dropout, steps, lr, seed = v.values()
        ws = Session()
        try:
            kind, out = call(app.train_model, ws, corpus, "", None, tok, layers, heads, d_model, d_ff, pos, norm, act,
                             dropout, steps, lr, seed)
            outcomes[kind] += 1
            if kind == "ok":
                final = out[-1]
                assert final[1].startswith("Training finished after ") and ws.run.done
                assert final[3]["value"] in ws.models and Path(final[4]["value"]).exists()
            else:
                errors[out.split(" ")[0]] += 1
                assert ws.models == {} and ws.run is None, "a refused training changed the session"
        finally:
            ws.close()

    run_recorded(request, "handlers.train_architecture", prop, outcomes)


@pytest.mark.parametrize(
    "layers,heads,d_model,pos,fragment",
    [
        (1, 3, 16, "learned", "must be divisible by n_heads"),
        (1, 4, 12, "rope", "RoPE rotates pairs of dimensions"),
        (1, 1, 8, "sinusoidal", None),  # valid: even d_model
        (2, 4, 40, "rope", None),  # valid: head size 10
    ],
)
def test_train_invalid_combinations_are_clear(layers, heads, d_model, pos, fragment):
    ws = Session()
    try:
        args = (ws, "toy", "", None, "char", layers, heads, d_model, 0, pos, "pre", "gelu", 0.0, 1, 3e-3, 0)
        if fragment is None:
            assert list(app.train_model(*args))[-1][1].startswith("Training finished after 1 steps")
        else:
            with pytest.raises(gr.Error, match=fragment) as info:
                list(app.train_model(*args))
            check_message(info.value.message, args)
    finally:
        ws.close()


TEXT_CASES = 35
_plain = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=40)
text_files = st.one_of(
    st.binary(max_size=2048),  # arbitrary bytes
    st.just(b""),
    st.sampled_from([b"a", b"\n", b"\x00", b"\xff", "é".encode()]),  # one character
    _plain.map(lambda s: (s * (1100 // len(s) + 2)).encode("utf-8")),  # valid UTF-8, ≥ 1 KB
    _plain.map(lambda s: (s * (1100 // len(s) + 2)).encode("utf-8") + b"\x00"),  # NUL byte
    _plain.map(lambda s: ("café " + s) * 300).map(lambda s: s.encode("latin-1", "replace")),  # latin-1
    _plain.map(lambda s: b"\xef\xbb\xbf" + ("line " + s + "\r\n").encode() * 200),  # BOM + CRLF
    st.integers(1_200_001, 1_200_100).map(lambda n: b"ab " * (n // 3 + 1)),  # over the limit
)


def test_train_handler_any_text_file(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("texts")
    outcomes: Counter = Counter()
    counter = iter(range(10**9))

    @settings(max_examples=TEXT_CASES, **SETTINGS)
    @given(data=text_files, tok=st.sampled_from(["char", "word", "bpe"]))
    def prop(data, tok):
        path = tmp / f"upload-{next(counter)}.txt"
        path.write_bytes(data)
        ws = Session()
        try:
            kind, out = call(app.train_model, ws, "text", "", str(path), tok, 1, 1, 8, 0, "learned", "pre", "gelu",
                             0.0, 1, 3e-3, 0)
            outcomes[kind] += 1
            if kind == "ok":
                assert out[-1][1].startswith("Training finished after 1 steps")
            else:
                assert ws.models == {}
            assert path.exists(), "the handler deleted a file it was given (it may be someone else's)"
        finally:
            ws.close()

    run_recorded(request, "handlers.train_text_file", prop, outcomes)


# ------------------------------------------------------------------------- through the server

API_CASES = 40




json_floats = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.floats(-1, 3), st.integers(-(2**53), 2**53))


@pytest.mark.slow
def test_api_any_prompt_and_sampling_and_bounded_memory(app_server, request):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    pid = app_server.proc.pid
    client = Client(app_server.url, verbose=False)
    client.predict(GRAMMAR, BUILTINS.get(GRAMMAR).examples[0], 1.0, 0, 1.0, 0, 0, "all", "weights", api_name="/step")
    rss0 = rss_mb(pid)
    outcomes: Counter = Counter()
    latencies: list[float] = []

    api_prompts = st.one_of(prompts, st.text(st.characters(codec="utf-8"), min_size=2001, max_size=2100))

    api_hostile = dict(t=json_floats, k=json_floats, p=json_floats, s=json_floats, prompt=api_prompts)

    @settings(max_examples=API_CASES, **SETTINGS)
    @given(st.data(), st.booleans())
    def prop(data, use_generate):
        bad = data.draw(st.sets(st.sampled_from(["t", "k", "p", "s", "prompt", "prompt"]), max_size=2))
        a = draw_args(data)
        for k in bad:
            a[k] = data.draw(api_hostile[k], label=k)
        for k in ("t", "k", "p", "s"):  # JSON has no infinity or NaN (test_fuzz sends those as raw HTTP)
            if isinstance(a[k], float) and not math.isfinite(a[k]):
                a[k] = data.draw(json_floats, label=k + " (JSON)")
        model = a["model"] if a["model"] in MODELS else GRAMMAR
        args = (model, a["prompt"], a["t"], a["k"], a["p"], a["s"])
        t0 = time.perf_counter()
        try:
            if use_generate:
                client.predict(*args, 3, 0, "all", "weights", api_name="/generate")
            else:
                client.predict(*args, 0, "all", "weights", api_name="/step")
            outcomes["ok"] += 1
        except AppError as e:
            check_message(str(e), args)
            outcomes["error"] += 1
        latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    prop()
    # one explicit 10 MB prompt (not through hypothesis)
    t1 = time.perf_counter()
    with pytest.raises(AppError) as info:
        client.predict(GRAMMAR, "he " * 3_500_000, 1.0, 0, 1.0, 0, 0, "all", "weights", api_name="/step")
    ten_mb_s = time.perf_counter() - t1
    assert "the limit is 2,000" in str(info.value)
    check_message(str(info.value), ())
    # the server is still fine and its memory is bounded
    assert client.predict(GRAMMAR, BUILTINS.get(GRAMMAR).examples[0], 1.0, 0, 1.0, 0, 0, "all", "weights",
                          api_name="/step")[0]
    rss1 = rss_mb(pid)
    latencies.sort()
    record(request, "api.step_generate", cases=sum(outcomes.values()), ok=outcomes["ok"], refused=outcomes["error"],
           p50_ms=round(1000 * latencies[len(latencies) // 2]), p95_ms=round(1000 * latencies[int(len(latencies) * .95)]),
           ten_mb_prompt_s=round(ten_mb_s, 2), rss_before_mb=round(rss0), rss_after_mb=round(rss1),
           seconds=round(time.perf_counter() - t0, 1))
    assert rss1 - rss0 < 200, (rss0, rss1)
    assert outcomes["ok"] > 0 and outcomes["error"] > 0
    assert "unexpected error" not in app_server.output()
