"""What the Explore buttons do to a person's text (lab.session.Session, no server).

Generate goes on with the text, Undo brings back the previous token's distribution, every
token's distribution is kept and is what the model computed, a finished text refuses more
tokens, and the page's shading numbers are the attention the model used. A Step, Generate, Undo
and Reset return one Shown of what the page draws, and the Step handler goes down into the lab
once (bench.step_path's count).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import viz
from lab.catalogue.models import BUILTINS
from lab.checks import UserError
from lab.limits import MAX_NEW_TOKENS
from lab.session import Session
from model.generate import Sampling, adjust_probs

GRAMMAR = "grammar (built-in)"
COPY = "copy / induction (built-in)"
SORT = "sort digits (built-in)"
P = BUILTINS.get(GRAMMAR).examples[0]
S = Sampling(temperature=1.0, seed=5)


def forward_probs(entry, ids: list[int]) -> np.ndarray:
    """Softmax of the model's next-token logits after `ids`, by one plain forward pass."""
    with torch.inference_mode():
        logits = entry.model(torch.tensor([ids])).logits[0, -1]
    return torch.softmax(logits.float(), dim=-1).numpy()


def test_generate_continues_the_text_that_step_started():
    s = Session()
    s.step(GRAMMAR, P, S)
    s.step(GRAMMAR, P, S)
    before = list(s.decoder.ids)
    steps = list(s.generate(GRAMMAR, P, S, 3))
    assert s.decoder.ids[: len(before)] == before  # nothing restarted
    assert len(s.decoder.ids) == len(before) + len(steps)
    # the same tokens as stepping one at a time with the same seed
    t = Session()
    for _ in range(2 + len(steps)):
        t.step(GRAMMAR, P, S)
    assert t.decoder.ids == s.decoder.ids


def test_generate_starts_again_for_a_new_prompt_or_seed():
    s = Session()
    s.step(GRAMMAR, P, S)
    s.step(GRAMMAR, P, S)
    list(s.generate(GRAMMAR, P, Sampling(temperature=1.0, seed=6), 1))
    assert len(s.decoder.ids) == s.decoder.prompt_len + 1


def test_every_token_keeps_the_distribution_it_was_drawn_from():
    s = Session()
    entry = BUILTINS.get(GRAMMAR)
    steps = [s.step(GRAMMAR, P, S).step for _ in range(4)]
    d = s.decoder
    for k, st in enumerate(steps):
        index = d.prompt_len + k
        p = s.probabilities(index)
        assert not p.typed and p.index == index and p.chosen == st.token_id
        np.testing.assert_array_equal(p.probs, st.probs)
        np.testing.assert_array_equal(p.adjusted, st.adjusted)
        # ... and it is what a plain forward pass over the tokens before it computes
        np.testing.assert_allclose(p.probs, forward_probs(entry, d.ids[:index]), atol=1e-5)
        np.testing.assert_allclose(p.adjusted, adjust_probs(torch.log(torch.tensor(p.probs)), S).numpy(), atol=1e-5)
    assert s.probabilities().index == len(d.ids) - 1  # default: the last token


def test_the_after_bars_follow_other_sampling_settings_without_generating():
    s = Session()
    entry = BUILTINS.get(GRAMMAR)
    steps = [s.step(GRAMMAR, P, S).step for _ in range(2)]
    ids = list(s.decoder.ids)
    index = s.decoder.prompt_len  # the first generated token
    same = s.probabilities(index, Sampling(temperature=1.0))  # the settings it was drawn with (any seed)
    assert not same.resampled and same.adjusted is steps[0].adjusted
    for other in (Sampling(temperature=2.0), Sampling(temperature=0.5, top_k=3), Sampling(top_p=0.5),
                  Sampling(temperature=0.0)):
        p = s.probabilities(index, other)
        assert p.resampled and p.chosen == steps[0].token_id
        np.testing.assert_array_equal(p.probs, steps[0].probs)  # the model's own bars never move
        with torch.inference_mode():  # the adjusted bars are what the sampler makes of the model's logits
            logits = entry.model(torch.tensor([ids[:index]])).logits[0, -1]
        np.testing.assert_allclose(p.adjusted, adjust_probs(logits, other).numpy(), atol=1e-5)
    assert s.decoder.ids == ids  # nothing was generated
    typed = s.probabilities(3, Sampling(temperature=2.0))  # a typed token was not sampled: no after bars
    assert typed.typed and typed.adjusted is None and not typed.resampled


def test_a_typed_token_shows_what_the_model_predicted_there():
    s = Session()
    entry = BUILTINS.get(GRAMMAR)
    s.step(GRAMMAR, P, S)
    d = s.decoder
    assert s.probabilities(0) is None  # nothing before the first token
    for index in (1, 5, d.prompt_len - 1):
        p = s.probabilities(index)
        assert p.typed and p.adjusted is None and p.chosen == d.ids[index]
        np.testing.assert_allclose(p.probs, forward_probs(entry, d.ids[:index]), atol=1e-6)


@pytest.mark.parametrize("index", [-1, 10_000, "x", 2.5, True, None])
def test_a_bad_token_index_is_refused_or_means_the_last(index):
    s = Session()
    s.step(GRAMMAR, P, S)
    if index is None:
        assert s.probabilities(index).index == len(s.decoder.ids) - 1
        return
    with pytest.raises(ValueError):
        s.probabilities(index)


def test_undo_brings_back_the_previous_distribution():
    s = Session()
    first = s.step(GRAMMAR, P, S).step
    s.step(GRAMMAR, P, S)
    assert s.undo().undone
    p = s.probabilities()
    assert p.chosen == first.token_id and not p.typed
    np.testing.assert_array_equal(p.adjusted, first.adjusted)
    assert s.last_step.token_id == first.token_id
    assert s.undo().undone
    p = s.probabilities()  # back at the prompt: the last prompt token's prediction
    assert p.typed and p.index == s.decoder.prompt_len - 1
    assert not s.undo().undone  # the prompt itself never goes


def test_a_text_ended_by_eos_refuses_more_tokens_and_undo_reopens_it():
    s = Session()
    entry = BUILTINS.get(COPY)
    prompt = entry.examples[0]
    greedy = Sampling(temperature=0.0, seed=0)
    steps = [f.step for f in s.generate(COPY, prompt, greedy, MAX_NEW_TOKENS)]
    assert steps[-1].eos, "the copy model ends its answer with <EOS>"
    n = len(s.decoder.ids)
    with pytest.raises(UserError, match="ended this text with <EOS>"):
        s.step(COPY, prompt, greedy)
    with pytest.raises(UserError, match="<EOS>"):
        list(s.generate(COPY, prompt, greedy, 5))
    assert len(s.decoder.ids) == n  # nothing changed
    assert s.undo().undone
    s.step(COPY, prompt, greedy)  # the same <EOS> again, greedily
    assert s.last_step.eos


def test_reset_and_a_new_model_drop_the_kept_distributions():
    s = Session()
    s.step(GRAMMAR, P, S)
    s.reset()
    assert s.drawn == [] and s.probabilities() is None
    s.step(GRAMMAR, P, S)
    s.select_model(SORT)
    assert s.drawn == []


def test_the_page_shading_is_the_attention_the_model_used():
    s = Session()
    for _ in range(3):
        s.step(GRAMMAR, P, S)
    att = s.attention()
    for layer, w in enumerate(att.weights):
        for head in (None, 0, w.shape[0] - 1):
            payload = viz.shade_payload(w, layer, head)
            back = viz.decode_shade(payload)
            assert np.abs(back - w).max() <= 0.5 / 255 * w.max() + 1e-6
            q = len(att.tokens) - 1
            row = w[head, q] if head is not None else w[:, q].mean(axis=0)
            np.testing.assert_allclose(viz.shading(payload, q), row, atol=1 / 255)


def test_display_settings_are_checked():
    s = Session()
    assert s.set_display("row", True, "390x844").narrow
    assert s.display.colour == "row" and s.display.presentation
    for bad in [("nope", None, None), (None, "yes", None), (None, None, "wide"), (None, None, "1x2x3"),
                (None, None, 1366)]:
        with pytest.raises(ValueError):
            s.set_display(*bad)
    assert s.display.width == 390  # unchanged by the refusals


def test_a_step_returns_one_frame_of_what_the_page_draws():
    s = Session()
    frame = s.step(GRAMMAR, P, S, view=(1, "all", "weights"))
    assert frame.complete and frame.step is s.last_step
    assert frame.tokens == s.tokens() and frame.status == s.status()
    p = s.probabilities()
    assert frame.probs.chosen == p.chosen and frame.probs.index == p.index
    np.testing.assert_array_equal(frame.probs.adjusted, p.adjusted)
    att = s.attention()
    assert frame.change == "" and all(a is b for a, b in zip(frame.attention.weights, att.weights))
    assert (frame.view.layer, frame.view.head, frame.view.view) == (1, None, "weights")
    roles = s.heads.head_roles()
    assert frame.badges == roles.badges(1)  # no change: each head's strongest role on this text
    last = len(att.tokens) - 1
    assert frame.caption.startswith(f"Layer 1, every head: the last token “{att.tokens[last]}” looks most at")
    d = s.display
    assert (frame.plot_width, frame.plot_height, frame.chart_height) == (d.plot_width, d.plot_height, d.chart_height)
    assert frame.stem == "grammar" and frame.attention_file == f"grammar_L1Hall_attention-weights_{last + 1}-tokens"
    assert frame.probs_file == f"grammar_pos{p.index}_probabilities"


def test_the_frame_is_drawn_under_the_head_tools_change():
    s = Session()
    s.step(GRAMMAR, P, S)
    s.heads.set_ablation(["L1H0"], "zero", False)
    frame = s.step(GRAMMAR, P, S, view=(1, 0, "weights"))
    assert frame.change == "L1H0 ablated (zero)" and frame.caption.startswith("With L1H0 ablated (zero): ")
    assert "✕ zeroed" in frame.badges[0]
    assert not np.array_equal(frame.attention.weights[1], s.attention().weights[1])  # the changed forward's


def test_a_refused_view_changes_nothing_and_generate_completes_only_its_last_frame():
    s = Session()
    s.step(GRAMMAR, P, S)
    ids = list(s.decoder.ids)
    with pytest.raises(UserError, match="layer"):
        s.step(GRAMMAR, P, S, view=(99, "all", "weights"))
    assert s.decoder.ids == ids
    frames = list(s.generate(GRAMMAR, P, S, 3, view=(0, "all", "weights")))
    assert [f.complete for f in frames] == [False] * (len(frames) - 1) + [True]
    assert frames[-1].attention is not None and frames[0].attention is None
    assert [f.step.token_id for f in frames] == s.decoder.ids[len(ids):]
    undone = s.undo(view=(0, "all", "weights"))
    assert undone.undone and undone.complete and undone.step is None and undone.tokens == s.tokens()
    reset = s.reset()
    assert reset.tokens == [] and reset.status == "" and reset.probs is None and reset.attention is None


def test_a_warm_step_goes_down_from_the_handler_about_half_as_often_as_before():
    """bench.step_path's count: 32 trips down from the Step handler into lab/ or viz/ before the Shown."""
    from bench.step_path import trace
    from ui import explore

    s = Session()
    call = (GRAMMAR, P, 0.0, 0, 1.0, 0, 0, "all", "weights")
    explore.step(s, *call)
    _, trips, _ = trace(explore.step, s, *call)
    into_lab = [t for t in trips if t.startswith("lab/")]
    assert sorted(set(into_lab)) == ["lab/checks.py:check_sampling", "lab/session.py:step", "lab/session.py:turn"]
    assert len(trips) <= 16, trips
