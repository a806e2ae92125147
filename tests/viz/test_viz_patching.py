"""Tests for the activation-patching figures (viz/patching.py), read back from the JSON the browser receives."""

from __future__ import annotations

import numpy as np
import pytest
from tests.support.figures import all_strings, sent

from viz import DIVERGING, ROW_OUTLINE, decode_array
from viz._common import MARK_LINES, PRESENTATION_FONT_PX
from viz.patching import NOT_RUN, head_on_two_prompts, patching_map

HOSTILE = "<img src=x onerror=alert(1)>"


def share_grid(rows: int = 3, cols: int = 4, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    share = rng.normal(0.0, 0.2, (rows, cols))
    share[1, 0] = 0.84
    return share


def cells_outlined(spec: dict, line: dict) -> set[tuple[int, int]]:
    return {(round((s["y0"] + s["y1"]) / 2), round((s["x0"] + s["x1"]) / 2))
            for s in spec["layout"].get("shapes", []) if s["line"] == line}


def test_head_sweep_cells_carry_share_percent_and_head():
    share = share_grid()
    metric = share * 3 - 1
    spec = sent(patching_map(share, kind="heads", metric=metric))
    (trace,) = spec["data"]
    np.testing.assert_allclose(decode_array(trace["z"]).astype(np.float64), share, rtol=1e-6)
    assert trace["text"][1][0] == "84%"
    assert trace["text"][0][0] == f"{round(100 * share[0, 0])}%".replace("-", "−")
    cd = np.array(trace["customdata"])
    assert cd.shape == (3, 4, 2) and cd[2, 3].tolist() == [2, 3]
    meta = spec["layout"]["meta"]
    assert (meta["pick"], meta["layers"], meta["heads"]) == ("head", 3, 4)
    assert spec["layout"]["yaxis"]["ticktext"] == ["L0", "L1", "L2"]
    assert spec["layout"]["yaxis"]["range"] == [2.5, -0.5]  # layer 0 on top
    assert spec["layout"]["xaxis"]["ticktext"] == ["H0", "H1", "H2", "H3"]
    hover = trace["hovertext"][1][0]
    assert hover.startswith("L1H0") and "restores 84.0 % of the B → A difference" in hover
    assert f"{metric[1, 0]:.4f}" in hover


def test_colours_are_diverging_symmetric_and_mark_0_and_1():
    share = share_grid()
    spec = sent(patching_map(share, kind="heads"))
    (trace,) = spec["data"]
    assert trace["colorscale"] == [[s, c] for s, c in DIVERGING]
    assert trace["zmin"] == -1.0 and trace["zmax"] == 1.0  # never narrower than ±1: 1 is full red
    bar = trace["colorbar"]
    labels = dict(zip(bar["tickvals"], bar["ticktext"]))
    assert labels[0.0] == "0 = B" and labels[1.0] == "1 = A"
    share[2, 2] = -1.7  # a patch that overshoots the other way widens the range both ways
    spec = sent(patching_map(share, kind="heads", ends=("clean A", "corrupted B")))
    (trace,) = spec["data"]
    assert trace["zmin"] == pytest.approx(-1.7) and trace["zmax"] == pytest.approx(1.7)
    labels = dict(zip(trace["colorbar"]["tickvals"], trace["colorbar"]["ticktext"]))
    assert labels[0.0] == "0 = clean A" and labels[1.0] == "1 = corrupted B"
    assert "0 = the run as clean A, 1 = as corrupted B" in spec["layout"]["title"]["subtitle"]["text"]


def test_best_selected_and_not_computed_cells():
    share = share_grid()
    share[2, 3] = np.nan  # the sweep stopped before this cell
    spec = sent(patching_map(share, kind="heads", best=[(1, 0)], selected=(0, 2)))
    assert cells_outlined(spec, MARK_LINES[0]) == {(1, 0)} == cells_outlined(spec, MARK_LINES[1])
    assert cells_outlined(spec, ROW_OUTLINE[1]) == {(0, 2)}
    dashes = [(a["y"], a["x"]) for a in spec["layout"]["annotations"] if a["text"] == NOT_RUN]
    assert dashes == [(2, 3)]
    (trace,) = spec["data"]
    assert trace["text"][2][3] == "" and "not computed" in trace["hovertext"][2][3]
    assert spec["layout"]["meta"]["best"] == [[1, 0]] and spec["layout"]["meta"]["selected"] == [0, 2]


def test_position_sweep_names_tokens_and_has_no_head_pick():
    share = share_grid(4, 6)
    tokens = ["anna→tom", "found", "the", "key", ".", "she→he"]
    rows = ["embedding", "after L0", "after L1", "after L2"]
    spec = sent(patching_map(share, kind="positions", columns=tokens, rows=rows))
    (trace,) = spec["data"]
    assert "customdata" not in trace and "pick" not in spec["layout"]["meta"]
    assert spec["layout"]["yaxis"]["ticktext"] == rows
    assert spec["layout"]["xaxis"]["ticktext"][0] == "anna→tom"
    assert trace["hovertext"][3][5].startswith("after L2 · “she→he” (position 5)")


def test_narrow_layouts_drop_cell_text_and_thin_token_labels():
    share = share_grid(12, 16)
    tokens = [f"token{i}" for i in range(16)]
    wide = sent(patching_map(share, kind="positions", columns=tokens, width_px=1400))
    narrow = sent(patching_map(share, kind="positions", columns=tokens, width_px=330))
    assert "text" in wide["data"][0] and "text" not in narrow["data"][0]
    assert len(narrow["layout"]["xaxis"]["tickvals"]) < 16 == len(wide["layout"]["xaxis"]["tickvals"])
    assert all("restores" in h for row in narrow["data"][0]["hovertext"] for h in row)  # hover still names all


def test_presentation_fonts_and_escaping():
    share = share_grid()
    spec = sent(patching_map(share, kind="heads", presentation=True, title=HOSTILE, note=HOSTILE,
                             ends=(HOSTILE, "A")))
    assert spec["layout"]["xaxis"]["tickfont"]["size"] >= PRESENTATION_FONT_PX
    assert spec["data"][0]["colorbar"]["tickfont"]["size"] >= PRESENTATION_FONT_PX
    assert not any("<img" in s for s in all_strings(spec))
    pos = sent(patching_map(share, kind="positions", columns=[HOSTILE] * 4))
    assert not any("<img" in s for s in all_strings(pos))


@pytest.mark.parametrize("args, kwargs, message", [
    (np.zeros(3), {"kind": "heads"}, "2-D"),
    (np.zeros((2, 2)), {"kind": "layers"}, "kind"),
    (np.zeros((2, 2)), {"kind": "positions"}, "token labels"),
    (np.zeros((2, 2)), {"kind": "heads", "columns": ["H0"]}, "column labels"),
    (np.zeros((2, 2)), {"kind": "heads", "rows": ["L0"]}, "row labels"),
    (np.full((2, 2), np.inf), {"kind": "heads"}, "finite"),
    (np.zeros((2, 2)), {"kind": "heads", "metric": np.zeros(3)}, "metric"),
    (np.zeros((2, 2)), {"kind": "heads", "best": [(2, 0)]}, "best row"),
    (np.zeros((2, 2)), {"kind": "heads", "selected": (0, 5)}, "selected column"),
])
def test_patching_map_rejects_bad_input(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        patching_map(args, **kwargs)


def test_head_on_two_prompts_shows_each_prompts_weights():
    rng = np.random.default_rng(1)
    t = 5
    w = rng.random((2, t, t)) * np.tril(np.ones((t, t)))
    w /= w.sum(-1, keepdims=True)
    tokens = ["anna→tom", "found", "the", "key", "she→he"]
    spec = sent(head_on_two_prompts(w[0], w[1], tokens, layer=1, head=0, causal=True))
    panels = spec["layout"]["meta"]["panels"]
    assert [(p["layer"], p["head"]) for p in panels] == [(1, 0), (1, 0)]
    assert "L1H0" in spec["layout"]["title"]["text"]
    strings = all_strings(spec)
    assert "prompt A" in strings and "prompt B" in strings
    # each panel's cells decode back to that prompt's weights (milli-units, masked cells NaN)
    heat = [tr for tr in spec["data"] if tr["type"] == "heatmap"]
    by_axis: dict[str, list] = {}
    for tr in heat:
        by_axis.setdefault(tr.get("xaxis", "x"), []).append(tr)
    assert len(by_axis) == 2
    for k, (xa, traces) in enumerate(sorted(by_axis.items())):
        seen = np.full((t, t), np.nan)
        for tr in traces:
            z = decode_array(tr["z"]).astype(np.float64)
            y0, x0 = int(tr.get("y0", 0)), int(tr.get("x0", 0))
            seen[y0:y0 + z.shape[0], x0:x0 + z.shape[1]] = np.where(np.isnan(z), seen[y0:y0 + z.shape[0],
                                                                                       x0:x0 + z.shape[1]], z)
        lower = np.tril(np.ones((t, t), bool))
        np.testing.assert_allclose(seen[lower] / 1000, w[k][lower], atol=5e-4 + 1e-9)


def test_head_on_two_prompts_rejects_bad_input():
    w = np.eye(3)
    with pytest.raises(ValueError, match="weights_b"):
        head_on_two_prompts(w, np.eye(4), list("abc"), layer=0, head=0, causal=True)
    with pytest.raises(ValueError, match="square"):
        head_on_two_prompts(np.ones((2, 3)), w, list("abc"), layer=0, head=0, causal=True)
    with pytest.raises(ValueError, match="head"):
        head_on_two_prompts(w, w, list("abc"), layer=0, head=-1, causal=True)


def test_head_on_two_prompts_puts_b_under_a_on_a_phone():
    w = np.tril(np.ones((5, 5)))
    w /= w.sum(-1, keepdims=True)
    for width, side_by_side in ((720, True), (390, False)):
        layout = sent(head_on_two_prompts(w, w, list("abcde"), layer=1, head=0, causal=True, width_px=width))["layout"]
        a, b = (layout["xaxis" + p["xaxis"][1:]]["domain"] for p in layout["meta"]["panels"])
        assert (a[1] <= b[0]) == side_by_side and (a == b) != side_by_side, width


def test_a_caution_heads_the_subtitle_in_bold_wrapped_and_escaped():
    """A sweep whose difference is noise (lab.patching.PatchResult.cautions) carries its warning on the map
    itself, first under the title, so a downloaded PNG keeps it; the plot area moves down to fit it."""
    share = share_grid()
    plain = sent(patching_map(share, kind="heads", width_px=390))["layout"]
    caution = ("The A/B difference (+0.445) is small next to the patched runs' spread (1.480): read these shares "
               f"as noise {HOSTILE}")
    lay = sent(patching_map(share, kind="heads", width_px=390, caution=caution))["layout"]
    lines = lay["title"]["subtitle"]["text"].split("<br>")
    warned = [line for line in lines if line.startswith("<b>")]
    assert warned[0].startswith("<b>⚠ The A/B difference") and len(warned) >= 3  # wrapped for a phone
    assert all(line.endswith("</b>") for line in warned) and lines[:len(warned)] == warned
    assert "<img" not in lay["title"]["subtitle"]["text"] and "&lt;img" in lay["title"]["subtitle"]["text"]
    assert lines[-1] == plain["title"]["subtitle"]["text"].split("<br>")[-1]  # the legend still follows
    assert lay["margin"]["t"] > plain["margin"]["t"] and lay["height"] > plain["height"]
