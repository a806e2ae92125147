"""What a replay costs (lab.server.rates.replay_cost, lab.server.rates.ModelWork, lab.sessionfile.model_work), counted
before it starts: its Steps, and its model's work, the tokens the model runs times its parameters.

The tokens counted are the tokens the engine runs (a forward hook on the model counts them during a real
replay), so a larger model, an Undo and a text past the context cost what they take. An import whose cost
is over the address's share is refused before its first action, changing nothing; the limiter is the
test's own (a fake clock), so what is asserted is counts, never times.
"""

from __future__ import annotations

import json

import pytest

from lab import sessionfile
from lab.checks import UserError
from lab.limits import CHECKPOINT_LIMITS, MAX_LOG
from lab.server import budget, rates
from lab.server.rates import TOKEN_WORK, ModelWork, RateLimiter, replay_cost
from lab.session import Session
from lab.sessionfile import FORMAT, VERSION, builtin_checksum, model_work
from model.generate import Sampling
from tests.support.budget_fakes import Clock

SORT, GRAMMAR = "sort digits (built-in)", "grammar (built-in)"
BURST = 2 * 4 * 256  # the replay bucket's burst at the default scale (README: "Steps replayed 2048 at once")


def step(token: int) -> dict:
    return {"do": "step", "sampling": [1.0, 0, 1.0], "tokens": [token]}


def session_file(tmp_path, model: str, prompt: str, actions: list):
    doc = {"format": FORMAT, "version": VERSION, "model": {"builtin": model, "sha256": builtin_checksum(Session(), model)},
           "prompt": prompt, "seed": 0, "actions": actions, "view": {"layer": 0, "head": 0, "view": "weights"}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_without_a_model_a_replay_costs_its_steps():
    actions = [step(5), {"do": "undo"}, {"do": "generate", "sampling": [1.0, 0, 1.0], "tokens": [5, 6, 7]}]
    assert replay_cost(actions) == 5 and replay_cost("not a list") == 0
    # one unit of work per token: the Steps, then the tokens the model runs: the prompt's 3 and the Step's
    # token, the window again for the Undo, the Generate's 3 tokens and its window once more at its end
    assert ModelWork(TOKEN_WORK, 16, 3).tokens(actions) == (3 + 1) + 3 + (3 + 6)
    assert replay_cost(actions, ModelWork(TOKEN_WORK, 16, 3)) == 5 + 16


def test_the_tokens_counted_are_the_tokens_the_engine_runs_in_a_real_replay(tmp_path):
    """Steps, an Undo, a Generate that slides past the 16-token context of the sort model, Undos and a Step
    there: replayed from a file, the model runs exactly the tokens `ModelWork.tokens` counts."""
    importer = Session()
    entry = importer.entry_for(SORT)
    five = entry.tokenizer.encode("5")[0]
    actions = [step(five)] * 3 + [{"do": "undo"}, {"do": "generate", "sampling": [1.0, 0, 1.0], "tokens": [five] * 12},
                                  {"do": "undo"}, {"do": "undo"}, step(five)]
    path = session_file(tmp_path, SORT, "503124=", actions)
    ran = []
    hook = entry.model.register_forward_pre_hook(lambda module, args: ran.append(args[0].shape[1]))
    try:
        sessionfile.open_session(importer, path)
    finally:
        hook.remove()
    work = model_work(entry, "503124=")
    assert work == ModelWork(sum(p.numel() for p in entry.model.parameters()), 16, 7)
    assert sum(ran) == work.tokens(actions) == 170  # the window slid: 16 tokens a Step past it
    assert replay_cost(actions, work) == 19 + -(-work.params * 170 // TOKEN_WORK)


def test_a_larger_model_costs_more_and_the_report_s_import_is_over_the_share():
    """The report's file: 1,024 actions (Step, Undo) on the largest own model the app takes, its prompt the
    whole context; it held the server's import worker for 87 s. The same actions on a built-in fit the share."""
    c = CHECKPOINT_LIMITS
    actions = [step(5), {"do": "undo"}] * (MAX_LOG // 2)
    largest = replay_cost(actions, ModelWork(c.max_params, c.max_block_size, c.max_block_size - 1))
    builtin = replay_cost(actions, ModelWork(400_000, 256, 12))
    assert builtin <= BURST < largest
    assert largest > 4 * builtin


@pytest.fixture
def limiter(monkeypatch):
    """The server's limiter replaced by one of the test's own: 300 Steps' worth of replay, a clock that stands still."""
    own = RateLimiter({"replay": (300, 300, 600.0), "session": (60, 60, 60.0)}, clock=Clock())
    monkeypatch.setattr(rates, "LIMITER", own)
    return own


def test_an_import_over_the_address_s_share_is_refused_before_its_first_action_and_changes_nothing(tmp_path, limiter):
    importer = Session()
    importer.client = "203.0.113.5"
    importer.step(GRAMMAR, "anna found the key .", Sampling(seed=3))
    before, held = importer.tokens(), budget.MODEL_BUDGET.held(importer)
    # its first action names a token the model does not have: had the replay begun, that is what it would say
    bad_first = [step(10**6)] + [step(5), {"do": "undo"}] * 200
    with pytest.raises(UserError, match=r"^This would take [\d,]+ Steps' worth of replay .* at most 300 at once"):
        sessionfile.open_session(importer, session_file(tmp_path, GRAMMAR, "anna found the key .", bad_first))
    assert importer.tokens() == before and budget.MODEL_BUDGET.held(importer) == held
    # nothing was taken from the share: a file that fits it opens in full (and pays for it)
    small = [step(5)] * 20
    opened = sessionfile.open_session(importer, session_file(tmp_path, GRAMMAR, "anna found the key .", small))
    assert "20 generated tokens replayed" in opened.notes[0]
    tokens, _ = limiter._buckets[("203.0.113.5", "replay")]
    cost = replay_cost(small, model_work(importer.entry_for(GRAMMAR), "anna found the key ."))
    assert tokens == 300 - cost and cost >= 20
    more = [step(5), {"do": "undo"}] * 140
    assert tokens < replay_cost(more, model_work(importer.entry_for(GRAMMAR), "anna found the key .")) <= 300
    with pytest.raises(UserError, match="^Slow down: too many Steps were replayed"):  # what is left is too little
        sessionfile.open_session(importer, session_file(tmp_path, GRAMMAR, "anna found the key .", more))
