"""Links (lab.links): the parameters a link carries open that state; anything unknown or out of range
is left out with a notice; the link the app writes opens the same text when Steps made it."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from lab import links
from lab.session import Session, View
from model.generate import Sampling
from tests.support.sessions import TWELVE, offered, twelve_heads

GRAMMAR, COPY = "grammar (built-in)", "copy / induction (built-in)"
P = "anna found the key . she gave it to tom because he"


def test_a_link_opens_its_state():
    s = Session()
    link = links.read_link(s, {"model": COPY, "prompt": "hcbpadlk|", "steps": "5", "temperature": "0",
                               "seed": "7", "layer": "1", "head": "2", "view": "scores"})
    assert link.notes == [] and link.given
    assert (link.model, link.prompt, link.steps) == (COPY, "hcbpadlk|", 5)
    assert link.view == View(1, 2, "scores") and link.sampling == Sampling(temperature=0.0, seed=7)
    links.open_link(s, link)
    assert "".join(p for p, _ in s.tokens()) == "hcbpadlk|hcbpa"


@pytest.mark.parametrize("params, kept, fragment", [
    ({"model": "gpt-5"}, {"model": GRAMMAR}, "model='gpt-5'"),
    ({"steps": "9999"}, {"steps": 0}, "steps='9999'"),
    ({"steps": "-1"}, {"steps": 0}, "steps='-1'"),
    ({"seed": "abc"}, {}, "seed='abc' (seed must be a whole number"),
    ({"temperature": "warm"}, {}, "temperature='warm' (not a number)"),
    ({"temperature": "nan"}, {}, "temperature"),
    ({"layer": "9"}, {}, "layer='9'"),
    ({"head": "99"}, {}, "head='99'"),
    ({"view": "3d"}, {}, "view='3d'"),
    ({"prompt": "x" * 5000}, {"prompt": None}, "prompt="),
    ({"colour": "red"}, {}, "unknown link parameter 'colour'"),
    ({"<script>": "1"}, {}, "unknown link parameter '<script>'"),
])
def test_bad_parameters_are_left_out_with_a_notice(params, kept, fragment):
    link = links.read_link(Session(), params)
    assert any(fragment in n for n in link.notes), link.notes
    for key, value in kept.items():
        assert getattr(link, key) == value
    assert all(len(n) < 200 for n in link.notes)


def test_gradios_own_parameters_are_not_called_unknown():
    """`?__theme=dark` is how Gradio opens a page dark: a link with it is not a link with a mistake in it."""
    link = links.read_link(Session(), {"__theme": "dark", "prompt": P, "colour": "red"})
    assert link.prompt == P and link.given
    assert [n for n in link.notes if "__theme" in n] == [] and any("'colour'" in n for n in link.notes)
    assert links.read_link(Session(), {"__theme": "dark"}).notes == []


def test_an_unknown_prompt_word_stops_with_a_note():
    s = Session()
    link = links.open_link(s, links.read_link(s, {"prompt": "zebra crossing", "steps": "3"}))
    assert any("does not know" in n for n in link.notes) and s.tokens() == []


def test_the_link_of_a_stepped_text_makes_the_same_text():
    s = Session()
    hot = Sampling(temperature=1.1, seed=4)
    for _ in range(6):
        s.step(GRAMMAR, P, hot)
    query, note = links.link_query(s, GRAMMAR, P, hot, View(2, 3, "weights"))
    assert note == ""
    params = dict(parse_qsl(query))
    assert params["steps"] == "6" and params["head"] == "3" and params["temperature"] == "1.1"
    t = Session()
    links.open_link(t, links.read_link(t, params))
    assert t.tokens() == s.tokens()


def test_the_link_says_what_it_cannot_carry():
    s = Session()
    s.step(GRAMMAR, P, Sampling(temperature=1.0, seed=4))
    s.step(GRAMMAR, P, Sampling(temperature=0.5, seed=4))
    _, note = links.link_query(s, GRAMMAR, P, Sampling(), View(0, None, "weights"))
    assert "Save session" in note
    query, _ = links.link_query(Session(), GRAMMAR, P, Sampling(), View(0, None, "weights"))
    assert dict(parse_qsl(query))["head"] == "all" and dict(parse_qsl(query))["steps"] == "0"


@pytest.fixture(scope="module")
def added(tmp_path_factory):
    """A model of 12 heads, added as `--model` adds a file: its layers show six heads at a time."""
    return twelve_heads(tmp_path_factory.mktemp("twelve_heads"))


def test_a_link_keeps_the_page_of_heads_it_was_made_on(added):
    """The link of a view of heads 6–11 says head=6-11 and opens on heads 6–11, with the same text."""
    s = offered(added)
    for _ in range(3):
        s.step(TWELVE, "503124=", Sampling(temperature=1.0, seed=2))
    view = s.check_view(None, 1, "6-11", "weights")
    assert view == View(1, None, "weights", tuple(range(6, 12)))
    params = dict(parse_qsl(links.link_query(s, TWELVE, "503124=", Sampling(), view)[0]))
    assert params["head"] == "6-11" and params["layer"] == "1"
    t = offered(added)
    link = links.open_link(t, links.read_link(t, params))
    assert link.notes == [] and link.view == view and t.tokens() == s.tokens()
    # links made before pages (head=all, or a layer without a head) open on the first page, as before
    first, older = View(1, None, "weights", tuple(range(6))), {k: v for k, v in params.items() if k != "head"}
    assert links.read_link(offered(added), older).view == first
    assert links.read_link(offered(added), older | {"head": "all"}).view == first
    assert links.read_link(offered(added), older | {"head": "11"}).view == View(1, 11, "weights")


@pytest.mark.parametrize("model, head", [(GRAMMAR, "6-11"), (TWELVE, "6-12"), (TWELVE, "5-10"), (TWELVE, "12")])
def test_a_page_the_model_has_not_is_left_out_with_a_notice(added, model, head):
    link = links.read_link(offered(added), {"model": model, "layer": "0", "head": head})
    assert any(f"head='{head}'" in n for n in link.notes), link.notes
    assert link.view.head is None and link.view.layer == 0  # the layer's first heads instead
