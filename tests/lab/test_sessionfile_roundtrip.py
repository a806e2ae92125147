"""Every session file the app writes opens again to the same state (property test).

Random sequences of what a person does on the Explore page (Step, Generate, Undo, Reset, another
model or prompt, sampling settings, the view, a token selected, heads ablated, a row edited, Clear,
colour / large fonts / head tool) are played through the page's own handlers on the two smallest
built-ins; then "Save session" writes the file and "Open session" opens it in a fresh session. The
opened session must have the same tokens, the same figures (their payloads, byte for byte) and the
same settings. A call the page refuses is part of the sequence too: it must change nothing.
"""

from __future__ import annotations

import gradio as gr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab import probing
from lab.limits import ATTENTION_VIEWS, COLOUR_MODES
from lab.session import HEAD_TOOLS, Session
from tests.support.sessions import assert_same_text
from ui import explore, heads, share

SORT, COPY = "sort digits (built-in)", "copy / induction (built-in)"
PROMPTS = {SORT: ["503124=", "98765=", "1=", "  "], COPY: ["hcbpadlk|", "ab|", "abcdefghijklmnop|"]}
LABELS = [probing.head_label(layer, h) for layer in range(2) for h in range(4)]  # both models: 2 layers × 4 heads

sampling = st.tuples(st.sampled_from([0.0, 0.7, 1.5]), st.sampled_from([0, 3]), st.sampled_from([1.0, 0.8]),
                     st.integers(0, 2))
actions = st.one_of(
    st.tuples(st.just("step")), st.tuples(st.just("step")),  # the most common action, twice as likely
    st.tuples(st.just("generate"), st.integers(1, 12)),
    st.tuples(st.just("undo")), st.tuples(st.just("reset")),
    st.tuples(st.just("model"), st.sampled_from([SORT, COPY])),
    st.tuples(st.just("prompt"), st.integers(0, 3)),
    st.tuples(st.just("sampling"), sampling),
    st.tuples(st.just("view"), st.integers(0, 1), st.sampled_from(["all", 0, 1, 2, 3]), st.sampled_from(ATTENTION_VIEWS)),
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
            elif kind == "model":
                self.model = args[0]
                explore.select_model(s, self.model)
                fv = s.entry_for(self.model).first_view
                self.layer, self.head, self.view, self.prompt = fv.layer, fv.head, fv.view, PROMPTS[self.model][0]
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
            s.status(), probing.edit_state(s.text, s.probe), probing.ablated(s.text, s.probe)]


views = st.tuples(st.integers(0, 1), st.sampled_from(["all", "all", 0, 1, 2, 3]), st.sampled_from(ATTENTION_VIEWS))


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(actions, min_size=3, max_size=16), views)
def test_every_saved_session_reopens_to_the_same_state(steps, view):
    """`view`: what the page shows when the file is saved (all heads of a layer is how own models open)."""
    s = Session()
    page = Page(s)
    for action in [*steps, ("view", *view)]:
        page.do(action)
    path, _ = share.save_session(s, *page.form(), *page.shown())  # the app writes every state it can reach
    t = Session()
    out = share.open_session(t, path)  # and opens every file it writes
    model, prompt = (s.model_name, s.prompt) if s.decoder is not None else (page.model, page.prompt)
    assert out[1]["value"] == model and out[2] == prompt
    assert (out[9]["value"], out[10]["value"], out[11]) == page.shown()
    assert tuple(out[14:18]) == page.sampling
    assert (t.display.colour, t.display.presentation, t.display.tool) == \
        (s.display.colour, s.display.presentation, s.display.tool)
    if s.decoder is None:
        assert t.tokens() == [] and out[5] == []
    else:
        assert_same_text(s, t)
        assert t.query == s.query and t.log == s.log
    assert t.probe == s.probe
    assert figures(t, *page.shown()) == figures(s, *page.shown())
    # both go on alike from the page the file set up: the opened text's sampler stands where the saved one stood
    page.prompt = out[2]
    page.do(("step",))
    page.s = t
    page.do(("step",))
    assert t.tokens() == s.tokens()
