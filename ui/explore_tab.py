"""The Explore tab: its layout and events.

One screen (1366×900 and 1280×720): the prompt and buttons on top; below, the attention of the
selected layer on the left and the text, the next-token chart and the status on the right. On a
narrow window the columns stack and the attention shows one head at full width (◀ ▶ move
between heads). What the page does by itself (token clicks, shortcuts) is in assets/explore.js.
"""

from __future__ import annotations

import gradio as gr

from lab.limits import (
    ATTENTION_VIEWS, COLOUR_MODES, CONCURRENCY, MAX_NEW_TOKENS, MAX_PROMPT_CHARS, SEED_RANGE, TEMPERATURE_RANGE,
    TOP_K_RANGE, TOP_P_RANGE,
)
from lab.models import DEFAULT_MODEL
from lab.session import Session

from .common import RAW, api_example, handler
from .explore import (
    NO_PROBS, NO_TEXT, example_choices, first_view, head_choices, layer_choices, generate, redraw_view, resample, reset, select_model,
    select_token, set_display, shift_head, show_caption, show_vocabulary, step, step_picture, undo, vocabulary_html,
)
from .common import message_plot
from .heads_tab import build_heads_section
from .share import NUMBERS, export_numbers, make_link, open_session, save_session, save_view_page
from .explore import probs_figure

SHORTCUTS = ("**Keys** (outside text boxes): **S** step · **G** generate · **U** undo · "
             "**←/→** move the selected token · **Esc** back to the last token · **Enter** in the prompt steps")
COLOUR_LABELS = {"linear": "colour: weight", "row": "colour: ÷ row max", "log": "colour: log scale"}
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
    components other tabs and the page's load event use."""
    default = first.entry_for(DEFAULT_MODEL)
    cfg = default.model.cfg
    layer0, head0, view0, caption0 = first_view(default, narrow=False)
    with gr.Row(elem_id="topbar", equal_height=True):
        model_dd = gr.Dropdown(first.model_names(), value=DEFAULT_MODEL, label="Model", elem_id="model", scale=2,
                               min_width=160)
        examples = gr.Dropdown(example_choices(default.examples), value=default.examples[0], label="Example prompts",
                               elem_id="examples", scale=2, min_width=160)
        prompt = gr.Textbox(default.examples[0], label="Prompt (Enter = Step)", elem_id="prompt", scale=4,
                            lines=1, max_lines=3, max_length=MAX_PROMPT_CHARS, min_width=220)
    with gr.Row(elem_id="actions", equal_height=True):
        step_btn = gr.Button("Step  [S]", variant="primary", elem_id="step", min_width=140)
        gen_btn = gr.Button("Generate  [G]", elem_id="generate", min_width=140)
        undo_btn = gr.Button("Undo  [U]", elem_id="undo", min_width=140)
        reset_btn = gr.Button("Reset", elem_id="reset", min_width=80)
        presentation = gr.Checkbox(False, label="Large fonts", elem_id="presentation", min_width=110, scale=0,
                                   container=False)
        dark_btn = gr.Button("◐ Dark", elem_id="dark", min_width=100, scale=0)
    share_note = gr.Markdown("", elem_id="share_note", visible=False)  # what a link or an opened session left out
    with gr.Row(elem_id="main"):
        with gr.Column(scale=7, min_width=300, elem_id="attention_col"):
            caption = gr.Markdown(caption0, elem_id="caption")
            with gr.Row(elem_id="view_controls"):
                layer = gr.Dropdown(layer_choices(cfg.n_layers), value=layer0, label="Layer", show_label=False, container=False,
                                    elem_id="layer", min_width=86, scale=1)
                prev_head = gr.Button("◀", elem_id="prev_head", min_width=36, scale=0)
                head = gr.Dropdown(head_choices(cfg.n_heads), value=head0, label="Head", show_label=False, container=False,
                                   elem_id="head", min_width=96, scale=1)
                next_head = gr.Button("▶", elem_id="next_head", min_width=36, scale=0)
                view = gr.Radio(list(ATTENTION_VIEWS), value=view0, label="View", show_label=False, container=False,
                                elem_id="view", min_width=270, scale=2)
                colour = gr.Dropdown([(COLOUR_LABELS.get(c, c), c) for c in COLOUR_MODES], value="linear",
                                     label="Colour", show_label=False, container=False, elem_id="colour", min_width=140, scale=1)
            attn_plot = gr.Plot(message_plot(NO_TEXT), show_label=False, elem_id="attention")
        with gr.Column(scale=5, min_width=300, elem_id="text_col"):
            tokens = gr.HighlightedText(label="Text: click a token to see where it looks (grey edge = prompt, "
                                              "orange = generated)",
                                        elem_id="tokens", color_map={"prompt": "#cfd8e3", "generated": "#ffd27f"},
                                        show_legend=False, combine_adjacent=False, show_inline_category=False)
            gr.HTML("", elem_id="shade_note")
            probs_plot = gr.Plot(probs_figure(first), show_label=False, elem_id="probs")
            status = gr.Textbox(label="Status", elem_id="status", lines=2, max_lines=6, interactive=False)
            gr.Markdown(SHORTCUTS, elem_id="shortcuts")
            with gr.Accordion("Sampling", open=False, elem_id="sampling"):
                with gr.Row():
                    temperature = gr.Slider(*TEMPERATURE_RANGE, value=0.8, step=0.05,
                                            label="Temperature (0 = greedy)", elem_id="temperature")
                    top_k = gr.Slider(*TOP_K_RANGE, value=0, step=1, label="Top-k (0 = off)", elem_id="top_k")
                with gr.Row():
                    top_p = gr.Slider(*TOP_P_RANGE, value=1.0, step=0.05, label="Top-p (1 = off)", elem_id="top_p")
                    seed = gr.Number(0, label="Seed", precision=0, minimum=SEED_RANGE[0], maximum=SEED_RANGE[1],
                                     elem_id="seed")
                max_new = gr.Slider(1, MAX_NEW_TOKENS, value=40, step=1, label="Max new tokens (Generate)",
                                    elem_id="max_new")
            with gr.Accordion("Vocabulary", open=False, elem_id="vocabulary"):
                vocabulary = gr.HTML(vocabulary_html(default), elem_id="vocabulary_list")
            with gr.Accordion("Save & share", open=False, elem_id="share"):
                with gr.Row():
                    save_btn = gr.Button("Save session", elem_id="save_session", min_width=120)
                    open_btn = gr.UploadButton("Open session", file_types=[".json"], elem_id="open_session",
                                               min_width=120)
                    link_btn = gr.Button("Link to this view", elem_id="make_link", min_width=120)
                    page_btn = gr.Button("View as web page", elem_id="view_page", min_width=120)
                save_msg = gr.Markdown("", elem_id="save_msg")
                saved = gr.File(label="Your file (session or web page)", elem_id="session_file", interactive=False, height=90)
                link_html = gr.HTML("", elem_id="share_link")
                link_text = gr.Textbox("", label="Link (copy button at the top right)", elem_id="share_link_text",
                                       interactive=False, buttons=["copy"], lines=1, max_lines=4,
                                       placeholder="“Link to this view” puts the link here.")
                with gr.Row(equal_height=True):
                    numbers_what = gr.Dropdown(list(NUMBERS.items()), value="weights", label="The numbers of",
                                               elem_id="numbers_what", scale=3)
                    numbers_fmt = gr.Radio(["csv", "json"], value="csv", label="as", elem_id="numbers_fmt", scale=1,
                                           min_width=120)
                    numbers_btn = gr.Button("Download numbers", elem_id="numbers_btn", scale=1, min_width=120)
                numbers_file = gr.File(label="Numbers", elem_id="numbers_file", interactive=False, height=90)
    screen = gr.Textbox(visible=False)
    heads_section = gr.Column(elem_id="heads_section")

    api_example(prompt, default.examples[0])
    sampling = [temperature, top_k, top_p, seed]
    views = [layer, head, view]
    explore = [ses, tokens, status, probs_plot, attn_plot]
    explore_group = dict(concurrency_limit=CONCURRENCY["explore"], concurrency_id="explore", **RAW)
    step_inputs = [ses, model_dd, prompt, *sampling, *views]
    # In the page a Step draws the attention first and the probability chart right after: the
    # attention is what the click is for. A Step takes milliseconds, so no progress overlay.
    for trigger in (step_btn.click, prompt.submit):
        trigger(step_picture, step_inputs, [ses, tokens, status, attn_plot, caption], api_visibility="private",
                show_progress="hidden", **explore_group).then(
            probs_after_step, ses, probs_plot, queue=False, api_visibility="private", show_progress="hidden")
    # The API's /step returns everything at once (an invisible button: the same handler logic).
    gr.Button(visible=False).click(step, step_inputs, explore, api_name="step", **explore_group)
    # the caption above the attention follows what it shows (the API's answers leave it out)
    caption_after = dict(fn=show_caption, inputs=[ses, model_dd, *views], outputs=caption, queue=False,
                         api_visibility="private", show_progress="hidden")
    gen_btn.click(generate, [ses, model_dd, prompt, *sampling, max_new, *views], explore, api_name="generate",
                  concurrency_limit=CONCURRENCY["generate"], concurrency_id="generate", show_progress="hidden",
                  **RAW).then(**caption_after)
    undo_btn.click(undo, [ses, *views], explore, api_name="undo", show_progress="hidden",
                   **explore_group).then(**caption_after)
    reset_btn.click(reset, [ses, model_dd], explore, api_name="reset", **RAW).then(**caption_after).then(
        None, [prompt, examples], examples, js=SAME_EXAMPLE)
    redraw_inputs, redraw_outputs = [ses, model_dd, *views], [attn_plot, caption]
    for control in views:
        control.change(redraw_view, redraw_inputs, redraw_outputs, api_name=False, show_progress="hidden",
                       **explore_group)
    tokens.select(select_token, [ses, temperature, top_k, top_p], probs_plot, api_name=False, show_progress="hidden",
                  **explore_group)
    for control in (temperature, top_k, top_p):  # the "after" bars follow the settings at once
        control.change(resample, [ses, temperature, top_k, top_p], probs_plot, api_name=False, show_progress="hidden",
                       trigger_mode="always_last", **explore_group)
    model_dd.change(select_model, [ses, model_dd],
                    [ses, tokens, status, probs_plot, attn_plot, layer, head, view, caption, examples, prompt],
                    api_name="select_model", **RAW)
    examples.input(None, examples, prompt, js="(example) => example")  # the page copies it: no round trip
    prompt.input(None, [prompt, examples], examples, js=SAME_EXAMPLE)  # the menu names the prompt, or nothing
    model_dd.change(show_vocabulary, [ses, model_dd], vocabulary, api_name=False, queue=False)
    for button, delta in ((prev_head, -1), (next_head, 1)):
        button.click(shift_head, [ses, model_dd, head, gr.Number(delta, visible=False)], head, api_name=False,
                     show_progress="hidden", **RAW)
    display_inputs = [ses, colour, presentation, screen, *views]
    for control in (colour, presentation):
        control.change(set_display, display_inputs, [attn_plot, probs_plot, head], api_name=False, **RAW)
    presentation.change(None, presentation, None,
                        js="(on) => { document.body.classList.toggle('presenting', !!on); }")
    dark_btn.click(None, None, None, js="() => { document.body.classList.toggle('dark'); "
                                        "window.dispatchEvent(new Event('resize')); }")
    state_outputs = [ses, model_dd, prompt, examples, caption, tokens, status, probs_plot, attn_plot, layer, head,
                     view, colour, presentation, temperature, top_k, top_p, seed, share_note]
    form = [ses, model_dd, prompt, *sampling, *views]
    api_example(open_btn, None)  # no file from the web as the documented example
    save_btn.click(save_session, form, [saved, save_msg], api_name="export_session", **RAW)
    open_btn.upload(open_session, [ses, open_btn], state_outputs, api_name="import_session", **RAW)
    link_btn.click(make_link, form, link_html, api_name="link", **RAW).then(
        None, link_html, link_text, js=WHOLE_LINK, queue=False, api_visibility="private")
    page_btn.click(save_view_page, [ses, *views], saved, api_name="export_page", **RAW)
    numbers_btn.click(export_numbers, [ses, numbers_what, numbers_fmt, model_dd, layer, head], numbers_file,
                      api_name="export_numbers", **RAW)
    with heads_section:
        build_heads_section(ses, {"model": model_dd, "layer": layer, "head": head, "sampling": sampling,
                                  "explore_group": explore_group,
                                  "redraw": dict(fn=redraw_view, inputs=redraw_inputs, outputs=redraw_outputs),
                                  "default_model": DEFAULT_MODEL, "layer_choices": layer_choices(cfg.n_layers)})
    return {"model": model_dd, "state_outputs": state_outputs, "screen": screen, "display_inputs": display_inputs,
            "no_probs": NO_PROBS}
