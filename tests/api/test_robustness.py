"""Robust for anonymous users: hostile model files, server hardening, faults with nothing lost, load.

Complements test_app.py / test_handlers.py / test_checkpoint.py (not repeated here): hostile
checkpoints go through the app's own upload handler with a live session whose state must survive;
the server tests run against the real app on 127.0.0.1. Numbers are printed and written to
`<pytest basetemp>/robustness-counts.json` (copied into tests/ROBUSTNESS.md).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import time
from pathlib import Path

import gradio as gr
import httpx
import pytest
import torch

import app
import model.checkpoint as ckpt_mod
from tests.support.safetensors_bytes import safetensors_join as join, safetensors_split as split
from lab.catalogue.models import BUILTINS
from lab.server import files
from tests.support.server import AppServer
from lab.session import Session
from model.checkpoint import checkpoint_bytes
from model.config import ModelConfig
from model.tokenizers import CharTokenizer
from model.transformer import DecoderLM

GRAMMAR = "grammar (built-in)"
P = BUILTINS.get(GRAMMAR).examples[0]
LEAKS = ("Traceback", 'File "', "/work", "/tmp", ".py", "Something went wrong")


def record(request, name: str, **numbers) -> None:
    path = Path(request.config._tmp_path_factory.getbasetemp()) / "robustness-counts.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = numbers
    path.write_text(json.dumps(data, indent=1, sort_keys=True))
    print(f"[robustness] {name}: {json.dumps(numbers, sort_keys=True)}")


def clean(msg: str) -> str:
    for leak in LEAKS:
        assert leak not in msg, msg
    return msg




# =============================================================== 2. hostile model files (handler)

TOK = CharTokenizer(list("abcdefghij"))




def small_model(**kw) -> DecoderLM:
    torch.manual_seed(0)
    base = dict(vocab_size=TOK.vocab_size, block_size=12, n_layers=2, n_heads=2, d_model=16, init="torch")
    return DecoderLM(ModelConfig(**{**base, **kw})).eval()


GOOD = checkpoint_bytes(small_model(), TOK, {"example_prompt": "abc"})


def with_config(**changes) -> bytes:
    header, body = split(GOOD)
    cfg = json.loads(header["__metadata__"]["config"])
    cfg.update(changes)
    header["__metadata__"]["config"] = json.dumps(cfg)
    return join(header, body)


def with_tensor(name: str, **changes) -> bytes:
    header, body = split(GOOD)
    header[name].update(changes)
    return join(header, body)


def drop_tensor(name: str) -> bytes:
    header, body = split(GOOD)
    del header[name]
    return join(header, body)


def add_tensor() -> bytes:
    header, body = split(GOOD)
    header["extra.weight"] = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    return join(header, body)


def poison(value: float) -> bytes:
    header, body = split(GOOD)
    start = header["tok_emb.weight"]["data_offsets"][0]
    return join(header, body[:start] + struct.pack("<f", value) + body[start + 4 :])


class Evil:
    def __init__(self, canary):
        self.canary = str(canary)

    def __reduce__(self):
        return (os.mkdir, (self.canary,))


def big_header() -> bytes:
    header, body = split(GOOD)
    header["__metadata__"]["padding"] = "x" * (3 * 1024 * 1024)
    return join(header, body)


HOSTILE = {
    "pickle-renamed": (lambda c: pickle.dumps(Evil(c)), r"safetensors"),
    "torch-zip-renamed": ("torch", r"safetensors"),
    "empty": (lambda c: b"", r"8-byte"),
    "header-longer-than-file": (lambda c: struct.pack("<Q", len(GOOD)) + GOOD[8:], r"longer than the file"),
    "header-length-50MB": (lambda c: struct.pack("<Q", 50 * 1024 * 1024) + GOOD[8:], r"header would be"),
    "header-length-2^63": (lambda c: struct.pack("<Q", 2**63) + GOOD[8:], r"header would be"),
    "real-3MB-header": (lambda c: big_header(), r"header would be"),
    "offsets-past-end": (lambda c: with_tensor("tok_emb.weight", data_offsets=[len(GOOD), len(GOOD) + 640]),
                         r"outside the file"),
    "config-d_model-1e6": (lambda c: with_config(d_model=10**6, n_heads=1), r"d_model is 1,000,000, above"),
    "config-layers-1e4": (lambda c: with_config(n_layers=10**4), r"n_layers is 10,000, above"),
    "config-vocab-1e9": (lambda c: with_config(vocab_size=10**9), r"vocab_size is 1,000,000,000, above"),
    "config-params-over-cap": (lambda c: with_config(n_layers=6, d_model=256, n_heads=8, d_ff=1024, vocab_size=4096),
                               r"parameters; the limit is"),
    "config-unknown-field": (lambda c: with_config(evil=1), r"unknown config fields"),
    "missing-tensor": (lambda c: drop_tensor("tok_emb.weight"), r"missing \['tok_emb.weight'\]"),
    "extra-tensor": (lambda c: add_tensor(), r"unexpected \['extra.weight'\]"),
    "dtype-F16": (lambda c: with_tensor("tok_emb.weight", dtype="F16"), r"must be float32"),
    "dtype-I64": (lambda c: with_tensor("tok_emb.weight", dtype="I64"), r"must be float32"),
    "wrong-shape": (lambda c: with_tensor("tok_emb.weight", shape=[16, 11]), r"has shape"),
    "nan-weight": (lambda c: poison(float("nan")), r"NaN or infinite"),
    "inf-weight": (lambda c: poison(float("inf")), r"NaN or infinite"),
    "truncated": (lambda c: GOOD[: len(GOOD) // 2], r"outside the file|truncated|longer than the file"),
    "random-bytes": (lambda c: os.urandom(5000), r"safetensors"),
}
BEFORE_LOAD = {"header-longer-than-file", "header-length-50MB", "header-length-2^63", "real-3MB-header",
               "offsets-past-end", "config-d_model-1e6", "config-layers-1e4", "config-vocab-1e9",
               "config-params-over-cap", "config-unknown-field", "missing-tensor", "extra-tensor", "dtype-F16",
               "dtype-I64", "wrong-shape", "empty", "pickle-renamed", "torch-zip-renamed", "random-bytes"}


@pytest.fixture
def busy_ws():
    """A session with text in progress and one model of its own, selected."""
    ws = Session()
    ok = tmp_ok = Path(files.RUNS) / "robustness-fixture.safetensors"
    tmp_ok.parent.mkdir(parents=True, exist_ok=True)
    tmp_ok.write_bytes(GOOD)
    app.upload_model(ws, str(ok))
    for _ in range(3):
        app.step(ws, GRAMMAR, P, 1.0, 0, 1.0, 1, 0, "all", "weights")
    yield ws
    ws.close()


def state_of(ws: Session):
    return (id(ws.decoder), list(ws.decoder.ids), id(ws.entry), ws.entry.name, list(ws.models), ws.prompt,
            ws.last_step.token_id)


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_model_file_through_upload_handler(case, busy_ws, tmp_path, monkeypatch):
    make, pattern = HOSTILE[case]
    canary = tmp_path / "canary"
    path = tmp_path / f"{case}.safetensors"
    if make == "torch":
        torch.save(Evil(canary), path)
    else:
        path.write_bytes(make(canary))
    loads = []
    real_load = ckpt_mod.st_load
    monkeypatch.setattr(ckpt_mod, "st_load", lambda data: loads.append(len(data)) or real_load(data))
    before = state_of(busy_ws)
    with pytest.raises(gr.Error, match=pattern) as info:
        app.upload_model(busy_ws, str(path))
    clean(info.value.message)
    assert not canary.exists(), "a pickle was executed"
    assert path.exists(), "the handler deleted a file it was given (the path may be someone else's)"
    assert state_of(busy_ws) == before, "the failed upload changed the session"
    if case in BEFORE_LOAD:
        assert loads == [], "tensors were read before the file was refused"
    # the session carries on with the same text
    app.step(busy_ws, GRAMMAR, P, 1.0, 0, 1.0, 1, 0, "all", "weights")
    assert len(busy_ws.decoder.ids) == len(before[1]) + 1


@pytest.mark.parametrize("kw", [dict(pos_encoding="rope", n_layers=3, n_heads=4, d_model=32, activation="swiglu"),
                                dict(pos_encoding="none", norm="post", d_ff=0, tie_weights=True),
                                dict(pos_encoding="sinusoidal", norm="none", activation="relu", block_size=40)])
def test_valid_file_of_other_architecture_is_accepted_and_works_as_that(kw, busy_ws, tmp_path):
    m = small_model(**kw)
    path = tmp_path / "other.safetensors"
    path.write_bytes(checkpoint_bytes(m, TOK, {"example_prompt": "abc"}))
    _, msg, dd = app.upload_model(busy_ws, str(path))
    name = dd["value"]
    assert msg == f"Loaded '{name}'. It is now in the Explore model list." and name == "uploaded: other"
    _, tokens, status, _, attn = app.step(busy_ws, name, "abcj", 0.0, 0, 1.0, 0, 0, "all", "weights")
    c = m.cfg
    assert f"{c.n_layers} layers × {c.n_heads} heads, d_model {c.d_model}, context {c.block_size}" in status
    with torch.inference_mode():
        expected = TOK.piece(int(m(torch.tensor([TOK.encode("abcj")])).logits[0, -1].argmax()))
    assert tokens[-1] == (expected, "generated")


def test_model_trained_in_app_can_be_uploaded_again(tmp_path):
    """Training refuses what the upload checks would refuse, and what it does train loads back."""
    words = [f"w{i}" for i in range(5000)]
    too_varied = " ".join(words) + " " + " ".join(words[:100])
    ws = Session()
    try:
        with pytest.raises(gr.Error, match="too big to save and load again: vocab_size is 5,002"):
            list(app.train_model(ws, "text", too_varied, None, "word", 1, 1, 8, 0, "learned", "pre", "gelu", 0.0, 1,
                                 3e-3, 0))
        fine = " ".join(words[:3000]) + " " + " ".join(words[:100])
        out = list(app.train_model(ws, "text", fine, None, "word", 1, 1, 8, 0, "learned", "pre", "gelu", 0.0, 1,
                                   3e-3, 0))
        path = tmp_path / "mine.safetensors"
        shutil.copy(out[-1][4]["value"], path)
        other = Session()
        _, message, _ = app.upload_model(other, str(path))
        assert "Loaded" in message and len(other.models) == 1
    finally:
        ws.close()


# ================================================================== 3. run directories, cleanup


def test_sweep_runs_deletes_old_dirs_and_keeps_new(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    monkeypatch.setattr(files, "RUNS", runs)
    files.sweep_runs()  # no directory yet: nothing to do, no error
    old, new = runs / "old", runs / "new"
    for d in (old, new):
        d.mkdir(parents=True)
        (d / "m.safetensors").write_bytes(GOOD)
    stale = time.time() - 2 * 3600
    os.utime(old, (stale, stale))
    files.sweep_runs()
    assert not old.exists() and new.exists() and (new / "m.safetensors").exists()
    files.sweep_runs(max_age_s=0)
    assert not new.exists()


def test_cleanup_session_stops_training_and_deletes_files(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "RUNS", tmp_path / "runs")
    ws = Session()
    done = list(app.train_model(ws, "toy", "", None, "char", 1, 1, 8, 0, "learned", "pre", "gelu", 0.0, 2, 3e-3, 0))
    assert Path(done[-1][4]["value"]).exists() and ws.run_dir.exists()
    gen = app.train_model(ws, "sort", "", None, "char", 2, 4, 64, 256, "learned", "pre", "gelu", 0.0, 2000, 3e-3, 0)
    first = next(gen)
    assert first[1].startswith("step ")
    at_close = ws.run.step
    ws.close()  # what gr.State's delete_callback does when the session expires
    assert ws.run.stop.is_set()
    list(gen)  # the loop sees the stop at its next step, and runs no step more
    assert ws.run.done and ws.run.step == at_close < 2000
    assert not ws.run_dir.exists(), "the run directory came back after cleanup"
    assert not any((tmp_path / "runs").iterdir())


# ========================================================================== 3. server hardening


def _get(url: str) -> tuple[int, str]:
    r = httpx.get(url, timeout=20)
    return r.status_code, r.text


@pytest.mark.parametrize("route", ["monitoring", "monitoring/summary", "gradio_api/monitoring",
                                   "gradio_api/monitoring/summary"])
def test_monitoring_is_not_available(app_server, route):
    status, body = _get(app_server.url + route)
    assert status != 200 or ("queue" not in body.lower() and "duration" not in body.lower()), (status, body[:200])


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def test_uploads_over_limit_refused_for_any_field_and_multiple_files(app_server):
    url = app_server.url + "gradio_api/upload"
    cache = Path(app_server.env["GRADIO_TEMP_DIR"])
    before = _dir_bytes(cache)
    big = b"\0" * (20 * 1024 * 1024 + 1)
    small = b"abc" * 100
    cases = {
        "other-field": {"files": [("model", ("big.safetensors", big, "application/octet-stream"))]},
        "many-files": {"files": [("files", ("a.txt", small, "text/plain")),
                                 ("files", ("big.txt", big, "text/plain"))]},
        "many-small-fields": {"files": [("files", ("a.txt", small, "text/plain")),
                                        ("other", ("b.txt", big, "text/plain"))]},
    }
    for name, kw in cases.items():
        r = httpx.post(url, timeout=60, **kw)
        assert r.status_code == 413, (name, r.status_code, r.text[:200])
        clean(r.text)
    assert _dir_bytes(cache) - before < 1024 * 1024, "a refused upload was kept in the cache"


def test_server_errors_show_no_internal_details(app_server):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    c = Client(app_server.url, verbose=False)
    hostile = [
        ((GRAMMAR, ["not", "text"], 1.0, 0, 1.0, 0, 0, "all", "weights"), "/step"),
        ((GRAMMAR, P, "hot", 0, 1.0, 0, 0, "all", "weights"), "/step"),
        ((GRAMMAR, P, 1.0, 0, 1.0, 0, 0, {"path": "/etc/passwd"}, "weights"), "/step"),
        (({"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}},), "/upload_model"),
        (("text", "", {"path": str(Path(app.__file__)), "meta": {"_type": "gradio.FileData"}}, "char", 1, 1, 8, 0,
          "learned", "pre", "gelu", 0.0, 1, 0.003, 0), "/train"),
    ]
    for args, api in hostile:
        with pytest.raises(AppError) as info:
            c.predict(*args, api_name=api)
        clean(str(info.value))
    # raw HTTP junk to the queue
    for body in (b"{", b'{"fn_index": 999999, "data": [], "session_hash": "x"}', b"[]" * 1000):
        r = httpx.post(app_server.url + "gradio_api/queue/join", content=body,
                       headers={"content-type": "application/json"}, timeout=20)
        assert r.status_code >= 400
        for leak in ("Traceback", 'File "', "/work/"):
            assert leak not in r.text, r.text[:300]
    assert c.predict(GRAMMAR, P, 1.0, 0, 1.0, 0, 0, "all", "weights", api_name="/step")[0]


# ================================================================== 4. faults with nothing lost

ROOT = Path(__file__).resolve().parents[2]


# A training may ask for more steps than any machine takes within the tests' waits (DECODER_LAB_MAX_STEPS): a run
# of that many steps ends only by its time limit, a Stop or its client going away, whatever the machine's speed.
ENDLESS = 10**9


@pytest.fixture(scope="module")
def short_server(tmp_path_factory):
    """An app with a 3 s training limit, endless runs allowed, and a 20 s session TTL (env overrides read by app.py)."""
    tmp = tmp_path_factory.mktemp("short")
    env = {"DECODER_LAB_TRAIN_SECONDS": "3", "DECODER_LAB_MAX_STEPS": str(ENDLESS), "DECODER_LAB_STATE_TTL": "20"}
    server = AppServer(env, tmp).start()
    yield server
    server.stop()


def train_args(steps=30, layers=1, heads=2, d_model=32, d_ff=64, corpus="sort"):
    return (corpus, "", None, "char", layers, heads, d_model, d_ff, "learned", "pre", "gelu", 0.0, steps, 0.003, 0)


def wait_first_output(job, timeout=300.0) -> float:
    """Wait for a job's first output (the timeout is a hang guard only); the seconds it took."""
    t0 = time.perf_counter()
    while not job.outputs():
        if job.done():
            raise AssertionError(f"job ended without output: {job.status()}")
        assert time.perf_counter() - t0 < timeout, job.status()
        time.sleep(0.02)
    return time.perf_counter() - t0


@pytest.mark.slow
def test_training_time_limit_ends_cleanly_and_keeps_the_model(short_server, request):
    from gradio_client import Client

    c = Client(short_server.url, verbose=False, httpx_kwargs={"timeout": 300})  # a hang guard on each request
    t0 = time.perf_counter()
    # a run of a billion steps: only the 3 s limit can end it, on any machine
    status, _, dd, download, _ = c.predict(*train_args(steps=ENDLESS, layers=2, heads=4, d_model=64, d_ff=256),
                                        api_name="/train")
    took = time.perf_counter() - t0
    assert status.startswith("Training hit the time limit after "), status
    steps_done = int(status.split("after ")[1].split(" steps")[0])  # how many steps 3 s hold: the machine's own
    name = dd["value"]
    tokens, st, _, _ = c.predict(name, "503124=", 0.0, 0, 1.0, 0, 0, "all", "weights", api_name="/step")
    assert f"{name}: 2 layers × 4 heads" in st and len(tokens) == 8
    assert download["value"].endswith(".safetensors")
    record(request, "fault.time_limit", limit_s=3, steps_done=steps_done, wall_s=round(took, 1))


@pytest.fixture(scope="module")
def long_server(tmp_path_factory):
    """An app whose endless runs (ENDLESS steps) end only by their 1 h limit, far beyond any wait of its tests."""
    env = {"DECODER_LAB_TRAIN_SECONDS": "3600", "DECODER_LAB_MAX_STEPS": str(ENDLESS)}
    server = AppServer(env, tmp_path_factory.mktemp("long")).start()
    yield server
    server.stop()


@pytest.mark.slow
def test_disconnect_during_training_frees_the_slot(long_server, request):
    """An abandoned run must not hold the single training slot. Left alone, it would hold it for an hour: it asks
    for ENDLESS steps, which no machine trains before the server's 1 h limit. A new run that gets the slot and
    finishes within the hang guards (at most 300 s each, far below the hour) proves the disconnect freed it."""
    from gradio_client import Client

    guard = {"timeout": 300}  # each request's hang guard (gradio_client's own is 5 s)
    a = Client(long_server.url, verbose=False, httpx_kwargs=guard)
    job = a.submit("grammar", "", None, "word", 4, 4, 128, 512, "learned", "pre", "gelu", 0.0, ENDLESS, 0.003, 0,
                   api_name="/train")
    wait_first_output(job)
    assert job.outputs()[-1][0].startswith("step "), job.outputs()[-1][0]  # it is training, and cannot finish
    t0 = time.perf_counter()
    job.cancel()
    a.close()  # the tab goes away
    b = Client(long_server.url, verbose=False, httpx_kwargs=guard)
    job_b = b.submit(*train_args(steps=20), api_name="/train")
    try:
        status, _, dd, _, _ = job_b.result(timeout=300)
    except TimeoutError:
        pytest.fail(f"the new run had not ended after 300 s: the abandoned run still holds the slot ({job_b.status()})")
    freed = time.perf_counter() - t0
    assert status.startswith("Training finished after 20 steps"), status
    assert b.predict(GRAMMAR, P, 1.0, 0, 1.0, 0, 0, "all", "weights", api_name="/step")[0]
    record(request, "fault.disconnect", slot_free_and_new_run_done_s=round(freed, 2))


@pytest.mark.slow
def test_short_load_isolation_and_latency(short_server, request):
    """20 sessions for ~8 s, mixing /step, /generate and tiny /train (the full version: python -m bench.stress)."""
    from bench import stress

    result = stress.run_load(short_server.url, sessions=20, seconds=8, pid=short_server.proc.pid)
    record(request, "load.short", **{k: result[k] for k in ("requests", "errors", "queue_full", "mismatches",
                                                             "p50_ms", "p95_ms", "trains", "rss_before_mb",
                                                             "rss_peak_mb")})
    assert result["errors"] == 0, result["error_samples"]
    assert result["mismatches"] == 0, result["mismatch_samples"]
    assert result["requests"] >= 20


@pytest.mark.slow
def test_restart_while_a_session_is_open(short_server, browser, request):
    """Stop the app and start it again on the same port: old clients get a clean outcome; the page recovers."""
    from gradio_client import Client

    c = Client(short_server.url, verbose=False)
    assert c.predict(GRAMMAR, P, 1.0, 0, 1.0, 0, 0, "all", "weights", api_name="/step")[0]
    context = browser.new_context()
    page = context.new_page()
    page.goto(short_server.url, wait_until="load")
    page.wait_for_selector("#attention .js-plotly-plot", timeout=60_000)
    page.click("#step")
    page.wait_for_function("document.querySelectorAll('#tokens .textfield .token').length > 0", timeout=120_000)

    short_server.stop()
    t0 = time.perf_counter()
    again = AppServer()
    again.port, again.url, again.env = short_server.port, short_server.url, dict(short_server.env)
    again.log_path = short_server.log_path.with_name(f"restart-{short_server.port}.log")
    again.start()
    restart_s = time.perf_counter() - t0
    try:
        try:
            tokens = c.predict(GRAMMAR, P, 1.0, 0, 1.0, 0, 0, "all", "weights", api_name="/step")[0]
            outcome = "fresh session"
            assert len(tokens) == 13  # a new session: the prompt plus one token, nothing from before
        except Exception as exc:  # noqa: BLE001 - any clear client-side error is acceptable, not a hang or crash
            outcome = f"error: {type(exc).__name__}"
            clean(str(exc)[:2000])
        c2 = Client(again.url, verbose=False)
        assert c2.predict(GRAMMAR, P, 1.0, 0, 1.0, 0, 0, "all", "weights", api_name="/step")[0]
        # the open page: after a reload the app is there and Step works
        # (the page may reload itself when it notices the new server: wait for the app, do not race it)
        has_app = "() => document.body !== null && document.body.innerText.includes('Generate')"
        page.wait_for_function(has_app, timeout=60_000)
        page.wait_for_selector("#step", timeout=60_000)
        page.click("#step")  # the stale page talks to the new server: a message or a fresh text, never blank
        time.sleep(2)
        toasts = page.eval_on_selector_all(".toast-body", "els => els.map(e => e.innerText)")
        page.wait_for_function(has_app, timeout=60_000)
        stale = ("toast: " + " ".join(toasts)[:120]) if toasts else "no toast"
        page.reload(wait_until="load")
        page.wait_for_selector("#attention .js-plotly-plot", timeout=60_000)
        page.click("#step")
        page.wait_for_function("document.querySelectorAll('#tokens .textfield .token').length === 13",
                               timeout=120_000)
        record(request, "fault.restart", restart_s=round(restart_s, 1), old_client=outcome, stale_page=stale)
    finally:
        context.close()
        again.stop()
