"""Tests for the head figures: viz/heads.py (role maps), viz/lens.py (logit lens), viz/compare.py (A/B),
and the head badges of viz.attention.attention_view.

Everything is read back from the JSON the browser would receive (typed arrays decoded), as in
test_viz.py: the values in the cells, which cells carry a mark, the text and hover a learner sees.
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass

import numpy as np
import pytest
from tests.support.figures import all_strings, assert_same_values, axis, sent, softmax_attention

import viz
from viz import (
    DIVERGING,
    ROW_OUTLINE,
    FigureSpec,
    attention_difference,
    attention_panels,
    attention_view,
    compare_distributions,
    decode_array,
    future_mask,
    lens_grid,
    plot_json,
    role_overview,
    score_changes,
)
from viz._common import DIFF_FLOOR, MARK_LINES
from viz.heads import NAN_TEXT
from viz.sampling import ADJ_COLOUR, RAW_COLOUR

STEP = 0.0005 + 1e-9  # milli-unit quantisation (attention_difference): half a step
HOSTILE = "<img src=x onerror=alert(1)>"


@dataclass(frozen=True)
class Role:
    key: str
    name: str
    formula: str
    threshold: float | None


ROLES = (
    Role("previous_token", "previous-token", "mean over queries i ≥ 1 of A[i, i−1]", 0.5),
    Role("induction", "induction", "mean of A[i, j+1] over repeats, j < i−1", 0.4),
    Role("entropy", "entropy (bits)", "mean over queries of −Σⱼ A[i, j] log₂ A[i, j]", None),
)


def make_scores(layers: int = 3, heads: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    scores = {"previous_token": rng.random((layers, heads)), "induction": rng.random((layers, heads)),
              "entropy": rng.random((layers, heads)) * 3}
    scores["previous_token"][1, 0] = 0.92
    scores["previous_token"][0, 0] = 0.5  # exactly at the threshold: plays the role
    scores["previous_token"][0, 1] = 0.4996  # just under: must not read "0.50" next to "≥ 0.5"
    scores["induction"][0, :] = np.nan  # undefined on this text
    return scores


def panel_traces(spec: dict) -> dict[str, dict]:
    """Role key → its heatmap trace."""
    return {tr["meta"]: tr for tr in spec["data"] if tr["type"] == "heatmap"}


def panel_refs(spec: dict) -> dict[str, tuple[str, str]]:
    return {p["key"]: (p["xaxis"], p["yaxis"]) for p in spec["layout"]["meta"]["panels"]}


def cell_of(shape: dict) -> tuple[int, int]:
    """(layer, head) at the centre of a rect shape drawn on a head map (x = head, y = layer)."""
    return round((shape["y0"] + shape["y1"]) / 2), round((shape["x0"] + shape["x1"]) / 2)


def outlined(spec: dict, xref: str, line: dict) -> set[tuple[int, int]]:
    """Cells of one panel outlined with `line` (a MARK_LINES / ROW_OUTLINE entry)."""
    return {cell_of(sh) for sh in spec["layout"].get("shapes", []) if sh["xref"] == xref and sh["line"] == line}


def annotations_at(spec: dict, xref: str, text: str) -> set[tuple[int, int]]:
    """Cells (layer, head) of one panel holding an annotation with this text (nearest cell)."""
    return {(round(a["y"]), round(a["x"])) for a in spec["layout"]["annotations"]
            if a.get("xref") == xref and a["text"] == text}


# ----------------------------------------------------------------------------- role_overview


def test_role_overview_cells_carry_the_scores_and_their_head():
    scores = make_scores()
    spec = sent(role_overview(scores, ROLES))
    traces = panel_traces(spec)
    assert list(traces) == [r.key for r in ROLES]  # one panel per role, in order
    for key, trace in traces.items():
        z = decode_array(trace["z"]).astype(np.float64)
        np.testing.assert_array_equal(z, scores[key])  # NaN where undefined
        cd = np.array(trace["customdata"])
        assert cd.shape == (3, 4, 2)
        for li in range(3):
            for h in range(4):
                assert cd[li, h].tolist() == [li, h]
                if np.isfinite(scores[key][li, h]):  # the value shown is the score, layer li, head h
                    shown = trace["text"][li][h].removeprefix("<b>").removesuffix("</b>")
                    assert float(shown) == pytest.approx(scores[key][li, h], abs=0.005)
    meta = spec["layout"]["meta"]
    assert (meta["pick"], meta["layers"], meta["heads"]) == ("head", 3, 4)
    # layer 0 on top, "L0"/"H0" labels
    xref, yref = panel_refs(spec)["previous_token"]
    xaxis, yaxis = spec["layout"][f"xaxis{xref[1:]}"], spec["layout"][f"yaxis{yref[1:]}"]
    assert yaxis["range"] == [2.5, -0.5] and yaxis["ticktext"] == ["L0", "L1", "L2"]
    assert xaxis["ticktext"] == ["H0", "H1", "H2", "H3"] and xaxis["tickvals"] == [0, 1, 2, 3]


def test_role_overview_marks_exactly_the_heads_at_or_above_threshold():
    scores = make_scores(seed=3)
    spec = sent(role_overview(scores, ROLES))
    traces, refs = panel_traces(spec), panel_refs(spec)
    for role in ROLES:
        s = scores[role.key]
        if role.threshold is None:
            expected = set()
        else:
            expected = {(li, h) for li in range(3) for h in range(4)
                        if np.isfinite(s[li, h]) and s[li, h] >= role.threshold}
        xref = refs[role.key][0]
        assert outlined(spec, xref, MARK_LINES[0]) == expected == outlined(spec, xref, MARK_LINES[1]), role.key
        bold = {(li, h) for li in range(3) for h in range(4) if traces[role.key]["text"][li][h].startswith("<b>")}
        assert bold == expected, role.key
    assert (0, 0) in outlined(spec, refs["previous_token"][0], MARK_LINES[1])  # exactly 0.5 counts
    assert traces["previous_token"]["text"][0][1] == "0.4996"  # not "0.50": it is below the threshold
    assert "outlined: score ≥ threshold: the head plays that role" in spec["layout"]["title"]["subtitle"]["text"]


def test_role_overview_undefined_scores_show_a_dash():
    scores = make_scores()
    spec = sent(role_overview(scores, ROLES))
    xref = panel_refs(spec)["induction"][0]
    assert annotations_at(spec, xref, NAN_TEXT) == {(0, h) for h in range(4)}
    trace = panel_traces(spec)["induction"]
    assert trace["text"][0] == ["", "", "", ""]  # no cell text (its automatic colour would not read)
    assert trace["hovertext"][0][2] == "layer 0, head 2 · induction: undefined for this text<br>" + \
        "mean of A[i, j+1] over repeats, j &lt; i−1"
    for key in ("previous_token", "entropy"):
        assert annotations_at(spec, panel_refs(spec)[key][0], NAN_TEXT) == set()


def test_role_overview_hover_and_colour_ranges():
    scores = make_scores()
    spec = sent(role_overview(scores, ROLES))
    traces = panel_traces(spec)
    prev = traces["previous_token"]
    assert prev["hovertext"][1][0] == ("layer 1, head 0 · previous-token 0.92 ≥ 0.5: previous-token head<br>"
                                       "mean over queries i ≥ 1 of A[i, i−1]")
    assert prev["hovertext"][0][1].startswith("layer 0, head 1 · previous-token 0.4996 &lt; 0.5<br>")
    assert prev["hovertemplate"] == "%{hovertext}<extra></extra>"
    assert (prev["zmin"], prev["zmax"], prev["colorscale"]) == (0.0, 1.0, "Viridis")
    ent = traces["entropy"]
    assert ent["zmin"] == 0.0 and ent["zmax"] == pytest.approx(np.nanmax(scores["entropy"]))
    assert ent["hovertext"][2][3].startswith(f"layer 2, head 3 · entropy (bits) {scores['entropy'][2, 3]:.2f}<br>")
    # the panel titles say the threshold; the one without is named as it is
    titles = [a["text"] for a in spec["layout"]["annotations"] if a.get("xref") == "paper"]
    assert titles == ["previous-token ≥ 0.5", "induction ≥ 0.4", "entropy (bits)"]
    # a measure without threshold that is undefined everywhere still gets a valid range
    empty = {**scores, "entropy": np.full((3, 4), np.nan)}
    assert panel_traces(sent(role_overview(empty, ROLES)))["entropy"]["zmax"] == 1.0


def test_role_overview_selected_and_marked_heads_in_every_panel():
    scores = make_scores()
    spec = sent(role_overview(scores, ROLES, selected=(2, 1), marked=[(0, 3), (1, 1), (0, 3)]))
    refs = panel_refs(spec)
    for key, (xref, _) in refs.items():
        assert outlined(spec, xref, ROW_OUTLINE[0]) == {(2, 1)} == outlined(spec, xref, ROW_OUTLINE[1]), key
        assert annotations_at(spec, xref, "<b>✕</b>") == {(0, 3), (1, 1)}, key
    meta = spec["layout"]["meta"]
    assert meta["selected"] == [2, 1] and meta["marked"] == [[0, 3], [1, 1]]
    assert ROW_OUTLINE[1]["color"] not in {line["color"] for line in MARK_LINES}  # selected ≠ role mark
    legend = spec["layout"]["title"]["subtitle"]["text"]
    assert "✕ = ablated" in legend and "magenta = selected head" in legend
    hover = panel_traces(spec)["entropy"]["hovertext"]
    assert hover[1][1].endswith("<br>✕ ablated") and hover[2][1].endswith("<br>selected")
    plain = sent(role_overview(scores, ROLES))
    assert not any(sh["line"] in ROW_OUTLINE for sh in plain["layout"].get("shapes", []))
    assert "✕" not in json.dumps(plain["layout"]["annotations"], ensure_ascii=False)


@pytest.mark.parametrize(("width_px", "ncols"), [(None, 5), (1000, 5), (700, 3), (600, 3), (420, 2)])
def test_role_overview_wraps_on_narrow_layouts(width_px, ncols):
    roles = ROLES + (Role("self_attention", "self", "mean of A[i, i]", 0.5),
                     Role("first_token", "first-token (sink)", "mean of A[i, 0]", 0.5))
    scores = {**make_scores(layers=2), "self_attention": np.full((2, 4), 0.3), "first_token": np.zeros((2, 4))}
    lay = sent(role_overview(scores, roles, width_px=width_px))["layout"]
    refs = [p["xaxis"] for p in lay["meta"]["panels"]]
    columns = {tuple(lay[f"xaxis{x[1:]}"]["domain"]) for x in refs}
    assert len(columns) == ncols  # at 700 px five panels of 4 heads would be too narrow for their text
    rows = -(-5 // ncols)
    assert 140 <= lay["height"] <= 100 + rows * (60 + 34 * 2)  # small: about 60 + 34 px a layer per row
    # a y axis per panel, labelled only in the first column
    shown = [lay[f"yaxis{p['yaxis'][1:]}"]["showticklabels"] for p in lay["meta"]["panels"]]
    assert shown == [k % ncols == 0 for k in range(5)]


def test_role_overview_presentation_fonts():
    spec = sent(role_overview(make_scores(), ROLES, presentation=True, selected=(0, 0), marked=[(1, 1)]))
    lay = spec["layout"]
    for key in lay:
        if key.startswith(("xaxis", "yaxis")):
            assert lay[key]["tickfont"]["size"] >= 16, key
    for trace in spec["data"]:
        assert trace["textfont"]["size"] >= 16
    assert all(a["font"]["size"] >= 16 for a in lay["annotations"])
    assert lay["hoverlabel"]["font"]["size"] >= 16 and lay["title"]["font"]["size"] >= 18
    normal = sent(role_overview(make_scores(), ROLES))["layout"]
    assert lay["height"] > normal["height"]  # cells grow


def test_role_overview_escapes_every_caller_string():
    roles = (Role("previous_token", f"prev {HOSTILE}", f"A[i, i−1] {HOSTILE}", 0.5),)
    spec = sent(role_overview(make_scores(), roles, title=f"t {HOSTILE}", marked_label="<br>"))
    strings = all_strings(spec)
    assert not any("<img" in s for s in strings)
    assert spec["layout"]["title"]["text"] == "t &lt;img src=x onerror=alert(1)&gt;"
    assert "&lt;img" in panel_traces(spec)["previous_token"]["hovertext"][0][0]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: role_overview({k: v for k, v in s.items() if k != "induction"}, ROLES), "scores has no 'induction'"),
        (lambda s: role_overview({**s, "entropy": np.ones((2, 4))}, ROLES), r"scores\['entropy'\] has shape \(2, 4\)"),
        (lambda s: role_overview({**s, "previous_token": np.ones(4)}, ROLES), "must be 2-D"),
        (lambda s: role_overview(s, ()), "roles is empty"),
        (lambda s: role_overview(s, ROLES, selected=(3, 0)), "selected layer must be a whole number in 0..2"),
        (lambda s: role_overview(s, ROLES, selected=(0,)), r"selected must be a \(layer, head\) pair"),
        (lambda s: role_overview(s, ROLES, marked=[(0, 4)]), "marked head must be a whole number in 0..3"),
        (lambda s: role_overview(s, ROLES, width_px=50), "width_px must be a whole number"),
        (lambda s: role_overview(s, (Role("entropy", "e", "f", float("nan")),)), "threshold must be a finite"),
        (lambda s: score_changes(s, {**s, "entropy": np.ones((3, 5))}, ROLES), r"scores_b\['entropy'\] has shape"),
        (lambda s: score_changes(s, {k: v[:2] for k, v in s.items()}, ROLES), r"scores_b are \(2, 4\)"),
    ],
)
def test_score_maps_reject_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call(make_scores())


# ----------------------------------------------------------------------------- score_changes


def test_score_changes_signed_values_symmetric_scale_and_crossings():
    a = make_scores(seed=1)
    b = {k: v.copy() for k, v in a.items()}
    b["previous_token"][1, 2] = a["previous_token"][1, 2] + 0.31
    b["induction"][1, 0], a["induction"][1, 0] = 0.55, 0.12
    b["entropy"] = a["entropy"] + 0.7
    spec = sent(score_changes(a, b, ROLES))
    traces, refs = panel_traces(spec), panel_refs(spec)
    for role in ROLES:
        trace = traces[role.key]
        d = b[role.key] - a[role.key]
        np.testing.assert_array_equal(decode_array(trace["z"]).astype(np.float64), d)
        assert trace["zmin"] == -trace["zmax"] and trace["colorscale"] == [list(p) for p in DIVERGING]
        assert trace["zmax"] >= np.nanmax(np.abs(d)) - 1e-12 and trace["zmax"] >= DIFF_FLOOR
        for li in range(3):
            for h in range(4):
                text = trace["text"][li][h]
                if np.isnan(d[li, h]):
                    assert text == ""
                else:
                    assert text[0] in "+-" and float(text) == pytest.approx(d[li, h], abs=0.005)
        if role.threshold is not None:
            plays_a, plays_b = (np.nan_to_num(s[role.key], nan=-1.0) >= role.threshold for s in (a, b))
            crossing = {(int(li), int(h)) for li, h in zip(*np.nonzero(plays_a != plays_b))}
            assert outlined(spec, refs[role.key][0], MARK_LINES[1]) == crossing
    # the 0-1 scores share one range; entropy (bits) has its own
    assert traces["previous_token"]["zmax"] == traces["induction"]["zmax"]
    assert traces["entropy"]["zmax"] == pytest.approx(0.7)
    assert traces["induction"]["text"][1][0] == "+0.43"
    assert traces["induction"]["hovertext"][1][0].startswith("layer 1, head 0 · induction: A 0.12 → B 0.55 (+0.43)")
    assert "becomes a induction head" in traces["induction"]["hovertext"][1][0]
    assert traces["entropy"]["text"][0][0] == "+0.70"
    assert annotations_at(spec, refs["induction"][0], NAN_TEXT) == {(0, h) for h in range(4)}
    meta = spec["layout"]["meta"]
    assert (meta["pick"], meta["layers"], meta["heads"]) == ("head", 3, 4)
    assert np.array(traces["entropy"]["customdata"])[2, 3].tolist() == [2, 3]


def test_score_changes_of_identical_prompts_are_zero_on_the_floor_range():
    a = make_scores()
    spec = sent(score_changes(a, a, ROLES))
    for trace in panel_traces(spec).values():
        assert trace["zmax"] == DIFF_FLOOR
        assert {t for row in trace["text"] for t in row} <= {"+0.00", ""}  # never "-0.00"
    assert "shapes" not in spec["layout"]


# ----------------------------------------------------------------------------- logit lens


def lens_case(rows: int = 4, vocab: int = 12, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(vocab) * 0.5, size=rows)  # distinct values: no ties
    return probs, [f"w{i}" for i in range(vocab)]


def test_lens_grid_rows_hold_each_layers_top_k():
    probs, pieces = lens_case()
    spec = sent(lens_grid(probs, pieces, top=5))
    (trace,) = spec["data"]
    ids = np.argsort(-probs, axis=1)[:, :5]
    assert spec["layout"]["meta"]["ids"] == ids.tolist()
    z = decode_array(trace["z"]).astype(np.float64)
    np.testing.assert_allclose(z, np.take_along_axis(probs, ids, 1))
    text = [[t.removeprefix("<b>").removesuffix("</b>") for t in row] for row in trace["text"]]
    assert text == [[pieces[i] for i in row] for row in ids]
    lay = spec["layout"]
    assert lay["yaxis"]["range"] == [3.5, -0.5]  # embedding on top, the model's output at the bottom
    assert lay["yaxis"]["ticktext"] == ["embedding", "after layer 0", "after layer 1", "after layer 2 (output)"]
    assert lay["xaxis"]["ticktext"] == [f"rank {k}" for k in range(1, 6)]
    assert (trace["zmin"], trace["zmax"], trace["colorscale"]) == (0.0, 1.0, "Viridis")
    assert trace["colorbar"]["title"]["text"] == "probability"
    k, r = 1, 1
    tok = ids[r, k]
    assert trace["hovertext"][r][k].startswith(f"after layer 0 · rank 2: 'w{tok}' {probs[r, tok]:.3f}")


@pytest.mark.parametrize("final", [None, 3])
def test_lens_grid_highlights_the_final_token_where_it_is_in_the_top(final):
    probs, pieces = lens_case(rows=5, seed=2)
    probs[1:, 3] += 0.3  # token 3 climbs into the top from the second row on
    probs /= probs.sum(1, keepdims=True)
    spec = sent(lens_grid(probs, pieces, top=3, final=final))
    target = int(np.argmax(probs[-1])) if final is None else final
    ids = np.argsort(-probs, axis=1)[:, :3]
    expected = {(r, k) for r in range(5) for k in range(3) if ids[r, k] == target}
    assert {r for r, _ in expected} == {r for r in range(5) if target in ids[r]}
    (trace,) = spec["data"]
    bold = {(r, k) for r in range(5) for k in range(3) if trace["text"][r][k].startswith("<b>")}
    assert bold == expected
    shapes = spec["layout"].get("shapes", [])
    assert {(round((s["y0"] + s["y1"]) / 2), round((s["x0"] + s["x1"]) / 2) - 1) for s in shapes} == expected
    note = spec["layout"]["title"]["subtitle"]["text"]
    assert f"bold, outlined = the model's final top token 'w{target}'" in note
    first = min(r for r, _ in expected)
    assert spec["layout"]["meta"]["first_row"] == first and spec["layout"]["meta"]["final"] == target


def test_lens_grid_final_outside_every_top_and_escaping():
    pieces = ["<b>", "a", "b", "c", "d", "e"]
    probs = np.array([[0.5, 0.3, 0.1, 0.05, 0.03, 0.02]] * 3 + [[0.2, 0.4, 0.25, 0.1, 0.03, 0.02]])
    spec = sent(lens_grid(probs, pieces, top=2, final=5, row_labels=["e", "l0", "l1", HOSTILE], title=HOSTILE))
    lay = spec["layout"]
    assert "shapes" not in lay and lay["meta"]["first_row"] is None  # token 5 is in no row's top 2
    assert "in no row's top 2" in lay["title"]["subtitle"]["text"]
    text = spec["data"][0]["text"]
    assert [row[0] for row in text] == ["&lt;b&gt;"] * 3 + ["a"]  # the piece "<b>" arrives escaped, not bold
    assert not any("<img" in s or "<b>" in s for s in all_strings(spec))
    assert lay["yaxis"]["ticktext"][3] == "&lt;img src=x onerror=alert(1)&gt;"
    assert lay["title"]["text"] == "&lt;img src=x onerror=alert(1)&gt;"
    # default final: the last row's argmax ("a"), bold where it is in the top 2 (every row)
    bold = sent(lens_grid(probs, pieces, top=2))["data"][0]["text"]
    assert [row[1] for row in bold[:3]] + [bold[3][0]] == ["<b>a</b>"] * 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"probs": np.ones(5) / 5}, "probs must be 2-D"),
        ({"pieces": ["a"] * 4}, "vocabulary of 12 but 4 token pieces"),
        ({"row_labels": ["a", "b"]}, "4 rows but 2 row labels"),
        ({"final": 12}, "final token id 12 is outside the vocabulary of 12"),
        ({"top": 0}, "top must be a whole number"),
        ({"probs": np.full((4, 12), np.nan)}, "probs must be finite"),
    ],
)
def test_lens_grid_rejects_bad_input(kwargs, message):
    probs, pieces = lens_case()
    args = {"probs": probs, "pieces": pieces, **kwargs}
    with pytest.raises(ValueError, match=message):
        lens_grid(args.pop("probs"), args.pop("pieces"), **args)


def test_lens_grid_presentation_fonts():
    probs, pieces = lens_case()
    lay = sent(lens_grid(probs, pieces, presentation=True))["layout"]
    normal = sent(lens_grid(probs, pieces))["layout"]
    for name in ("xaxis", "yaxis"):
        assert lay[name]["tickfont"]["size"] >= 16
    assert lay["hoverlabel"]["font"]["size"] >= 16 and lay["height"] > normal["height"]


# ----------------------------------------------------------------------------- compare_distributions


def test_compare_distributions_union_of_tops_and_rank_changes():
    pieces = ["a", "b", "c", "d", "e", "f"]
    before = np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
    after = np.array([0.04, 0.30, 0.10, 0.35, 0.15, 0.06])
    spec = sent(compare_distributions(pieces, before, after, top=3))
    lay = spec["layout"]
    # before's top 3 in its order, then what only after's top 3 holds (d, e), by after
    assert lay["meta"]["ids"] == [0, 1, 2, 3, 4]
    assert lay["yaxis"]["ticktext"] == ["a  1→6", "b  2→2", "c  3→4", "d  4→1", "e  5→3"]
    normal, ablated = spec["data"]
    assert (normal["name"], ablated["name"]) == ("normal", "ablated")
    assert normal["marker"]["color"] == RAW_COLOUR and ablated["marker"]["color"] == ADJ_COLOUR
    np.testing.assert_allclose(decode_array(normal["x"]), before[:5], atol=1e-7)
    np.testing.assert_allclose(decode_array(ablated["x"]), after[:5], atol=1e-7)
    assert decode_array(normal["y"]).tolist() == [0, 1, 2, 3, 4]
    assert normal["hovertext"][3] == ("'d' (id 3)<br>normal: 0.100 (rank 4)<br>ablated: 0.350 (rank 1)<br>"
                                      "ablated − normal: +0.250")
    assert lay["yaxis"]["autorange"] == "reversed" and lay["showlegend"] is True


def test_compare_distributions_prompt_labels_cap_and_escaping():
    rng = np.random.default_rng(5)
    vocab = 200
    pieces = [f"p{i}" for i in range(vocab)]
    pieces[7] = "<b>"
    before, after = rng.dirichlet(np.ones(vocab) * 0.1), rng.dirichlet(np.ones(vocab) * 0.1)
    for presentation in (False, True):
        fig = compare_distributions(pieces, before, after, labels=("prompt A", "<i>B</i>"), top=40,
                                    presentation=presentation, title="A vs B <script>")
        spec = sent(fig)
        lay = spec["layout"]
        assert lay["height"] <= 360
        ids = lay["meta"]["ids"]
        pitch = (lay["height"] - lay["margin"]["t"] - lay["margin"]["b"]) / len(ids)
        assert lay["yaxis"]["tickfont"]["size"] * 1.25 <= pitch  # rows stay legible
        # the rows are the union of both tops cut to the same length k
        k = next(k for k in range(40, 0, -1) if set(np.argsort(-before)[:k]) <= set(ids))
        assert set(ids) == set(np.argsort(-before)[:k]) | set(np.argsort(-after)[:k])
        assert [d["name"] for d in spec["data"]] == ["prompt A", "&lt;i&gt;B&lt;/i&gt;"]
        assert lay["title"]["text"] == "A vs B &lt;script&gt;"
        assert not any("<i>" in s or "<script" in s for s in all_strings(spec))
        if presentation:
            assert lay["yaxis"]["tickfont"]["size"] >= 16 and lay["xaxis"]["tickfont"]["size"] >= 16
    assert sent(compare_distributions(pieces, before, after))["layout"]["title"]["text"] == \
        "Next-token probabilities: normal vs ablated"


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((["a", "b"], np.ones(3) / 3, np.ones(2) / 2), {}, "before has 3 entries but 2 token pieces"),
        ((["a", "b"], np.ones(2) / 2, np.ones((1, 2))), {}, "after must be 1-D"),
        ((["a", "b"], np.ones(2) / 2, np.ones(2) / 2), {"labels": ("x",)}, "labels must be two names"),
        ((["a", "b"], np.ones(2) / 2, np.ones(2) / 2), {"top": 0}, "top must be a whole number"),
    ],
)
def test_compare_distributions_rejects_bad_input(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        compare_distributions(*args, **kwargs)


# ----------------------------------------------------------------------------- attention_difference


def diff_case(heads: int = 3, t: int = 7, seed: int = 0) -> np.ndarray:
    wa, _ = softmax_attention(heads, t, seed=seed)
    wb, _ = softmax_attention(heads, t, seed=seed + 1)
    return wb - wa


def test_attention_difference_values_masked_cells_and_symmetric_range():
    t = 7
    diff = diff_case(t=t)
    diff[:, future_mask(t)] = 5.0  # junk above the diagonal must neither show nor set the range
    toks = ["anna", "saw", "tom", ".", "he→she", "said", "<b>"]
    fig = attention_difference(diff, toks, layer=1, causal=True)
    seen = attention_panels(fig)
    upper = future_mask(t)
    assert np.isnan(seen[:, upper]).all()
    assert np.abs(seen[:, ~upper] - diff[:, ~upper]).max() <= STEP
    spec = sent(fig)
    lay = spec["layout"]
    ca = lay["coloraxis"]
    bound = np.abs(diff[:, ~upper]).max()
    assert ca["cmin"] == -ca["cmax"] and ca["cmax"] == pytest.approx(bound * 1000)
    assert ca["colorscale"] == [list(p) for p in DIVERGING]
    assert ca["colorbar"]["title"]["text"] == "B − A"
    assert "hatched = masked (future position)" in lay["title"]["subtitle"]["text"]
    assert len(lay["images"]) == 3  # the hatch behind every panel
    hover = lay["template"]["data"]["heatmap"][0]["hovertemplate"]
    assert hover == "%{meta}<br>query %{y} → key %{x}<br>B − A = %{z:+05,d}<extra></extra>"
    assert {tr["meta"] for tr in spec["data"]} == {"layer 1, head 0", "layer 1, head 1", "layer 1, head 2"}
    cats = lay["xaxis"]["categoryarray"]
    assert cats[4] == '"he→she" (4)' and cats[6] == '"&lt;b&gt;" (6)'
    titles = [a["text"] for a in lay["annotations"]]
    assert titles == ["head 0", "head 1", "head 2"]
    assert lay["title"]["text"] == "Layer 1: attention weights, prompt B − prompt A"


def test_attention_difference_floor_notes_and_no_mask():
    t = 5
    diff = np.full((2, t, t), 0.001)
    diff[1, 0, 4] = -0.01
    fig = attention_difference(diff, list("abcde"), layer=0, causal=False,
                               panel_notes={1: "largest change <b>here</b>"}, title="A → B")
    spec = sent(fig)
    lay = spec["layout"]
    assert (lay["coloraxis"]["cmin"], lay["coloraxis"]["cmax"]) == (-DIFF_FLOOR * 1000, DIFF_FLOOR * 1000)
    assert np.isfinite(attention_panels(fig)).all()  # nothing masked
    assert "images" not in lay
    assert [a["text"] for a in lay["annotations"]] == ["head 0", "head 1 · largest change &lt;b&gt;here&lt;/b&gt;"]
    assert lay["title"]["text"] == "A → B"
    assert not any("<b>" in s for s in all_strings(lay) if "<extra>" not in s)


def test_attention_difference_presentation_fonts():
    diff = diff_case(heads=4, t=10)
    lay = sent(attention_difference(diff, [f"w{i}" for i in range(10)], layer=0, causal=True,
                                    presentation=True, max_height_px=700))["layout"]
    for name in ("xaxis", "yaxis"):
        assert axis(lay, name)["tickfont"]["size"] >= 16
    assert lay["coloraxis"]["colorbar"]["tickfont"]["size"] >= 16 and lay["height"] <= 700


@pytest.mark.parametrize(
    ("diff", "tokens", "kwargs", "message"),
    [
        (np.zeros((5, 5)), list("abcde"), {}, "diff must be 3-D"),
        (np.zeros((2, 5, 4)), list("abcde"), {}, "diff is 5×4"),
        (np.zeros((2, 5, 5)), list("abc"), {}, "attention is 5×5 but 3 token labels"),
        (np.zeros((2, 5, 5)), list("abcde"), {"panel_notes": {2: "x"}}, r"panel_notes names heads \[2\]"),
        (np.zeros((2, 5, 5)), list("abcde"), {"layer": -1}, "layer must be a whole number"),
        (np.zeros((2, 5, 5)), list("abcde"), {"width_px": 10}, "width_px must be a whole number"),
    ],
)
def test_attention_difference_rejects_bad_input(diff, tokens, kwargs, message):
    with pytest.raises(ValueError, match=message):
        attention_difference(diff, tokens, **{"layer": 0, "causal": True, **kwargs})


# ----------------------------------------------------------------------------- attention_view badges


def view_case(t: int = 6):
    w, s = softmax_attention(3, t)
    return np.stack([w, w]), np.stack([s, s]), [f"w{i}" for i in range(t)]


@pytest.mark.parametrize("view", ["weights", "scores"])
def test_badges_name_the_heads_in_the_grid_and_are_escaped(view):
    weights, scores, toks = view_case()
    badges = {0: "previous-token", 2: "<b>induction</b>"}
    fig = attention_view(weights, scores, toks, layer=1, head=None, view=view, causal=True, overview_max_tokens=48,
                         badges=badges)
    lay = sent(fig)["layout"]
    assert [a["text"] for a in lay["annotations"]] == ["head 0 · previous-token", "head 1",
                                                       "head 2 · &lt;b&gt;induction&lt;/b&gt;"]
    assert not any("<b>" in s for s in all_strings(lay) if "<extra>" not in s)
    plain = attention_view(weights, scores, toks, layer=1, head=None, view=view, causal=True, overview_max_tokens=48)
    np.testing.assert_array_equal(attention_panels(fig), attention_panels(plain))  # same cells


def test_badge_goes_after_a_single_heads_title_and_the_overview_ignores_badges():
    weights, scores, toks = view_case()
    badges = {1: "self <i>"}
    common = {"causal": True, "overview_max_tokens": 48, "badges": badges}
    one = sent(attention_view(weights, scores, toks, layer=0, head=1, view="weights", **common))["layout"]
    assert one["title"]["text"] == "Layer 0, head 1: attention weights · self &lt;i&gt;"
    other = sent(attention_view(weights, scores, toks, layer=0, head=2, view="weights", **common))["layout"]
    assert other["title"]["text"] == "Layer 0, head 2: attention weights"  # no badge for head 2
    prefixed = sent(attention_view(weights, scores, toks, layer=0, head=1, view="scores", title_prefix="Step 3 · ",
                                   **common))["layout"]
    assert prefixed["title"]["text"] == "Step 3 · Layer 0, head 1: attention scores (before softmax) · self &lt;i&gt;"
    overview = attention_view(weights, scores, toks, layer=0, head=None, view="all layers", **common)
    bare = attention_view(weights, scores, toks, layer=0, head=None, view="all layers", causal=True,
                          overview_max_tokens=48)
    assert plot_json(overview) == plot_json(bare)
    with pytest.raises(ValueError, match="badges must map head numbers to text"):
        attention_view(weights, scores, toks, layer=0, head=None, view="weights", causal=True,
                       overview_max_tokens=48, badges=["x"])


# ----------------------------------------------------------------------------- all figures


def all_figures() -> list[FigureSpec]:
    scores = make_scores()
    probs, pieces = lens_case()
    return [
        role_overview(scores, ROLES, selected=(0, 1), marked=[(1, 2)]),
        score_changes(scores, make_scores(seed=9), ROLES),
        lens_grid(probs, pieces),
        compare_distributions(pieces, probs[0], probs[-1]),
        attention_difference(diff_case(), [f"w{i}" for i in range(7)], layer=0, causal=True),
    ]


def test_new_figures_are_valid_plotly_on_transparent_backgrounds():
    for fig in all_figures():
        assert isinstance(fig, FigureSpec)
        spec = sent(fig)
        lay = spec["layout"]
        assert lay["paper_bgcolor"] == lay["plot_bgcolor"] == "rgba(0,0,0,0)"
        assert lay["font"]["color"] == viz._common.TEXT_GREY
        plain = fig.to_plotly()  # plotly validates every attribute name and value
        # the same traces (plotly expands a named colour scale such as "Viridis" into its stops)
        strip = [{k: v for k, v in tr.items() if k != "colorscale"} for tr in spec["data"]]
        assert_same_values(strip, [{k: v for k, v in tr.items() if k != "colorscale"}
                                   for tr in json.loads(plain.to_json())["data"]])


def test_exports_and_return_annotations():
    for name in ("role_overview", "score_changes", "lens_grid", "compare_distributions", "attention_difference"):
        fn = getattr(viz, name)
        assert name in viz.__all__ and typing.get_type_hints(fn)["return"] is FigureSpec
        assert fn.__doc__ and len(fn.__doc__.strip().splitlines()) > 2
