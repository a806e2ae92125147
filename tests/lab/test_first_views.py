"""Every built-in's first view tells the truth: its caption's claim, checked on the model.

Each built-in opens on its first example prompt with a chosen layer and head (`FirstView` in
lab/catalogue/models.py) and a caption saying what to look for. These tests step the prompt through the
model as the app does (`encode_prompt`, then `Decoder`; greedy `generate` where the caption says
Generate) and check the claim numerically, with the numbers the caption quotes.
"""

from __future__ import annotations

import numpy as np
import pytest

from lab import captions
from lab.catalogue.models import BUILTIN_MODELS, BUILTINS, FirstView, ModelEntry, encode_prompt
from model import heads
from model.generate import Decoder, Sampling, generate

GREEDY = Sampling(temperature=0.0)


def decode(name: str, prompt: str, new_tokens: int = 0):
    entry = BUILTINS.get(name)
    ids, _ = encode_prompt(prompt, entry)
    d = Decoder(entry.model, ids, GREEDY, eos_id=entry.tokenizer.eos_id, piece=entry.tokenizer.piece)
    for _ in generate(d, new_tokens, GREEDY):
        pass
    return np.stack(d.attention), [entry.tokenizer.piece(i) for i in d.window], d


def view(name: str) -> FirstView:
    return BUILTIN_MODELS[name].first_view


def quoted(caption: str, value: float) -> bool:
    """The caption quotes this value, to two decimals."""
    return f"{value:.2f}" in caption


@pytest.mark.parametrize("name", list(BUILTIN_MODELS))
def test_every_builtin_has_a_first_view_that_fits_the_model_and_two_examples(name):
    b = BUILTIN_MODELS[name]
    assert len(b.examples) >= 2
    v = b.first_view
    assert isinstance(v, FirstView) and v.view == "weights"
    entry = BUILTINS.get(name)
    assert entry.first_view is v  # the loaded entry carries it to the UI
    assert 0 <= v.layer < entry.model.cfg.n_layers and 0 <= v.head < entry.model.cfg.n_heads
    if entry.model.cfg.n_heads > 1:
        assert f"Layer {v.layer}, head {v.head}:" in v.caption
    assert "\n" not in v.caption and len(v.caption) <= 240


def test_other_models_have_no_first_view():
    entry = BUILTINS.get("grammar (built-in)")
    own = ModelEntry("mine", entry.model, entry.tokenizer, {})
    assert own.first_view is None
    with pytest.raises(ValueError):
        FirstView(layer=0, head=0, caption="x", view="pictures")


def test_grammar_the_pronoun_he_looks_at_the_name_tom():
    name = "grammar (built-in)"
    v = view(name)
    A, t, _ = decode(name, BUILTIN_MODELS[name].examples[0])
    q, k = t.index("he"), t.index("tom")
    assert t.count("he") == 1 and t.count("tom") == 1
    row = A[v.layer, v.head, q]
    assert int(row.argmax()) == k and row[k] > 0.5
    assert quoted(v.caption, row[k])
    assert row[k] == A[:, :, q, k].max()  # no other head links "he" to "tom" as strongly


def test_sort_the_head_points_at_the_next_digit_to_write():
    name = "sort digits (built-in)"
    v = view(name)
    prompt = BUILTIN_MODELS[name].examples[0]
    A, t, _ = decode(name, prompt)
    q, k = heads.ideal_keys_sort(t)
    assert t[q[0]] == "=" and t[k[0]] == "0"
    row = A[v.layer, v.head, q[0]]
    assert int(row.argmax()) == k[0]  # "=" looks most at the smallest digit, the first to write
    assert quoted(v.caption, row[k[0]])
    # Generate: the answer is the sorted digits, and most answer rows point at the next digit to
    # write; of all heads, this one matches the ideal sort pattern best
    A, t, _ = decode(name, prompt, 8)
    assert "".join(t) == prompt + "".join(sorted(prompt[:-1])) + "<EOS>"
    q, k = heads.ideal_keys_sort(t)
    assert len(q) == len(prompt) - 1
    hits = A[v.layer, v.head, q].argmax(-1) == k
    assert hits.sum() > len(q) / 2
    match = heads.task_match(A, q, k)
    assert match[v.layer, v.head] == match.max()


def test_copy_the_induction_head():
    name = "copy / induction (built-in)"
    v = view(name)
    prompt = BUILTIN_MODELS[name].examples[0]
    A, t, d = decode(name, prompt)
    q, k = heads.ideal_keys_copy(t)
    assert t[q[0]] == "|" and int(A[v.layer, v.head, q[0]].argmax()) == k[0] == 0  # "|" looks at the first letter
    assert quoted(v.caption, A[v.layer, v.head, q[0], 0])
    assert np.isnan(heads.induction(A, d.window)).all()  # no repeats yet: undefined until Generate
    A, t, d = decode(name, prompt, 16)
    assert "".join(t) == prompt + prompt[:-1] + "<EOS>"
    ind = heads.induction(A, d.window)
    score = ind[v.layer, v.head]
    assert score >= heads.ROLES["induction"].threshold
    assert score == np.nanmax(ind)
    assert quoted(v.caption, score)
    # each copied letter's largest weight is on the letter after its first copy
    iq, ik = heads.induction_targets(d.window)
    assert [t[i] for i in iq] == list(prompt[:-1])  # the copied letters, and nothing else
    for i, j in zip(iq, ik):
        assert int(A[v.layer, v.head, i].argmax()) == j, (t[i], i)


def test_article_toy_the_eos_row_finds_is_in_both_word_orders():
    name = "article toy (built-in)"
    v = view(name)
    weights = []
    for prompt in BUILTIN_MODELS[name].examples[:2]:
        A, t, _ = decode(name, prompt)
        row = A[v.layer, v.head, -1]
        assert t[-1] == "<EOS>"
        assert t[int(row.argmax())] == "is", prompt
        weights.append(row[t.index("is")])
        _, answer, _ = decode(name, prompt, 2)
        assert answer[len(t):] == ["exciting", "<EOS>"]
    assert quoted(v.caption, weights[0]) and quoted(v.caption, weights[1])


def test_shakespeare_characters_look_at_the_start_of_their_word():
    name = "shakespeare (built-in)"
    v = view(name)
    A, t, _ = decode(name, BUILTIN_MODELS[name].examples[0])
    seps = [i for i, p in enumerate(t) if p in ("␣", "⏎")]
    queries = [i for i, p in enumerate(t) if p not in ("␣", "⏎") and i > seps[0]]
    keys = [max(s for s in seps if s < i) for i in queries]
    weight = A[:, :, queries, keys].mean(-1)  # (L, H): mean weight on the separator before the word
    assert weight[v.layer, v.head] > 0.5 and weight[v.layer, v.head] == weight.max()
    assert quoted(v.caption, weight[v.layer, v.head])
    hits = A[v.layer, v.head, queries].argmax(-1) == np.array(keys)
    assert hits.mean() > 0.75  # "most of its weight": the separator is the row's largest weight almost always


# ------------------------------------------------------------------ the caption shown on the page


@pytest.mark.parametrize("name", list(BUILTIN_MODELS))
def test_a_builtin_caption_is_shown_only_where_its_claim_holds(name):
    """The caption above the attention (lab.captions) is the built-in's own line on its first example,
    at its own head, and a sentence read off the numbers drawn anywhere else."""
    v, entry = view(name), BUILTINS.get(name)
    A, t, d = decode(name, BUILTIN_MODELS[name].examples[0])
    weights, window = list(A), list(d.window)
    assert captions.claim_holds(entry, weights, t, window)
    assert captions.caption(entry, weights, None, t, window, v.layer, v.head, v.view) == v.caption
    # the second example: the caption's numbers are not its numbers
    A2, t2, d2 = decode(name, BUILTIN_MODELS[name].examples[1])
    assert not captions.claim_holds(entry, list(A2), t2, list(d2.window))
    said = captions.caption(entry, list(A2), None, t2, list(d2.window), v.layer, v.head, v.view)
    row = A2[v.layer, v.head, -1]
    k = int(row.argmax())
    assert said != v.caption and f"({row[k]:.2f}) on “{t2[k]}” (position {k})" in said
    # another head of the first example
    other = (v.head + 1) % entry.model.cfg.n_heads
    if other != v.head:
        said = captions.caption(entry, weights, None, t, window, v.layer, other, v.view)
        row = A[v.layer, other, -1]
        assert said.startswith(f"Layer {v.layer}, head {other}:") and f"({row.max():.2f})" in said
    # a change of the heads (the head tools) is named, and the built-in line is not claimed under it
    said = captions.caption(entry, weights, None, t, window, v.layer, v.head, v.view, change="L0H0 ablated (zero)")
    assert said.startswith("With L0H0 ablated (zero): ")


def test_a_caption_whose_numbers_change_as_the_text_grows_gives_way():
    name = "shakespeare (built-in)"  # the mean over the text's characters moves with every new character
    entry, v = BUILTINS.get(name), view(name)
    A, t, d = decode(name, BUILTIN_MODELS[name].examples[0], 4)
    assert not captions.claim_holds(entry, list(A), t, list(d.window))
    name = "copy / induction (built-in)"  # each copied letter so far looks where the caption says
    entry = BUILTINS.get(name)
    for n in (3, 16):
        A, t, d = decode(name, BUILTIN_MODELS[name].examples[0], n)
        assert captions.claim_holds(entry, list(A), t, list(d.window))
    own = ModelEntry("mine", entry.model, entry.tokenizer, {})
    assert not captions.claim_holds(own, list(A), t, list(d.window))
