"""The Explore tab's handlers: Step, Generate, Undo, Reset, the model, the attention view, the
selected token and how figures are drawn.

Each checks its inputs, calls one verb of the person's `lab.session.Session`, draws with one
`viz` function and returns what the page shows. Clicking a token is answered twice: the page
itself outlines the query row and shades the text at once (assets/explore.js, from the figure's
``meta.shade``), and `select_token` sends the distribution that token was drawn from.
"""

from __future__ import annotations

import html
import time

import gradio as gr

import viz
from lab import captions, probing
from lab.checks import check_sampling
from lab.export import model_stem
from lab.limits import OVERVIEW_MAX_TOKENS
from lab.models import ModelEntry
from lab.session import Session

from .common import handler, message_plot, named
from .plots import to_plot

NO_TEXT = "Press Step (or Enter in the prompt) to see attention."
NO_PROBS = "Next-token probabilities appear after the first step."
OWN_MODEL_CAPTION = ("Your own model: pick a layer and a head, then click a token to see where it looks. "
                     "Heads that point one token back or at repeated text are worth finding.")


def attention_figure(session: Session, layer, head, view):
    """The attention picture of the session's current text, for a gr.Plot."""
    spec = attention_spec(session, layer, head, view)
    return message_plot(NO_TEXT) if spec is None else to_plot(spec)


def attention_spec(session: Session, layer, head, view):
    """The attention figure itself (None without a text), named for its download."""
    att, change = captions.shown_attention(session)
    if att is None:
        return None
    v = session.check_view(None, layer, head, view)
    d = session.display

    # under a change, the panels' role badges are read off the attention drawn
    badges = probing.badges(session, v.layer, roles=captions.shown_roles(session, att) if change else None)

    # The figure fits below the page's controls (one screen, also at a projector's 1280×720): where
    # its cells are too small for readable labels, viz labels every k-th token instead.
    spec = viz.attention_view(att.weights, att.scores, att.tokens, layer=v.layer, head=v.head, view=v.view,
                              causal=att.causal, overview_max_tokens=OVERVIEW_MAX_TOKENS, width_px=d.plot_width,
                              max_height_px=d.plot_height, presentation=d.presentation, colour=d.colour,
                              badges=badges, title_prefix=f"{change} · " if change else None)
    if isinstance(spec, viz.FigureSpec):  # the page links the text with the picture from these numbers
        spec.layout.setdefault("meta", {})["change"] = change  # what the head tools changed ('' = nothing)
        spec.layout.setdefault("meta", {})["shade"] = viz.shade_payload(att.weights[v.layer], v.layer, v.head,
                                                                        causal=att.causal)
    which = "all-layers" if v.view == "all layers" else f"L{v.layer}H{'all' if v.head is None else v.head}"
    return named(spec, model_stem(session.model_name), which, f"attention {v.view}", f"{len(att.tokens)} tokens")


def view_caption(session: Session, model_name, layer, head, view) -> str:
    """The line above the attention, true of what it shows (Markdown: tokens stay text)."""
    line = captions.session_caption(session, model_name, layer, head, view)
    return OWN_MODEL_CAPTION if line is None else html.escape(line, quote=False)


def probs_figure(session: Session, index=None, sampling=None):
    """The distribution the token at window position `index` (default: the last) was drawn from; with
    `sampling` (the Sampling section's settings), its "after" bars are what those settings make of it."""
    p = session.probabilities(index, sampling)
    presentation = session.display.presentation
    if p is None:
        tokens = session.tokens()
        if not tokens:
            return message_plot(NO_PROBS)
        return message_plot(f"“{tokens[0][0]}” is the first token: nothing comes before it to predict it from.")
    piece = p.pieces[p.chosen]
    piece = piece if len(piece) <= 16 else piece[:15] + "…"  # the figure escapes it
    if p.typed:
        title = f"Typed “{piece}” (position {p.index}): what the model predicted there"
    elif p.resampled:
        title = f"“{piece}” (position {p.index}) under new settings"  # not the ones it was drawn with
    else:
        title = f"“{piece}” (position {p.index}) was drawn from this"
    fig = viz.probabilities(p.pieces, p.probs, adjusted=p.adjusted, chosen=p.chosen, top=10, title=title,
                            presentation=presentation, typed=p.typed, max_height_px=session.display.chart_height)
    return to_plot(named(fig, model_stem(session.model_name), f"pos{p.index}", "probabilities"))


def explore_outputs(session: Session, layer, head, view):
    return (session, session.tokens(), session.status(), probs_figure(session),
            attention_figure(session, layer, head, view))


def example_choices(examples) -> list[tuple[str, str]]:
    """The example menu: each prompt shown on one line (⏎ for a line break), sent whole."""
    return [(e.replace("\n", " ⏎ "), e) for e in examples]


def layer_choices(n_layers: int) -> list[tuple[str, int]]:
    """The Layer dropdown: shown "layer 1", sent 1."""
    return [(f"layer {i}", i) for i in range(n_layers)]


def head_choices(n_heads: int) -> list[tuple[str, int | str]]:
    """The Head dropdown: shown "all heads" / "head 3", sent "all" / 3."""
    return [("all heads", "all"), *((f"head {i}", i) for i in range(n_heads))]


def first_view(entry: ModelEntry, narrow: bool) -> tuple[int, int | str, str, str]:
    """(layer, head, view, caption) a model opens on: a built-in's chosen head, else layer 0's heads
    (one head on a narrow screen, where a grid of heads is too small to read)."""
    fv = entry.first_view
    if fv is not None:  # the caption is shown as Markdown: tokens such as <EOS> must stay text
        return fv.layer, fv.head, fv.view, html.escape(fv.caption, quote=False)
    return 0, 0 if narrow else "all", "weights", OWN_MODEL_CAPTION


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
    return (session, session.tokens(), session.status(), attention_figure(session, layer, head, view),
            view_caption(session, model_name, layer, head, view))


@handler(rate="generate")  # no ZeroGPU decorator: generation runs on the CPU (it never touches CUDA)
def generate(session, model_name, prompt, temperature, top_k, top_p, seed, max_new, layer, head, view,
             request: gr.Request = None):
    """Up to `max_new` more tokens (the text goes on; a new model, prompt or seed starts it again),
    streaming the text."""
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
    """Take the last generated token back; the chart shows what the token before it was drawn from."""
    if session.model_name is not None:
        session.check_view(None, layer, head, view)
    session.undo()
    return explore_outputs(session, layer, head, view)


@handler
def reset(session, model_name, request: gr.Request = None):
    """Start again from the prompt (which stays as the person typed it)."""
    session.entry_for(model_name)  # checked before the text goes
    session.reset()
    return session, [], "", probs_figure(session), message_plot(NO_TEXT)


@handler
def redraw(session, layer, head, view, request: gr.Request = None):
    return attention_figure(session, layer, head, view)


@handler
def redraw_view(session, model_name, layer, head, view, request: gr.Request = None):
    """The attention and the caption above it, for the view chosen (the page's Layer / Head / View,
    and after the head tools change the model or the text changed)."""
    return attention_figure(session, layer, head, view), view_caption(session, model_name, layer, head, view)


@handler
def show_caption(session, model_name, layer, head, view, request: gr.Request = None):
    return view_caption(session, model_name, layer, head, view)


@handler
def select_token(session, temperature, top_k, top_p, evt: gr.SelectData, request: gr.Request = None):
    """A token of the text was clicked: the chart shows the distribution it was drawn from (its
    "after" bars under the Sampling section's settings)."""
    sampling = check_sampling(temperature, top_k, top_p, 0)
    index = evt.index if isinstance(evt, gr.SelectData) else None
    if index is not None and session.tokens():
        session.select(index)  # the head tools read it at this token
    return probs_figure(session, index, sampling)


@handler
def resample(session, temperature, top_k, top_p, request: gr.Request = None):
    """Temperature, top-k or top-p moved: the chart's "after" bars for the selected token, at once
    (nothing is generated)."""
    sampling = check_sampling(temperature, top_k, top_p, 0)  # the seed plays no part in the distribution
    if not session.tokens():
        return gr.skip()
    return probs_figure(session, session.query, sampling)


def vocabulary_html(entry: ModelEntry) -> str:
    """Every token the model knows, as its pieces (␣ a space, ⏎ a line break), for the Vocabulary section."""
    tok = entry.tokenizer
    unit = {"word": "words", "char": "characters"}.get(tok.kind, "pieces")
    pieces = "".join(f'<span class="lab-piece">{html.escape(tok.piece(i))}</span> ' for i in range(tok.vocab_size))
    return (f'<p>{html.escape(entry.name)}: {tok.vocab_size} tokens ({unit}; a prompt may use only these).</p>'
            f'<div class="lab-cont">{pieces}</div>')


@handler
def show_vocabulary(session, model_name, request: gr.Request = None):
    return vocabulary_html(session.entry_for(model_name))


@handler
def select_model(session, model_name, request: gr.Request = None):
    if session.kept_on_select(model_name):  # a session file or link set this model's text up: keep it
        return (session, *[gr.skip()] * 10)
    entry = session.select_model(model_name)
    cfg = entry.model.cfg
    layer, head, view, caption = first_view(entry, session.display.narrow)
    examples = list(entry.examples)
    return (session, [], entry.summary, probs_figure(session), message_plot(NO_TEXT),
            gr.update(choices=layer_choices(cfg.n_layers), value=layer),
            gr.update(choices=head_choices(cfg.n_heads), value=head),
            gr.update(value=view), caption,
            gr.update(choices=example_choices(examples), value=examples[0] if examples else None),
            gr.update(value=examples[0] if examples else ""))


@handler
def shift_head(session, model_name, head, delta, request: gr.Request = None):
    """The head before or after the one shown (◀ ▶), wrapping around; from "all", the first or last."""
    n = session.entry_for(model_name).model.cfg.n_heads
    if delta not in (-1, 1):
        raise ValueError("delta must be -1 or 1.")
    if head == "all":
        return 0 if delta > 0 else n - 1
    current = session.check_view(model_name, 0, head, "weights").head
    return (current + delta) % n


@handler
def set_display(session, colour, presentation, screen, layer, head, view, request: gr.Request = None):
    """Colour mode, large fonts or the window's size changed: draw the figures again for them."""
    return redisplay(session, colour, presentation, screen, layer, head, view)


def redisplay(session: Session, colour, presentation, screen, layer, head, view):
    """`set_display`'s work (attention, chart, head): on the page's first load (screen given) a narrow
    window gets one head instead of a grid."""
    was_narrow = session.display.narrow
    session.set_display(colour, presentation, screen)
    if session.display.narrow and not was_narrow and head == "all" and session.model_name is None:
        head = 0
    return attention_figure(session, layer, head, view) if session.model_name else gr.skip(), \
        probs_figure(session) if session.model_name else gr.skip(), head
