"""The Explore tab's handlers: Step, Generate, Undo, Reset, the model and the attention view.

Each checks its inputs, calls one verb of the person's `lab.session.Session`, draws with one
`viz` function and returns what the page shows.
"""

from __future__ import annotations

import time

import gradio as gr

import viz
from lab.checks import check_sampling
from lab.limits import OVERVIEW_MAX_TOKENS
from lab.session import Session

from .common import gpu, handler, message_plot


def attention_figure(session: Session, layer, head, view):
    """The attention picture of the session's current text, for a gr.Plot."""
    att = session.attention()
    if att is None:
        return message_plot("Press Step or Generate to see attention.")
    v = session.check_view(None, layer, head, view)
    return viz.to_gradio_plot(viz.attention_view(att.weights, att.scores, att.tokens, layer=v.layer, head=v.head,
                                                 view=v.view, causal=att.causal,
                                                 overview_max_tokens=OVERVIEW_MAX_TOKENS))


def probs_figure(session: Session):
    p = session.probabilities()
    if p is None:
        return message_plot("Next-token probabilities appear after the first step.")
    return viz.to_gradio_plot(viz.probabilities(p.pieces, p.probs, adjusted=p.adjusted, chosen=p.chosen, top=10))


def explore_outputs(session: Session, layer, head, view):
    return (session, session.tokens(), session.status(), probs_figure(session),
            attention_figure(session, layer, head, view))


# ------------------------------------------------------------------------------ handlers


def _step(session: Session, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view) -> None:
    sampling = check_sampling(temperature, top_k, top_p, seed)
    session.check_view(model_name, layer, head, view)
    session.step(model_name, prompt, sampling)


@handler
def step(session, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view,
         request: gr.Request = None):
    """One new token: sample from the model's distribution, then show what it attended to."""
    _step(session, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view)
    return explore_outputs(session, layer, head, view)


@handler
def step_picture(session, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view,
                 request: gr.Request = None):
    """`step` without the probability chart, which the page fetches right after the picture."""
    _step(session, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view)
    return session, session.tokens(), session.status(), attention_figure(session, layer, head, view)


@gpu
@handler(rate="generate")
def generate(session, model_name, prompt, temperature, top_k, top_p, seed, max_new, layer, head, view,
             request: gr.Request = None):
    """Generate up to `max_new` tokens from the prompt (restarting it), streaming the text."""
    sampling = check_sampling(temperature, top_k, top_p, seed)
    session.check_view(model_name, layer, head, view)
    last_yield = 0.0
    for s in session.generate(model_name, prompt, sampling, max_new):
        if time.perf_counter() - last_yield > 0.3 and not s.eos:  # the text streams; the figures come at the end
            last_yield = time.perf_counter()
            yield session, session.tokens(), session.status(), gr.skip(), gr.skip()
    yield explore_outputs(session, layer, head, view)


@handler
def undo(session, layer, head, view, request: gr.Request = None):
    if session.model_name is not None:
        session.check_view(None, layer, head, view)
    session.undo()
    return explore_outputs(session, layer, head, view)


@handler
def reset(session, model_name, request: gr.Request = None):
    examples = session.entry_for(model_name).examples  # checked before the text goes
    session.reset()
    return (session, [], "", probs_figure(session), message_plot("Press Step or Generate to see attention."),
            examples[0] if examples else "")


@handler
def redraw(session, layer, head, view, request: gr.Request = None):
    return attention_figure(session, layer, head, view)


@handler
def select_model(session, model_name, request: gr.Request = None):
    entry = session.select_model(model_name)
    cfg = entry.model.cfg
    return (session, [], entry.summary, probs_figure(session), message_plot("Press Step or Generate."),
            gr.update(choices=list(range(cfg.n_layers)), value=0),
            gr.update(choices=["all", *range(cfg.n_heads)], value="all"),
            gr.update(value=entry.examples[0] if entry.examples else ""))
