"""Compare A / B on a model of one's own (a nanoGPT character run given with --model): a switch puts a pair
made for its tokenizer in the prompt boxes and the menu, and its answers in the patching boxes (never the
grammar model's pair, which it cannot read); back on the grammar model its own come back; the helper counts
a template's words in the model's tokens; all of it wired in the built page."""

from __future__ import annotations

import gradio as gr
import pytest

import app
from lab import pairs
from lab.catalogue.external import ExternalModels, parse_source
from lab.session import Session
from tests.support.nanogpt_runs import CHARS, reference, save_run
from ui import patching as ui_patching
from ui.heads import PAIRS, model_changed, pick_pair
from ui.pairs import count_pair_words

GRAMMAR = "grammar (built-in)"


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    s = Session()
    s.external = ExternalModels([parse_source(str(save_run(root / "run", reference(len(CHARS), block=64))))],
                                root / "hashes.json")
    return s


def test_a_switch_to_an_own_model_brings_its_own_pair_and_answers(session):
    own = session.external.names[0]
    made = pairs.pairs_for(session.entry_for(own))
    menu, a, b, *_ = model_changed(session, own)
    assert (a, b) == (made[0].a, made[0].b) and a not in [x for pair in PAIRS[GRAMMAR] for x in pair]
    assert [v for _, v in menu["choices"]] == [f"{p.a}\u241e{p.b}" for p in made] and menu["value"] is None
    answer, other, *_ = ui_patching.model_switched(session, own)
    assert (answer, other) == (made[0].answer_a, made[0].answer_b) == ("a", "o")
    # the second pair of the menu: both prompts, and its answers
    value = menu["choices"][1][1]
    assert pick_pair(value) == (made[1].a, made[1].b)
    assert ui_patching.pair_answers(session, own, value) == (made[1].answer_a, made[1].answer_b)
    # the sweep the boxes now hold runs
    *_, (_, note, _, _, data) = list(ui_patching.run_patching(session, own, a, b, "logit_diff", answer, other,
                                                              "heads", "denoising"))
    assert "".join(data["tokens_a"]).replace("␣", " ") == a and "restores" in note
    # back to the grammar model: its own pair and answers
    _, a, b, *_ = model_changed(session, GRAMMAR)
    assert (a, b) == PAIRS[GRAMMAR][0] and ui_patching.model_switched(session, GRAMMAR)[:2] == ("her", "him")
    # the other built-ins keep their own pairs
    _, a, b, *_ = model_changed(session, "article toy (built-in)")
    assert (a, b) == PAIRS["article toy (built-in)"][0]


def test_an_own_model_no_template_fits_gets_empty_boxes(tmp_path):
    """The article toy's seven words, uploaded as one's own model: no template reads in them, so the boxes are
    emptied (the last model's pair would be refused) and the menu is empty."""
    from lab.catalogue.models import BUILTINS
    from model.checkpoint import save_checkpoint

    toy = BUILTINS.get("article toy (built-in)")
    s = Session()
    name = s.upload(str(save_checkpoint(tmp_path / "toy.safetensors", toy.model, toy.tokenizer, toy.meta)))
    menu, a, b, *_ = model_changed(s, name)
    assert (a, b) == ("", "") and menu["choices"] == [] and ui_patching.model_switched(s, name)[:2] == ("", "")


def test_only_pairs_the_menu_can_offer_are_taken():
    assert pick_pair("the cat sat. the c\u241ethe cot sat. the c") == ("the cat sat. the c", "the cot sat. the c")
    for bad in ("the cat sat. the c\u241ethe cat sat. the c", "the cat sat. the c\u241ejunk", "a\u241eb\u241ec"):
        with pytest.raises(gr.Error, match="choose one of the pairs"):
            pick_pair(bad)


def test_the_helper_counts_a_templates_words_for_the_model_shown(session):
    own = session.external.names[0]
    said = count_pair_words(session, own, "the ___ sat", "cat, dog, mouse, CAT")
    assert said.startswith(f"**{own}**")
    assert "**11 tokens** (any two make a pair): cat (␣ · c · a · t), dog" in said
    assert "**13 tokens** (no other word has this count): mouse" in said and "vocabulary: CAT" in said
    for args, msg in ((("no slot", "a"), "Mark the one place"), (("the ___", ""), "List the words")):
        with pytest.raises(gr.Error, match=msg):
            count_pair_words(session, own, *args)
    with pytest.raises(gr.Error, match="Unknown model"):
        count_pair_words(session, "nobody's model", "the ___", "a")


def test_the_switch_and_the_helper_are_wired_in_the_page():
    demo = app.build_demo()
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    [changed] = [f for f in demo.fns.values() if f.name == "model_changed"]
    outs = [o.elem_id for o in changed.outputs]
    assert outs[:4] == ["pair", "prompt_a", "prompt_b", "cmp_layer"]
    helper = [f for f in demo.fns.values() if f.name == "count_pair_words"]
    assert len(helper) == 3 and all(f.api_visibility == "private" for f in helper)
    assert [i.elem_id for i in helper[0].inputs[1:]] == ["model", "pair_template", "pair_words"]
    assert by_id["pair_counts"] in helper[0].outputs
    [answers] = [f for f in demo.fns.values() if f.name == "pair_answers"]
    assert [i.elem_id for i in answers.inputs[1:]] == ["model", "pair"]
