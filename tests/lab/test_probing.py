"""The head tools of a session (lab.heads), held against slow, obvious references.

Head roles are compared with loops over the attention the model returned, the logit lens with
the plain forward, ablation with test_interventions' by-hand forward (a head's slice removed
before the output projection), regeneration with a step-by-step loop that calls the model's
forward itself, and prompt A vs B with two plain forwards. Every positional encoding, norm
placement, activation and both masks run through the same session code.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lab.catalogue.models import ModelEntry
from lab.checks import UserError
from lab.roles import SCORE_ROLES, compute_head_roles
from lab.session import Session
from model.config import ModelConfig
from model.generate import Sampling, adjust_probs
from model.heads import ROLES
from model.interventions import AttentionEdit, Intervention
from model.tokenizers import CharTokenizer
from model.transformer import DecoderLM
from tests.support.by_hand import by_hand

GRAMMAR, COPY, SORT = "grammar (built-in)", "copy / induction (built-in)", "sort digits (built-in)"
GRAMMAR_PROMPT = "anna found the key . she gave it to tom because he"
GREEDY = Sampling(temperature=0.0)
VARIANTS = [(pe, norm, act, mask) for pe in ("sinusoidal", "learned", "rope", "none")
            for norm, act in (("pre", "gelu"), ("post", "relu"), ("none", "swiglu"))
            for mask in ("causal", "bidirectional")]


@pytest.fixture(scope="module")
def grammar() -> Session:
    s = Session()
    s.step(GRAMMAR, GRAMMAR_PROMPT, GREEDY)
    return s


def own_session(pe="learned", norm="pre", act="gelu", mask="causal", seed=0) -> Session:
    """A session on an own model of this architecture (random weights, large enough that every head
    matters), as a trained or uploaded model would be."""
    tok = CharTokenizer.train("abcdefgh|=")
    cfg = ModelConfig(vocab_size=tok.vocab_size, block_size=16, n_layers=2, n_heads=2, d_model=16,
                      pos_encoding=pe, norm=norm, activation=act, mask=mask)
    torch.manual_seed(seed)
    model = DecoderLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.15 if norm == "none" else 0.4)
    s = Session()
    s._add_model(ModelEntry("mine", model, tok, {"corpus": "text"}))
    s.step("mine", "abcabcab", GREEDY)
    return s


def window(s: Session) -> torch.Tensor:
    return torch.tensor([s.decoder.window])


# ------------------------------------------------------------------------------ head roles


def test_roles_are_the_scores_of_the_attention_drawn(grammar):
    roles = grammar.heads.head_roles()
    att = grammar.attention()
    a = np.stack(att.weights).astype(np.float64)  # (L, H, T, T): what the Explore figure draws
    L, H, T, _ = a.shape
    for layer in range(L):
        for h in range(H):
            prev = np.mean([a[layer, h, i, i - 1] for i in range(1, T)])
            first = np.mean([a[layer, h, i, 0] for i in range(1, T)])
            ent = np.mean([-sum(w * math.log2(w) for w in a[layer, h, i, : i + 1] if w > 0) for i in range(1, T)])
            assert roles.scores["previous_token"][layer, h] == pytest.approx(prev, abs=1e-9)
            assert roles.scores["first_token"][layer, h] == pytest.approx(first, abs=1e-9)
            assert roles.scores["entropy"][layer, h] == pytest.approx(ent, abs=1e-6)
    # the table of /head_roles holds the same numbers, one row per head
    rows = roles.rows()
    assert len(rows) == L * H
    col = roles.columns().index("previous_token")
    assert all(r[col] == round(float(roles.scores["previous_token"][r[0], r[1]]), 4) for r in rows)


def test_grammar_pronoun_head_is_labelled_by_what_it_does(grammar):
    """The head the README points to (layer 1, head 0: "he" → "tom") gets the pronoun → name label."""
    roles = grammar.heads.head_roles()
    toks = grammar.attention().tokens
    he, tom = toks.index("he"), toks.index("tom")
    weight = float(grammar.attention().weights[1][0, he, tom])
    assert weight >= 0.5
    assert roles.scores["match"][1, 0] == pytest.approx(max(weight, float(grammar.attention().weights[1][0, toks.index("she"), 0])))
    assert roles.label(1, 0) == f"pronoun → name head: {roles.scores['match'][1, 0]:.2f} ≥ 0.5"
    assert roles.badges(1)[0].startswith("pronoun → name")


def test_copy_induction_head_is_labelled_once_the_copy_starts():
    s = Session()
    s.step(COPY, "hcbpadlk|", GREEDY)  # the example prompt and one Step: "h" comes again
    assert s.heads.head_roles().label(0, 1).startswith("induction head: ")
    for _ in s.generate(COPY, "hcbpadlk|", GREEDY, 6):
        pass
    assert "".join(p for p, _ in s.tokens()) == "hcbpadlk|hcbpadl"
    roles = s.heads.head_roles()
    induction = [(layer, h) for layer in range(roles.shape[0]) for h in range(roles.shape[1])
                 if (found := roles.strongest(layer, h)) and found[0].key in ("induction", "match")]
    assert (0, 1) in induction  # the head the copy model's first view names
    assert "induction" in roles.label(0, 1) or "copy match" in roles.label(0, 1)


def test_trained_and_uploaded_models_get_their_tasks_role(tmp_path, train_sort):
    """A model trained in the app on the sort task, and the same model uploaded from its file."""
    s = Session()
    progress = train_sort(s, layers=2, steps=30)
    name = progress.run.name
    s.step(name, "503124=", GREEDY)
    roles = s.heads.head_roles()
    assert [r.key for r in roles.roles][-1] == "match" and roles.roles[-1].name == "sort match"
    other = Session()
    uploaded = other.upload(str(progress.download))
    other.step(uploaded, "503124=", GREEDY)
    again = other.heads.head_roles()
    for key in roles.scores:
        np.testing.assert_allclose(again.scores[key], roles.scores[key], atol=1e-6)
    other.heads.set_ablation(["L0H1"], "zero", False)
    assert other.heads.effect().kl_bits > 0  # the uploaded model's heads can be ablated too


def test_roles_are_recomputed_at_every_step():
    s = Session()
    s.step(GRAMMAR, "anna found the key", GREEDY)
    before = s.heads.head_roles()
    assert np.isnan(before.scores["induction"]).all()  # no token repeats: undefined, not 0
    for _ in range(4):
        s.step(GRAMMAR, "anna found the key", GREEDY)
    after = s.heads.head_roles()
    assert len(after.tokens) == len(before.tokens) + 4
    assert not np.allclose(after.scores["previous_token"], before.scores["previous_token"])


def test_roles_kept_for_one_text_are_never_stale():
    """The roles are computed once per text and reused; every change of the text recomputes them."""
    s = Session()
    hot = Sampling(temperature=1.5, seed=1)
    s.step(GRAMMAR, "anna found the key", hot)
    first = s.heads.head_roles()
    assert s.heads.head_roles() is first  # the same text: reused
    for action in (lambda: s.undo(), lambda: s.step(GRAMMAR, "anna found the key", hot),
                   lambda: s.step(GRAMMAR, "anna found the key", Sampling(temperature=1.5, seed=2)),
                   lambda: s.step(COPY, "hcbpadlk|", GREEDY)):
        action()
        att = s.attention()
        fresh = compute_head_roles(s.entry, s.decoder.window, att.weights, att.tokens)
        got = s.heads.head_roles()
        for key in fresh.scores:
            np.testing.assert_array_equal(got.scores[key], fresh.scores[key])


# ------------------------------------------------------------------------------ logit lens


@pytest.mark.parametrize("variant", VARIANTS[::3])
def test_lens_last_row_is_the_models_own_distribution(variant):
    s = own_session(*variant)
    model = s.entry.model
    newest = len(s.decoder.window) - 1
    for index in (0, 3, newest):
        lens = s.heads.lens(index)
        with torch.inference_mode():
            logits = model(window(s)).logits[0, index]
        own = torch.softmax(logits.double(), -1).numpy()
        # the newest token's row is, bit for bit, the distribution its Step drew from; an earlier one comes
        # from the token run against the text's cache (tests/lab/test_lens_cache.py), the same sums as
        # the whole window's in another order, or for a bidirectional model from exactly that forward
        if index == newest:
            assert np.array_equal(lens.probs[-1], torch.softmax(s.decoder.logits.double(), -1).numpy())
        if s.decoder.use_cache or index == newest:
            np.testing.assert_allclose(lens.probs[-1], own, atol=1e-6, rtol=0)
        else:
            assert np.array_equal(lens.probs[-1], own)
        assert lens.probs.shape == (model.cfg.n_layers + 1, s.entry.tokenizer.vocab_size)
        np.testing.assert_allclose(lens.probs.sum(-1), 1.0, atol=1e-12)


def test_lens_rows_are_the_residual_stream_read_out(grammar):
    """Row l + 1 is block l's output through the final norm and head (hooks on the real modules)."""
    model = grammar.entry.model
    seen = []
    hooks = [b.register_forward_hook(lambda m, i, o: seen.append(o[0] if isinstance(o, tuple) else o))
             for b in model.blocks]
    try:
        with torch.inference_mode():
            model(window(grammar))
    finally:
        for h in hooks:
            h.remove()
    lens = grammar.heads.lens(11)
    assert len(seen) == model.cfg.n_layers == 3
    for layer, out in enumerate(seen):
        with torch.inference_mode():
            expect = torch.softmax(model.head(model.norm_f(out))[0, 11].double(), -1).numpy()
        # the lens reads out position 11 alone (one row per layer, in one batch): float32 rounds that
        # product apart from this one over every position, by about 1e-6
        np.testing.assert_allclose(lens.probs[layer + 1], expect, atol=1e-5)
    assert not np.allclose(lens.probs[1], lens.probs[-1], atol=1e-3)  # the prediction forms layer by layer
    assert lens.token == "he" and lens.labels[0] == "embedding" and lens.labels[-1] == "after layer 2"


def test_lens_follows_the_selected_token(grammar):
    grammar.select(4)
    try:
        assert grammar.heads.lens().index == 4
    finally:
        grammar.select_last()
    assert grammar.heads.lens().index == len(grammar.decoder.window) - 1


# ------------------------------------------------------------------------ ablation and edits


def _expected(s: Session, index: int, heads=(), mode="zero", edits=()):
    """Before and after from the slow by-hand forward of test_interventions (float64 copy)."""
    model = s.entry.model.double()
    edits = [AttentionEdit(*e) for e in edits]
    torch.set_grad_enabled(False)
    try:
        ids = window(s)
        before = by_hand(model, ids)[0][0, index]
        after = by_hand(model, ids, ablate=heads, mode=mode, edits=edits)[0][0, index]
    finally:
        s.entry.model.float()
        torch.set_grad_enabled(True)
    return torch.softmax(before, -1).numpy(), torch.softmax(after, -1).numpy()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["zero", "mean", "uniform"])
def test_ablation_effect_matches_by_hand(variant, mode):
    s = own_session(*variant)
    s.heads.set_ablation(["L1H0", "L0H1"], mode, False)
    e = s.heads.effect()
    last = len(s.decoder.window) - 1
    p, q = _expected(s, last, heads=[(0, 1), (1, 0)], mode=mode)
    assert_close_and_telling(e.before, e.after, p, q)
    kl = float(np.sum(e.before * np.log2(e.before / e.after)))
    assert e.kl_bits == pytest.approx(kl, rel=1e-5, abs=1e-12)


def assert_close_and_telling(before, after, p, q):
    """The app's before/after equal the reference's (log-probabilities, float32 against float64),
    and the change is at least ten times the error: a no-op ablation could not pass."""
    err = max(np.abs(np.log(before) - np.log(p)).max(), np.abs(np.log(after) - np.log(q)).max())
    gap = np.abs(np.log(p) - np.log(q)).max()
    assert err < 1e-5
    assert err < 0.1 * gap


def test_no_heads_is_bit_for_bit_the_normal_forward(grammar):
    s = grammar
    s.heads.set_ablation([], "zero", False)
    assert not s.heads.settings.active and s.heads.settings.intervention() is None
    s.heads.set_ablation(["L0H0"], "zero", False)
    try:
        e = s.heads.effect()
        with torch.inference_mode():
            plain = torch.softmax(s.entry.model(window(s)).logits[0, -1].double(), -1).numpy()
        assert np.array_equal(e.before, plain)
    finally:
        s.heads.clear_probe()


@pytest.mark.parametrize("variant", VARIANTS[::4])
def test_attention_edit_matches_by_hand(variant):
    s = own_session(*variant)
    n = len(s.decoder.window)
    s.select(n - 2)
    s.heads.set_edit(1, 1, n - 2, 2)
    e = s.heads.effect()
    assert e.index == n - 2
    p, q = _expected(s, n - 2, edits=[(1, 1, n - 2, 2)])
    assert_close_and_telling(e.before, e.after, p, q)
    s.heads.set_edit(0, 0, n - 2, "uniform")
    p, q = _expected(s, n - 2, edits=[(0, 0, n - 2, None)])
    assert_close_and_telling(e.before, s.heads.effect().after, p, q)
    assert "every allowed key equally" in s.heads.effect().what


def test_keep_only_ablates_every_other_head():
    s = own_session()
    s.heads.set_ablation(["L0H0"], "zero", True)
    kept = s.heads.effect().after
    s.heads.set_ablation(["L0H1", "L1H0", "L1H1"], "zero", False)
    np.testing.assert_array_equal(s.heads.effect().after, kept)


def test_ablation_stays_while_the_text_grows():
    s = own_session()
    s.heads.set_ablation(["L1H1"], "mean", False)
    s.step("mine", "abcabcab", GREEDY)
    assert s.heads.settings.heads == ((1, 1),)
    e = s.heads.effect()
    p, q = _expected(s, len(s.decoder.window) - 1, heads=[(1, 1)], mode="mean")
    assert_close_and_telling(e.before, e.after, p, q)


def test_settings_lifecycle():
    s = Session()
    s.step(GRAMMAR, GRAMMAR_PROMPT, GREEDY)
    s.heads.set_ablation(["L1H0"], "zero", False)
    s.heads.set_edit(2, 1, 11, 9)
    s.step(GRAMMAR, GRAMMAR_PROMPT, GREEDY)  # the same text goes on: everything stays
    assert s.heads.settings.heads == ((1, 0),) and s.heads.settings.edit == AttentionEdit(2, 1, 11, 9)
    s.undo()
    s.undo()
    assert s.heads.settings.edit is not None  # position 11 is prompt: still there
    s.step(GRAMMAR, "tom met lisa at the park . he", GREEDY)  # a new text: the row meant the old one
    assert s.heads.settings.heads == ((1, 0),) and s.heads.settings.edit is None
    s.select_model(SORT)  # another model: its heads are others
    assert not s.heads.settings.active


@pytest.mark.parametrize("call, fragment", [
    (lambda s: s.heads.set_ablation(["L9H0"], "zero", False), "layers 0–2"),
    (lambda s: s.heads.set_ablation(["L0H7"], "zero", False), "heads 0–3"),
    (lambda s: s.heads.set_ablation(["head one"], "zero", False), "L<layer>H<head>"),
    (lambda s: s.heads.set_ablation("L0H1; rm -rf", "zero", False), "L<layer>H<head>"),
    (lambda s: s.heads.set_ablation(42, "zero", False), "list"),
    (lambda s: s.heads.set_ablation([[0, True]], "zero", False), "L<layer>H<head>"),
    (lambda s: s.heads.set_ablation(["L0H0"], "shuffle", False), "ablation mode"),
    (lambda s: s.heads.set_ablation(["L0H0"], "zero", "yes"), "true or false"),
    (lambda s: s.heads.set_ablation([], "zero", True), "at least one head"),
    (lambda s: s.heads.set_ablation(["L0H0"] * 99, "zero", False), "12"),
    (lambda s: s.heads.set_edit(0, 0, 3, 7), "comes after the query"),
    (lambda s: s.heads.set_edit(0, 0, 99, 0), "query position"),
    (lambda s: s.heads.set_edit(5, 0, 3, 0), "layer"),
    (lambda s: s.heads.set_edit(0, 0, 3, "left"), "key position"),
    (lambda s: s.heads.set_edit(1, 0, 3, 1), "both ablated"),
    (lambda s: s.heads.lens(999), "token position"),
    (lambda s: s.heads.lens("x"), "token position"),
])
def test_refusals_change_nothing(call, fragment):
    s = Session()
    s.step(GRAMMAR, GRAMMAR_PROMPT, GREEDY)
    s.heads.set_ablation(["L1H0"], "zero", False)
    before = (s.heads.settings, list(s.decoder.ids), s.query)
    with pytest.raises(UserError, match=fragment):
        call(s)
    assert (s.heads.settings, list(s.decoder.ids), s.query) == before


def test_tools_need_a_text():
    s = Session()
    for call in (lambda: s.heads.lens(), lambda: s.heads.effect(),
                 lambda: s.heads.set_ablation(["L0H0"], "zero", False),
                 lambda: s.heads.set_edit(0, 0, 0, 0), lambda: s.heads.regenerate(GREEDY, 3)):
        with pytest.raises(UserError, match="Step first"):
            call()
    assert s.heads.head_roles() is None


# ----------------------------------------------------------------------------- regenerate


def _slow_continuation(model, ids, sampling, n, iv, eos_id, block):
    """Token by token: the whole window through the model's forward (no cache), then the sampler."""
    g = torch.Generator().manual_seed(sampling.seed)
    ids = list(ids)
    start_len = len(ids)
    for _ in range(n):
        start = max(0, len(ids) - block)
        w = Intervention(iv.heads, iv.mode, iv.keep_only, iv.edits).within(start, 0, len(ids) - start) \
            if iv is not None else None
        with torch.inference_mode():
            logits = model(torch.tensor([ids[start:]]), intervention=w).logits[0, -1]
        probs = adjust_probs(logits, sampling)
        tok = int(torch.multinomial(probs, 1, generator=g)) if sampling.temperature else int(probs.argmax())
        ids.append(tok)
        if tok == eos_id:
            break
    return ids[start_len:]


@pytest.mark.parametrize("sampling", [GREEDY, Sampling(temperature=0.9, seed=7)])
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_regenerate_matches_a_slow_loop(sampling, mode):
    s = Session()
    s.step(GRAMMAR, "anna found the key . she gave it to tom because he asked", GREEDY)
    s.heads.set_ablation(["L1H1", "L2H3"], mode, False)
    r = s.heads.regenerate(sampling, 12)
    model, tok = s.entry.model, s.entry.tokenizer
    normal = _slow_continuation(model, s.decoder.ids, sampling, 12, None, tok.eos_id, model.cfg.block_size)
    changed = _slow_continuation(model, s.decoder.ids, sampling, 12, s.heads.settings.intervention(), tok.eos_id,
                                 model.cfg.block_size)
    assert r.normal == [tok.piece(i) for i in normal]
    assert r.changed == [tok.piece(i) for i in changed]
    diff = next((i for i, (a, b) in enumerate(zip(r.normal, r.changed)) if a != b), None)
    assert r.first_difference == diff


def test_regenerate_marks_where_they_part():
    s = Session()
    s.step(GRAMMAR, GRAMMAR_PROMPT, GREEDY)
    s.heads.set_edit(1, 0, 11, 0)
    r = s.heads.regenerate(GREEDY, 12)
    assert r.first_difference is not None
    assert r.normal[: r.first_difference] == r.changed[: r.first_difference]
    assert r.normal[r.first_difference] != r.changed[r.first_difference]
    with pytest.raises(UserError, match="tokens to regenerate"):
        s.heads.regenerate(GREEDY, 10_000)
    s.heads.clear_probe()
    with pytest.raises(UserError, match="Choose heads"):
        s.heads.regenerate(GREEDY, 4)


# --------------------------------------------------------------------------------- compare


def test_compare_is_two_plain_forwards():
    s = Session()
    c = s.heads.compare(GRAMMAR, "anna found the key . she", "tom found the key . he")
    model, tok = s.entry_for(GRAMMAR).model, s.entry_for(GRAMMAR).tokenizer
    outs = []
    for text in ("anna found the key . she", "tom found the key . he"):
        with torch.inference_mode():
            outs.append(model(torch.tensor([tok.encode(text)]), return_attention=True, logits="last"))
    for layer in range(model.cfg.n_layers):
        expect = (outs[1].attentions[layer][0] - outs[0].attentions[layer][0]).numpy()
        np.testing.assert_allclose(c.diff[layer], expect, atol=1e-7)
    np.testing.assert_allclose(c.probs_b, torch.softmax(outs[1].logits[0, -1].double(), -1).numpy(), atol=1e-12)
    assert c.aligned_tokens() == ["anna→tom", "found", "the", "key", ".", "she→he"]
    assert c.notes == []
    kl = float(np.sum(c.probs_a * np.log2(c.probs_a / c.probs_b)))
    assert c.kl_bits() == pytest.approx(kl, rel=1e-6)
    rows = c.rows()
    col = c.columns().index("previous_token B−A")
    r = rows[5]
    assert r[col] == pytest.approx(round(float(c.roles_b.scores["previous_token"][r[0], r[1]]
                                               - c.roles_a.scores["previous_token"][r[0], r[1]]), 4), abs=1e-4)


def test_compare_says_when_lengths_differ():
    c = Session().heads.compare(GRAMMAR, "anna found the key . she", "tom found the old key . he")
    assert c.common == 6 and len(c.tokens_b) == 7
    assert any("6 and 7 tokens" in n for n in c.notes)
    assert all(d.shape[-1] == 6 for d in c.diff)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v[3] == "bidirectional"][:3])
def test_compare_bidirectional_models_say_so(variant):
    s = own_session(*variant)
    c = s.heads.compare("mine", "abcab", "abcad")
    assert any("both directions" in n for n in c.notes)
    assert c.roles_a.scores["previous_token"].shape == (2, 2)


@pytest.mark.parametrize("a, b, fragment", [("", "tom", "empty"), ("anna", "zebra", "does not know"),
                                            ("anna", 5, "text"), ("x" * 5000, "anna", "limit")])
def test_compare_refusals(a, b, fragment):
    with pytest.raises(UserError, match=fragment):
        Session().heads.compare(GRAMMAR, a, b)


def test_role_formulas_are_stated():
    for key in SCORE_ROLES:
        assert ROLES[key].formula and ROLES[key].meaning


def test_the_learn_tabs_worked_example_holds():
    """Learn section 16 quotes these numbers ("attention is not explanation"): they must stay true."""
    s = Session()
    s.step(GRAMMAR, GRAMMAR_PROMPT, GREEDY)
    s.select(11)
    assert float(s.attention().weights[1][0, 11, 9]) == pytest.approx(0.756, abs=5e-4)
    s.heads.set_ablation(["L1H0"], "zero", False)
    assert s.heads.effect().kl_bits < 0.001  # the bright cell does nothing for this token
    t = Session()
    t.step(GRAMMAR, GRAMMAR_PROMPT + " asked", GREEDY)
    t.undo()  # the text ends at "asked": the tools read the prediction after it
    her, him = t.entry.tokenizer.encode("her")[0], t.entry.tokenizer.encode("him")[0]
    t.heads.set_ablation(["L1H0"], "zero", False)
    e = t.heads.effect()
    assert e.before[her] == pytest.approx(0.996, abs=5e-4)
    assert [e.after[her], e.after[him], e.kl_bits] == pytest.approx([0.526, 0.473, 0.893], abs=1.5e-3)
    t.heads.set_ablation(["L1H0", "L0H3"], "zero", False)
    e = t.heads.effect()
    assert [e.after[him], e.kl_bits] == pytest.approx([0.690, 1.654], abs=1.5e-3)
