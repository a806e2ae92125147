"""The Explore tab: its layout and events.

One screen (1366×900 and 1280×720): the prompt and buttons on top; below, the attention of the
selected layer on the left and the text, the next-token chart and the status on the right. On a
narrow window the columns stack and the attention shows one head at full width (◀ ▶ move
between heads). What the page does by itself (token clicks, shortcuts) is in assets/explore.js.
"""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from lab.catalogue.models import DEFAULT_MODEL
from lab.limits import (
    ATTENTION_VIEWS, COLOUR_MODES, CONCURRENCY, MAX_NEW_TOKENS, MAX_PROMPT_CHARS, SEED_RANGE, TEMPERATURE_RANGE,
    TOP_K_RANGE, TOP_P_RANGE,
)
from lab.session import Session
from lab.text import cut_lines

from .common import RAW, api_example, handler
from .explore import (
    NO_PROBS, NO_TEXT, example_choices, head_choices, layer_choices, generate, lines_from_token, opening_controls,
    redraw_view, resample, reset, select_model, select_token, set_display, shift_head, show_caption, show_vocabulary,
    step, step_picture, undo, vocabulary_html,
)
from .common import message_plot
from .heads_tab import build_heads_section
from .inside_tab import build_inside_section
from .share import NUMBERS, export_numbers, make_link, open_session, save_session, save_view_page
from .explore import probs_figure

SHORTCUTS = ("**Keys** (outside text boxes): **S** step · **G** generate · **U** undo · "
             "**←/→** move the selected token · **Esc** back to the last token · **Enter** in the prompt steps")
COLOUR_LABELS = {"linear": "colour: weight", "row": "colour: ÷ row max", "log": "colour: log scale",
                 "value": "colour: ‖a·v W_O‖"}  # value-weighted: how far each key moves the output
SAME_EXAMPLE = "(prompt, example) => (prompt === example ? example : null)"
# the link the server made is relative (it knows not the page's address): the page writes it out whole
WHOLE_LINK = ("(page) => { const a = new DOMParser().parseFromString(page || '', 'text/html').querySelector('a[href]');"
              " return a ? new URL(a.getAttribute('href'), window.location.href).href : ''; }")


@handler(exclusive=False)
def probs_after_step(session, request: gr.Request = None):
    """The next-token chart the page draws right after a Step's picture (not held: it only reads)."""
    return probs_figure(session)


def build_explore_tab(ses: gr.State, first: Session) -> dict:
    """Lay out the Explore tab (call inside its `gr.Tab`) and bind its events; returns the
    components other tabs and the page's load event use.

    The components are made, and the events bound, in one fixed order: the API page lists the
    endpoints in the order they are bound, and the numbers gradio gives them (fn_index) follow it.
    """
    default = first.entry_for(DEFAULT_MODEL)
    c = SimpleNamespace()  # the tab's components, by name, for the helpers below
    _lay_out_top(c, first, default)
    with gr.Row(elem_id="main"):
        _lay_out_attention(c, default)
        with gr.Column(scale=5, min_width=300, elem_id="text_col"):
            _lay_out_text(c, first, default)
            _lay_out_share(c)
    c.screen = gr.Textbox(visible=False)
    inside = build_inside_section({"layer": c.layer, "head": c.head, "view": c.view, "model": c.model_dd,
                                   "colour": c.colour, "caption": c.caption})  # its events are bound last (app.py)
    heads_section = gr.Column(elem_id="heads_section")

    api_example(c.prompt, default.examples[0])
    c.sampling = [c.temperature, c.top_k, c.top_p, c.seed]
    c.views = [c.layer, c.head, c.view]
    c.explore = [ses, c.tokens, c.status, c.probs_plot, c.attn_plot]  # what Step, Generate, Undo and Reset return
    c.group = dict(concurrency_limit=CONCURRENCY["explore"], concurrency_id="explore", **RAW)
    c.redraw = dict(fn=redraw_view, inputs=[ses, c.model_dd, *c.views], outputs=[c.attn_plot, c.caption])
    c.display_inputs = [ses, c.colour, c.presentation, c.screen, *c.views]
    c.state_outputs = [ses, c.model_dd, c.prompt, c.examples, c.caption, c.tokens, c.status, c.probs_plot,
                       c.attn_plot, c.layer, c.head, c.view, c.colour, c.presentation, *c.sampling, c.share_note]
    _bind_text_buttons(ses, c)
    _bind_views(ses, c)
    _bind_model_and_display(ses, c)
    _bind_share(ses, c)
    with heads_section:
        heads = build_heads_section(ses, {"model": c.model_dd, "layer": c.layer, "head": c.head, "view": c.view,
                                  "sampling": c.sampling,
                                  "explore_group": c.group, "redraw": c.redraw, "default_model": DEFAULT_MODEL,
                                  "layer_choices": layer_choices(default.cfg.n_layers)})
    return {"model": c.model_dd, "state_outputs": c.state_outputs, "screen": c.screen,
            "display_inputs": c.display_inputs, "no_probs": NO_PROBS, "inside": inside,
            "heads": heads, "token_view": {"tokens": c.tokens, "plot": c.attn_plot, "views": c.views,
                                           "status": c.status, "note": c.text_note,
                                           "group": c.group}}


def _lay_out_top(c: SimpleNamespace, first: Session, default) -> None:
    """The model, the example prompts and the prompt; the buttons; the note a link or an opened session leaves."""
    with gr.Row(elem_id="topbar", equal_height=True):
        c.model_dd = gr.Dropdown(first.model_names(), value=DEFAULT_MODEL, label="Model", elem_id="model", scale=2,
                                 min_width=160)
        c.examples = gr.Dropdown(example_choices(default.examples), value=default.examples[0],
                                 label="Example prompts", elem_id="examples", scale=2, min_width=160)
        c.prompt = gr.Textbox(default.examples[0], label="Prompt (Enter = Step)", elem_id="prompt", scale=4,
                              lines=1, max_lines=3, max_length=MAX_PROMPT_CHARS, min_width=220)
    with gr.Row(elem_id="actions", equal_height=True):
        c.step_btn = gr.Button("Step  [S]", variant="primary", elem_id="step", min_width=140)
        c.gen_btn = gr.Button("Generate  [G]", elem_id="generate", min_width=140)
        c.undo_btn = gr.Button("Undo  [U]", elem_id="undo", min_width=140)
        c.reset_btn = gr.Button("Reset", elem_id="reset", min_width=80)
        c.presentation = gr.Checkbox(False, label="Large fonts", elem_id="presentation", min_width=110, scale=0,
                                     container=False)
        c.dark_btn = gr.Button("◐ Dark", elem_id="dark", min_width=100, scale=0)
    c.share_note = gr.Markdown("", elem_id="share_note", visible=False)  # what a link or an opened session left out


def _lay_out_attention(c: SimpleNamespace, default) -> None:
    """The left column: the caption, the view's controls and the attention, on the model's first view."""
    cfg = default.cfg
    layer0, head0, view0, caption0 = opening_controls(default, narrow=False)
    with gr.Column(scale=7, min_width=300, elem_id="attention_col"):
        c.caption = gr.Markdown(caption0, elem_id="caption")
        with gr.Row(elem_id="view_controls"):
            c.layer = gr.Dropdown(layer_choices(cfg.n_layers), value=layer0, label="Layer", show_label=False,
                                  container=False, elem_id="layer", min_width=86, scale=1)
            c.prev_head = gr.Button("◀", elem_id="prev_head", min_width=36, scale=0)
            c.head = gr.Dropdown(head_choices(cfg.n_heads), value=head0, label="Head", show_label=False,
                                 container=False, elem_id="head", min_width=96, scale=1)
            c.next_head = gr.Button("▶", elem_id="next_head", min_width=36, scale=0)
            # a menu: five views would not fit beside the other controls as a row of radio buttons
            c.view = gr.Dropdown(list(ATTENTION_VIEWS), value=view0, label="View", show_label=False, container=False,
                                 elem_id="view", min_width=150, scale=2)
            c.colour = gr.Dropdown([(COLOUR_LABELS.get(m, m), m) for m in COLOUR_MODES], value="linear",
                                   label="Colour", show_label=False, container=False, elem_id="colour", min_width=140,
                                   scale=1)
        c.attn_plot = gr.Plot(message_plot(NO_TEXT), show_label=False, elem_id="attention")


def _lay_out_text(c: SimpleNamespace, first: Session, default) -> None:
    """The right column's top: the text, the next-token chart, the status, the keys, sampling and vocabulary."""
    c.text_note = gr.Markdown("", elem_id="text_note", visible=False)  # the text shown is cut (`text_cut_note`)
    c.tokens = gr.HighlightedText(label="Text: click a token to see where it looks (grey edge = prompt, "
                                        "orange = generated)",
                                  elem_id="tokens", color_map={"prompt": "#cfd8e3", "generated": "#ffd27f"},
                                  show_legend=False, combine_adjacent=False, show_inline_category=False)
    gr.HTML("", elem_id="shade_note")
    c.probs_plot = gr.Plot(probs_figure(first), show_label=False, elem_id="probs")
    c.status = gr.Textbox(label="Status", elem_id="status", lines=2, max_lines=6, interactive=False)
    gr.Markdown(SHORTCUTS, elem_id="shortcuts")
    with gr.Accordion("Sampling", open=False, elem_id="sampling"):
        with gr.Row():
            c.temperature = gr.Slider(*TEMPERATURE_RANGE, value=0.8, step=0.05,
                                      label="Temperature (0 = greedy)", elem_id="temperature")
            c.top_k = gr.Slider(*TOP_K_RANGE, value=0, step=1, label="Top-k (0 = off)", elem_id="top_k")
        with gr.Row():
            c.top_p = gr.Slider(*TOP_P_RANGE, value=1.0, step=0.05, label="Top-p (1 = off)", elem_id="top_p")
            c.seed = gr.Number(0, label="Seed", precision=0, minimum=SEED_RANGE[0], maximum=SEED_RANGE[1],
                               elem_id="seed")
        c.max_new = gr.Slider(1, MAX_NEW_TOKENS, value=40, step=1, label="Max new tokens (Generate)",
                              elem_id="max_new")
    with gr.Accordion("Vocabulary", open=False, elem_id="vocabulary"):
        c.vocabulary = gr.HTML(vocabulary_html(default), elem_id="vocabulary_list")


def _lay_out_share(c: SimpleNamespace) -> None:
    """The right column's "Save & share": session files, links, a web page of the view and its numbers."""
    with gr.Accordion("Save & share", open=False, elem_id="share"):
        with gr.Row():
            c.save_btn = gr.Button("Save session", elem_id="save_session", min_width=120)
            c.open_btn = gr.UploadButton("Open session", file_types=[".json"], elem_id="open_session",
                                         min_width=120)
            c.link_btn = gr.Button("Link to this view", elem_id="make_link", min_width=120)
            c.page_btn = gr.Button("View as web page", elem_id="view_page", min_width=120)
        c.save_msg = gr.Markdown("", elem_id="save_msg")
        c.saved = gr.File(label="Your file (session or web page)", elem_id="session_file", interactive=False,
                          height=90)
        c.link_html = gr.HTML("", elem_id="share_link")
        c.link_text = gr.Textbox("", label="Link (copy button at the top right)", elem_id="share_link_text",
                                 interactive=False, buttons=["copy"], lines=1, max_lines=4,
                                 placeholder="“Link to this view” puts the link here.")
        with gr.Row(equal_height=True):
            c.numbers_what = gr.Dropdown(list(NUMBERS.items()), value="weights", label="The numbers of",
                                         elem_id="numbers_what", scale=3)
            c.numbers_fmt = gr.Radio(["csv", "json"], value="csv", label="as", elem_id="numbers_fmt", scale=1,
                                     min_width=120)
            c.numbers_btn = gr.Button("Download numbers", elem_id="numbers_btn", scale=1, min_width=120)
        c.numbers_file = gr.File(label="Numbers", elem_id="numbers_file", interactive=False, height=90)


def _bind_text_buttons(ses: gr.State, c: SimpleNamespace) -> None:
    """Step (button and Enter), Generate, Undo and Reset, and the API's /step."""
    step_inputs = [ses, c.model_dd, c.prompt, *c.sampling, *c.views]
    # In the page a Step draws the attention first and the probability chart right after: the
    # attention is what the click is for. A Step takes milliseconds, so no progress overlay.
    for trigger in (c.step_btn.click, c.prompt.submit):
        trigger(step_picture, step_inputs, [ses, c.tokens, c.status, c.attn_plot, c.caption],
                api_visibility="private", show_progress="hidden", **c.group).then(
            probs_after_step, ses, c.probs_plot, queue=False, api_visibility="private", show_progress="hidden")
    # The API's /step returns everything at once (an invisible button: the same handler logic).
    gr.Button(visible=False).click(step, step_inputs, c.explore, api_name="step", **c.group)
    # the caption above the attention follows what it shows (the API's answers leave it out)
    caption_after = dict(fn=show_caption, inputs=[ses, c.model_dd, *c.views], outputs=c.caption, queue=False,
                         api_visibility="private", show_progress="hidden", **RAW)
    c.gen_btn.click(generate, [ses, c.model_dd, c.prompt, *c.sampling, c.max_new, *c.views], c.explore,
                    api_name="generate", concurrency_limit=CONCURRENCY["generate"], concurrency_id="generate",
                    show_progress="hidden", **RAW).then(**caption_after)
    c.undo_btn.click(undo, [ses, *c.views], c.explore, api_name="undo", show_progress="hidden",
                     **c.group).then(**caption_after)
    c.reset_btn.click(reset, [ses, c.model_dd], c.explore, api_name="reset", **RAW).then(**caption_after).then(
        None, [c.prompt, c.examples], c.examples, js=SAME_EXAMPLE)


def _bind_views(ses: gr.State, c: SimpleNamespace) -> None:
    """The attention follows its layer, head and view; the chart follows a clicked token and the sampling."""
    for control in c.views:
        control.change(**c.redraw, api_name=False, show_progress="hidden", **c.group)
    c.tokens.select(select_token, [ses, c.temperature, c.top_k, c.top_p], c.probs_plot, api_name=False,
                    show_progress="hidden", **c.group)
    for control in (c.temperature, c.top_k, c.top_p):  # the "after" bars follow the settings at once
        control.change(resample, [ses, c.temperature, c.top_k, c.top_p], c.probs_plot, api_name=False,
                       show_progress="hidden", trigger_mode="always_last", **c.group)


def _bind_model_and_display(ses: gr.State, c: SimpleNamespace) -> None:
    """The model menu, the example prompts, the vocabulary, ◀ ▶, the colours, Large fonts and Dark."""
    c.model_dd.change(select_model, [ses, c.model_dd],
                      [ses, c.tokens, c.status, c.probs_plot, c.attn_plot, c.layer, c.head, c.view, c.caption,
                       c.examples, c.prompt], api_name="select_model", **RAW)
    c.examples.input(None, c.examples, c.prompt, js="(example) => example")  # the page copies it: no round trip
    c.prompt.input(None, [c.prompt, c.examples], c.examples, js=SAME_EXAMPLE)  # the menu names the prompt, or nothing
    c.model_dd.change(show_vocabulary, [ses, c.model_dd], c.vocabulary, api_name=False, queue=False, **RAW)
    for button, delta in ((c.prev_head, -1), (c.next_head, 1)):
        button.click(shift_head, [ses, c.model_dd, c.head, gr.Number(delta, visible=False)], c.head, api_name=False,
                     show_progress="hidden", **RAW)
    for control in (c.colour, c.presentation):
        control.change(set_display, c.display_inputs, [c.attn_plot, c.probs_plot, c.head], api_name=False, **RAW)
    c.presentation.change(None, c.presentation, None,
                          js="(on) => { document.body.classList.toggle('presenting', !!on); }")
    c.dark_btn.click(None, None, None, js="() => { document.body.classList.toggle('dark'); "
                                          "window.dispatchEvent(new Event('resize')); }")


def _bind_share(ses: gr.State, c: SimpleNamespace) -> None:
    """Save & share: a session file out and in, a link, a web page of the view, the numbers."""
    form = [ses, c.model_dd, c.prompt, *c.sampling, *c.views]
    api_example(c.open_btn, None)  # no file from the web as the documented example
    c.save_btn.click(save_session, form, [c.saved, c.save_msg], api_name="export_session", **RAW)
    c.open_btn.upload(open_session, [ses, c.open_btn], c.state_outputs, api_name="import_session", **RAW)
    c.link_btn.click(make_link, form, c.link_html, api_name="link", **RAW).then(
        None, c.link_html, c.link_text, js=WHOLE_LINK, queue=False, api_visibility="private")
    c.page_btn.click(save_view_page, [ses, *c.views], c.saved, api_name="export_page", **RAW)
    c.numbers_btn.click(export_numbers, [ses, c.numbers_what, c.numbers_fmt, c.model_dd, c.layer, c.head],
                        c.numbers_file, api_name="export_numbers", **RAW)


def bind_token_view(ses: gr.State, parts: dict) -> None:
    """A token clicked in the text redraws the lines view from it (ui.explore.lines_from_token). A page-only
    event, bound after every endpoint (app.py) so that the endpoints keep their numbers."""
    parts["tokens"].select(lines_from_token, [ses, *parts["views"]], parts["plot"], api_name=False,
                           show_progress="hidden", trigger_mode="always_last", **parts["group"])
    # the status says when the text is cut to the context; the page says it above the text too
    parts["status"].change(text_cut_note, parts["status"], parts["note"], api_name=False, queue=False,
                           show_progress="hidden", **RAW)


@handler
def text_cut_note(status):
    """Above the text, the status's lines that say the text shown is not all of it (lab.text.cut_lines):
    the prompt cut to the model's context, or the oldest token dropped; hidden when there are none."""
    lines = cut_lines(status)
    return gr.update(value="  \n".join(f"✂ {line}" for line in lines), visible=bool(lines))
