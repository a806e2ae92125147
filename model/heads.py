"""Head scores: one number per layer × head that says what a head's attention pattern does.

For an attention matrix A of a text of T tokens (rows are queries, columns keys, each row sums
to 1 over the keys it may see, j ≤ i) and the text's token ids:

* previous-token: mean over queries i ≥ 1 of A[i, i−1];
* first-token (sink): mean over queries i ≥ 1 of A[i, 0];
* self: mean over queries i ≥ 1 of A[i, i];
* induction: mean over queries i whose token occurred earlier, at latest position j < i − 1,
  of A[i, j+1] (the token that followed the earlier copy); undefined (NaN) when no query qualifies;
* entropy: mean over queries i ≥ 1 of −Σⱼ A[i, j] log₂ A[i, j], in bits (0 · log 0 = 0);
* task match (sort, copy — tasks where the right attention is known): mean over the answer
  queries i of A[i, k(i)], where k(i) is the key the query should read (`ideal_keys_sort`,
  `ideal_keys_copy`). 1.0 means the head puts all of its weight on the right key every time.

Query 0 is left out of the means: it can only see itself, so it carries no information about
the head. Every function is vectorised over leading axes: it takes (..., T, T) — one matrix,
(H, T, T) for a layer, (L, H, T, T) for a model — and returns an array of shape (...).
`head_scores(per_layer, ids)` gives all of them as (L, H) arrays; `ROLES` holds each role's
name, formula (as text, for the UI) and the threshold from which a head is said to play it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def _as_array(attn) -> np.ndarray:
    # one dtype whatever comes in (lists, float32 copies of tensors): the means are taken in double precision
    a = np.asarray(attn, dtype=np.float64)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"attention must be (..., T, T), got shape {a.shape}")
    return a


def _nan_result(a: np.ndarray) -> np.ndarray:
    # one NaN per matrix: (..., T, T) -> (...), the shape a defined score would have had
    return np.full(a.shape[:-2], np.nan)


def _diagonal_mean(attn, back: int) -> np.ndarray:
    """Mean over queries i ≥ 1 of A[i, i − back]; NaN for a text of one token."""
    a = _as_array(attn)
    T = a.shape[-1]
    if T < 2:
        return _nan_result(a)
    i = np.arange(1, T)
    # paired fancy indexing picks A[i, i - back] for each i at once: (..., T-1), then the mean over queries
    return a[..., i, i - back].mean(axis=-1)


def previous_token(attn) -> np.ndarray:
    """Mean over queries i ≥ 1 of A[i, i−1]; NaN for a text of one token."""
    return _diagonal_mean(attn, 1)


def first_token(attn) -> np.ndarray:
    """Mean over queries i ≥ 1 of A[i, 0] (the attention sink); NaN for a text of one token."""
    a = _as_array(attn)
    if a.shape[-1] < 2:
        return _nan_result(a)
    return a[..., 1:, 0].mean(axis=-1)


def self_attention(attn) -> np.ndarray:
    """Mean over queries i ≥ 1 of A[i, i]; NaN for a text of one token."""
    return _diagonal_mean(attn, 0)


def entropy(attn) -> np.ndarray:
    """Mean over queries i ≥ 1 of −Σⱼ A[i, j] log₂ A[i, j], in bits; NaN for a text of one token."""
    a = _as_array(attn)
    if a.shape[-1] < 2:
        return _nan_result(a)
    rows = a[..., 1:, :]  # (..., T-1, T): query 0 left out, as in every score
    logs = np.zeros_like(rows)
    np.log2(rows, out=logs, where=rows > 0)  # 0 · log 0 = 0: masked and unused keys add nothing
    return -np.einsum("...ij,...ij->...i", rows, logs).mean(axis=-1)  # one pass, no temporaries of T × T


def induction_targets(ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The (queries, keys) the induction score reads, as two int arrays.

    For each query i, j is the latest position j < i − 1 holding the same token as i; when
    there is one, the pair (i, j + 1) is included: the key right after the earlier copy, the
    token an induction head would copy next. (An occurrence at i − 1 is skipped: its j + 1 is
    the query itself.)
    """
    seen: dict[int, int] = {}  # token → its latest position among 0 … i − 2
    queries, keys = [], []
    toks = [int(t) for t in ids]
    for i, t in enumerate(toks):
        # the map lags two behind the query: position i - 1 is recorded only on the next step, so an
        # immediate repeat ("a a") is not counted, its j + 1 being the query itself
        if i >= 2:
            seen[toks[i - 2]] = i - 2
        j = seen.get(t)
        if j is not None:
            queries.append(i)
            keys.append(j + 1)
    return np.asarray(queries, dtype=np.int64), np.asarray(keys, dtype=np.int64)


def _mean_at(a: np.ndarray, queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Mean of A[queries[n], keys[n]] over n, for every leading index: (..., T, T) -> (...)."""
    if len(queries) == 0:  # a mean over nothing is undefined, not 0: the text holds no such query
        return _nan_result(a)
    return a[..., queries, keys].mean(axis=-1)


def induction(attn, ids: Sequence[int]) -> np.ndarray:
    """Mean over the queries of `induction_targets(ids)` of A[i, j+1]; NaN when there are none."""
    a = _as_array(attn)
    if len(ids) != a.shape[-1]:
        raise ValueError(f"{len(ids)} token ids for an attention matrix over {a.shape[-1]} tokens")
    return _mean_at(a, *induction_targets(ids))


def task_match(attn, queries: Sequence[int], keys: Sequence[int]) -> np.ndarray:
    """Match to a known ideal pattern: mean over the given queries i of A[i, keys[i]].

    `keys[n]` is the one key query `queries[n]` should read (see `ideal_keys_sort`,
    `ideal_keys_copy`); 1.0 means all of the weight is on the right key every time. NaN when
    there are no queries.
    """
    a = _as_array(attn)
    q = np.asarray(queries, dtype=np.int64).reshape(-1)
    k = np.asarray(keys, dtype=np.int64).reshape(-1)
    if q.shape != k.shape:
        raise ValueError("queries and keys must have the same length")
    T = a.shape[-1]
    # a key after its query is masked (weight 0), so such a target is a mistake in the caller, not a score
    if len(q) and (q.min() < 0 or q.max() >= T or k.min() < 0 or (k > q).any()):
        raise ValueError("every (query, key) pair must lie in the text with key ≤ query")
    return _mean_at(a, q, k)


def ideal_keys_sort(tokens: Sequence, sep="=") -> tuple[np.ndarray, np.ndarray]:
    """Sort task (`digits=sorted digits`): the query at the separator and each answer digit but
    the last should read the input digit to write next, the (k+1)-th smallest for the k-th
    query. Repeated digits are taken in input order (a stable sort). Only queries already in
    `tokens` are returned; none when there is no separator.
    """
    toks = list(tokens)
    if sep not in toks:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    p = toks.index(sep)  # the separator's position is also the number of input digits
    order = sorted(range(p), key=lambda j: toks[j])  # stable: equal digits keep input order
    # the separator predicts answer digit 0, answer digit k predicts digit k + 1: p queries from the separator
    # on, cut where the text ends (a text still being written has fewer)
    queries = [q for q in range(p, min(len(toks), 2 * p)) if q - p < len(order)]
    return np.asarray(queries, np.int64), np.asarray([order[q - p] for q in queries], np.int64)


def ideal_keys_copy(tokens: Sequence, sep="|") -> tuple[np.ndarray, np.ndarray]:
    """Copy task (`sequence|sequence`): the query at the separator should read input token 0,
    the query at the k-th copied token input token k + 1 (the one after its earlier copy).
    Only queries already in `tokens` are returned; none when there is no separator.
    """
    toks = list(tokens)
    if sep not in toks:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    p = toks.index(sep)
    # query p + k should read input k: the offset between a copied token and its source is p
    queries = list(range(p, min(len(toks), 2 * p)))
    return np.asarray(queries, np.int64), np.asarray([q - p for q in queries], np.int64)


@dataclass(frozen=True)
class Role:
    key: str  # the name in `head_scores`
    name: str  # shown to a learner
    formula: str  # the definition, as text
    threshold: float | None  # a head plays this role when its score is ≥ threshold (None: no role)
    meaning: str  # one line: what a head with a high score does


ROLES: dict[str, Role] = {r.key: r for r in (
    Role("previous_token", "previous-token", "mean over queries i ≥ 1 of A[i, i−1]", 0.5,
         "each token looks at the token just before it"),
    Role("first_token", "first-token (sink)", "mean over queries i ≥ 1 of A[i, 0]", 0.5,
         "the head parks its attention on the first token when it has nothing to look for"),
    Role("self_attention", "self", "mean over queries i ≥ 1 of A[i, i]", 0.5,
         "each token looks at itself"),
    Role("induction", "induction",
         "mean over queries i whose token occurred earlier, at latest position j < i−1, of A[i, j+1]", 0.4,
         "a repeated token looks at what followed its earlier copy, to predict it comes again"),
    Role("entropy", "entropy (bits)", "mean over queries i ≥ 1 of −Σⱼ A[i, j] log₂ A[i, j]", None,
         "how spread out the attention is: 0 bits = all on one key, log₂(i+1) = uniform"),
)}
# What a head should read in the corpora whose right attention is known: the "match" score of a
# built-in or trained model of that corpus, a role like the others (threshold MATCH_THRESHOLD).
MATCH_THRESHOLD = 0.5
TASK_ROLES: dict[str, Role] = {
    "sort": Role("match", "sort match",
                 "mean over the answer queries i of A[i, k(i)], k(i) = the input digit to write next", MATCH_THRESHOLD,
                 "each answer position reads the input digit that comes next in sorted order"),
    "copy": Role("match", "copy match",
                 "mean over the copy queries i of A[i, k(i)], k(i) = the input letter to write next", MATCH_THRESHOLD,
                 "each copied position reads the input letter to write next"),
    "grammar": Role("match", "pronoun → name",
                    "largest over pronoun queries i (he, him, his, she, her) of A[i, n(i)], n(i) = the latest "
                    "earlier name of the pronoun's gender", MATCH_THRESHOLD,
                    "a pronoun of this text looks at the name it stands for (heads split the pronouns between "
                    "them, so the largest link is the one to look for)"),
}
# The corpora whose right attention is known, and so have a task role: one per key of TASK_ROLES.
TASKS = tuple(TASK_ROLES)


def task_of(corpus_name: object) -> str | None:
    """The task of a corpus whose right attention is known (one of TASKS: sort, copy, grammar), or None.

    Takes the corpus name as stored anywhere (a checkpoint's metadata included): anything but one of
    those names, a non-string too, has no task."""
    return corpus_name if isinstance(corpus_name, str) and corpus_name in TASK_ROLES else None


PRONOUN_GENDER = {"he": "m", "him": "m", "his": "m", "she": "f", "her": "f"}


def ideal_keys_pronoun(tokens: Sequence, names: dict[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """Pronoun → name (the grammar corpus): each pronoun query (`PRONOUN_GENDER`) should read the
    latest earlier name of its gender; names: name → "f" | "m". Pronouns with no such name are left out.
    """
    toks = [str(t).strip() for t in tokens]
    queries, keys = [], []
    for i, t in enumerate(toks):
        gender = PRONOUN_GENDER.get(t)
        if gender is None:  # not a pronoun: not a query of this task
            continue
        earlier = [j for j in range(i) if names.get(toks[j]) == gender]  # names of the same gender before i
        if earlier:
            queries.append(i)
            keys.append(earlier[-1])
    return np.asarray(queries, np.int64), np.asarray(keys, np.int64)


def task_score(task: str, attn, queries: Sequence[int], keys: Sequence[int]) -> np.ndarray:
    """The task's match score per head (`TASK_ROLES`): the mean of A[i, k(i)] over the task's
    queries, or for "grammar" the largest (NaN without a query)."""
    # sort and copy ask every answer query to read its key, so the mean is fair; in grammar texts the
    # heads share the pronouns between them, so the one head's best link is the better measure
    if task != "grammar":
        return task_match(attn, queries, keys)
    a = _as_array(attn)
    q, k = np.asarray(queries, np.int64), np.asarray(keys, np.int64)
    if not len(q):
        return _nan_result(a)
    return a[..., q, k].max(axis=-1).astype(np.float64)  # (..., n pronouns) -> (...)


def task_targets(task: str, tokens: Sequence, names: dict[str, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(queries, keys) the task's head should link on these tokens (`TASK_ROLES`)."""
    if task == "sort":
        return ideal_keys_sort(tokens)
    if task == "copy":
        return ideal_keys_copy(tokens)
    if task == "grammar":
        return ideal_keys_pronoun(tokens, names or {})
    raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASK_ROLES)}")


# the roles `strongest_role` chooses between, in the order that breaks ties
ROLE_ORDER = ("induction", "previous_token", "self_attention", "first_token")
MATCH_FORMULA = "mean over the answer queries i of A[i, k(i)], k(i) = the key the task needs i to read"


def head_scores(weights_per_layer, ids: Sequence[int]) -> dict[str, np.ndarray]:
    """Every score of every head: name → (L, H) array (NaN where undefined).

    weights_per_layer: a list of (H, T, T) arrays (as `Decoder.attention`) or an (L, H, T, T) array.
    """
    # a list of per-layer (H, T, T) arrays is stacked to (L, H, T, T), so each score runs once over all heads
    a = _as_array(np.stack([np.asarray(w) for w in weights_per_layer]) if isinstance(weights_per_layer, (list, tuple))
                  else weights_per_layer)
    if a.ndim != 4:
        raise ValueError(f"expected per-layer (H, T, T) weights, got shape {a.shape}")
    return {
        "previous_token": previous_token(a),
        "first_token": first_token(a),
        "self_attention": self_attention(a),
        "induction": induction(a, ids),
        "entropy": entropy(a),
    }


def strongest_role(scores: dict[str, np.ndarray], layer: int, head: int,
                   roles: Sequence[Role] | None = None) -> tuple[str, float] | None:
    """The role this head plays most clearly: the one whose score is furthest above its threshold
    (relative to the threshold), with its score; None when no score reaches its threshold (a score equal to
    its threshold reaches it: the role is played from the threshold on, as `Role.threshold` says).
    roles: the candidates, in the order that breaks ties (default `ROLE_ORDER`)."""
    # roles without a threshold (entropy) describe a head but are never "played", so they cannot win
    candidates = [ROLES[k] for k in ROLE_ORDER] if roles is None else [r for r in roles if r.threshold is not None]
    best = None
    for role in candidates:
        key = role.key
        if key not in scores:  # e.g. a task role asked of scores computed without that task
            continue
        value = float(np.asarray(scores[key])[layer, head])
        thr = role.threshold
        if np.isnan(value) or value < thr:
            continue
        # compared as a ratio, since thresholds differ by role (0.4 for induction, 0.5 for the others);
        # strictly greater, so on a tie the earlier role in the order keeps its place
        margin = value / thr
        if best is None or margin > best[2]:
            best = (key, value, margin)
    return None if best is None else (best[0], best[1])


def role_heads(scores: dict[str, np.ndarray], role: str) -> list[tuple[int, int, float]]:
    """The heads that play `role` (score ≥ threshold), as (layer, head, score), strongest first."""
    thr = ROLES[role].threshold
    s = np.asarray(scores[role])
    # NaN (an undefined score) becomes -1 so it never passes a threshold; nonzero gives the (layer, head) pairs
    found = [(int(li), int(h), float(s[li, h])) for li, h in zip(*np.nonzero(np.nan_to_num(s, nan=-1.0) >= thr))]
    return sorted(found, key=lambda x: -x[2])
