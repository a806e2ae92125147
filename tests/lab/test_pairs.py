"""Minimal pairs made for a model's own tokenizer (lab/pairs.py), on real models: a nanoGPT character run,
a GPT-2 folder with a byte-level BPE of GPT-2's size, a small BPE folder, and the built-ins. Each pair has
prompts of the same number of tokens as the lab reads a prompt and two different one-token answers, so a
patching sweep runs on it; the count check says which words of a template keep the count; the refusal of
prompts of different lengths names a pair of the model's own.
"""

from __future__ import annotations

import pytest
import torch

from lab import pairs, patching
from lab.catalogue.external import ExternalModels, parse_source
from lab.catalogue.models import BUILTIN_MODELS, BUILTINS, ModelEntry, encode_prompt
from lab.checks import UserError
from lab.session import Session
from model.families import open_folder
from tests.support.nanogpt_runs import CHARS, reference, save_run

GRAMMAR_PAIR = ("anna found the key . she", "tom found the key . he")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> entry: a nanoGPT character run (as --model offers it), a GPT-2 of GPT-2's vocabulary (50,257
    byte-level BPE pieces) and a GPT-2 of a 300-piece BPE, saved by transformers."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.support import families, gpt2_small

    root = tmp_path_factory.mktemp("pairs")
    s = Session()
    s.external = ExternalModels([parse_source(str(save_run(root / "run", reference(len(CHARS), block=64))))],
                                root / "hashes.json")
    out = {"nanogpt": s.entry_for(s.external.names[0])}
    for name, vocab, write in (("gpt2-vocab", gpt2_small.VOCAB, gpt2_small.write_tokenizer),
                               ("bpe-300", 300, lambda f: families.write_tokenizer(f, 300))):
        folder = root / name
        write(folder)
        torch.manual_seed(0)
        ref = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=64, vocab_size=vocab,
                                         bos_token_id=0, eos_token_id=0))
        families.sharpen(ref, conv1d=True)  # answers that A and B move apart, as a trained model's
        ref.save_pretrained(folder)
        model, tok = open_folder(folder)
        out[name] = ModelEntry(name, model, tok, {})
    return out


def check_pair(entry: ModelEntry, p: pairs.Pair) -> None:
    ids_a, notes_a = encode_prompt(p.a, entry)
    ids_b, notes_b = encode_prompt(p.b, entry)
    assert len(ids_a) == len(ids_b) == p.tokens and not notes_a and not notes_b
    a, b = (patching.answer_token(entry, x, "first") for x in (p.answer_a, p.answer_b))
    assert a != b and (entry.pieces[a], entry.pieces[b]) == (p.answer_a, p.answer_b)
    assert pairs.template_pair(p.a, p.b) and pairs.answers_of(entry, p.a, p.b) == (p.answer_a, p.answer_b)


@pytest.mark.parametrize("name", ["nanogpt", "gpt2-vocab", "bpe-300"])
def test_every_pair_made_for_a_model_fits_it_and_a_sweep_runs_on_it(models, name):
    entry = models[name]
    made = pairs.pairs_for(entry)
    assert made, name
    for p in made:
        check_pair(entry, p)
    first = made[0]
    setup = patching.prepare_sweep(entry, first.a, first.b, "logit_diff", first.answer_a, first.answer_b)
    result = patching.sweep(setup, "heads", "denoising")
    assert result.values.shape == (2 if name != "nanogpt" else 2, 2 if name != "nanogpt" else 4)
    if name == "gpt2-vocab":  # GPT-2's pieces of names: the indirect-object pair, answers with their space
        assert (first.answer_a, first.answer_b) == ("␣Mary", "␣John") and "gave a drink to" in first.a
    if name == "nanogpt":  # characters: only the pairs whose answers are one character
        assert all(len(p.answer_a) == len(p.answer_b) == 1 for p in made)
        assert not any(p.a.startswith(("5", "hc")) for p in made)  # the task pairs are for task models only


@pytest.mark.parametrize("name", BUILTIN_MODELS)
def test_the_builtins_get_pairs_of_their_own_vocabulary(name):
    entry = BUILTINS.get(name)
    made = pairs.pairs_for(entry)
    for p in made:
        check_pair(entry, p)
    if name.startswith(("sort", "copy")):  # a task model: its task's pair
        assert len(made) == 1 and made[0].about.startswith(("sorting", "copying the sequence"))
    if name.startswith("grammar"):
        assert (made[0].answer_a, made[0].answer_b) == ("she", "he")


def test_the_count_says_which_words_keep_the_count(models):
    entry = models["gpt2-vocab"]
    template = "When Mary and John went to the store, ___ gave a drink to"
    counts = pairs.count_tokens(entry, template, "John, Mary, Tom, Elizabeth, John")
    assert [c.word for c in counts] == ["John", "Mary", "Tom", "Elizabeth"]  # each word once
    for c in counts:
        assert c.tokens == len(encode_prompt(template.replace("___", c.word), entry)[0])
    assert counts[0].tokens == counts[1].tokens == counts[2].tokens < counts[3].tokens
    assert counts[0].pieces == ("␣John",) and len(counts[3].pieces) > 1
    report = pairs.count_report(counts)
    first, second = report.splitlines()
    assert first.startswith(f"- **{counts[0].tokens} tokens** (any two make a pair): John (␣John), Mary")
    assert "Elizabeth" in second and "no other word has this count" in second
    # a character model: what it cannot read is said, not counted
    lost = pairs.count_tokens(models["nanogpt"], "the {} sat", "cat, CAT, café")
    assert [c.tokens for c in lost] == [11, None, None]
    assert pairs.count_report(lost).endswith("not in this model's vocabulary: CAT, café")
    assert "\\*" in pairs.count_report(pairs.count_tokens(entry, "a ___ b", "*x*"))  # shown as typed


@pytest.mark.parametrize("template, words, said", [
    ("no slot here", "a, b", "Mark the one place"), ("two ___ and ___", "a", "Mark the one place"),
    ("a ___", " , ,", "List the words"), ("a ___", ",".join(["w"] * 41 + ["v"]), "at most 40 words"),
    ("a ___", "x" * 41, "at most 40 words"), ("x" * 301 + "___", "a", "304 characters"),
    (5, "a", "Type a template"), ("a ___", None, "Type a template")])
def test_the_count_refuses_in_a_sentence(models, template, words, said):
    with pytest.raises(UserError, match=said):
        pairs.count_tokens(models["bpe-300"], template, words)


def test_prompts_of_different_lengths_are_refused_with_a_pair_of_the_models_own(models):
    entry = models["nanogpt"]
    with pytest.raises(UserError) as info:
        patching.prepare_sweep(entry, "the cat sat", "the cats sat", "logit_diff", "a", "o")
    said = str(info.value)
    made = pairs.pairs_for(entry)[0]
    assert f"“{made.a}” ⇄ “{made.b}”" in said and GRAMMAR_PAIR[0] not in said and len(said) < 400
    with pytest.raises(UserError) as info:  # the grammar model is offered its own
        patching.prepare_sweep(BUILTINS.get("grammar (built-in)"), "anna found the key . she", "tom found the key",
                               " she", " he")
    assert "“anna found the key .” ⇄ “tom found the key .”" in str(info.value)
