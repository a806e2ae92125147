"""The Patching part's handlers (ui/patching.py) called directly: what the page shows is the lab's sweep,
Stop ends a sweep after its batch, a click on a head's cell opens that head, and refusals change nothing."""

from __future__ import annotations

import json

import gradio as gr
import numpy as np
import pytest

from lab import patching
from lab.session import Session
from ui import patching as ui_patching
from viz import decode_array

GRAMMAR = "grammar (built-in)"
A = "anna found the key . she gave it to tom because he asked"
B = "tom found the key . he gave it to anna because she asked"


def figure(plot) -> dict:
    return json.loads(plot.plot)


def sweep(session: Session, what: str = "heads", direction: str = "denoising") -> list:
    return list(ui_patching.run_patching(session, GRAMMAR, A, B, "logit_diff", "her", "him", what, direction))


def test_a_head_sweep_shows_the_labs_numbers_summary_and_metric():
    s = Session()
    *_, (progress, note, plot, head_plot, data) = sweep(s)
    r = Session().sweeps.run(GRAMMAR, A, B, "logit_diff", "her", "him", "heads", "denoising")
    fig = figure(plot)
    z = decode_array(fig["data"][0]["z"]).astype(np.float64)
    np.testing.assert_allclose(z, r.values, rtol=1e-6)  # float32 on the wire
    assert fig["layout"]["meta"]["best"][0] == [1, 0]
    assert "12 / 12 patched runs" in progress
    assert r.summary() in note and note.count("L1H0 restores") == 1
    assert f"{r.setup.clean:.3f} on A, {r.setup.corrupted:.3f} on B" in note
    assert "her/him difference restored" in fig["layout"]["title"]["text"]
    assert data["values"] == r.to_json()["values"] and data["summary"] == r.summary()
    assert "Click a head" in json.dumps(figure(head_plot))


def test_noising_names_its_own_ends_and_scale():
    s = Session()
    *_, (_, note, plot, _, _) = sweep(s, "heads", "noising")
    fig = figure(plot)
    bar = fig["data"][0]["colorbar"]
    labels = dict(zip(bar["tickvals"], bar["ticktext"]))
    assert labels[0.0] == "0 = A" and labels[1.0] == "1 = B" and bar["title"]["text"] == "share made"
    assert "L1H0 makes" in note


def test_stop_ends_the_sweep_after_its_batch_and_the_map_says_so():
    s = Session()
    updates = ui_patching.run_patching(s, GRAMMAR, A, B, "logit_diff", "her", "him", "resid", "denoising")
    first = next(updates)  # the first batch's progress: the embedding's row, 13 positions, of 4 rows
    assert "13 / 52 patched runs" in first[0]
    assert "Stopping" in ui_patching.stop_patching(s)
    *_, (progress, note, plot, _, data) = list(updates)
    assert "stopped: 13 / 52" in progress and "Stopped after 13 of 52" in note
    fig = figure(plot)
    z = decode_array(fig["data"][0]["z"]).astype(np.float64)
    assert np.isfinite(z[0]).all() and np.isnan(z[1:]).all()  # only the first row was computed
    assert sum(a["text"] == "–" for a in fig["layout"]["annotations"]) == 39
    assert data["stopped"] is True
    assert ui_patching.stop_patching(s) == gr.skip()  # nothing runs any more


def test_a_click_on_a_head_opens_it_on_both_prompts():
    s = Session()
    sweep(s)
    out = ui_patching.open_patched_head(s, "1,0", A, B, "all layers")
    layer, head, view, cmp_layer, diff, _, _, _, patch_map, pair = out
    assert (layer, head, view, cmp_layer) == (1, 0, "weights", 1)
    c = s.heads.compare(GRAMMAR, A, B)
    pair_fig = figure(pair)
    assert pair_fig["layout"]["title"]["text"].startswith("L1H0 (102 % restored)")
    assert [(p["layer"], p["head"]) for p in pair_fig["layout"]["meta"]["panels"]] == [(1, 0), (1, 0)]
    assert c.weights_a[1][0].shape == (13, 13)
    np.testing.assert_allclose(c.weights_b[1][0] - c.weights_a[1][0], c.diff[1][0], atol=1e-6)
    diff_fig = figure(diff)
    assert any("head 0 · 102 % restored" in a["text"] for a in diff_fig["layout"]["annotations"])
    assert figure(patch_map)["layout"]["meta"]["selected"] == [1, 0]


@pytest.mark.parametrize("pick, prompts, fragment", [
    ("1,0", (A, "tom found the key . he gave it to anna because she went"), "prompts changed"),
    ("9,0", (A, B), "Click a cell"),
    ("x", (A, B), "Click a cell"),
])
def test_clicks_that_cannot_open_a_head_are_refused(pick, prompts, fragment):
    s = Session()
    sweep(s)
    with pytest.raises(gr.Error, match=fragment):
        ui_patching.open_patched_head(s, pick, *prompts, "layer")


def test_a_click_needs_a_head_sweep_and_refusals_keep_the_last_sweep():
    s = Session()
    with pytest.raises(gr.Error, match="head outputs first"):
        ui_patching.open_patched_head(s, "1,0", A, B, "layer")
    sweep(s)
    with pytest.raises(gr.Error, match="same number of tokens"):
        list(ui_patching.run_patching(s, GRAMMAR, A, "tom found it", "logit_diff", "her", "him", "heads", "denoising"))
    with pytest.raises(gr.Error, match="single token"):
        list(ui_patching.run_patching(s, GRAMMAR, A, B, "logit_diff", "her mother", "him", "heads", "denoising"))
    assert ui_patching.open_patched_head(s, "1,0", A, B, "layer")[0] == 1  # the head sweep is still there
    sweep(s, "mlp")
    with pytest.raises(gr.Error, match="head outputs first"):
        ui_patching.open_patched_head(s, "1,0", A, B, "layer")


def test_minimal_pairs_bring_their_answers_and_a_new_model_clears_the_part():
    pair = "tom found the key . he gave it to anna because\u241eanna found the key . she gave it to tom because"
    s = Session()
    assert ui_patching.pair_answers(s, GRAMMAR, pair) == ("she", "he")
    assert ui_patching.pair_answers(s, GRAMMAR, "anna found the key . she\u241etom found the key . he") == (
        gr.skip(), gr.skip())
    answer, other, progress, note, *_ = ui_patching.model_switched(s, "sort digits (built-in)")
    assert (answer, other, note) == ("", "", "") and "No sweep yet" in progress
    assert ui_patching.model_switched(s, GRAMMAR)[:2] == ("her", "him")


def test_the_maps_numbers_download_as_csv_and_json():
    s = Session()
    with pytest.raises(gr.Error, match="Run patching first"):
        ui_patching.download_patching(s, "csv")
    *_, (_, _, _, _, data) = sweep(s)
    csv_path = ui_patching.download_patching(s, "csv")
    lines = open(csv_path, encoding="utf-8-sig").read().splitlines()
    assert lines[0].split(",") == patching.CSV_COLUMNS and len(lines) == 1 + 12
    cell = next(line.split(",") for line in lines[1:] if line.startswith("heads,denoising,L1,1,0,"))
    assert float(cell[-1]) == pytest.approx(data["values"][1][0])
    with open(ui_patching.download_patching(s, "json"), encoding="utf-8") as f:
        assert json.load(f)["values"] == data["values"]
    with pytest.raises(gr.Error, match="csv or json"):
        ui_patching.download_patching(s, "xlsx")


def test_the_second_answer_box_serves_the_logit_difference_only():
    assert ui_patching.metric_changed("prob")["interactive"] is False
    assert ui_patching.metric_changed("logit_diff")["interactive"] is True
    s = Session()  # the probability of one answer needs no second one
    *_, (_, note, _, _, data) = list(ui_patching.run_patching(s, GRAMMAR, A, B, "prob", "her", "", "heads", "noising"))
    assert "P(her)" in note and data["metric"] == "prob"


def test_a_difference_that_is_noise_is_said_above_the_map_and_on_it(tmp_path):
    """A random nanoGPT run's pair whose A/B difference single patches drown, and of the wrong sign: the note
    gives the lab's warnings with their numbers before the headline, and the map carries the short one."""
    from lab.catalogue.external import ExternalModels, parse_source
    from tests.support.nanogpt_runs import CHARS, reference, save_run

    s = Session()
    s.external = ExternalModels([parse_source(str(save_run(tmp_path / "run", reference(len(CHARS), block=64))))],
                                tmp_path / "hashes.json")
    name = s.external.names[0]
    *_, (_, note, plot, _, data) = list(ui_patching.run_patching(s, name, "hello world", "hello worle", "logit_diff",
                                                                 "a", "e", "heads", "denoising"))
    r = s.sweeps.run(name, "hello world", "hello worle", "logit_diff",
                     "a", "e", "heads", "denoising")
    assert len(r.cautions()) == 2 and data["cautions"] == r.cautions()
    lines = note.split("  \n")
    assert [line.startswith("⚠ **") for line in lines[:4]] == [False, True, True, False]
    assert "Wrong sign" in lines[1] and f"{r.setup.difference:+.3f}" in lines[2] and "wrong sign" in lines[3]
    subtitle = figure(plot)["layout"]["title"]["subtitle"]["text"]
    assert subtitle.startswith("<b>⚠ The A/B difference (-0.729) has the wrong sign and is small next to")
    assert "read these shares as noise" in subtitle.replace("<br>", " ").replace("</b> <b>", " ")
    *_, (_, plain_note, plain_plot, _, _) = sweep(Session())  # a real difference: no warning anywhere
    assert "⚠" not in plain_note and "⚠" not in figure(plain_plot)["layout"]["title"]["subtitle"]["text"]
