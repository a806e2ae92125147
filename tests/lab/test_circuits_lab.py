"""The Circuits view's lab part (lab/circuits.py, lab/circuits_records.py, lab/circuits_heads.py,
lab/circuits_atp.py) against the engine it calls (model/circuits.py, model/attribution.py) and lab.patching's
exact sweep: on the built-in grammar model and on a random model of 12 layers × 12 heads (small d_model), every
number of each record equals the engine's on the same input; refusals are one sentence and change nothing;
progress, Stop, one long job per session, the shared composition cache, the memory budget and the downloads.
The engine's numbers are held to float64 references of the definitions in tests/engine/.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import types

import numpy as np
import pytest
import torch

from lab import circuits, circuits_atp, circuits_records, patching
from lab.catalogue.models import BUILTINS, ModelEntry
from lab.checks import UserError
from lab.circuits import Circuits
from lab.circuits_records import COMPOSITION, POST_NORM, composition_flops
from lab.server.budget import MODEL_BUDGET, ModelBudget
from lab.session import Session
from model.attribution import AnswerMetric, attribute
from model.circuits import composition_scores, copying_scores, direct_logit_attribution, ov_circuit, qk_circuit
from model.config import ModelConfig
from model.generate import Sampling
from model.transformer import DecoderLM

GRAMMAR = "grammar (built-in)"
TWELVE = "twelve by twelve"
PROMPT = "anna found the key . she gave it to tom because he"
LONG_A = "anna found the key . she gave it to tom because he asked"
LONG_B = "tom found the key . he gave it to anna because she asked"
GREEDY = Sampling(temperature=0.0)


def one_sentence(message: str) -> bool:
    """No sentence ends inside it (the lab's checks may leave the final full stop out)."""
    return bool(message) and not re.search(r"[.!?] +[A-Z]", message)


def twelve_entry() -> ModelEntry:
    """12 layers × 12 heads of d_model 48 (head size 4), random weights, the sort model's characters."""
    sort = BUILTINS.get("sort digits (built-in)")
    with torch.random.fork_rng():
        torch.manual_seed(1)
        model = DecoderLM(dataclasses.replace(sort.model.cfg, n_layers=12, n_heads=12, d_model=48)).eval()
        with torch.no_grad():  # weights large enough that the heads differ visibly
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.3)
    return ModelEntry(TWELVE, model, sort.tokenizer, {"corpus": "sort"})


@pytest.fixture(scope="module")
def grammar() -> Session:
    s = Session()
    s.step(GRAMMAR, PROMPT, GREEDY)
    return s


@pytest.fixture(scope="module")
def twelve() -> Session:
    s = Session()
    s._add_model(twelve_entry())
    s.step(TWELVE, "503124=", GREEDY)
    return s


def recorded(session: Session):
    model = session.entry.model
    with torch.inference_mode():
        return model(torch.tensor([list(session.decoder.window)]), record=True, logits="last")


# ---------------------------------------------------------------------------------- direct logit attribution


@pytest.mark.parametrize("which", ["grammar", "twelve"])
def test_dla_is_the_engines_on_the_text(which, request):
    s = request.getfixturevalue(which)
    part, entry = Circuits(s), s.entry
    answer, other = (" tom", " anna") if which == "grammar" else ("1", "2")
    a, b = patching.answer_token(entry, answer, "first"), patching.answer_token(entry, other, "second")
    T = len(s.decoder.window)
    for index in (T - 1, 3):
        r = part.dla(index, answer, other)
        want = direct_logit_attribution(entry.model, recorded(s), index, a, b)
        np.testing.assert_array_equal(r.heads, want.heads)
        np.testing.assert_array_equal(r.mlps, want.mlps)
        assert (r.embedding, r.biases, r.actual, r.direct_sum, r.remainder, r.cap) == (
            want.embedding, want.biases, want.actual, want.direct_sum, want.remainder, want.cap)
        assert (r.position, r.answer, r.other) == (index, a, b) and abs(r.gap) < 1e-4  # the parts add up
        assert (r.answer_piece, r.other_piece) == (entry.pieces[a], entry.pieces[b])
        assert "Direct effect only" in r.to_json()["direct_only"] and part.last["dla"] is r
        json.dumps(r.to_json(), allow_nan=False)
    # the default position is the selected token; the default answer the model's own top prediction there
    s.select(2)
    try:
        r = part.dla()
    finally:
        s.select_last()
    with torch.inference_mode():
        logits = entry.model(torch.tensor([list(s.decoder.window)])).logits[0, 2].double()
    used = entry.model.cfg.vocab_used or entry.model.cfg.vocab_size
    assert r.position == 2 and r.other is None and r.default_answer
    assert r.answer == int(logits[:used].argmax()) and r.actual == pytest.approx(float(logits[r.answer]), abs=1e-4)


def test_dla_reads_one_kept_forward_per_text_and_window():
    s = Session()
    s.step(GRAMMAR, PROMPT, GREEDY)
    kept = circuits_records.RECORDED.get(s.text)
    assert circuits_records.RECORDED.get(s.text) is kept  # another token or answer: no forward
    s.step(GRAMMAR, PROMPT, GREEDY)  # the text grows: its window is another
    grown = circuits_records.RECORDED.get(s.text)
    assert grown is not kept and grown.activations.shape[1] == kept.activations.shape[1] + 1
    tight = circuits_records.RecordedForwards(max_one=0)  # too large to keep: run each time, hold nothing
    assert tight.get(s.text) is not tight.get(s.text) and tight.nbytes() == 0


def test_dla_refusals_are_sentences_and_change_nothing(grammar):
    part = Circuits(grammar)
    kept = part.dla(None, " tom", " anna")
    for args in ((None, " tom", " tom"), (None, " zebra", " anna"), (None, None, " anna"), (99, " tom", " anna"),
                 (None, "tom anna", None)):
        with pytest.raises(UserError) as exc:
            part.dla(*args)
        assert one_sentence(str(exc.value)), str(exc.value)
        assert part.last["dla"] is kept
    with pytest.raises(UserError, match="Press Step first"):
        Circuits(Session()).dla()


def test_dla_is_refused_on_a_post_norm_model():
    s = Session()
    sort = BUILTINS.get("sort digits (built-in)")
    model = DecoderLM(dataclasses.replace(sort.model.cfg, norm="post")).eval()
    s._add_model(ModelEntry("post", model, sort.tokenizer, {"corpus": "sort"}))
    s.step("post", "503124=", GREEDY)
    with pytest.raises(UserError) as exc:
        Circuits(s).dla()
    assert str(exc.value) == POST_NORM and one_sentence(POST_NORM)


# ---------------------------------------------------------------------------------- composition


@pytest.mark.parametrize("which", ["grammar", "twelve"])
def test_composition_is_the_engines_and_is_computed_once_per_model(which, request, monkeypatch):
    s = request.getfixturevalue(which)
    model = s.entry.model
    COMPOSITION.forget(model)
    seen = []
    r = Circuits(s).composition(progress=lambda *p: seen.append(p))
    want, copying = composition_scores(model), copying_scores(model)
    for kind in "qkv":
        np.testing.assert_array_equal(r.of(kind), want.of(kind))
        assert [(p.earlier + p.later + (p.score,)) for p in r.top[kind]] == want.top(kind, len(r.top[kind]))
    np.testing.assert_array_equal(r.copying, copying)
    L = model.cfg.n_layers
    assert [p[1] for p in seen] == list(range(1, 2 * L + 1)) and not r.cached and not r.stopped
    # a second request, by anyone, is read from the cache: the engine is not called
    monkeypatch.setattr(circuits_records, "composition_scores", None)
    again = Circuits(Session() if which == "grammar" else s).composition(s.entry.name)
    assert again.cached and all(np.array_equal(again.of(k), r.of(k), equal_nan=True) for k in "qkv")
    assert not again.k.flags.writeable  # every session reads the same arrays: none may change them
    json.dumps(again.to_json(), allow_nan=False)


def test_a_model_trained_further_is_computed_again(twelve):
    model = twelve.entry.model
    first = Circuits(twelve).composition()
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.mul_(1.0)  # an in-place step: the weights' version moves on
    again = Circuits(twelve).composition()
    assert not again.cached and np.array_equal(again.k, first.k, equal_nan=True)
    assert Circuits(twelve).composition().cached


def test_the_shared_cache_keeps_at_most_its_bound_least_recently_used_first(grammar, twelve):
    first, second = grammar.entry.model, twelve.entry.model
    results = {m: (composition_scores(m), copying_scores(m)) for m in (first, second)}
    one = circuits_records.CompositionCache.nbytes_of(types.SimpleNamespace(
        scores=results[second][0], copying=results[second][1]))
    cache = circuits_records.CompositionCache(max_bytes=one)  # room for the larger model's scores alone
    cache.put(first, True, *results[first])
    assert cache.get(first, True) is not None and cache.get(first, False) is None
    cache.put(second, True, *results[second])
    assert cache.get(first, True) is None and cache.get(second, True) is not None and cache.nbytes() == one
    cache.forget(second)
    assert cache.nbytes() == 0


def test_composition_stops_between_layers_and_a_stopped_result_is_not_kept(twelve):
    COMPOSITION.forget(twelve.entry.model)
    part = Circuits(twelve)
    held = MODEL_BUDGET.held(twelve)
    steps = part.composition_steps()
    assert next(steps).done == 1
    assert MODEL_BUDGET.held(twelve) == held + circuits_records.composition_bytes(twelve.entry)  # while it runs
    second = next(steps)
    assert second.phase == "composition" and second.done == 2 and part.running
    with pytest.raises(UserError, match="already running") as exc:
        next(part.atp_steps(TWELVE, "503124=", "503125=", "logit_diff", "0", "1"))
    assert one_sentence(str(exc.value))
    assert part.stop()
    last = list(steps)[-1].result
    assert last.stopped and last.done == 2 and np.isnan(last.k[:, :, 2:]).all() and np.isfinite(last.k[0, :, 1]).all()
    assert not part.running and not part.stop() and COMPOSITION.get(twelve.entry.model, True) is None
    assert MODEL_BUDGET.held(twelve) == held
    assert "Stopped after 2 of 12 layers" in last.summary()


def test_composition_refusals_are_sentences_and_change_nothing(twelve, monkeypatch):
    part = Circuits(twelve)
    COMPOSITION.forget(twelve.entry.model)
    monkeypatch.setattr(circuits, "MAX_COMPOSITION_GFLOP", 1e-6)
    with pytest.raises(UserError, match="past the server's") as exc:
        part.composition()
    assert one_sentence(str(exc.value)) and "composition" not in part.last and not part.running
    monkeypatch.undo()
    release = COMPOSITION.claim(twelve.entry.model, True)  # another session computes it now
    try:
        with pytest.raises(UserError, match="another session") as exc:
            part.composition()
        assert one_sentence(str(exc.value)) and not part.running
    finally:
        release()
    monkeypatch.setattr(circuits, "MODEL_BUDGET", ModelBudget(limit_bytes=1000))
    with pytest.raises(UserError, match="memory"):
        part.composition()
    assert "composition" not in part.last and not part.running


def test_the_composition_estimate_reads_the_shape():
    """GPT-2 small's scores fit the server's bound (~190 GFLOP, ~230 MB); GPT-2 medium's do not."""
    def entry(**kw):
        cfg = ModelConfig(vocab_size=50257, block_size=1024, **kw)
        return types.SimpleNamespace(cfg=cfg)
    small = entry(n_layers=12, n_heads=12, d_model=768)
    medium = entry(n_layers=24, n_heads=16, d_model=1024)
    assert 150e9 < composition_flops(small) < circuits.MAX_COMPOSITION_GFLOP * 1e9 < composition_flops(medium)
    assert 150 * 2**20 < circuits_records.composition_bytes(small) < circuits.MAX_COMPOSITION_BYTES


# ---------------------------------------------------------------------------------- one head's circuits


@pytest.mark.parametrize("which", ["grammar", "twelve"])
def test_head_circuits_are_the_engines_on_the_texts_tokens(which, request):
    s = request.getfixturevalue(which)
    window = list(s.decoder.window)
    L, H = s.entry.model.cfg.n_layers, s.entry.model.cfg.n_heads
    for layer, head in ((0, 0), (L - 1, H - 1)):
        r = Circuits(s).circuits(layer, head, top_k=3)
        ov = ov_circuit(s.entry.model, layer, head, r.inputs, 3)
        qk = qk_circuit(s.entry.model, layer, head, window)
        assert sorted(r.inputs) == sorted(set(window)) and r.copying == ov.copying
        for mine, theirs in ((r.eigenvalues, ov.eigenvalues), (r.top_ids, ov.top_ids), (r.top_values, ov.top_values),
                             (r.own_value, ov.own_value), (r.own_rank, ov.own_rank), (r.plain, qk.plain),
                             (r.positional, qk.positional), (r.allowed, qk.allowed)):
            np.testing.assert_array_equal(mine, theirs)
        assert r.top_pieces[0] == [s.entry.pieces[i] for i in ov.top_ids[0]] and r.qk_start == 0
        json.dumps(r.to_json(), allow_nan=False)


def test_head_circuit_refusals_are_sentences_and_change_nothing(grammar):
    part = Circuits(grammar)
    kept = part.circuits(1, 0)
    for layer, head, top in ((3, 0, 5), (0, 4, 5), (0, 0, 0), ("x", 0, 5)):
        with pytest.raises(UserError) as exc:
            part.circuits(layer, head, top)
        assert one_sentence(str(exc.value)), exc.value
        assert part.last["circuits"] is kept
    with pytest.raises(UserError, match="Press Step first"):
        Circuits(Session()).circuits(0, 0)


# ---------------------------------------------------------------------------------- attribution patching


@pytest.mark.parametrize("what,direction", [("heads", "denoising"), ("resid", "noising")])
def test_atp_beside_the_exact_sweep_on_the_grammar_model(what, direction):
    s = Session()
    part = Circuits(s)
    r = part.atp(GRAMMAR, LONG_A, LONG_B, "logit_diff", " she", " he", what, direction, k=6)
    setup = patching.prepare_sweep(s.entry_for(GRAMMAR), LONG_A, LONG_B, "logit_diff", " she", " he")
    sweep = patching.sweep(setup, what, direction)
    att = attribute(setup.entry.model, setup.ids_a, setup.ids_b, AnswerMetric("logit_diff", setup.metric.answer,
                                                                             setup.metric.other), direction)
    np.testing.assert_array_equal(r.estimate, att.estimates[what])
    np.testing.assert_array_equal(r.exact_metric, sweep.metric)
    np.testing.assert_array_equal(r.exact_share, sweep.values)
    assert (r.metric_a, r.metric_b, r.exact_mode) == (setup.clean, setup.corrupted, "sweep")
    assert len(r.verified) == 6 and (r.rows, r.columns) == (sweep.rows, sweep.columns)
    for c in r.verified:  # the exact re-runs are the sweep's cells bit for bit, and flagged as the grid is
        assert c.patched == sweep.metric[c.row, c.column] and c.disagrees == r.disagree[c.row, c.column]
    top = np.argsort(-np.abs(r.estimate).ravel(), kind="stable")[:6]
    assert [c.row * len(r.columns) + c.column for c in r.verified] == top.tolist()
    export = part.export("atp")
    rows = list(csv.reader(io.StringIO(export.csv)))
    assert len(rows) == 1 + r.estimate.size and json.loads(export.json_text())["exact_mode"] == "sweep"


def test_atp_on_the_twelve_head_model_and_the_top_cells_alone(twelve, monkeypatch):
    part = Circuits(twelve)
    args = (TWELVE, "503124=", "503125=", "logit_diff", "0", "1", "heads", "denoising", 5)
    full = part.atp(*args)
    assert full.estimate.shape == (12, 12) and np.isfinite(full.exact_metric).all()
    T = len(full.tokens_a)
    sweep, top = patching.sweep_flops(twelve.entry, "heads", T), circuits_atp.verify_flops(twelve.entry, "heads", T, 5)
    assert top < sweep
    monkeypatch.setattr(patching, "MAX_SWEEP_GFLOP", (top + sweep) / 2e9)  # the whole sweep past the bound
    alone = part.atp(*args)
    assert alone.exact_mode == "top-k" and np.isfinite(alone.exact_metric).sum() == 5
    np.testing.assert_array_equal(alone.estimate, full.estimate)
    for c in alone.verified:
        assert c.patched == full.exact_metric[c.row, c.column] == alone.exact_metric[c.row, c.column]
    assert any("only the 5 cells" in n for n in alone.notes)
    monkeypatch.setattr(patching, "MAX_SWEEP_GFLOP", top / 2e9)  # not even the top cells
    with pytest.raises(UserError, match="Even 5 exact re-runs") as exc:
        part.atp(*args)
    assert one_sentence(str(exc.value)) and part.last["atp"] is alone and not part.running


def test_atp_progress_stop_and_refusals(grammar):
    part = Circuits(grammar)
    args = (GRAMMAR, LONG_A, LONG_B, "logit_diff", " she", " he", "resid", "denoising")
    phases = []
    part.atp(*args, progress=lambda *p: phases.append(p[0]))
    assert phases[0] == "estimate" and "exact sweep" in phases
    kept = part.last["atp"]
    steps = part.atp_steps(*args)
    assert next(steps).phase == "estimate" and part.stop()
    stopped = list(steps)[-1].result
    assert stopped.stopped and not np.isfinite(stopped.estimate).any() and not stopped.verified
    assert "Stopped before the backward pass" in stopped.summary() and not part.running
    part.last["atp"] = kept
    bad = [(GRAMMAR, "anna found the key . she", "tom found the key", "logit_diff", " she", " he"),
           (GRAMMAR, LONG_A, LONG_B, "logit_diff", " she", " she"), (*args[:6], "neurons"),
           (*args[:7], "sideways"), (*args, 0), ("article toy (built-in)", "a", "b", "logit_diff", "x", "y", "mlp")]
    for call in bad:
        with pytest.raises(UserError):
            part.atp(*call)
        assert part.last["atp"] is kept and not part.running
    held = MODEL_BUDGET.held(grammar)
    with pytest.raises(UserError, match="Run attribution patching first"):
        Circuits(grammar).export("atp")
    assert MODEL_BUDGET.held(grammar) == held


# ---------------------------------------------------------------------------------- downloads


def test_each_download_holds_the_records_numbers(grammar):
    part = Circuits(grammar)
    for method in circuits.METHODS:
        with pytest.raises(UserError) as exc:
            part.export(method)
        assert one_sentence(str(exc.value))
    d = part.dla(None, " tom", " anna")
    part.composition()
    h = part.circuits(1, 0, top_k=2)
    e = part.export("dla")
    rows = list(csv.DictReader(io.StringIO(e.csv)))
    heads = {(int(r["layer"]), int(r["head"])): float(r["value"]) for r in rows if r["part"] == "head"}
    assert heads == {(li, hh): float(d.heads[li, hh]) for li in range(3) for hh in range(4)}
    assert float(next(r for r in rows if r["part"] == "actual")["value"]) == d.actual
    assert e.name == "grammar_dla_pos12_tom_anna" and json.loads(e.json_text())["actual"] == d.actual
    comp = part.export("composition")
    rows = list(csv.DictReader(io.StringIO(comp.csv)))
    assert len(rows) == 3 * (4 * 4 * 3) + 12  # 3 kinds × pairs of later layers, then the copying scores
    first = rows[0]
    assert float(first["score"]) == part.last["composition"].q[0, 0, 1, 0]
    head = part.export("circuits")
    data = json.loads(head.json_text())
    assert data["top_values"] == h.top_values.tolist() and data["qk_plain"] == h.plain.tolist()
    assert head.name == "grammar_L1H0_circuits"
    with pytest.raises(UserError) as exc:
        part.export("everything")
    assert "method must be one of" in str(exc.value)
