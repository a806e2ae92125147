"""The Circuits view's stateless tools (lab/tools.py: dla, composition, head_circuits, atp) give the numbers the
session's `circuits` part gives on the same model and prompt, the page's way: direct logit attribution and one
head's circuits on a person's text after Step then Undo (the prompt alone), composition and attribution patching
by the model's name. The composition scores a tool computes are the server's one cache's, which the page then
reads; the long jobs keep the page's limits (refused before any work past them; attribution patching re-runs only
its top cells when the whole exact sweep would pass the limit). A tool keeps nothing, refuses in the lab's
sentences, and its session counts against its caller's share of memory.
"""

from __future__ import annotations

import gc
import re

import numpy as np
import pytest

from lab import circuits as circuits_part
from lab import patching, tools
from lab.checks import UserError
from lab.circuits_atp import verify_flops
from lab.circuits_records import COMPOSITION, TOP_PAIRS
from lab.server.budget import MODEL_BUDGET
from lab.session import SESSIONS, Session

from tests.lab.test_tools import GRAMMAR, A, B, P, page_text  # the same prompts and the page's Step then Undo


def held_now() -> int:
    """What sessions hold now, once earlier tests' sessions (kept alive by reference cycles) are gone."""
    gc.collect()
    return MODEL_BUDGET.total


def model_of(name: str):
    return Session().entry_for(name).model


@pytest.mark.parametrize("position,answer,other", [(None, " tom", " anna"), (4, None, None), (9, "tom", None)])
def test_dla_is_the_pages_attribution_on_the_prompt(position, answer, other):
    want = page_text(GRAMMAR, P).circuits.dla(position, answer, other)
    got = tools.dla_tool(GRAMMAR, P, position, answer, other)
    assert {k: got[k] for k in want.to_json()} == want.to_json()
    assert got["label"] == want.label and got["units"] == "logits" and got["tokens"] == P.split()
    assert got["position"] == (11 if position is None else position)
    assert got["direct_sum"] + got["remainder"] == pytest.approx(got["actual"], abs=1e-4)
    np.testing.assert_array_equal(np.array(got["heads"]), want.heads)
    assert tools.dla_tool(GRAMMAR, P, position, answer or "", other or " ") == got  # a blank box is no answer


def test_composition_is_the_models_scores_kept_for_the_page_too():
    COMPOSITION.forget(model_of(GRAMMAR))  # computed by this call, not read from an earlier test's
    got = tools.composition_tool(GRAMMAR, "k", 3)
    assert got["cached"] is False and got["kind"] == "k" and got["scores"] is None and len(got["pairs"]) == 3
    page = Session().circuits.composition(GRAMMAR)  # the page reads what the tool computed
    assert page.cached is True
    want = page.to_json()
    assert got["pairs"] == want["top"]["k"][:3] and got["copying"] == want["copying"]
    for kind in ("q", "k", "v"):
        whole = tools.composition_tool(GRAMMAR, kind, 0)
        assert whole["cached"] is True and whole["pairs"] == [] and whole["scores"] == want[kind]
    # past the record's ten pairs the engine's ranking goes on: every pair of heads in different layers, in order
    every = tools.composition_tool(GRAMMAR, "q", 1000)["pairs"]
    assert len(every) == 3 * 4 * 4 and every[:TOP_PAIRS] == want["top"]["q"]
    assert [p["score"] for p in every] == sorted((p["score"] for p in every), reverse=True)


def test_composition_past_the_servers_limit_is_refused_before_any_work(monkeypatch):
    model = model_of(GRAMMAR)
    COMPOSITION.forget(model)
    monkeypatch.setattr(circuits_part, "MAX_COMPOSITION_GFLOP", 1e-6)
    held = held_now()
    with pytest.raises(UserError) as info:
        tools.composition_tool(GRAMMAR)
    assert re.search(r"^The composition scores of this model \(3 layers × 4 heads.*past the server's", str(info.value))
    assert COMPOSITION.get(model, True) is None and held_now() == held


def test_head_circuits_are_the_pages_on_the_prompts_tokens():
    want = page_text(GRAMMAR, P).circuits.circuits(2, 1).to_json()
    got = tools.head_circuits_tool(GRAMMAR, P, 2, 1)
    assert {k: got[k] for k in want} == want
    assert got["token_ids"] and got["qk_tokens"] == P.split()
    lam = np.array(want["eigenvalues_real"]) + 1j * np.array(want["eigenvalues_imag"])
    s = got["spectrum"]
    assert s["count"] == lam.size and s["positive_real"] == int((lam.real > 0).sum())
    assert s["sum_real"] / s["sum_abs"] == pytest.approx(want["copying"], rel=1e-12)
    assert s["largest_abs"] == pytest.approx(np.abs(lam).max())


def test_atp_is_the_pages_with_the_exact_sweep_within_the_limit():
    want = Session().circuits.atp(GRAMMAR, A, B, "logit_diff", " she", " he", "heads", "noising", 3).to_json()
    got = tools.atp_tool(GRAMMAR, A, B, " she", " he", "heads", "noising", 3)
    assert got == want and got["exact_mode"] == "sweep" and len(got["verified"]) == 3
    prob = Session().circuits.atp(GRAMMAR, A, B, "prob", " her", None, "mlp", "denoising", 5).to_json()
    assert tools.atp_tool(GRAMMAR, A, B, " her", kind="mlp", metric="prob") == prob  # k: 5 by default
    assert len(prob["verified"]) == tools.ATP_TOOL_TOP


def test_atp_past_the_sweeps_limit_re_runs_only_its_top_cells(monkeypatch):
    """The page's budget of exact work: when the whole sweep would pass it, the k cells of largest estimate are
    the only ones run exactly; when even those would, the call is refused before any forward."""
    entry = Session().entry_for(GRAMMAR)
    T = len(patching.prepare_sweep(entry, A, B, "logit_diff", " she", " he").ids_a)  # the prompt and its BOS
    top = verify_flops(entry, "heads", T, 2)
    assert top < patching.sweep_flops(entry, "heads", T)
    monkeypatch.setattr(patching, "MAX_SWEEP_GFLOP", top / 1e9)
    got = tools.atp_tool(GRAMMAR, A, B, " she", " he", "heads", "denoising", 2)
    assert got["exact_mode"] == "top-k" and len(got["verified"]) == 2
    assert sum(v is not None for row in got["exact_metric"] for v in row) == 2
    held = held_now()
    with pytest.raises(UserError, match=rf"^Even 3 exact re-runs of {T} tokens on this model pass the server's"):
        tools.atp_tool(GRAMMAR, A, B, " she", " he", "heads", "denoising", 3)
    assert held_now() == held


def test_a_circuits_tool_keeps_nothing_and_answers_the_same_again():
    first = tools.head_circuits_tool(GRAMMAR, P, 1, 0)
    held, kept = held_now(), len(SESSIONS)
    assert tools.dla_tool(GRAMMAR, P) == tools.dla_tool(GRAMMAR, P)
    tools.atp_tool(GRAMMAR, A, B, " she", " he", k=1)
    tools.composition_tool(GRAMMAR)
    assert tools.head_circuits_tool(GRAMMAR, P, 1, 0) == first
    assert held_now() == held and len(SESSIONS) == kept


@pytest.mark.parametrize("call,pattern", [
    (lambda: tools.dla_tool("no such model", P), r"^Unknown model 'no such model'\. Pick one"),
    (lambda: tools.dla_tool(GRAMMAR, P, 12), r"^token position must be a whole number between 0 and 11; got 12"),
    (lambda: tools.dla_tool(GRAMMAR, P, None, " tom", " tom"), r"^The two answer tokens are the same token"),
    (lambda: tools.dla_tool(GRAMMAR, P, None, None, " anna"), r"^Give the first answer token too"),
    (lambda: tools.dla_tool(GRAMMAR, "", None), r"^The prompt is empty"),
    (lambda: tools.composition_tool("no such model"), r"^Unknown model 'no such model'\. Pick one"),
    (lambda: tools.composition_tool(GRAMMAR, "o"), r"^kind must be one of q, k, v; got"),
    (lambda: tools.composition_tool(GRAMMAR, "k", -1), r"^top must be a whole number between 0 and 1000; got -1"),
    (lambda: tools.head_circuits_tool(GRAMMAR, P, 3, 0), r"^layer must be a whole number between 0 and 2; got 3"),
    (lambda: tools.head_circuits_tool(GRAMMAR, P, 0, 4), r"^head must be a whole number between 0 and 3; got 4"),
    (lambda: tools.atp_tool(GRAMMAR, A, "tom found", " she", " he"), r"same number of tokens"),
    (lambda: tools.atp_tool(GRAMMAR, A, B, " she", " he", "heads", "denoising", 51), r"cells to re-run exactly"),
    (lambda: tools.atp_tool(GRAMMAR, A, B, " she", " he", "neurons"), r"^what to patch must be one of"),
    (lambda: tools.atp_tool(GRAMMAR, A, B, " she", " he", "heads", "sideways"), r"^direction must be one of"),
])
def test_refusals_are_the_labs_sentences_and_give_back_the_memory(call, pattern):
    held = held_now()
    with pytest.raises(UserError) as info:
        call()
    assert re.search(pattern, str(info.value)), str(info.value)
    assert "\n" not in str(info.value) and held_now() == held


def test_a_circuits_tools_session_counts_against_its_callers_share(monkeypatch):
    monkeypatch.setattr(MODEL_BUDGET, "client_limit_bytes", 1024)  # less than any text or job
    for call in (lambda client: tools.dla_tool(GRAMMAR, P, client=client),
                 lambda client: tools.atp_tool(GRAMMAR, A, B, " she", " he", k=1, client=client)):
        with pytest.raises(UserError, match="one address may hold"):
            call("203.0.113.9")
        assert call(None)["model"] == GRAMMAR  # no client: no client's share
