"""The training film's figures: score curves of every head, the loss curve's frame and phase lines,
the attention figure titled for a frame. Checked from the JSON the browser receives."""

from __future__ import annotations

import colorsys
import json

import numpy as np
import pytest

import viz
from viz import attention_view, decode_array, future_mask, payload_bytes, plot_json, score_curves
from viz.film import HEAD_DASHES, PHASE_SYMBOL, THRESHOLD_LINE
from viz.training import FRAME_LINE, LOG_RATIO, PHASE_LINE

INDUCTION = "mean over queries i whose token occurred earlier, at latest position j < i−1, of A[i, j+1]"


def spec_of(fig) -> dict:
    return json.loads(plot_json(fig))


def film(frames: int = 41, layers: int = 4, heads: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Steps denser early (0 … 2000) and scores in [0, 1] with a few undefined (NaN) frames."""
    rng = np.random.default_rng(seed)
    steps = np.unique(np.round(2000 * np.linspace(0, 1, frames) ** 2).astype(np.int64))
    while steps.size < frames:  # keep exactly `frames` increasing steps
        steps = np.unique(np.append(steps, steps[-1] + 1))
    scores = rng.random((frames, layers, heads))
    scores[2:5, min(1, layers - 1), heads - 1] = np.nan
    scores[0, 0, 0] = np.nan
    return steps, scores


def curves(fig) -> dict[str, dict]:
    return {tr["name"]: tr for tr in spec_of(fig)["data"] if tr["name"] != "phase"}


def shapes_of(layout: dict) -> list[dict]:
    return layout.get("shapes", [])


def texts_of(layout: dict) -> list[str]:
    return [a["text"] for a in layout.get("annotations", [])]


# ----------------------------------------------------------------------------- score curves


def test_every_head_is_a_line_carrying_exactly_the_scores_given():
    steps, scores = film()
    fig = score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=0.4)
    lines = curves(fig)
    names = [f"L{layer} H{head}" for layer in range(4) for head in range(4)]
    assert list(lines) == names  # legend order: layer by layer
    for layer in range(4):
        for head in range(4):
            tr = lines[f"L{layer} H{head}"]
            assert tr["type"] == "scatter" and tr.get("showlegend", True)
            np.testing.assert_array_equal(decode_array(tr["y"]), scores[:, layer, head])  # NaN where NaN
            np.testing.assert_array_equal(decode_array(tr["x"]), steps)
    assert spec_of(fig)["layout"]["meta"]["names"] == names


def test_nan_leaves_a_gap():
    steps, scores = film()
    tr = curves(score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=None))["L1 H3"]
    y = decode_array(tr["y"])
    assert np.isnan(y[2:5]).all() and np.isfinite(y[5:]).all() and np.isfinite(y[:2]).all()
    assert tr["connectgaps"] is False and tr["mode"] == "lines"


def test_colours_one_hue_family_per_layer_and_heads_told_apart():
    steps, scores = film(layers=3, heads=4)
    lines = curves(score_curves(steps, scores, score="self", formula="mean A[i, i]", threshold=0.5))

    def hls(colour: str) -> tuple[float, float, float]:
        return colorsys.rgb_to_hls(*(int(colour[k : k + 2], 16) / 255 for k in (1, 3, 5)))

    hues = {}
    for name, tr in lines.items():
        layer, head = int(name[1]), int(name[4])
        h, light, _ = hls(tr["line"]["color"])
        hues.setdefault(layer, set()).add(round(h * 360))
        assert 0.35 <= light <= 0.7  # readable on a light and a dark page
        assert tr["line"]["dash"] == HEAD_DASHES[head]
    assert all(len(v) == 1 for v in hues.values())  # one hue a layer
    assert len({next(iter(v)) for v in hues.values()}) == 3  # different hues across layers
    assert len({tr["line"]["color"] for tr in lines.values()}) == 12  # every head its own colour


def test_hover_names_layer_head_step_and_score():
    steps, scores = film()
    tr = curves(score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=0.4))["L1 H2"]
    assert tr["hovertemplate"] == "layer 1 · head 2 · step %{x} · induction %{y:.2f}<extra></extra>"


def test_threshold_line_present_iff_threshold_given():
    steps, scores = film()
    with_line = spec_of(score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=0.5))["layout"]
    lines = [s for s in shapes_of(with_line) if s.get("yref") == "y"]
    assert len(lines) == 1
    line = lines[0]
    assert (line["y0"], line["y1"], line["x0"], line["x1"], line["xref"]) == (0.5, 0.5, 0, 1, "paper")
    assert line["line"] == THRESHOLD_LINE and line["line"]["dash"] == "dash"
    assert "threshold 0.5" in texts_of(with_line)
    without = spec_of(score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=None))["layout"]
    assert not [s for s in shapes_of(without) if s.get("yref") == "y"]
    assert not any("threshold" in t for t in texts_of(without))
    with pytest.raises(ValueError, match="threshold"):
        score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=float("nan"))


def test_marker_at_the_frame_shown():
    steps, scores = film()
    lay = spec_of(score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=None,
                               marker_step=int(steps[20])))["layout"]
    marks = [s for s in shapes_of(lay) if s.get("xref") == "x"]
    assert len(marks) == 1
    assert marks[0]["x0"] == marks[0]["x1"] == int(steps[20]) and (marks[0]["y0"], marks[0]["y1"]) == (0, 1)
    assert marks[0]["line"] == FRAME_LINE and lay["meta"]["marker_step"] == int(steps[20])
    none = spec_of(score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=None))["layout"]
    assert not shapes_of(none)


def test_phase_markers_sit_on_the_heads_curve():
    steps, scores = film()
    at_frame = int(steps[10])
    between = int(steps[30]) + 1  # between frames 30 and 31: interpolated
    fig = score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=0.4,
                       phases=[(1, 2, at_frame), (3, 0, between)])
    spec = spec_of(fig)
    phase = [tr for tr in spec["data"] if tr["name"] == "phase"]
    assert len(phase) == 1
    phase = phase[0]
    assert phase["mode"] == "markers" and phase["marker"]["symbol"] == PHASE_SYMBOL
    assert phase["x"] == [at_frame, between]
    expected = np.interp(between, steps[30:32], scores[30:32, 3, 0])
    assert phase["y"][0] == scores[10, 1, 2]
    assert phase["y"][1] == pytest.approx(expected)
    lines = curves(fig)
    assert phase["marker"]["color"] == [lines["L1 H2"]["line"]["color"], lines["L3 H0"]["line"]["color"]]
    assert phase["hovertext"][0].startswith(f"layer 1 · head 2 · phase change around step {at_frame}")
    assert spec["layout"]["meta"]["phases"] == [[1, 2, at_frame], [3, 0, between]]
    for bad in ([(4, 0, 10)], [(0, 4, 10)], [(0, 0)], [(0, 0, float("inf"))]):
        with pytest.raises(ValueError, match="phase"):
            score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=None, phases=bad)


def test_highlight_thickens_one_head_and_fades_the_rest():
    steps, scores = film()
    lines = curves(score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=None,
                                highlight=(2, 1)))
    assert lines["L2 H1"]["line"]["width"] > lines["L0 H0"]["line"]["width"]
    assert lines["L2 H1"]["opacity"] == 1 and all(tr["opacity"] < 1 for n, tr in lines.items() if n != "L2 H1")
    with pytest.raises(ValueError, match="highlight"):
        score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=None, highlight=(0, 9))


def test_axes_span_the_steps_and_the_score():
    steps, scores = film()
    lay = spec_of(score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=0.4))["layout"]
    assert lay["xaxis"]["range"] == [0, int(steps[-1])]
    lo, hi = lay["yaxis"]["range"]
    assert -0.05 <= lo <= 0 and 1 <= hi <= 1.05
    assert lay["yaxis"]["title"]["text"] == "induction" and lay["xaxis"]["title"]["text"] == "step"
    running = spec_of(score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=0.4,
                                   total_steps=5000))["layout"]
    assert running["xaxis"]["range"] == [0, 5000]
    bits = spec_of(score_curves(steps, scores * 3.5, score="entropy (bits)", formula="−Σ A log₂ A",
                                threshold=None))["layout"]
    assert bits["yaxis"]["range"][0] == 0 and bits["yaxis"]["range"][1] >= np.nanmax(scores * 3.5)
    assert "bits" in bits["yaxis"]["title"]["text"]


def test_formula_is_the_subtitle_escaped_and_unbroken_at_comparisons():
    steps, scores = film()
    title = spec_of(score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=0.4))["layout"]["title"]
    assert "induction" in title["text"]
    sub = title["subtitle"]["text"]
    assert "&lt;" in sub and "<" not in sub.replace("<br>", "")
    assert sub.replace("<br>", " ").replace("\u00a0", " ") == INDUCTION.replace("<", "&lt;")
    assert "j\u00a0&lt;\u00a0i−1" in sub  # never wrapped inside "j < i−1"


@pytest.mark.parametrize("width", [240, 326, 600])
def test_the_formula_wraps_to_the_figure_width(width):
    """On a phone the formula's lines stay inside the figure: each at most as many characters as fit."""
    steps, scores = film()
    lay = spec_of(score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=0.4,
                               width_px=width))["layout"]
    lines = lay["title"]["subtitle"]["text"].replace("&lt;", "<").split("<br>")
    size = lay["title"]["subtitle"]["font"]["size"]
    assert all(len(t) * size * 0.6 <= width - 30 for t in lines), lines
    assert " ".join(lines).replace("\u00a0", " ") == INDUCTION
    with pytest.raises(ValueError, match="width_px"):
        score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=0.4, width_px=50)


def test_presentation_fonts_are_large():
    steps, scores = film()
    normal = spec_of(score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=0.4))["layout"]
    big = spec_of(score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=0.4,
                               presentation=True, height_px=420))["layout"]
    for name in ("xaxis", "yaxis"):
        assert big[name]["tickfont"]["size"] >= 16
        assert big[name]["title"]["font"]["size"] >= 16
    assert big["legend"]["font"]["size"] >= 16 and big["hoverlabel"]["font"]["size"] >= 16
    assert big["title"]["font"]["size"] > normal["title"]["font"]["size"]
    assert big["title"]["subtitle"]["font"]["size"] >= 16
    assert big["height"] == 420 and normal["height"] == 320
    assert big["paper_bgcolor"] == big["plot_bgcolor"] == "rgba(0,0,0,0)"  # dark mode


def test_validated_by_plotly_and_small_on_the_wire():
    steps, scores = film(41, 4, 4)
    for presentation in (False, True):
        fig = score_curves(steps, scores, score="induction", formula=INDUCTION, threshold=0.4,
                           marker_step=int(steps[20]), phases=[(1, 2, 340)], highlight=(1, 2),
                           presentation=presentation)
        fig.to_plotly()  # every property is one plotly knows
        assert payload_bytes(fig) < 60_000


def test_shapes_and_empty_film_checked():
    steps, scores = film()
    with pytest.raises(ValueError, match="frames"):
        score_curves(steps[:-1], scores, score="induction", formula=INDUCTION, threshold=None)
    with pytest.raises(ValueError, match="frames, layers, heads"):
        score_curves(steps, scores[:, 0], score="induction", formula=INDUCTION, threshold=None)
    with pytest.raises(ValueError, match="increasing"):
        score_curves(steps[::-1], scores, score="induction", formula=INDUCTION, threshold=None)
    empty = spec_of(score_curves(np.zeros(0, np.int64), np.zeros((0, 2, 2)), score="induction", formula=INDUCTION,
                                 threshold=0.4))
    assert "no frames recorded yet" in texts_of(empty["layout"])
    one = curves(score_curves(np.array([0]), np.full((1, 1, 1), 0.3), score="self", formula="A[i, i]",
                              threshold=None))["L0 H0"]
    assert one["mode"] == "lines+markers"


# ----------------------------------------------------------------------------- loss curve


def test_loss_curve_marker_and_phase_lines():
    steps = np.arange(0, 2001, 50)
    loss = 3 * np.exp(-steps / 400) + 0.3
    fig = viz.loss_curve(steps, loss, steps[::4], loss[::4] + 0.1, total_steps=2000, kept_step=1800,
                         marker_step=1000, phase_steps=[(800, "L2H3"), (340, "L1H2"), (360, "L0<H0>")])
    fig.to_plotly()
    lay = spec_of(fig)["layout"]
    shapes = lay["shapes"]
    assert shapes[0]["x0"] == 1800 and "kept: step 1800" in lay["annotations"][0]["text"]  # kept comes first
    frame = [s for s in shapes if s["line"] == FRAME_LINE]
    assert len(frame) == 1 and frame[0]["x0"] == frame[0]["x1"] == 1000
    phase = [s for s in shapes if s["line"] == PHASE_LINE]
    assert [s["x0"] for s in phase] == [340, 360, 800] and all(s["line"]["dash"] == "dot" for s in phase)
    labels = {a["text"]: a for a in lay["annotations"][1:]}
    # 20 steps apart is a few pixels: one label for both, right of the later line; the far one on its own
    assert set(labels) == {"L1H2<br>L0&lt;H0&gt;", "L2H3"}
    assert [labels[t]["x"] for t in ("L1H2<br>L0&lt;H0&gt;", "L2H3")] == [360, 800]
    assert all(a["xanchor"] == "left" and a["yshift"] == labels["L2H3"]["yshift"] for a in labels.values())
    assert lay["meta"]["marker_step"] == 1000


def _label_boxes(lay: dict, span: float, plot_px: float, char_px: float) -> list[tuple[float, float, float, float]]:
    """(left, right, top, bottom) in px of each phase label, from the annotation as plotly places it: x at the
    step, shifted, anchored on its left or right side; a line per <br>."""
    boxes = []
    for a in lay.get("annotations", []):
        if "kept" in a["text"]:
            continue
        lines = a["text"].split("<br>")
        w = max(len(t) for t in lines) * char_px
        x = (a["x"] * plot_px if a["xref"] == "paper" else a["x"] / span * plot_px) + a["xshift"]
        left, right = (x, x + w) if a["xanchor"] == "left" else (x - w, x)
        top = -a["yshift"]
        boxes.append((left, right, top, top + len(lines) * a["font"]["size"] * 1.2, a["xref"] == "paper"))
    return boxes


@pytest.mark.parametrize("plot_px", [200, 260, 560, 900])
@pytest.mark.parametrize("seed", range(6))
def test_phase_labels_never_overlap_and_no_line_crosses_one(plot_px, seed):
    """Phases at random steps (some on the same step, some a few steps apart, 16 heads at most): every label
    box is clear of every other and of every phase line, and lies inside the plot."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 17))
    heads = rng.choice(16, size=n, replace=False)
    steps = np.sort(rng.choice([63, 64, 84, 120, 258, 900, 1400, 1490, 1500], size=n))
    phases = [(int(s), f"L{h // 4}H{h % 4}") for s, h in zip(steps, heads)]
    fig = viz.loss_curve(np.arange(0, 1501, 50), np.linspace(3, 0.1, 31), total_steps=1500, phase_steps=phases,
                         plot_px=plot_px)
    lay = spec_of(fig)["layout"]
    char_px = 0.62 * lay["annotations"][0]["font"]["size"]
    boxes = _label_boxes(lay, 1500, plot_px, char_px)
    lines = [s["x0"] / 1500 * plot_px for s in lay["shapes"] if s["line"] == PHASE_LINE]
    assert len(lines) == n and 1 <= len(boxes) <= n
    named = [t for a in lay["annotations"] for t in a["text"].replace("<br>", ", ").replace(": ", ", ").split(", ")]
    for _, label in phases:  # every head is named once: "L1H2", or "L1: H0, H2" for several of a layer
        layer, head = label[1:].split("H")
        assert label in named or (f"L{layer}" in named and f"H{head}" in named)
    for i, (l1, r1, t1, b1, edge) in enumerate(boxes):
        assert -1e-6 <= l1 and r1 <= plot_px + 1e-6, "inside the plot"
        # no phase line crosses a label, unless its lines span the whole axis (then it sits at the right edge)
        assert edge or all(not (l1 < x < r1) for x in lines), "a phase line crosses a label"
        assert not edge or plot_px < 500
        for l2, r2, t2, b2, _ in boxes[i + 1:]:
            apart = r1 <= l2 or r2 <= l1  # side by side ...
            stacked = b1 <= t2 or b2 <= t1  # ... or one under the other
            assert apart or stacked


def test_a_loss_spanning_orders_of_magnitude_gets_a_log_axis():
    steps = np.arange(0, 1501, 50)
    falls = 2.8 * np.exp(-steps / 60) + 1e-3  # 2.8 → 0.001: a linear axis would show a flat line at 0
    lay = spec_of(viz.loss_curve(steps, falls, steps, falls * 1.1, total_steps=1500))["layout"]
    y = lay["yaxis"]
    assert y["type"] == "log" and y["title"]["text"] == "loss (log scale)" and lay["meta"]["log_y"] is True
    lowest, highest = float(falls.min()), float((falls * 1.1).max())
    assert y["range"][0] == np.floor(np.log10(lowest)) and 10 ** y["range"][1] >= highest  # every point shown
    assert y["exponentformat"] == "power"
    # within the ratio: linear from 0; and the choice can be forced either way
    mild = 2.0 / np.sqrt(steps + 10)
    assert mild.max() / mild.min() < LOG_RATIO
    lin = spec_of(viz.loss_curve(steps, mild, total_steps=1500))["layout"]["yaxis"]
    assert lin.get("type", "linear") == "linear" and lin["range"][0] == 0 and lin["title"]["text"] == "loss"
    forced = spec_of(viz.loss_curve(steps, mild, total_steps=1500, log_y=True))["layout"]["yaxis"]
    assert forced["type"] == "log"
    off = spec_of(viz.loss_curve(steps, falls, total_steps=1500, log_y=False))["layout"]["yaxis"]
    assert off.get("type", "linear") == "linear"
    # a log axis needs a positive loss; an empty curve stays linear
    assert spec_of(viz.loss_curve(steps, np.zeros(steps.size), log_y=True))["layout"]["yaxis"].get("type") != "log"
    assert spec_of(viz.loss_curve(np.zeros(0), np.zeros(0)))["layout"]["yaxis"].get("type") != "log"
    with pytest.raises(ValueError, match="plot_px"):
        viz.loss_curve(steps, falls, plot_px=10)


def test_loss_curve_unchanged_without_the_film_arguments():
    steps = np.arange(1, 151)
    lay = spec_of(viz.loss_curve(steps, 2.1 / np.sqrt(steps), total_steps=300))["layout"]
    assert "shapes" not in lay and "annotations" not in lay
    assert lay["height"] == 280 and lay["xaxis"]["range"] == [0, 300]
    empty = spec_of(viz.loss_curve(np.zeros(0), np.zeros(0), total_steps=300, marker_step=5))["layout"]
    assert texts_of(empty) == ["waiting for first step"]
    for bad in ("5", float("nan"), True):
        with pytest.raises(ValueError, match="marker_step"):
            viz.loss_curve(steps, 2.1 / np.sqrt(steps), marker_step=bad)
    with pytest.raises(ValueError, match="phase_steps"):
        viz.loss_curve(steps, 2.1 / np.sqrt(steps), phase_steps=[(3, "a", "b")])


def test_loss_curve_presentation_fonts():
    steps = np.arange(1, 151)
    lay = spec_of(viz.loss_curve(steps, 2.1 / np.sqrt(steps), total_steps=300, phase_steps=[(40, "L0H1")],
                                 presentation=True))["layout"]
    assert lay["xaxis"]["tickfont"]["size"] >= 16 and lay["yaxis"]["tickfont"]["size"] >= 16
    assert lay["legend"]["font"]["size"] >= 16 and lay["hoverlabel"]["font"]["size"] >= 16
    assert lay["annotations"][0]["font"]["size"] >= 15


# ----------------------------------------------------------------------------- attention, titled for a frame


def _attention(h: int = 2, t: int = 6) -> np.ndarray:
    rng = np.random.default_rng(1)
    s = rng.normal(size=(h, t, t))
    s[:, future_mask(t)] = -np.inf
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True))[None]


@pytest.mark.parametrize("view,head", [("weights", None), ("weights", 1), ("all layers", None)])
def test_attention_view_title_prefix(view, head):
    w = _attention()
    toks = list("abcdef")
    args = dict(layer=0, head=head, view=view, causal=True, overview_max_tokens=48)
    plain = spec_of(attention_view(w, None, toks, **args))
    framed = spec_of(attention_view(w, None, toks, title_prefix="Step 340 of 2000 · ", **args))
    assert framed["layout"]["title"]["text"] == "Step 340 of 2000 · " + plain["layout"]["title"]["text"]
    assert framed["data"] == plain["data"]
    framed["layout"]["title"]["text"] = plain["layout"]["title"]["text"]
    assert framed["layout"] == plain["layout"]  # nothing else changes
    escaped = spec_of(attention_view(w, None, toks, title_prefix="<b>", **args))
    assert escaped["layout"]["title"]["text"].startswith("&lt;b&gt;")


def test_attention_view_title_prefix_on_the_message_figure():
    w = _attention(t=6)
    fig = attention_view(w, None, list("abcdef"), layer=0, head=None, view="all layers", causal=True,
                         overview_max_tokens=3, title_prefix="Step 0 of 10 · ")
    assert spec_of(fig)["layout"]["annotations"][0]["text"].startswith("Step 0 of 10 · The overview draws")


def test_a_series_films_losses_are_named_and_their_legend_keeps_clear_of_the_title():
    """A film from checkpoints names its lines by what they measure ("loss on the probe", "held-out loss") in
    the legend and hover; on a phone's plot the longer legend gets a row of its own under the title."""
    steps = np.arange(0, 41, 10).astype(np.float32)
    names = ("loss on the probe", "held-out loss")
    wide = spec_of(viz.loss_curve(steps, 5 - steps / 10, steps, 6 - steps / 20, names=names, plot_px=700))
    narrow = spec_of(viz.loss_curve(steps, 5 - steps / 10, steps, 6 - steps / 20, names=names, plot_px=256))
    assert [t["name"] for t in wide["data"]] == list(names)
    assert [t["hovertemplate"].split(": ")[1].split(" %")[0] for t in wide["data"]] == list(names)
    plain = spec_of(viz.loss_curve(steps, 5 - steps / 10, steps, 6 - steps / 20, plot_px=700))
    assert [t["name"] for t in plain["data"]] == ["train", "validation"]
    assert wide["layout"]["margin"]["t"] == plain["layout"]["margin"]["t"]  # room enough: as before
    assert narrow["layout"]["margin"]["t"] > wide["layout"]["margin"]["t"]
    assert narrow["layout"]["title"]["yanchor"] == "top" and narrow["layout"]["title"]["y"] == 1
