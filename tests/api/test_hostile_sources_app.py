"""The app started with hostile models beside a good one (`python app.py --model SRC`, and
DECODER_LAB_MODELS): it starts, lists them all, answers a hostile one with the sentence the command
lines print (tests/engine/test_hostile_model_files.py) when it is chosen, and serves the good one.
A source no file can have (a name of 3,000 characters) stops the start with one line and status 2.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from tests.support.api import assert_clean_error
from tests.support.hostile_models import CASES, build_sources
from tests.support.server import APP, OFFLINE_ENV, ROOT, AppServer

import transformers  # noqa: F401 - the reference: a missing package fails collection, never skips

GIVEN = ("config-400-digits", "tensors-overlap", "tokenizer-regex-split", "config-links-out")  # with --model
FROM_ENV = ("nanogpt-million-layers", "zip-bomb")  # in DECODER_LAB_MODELS


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile-app")
    sources = build_sources(tmp / "models")
    args = [a for case in GIVEN for a in ("--model", sources[case][0])] + ["--model", sources["good"][0]]
    env = {"DECODER_LAB_MODELS": ";".join(sources[case][0] for case in FROM_ENV),
           "DECODER_LAB_MODEL_HASHES": str(tmp / "hashes.json"), "HF_HUB_CACHE": str(tmp / "hub")}
    server = AppServer(env, tmp, args=args).start()
    yield server, sources
    server.stop()


def choices(client: Client) -> list[str]:
    api = client.view_api(return_format="dict", print_info=False)
    enum = api["named_endpoints"]["/select_model"]["parameters"][0]["type"]["enum"]
    return [c[0] if isinstance(c, (list, tuple)) else c for c in enum]


def test_the_app_starts_and_answers_each_hostile_model_with_its_sentence(app):
    server, _ = app
    client = Client(server.url, verbose=False)
    external = choices(client)[-(len(GIVEN) + 1 + len(FROM_ENV)):]  # after the built-ins: --model, then the variable
    hostile = dict(zip(GIVEN + ("good",) + FROM_ENV, external))
    for case in GIVEN + FROM_ENV:
        with pytest.raises(AppError) as info:
            client.predict(hostile[case], api_name="/select_model")
        assert_clean_error(info.value, re.escape(CASES[case][2]))
    summary = client.predict(hostile["good"], api_name="/select_model")[1]
    assert "GPT-2" in str(summary) and "2 layers × 4 heads" in str(summary)
    tokens, *_ = client.predict(hostile["good"], "Once upon", 0.0, 0, 1.0, 0, 0, "all", "weights", api_name="/step")
    assert len(tokens) >= 2
    log = server.output()
    assert "Traceback" not in log and "Something went wrong" not in log


def test_a_source_no_file_can_have_stops_the_start_with_one_line(app):
    _, sources = app
    done = subprocess.run([sys.executable, str(APP), "--model", sources["name-of-3000-characters"][0]], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, **OFFLINE_ENV})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python app.py: error: "), done.stderr
    assert CASES["name-of-3000-characters"][2] in lines[0]
