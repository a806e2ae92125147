"""model.heads at a role's threshold: a head whose score equals the threshold plays the role.

`Role.threshold` says "a head plays this role when its score is ≥ threshold"; `strongest_role` and
`role_heads` decide it. The scores here come from attention matrices built so that the mean lands on the
threshold exactly (0.5 is exact in float; 0.4 is the same float as the threshold's literal), and one step
below it (the next float down) plays no role.
"""

from __future__ import annotations

import numpy as np
import pytest

from model import heads

T = 6


def previous_token_matrix(weight: float) -> np.ndarray:
    """(T, T) causal attention: every query i ≥ 1 puts `weight` on i − 1 and the rest on itself."""
    a = np.zeros((T, T))
    a[0, 0] = 1.0
    for i in range(1, T):
        a[i, i - 1] = weight
        a[i, i] += 1.0 - weight
    return a


def scores_of(**values: float) -> dict[str, np.ndarray]:
    """Scores of one layer of one head: each role's score as given, NaN for the others."""
    out = {k: np.full((1, 1), np.nan) for k in heads.ROLES}
    for k, v in values.items():
        out[k] = np.full((1, 1), v)
    return out


@pytest.mark.parametrize("role", [k for k, r in heads.ROLES.items() if r.threshold is not None])
def test_a_score_equal_to_its_threshold_plays_the_role_one_just_below_does_not(role):
    thr = heads.ROLES[role].threshold
    at = scores_of(**{role: thr})
    assert heads.strongest_role(at, 0, 0) == (role, thr)
    assert heads.role_heads(at, role) == [(0, 0, thr)]
    below = scores_of(**{role: float(np.nextafter(thr, 0.0))})
    assert heads.strongest_role(below, 0, 0) is None
    assert heads.role_heads(below, role) == []


def test_a_previous_token_head_at_exactly_the_threshold_from_its_attention():
    """The score computed from attention (not written in): each query gives half to the token before it."""
    thr = heads.ROLES["previous_token"].threshold
    assert thr == 0.5
    a = previous_token_matrix(0.5)[None, None]  # (L, H, T, T)
    scores = heads.head_scores(a, list(range(T)))
    assert scores["previous_token"][0, 0] == 0.5  # exact: a mean of 0.5s
    # its self score is 0.5 too: both at their thresholds, ROLE_ORDER names previous-token first
    assert scores["self_attention"][0, 0] == 0.5
    assert heads.strongest_role(scores, 0, 0) == ("previous_token", 0.5)
    assert heads.role_heads(scores, "previous_token") == [(0, 0, 0.5)]
    lower = previous_token_matrix(float(np.nextafter(0.5, 0.0)))[None, None]
    low_scores = heads.head_scores(lower, list(range(T)))
    assert low_scores["previous_token"][0, 0] < 0.5
    assert heads.role_heads(low_scores, "previous_token") == []


def test_at_the_threshold_ties_between_roles_go_by_the_role_order():
    """Two roles exactly at their thresholds are equally far above them (margin 1): ROLE_ORDER decides."""
    both = scores_of(previous_token=heads.ROLES["previous_token"].threshold,
                     first_token=heads.ROLES["first_token"].threshold)
    first = next(k for k in heads.ROLE_ORDER if k in ("previous_token", "first_token"))
    assert heads.strongest_role(both, 0, 0)[0] == first


@pytest.mark.parametrize("task", heads.TASKS)
def test_a_task_match_at_exactly_its_threshold_plays_the_task_s_role(task):
    role = heads.TASK_ROLES[task]
    thr = role.threshold
    assert heads.strongest_role({"match": np.full((1, 1), thr)}, 0, 0, roles=[role]) == ("match", thr)
    below = {"match": np.full((1, 1), float(np.nextafter(thr, 0.0)))}
    assert heads.strongest_role(below, 0, 0, roles=[role]) is None
