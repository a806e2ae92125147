"""Every session file the app writes opens again to the same state (property test).

Random sequences of what a person does on the Explore page (Step, Generate, Undo, Reset, another
model or prompt, sampling settings, the view, a token selected, heads ablated, a row edited, Clear,
colour / large fonts / head tool) are played through the page's own handlers on the two smallest
built-ins and on a model of 12 heads added as `--model` adds one (its layers are shown a page of six
heads at a time: H0–5, H6–11); then "Save session" writes the file and "Open session" opens it in a
fresh session. The opened session must have the same tokens, the same figures (their payloads, byte
for byte) and the same settings, the page of heads included. A call the page refuses is part of the
sequence too: it must change nothing.
"""

from __future__ import annotations

import gradio as gr
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lab.headsettings import head_label
from lab.limits import ATTENTION_VIEWS, COLOUR_MODES
from lab.session import HEAD_TOOLS, Session
from tests.support.sessions import TWELVE, assert_same_text, offered, twelve_heads
from ui import explore, heads, share

SORT, COPY = "sort digits (built-in)", "copy / induction (built-in)"
PROMPTS = {SORT: ["503124=", "98765=", "1=", "  "], COPY: ["hcbpadlk|", "ab|", "abcdefghijklmnop|"]}
PROMPTS[TWELVE] = PROMPTS[SORT]  # it reads the sort model's characters
LABELS = [head_label(layer, h) for layer in range(2) for h in (0, 1, 2, 3, 7, 11)]  # every model: 2 layers
HEADS = ["all", "6-11", 0, 1, 2, 3, 7, 11]  # what the Head menu sends; a page or a head past 3 exists on TWELVE only

sampling = st.tuples(st.sampled_from([0.0, 0.7, 1.5]), st.sampled_from([0, 3]), st.sampled_from([1.0, 0.8]),
                     st.integers(0, 2))
actions = st.one_of(
    st.tuples(st.just("step")), st.tuples(st.just("step")),  # the most common action, twice as likely
    st.tuples(st.just("generate"), st.integers(1, 12)),
    st.tuples(st.just("undo")), st.tuples(st.just("reset")),
    st.tuples(st.just("model"), st.sampled_from([SORT, COPY, TWELVE])),
    st.tuples(st.just("prompt"), st.integers(0, 3)),
    st.tuples(st.just("sampling"), sampling),
    st.tuples(st.just("view"), st.integers(0, 1), st.sampled_from(HEADS), st.sampled_from(ATTENTION_VIEWS)),
    st.tuples(st.just("select"), st.integers(0, 20)),
    st.tuples(st.just("ablate"), st.lists(st.sampled_from(LABELS), max_size=3, unique=True),
              st.sampled_from(["zero", "mean", "uniform"]), st.booleans()),
    st.tuples(st.just("edit"), st.sampled_from(LABELS), st.sampled_from(["off", "uniform", "0", "2", "5", "9"])),
    st.tuples(st.just("clear")),
    st.tuples(st.just("display"), st.sampled_from(COLOUR_MODES), st.booleans(), st.sampled_from(HEAD_TOOLS)),
)


class Page:
    """The form's controls as the page holds them, and the calls its buttons make."""

    def __init__(self, session: Session):
        self.s = session
        self.model, self.prompt = SORT, PROMPTS[SORT][0]
        self.sampling = (0.8, 0, 1.0, 0)
        self.layer, self.head, self.view = 0, 2, "weights"

    def form(self):
        return (self.model, self.prompt, *self.sampling)

    def shown(self):
        return (self.layer, self.head, self.view)

    def do(self, action) -> None:
        """One action; a refusal (gr.Error) is what the page would show, and must change nothing."""
        kind, *args = action
        s = self.s
        try:
            if kind == "step":
                explore.step(s, *self.form(), *self.shown())
            elif kind == "generate":
                list(explore.generate(s, *self.form(), args[0], *self.shown()))
            elif kind == "undo":
                explore.undo(s, *self.shown())
            elif kind == "reset":
                explore.reset(s, self.model)
            elif kind == "model":  # the page shows the view the model opens on
                self.model, self.prompt = args[0], PROMPTS[args[0]][0]
                out = explore.select_model(s, self.model)
                self.layer, self.head, self.view = (out[i]["value"] for i in (5, 6, 7))
            elif kind == "prompt":
                self.prompt = PROMPTS[self.model][args[0] % len(PROMPTS[self.model])]
            elif kind == "sampling":
                self.sampling = args[0]
            elif kind == "view":
                self.layer, self.head, self.view = args
            elif kind == "select":
                heads.refresh(s, self.layer, self.head, args[0])
            elif kind == "ablate":
                heads.ablate(s, *args, self.layer, self.head)
            elif kind == "edit":
                heads.edit_attention(s, *args)
            elif kind == "clear":
                heads.clear_settings(s, self.layer, self.head)
            elif kind == "display":
                explore.set_display(s, args[0], args[1], None, *self.shown())
                heads.show_tool(s, args[2], self.layer, self.head)
        except gr.Error as exc:
            assert exc.message and "Something went wrong" not in exc.message, (action, exc.message)


def figures(s: Session, layer, head, view) -> list:
    """Every figure the page draws for this session (the JSON gradio sends), or the sentence it shows
    instead."""
    def payload(draw):
        try:
            out = draw()
        except (gr.Error, ValueError) as exc:
            return ("refused", str(exc))
        return getattr(out, "plot", out)

    return [payload(lambda: explore.attention_figure(s, layer, head, view)),
            payload(lambda: explore.probs_figure(s, s.query)),
            payload(lambda: heads.effect_views(s)[:2]),
            payload(lambda: heads.roles_figure(s, layer, head if head != "all" else None)),
            payload(lambda: heads.show_lens(s)),
            s.status(), s.heads.edit_state(), s.heads.ablated()]


@pytest.fixture(scope="module")
def added(tmp_path_factory):
    """The 12-head model, added as `--model` adds a file."""
    return twelve_heads(tmp_path_factory.mktemp("twelve_heads"))


# what the page shows when the file is saved: a layer, the i-th value of its model's Head menu (the first
# is "all": all heads, or the first page of six; on TWELVE the second is the page "6-11"), a view
views = st.tuples(st.integers(0, 1), st.sampled_from([0, 0, 1, 1, 2, 5, 8, 12]), st.sampled_from(ATTENTION_VIEWS))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=st.lists(actions, min_size=3, max_size=16), view=views)
@example(steps=[("model", TWELVE), ("step",), ("view", 1, "6-11", "weights"), ("step",)], view=(1, 1, "scores"))
@example(steps=[("model", TWELVE), ("step",), ("reset",)], view=(0, 1, "weights"))  # heads 6–11, no text
def test_every_saved_session_reopens_to_the_same_state(added, steps, view):
    s = offered(added)
    page = Page(s)
    for action in steps:
        page.do(action)
    model = s.model_name if s.decoder is not None else page.model
    menu = [value for _, value in explore.head_choices(s.entry_for(model).model.cfg.n_heads)]
    page.do(("view", view[0], menu[view[1] % len(menu)], view[2]))
    path, _ = share.save_session(s, *page.form(), *page.shown())  # the app writes every state it can reach
    t = offered(added)
    out = share.open_session(t, path)  # and opens every file it writes
    model, prompt = (s.model_name, s.prompt) if s.decoder is not None else (page.model, page.prompt)
    assert out[1]["value"] == model and out[2] == prompt
    assert (out[9]["value"], out[10]["value"], out[11]) == page.shown()  # a page of heads too ("6-11")
    assert tuple(out[14:18]) == page.sampling
    assert (t.display.colour, t.display.presentation, t.display.tool) == \
        (s.display.colour, s.display.presentation, s.display.tool)
    if s.decoder is None:
        assert t.tokens() == [] and out[5] == []
    else:
        assert_same_text(s, t)
        assert t.query == s.query and t.log == s.log
    assert t.heads.settings == s.heads.settings
    assert figures(t, *page.shown()) == figures(s, *page.shown())
    # both go on alike from the page the file set up: the opened text's sampler stands where the saved one stood
    page.prompt = out[2]
    page.do(("step",))
    page.s = t
    page.do(("step",))
    assert t.tokens() == s.tokens()
