"""/inside through the running app (gradio_client against a real server): one cell of the Explore text,
its numbers held to the float64 path from the weights and to the session computed here, the head tools'
settings applied, and its refusals (a sentence, nothing changed)."""

from __future__ import annotations

import numpy as np
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from lab import inside
from lab.catalogue.models import BUILTINS
from lab.session import Session
from model.generate import Sampling
from model.interventions import Intervention
from tests.support.api import assert_clean_error
from tests.support.inside_ref import reference

GRAMMAR = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
GREEDY = (0.0, 0, 1.0, 0)
REL = 2e-5  # float32 (one torch thread on the server) against float64


@pytest.fixture
def client(app_server):
    c = Client(app_server.url, verbose=False)
    c.predict(GRAMMAR, P, *GREEDY, 1, 0, "weights", api_name="/step")
    return c


def close(got, want, what):
    got = np.array([np.nan if g is None else g for g in np.ravel(np.asarray(got, dtype=object))], dtype=np.float64)
    want = np.ravel(np.where(np.isinf(want), np.nan, np.asarray(want, dtype=np.float64)))
    assert np.array_equal(np.isnan(got), np.isnan(want)), what
    diff = np.abs(np.nan_to_num(got) - np.nan_to_num(want)).max()
    assert diff <= REL * max(1.0, np.abs(np.nan_to_num(want)).max()), f"{what}: {diff:.3g}"


def test_a_cell_through_the_api_is_the_models_arithmetic(client):
    data = client.predict(1, 0, 11, 9, api_name="/inside")
    assert (data["query_token"], data["key_token"], round(data["weight"], 3)) == ("he", "tom", 0.756)
    entry = BUILTINS.get(GRAMMAR)
    ids = entry.tokenizer.encode(P)
    ids.append(entry.tokenizer.encode("asked")[0])  # the greedy Step's token
    assert data["tokens"] == [entry.tokenizer.piece(i) for i in ids]
    r = reference(entry.model, ids)[1]
    for name, want in (("x_i", r.x[11]), ("q", r.q[0, 11]), ("k", r.k[0, 9]), ("products", r.q[0, 11] * r.k[0, 9]),
                       ("scores_row", r.scores[0, 11]), ("softmax_row", r.weights[0, 11]), ("v", r.v[0]),
                       ("weighted", r.weights[0, 11] @ r.v[0]), ("head_out", r.heads_out[0, 11]),
                       ("residual_after", r.x[11] + r.attn_out[11])):
        close(data[name], want, name)
    close(data["dot"], r.raw[0, 11, 9], "dot")
    close(data["exp_sum"], np.exp(r.scores[0, 11] - r.scores[0, 11].max()).sum(), "exp sum")
    assert data["formulas"]["softmax_row"] == "a_ij = exp(s_ij − m) / Σ_j exp(s_ij − m)"


def test_defaults_and_the_head_tools_settings(client):
    client.predict(["L1H0"], "zero", False, 1, 0, api_name="/ablate")
    data = client.predict(1, 0, None, None, api_name="/inside")  # the selected token (the last) and its strongest key
    assert data["query"] == 12 and data["key"] == int(np.argmax(data["used_row"]))
    assert data["active"]["changed"] and data["active"]["ablation"] == "zero"
    assert "L1H0 zeroed" in data["active"]["what"]
    assert not any(data["head_out"]) and not any(data["head_value"])
    s = Session()
    s.step(GRAMMAR, P, Sampling(temperature=0.0))
    s.heads.set_ablation(["L1H0"], "zero", False)
    here = inside.cell(s.text, s.heads.settings, 1, 0, None, None)
    close(data["attn_out"], here["attn_out"], "attention output with L1H0 zeroed")
    ids = s.decoder.window
    r = reference(s.text.entry.model, ids, Intervention(((1, 0),), "zero"))[2]  # a later layer sees the change
    later = client.predict(2, 1, 12, 3, api_name="/inside")
    close(later["x_i"], r.x[12], "layer 2 input after the ablation")


@pytest.mark.parametrize("args, sentence", [
    ((3, 0, 11, 9), "layer must be a whole number between 0 and 2"),
    ((1, 9, 11, 9), "head must be a whole number between 0 and 3"),
    ((1, 0, 40, 9), "token position must be a whole number between 0 and 12"),
    ((1, 0, 11, 2.5), "key position must be a whole number"),
    ((1, 0, "zzz", 9), "token position must be a whole number"),
    (([1], 0, 11, 9), "layer must be a whole number"),
])
def test_refusals_name_the_value_and_change_nothing(client, args, sentence):
    before = client.predict(1, 0, 11, 9, api_name="/inside")
    with pytest.raises(AppError) as info:
        client.predict(*args, api_name="/inside")
    assert_clean_error(info.value, sentence)
    assert client.predict(1, 0, 11, 9, api_name="/inside") == before


def test_before_any_step_it_says_so(app_server):
    with pytest.raises(AppError) as info:
        Client(app_server.url, verbose=False).predict(0, 0, 0, 0, api_name="/inside")
    assert_clean_error(info.value, "Press Step first")
