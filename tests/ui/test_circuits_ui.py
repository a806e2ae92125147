"""The Circuits tab's handlers called directly (no server): each draws its figures from the session's record,
answers the record's numbers, streams its long job with a working Stop, and refuses bad values with one
sentence that changes nothing."""

from __future__ import annotations

import base64
import json
import re

import gradio as gr
import numpy as np
import pytest

import ui.circuits as ui
from lab.catalogue.models import BUILTINS
from lab.circuits_records import COMPOSITION, DIRECT_ONLY
from lab.session import Session
from model.generate import Sampling

GRAMMAR = "grammar (built-in)"
PROMPT = "anna found the key . she gave it to tom because he"
A = "anna found the key . she gave it to tom because he asked"
B = "tom found the key . he gave it to anna because she asked"


@pytest.fixture(scope="module")
def session() -> Session:
    s = Session()
    s.step(GRAMMAR, PROMPT, Sampling(temperature=0.0))
    return s


def spec(plot) -> dict:
    return json.loads(plot.plot)


def array(z) -> np.ndarray:
    """A trace's z as sent (a typed array, or nested lists)."""
    if isinstance(z, dict):
        shape = tuple(int(n) for n in str(z["shape"]).split(","))
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"])).reshape(shape)
    return np.asarray(z, dtype=np.float64)


def one_sentence_refusal(call, pattern: str) -> str:
    with pytest.raises(gr.Error) as info:
        call()
    msg = info.value.message
    assert re.search(pattern, msg), msg
    assert not re.search(r"[.!?] +[A-Z]", msg), f"more than one sentence: {msg!r}"
    assert "Traceback" not in msg and "Something went wrong" not in msg
    return msg


def test_dla_draws_the_records_heads_and_says_sum_against_actual(session):
    plot, note = ui.show_dla(session, "tom", "anna")
    r = session.circuits.last["dla"]
    figure = spec(plot)
    assert figure["layout"]["meta"]["viz"] == "dla_map" and figure["layout"]["meta"]["pick"] == "head"
    np.testing.assert_allclose(array(figure["data"][0]["z"]), r.heads, rtol=1e-6, atol=1e-7)
    assert DIRECT_ONLY in note and f"actual {r.label} {r.actual:+.4f}" in note
    assert f"{r.direct_sum:+.4f}" in note and abs(r.gap) < 1e-4
    answer = ui.dla_api(session, " tom", " anna")  # the API's answer: the same record's numbers
    assert answer["heads"] == [[float(v) for v in row] for row in r.heads]
    assert answer["actual"] == r.actual and answer["direct_sum"] == r.direct_sum
    assert answer["position"] == r.position == len(session.decoder.window) - 1


def test_composition_streams_progress_and_stop_ends_it(session):
    entry = BUILTINS.get(GRAMMAR)
    COMPOSITION.forget(entry.model)
    steps = ui.run_composition(session, GRAMMAR, "k")
    first = next(steps)  # a progress: the job waits for the next ask, so Stop lands before its next step
    assert "<progress" in first[0] and all(u is gr.skip() or u == gr.skip() for u in first[1:])
    assert session.circuits.running
    assert "Stopping" in ui.stop_circuits(session)
    last = list(steps)[-1]
    assert "stopped" in last[0] and "Stopped after" in last[1]
    assert not session.circuits.running and ui.stop_circuits(session) == gr.skip()


def test_composition_ends_with_the_map_and_the_strongest_pairs(session):
    COMPOSITION.forget(BUILTINS.get(GRAMMAR).model)
    progress, note, plot, pairs = list(ui.run_composition(session, GRAMMAR, "k"))[-1]
    r = session.circuits.last["composition"]
    assert not r.stopped and "computed now" in note
    assert spec(plot)["layout"]["meta"]["viz"] == "composition_map"
    best = r.top["k"][0]
    assert f"1. {best.name}: {best.score:.3f}" in pairs
    again = ui.composition_api(session, GRAMMAR)  # the API's: read from the cache, the same numbers
    assert again["k"] == r.to_json()["k"] and again["top"] == r.to_json()["top"]
    q_plot, q_pairs = ui.composition_kind(session, "q")
    assert "Q-composition" in q_pairs and spec(q_plot)["layout"]["meta"]["viz"] == "composition_map"


def test_one_heads_circuits_draw_the_ov_table_spectrum_and_qk_map(session):
    note, ov, spectrum, qk = ui.show_circuits(session, 1, 2)
    r = session.circuits.last["circuits"]
    assert (r.layer, r.head) == (1, 2) and f"copying score {r.copying:+.2f}" in note
    for plot in (ov, spectrum, qk):
        assert spec(plot)["data"], spec(plot)["layout"].get("meta")
    answer = ui.circuits_api(session, 1, 2)
    assert answer["copying"] == r.copying and answer["qk_tokens"] == r.qk_tokens


def test_atp_streams_to_the_scatter_and_the_maps(session):
    *_, last = ui.run_atp(session, GRAMMAR, A, B, "logit_diff", "her", "him", "heads", "denoising", 3)
    progress, note, scatter, maps = last
    r = session.circuits.last["atp"]
    assert "done" in progress and r.summary() in note and len(r.verified) == 3
    assert spec(scatter)["data"] and spec(maps)["data"]
    assert abs(r.metric_a - r.metric_b) > 1  # the pair tells her from him


def test_a_dla_head_clicked_is_outlined_and_opens_inside_one_cell_at_the_selected_token(session):
    ui.show_dla(session, "tom", "anna")
    plot, note = ui.open_dla_head(session, "1,2")
    r = session.circuits.last["dla"]
    assert spec(plot)["layout"]["meta"]["selected"] == [1, 2]
    assert "L1H2" in note and "Inside one cell" in note and f"{r.heads[1, 2]:+.3f}" in note
    panel, header, table, *rest = ui.inside_for_head(session, "1,2", True)
    *figures, layer, head, query, key, matrices = rest
    want = session.inside.cell(1, 2)  # the selected token's row, at the key it gives the largest share
    assert panel == gr.update(open=True) and "Layer 1, head 2" in header and len(figures) == 6
    assert (layer, head, query, key) == (1, 2, want["query"], want["key"]) == (1, 2, r.position, want["key"])
    m = spec(matrices)["layout"]["meta"]  # the matrices section is open: the head's matrices, the cell outlined
    assert (m["viz"], m["layer"], m["head"], m["query"], m["key"]) == ("inside_matrices", 1, 2, query, key)
    assert ui.inside_for_head(session, "1,2")[-1] == gr.skip()  # closed: not drawn
    one_sentence_refusal(lambda: ui.open_dla_head(session, "9,0"), "Click a head's cell")
    one_sentence_refusal(lambda: ui.inside_for_head(session, "1"), "Click a head's cell")


def test_a_composition_pair_clicked_opens_the_writing_heads_circuits_and_names_the_pair(session):
    list(ui.run_composition(session, GRAMMAR, "k"))
    r = session.circuits.last["composition"]
    assert ui.OPEN_PAIR_HINT in ui.pairs_list(r, "k")
    layer, head, note, plot, head_note, ov, spectrum, qk = ui.open_pair(session, "k,0,1,1,2")
    assert (layer, head) == (0, 1) and "L0H1 → L1H2" in note and f"{r.k[0, 1, 1, 2]:.3f}" in note
    assert spec(plot)["layout"]["meta"]["selected"] == [0, 1, 1, 2]
    assert (session.circuits.last["circuits"].layer, session.circuits.last["circuits"].head) == (0, 1)
    assert all(spec(f)["layout"]["title"]["text"].startswith("L0H1:") for f in (ov, spectrum, qk))
    for bad in ("k,1,0,0,1", "k,1,0,1,0", "x,0,1,1,2", "k,0,1,1", "k,0,1,3,9", None):
        one_sentence_refusal(lambda bad=bad: ui.open_pair(session, bad), "Click a cell of the composition map")
    assert session.circuits.last["circuits"].head == 1  # a refusal opened nothing


def test_downloads_hold_the_last_records(session):
    ui.show_dla(session, "tom", "anna")
    path = ui.download_circuits(session, "dla", "json")
    data = json.loads(open(path, encoding="utf-8").read())
    assert data["actual"] == session.circuits.last["dla"].actual


def test_refusals_are_one_sentence_and_change_nothing(session):
    fresh = Session()
    one_sentence_refusal(lambda: ui.show_dla(fresh, "tom", None), r"(?i)step|text")
    one_sentence_refusal(lambda: ui.download_circuits(fresh, "atp", "csv"), "Run attribution patching first")
    before = session.circuits.last["dla"]
    one_sentence_refusal(lambda: ui.show_dla(session, "tom", "tom"), "same token")
    one_sentence_refusal(lambda: ui.show_circuits(session, 9, 0), "layer")
    one_sentence_refusal(lambda: ui.composition_kind(session, "x"), "kind")
    one_sentence_refusal(lambda: ui.download_circuits(session, "dla", "xml"), "csv or json")
    one_sentence_refusal(lambda: list(ui.run_atp(session, GRAMMAR, A, B, "logit_diff", "her", "him", "nothing",
                                                 "denoising", 3)), "patch")
    assert session.circuits.last["dla"] is before and not session.circuits.running
