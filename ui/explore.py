"""The Explore tab's handlers: Step, Generate, Undo, Reset, the model, the attention view, the
selected token and how figures are drawn.

Each checks its inputs and calls one verb of the person's `lab.session.Session`; Step, Generate,
Undo and Reset get back one `lab.shown.Shown` and draw it with viz (`shown_probs`, `attention_plot`)
without going back into the lab. Clicking a token is answered twice: the page
itself outlines the query row and shades the text at once (assets/explore.js, from the figure's
``meta.shade``), and `select_token` sends the distribution that token was drawn from.
"""

from __future__ import annotations

import html
import time

import gradio as gr

import viz
from lab import captions
from lab.catalogue.models import ModelEntry, many_heads, thousands_of_heads_caption
from lab.checks import check_sampling
from lab.display import check_head, head_pages, page_value
from lab.export import file_name, model_stem
from lab.shown import Shown
from lab.limits import OVERVIEW_MAX_TOKENS
from lab.session import Session
from lab.text import Probabilities

from .common import handler, known_model, message_plot
from .plots import to_plot

NO_TEXT = "Press Step (or Enter in the prompt) to see attention."
NO_PROBS = "Next-token probabilities appear after the first step."
VALUE_NOTE = " *Colours: ‖a·v W_O‖, how far each key moves the output, not the weight.*"
WEIGHTS_ONLY = ("scores", viz.LINES_VIEW, viz.THUMBNAILS_VIEW)  # views the colour menu leaves as they are
OWN_MODEL_CAPTION = ("Your own model: pick a layer and a head, then click a token to see where it looks. "
                     "Heads that point one token back or at repeated text are worth finding.")


def attention_figure(session: Session, layer, head, view):
    """The attention picture of the session's current text, for a gr.Plot (the lines view from the
    token selected in the text)."""
    return attention_plot(session.shown(layer, head, view), session.query)


def attention_spec(session: Session, layer, head, view):
    """The attention figure itself (None without a text), named for its download."""
    return shown_spec(session.shown(layer, head, view))


def attention_plot(shown: Shown, query: int | None = None):
    """A Shown's attention picture, for a gr.Plot (`query`: the token the lines view draws from, None: the last)."""
    spec = shown_spec(shown, query)
    return message_plot(NO_TEXT) if spec is None else to_plot(spec)


def shown_spec(shown: Shown, query: int | None = None):
    """A Shown's attention figure (None without a text), named for its download; `query`: the token the
    lines view draws its lines from (None: the last; the heatmaps' selected row is outlined by the page)."""
    att, v = shown.attention, shown.view
    if att is None:
        return None
    # The figure fits below the page's controls (one screen, also at a projector's 1280×720): where
    # its cells are too small for readable labels, viz labels every k-th token instead.
    spec = viz.attention_view(att.weights, att.scores, att.tokens, layer=v.layer, head=v.head, view=v.view,
                              causal=att.causal, overview_max_tokens=OVERVIEW_MAX_TOKENS, width_px=shown.plot_width,
                              max_height_px=shown.plot_height, presentation=shown.presentation, colour=shown.colour,
                              badges=shown.badges, heads=v.heads, value_weighted=shown.value_weighted,
                              title_prefix=f"{shown.change} · " if shown.change else None,
                              query=query if v.view == viz.LINES_VIEW else None)
    if isinstance(spec, viz.FigureSpec):  # the page links the text with the picture from these numbers
        spec.layout.setdefault("meta", {})["change"] = shown.change  # what the head tools changed ('' = nothing)
        spec.layout.setdefault("meta", {})["shade"] = viz.shade_payload(att.weights[v.layer], v.layer, v.head,
                                                                        causal=att.causal)
    return viz.with_filename(spec, shown.attention_file)


def caption_markdown(line: str | None) -> str:
    """The line above the attention as the page shows it (Markdown: tokens stay text)."""
    return OWN_MODEL_CAPTION if line is None else html.escape(line, quote=False)


def shown_caption(shown: Shown) -> str:
    """A Shown's line above the attention; with the value-weighted colour, what the colours are. Where the
    all-layers view draws no panels (too many heads, or too long a text), the line says why, as its figure does."""
    att, v = shown.attention, shown.view
    if att is not None and v is not None and v.view == "all layers":
        refused = viz.overview_refusal(len(att.weights), len(att.weights[0]), len(att.tokens), OVERVIEW_MAX_TOKENS)
        if refused is not None:
            return html.escape(f"No panels here: {refused}", quote=False)
    line = caption_markdown(shown.caption)
    if shown.colour == "value" and shown.view is not None and shown.view.view not in WEIGHTS_ONLY:
        line += VALUE_NOTE
    return line


def check_caption_view(session: Session, model_name, layer, head, view) -> None:
    """The page's model and view as a caption reads them, checked (the text's model, once there is a text)."""
    known_model(session, model_name)
    session.check_view(None if session.tokens() else model_name, layer, head, view)


def view_caption(session: Session, model_name, layer, head, view) -> str:
    """The line above the attention, true of what it shows."""
    check_caption_view(session, model_name, layer, head, view)
    shown = session.shown(layer, head, view)
    if shown.attention is None:
        return caption_markdown(captions.no_text_caption(session.entry_for(model_name), layer, head, view))
    return shown_caption(shown)


def probs_chart(p: Probabilities | None, first_token: str | None, presentation: bool, chart_height: int, name: str):
    """The distribution a token was drawn from, for a gr.Plot (a message when there is none)."""
    if p is None:
        if first_token is None:
            return message_plot(NO_PROBS)
        return message_plot(f"“{first_token}” is the first token: nothing comes before it to predict it from.")
    piece = p.pieces[p.chosen]
    piece = piece if len(piece) <= 16 else piece[:15] + "…"  # the figure escapes it
    if p.typed:
        title = f"Typed “{piece}” (position {p.index}): what the model predicted there"
    elif p.resampled:
        title = f"“{piece}” (position {p.index}) under new settings"  # not the ones it was drawn with
    else:
        title = f"“{piece}” (position {p.index}) was drawn from this"
    fig = viz.probabilities(p.pieces, p.probs, adjusted=p.adjusted, chosen=p.chosen, top=10, title=title,
                            presentation=presentation, typed=p.typed, max_height_px=chart_height)
    return to_plot(viz.with_filename(fig, name))


def probs_figure(session: Session, index=None, sampling=None):
    """The distribution the token at window position `index` (default: the last) was drawn from; with
    `sampling` (the Sampling section's settings), its "after" bars are what those settings make of it."""
    p = session.probabilities(index, sampling)
    tokens = session.tokens() if p is None else None
    name = file_name(model_stem(session.model_name), f"pos{p.index}", "probabilities") if p is not None else ""
    d = session.display
    return probs_chart(p, tokens[0][0] if tokens else None, d.presentation, d.chart_height, name)


def shown_probs(shown: Shown):
    """A Shown's next-token chart, for a gr.Plot."""
    return probs_chart(shown.probs, shown.first_token, shown.presentation, shown.chart_height, shown.probs_file)


def explore_outputs(session: Session, shown: Shown):
    return session, shown.tokens, shown.status, shown_probs(shown), attention_plot(shown)


def example_choices(examples) -> list[tuple[str, str]]:
    """The example menu: each prompt shown on one line (⏎ for a line break), sent whole."""
    return [(e.replace("\n", " ⏎ "), e) for e in examples]


def layer_choices(n_layers: int) -> list[tuple[str, int]]:
    """The Layer dropdown: shown "layer 1", sent 1."""
    return [(f"layer {i}", i) for i in range(n_layers)]


def head_choices(n_heads: int) -> list[tuple[str, int | str]]:
    """The Head dropdown: shown "all heads" / "head 3", sent "all" / 3. A layer of more heads than fit
    on one screen offers them a page at a time instead of all: "H0–5" (heads 0 to 5, sent "all"),
    "H6–11" (sent "6-11"); short, as the box is narrow at 1280 px, and the figure's title says "heads 6–11"."""
    pages = head_pages(n_heads)
    if len(pages) == 1:
        return [("all heads", "all"), *((f"head {i}", i) for i in range(n_heads))]
    return [*((f"H{p[0]}–{p[-1]}", page_value(p)) for p in pages), *((f"head {i}", i) for i in range(n_heads))]


def opening_controls(entry: ModelEntry, narrow: bool) -> tuple[int, int | str, str, str]:
    """(layer, head, view, caption) a model opens on: a built-in's chosen head, else layer 0's heads
    (one head on a narrow screen, where a grid of heads is too small to read)."""
    fv = entry.first_view
    if fv is not None:  # the caption is shown as Markdown: tokens such as <EOS> must stay text
        return fv.layer, fv.head, fv.view, html.escape(fv.caption, quote=False)
    if many_heads(entry.cfg):  # thousands of heads: one head above, and the roles map of every head below
        return 0, 0, "weights", thousands_of_heads_caption(entry.cfg)
    return 0, 0 if narrow else "all", "weights", OWN_MODEL_CAPTION


# ------------------------------------------------------------------------------ handlers


@handler
def step(session, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view,
         request: gr.Request = None):
    """One new token: sample from the model's distribution, then show what it attended to."""
    sampling = check_sampling(temperature, top_k, top_p, seed)
    return explore_outputs(session, session.step(model_name, prompt, sampling, view=(layer, head, view)))


@handler
def step_picture(session, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view,
                 request: gr.Request = None):
    """`step` without the probability chart, which the page fetches right after the picture."""
    sampling = check_sampling(temperature, top_k, top_p, seed)
    shown = session.step(model_name, prompt, sampling, view=(layer, head, view))
    return session, shown.tokens, shown.status, attention_plot(shown), shown_caption(shown)


@handler(rate="generate")  # no ZeroGPU decorator: generation runs on the CPU (it never touches CUDA)
def generate(session, model_name, prompt, temperature, top_k, top_p, seed, max_new, layer, head, view,
             request: gr.Request = None):
    """Up to `max_new` more tokens (the text goes on; a new model, prompt or seed starts it again),
    streaming the text."""
    sampling = check_sampling(temperature, top_k, top_p, seed)
    last_yield = 0.0
    for shown in session.generate(model_name, prompt, sampling, max_new, view=(layer, head, view)):
        if shown.complete:  # the last token's: the figures come at the end
            yield explore_outputs(session, shown)
        elif time.perf_counter() - last_yield > 0.3 and not shown.step.eos:  # the text streams
            last_yield = time.perf_counter()
            yield session, shown.tokens, shown.status, gr.skip(), gr.skip()


@handler
def undo(session, layer, head, view, request: gr.Request = None):
    """Take the last generated token back; the chart shows what the token before it was drawn from."""
    return explore_outputs(session, session.undo(view=(layer, head, view)))


@handler
def reset(session, model_name, request: gr.Request = None):
    """Start again from the prompt (which stays as the person typed it)."""
    session.entry_for(model_name)  # checked before the text goes
    shown = session.reset()
    return session, shown.tokens, shown.status, shown_probs(shown), message_plot(NO_TEXT)


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
def lines_from_token(session, layer, head, view, evt: gr.SelectData, request: gr.Request = None):
    """A token of the text was clicked (or reached with ←/→): the lines view draws that token's lines
    (the other views answer at once in the page itself: nothing to draw again)."""
    index = evt.index if isinstance(evt, gr.SelectData) else None
    if view != viz.LINES_VIEW or index is None or not session.tokens():
        return gr.skip()
    session.select(index)  # as select_token does: the two answers to one click agree whichever comes first
    return attention_figure(session, layer, head, view)


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
    cfg = entry.cfg
    layer, head, view, caption = opening_controls(entry, session.display.narrow)
    examples = list(entry.examples)
    return (session, [], entry.summary, probs_figure(session), message_plot(NO_TEXT),
            gr.update(choices=layer_choices(cfg.n_layers), value=layer),
            gr.update(choices=head_choices(cfg.n_heads), value=head),
            gr.update(value=view), caption,
            gr.update(choices=example_choices(examples), value=examples[0] if examples else None),
            gr.update(value=examples[0] if examples else ""))


@handler
def shift_head(session, model_name, head, delta, request: gr.Request = None):
    """The head before or after the one shown (◀ ▶), wrapping around; from "all", the first or last.
    From a page of heads ("heads 6–11"), the page before or after it."""
    n = session.entry_for(model_name).cfg.n_heads
    if delta not in (-1, 1):
        raise ValueError("delta must be -1 or 1.")
    current, page = check_head(head, n)
    if page is not None:
        pages = head_pages(n)
        return page_value(pages[(pages.index(page) + delta) % len(pages)])
    if current is None:
        return 0 if delta > 0 else n - 1
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


@handler
def colour_caption(session, colour, model_name, layer, head, view, request: gr.Request = None):
    """The colour menu changed: the line above the attention says what the colours are (the colour is set
    here too, so this answer never depends on `set_display`'s coming first)."""
    check_caption_view(session, model_name, layer, head, view)  # before the colour changes: a refusal changes nothing
    session.set_display(colour, None, None)
    return view_caption(session, model_name, layer, head, view)
