"""The server-wide model budget seen from outside, scaled down from `python -m bench.memory_budget`.

A server with a 62 MiB budget for people's own models (`DECODER_LAB_MEMORY_MB=62`), behind a pretend
proxy so that each visitor is its own client (X-Forwarded-For), with its real rate limits. Eight
visitors, one after another, each upload a ~20 MB model (at the checkpoint limits) twice, and all
of them stay active (`IDLE_S` is 300 s, far longer than the test): the budget holds three such
models, so the first three uploads go in and every later one is refused with "the server is
full", and nothing else goes wrong. Then every visitor that got a model in can still Step on it: the
budget leaves room beside the three 20 MB models for their three texts (~1.5 MB reserved each: attention,
scores, key/value cache and distributions), and not for a fourth model.

Memory: the server's RSS (its process tree) may grow over its idle RSS by at most the budget plus
`MARGIN_MB`: what the first uploads and Steps load once (torch kernels, the figure code), two
uploads in flight (each reads its 19 MB file and builds its 19 MB model before the budget can
refuse it), eight short texts (~1.5 MB each) and the allocator's slack.
"""

from __future__ import annotations

import time
import urllib.request

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from bench.clients import Sampler
from bench.memory_budget import address, kind, model_files
from tests.support.server import AppServer, rss_mb

BUDGET_MB = 62
MARGIN_MB = 150
VISITORS = 8
UPLOADS = 2


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Start the server, let every visitor upload twice, then Step; the record of what happened."""
    tmp = tmp_path_factory.mktemp("memory-budget")
    (path,), prompt, nbytes = model_files(tmp)
    # the whole server's budget is what this test is about: one address may take all of it here (the
    # per-address share has its own tests, tests/lab/test_shares.py)
    env = {"DECODER_LAB_RATE_SCALE": "1", "DECODER_LAB_BEHIND_PROXY": "1", "DECODER_LAB_MEMORY_MB": str(BUDGET_MB),
           "DECODER_LAB_CLIENT_MEMORY_MB": str(BUDGET_MB)}
    server = AppServer(env, tmp).start()
    rec = {"nbytes": nbytes, "accepted": [], "refused": [], "errors": [], "steps": {}}
    try:
        urllib.request.urlopen(server.url, timeout=10).read()
        time.sleep(2)
        rec["idle"] = rss_mb(server.pid, tree=True)
        sampler = Sampler(lambda: rss_mb(server.pid, tree=True), every=0.2)
        sampler.start()
        clients = []
        for i in range(VISITORS):
            c = Client(server.url, verbose=False, download_files=False, headers={"X-Forwarded-For": address(i)})
            clients.append(c)
            for _ in range(UPLOADS):
                try:
                    _status, model = c.predict(handle_file(str(path)), api_name="/upload_model")
                except AppError as exc:
                    rec["refused"].append((i, str(exc)))
                    continue
                except Exception as exc:  # noqa: BLE001 - asserted below
                    rec["errors"].append((i, repr(exc)))
                    continue
                model = model.get("value") if isinstance(model, dict) else model
                rec["accepted"].append((i, model))
        for i, model in rec["accepted"]:  # after everyone uploaded: the accepted still have their models
            try:
                rec["steps"][(i, model)] = clients[i].predict(model, prompt, 0.8, 0, 1.0, 0, 0, "all", "weights",
                                                              api_name="/step")[0]
            except Exception as exc:  # noqa: BLE001
                rec["steps"][(i, model)] = exc
        time.sleep(1)
        rec["samples"] = [*sampler.stop(), rss_mb(server.pid, tree=True)]
        for c in clients:
            c.close()
        rec["log"] = server.output()
    finally:
        server.stop()
    return rec


@pytest.mark.slow
def test_uploads_beyond_the_model_budget_are_refused_as_server_full(run):
    fits = BUDGET_MB * 2**20 // run["nbytes"]
    assert fits == 3  # the arithmetic this test is built on: three 19 MB models in 60 MB
    assert not run["errors"], run["errors"]
    assert [i for i, _ in run["accepted"]] == [0, 0, 1]  # first come, first served
    assert len(run["refused"]) == VISITORS * UPLOADS - fits
    assert all(kind(m) == "full" for _, m in run["refused"]), {m for _, m in run["refused"]}
    assert "Traceback" not in run["log"] and "unexpected error" not in run["log"]


@pytest.mark.slow
def test_every_accepted_visitor_can_still_step_on_its_model(run):
    assert len(run["steps"]) == len(run["accepted"]) == 3
    for (i, model), tokens in run["steps"].items():
        assert isinstance(tokens, list) and tokens, (i, model, tokens)


@pytest.mark.slow
def test_server_memory_stays_under_the_budget_plus_a_margin(run):
    peak = max(run["samples"])
    growth = peak - run["idle"]
    assert growth <= BUDGET_MB + MARGIN_MB, (
        f"RSS grew {growth:.0f} MB over idle {run['idle']:.0f} MB (peak {peak:.0f} MB); "
        f"allowed {BUDGET_MB} + {MARGIN_MB} MB")
