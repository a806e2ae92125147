"""A session file's recorded tokens under top-k and top-p: a token the file's settings could not have drawn
is refused, one they could have drawn is replayed.

A session file lists each Step's sampling settings and the token it made; opening it forces those tokens
into the model's decoder (lab.sessionfile → model.generate.Decoder.step). The greedy case is in
lab/test_sessionfile.py; here a Step on the grammar model with top-k 3, then with top-p 0.5, is saved and
its token replaced by one outside the kept set (a token with probability > 0 before top-k / top-p) or by
another one inside it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from lab import sessionfile
from lab.checks import UserError
from lab.session import Session, View
from model.generate import Sampling

GRAMMAR = "grammar (built-in)"
P = "anna found the key . she gave it to tom because he"
SETTINGS = {"top_k": Sampling(temperature=1.0, top_k=3, seed=5), "top_p": Sampling(temperature=1.0, top_p=0.5, seed=5)}


def saved_step(tmp_path, sampling: Sampling):
    """A file of one Step under `sampling`, with the Step's distributions (softmax, and after the settings)."""
    s = Session()
    step = s.step(GRAMMAR, P, sampling).step
    path = tmp_path / "one_step.json"
    path.write_bytes(sessionfile.export_session(s, GRAMMAR, P, sampling, View(0, "all", "weights")))
    doc = json.loads(path.read_text())
    assert [a["tokens"] for a in doc["actions"]] == [[step.token_id]]
    return doc, step


def with_token(tmp_path, doc: dict, token: int) -> str:
    doc = json.loads(json.dumps(doc))
    doc["actions"][0]["tokens"] = [token]
    path = tmp_path / f"token_{token}.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("rule", sorted(SETTINGS))
def test_a_token_outside_top_k_or_top_p_is_refused_and_changes_nothing(tmp_path, rule):
    doc, step = saved_step(tmp_path, SETTINGS[rule])
    left_out = np.flatnonzero((step.adjusted == 0) & (step.probs > 0))
    assert len(left_out), "the rule left every token in: nothing to test"
    # the most likely token the rule left out: the one a check that ignored the rule would take first
    token = int(left_out[np.argmax(step.probs[left_out])])
    t = Session()
    t.step(GRAMMAR, "tom found the key", Sampling(temperature=0.0))  # a text of its own, kept as it was
    before = (t.tokens(), list(t.log))
    with pytest.raises(UserError, match=f"action 1 cannot be replayed on this model .*token {token} cannot come next"):
        sessionfile.open_session(t, with_token(tmp_path, doc, token))
    assert (t.tokens(), list(t.log)) == before


@pytest.mark.parametrize("rule", sorted(SETTINGS))
def test_another_token_inside_top_k_or_top_p_is_replayed(tmp_path, rule):
    doc, step = saved_step(tmp_path, SETTINGS[rule])
    kept = [int(i) for i in np.flatnonzero(step.adjusted > 0)]
    others = [i for i in kept if i != step.token_id] or kept  # top-p 0.5 may keep the drawn token alone
    token = others[0]
    t = Session()
    sessionfile.open_session(t, with_token(tmp_path, doc, token))
    assert t.decoder.ids[-1] == token
