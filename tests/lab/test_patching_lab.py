"""Activation-patching sweeps of the lab (lab/patching.py) held to a float64 forward written out from the
weights (tests/support/patch_reference.py): every cell of every sweep (heads, residual stream, attention
and MLP outputs; denoising and noising) on the built-ins, a model trained here, random folders of the real
families and random models of every positional encoding; the endpoints of the method (nothing patched,
every head, the last residual); refusals in sentences; progress, Stop, one sweep per session, the memory
budget; the download.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from lab import patching, sweeps
from lab.catalogue.models import BUILTINS, ModelEntry
from lab.checks import UserError
from lab.server.budget import MODEL_BUDGET, ModelBudget
from lab.session import Session
from model.families import open_folder
from model.patching import Patch, PatchSite
from model.transformer import DecoderLM
from tests.support.patch_reference import family_folder, metric_of, one_thread, reference  # noqa: F401 (fixture)



GRAMMAR = "grammar (built-in)"
LONG_A = "anna found the key . she gave it to tom because he asked"
LONG_B = "tom found the key . he gave it to anna because she asked"
PAIRS = {  # same length in tokens; answers None: the two tokens whose logit difference A and B move most
    GRAMMAR: (LONG_A, LONG_B, " she", " he"),
    "copy / induction (built-in)": ("hcbpadlk|hcb", "hcbpadlk|hcp", None, None),
    "sort digits (built-in)": ("503124=", "503125=", None, None),
    "shakespeare (built-in)": ("ROMEO:\nO, she", "JULIA:\nO, she", None, None),
    "article toy (built-in)": ("how is living in amsterdam <EOS>", "living in amsterdam is how <EOS>", None, None),
}


def moved_most(entry: ModelEntry, a: str, b: str) -> tuple[str, str]:
    """The pieces of the two tokens whose logit difference changes most from B to A."""
    n = entry.model.cfg.vocab_used or entry.model.cfg.vocab_size
    z = [reference(entry.model, entry.tokenizer.encode(p))[0][-1, :n] for p in (a, b)]
    d = z[0] - z[1]
    return entry.pieces[int(d.argmax())], entry.pieces[int(d.argmin())]


def check_every_cell(entry: ModelEntry, a: str, b: str, answer=None, other=None, metric="logit_diff",
                     whats=tuple(patching.SWEEPS)) -> None:
    """Every cell of each sweep, both directions, equals the reference's forward with that slice replaced."""
    if answer is None:
        answer, other = moved_most(entry, a, b)
    setup = patching.prepare_sweep(entry, a, b, metric, answer, other)
    m, n = setup.metric, entry.model.cfg.vocab_used or entry.model.cfg.vocab_size
    refs = {name: reference(entry.model, ids) for name, ids in (("a", setup.ids_a), ("b", setup.ids_b))}
    ref_a, ref_b = (metric_of(refs[k][0][-1], m.kind, m.answer, m.other, n) for k in "ab")
    tol = 2e-4 if metric == "logit_diff" else 1e-6
    assert setup.clean == pytest.approx(ref_a, abs=tol) and setup.corrupted == pytest.approx(ref_b, abs=tol)
    for what in whats:
        if what == "mlp" and entry.model.cfg.ff_dim == 0:
            continue
        for direction in patching.DIRECTIONS:
            result = patching.sweep(setup, what, direction)
            base, source = (setup.ids_b, refs["a"][1]) if direction == "denoising" else (setup.ids_a, refs["b"][1])
            _, _, sites = patching.grid(entry, what, len(setup.ids_a))
            want = []
            for s in sites:
                logits, _ = reference(entry.model, base, [(s.kind, s.layer, s.head, s.positions)], source)
                want.append(metric_of(logits[-1], m.kind, m.answer, m.other, n))
            want = np.array(want).reshape(result.metric.shape)
            np.testing.assert_allclose(result.metric, want, atol=tol, rtol=0, err_msg=f"{what} {direction}")
            share = (want - ref_b) / (ref_a - ref_b) if direction == "denoising" else (ref_a - want) / (ref_a - ref_b)
            np.testing.assert_allclose(result.values, share, atol=50 * tol / abs(ref_a - ref_b), rtol=0)
            assert result.done == result.values.size and not result.stopped


@pytest.mark.parametrize("name", list(PAIRS))
def test_every_cell_of_every_sweep_on_the_builtins(name):
    entry = BUILTINS.get(name)
    check_every_cell(entry, *PAIRS[name])


def test_the_probability_metric_cell_by_cell():
    check_every_cell(BUILTINS.get(GRAMMAR), "anna found the key . she gave it to", "tom found the key . he gave it to",
                     " tom", None, metric="prob", whats=("heads", "resid"))


def run(entry, ids, patch):
    """The own engine's last-position logits of `ids` under `patch`, read without the lab."""
    with torch.inference_mode():
        return entry.model(ids, patch=patch, logits="last").logits[:, -1]


def test_the_methods_endpoints():
    """Nothing patched gives the corrupted run's metric; every head's output in every layer, or the residual
    stream after the last block, gives the clean run's (both prompts end on the same token)."""
    entry = BUILTINS.get(GRAMMAR)
    setup = patching.prepare_sweep(entry, LONG_A, LONG_B, "logit_diff", " she", " he")
    cfg = entry.model.cfg
    for base, source_ids, want in ((setup.ids_b, setup.ids_a, setup.clean), (setup.ids_a, setup.ids_b, setup.corrupted)):
        with torch.inference_mode():
            source = entry.model(torch.tensor([source_ids]), record=True, logits="last").activations
        ids = torch.tensor([base])
        unpatched = run(entry, ids, Patch())
        assert setup.metric.of(unpatched, entry)[0] == (setup.corrupted if want == setup.clean else setup.clean)
        heads = [PatchSite("head", l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
        for sites in (heads, [PatchSite("resid", cfg.n_layers)]):
            out = run(entry, ids, Patch(source, sites))
            assert setup.metric.of(out, entry)[0] == pytest.approx(want, abs=1e-4)
    for direction in patching.DIRECTIONS:
        resid = patching.sweep(setup, "resid", direction)
        assert resid.values[-1, -1] == pytest.approx(1.0, abs=1e-5)  # the last residual at the last position
        np.testing.assert_allclose(resid.values[-1, :-1], 0.0, atol=1e-5)  # the others are never read again
    heads = patching.sweep(setup, "heads", "denoising")
    assert heads.best(1)[0][:2] == (1, 0) and heads.summary().startswith("L1H0 restores ")
    assert "% of the she/he difference" in heads.summary()


def test_a_model_trained_here(train_sort):
    session = Session()
    run = train_sort(session, layers=2, steps=30)
    entry = session.entry_for(run.run.name)
    check_every_cell(entry, "503124=", "503125=")


@pytest.mark.parametrize("pe", ["learned", "sinusoidal", "rope", "none"])
def test_every_positional_encoding(pe):
    sort = BUILTINS.get("sort digits (built-in)")
    torch.manual_seed(1)
    model = DecoderLM(dataclasses.replace(sort.model.cfg, pos_encoding=pe)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5.0 if p.dim() > 1 else 1.0)
    entry = ModelEntry(f"random {pe}", model, sort.tokenizer, {})
    check_every_cell(entry, "503124=", "513124=", whats=("heads", "resid"))


@pytest.mark.slow  # transformers builds and saves each folder
@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_random_folders_of_the_real_families(family, tmp_path):
    model, tok = open_folder(family_folder(family, tmp_path))
    entry = ModelEntry(family, model, tok, {})
    a, b = "the fox met a bear", "the bear met a fox"
    assert len(tok.encode(a)) == len(tok.encode(b))
    check_every_cell(entry, a, b, whats=("heads", "attn"))


@pytest.mark.slow  # transformers builds and saves the folder
def test_one_token_answers_on_a_tokenizer_that_puts_bos_first(tmp_path):
    """A Llama-style tokenizer encodes a text with <s> first; an answer typed as text is still read as the
    token it is (the BOS belongs to a text's start, not to an answer that continues it)."""
    import transformers
    from tests.support.families import save_reference, sharpen
    from tests.support.patch_reference import FAMILIES, FAMILY_VOCAB

    cfg = transformers.LlamaConfig(vocab_size=FAMILY_VOCAB, bos_token_id=1, eos_token_id=0,
                                   attn_implementation="eager", **FAMILIES["llama"][2])
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(cfg).eval()
    sharpen(ref, seed=5)
    model, tok = open_folder(save_reference(ref, tmp_path / "llama-bos", FAMILY_VOCAB, bos=True))
    assert tok.add_bos and tok.encode(" fox")[0] == tok.bos_id and len(tok.encode(" fox")) == 2
    entry = ModelEntry("llama with BOS", model, tok, {})
    fox, bear = (tok.encode(w, add_special_tokens=False) for w in (" fox", " bear"))
    assert len(fox) == len(bear) == 1 and tok.encode(" fox") == [tok.bos_id, *fox]
    assert patching.answer_token(entry, " fox", "first") == fox[0] == patching.answer_token(entry, "␣fox", "first")
    a, b = "the fox met a bear", "the bear met a fox"
    setup = patching.prepare_sweep(entry, a, b, "logit_diff", " fox", " bear")
    assert (setup.metric.answer, setup.metric.other) == (fox[0], bear[0])
    assert setup.ids_a[0] == tok.bos_id  # the prompts keep their BOS
    check_every_cell(entry, a, b, " fox", " bear", whats=("heads",))
    wood = tok.encode(" wood", add_special_tokens=False)
    assert len(wood) == 2  # counted without the BOS
    with pytest.raises(UserError, match="' wood' is 2 tokens for this model"):
        patching.answer_token(entry, " wood", "first")


def test_refusals_are_sentences_and_change_nothing():
    entry = BUILTINS.get(GRAMMAR)
    cases = {
        "same number of tokens": ("anna found the key . she", "tom found the key", " she", " he"),
        "single token": (LONG_A, LONG_B, "she gave", " he"),
        "same token": (LONG_A, LONG_B, " she", "she"),
        "no difference for a patch": (LONG_A, LONG_A, " she", " he"),
    }
    for words, (a, b, x, y) in cases.items():
        with pytest.raises(UserError, match=words):
            patching.prepare_sweep(entry, a, b, "logit_diff", x, y)
    with pytest.raises(UserError, match="Minimal pair|minimal pair"):
        patching.prepare_sweep(entry, "anna found the key . she", "tom found the key", "logit_diff", " she", " he")
    with pytest.raises(UserError, match="metric"):
        patching.prepare_sweep(entry, LONG_A, LONG_B, "kl", " she", " he")
    setup = patching.prepare_sweep(entry, LONG_A, LONG_B, "logit_diff", " she", " he")
    for what, direction in (("neurons", "denoising"), ("heads", "sideways")):
        with pytest.raises(UserError):
            patching.sweep(setup, what, direction)
    toy = BUILTINS.get("article toy (built-in)")
    a, b, *_ = PAIRS["article toy (built-in)"]
    x, y = moved_most(toy, a, b)
    with pytest.raises(UserError, match="no MLP"):
        patching.sweep(patching.prepare_sweep(toy, a, b, "logit_diff", x, y), "mlp", "denoising")
    # a display piece names a token too
    assert patching.answer_token(entry, "she", "first") == patching.answer_token(entry, " she", "first")


def test_progress_stop_and_one_sweep_per_session():
    session = Session()
    args = (GRAMMAR, LONG_A, LONG_B, "logit_diff", " she", " he", "resid", "denoising")
    seen = []
    result = session.sweeps.run(*args, progress=lambda done, total: seen.append((done, total)))
    T = len(BUILTINS.get(GRAMMAR).tokenizer.encode(LONG_A))
    cells = (3 + 1) * T
    assert seen and all(t == cells for _, t in seen) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert result.done == cells and np.isfinite(result.values).all()
    held = MODEL_BUDGET.held(session)
    steps = session.sweeps.run_steps(*args)
    first = next(steps)
    assert first.result is None and 0 < first.done < cells
    assert MODEL_BUDGET.held(session) == held + patching.sweep_bytes(BUILTINS.get(GRAMMAR), T)
    with pytest.raises(UserError, match="already running"):
        session.sweeps.run(*args)
    assert session.sweeps.stop()
    last = list(steps)[-1]
    assert last.result.stopped and last.result.done == first.done
    assert np.isnan(last.result.values.ravel()[first.done:]).all()
    assert np.isfinite(last.result.values.ravel()[:first.done]).all()
    np.testing.assert_array_equal(last.result.values.ravel()[:first.done], result.values.ravel()[:first.done])
    assert MODEL_BUDGET.held(session) == held and not session.sweeps.stop()
    session.sweeps.run(*args)  # the session may sweep again


def test_a_full_memory_budget_refuses_the_sweep(monkeypatch):
    session = Session()
    monkeypatch.setattr(sweeps, "MODEL_BUDGET", ModelBudget(limit_bytes=1000))
    with pytest.raises(UserError, match="memory"):
        session.sweeps.run(GRAMMAR, LONG_A, LONG_B, "logit_diff", " she", " he")
    assert not session.sweeps.stop()  # nothing left running
    assert sweeps.MODEL_BUDGET.held(session) == 0


def test_the_download_holds_every_cell():
    session = Session()
    result = session.sweeps.run(GRAMMAR, LONG_A, LONG_B, "logit_diff", " she", " he", "heads", "noising")
    export = patching.export(result)
    lines = export.csv.strip().split("\r\n")
    assert lines[0].split(",") == patching.CSV_COLUMNS and len(lines) == 1 + 12
    assert export.name == "grammar_patching_heads_noising_13tokens"
    data = json.loads(export.json_text())
    assert data["values"] == result.values.tolist() and data["metric_patched"] == result.metric.tolist()
    assert data["direction"] == "noising" and data["value_is"] == "share of the A→B difference made"
    row = lines[1 + 4].split(",")  # L1H0
    assert row[2:5] == ["L1", "1", "0"] and float(row[-1]) == result.values[1, 0]


def test_a_sweep_past_the_servers_arithmetic_bound_is_refused(monkeypatch):
    entry = BUILTINS.get(GRAMMAR)
    T = len(entry.tokenizer.encode(LONG_A))
    work = patching.sweep_flops(entry, "resid", T)
    assert patching.sweep_flops(entry, "heads", T) < work  # 12 runs against 52
    monkeypatch.setattr(patching, "MAX_SWEEP_GFLOP", work / 2e9)
    session = Session()
    with pytest.raises(UserError, match=f"would run 52 patched forwards of {T} tokens.*Use shorter prompts"):
        session.sweeps.run(GRAMMAR, LONG_A, LONG_B, "logit_diff", " she", " he", "resid")
    assert not session.sweeps.stop() and MODEL_BUDGET.held(session) == 0
    assert session.sweeps.run(GRAMMAR, LONG_A, LONG_B, "logit_diff", " she", " he", "heads").done == 12
