"""/dla, /composition, /circuits and /atp through the running app (gradio_client against a real server, the
built-in grammar model): /dla's numbers are the lab's for the same text, the others answer their records, and a
bad argument is refused with one sentence."""

from __future__ import annotations

import re

import numpy as np
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from lab.session import Session
from model.generate import Sampling
from tests.support.api import assert_clean_error

GRAMMAR = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
A = "anna found the key . she gave it to tom because he asked"
B = "tom found the key . he gave it to anna because she asked"
REL = 2e-5  # the server's float32 sums against this process's (one thread each; another order is possible)


@pytest.fixture
def client(app_server):
    c = Client(app_server.url, verbose=False)
    c.predict(GRAMMAR, P, 0.0, 0, 1.0, 0, 0, "all", "weights", api_name="/step")
    return c


def refused(c: Client, api_name: str, *args, pattern: str, one: bool = True) -> None:
    with pytest.raises(AppError) as info:
        c.predict(*args, api_name=api_name)
    assert_clean_error(info.value, pattern)
    if one:
        assert not re.search(r"[.!?] +[A-Z]", str(info.value)), f"more than one sentence: {info.value}"


def test_dla_answers_the_labs_numbers(client):
    got = client.predict(" tom", " anna", None, api_name="/dla")
    here = Session()
    here.step(GRAMMAR, P, Sampling(temperature=0.0))
    want = here.circuits.dla(None, " tom", " anna")
    assert got["tokens"] == want.tokens and got["position"] == want.position
    np.testing.assert_allclose(np.array(got["heads"]), want.heads, rtol=REL, atol=REL)
    for name in ("direct_sum", "remainder", "actual"):
        assert got[name] == pytest.approx(getattr(want, name), rel=REL, abs=REL), name
    assert "Direct effect only" in got["direct_only"]


def test_composition_circuits_and_atp_answer_their_records(client):
    comp = client.predict(GRAMMAR, api_name="/composition")
    assert comp["what"] == "head composition" and not comp["stopped"] and comp["top"]["k"]
    L = len(comp["q"])
    assert all(comp["k"][1][0][0][h] is None for h in range(len(comp["k"][0][0][0])))  # later layer not after
    assert L == 3 and comp["summary"].startswith("Strongest pairs")
    heads = client.predict(1, 2, api_name="/circuits")
    assert heads["head_label"] == "L1H2" and isinstance(heads["copying"], float) and heads["qk_tokens"]
    atp = client.predict(GRAMMAR, A, B, "logit_diff", "her", "him", "heads", "denoising", 3, api_name="/atp")
    assert atp["what"] == "attribution patching" and len(atp["verified"]) == 3 and atp["exact_mode"] == "sweep"
    assert atp["metric_a"] - atp["metric_b"] > 1


def test_a_bad_argument_is_one_sentence(client):
    refused(client, "/circuits", 7, 0, pattern="layer")
    refused(client, "/dla", " tom", " tom", None, pattern="same token")
    refused(client, "/atp", GRAMMAR, A, B, "logit_diff", "her", "him", "heads", "denoising", 999, pattern="exactly")
    # the page's own refusal of a model not in the list (lab/session.py), with its hint "Pick one from the list."
    refused(client, "/composition", "no such model", pattern="Unknown model", one=False)
