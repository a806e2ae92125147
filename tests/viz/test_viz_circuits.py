"""The Circuits view's figures (viz/circuits.py, viz/circuits_heads.py, viz/circuits_atp.py), read back from
the JSON the browser receives: every value drawn is the lab record's number (to float32, what the wire
carries), on the built-in grammar model and on a random model of 12 layers × 12 heads; each figure builds at a
phone's, a laptop's and a wide width, with and without large fonts, within its size bounds; caller strings are
escaped.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from lab.catalogue.models import BUILTINS, ModelEntry
from lab.circuits import Circuits
from lab.session import Session
from model.generate import Sampling
from model.transformer import DecoderLM
from tests.support.figures import all_strings, sent
from viz import decode_array, payload_bytes
from viz._common import MARK_LINES, PRESENTATION_FONT_PX, ROW_OUTLINE
from viz.circuits import composition_map, composition_matrix, dla_map
from viz.circuits_atp import atp_maps, atp_scatter
from viz.circuits_heads import ov_spectrum, ov_table, qk_map

HOSTILE = "<img src=x onerror=alert(1)>"
WIDTHS = (390, 720, 1366)
MAX_HEIGHT_PX = 2400  # the tallest any of these figures may be (a phone's stacked maps in large fonts)
MAX_PAYLOAD = 300_000  # bytes on the wire: the 12 × 12 composition map is the largest (~110 KB)


def session_on(name: str, prompt: str, entry: ModelEntry | None = None) -> Session:
    s = Session()
    if entry is not None:
        s._add_model(entry)
    s.step(name, prompt, Sampling(temperature=0.0))
    return s


def twelve() -> ModelEntry:
    sort = BUILTINS.get("sort digits (built-in)")
    with torch.random.fork_rng():
        torch.manual_seed(2)
        model = DecoderLM(dataclasses.replace(sort.model.cfg, n_layers=12, n_heads=12, d_model=48)).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.3)
    return ModelEntry("twelve", model, sort.tokenizer, {"corpus": "sort"})


@pytest.fixture(scope="module", params=["grammar", "twelve"])
def records(request) -> dict:
    """Each method's record from the lab, on one model."""
    if request.param == "grammar":
        s = session_on("grammar (built-in)", "anna found the key . she gave it to tom because he")
        pair = ("anna found the key . she gave it to tom because he asked",
                "tom found the key . he gave it to anna because she asked", " she", " he")
        answers = (" tom", " anna")
    else:
        s = session_on("twelve", "503124=", twelve())
        pair, answers = ("503124=", "503125=", "0", "1"), ("1", "2")
    part = Circuits(s)
    L, H = s.entry.model.cfg.n_layers, s.entry.model.cfg.n_heads
    return {"dla": part.dla(None, *answers), "composition": part.composition(),
            "circuits": part.circuits(L - 1, H - 1), "atp": part.atp(s.entry.name, *pair[:2], "logit_diff", *pair[2:]),
            "shape": (L, H)}


def z_of(trace: dict) -> np.ndarray:
    return decode_array(trace["z"]).astype(np.float32)


def mlp_column(r) -> np.ndarray:
    return np.array([r.mlps[li] if li in r.mlp_layers else np.nan for li in range(len(r.mlps))])


def figures(rec: dict, width: int | None, presentation: bool) -> dict:
    """Every figure of the view from the records, as a page draws them."""
    d, c, h, a = rec["dla"], rec["composition"], rec["circuits"], rec["atp"]
    kw = {"presentation": presentation, "width_px": width}
    cells = {"rows": a.rows, "columns": a.columns, "heads": True}
    return {
        "dla": dla_map(d.heads, mlp_column(d), embedding=d.embedding, remainder=d.remainder, actual=d.actual,
                       label=d.label, selected=(0, 0), **kw),
        **{f"composition {k}": composition_map(c.of(k), kind=k, top=[p.earlier + p.later for p in c.top[k][:3]], **kw)
           for k in "qkv"},
        "ov": ov_table(h.input_pieces, h.top_pieces, h.top_values, copying=h.copying, layer=h.layer, head=h.head, **kw),
        "spectrum": ov_spectrum(h.eigenvalues, copying=h.copying, layer=h.layer, head=h.head, **kw),
        "qk plain": qk_map(h.plain, h.qk_tokens, h.allowed, layer=h.layer, head=h.head, positional=False, **kw),
        "qk positional": qk_map(h.positional, h.qk_tokens, h.allowed, layer=h.layer, head=h.head, positional=True,
                                selected_query=0, **kw),
        "atp scatter": atp_scatter(a.estimate_share, a.exact_share, a.disagree,
                                   verified=[(v.row, v.column) for v in a.verified], **cells, **kw),
        "atp maps": atp_maps(a.estimate_share, a.exact_share, a.disagree, **cells, **kw),
    }


def test_the_dla_map_draws_the_records_terms(records):
    r, (L, H) = records["dla"], records["shape"]
    spec = sent(figures(records, None, False)["dla"])
    heads, mlps = spec["data"]
    np.testing.assert_array_equal(z_of(heads), r.heads.astype(np.float32))
    np.testing.assert_array_equal(z_of(mlps)[:, 0], mlp_column(r).astype(np.float32))
    assert np.array(heads["customdata"]).shape == (L, H, 2) and heads["customdata"][L - 1][H - 1] == [L - 1, H - 1]
    lim = max(np.abs(r.heads).max(), np.nanmax(np.abs(mlp_column(r))))
    assert heads["zmin"] == -heads["zmax"] and heads["zmax"] == pytest.approx(lim)
    meta = spec["layout"]["meta"]
    assert (meta["pick"], meta["layers"], meta["heads"], meta["selected"]) == ("head", L, H, [0, 0])
    subtitle = spec["layout"]["title"]["subtitle"]["text"]
    assert f"actual {r.actual:+.2f}".replace("-", "−") in subtitle and "direct effect only" in subtitle
    assert f"L{L - 1}H{H - 1}: " in heads["hovertext"][L - 1][H - 1]


def test_the_composition_maps_draw_the_records_scores(records):
    r, (L, H) = records["composition"], records["shape"]
    figs = figures(records, None, False)
    for kind in "qkv":
        spec = sent(figs[f"composition {kind}"])
        (trace,) = spec["data"]
        want = composition_matrix(r.of(kind))
        assert want.shape == ((L - 1) * H,) * 2
        np.testing.assert_array_equal(z_of(trace), want.astype(np.float32))  # NaN (no later layer) stays NaN
        assert trace["y"][H] == "L1H0" and trace["x"][0] == "L1H0" and trace["x"][-1] == f"L{L - 1}H{H - 1}"
        e, h, later, h2 = r.top[kind][0].earlier + r.top[kind][0].later
        assert want[e * H + h, (later - 1) * H + h2] == r.top[kind][0].score  # the map's cell of the top pair
        outlined = [s for s in spec["layout"]["shapes"] if s.get("type") == "rect" and s["line"] == MARK_LINES[1]]
        assert len(outlined) == min(3, len(r.top[kind]))
        assert spec["layout"]["meta"]["pick"] == "pair" and spec["layout"]["meta"]["heads"] == H
        assert spec["layout"]["meta"]["blocks"] is False
        pairs = decode_array(trace["customdata"]).astype(np.int64)  # what a click on each cell opens (int8 sent)
        assert pairs.shape == want.shape + (4,)
        assert pairs[e * H + h, (later - 1) * H + h2].tolist() == [e, h, later, h2]
        rows, cols = np.indices(want.shape)
        np.testing.assert_array_equal(pairs[..., 0] * H + pairs[..., 1], rows)
        np.testing.assert_array_equal((pairs[..., 2] - 1) * H + pairs[..., 3], cols)


def test_a_map_too_narrow_for_a_cell_per_pair_shows_each_pair_of_layers_strongest_pair(records):
    """On a phone a 12 × 12 model's 132 × 132 pairs would be 1.4 px cells: the map has a cell per pair of layers
    instead, the strongest of its 144 head pairs (checked here against the scores cell by cell), which a click
    opens; the grammar model's 8 × 8 pairs keep a cell each."""
    r, (L, H) = records["composition"], records["shape"]
    best = r.top["k"][0]
    pair = best.earlier + best.later
    spec = sent(composition_map(r.of("k"), kind="k", top=[pair], selected=pair, width_px=390))
    (trace,) = spec["data"]
    meta = spec["layout"]["meta"]
    if L < 12:
        assert meta["blocks"] is False and z_of(trace).shape == ((L - 1) * H,) * 2
        return
    assert meta["blocks"] is True
    z, pairs = z_of(trace), decode_array(trace["customdata"])
    assert z.shape == (L - 1, L - 1) and pairs.shape == (L - 1, L - 1, 4)
    scores = r.of("k")
    for a in range(L - 1):
        for b in range(1, L):
            if b <= a:
                assert np.isnan(z[a, b - 1])
                continue
            block = scores[a, :, b, :]
            assert z[a, b - 1] == np.float32(np.nanmax(block))
            la, ha, lb, hb = pairs[a, b - 1].tolist()
            assert (la, lb) == (a, b) and scores[a, ha, b, hb] == np.nanmax(block)
    assert pairs[best.earlier[0], best.later[0] - 1].tolist() == list(pair)  # the strongest pair's own cell
    shapes = spec["layout"]["shapes"]
    at = (best.earlier[0], best.later[0] - 1)
    assert {(s["y0"] + s["y1"]) / 2 for s in shapes} == {at[0]} and {(s["x0"] + s["x1"]) / 2 for s in shapes} == {at[1]}
    assert [s["line"] for s in shapes[-len(ROW_OUTLINE):]] == [dict(line) for line in ROW_OUTLINE]
    assert trace["x"][0] == "L1" and trace["y"][-1] == f"L{L - 2}"


def test_the_head_circuit_figures_draw_the_records_numbers(records):
    r = records["circuits"]
    figs = figures(records, None, False)
    ov = sent(figs["ov"])
    (trace,) = ov["data"]
    np.testing.assert_array_equal(z_of(trace), r.top_values.astype(np.float32))
    copied = [(i, j) for i, row in enumerate(r.top_pieces) for j, p in enumerate(row) if p == r.input_pieces[i]]
    rects = [s for s in ov["layout"].get("shapes", []) if s["line"] == MARK_LINES[1]]
    assert len(rects) == len(copied)
    assert f"{r.copying:+.2f}".replace("-", "−") in ov["layout"]["title"]["subtitle"]["text"]
    spectrum = sent(figs["spectrum"])["data"][0]
    np.testing.assert_array_equal(decode_array(spectrum["x"]), r.eigenvalues.real.astype(np.float32))
    np.testing.assert_array_equal(decode_array(spectrum["y"]), r.eigenvalues.imag.astype(np.float32))
    for name, values in (("qk plain", r.plain), ("qk positional", r.positional)):
        spec = sent(figs[name])
        np.testing.assert_array_equal(z_of(spec["data"][0]), np.where(r.allowed, values, np.nan).astype(np.float32))
        assert spec["layout"]["meta"]["positional"] == (name == "qk positional")
    assert "with positions" in sent(figs["qk positional"])["layout"]["title"]["text"]


def test_the_atp_figures_draw_the_records_shares_and_flags(records):
    r = records["atp"]
    figs = figures(records, None, False)
    scatter = sent(figs["atp scatter"])["data"]
    both = np.isfinite(r.estimate_share) & np.isfinite(r.exact_share)
    for trace, pick in ((scatter[0], both & ~r.disagree), (scatter[1], both & r.disagree)):
        rr, cc = np.nonzero(pick)
        if rr.size:
            np.testing.assert_array_equal(decode_array(trace["x"]), r.exact_share[rr, cc].astype(np.float32))
            np.testing.assert_array_equal(decode_array(trace["y"]), r.estimate_share[rr, cc].astype(np.float32))
        assert [tuple(c) for c in trace["customdata"]] == list(zip(rr.tolist(), cc.tolist()))
    rings = scatter[2]["x"] if isinstance(scatter[2]["x"], list) else decode_array(scatter[2]["x"])
    assert len(rings) == len(r.verified)
    maps = sent(figs["atp maps"])
    est, ex = maps["data"]
    np.testing.assert_array_equal(z_of(est), r.estimate_share.astype(np.float32))
    np.testing.assert_array_equal(z_of(ex), r.exact_share.astype(np.float32))
    rects = [s for s in maps["layout"].get("shapes", []) if s["line"] == MARK_LINES[1]]
    assert len(rects) == 2 * int(r.disagree.sum())  # each disagreement outlined in both maps
    assert maps["layout"]["meta"]["disagree"] == [list(p) for p in zip(*np.nonzero(r.disagree))]


@pytest.mark.parametrize("presentation", [False, True])
def test_every_figure_builds_within_its_bounds_at_every_width(records, presentation):
    for width in WIDTHS:
        for name, fig in figures(records, width, presentation).items():
            spec = sent(fig)
            layout = spec["layout"]
            assert layout["height"] <= MAX_HEIGHT_PX, (name, width, layout["height"])
            assert payload_bytes(fig) <= MAX_PAYLOAD, (name, width, payload_bytes(fig))
            ticks = [a["tickfont"]["size"] for k, a in layout.items() if k.startswith(("xaxis", "yaxis"))
                     and "tickfont" in a]
            assert ticks and min(ticks) >= (PRESENTATION_FONT_PX if presentation else 11), name
            fig.to_plotly()  # plotly accepts every key


def test_figures_refuse_bad_input_and_escape_caller_text():
    heads = np.arange(6.0).reshape(2, 3)
    with pytest.raises(ValueError, match="width_px"):
        dla_map(heads, np.zeros(2), embedding={}, remainder=0.0, actual=0.0, width_px=100)
    with pytest.raises(ValueError, match="one value per layer"):
        dla_map(heads, np.zeros(3), embedding={}, remainder=0.0, actual=0.0)
    with pytest.raises(ValueError, match="kind"):
        composition_map(np.zeros((2, 2, 2, 2)), kind="x")
    one = sent(composition_map(np.full((1, 2, 1, 2), np.nan), kind="k"))
    assert "one layer" in " ".join(all_strings(one["layout"]))
    tokens = [HOSTILE, "b"]
    figs = [ov_table(tokens, [[HOSTILE], ["b"]], np.ones((2, 1)), copying=0.5, layer=0, head=0, title=HOSTILE),
            qk_map(np.ones((2, 2)), tokens, np.tril(np.ones((2, 2), bool)), layer=0, head=0, positional=False),
            atp_maps(np.ones((1, 2)), np.ones((1, 2)), np.zeros((1, 2), bool), rows=[HOSTILE], columns=tokens,
                     heads=False),
            dla_map(heads, np.zeros(2), embedding={HOSTILE: 1.0}, remainder=0.0, actual=15.0, label=HOSTILE)]
    for fig in figs:
        text = " ".join(all_strings(sent(fig)))
        assert HOSTILE not in text and "&lt;img" in text
    spec = sent(dla_map(heads, np.zeros(2), embedding={}, remainder=0.0, actual=15.0, selected=(1, 2)))
    assert [s["line"] for s in spec["layout"]["shapes"]] == [dict(line) for line in ROW_OUTLINE]
