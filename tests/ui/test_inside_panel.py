"""The "Inside one cell" panel's handlers called directly (no server): every number the panel draws is
lab.inside's for that cell (the numbers' own tests recompute those from the weights), each with its
formula; the value-weighted colour draws lab.inside's ‖a_ij · v_j W_O‖; bad input gets a sentence."""

from __future__ import annotations

import json

import numpy as np
import pytest

import viz
from lab import inside as lab_inside
from lab.checks import UserError
from lab.session import Session
from model.generate import Sampling
from ui.explore import colour_caption, shown_spec
from ui.inside import N_FIGURES, download_cell, draw_cell, draw_matrices, open_panel, pick_cell, selected_token

GRAMMAR = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"


def figure(plot) -> dict:
    return json.loads(plot.plot)


def arr(x) -> np.ndarray:
    return viz.decode_array(x) if isinstance(x, dict) else np.asarray(x, dtype=float)


@pytest.fixture(scope="module")
def session() -> Session:
    s = Session()
    s.step(GRAMMAR, P, Sampling(temperature=0.0))  # "he" is position 11, "tom" 9
    return s


def test_a_cell_is_drawn_with_the_labs_numbers_and_their_formulas(session):
    data = lab_inside.cell(session.text, session.heads.settings, 1, 0, 11, 9)
    header, table, *rest = draw_cell(session, 1, 0, 11, 9)
    figs, numbers = [figure(p) for p in rest[:N_FIGURES]], rest[N_FIGURES:]
    assert numbers == [1, 0, 11, 9]
    assert "query i = “he” (11) → key j = “tom” (9)" in header and f"{data['weight']:.4f}" in header
    # the table: every single number beside its formula
    for name, value in (("dot", data["dot"]), ("scale", data["scale"]), ("score", data["score"]),
                        ("row_max", data["row_max"]), ("exp_sum", data["exp_sum"])):
        line = next(r for r in table.splitlines() if data["formulas"][name] in r)
        assert f"| {value:.4f} |" in line, (name, line)
    assert f"= {data['weight']:.4f}" in table
    inputs, qk, products, softmax, values, heads = figs
    assert np.allclose(arr(inputs["data"][0]["z"]), [data["x_i"], data["xn_i"], data["x_j"], data["xn_j"]])
    assert np.allclose(arr(qk["data"][0]["z"]), [data["q_raw"], data["k_raw"]])  # learned positions: no rotary rows
    shown = arr(products["data"][0]["x"])
    assert np.allclose(shown[:-1], sorted(data["products"], key=abs, reverse=True)[: len(shown) - 1])
    assert shown.sum() == pytest.approx(data["dot"], abs=1e-4)  # the bars add up to q_i · k_j
    assert np.allclose(arr(softmax["data"][0]["y"]), data["softmax_row"])
    assert softmax["layout"]["meta"]["key"] == 9 and softmax["data"][0]["marker"]["line"]["width"][9] > 0
    assert np.allclose(arr(values["data"][0]["z"])[[0, 2]], [data["v"][9], data["weighted"]])
    assert np.allclose(arr(heads["data"][0]["x"])[:4], [h["norm"] for h in data["heads_out"]])


def test_the_selected_token_opens_on_its_strongest_key(session):
    session.select(11)
    try:
        out = selected_token(session, None, None, None, 1, 0)
        assert out[-4:] == (1, 0, 11, 9)
        out = selected_token(session, "", "", "", 1, 0)  # no cell drawn yet: the boxes are blank
        assert out[-4:] == (1, 0, 11, 9)  # "he" gives "tom" its largest share
        opened = open_panel(session, "", "", " ", "", 1, "all")  # a grid of heads: its first
        assert opened[-4:] == (1, 0, 11, 9)
        opened = open_panel(session, "1", "0", "11", "9", 0, 0)  # typed in the boxes
        assert opened[-4:] == (1, 0, 11, 9)
    finally:
        session.select_last()


def test_an_ablated_head_is_named_and_its_used_numbers_drawn(session):
    session.heads.set_ablation(["L1H0"], "zero", False)
    try:
        data = lab_inside.cell(session.text, session.heads.settings, 1, 0, 11, 9)
        header, _, *rest = draw_cell(session, 1, 0, 11, 9)
        assert "zero-ablated" in header and "change the model now" in header
        values = figure(rest[4])
        assert np.allclose(arr(values["data"][0]["z"])[3], data["head_value"]) and not np.any(data["head_value"])
    finally:
        session.heads.clear_probe()


def test_the_matrices_are_the_labs_and_outline_the_cell(session):
    data = lab_inside.head(session.text, session.heads.settings, 1, 0)
    fig = figure(draw_matrices(session, 1, 0, 11, 9))
    assert (fig["layout"]["meta"]["query"], fig["layout"]["meta"]["key"]) == (11, 9)
    for trace, name in zip(fig["data"], ("q", "k", "v", "raw", "scaled")):
        assert np.allclose(arr(trace["z"]), data[name]), name
    masked = arr(fig["data"][5]["z"])
    assert np.isnan(masked[3, 4]) and masked[11, 9] == pytest.approx(data["scaled"][11][9], abs=1e-6)


def test_value_weighted_colour_is_the_labs_norms(session):
    before = session.display.colour
    session.set_display("value", None, None)
    try:
        shown = session.shown(1, 0, "weights")
        seen = viz.attention_panels(shown_spec(shown))[0]
        want = np.array(lab_inside.head(session.text, session.heads.settings, 1, 0)["value_weighted"], dtype=float)
        assert np.allclose(np.nan_to_num(seen), np.round(np.nan_to_num(want), 3), atol=1e-9)
        assert seen[11, 9] > 0 and np.isnan(seen[3, 4])
    finally:
        session.set_display(before, None, None)


@pytest.mark.parametrize("cell", [None, "", "1,0,11", "a,b,c,d", "1,0,11,-9", {"x": 1}])
def test_a_broken_click_is_refused_with_a_sentence(session, cell):
    with pytest.raises(Exception) as info:  # the handler turns the refusal into gr.Error with its sentence
        pick_cell(session, cell)
    assert "Click a cell of the attention" in str(info.value)


def test_out_of_range_cells_are_refused_and_nothing_changes(session):
    probe, display = session.heads.settings, session.display
    for args in ((1, 0, 11, 40), (9, 0, 0, 0), (1, 7, 0, 0)):
        with pytest.raises(UserError):
            draw_cell(session, *args)
    assert session.heads.settings is probe and session.display is display


def test_the_cells_numbers_download_holds_q_k_v_and_the_row(session):
    data = lab_inside.cell(session.text, session.heads.settings, 1, 0, 11, 9)
    saved = json.loads(open(download_cell(session, "json", 1, 0, 11, 9), encoding="utf-8").read())
    for name in ("q", "k", "v", "softmax_row", "scores_row"):
        assert saved[name] == data[name], name
    table = open(download_cell(session, "csv", 1, 0, 11, 9), encoding="utf-8-sig").read()
    assert "softmax_row,a_ij = exp(s_ij − m) / Σ_j exp(s_ij − m),9,tom," in table
    with pytest.raises(Exception, match="Open a cell first"):
        download_cell(session, "csv", None, None, None, None)


@pytest.mark.parametrize("name", ["sort digits (built-in)", "copy / induction (built-in)", "article toy (built-in)",
                                  "shakespeare (built-in)"])
def test_every_built_in_draws_its_last_layers_cell(name):
    s = Session()
    entry = s.entry_for(name)
    s.step(name, entry.examples[0], Sampling(temperature=0.0))
    layer = entry.model.cfg.n_layers - 1
    header, table, *rest = draw_cell(s, layer, 0, None, None)
    data = lab_inside.cell(s.text, s.heads.settings, layer, 0)
    assert rest[N_FIGURES:] == [layer, 0, data["query"], data["key"]] and data["query"] == len(data["tokens"]) - 1
    assert f"{data['weight']:.4f}" in header and f"{data['dot']:.4f}" in table
    heads = figure(rest[5])
    assert len(arr(heads["data"][0]["x"])) == entry.model.cfg.n_heads + (data["out_bias"] is not None)


def test_a_rotary_model_shows_its_rotary_step():
    s = Session()
    for progress in s.train("grammar", "", None, "word", 1, 2, 32, 64, "rope", "pre", "gelu", 0.0, 3, 3e-3, 0):
        pass
    assert progress.done
    s.step(progress.run.name, P, Sampling(temperature=0.0))
    data = lab_inside.cell(s.text, s.heads.settings, 0, 1, 11, 2)
    header, table, *rest = draw_cell(s, 0, 1, 11, 2)
    qk = figure(rest[1])
    assert np.allclose(arr(qk["data"][0]["z"]), [data["q_raw"], data["k_raw"], data["q"], data["k"]])
    assert "rotary" in qk["layout"]["title"]["text"] and "rotary" in table
    assert not np.allclose(data["q_raw"], data["q"])  # position 11 turns the query


def test_the_caption_says_what_the_value_weighted_colours_are(session):
    try:
        line = colour_caption(session, "value", GRAMMAR, 1, 0, "weights")
        assert "Colours: ‖a·v W_O‖" in line and 'the row of "he"' in line
        assert "‖a·v W_O‖" not in colour_caption(session, "value", GRAMMAR, 1, 0, "scores")
        assert "‖a·v W_O‖" not in colour_caption(session, "linear", GRAMMAR, 1, 0, "weights")
        with pytest.raises(Exception, match="colour"):
            colour_caption(session, "rainbow", GRAMMAR, 1, 0, "weights")
        assert session.display.colour == "linear"  # a refused colour changes nothing
    finally:
        session.set_display("linear", None, None)


def test_without_a_text_the_panel_says_so_quietly():
    s = Session()
    for out in (open_panel(s, None, None, None, None, 1, 0), selected_token(s, 1, 0, 11, 1, 0)):
        assert "Click a cell" in out[0] and out[-4:] == ("", "", "", "")
