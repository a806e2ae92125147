"""Links reopen the Circuits tab (lab.links): `tab`, `answer`, `other`, `kind`, `circuit_layer` and
`circuit_head` are read as the tab's own boxes read them, a value that does not fit is left out with a notice,
and the link the app writes carries what the person's Circuits tab shows, so that reading it back gives it."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from lab import links
from lab.checks import UserError
from lab.session import Session, View
from model.generate import Sampling

GRAMMAR, COPY = "grammar (built-in)", "copy / induction (built-in)"
P = "anna found the key . she gave it to tom because he"
GREEDY = Sampling(temperature=0.0, seed=0)


def with_text(steps: int = 1) -> Session:
    s = Session()
    for _ in range(steps):
        s.step(GRAMMAR, P, GREEDY)
    return s


def test_a_link_s_circuits_parameters_are_read():
    link = links.read_link(Session(), {"model": GRAMMAR, "prompt": P, "steps": "1", "tab": "circuits",
                                       "answer": " tom", "other": " anna", "kind": "v", "circuit_layer": "1",
                                       "circuit_head": "2"})
    assert link.notes == [] and link.given
    assert link.circuits == links.CircuitsView("circuits", (" tom", " anna"), "v", (1, 2))
    # every tab of the page can be opened; a link of the tab alone draws DLA (the model's prediction) on Circuits
    for tab in links.TABS:
        view = links.read_link(Session(), {"tab": tab}).circuits
        assert view.tab == tab and view.dla == (("", "") if tab == "circuits" else None)
    assert links.read_link(Session(), {"answer": ""}).circuits.dla == ("", "")  # blank: the prediction
    assert links.read_link(Session(), {"model": GRAMMAR, "prompt": P}).circuits is None  # a link of Explore alone


@pytest.mark.parametrize("params, fragment, kept", [
    ({"tab": "graphs"}, "tab='graphs' (tab must be one of explore", {"tab": None}),
    ({"tab": "circuits", "answer": "zebra crossing"}, "answer='zebra crossing' (not one token of this model)",
     {"dla": ("", "")}),
    ({"answer": "x" * 500}, "answer='xxx", {"dla": None}),
    ({"answer": " tom", "other": "qqq zzz"}, "other='qqq zzz' (not one token", {"dla": (" tom", "")}),
    ({"other": " anna"}, "other=' anna' (give the answer token too)", {"dla": None}),
    ({"tab": "circuits", "other": " anna"}, "other=' anna' (the second answer token needs a first)",
     {"dla": ("", "")}),
    ({"answer": " tom", "other": "tom"}, "other='tom' (the two answer tokens are the same token)",
     {"dla": (" tom", "")}),
    ({"kind": "z"}, "kind='z' (kind must be one of q, k, v", {"kind": None}),
    ({"circuit_layer": "9", "circuit_head": "0"}, "circuit_layer='9' (circuit layer must be a whole number "
     "between 0 and 2", {"head": None}),
    ({"circuit_layer": "1", "circuit_head": "x"}, "circuit_head='x'", {"head": None}),
    ({"circuit_layer": "1"}, "circuit_layer='1' (it opens a head with circuit_head)", {"head": None}),
    ({"circuit_head": "3"}, "circuit_head='3' (it opens a head with circuit_layer)", {"head": None}),
])
def test_circuits_parameters_that_do_not_fit_are_left_out_with_a_notice(params, fragment, kept):
    link = links.read_link(Session(), {"model": GRAMMAR, **params})
    assert any(fragment in n for n in link.notes), link.notes
    for key, value in kept.items():
        assert getattr(link.circuits, key) == value, key
    assert all(len(n) < 200 for n in link.notes)
    assert link.model == GRAMMAR  # the rest of the link is read as before


def test_a_link_of_one_model_checks_heads_and_tokens_against_that_model():
    # the copy model is character-level: " tom" is several of its tokens, "a" one
    link = links.read_link(Session(), {"model": COPY, "answer": "a", "other": " tom", "circuit_layer": "0",
                                       "circuit_head": "1"})
    assert link.circuits.dla == ("a", "") and link.circuits.head == (0, 1)
    assert any("other=' tom' (not one token" in n for n in link.notes)


def test_the_app_s_link_carries_what_the_circuits_tab_shows_and_reads_back_the_same():
    s = with_text(3)
    query, _ = links.link_query(s, GRAMMAR, P, GREEDY, View(1, 0, "weights"))
    assert not set(dict(parse_qsl(query))) & set(links.CIRCUIT_PARAMS)  # the tab unused: the link of before
    s.circuits.dla(None, " tom", " anna")
    s.circuits.circuits(1, 2)
    s.circuits.composition(GRAMMAR)
    links.note_kind(s, "q")
    links.note_tab(s, "circuits")
    links.note_tab(s, "explore")  # "Link to this view" is on Explore: the tab before it counts
    query, _ = links.link_query(s, GRAMMAR, P, GREEDY, View(1, 0, "weights"))
    params = dict(parse_qsl(query, keep_blank_values=True))
    assert {k: params[k] for k in links.CIRCUIT_PARAMS} == {
        "tab": "circuits", "answer": "tom", "other": "anna", "kind": "q", "circuit_layer": "1", "circuit_head": "2"}
    back = links.read_link(Session(), params)
    assert back.notes == []
    assert back.circuits == links.CircuitsView("circuits", ("tom", "anna"), "q", (1, 2))
    # the model's own prediction (no answer typed) travels as a blank answer
    s.circuits.dla(None, None, None)
    params = dict(parse_qsl(links.link_query(s, GRAMMAR, P, GREEDY, View(1, 0, "weights"))[0],
                            keep_blank_values=True))
    assert params["answer"] == "" and "other" not in params
    assert links.read_link(Session(), params).circuits.dla == ("", "")


def test_only_the_circuits_tab_is_written_and_only_once_used():
    s = with_text()
    links.note_tab(s, "circuits")
    query, _ = links.link_query(s, GRAMMAR, P, GREEDY, View(1, 0, "weights"))
    assert "tab=" not in query  # opened but nothing drawn there: nothing to reopen
    s.circuits.circuits(0, 1)
    links.note_tab(s, "learn")  # the last tab besides Explore was another one
    params = dict(parse_qsl(links.link_query(s, GRAMMAR, P, GREEDY, View(1, 0, "weights"))[0]))
    assert "tab" not in params and (params["circuit_layer"], params["circuit_head"]) == ("0", "1")
    # after Reset, a link of another model: the records of this one are not its
    s.reset()
    assert s.circuits.last["circuits"].model == GRAMMAR
    params = dict(parse_qsl(links.link_query(s, COPY, "ab|", GREEDY, View(0, 0, "weights"))[0]))
    assert not set(params) & set(links.CIRCUIT_PARAMS)


def test_the_page_s_bookkeeping_keeps_only_values_that_fit():
    s = Session()
    with pytest.raises(UserError, match="tab must be one of"):
        links.note_tab(s, "<script>")
    with pytest.raises(UserError, match="kind must be one of"):
        links.note_kind(s, ["k"])
    form = dict(prompt_a=P, prompt_b=P, metric="logit_diff", answer=" her", other=" him", what="heads",
                direction="denoising", k=5.0)
    links.note_atp(s, form)
    assert links.circuits_form(s).atp == {**form, "k": 5}
    for bad in ({**form, "k": 0}, {**form, "metric": "loss"}, {**form, "prompt_a": "x" * 2001},
                {**form, "answer": "a\udfffb"}, {**form, "what": None}):
        with pytest.raises(UserError):
            links.note_atp(s, bad)
    assert links.circuits_form(s).atp == {**form, "k": 5}  # what fitted stays
    assert links.circuits_form(s).kind == "k" and links.circuits_form(s).last_tab is None
