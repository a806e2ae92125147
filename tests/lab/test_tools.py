"""The stateless tools (lab/tools.py) give the numbers the Session's verbs give on the same model, prompt and
seed, the page's way: a person's session that Steps the prompt then Undoes it (the prompt alone, nothing
sampled), then asks its head tools, Inside one cell or a patching sweep; `generate` is Generate on a new text.
A tool keeps nothing: the memory its session held goes back, no session of the store is made, and the same
arguments give the same numbers again. Refusals are the lab's sentences, and a tool's session counts against
its caller's share of memory.
"""

from __future__ import annotations

import gc
import re

import numpy as np
import pytest

from lab import tools
from lab.checks import UserError
from lab.server.budget import MODEL_BUDGET
from lab.session import SESSIONS, Session
from model.generate import Sampling

GRAMMAR, COPY = "grammar (built-in)", "copy / induction (built-in)"
P = "anna found the key . she gave it to tom because he"
A = "anna found the key . she gave it to tom because he asked"
B = "tom found the key . he gave it to anna because she asked"
GREEDY = Sampling(temperature=0.0, top_k=0, top_p=1.0, seed=0)


def page_text(model: str, prompt: str) -> Session:
    """A person's session as the page leaves it after Step then Undo: the prompt alone."""
    session = Session()
    session.step(model, prompt, GREEDY)
    session.undo()
    return session


def test_generate_is_the_pages_generate_with_the_same_seed():
    sampling = Sampling(temperature=0.9, top_k=20, top_p=0.95, seed=7)
    session = Session()
    for _ in session.generate(GRAMMAR, P, sampling, 12):
        pass
    got = tools.generate_tool(GRAMMAR, P, 12, 0.9, 20, 0.95, 7)
    drawn = session.drawn
    assert [g["token_id"] for g in got["generated"]] == [s.token_id for s in drawn]
    assert [g["piece"] for g in got["generated"]] == [s.piece for s in drawn]
    assert [g["probability"] for g in got["generated"]] == [float(s.probs[s.token_id]) for s in drawn]
    assert [g["sampled_probability"] for g in got["generated"]] == [float(s.adjusted[s.token_id]) for s in drawn]
    assert got["text"] == session.generated_text() and got["prompt_tokens"] == P.split()
    assert [g["position"] for g in got["generated"]] == list(range(12, 12 + len(drawn)))
    assert got["sampling"] == {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "seed": 7}
    assert tools.generate_tool(GRAMMAR, P, 12, 0.9, 20, 0.95, 8)["generated"] != got["generated"]  # the seed counts


@pytest.mark.parametrize("model,prompt,layer", [(GRAMMAR, P, 1), (COPY, "hcbpadlk|hcb", 0)])
def test_attention_is_the_texts_own(model, prompt, layer):
    att = page_text(model, prompt).attention()
    for head in (0, None):
        got = tools.attention_tool(model, prompt, layer, head)
        heads = [head] if head is not None else list(range(len(att.weights[layer])))
        assert got["heads"] == heads and got["tokens"] == att.tokens and got["causal"] is True
        for i, h in enumerate(heads):
            T = len(att.tokens)
            weights = np.array([[np.nan if v is None else v for v in row] for row in got["weights"][i]])
            scores = np.array([[np.nan if v is None else v for v in row] for row in got["scores"][i]])
            hidden = np.triu(np.ones((T, T), dtype=bool), 1)  # a key after its query: null
            assert np.isnan(weights[hidden]).all() and np.isnan(scores[hidden]).all()
            np.testing.assert_array_equal(weights[~hidden], att.weights[layer][h][~hidden])
            np.testing.assert_array_equal(scores[~hidden], att.scores[layer][h][~hidden])
            np.testing.assert_allclose(np.nansum(weights, axis=1), 1.0, atol=1e-5)


def test_head_roles_are_the_texts_table_at_full_precision():
    roles = page_text(GRAMMAR, P).heads.head_roles()
    got = tools.head_roles_tool(GRAMMAR, P)
    assert got["columns"] == roles.columns() and got["rows"] == roles.rows(digits=None)
    assert got["thresholds"] == {r.key: r.threshold for r in roles.roles}
    assert got["formulas"] == {r.key: r.formula for r in roles.roles}
    assert len(got["rows"]) == 3 * 4 and got["tokens"] == P.split()


@pytest.mark.parametrize("position", [None, 5])
def test_the_logit_lens_is_the_pages(position):
    lens = page_text(GRAMMAR, P).heads.lens_at(position)
    got = tools.logit_lens_tool(GRAMMAR, P, position)
    assert got["index"] == lens.index and got["token"] == lens.token and got["stages"] == lens.labels
    assert [[s, r, piece, round(p, 6)] for s, r, _, piece, p in got["rows"]] == lens.top()
    last = [row for row in got["rows"] if row[0] == lens.labels[-1]]
    assert [row[4] for row in last] == sorted((row[4] for row in last), reverse=True)


def test_ablate_is_the_pages_effect_and_regeneration():
    session = page_text(GRAMMAR, P)
    session.heads.set_ablation(["L1H1", "L2H0"], "mean", False)
    e = session.heads.effect()
    r = session.heads.regenerate(Sampling(temperature=0.8, top_k=0, top_p=1.0, seed=3), 10)
    got = tools.ablate_tool(GRAMMAR, P, ["L1H1", "L2H0"], "mean", False, None, 10, 0.8, 0, 1.0, 3)
    assert got["ablated"] == ["L1H1", "L2H0"] and got["mode"] == "mean"
    assert got["effect"] == {"what": e.what, "index": e.index, "token": e.token, "kl_bits": e.kl_bits,
                             "moves": [vars(m) for m in e.moves]}
    assert got["regeneration"] == {"normal": r.normal, "changed": r.changed, "first_difference": r.first_difference,
                                   "what": r.what}
    assert got["effect"]["kl_bits"] > 0


def test_inside_cell_is_the_pages_cell():
    session = page_text(GRAMMAR, P)
    assert tools.inside_cell_tool(GRAMMAR, P, 1, 0) == session.inside.cell(1, 0)
    assert tools.inside_cell_tool(GRAMMAR, P, 2, 3, 9, 4) == session.inside.cell(2, 3, 9, 4)


def test_patch_is_the_pages_sweep():
    want = Session().sweeps.run(GRAMMAR, A, B, "logit_diff", " she", " he", "heads", "noising").to_json()
    assert tools.patch_tool(GRAMMAR, A, B, " she", " he", "heads", "noising") == want


def held_now() -> int:
    """What sessions hold now, once earlier tests' sessions (kept alive by reference cycles) are gone."""
    gc.collect()
    return MODEL_BUDGET.total


def test_a_tool_keeps_nothing_and_answers_the_same_again():
    held, kept = held_now(), len(SESSIONS)
    first = tools.attention_tool(GRAMMAR, P, 2, 1)
    tools.patch_tool(GRAMMAR, A, B, " she", " he")
    assert tools.attention_tool(GRAMMAR, P, 2, 1) == first
    assert held_now() == held and len(SESSIONS) == kept
    assert tools.models_tool() == {"models": Session().model_names(), "default": GRAMMAR}


@pytest.mark.parametrize("call,pattern", [
    (lambda: tools.attention_tool("no such model", P, 0, 0), r"^Unknown model 'no such model'\. Pick one"),
    (lambda: tools.attention_tool(GRAMMAR, P, 3, 0), r"^layer must be a whole number between 0 and 2; got 3"),
    (lambda: tools.generate_tool(GRAMMAR, P, 0), r"max new tokens"),
    (lambda: tools.generate_tool(GRAMMAR, P, 5, 9.0), r"temperature"),
    (lambda: tools.head_roles_tool(GRAMMAR, ""), r"^The prompt is empty"),
    (lambda: tools.logit_lens_tool(GRAMMAR, P, 12), r"^token position must be a whole number between 0 and 11"),
    (lambda: tools.ablate_tool(GRAMMAR, P, []), r"^Name at least one head to ablate"),
    (lambda: tools.ablate_tool(GRAMMAR, P, ["L9H0"]), r"L9H0"),
    (lambda: tools.ablate_tool(GRAMMAR, P, ["L1H0"], "erase"), r"ablation mode"),
    (lambda: tools.inside_cell_tool(GRAMMAR, P, 0, 0, 3, 40), r"key"),
    (lambda: tools.patch_tool(GRAMMAR, A, "tom found", " she", " he"), r"same number of tokens"),
])
def test_refusals_are_the_labs_sentences_and_give_back_the_memory(call, pattern):
    held = held_now()
    with pytest.raises(UserError) as info:
        call()
    assert re.search(pattern, str(info.value)), str(info.value)
    assert "\n" not in str(info.value) and held_now() == held


def test_a_tools_session_counts_against_its_callers_share(monkeypatch):
    monkeypatch.setattr(MODEL_BUDGET, "client_limit_bytes", 1024)  # less than any text
    with pytest.raises(UserError, match="one address may hold"):
        tools.attention_tool(GRAMMAR, P, 0, 0, client="203.0.113.9")
    assert tools.attention_tool(GRAMMAR, P, 0, 0)["heads"] == [0]  # no client: no client's share
