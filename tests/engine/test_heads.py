"""Head scores (model/heads.py) against loops written the slow, obvious way, and hand-made cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model import heads

# ------------------------------------------------------------------ slow references: one (T, T) matrix

def slow_previous(A):
    T = len(A)
    return sum(A[i][i - 1] for i in range(1, T)) / (T - 1)


def slow_first(A):
    T = len(A)
    return sum(A[i][0] for i in range(1, T)) / (T - 1)


def slow_self(A):
    T = len(A)
    return sum(A[i][i] for i in range(1, T)) / (T - 1)


def slow_entropy(A):
    T = len(A)
    total = 0.0
    for i in range(1, T):
        h = 0.0
        for j in range(T):
            if A[i][j] > 0:
                h -= A[i][j] * math.log2(A[i][j])
        total += h
    return total / (T - 1)


def slow_induction(A, ids):
    values = []
    for i in range(len(ids)):
        earlier = [j for j in range(i - 1) if ids[j] == ids[i]]  # positions j < i − 1 with the same token
        if earlier:
            values.append(A[i][max(earlier) + 1])
    return sum(values) / len(values) if values else float("nan")


SLOW = {
    "previous_token": slow_previous,
    "first_token": slow_first,
    "self_attention": slow_self,
    "entropy": slow_entropy,
}


def random_causal(rng, shape, T, zeros=False):
    """Row-stochastic causal matrices (..., T, T); with zeros, some allowed weights are exactly 0."""
    x = rng.exponential(size=(*shape, T, T))
    if zeros:
        x = x * (rng.random(size=x.shape) < 0.6)
        idx = np.arange(T)
        x[..., idx, idx] += 1e-3  # every row keeps some weight
    x = np.tril(x)
    return x / x.sum(-1, keepdims=True)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("zeros", [False, True])
def test_every_score_matches_the_slow_loop(seed, zeros):
    rng = np.random.default_rng(seed)
    L, H, T = 2, 3, int(rng.integers(2, 20))
    A = random_causal(rng, (L, H), T, zeros)
    ids = rng.integers(0, 4, size=T).tolist()  # a small vocabulary: plenty of repeats
    scores = heads.head_scores([A[li] for li in range(L)], ids)
    assert set(scores) == {"previous_token", "first_token", "self_attention", "induction", "entropy"}
    for key, slow in SLOW.items():
        expected = np.array([[slow(A[li, h].tolist()) for h in range(H)] for li in range(L)])
        assert scores[key].shape == (L, H)
        np.testing.assert_allclose(scores[key], expected, rtol=1e-12, atol=1e-12, err_msg=key)
        # the single functions take any leading axes: (T, T), (H, T, T), (L, H, T, T)
        fn = getattr(heads, key)
        assert fn(A[1, 2]).shape == ()
        np.testing.assert_allclose(fn(A[1, 2]), expected[1, 2], rtol=1e-12)
        np.testing.assert_allclose(fn(A[0]), expected[0], rtol=1e-12)
    expected = np.array([[slow_induction(A[li, h].tolist(), ids) for h in range(H)] for li in range(L)])
    np.testing.assert_allclose(scores["induction"], expected, rtol=1e-12, atol=1e-12, equal_nan=True)
    np.testing.assert_allclose(heads.induction(A[0, 1], ids), expected[0, 1], rtol=1e-12, equal_nan=True)


def test_an_lht_array_gives_the_same_scores_as_a_list_of_layers():
    rng = np.random.default_rng(7)
    A = random_causal(rng, (3, 2), 9).astype(np.float32)  # float32 as the decoder gives it
    ids = [1, 2, 3, 1, 2, 3, 1, 2, 3]
    a, b = heads.head_scores(A, ids), heads.head_scores(list(A), ids)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_induction_targets_take_the_latest_occurrence_before_i_minus_1():
    # token 5 at 0, 2 and 3: query 3 skips position 2 (= i − 1) and reads 0 + 1;
    # query 6 (token 5) has 0, 2, 3 < 5: the latest is 3, so it reads key 4
    ids = [5, 1, 5, 5, 2, 9, 5]
    q, k = heads.induction_targets(ids)
    assert q.tolist() == [2, 3, 6]
    assert k.tolist() == [1, 1, 4]
    for i, j in zip(q, k):
        earlier = [p for p in range(i - 1) if ids[p] == ids[i]]
        assert j == max(earlier) + 1


def test_a_perfect_previous_token_head_scores_one():
    T = 8
    A = np.zeros((T, T))
    A[0, 0] = 1.0
    A[np.arange(1, T), np.arange(T - 1)] = 1.0
    assert heads.previous_token(A) == pytest.approx(1.0)
    assert heads.self_attention(A) == pytest.approx(0.0)
    assert heads.first_token(A) == pytest.approx(1 / (T - 1))  # only query 1's previous token is token 0
    assert heads.entropy(A) == pytest.approx(0.0)


def test_sink_and_self_heads_score_one():
    T = 6
    sink = np.zeros((T, T))
    sink[:, 0] = 1.0
    assert heads.first_token(sink) == pytest.approx(1.0)
    assert heads.entropy(sink) == pytest.approx(0.0)
    assert heads.self_attention(np.eye(T)) == pytest.approx(1.0)


def test_uniform_causal_attention_has_entropy_log2_of_the_keys_seen():
    T = 10
    A = np.tril(np.ones((T, T)))
    A /= A.sum(-1, keepdims=True)
    expected = np.mean([math.log2(i + 1) for i in range(1, T)])
    assert heads.entropy(A) == pytest.approx(expected, rel=1e-12)
    assert heads.previous_token(A) == pytest.approx(np.mean([1 / (i + 1) for i in range(1, T)]))


def test_induction_is_undefined_without_repeats():
    rng = np.random.default_rng(0)
    A = random_causal(rng, (2, 3), 6)
    assert np.isnan(heads.induction(A, [0, 1, 2, 3, 4, 5])).all()
    # a repeat right after itself (j = i − 1) does not count either
    assert np.isnan(heads.induction(A, [0, 1, 1, 2, 3, 4])).all()
    assert np.isnan(heads.head_scores(A, [0, 1, 2, 3, 4, 5])["induction"]).all()
    with pytest.raises(ValueError):
        heads.induction(A, [0, 1, 2])  # ids must match the matrix


def test_a_perfect_induction_head_scores_one():
    ids = [3, 7, 1, 4, 3, 7, 1, 4]  # a sequence and its copy
    T = len(ids)
    A = np.zeros((T, T))
    A[np.arange(T), np.arange(T)] = 1.0
    q, k = heads.induction_targets(ids)
    A[q] = 0.0
    A[q, k] = 1.0
    assert q.tolist() == [4, 5, 6, 7]
    assert heads.induction(A, ids) == pytest.approx(1.0)
    assert heads.self_attention(A) == pytest.approx(3 / 7)


def test_a_one_token_text_has_no_scores():
    A = np.ones((2, 1, 1))
    for fn in (heads.previous_token, heads.first_token, heads.self_attention, heads.entropy):
        assert np.isnan(fn(A)).all()


def test_task_match_is_the_mean_weight_on_the_ideal_keys():
    rng = np.random.default_rng(3)
    A = random_causal(rng, (2, 4), 12)
    queries, keys = [6, 7, 8, 11], [1, 3, 0, 5]
    slow = np.array([[sum(A[li, h, q, k] for q, k in zip(queries, keys)) / len(queries) for h in range(4)]
                     for li in range(2)])
    np.testing.assert_allclose(heads.task_match(A, queries, keys), slow, rtol=1e-12)
    assert np.isnan(heads.task_match(A, [], [])).all()
    with pytest.raises(ValueError):
        heads.task_match(A, [3], [4])  # a key after its query cannot be seen
    with pytest.raises(ValueError):
        heads.task_match(A, [3, 4], [1])


def test_ideal_keys_of_the_sort_task():
    toks = list("503124=012345")
    q, k = heads.ideal_keys_sort(toks)
    assert q.tolist() == [6, 7, 8, 9, 10, 11]  # "=" and every answer digit but the last
    assert [toks[j] for j in k] == list("012345")  # each reads the digit it has to write next
    q, k = heads.ideal_keys_sort(list("503124="))  # the prompt alone: only the "=" query
    assert q.tolist() == [6] and k.tolist() == [1]
    q, k = heads.ideal_keys_sort(list("3113=1"))  # repeated digits in input order
    assert q.tolist() == [4, 5] and k.tolist() == [1, 2]
    assert heads.ideal_keys_sort(list("3113"))[0].size == 0


def test_ideal_keys_of_the_copy_task():
    toks = list("abca|abca") + ["<EOS>"]
    q, k = heads.ideal_keys_copy(toks)
    assert q.tolist() == [4, 5, 6, 7]
    assert k.tolist() == [0, 1, 2, 3]
    # the copy's ideal is the induction pattern wherever the induction pattern is unambiguous
    iq, ik = heads.induction_targets([ord(c) for c in "abcd|abcd"])
    q, k = heads.ideal_keys_copy(list("abcd|abcd"))
    assert dict(zip(iq.tolist(), ik.tolist())) == {5: 1, 6: 2, 7: 3, 8: 4}
    assert dict(zip(q[1:].tolist(), k[1:].tolist())) == {5: 1, 6: 2, 7: 3}


def test_roles_and_the_strongest_role():
    assert set(heads.ROLE_ORDER) <= set(heads.ROLES)
    for key, role in heads.ROLES.items():
        assert role.key == key and role.formula and role.name
    assert heads.ROLES["previous_token"].threshold == 0.5
    assert heads.ROLES["induction"].threshold == 0.4
    assert heads.ROLES["first_token"].threshold == 0.5
    assert heads.ROLES["self_attention"].threshold == 0.5
    scores = {
        "previous_token": np.array([[0.9, 0.1, 0.55]]),
        "first_token": np.array([[0.05, 0.2, 0.1]]),
        "self_attention": np.array([[0.0, 0.3, 0.1]]),
        "induction": np.array([[np.nan, 0.2, 0.5]]),
        "entropy": np.array([[0.5, 3.0, 1.0]]),
    }
    assert heads.strongest_role(scores, 0, 0) == ("previous_token", 0.9)
    assert heads.strongest_role(scores, 0, 1) is None
    # 0.5 / 0.4 beats 0.55 / 0.5: induction is further above its threshold
    assert heads.strongest_role(scores, 0, 2) == ("induction", 0.5)
    assert heads.role_heads(scores, "previous_token") == [(0, 0, 0.9), (0, 2, 0.55)]
    assert heads.role_heads(scores, "induction") == [(0, 2, 0.5)]


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError):
        heads.previous_token(np.ones((3, 4)))
    with pytest.raises(ValueError):
        heads.head_scores(np.ones((2, 3, 3)), [0, 1, 2])  # one layer must still be a list or (L, H, T, T)
