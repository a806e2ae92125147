"""The head and example a model added with --model opens on (lab/catalogue/realmodels.py `choose_first_view`): where
the model shows something, as the built-ins' first views do, and a caption that says so honestly when no head stands
out. On a real character model written as nanoGPT writes one (the built-in Shakespeare model's weights in a
shakespeare_char run's ckpt.pt and meta.pkl), on a random nanoGPT run, and the rule at its edges.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lab.catalogue import realmodels
from lab.catalogue.external import ExternalModels, parse_source
from lab.catalogue.models import BUILTINS
from lab.session import Session
from model.heads import ROLES, head_scores
from tests.support.nanogpt_runs import CHARS, reference, save_decoder_run, save_run


def opened(tmp_path, ckpt):
    s = Session()
    s.external = ExternalModels([parse_source(str(ckpt))], tmp_path / "hashes.json")
    return s.entry_for(s.external.names[0])


def by_hand(entry, prompt: str) -> dict[str, np.ndarray]:
    """The roles' scores on `prompt`, and the word-start score written out: the mean weight a character
    after the first space puts on the space or line break that starts its word."""
    ids = entry.tokenizer.encode(prompt)
    with torch.inference_mode():
        A = [a[0].numpy() for a in entry.model(torch.tensor([ids]), return_attention=True).attentions]
    scores = head_scores(A, ids)
    weights, n = np.zeros((len(A), A[0].shape[0])), 0
    for i, ch in enumerate(prompt):
        if ch not in " \n" and " " in prompt[:i]:
            start = max(j for j in range(i) if prompt[j] in " \n")
            weights += np.stack([a[:, i, start] for a in A])
            n += 1
    scores["word_start"] = weights / n if n else np.full(weights.shape, np.nan)  # no word: undefined
    return scores


def test_a_nanogpt_character_model_opens_where_it_shows_something(tmp_path):
    """The issue's case: the random-letter induction example, once first, shows nothing on a character
    model (its best induction score is far below 0.4). The model now opens on the example and head of its
    clearest pattern: the head the built-in names by hand, each character on the space before its word."""
    run = save_decoder_run(tmp_path / "out-shakespeare-char", BUILTINS.get("shakespeare (built-in)"))
    entry = opened(tmp_path, run)
    fv, examples = entry.first_view, entry.examples
    letters = next(e for e in examples if e[: len(e) // 2] == e[len(e) // 2:])  # the random-letter sequence, twice
    assert np.nanmax(by_hand(entry, letters)["induction"]) < 0.2 and examples[0] != letters
    every = {e: by_hand(entry, e) for e in examples}
    best = max(every, key=lambda e: np.nan_to_num(every[e]["word_start"], nan=-1).max())
    assert examples[0] == best  # the example it opens on is where the pattern is strongest
    score = every[best]["word_start"]
    assert (fv.layer, fv.head) == np.unravel_index(np.nanargmax(score), score.shape) == (1, 3)
    assert score[1, 3] >= 0.5 and f"({score[1, 3]:.2f} ≥ 0.5)" in fv.caption and "word-start head" in fv.caption
    assert (fv.layer, fv.head) == (BUILTINS.get("shakespeare (built-in)").first_view.layer,
                                   BUILTINS.get("shakespeare (built-in)").first_view.head)
    for e in examples:  # no induction or previous-token head reached its threshold anywhere: word start is next
        for key in ("induction", "previous_token"):
            assert np.nan_to_num(every[e][key], nan=0).max() < ROLES[key].threshold


def test_a_model_where_no_head_stands_out_says_so(tmp_path):
    """Random weights: no head reaches a role on any example; it opens on the head nearest to one (the highest
    score relative to its role's threshold), and the caption says that no head stands out, with the number."""
    entry = opened(tmp_path, save_run(tmp_path / "run", reference(len(CHARS), block=64)))
    every = {e: by_hand(entry, e) for e in entry.examples}
    nearest = max(((np.nanmax(s[k]) / realmodels.SHOWN[k].threshold, e, k) for e, s in every.items()
                   for k in realmodels.SHOWN_ROLES if np.isfinite(s[k]).any()))
    ratio, example, key = nearest
    assert ratio < 1 and entry.examples[0] == example
    table = every[example][key]
    fv = entry.first_view
    assert (fv.layer, fv.head) == np.unravel_index(np.nanargmax(table), table.shape)
    assert fv.caption.startswith("No head of this model stands out on its examples")
    assert f"{realmodels.SHOWN[key].name} {np.nanmax(table):.2f}" in fv.caption


def test_the_example_where_a_head_shows_its_role_comes_first():
    """The built-in copy model (trained to copy, with induction heads) as if it were one's own, given a prompt
    it has nothing to copy in and one with a copy under way: it opens on the second and on its induction head
    (the rarer role, first although a previous-token head comes near its threshold too)."""
    import dataclasses

    model = BUILTINS.get("copy / induction (built-in)")
    examples = ("abcdefgh|", "hcbpadlk|hcbpadl")
    entry = dataclasses.replace(model, builtin=False, first_view=None, examples=examples)
    fv, ordered = realmodels.choose_first_view(entry)
    assert ordered == examples[::-1]
    table = by_hand(entry, ordered[0])["induction"]
    assert np.nanmax(table) >= 0.4 and (fv.layer, fv.head) == np.unravel_index(np.nanargmax(table), table.shape)
    assert "clearest induction head" in fv.caption and f"({np.nanmax(table):.2f} ≥ 0.4)" in fv.caption


@pytest.mark.parametrize("scores, chosen", [
    ({"induction": 0.40, "previous_token": 0.9}, "induction"),  # at its threshold: reached, and the rarer
    ({"induction": 0.39, "previous_token": 0.5}, "previous_token"),  # at its threshold
    ({"induction": 0.396, "previous_token": 0.45}, "induction"),  # none reached: 0.99 of its threshold beats 0.9
    ({"induction": 0.2, "previous_token": 0.499}, "previous_token"),  # none reached: 0.998 beats 0.5
    ({"induction": 0.1, "previous_token": 0.2, "word_start": 0.49}, "word_start"),  # the nearest to its threshold
])
def test_the_rule_at_the_thresholds(scores, chosen):
    best = [(k, 0, 0, 0, v) for k, v in scores.items()]
    assert realmodels.choose(best)[0] == chosen
