"""The "Inside one cell" panel of the Explore tab: its layout and events (handlers in ui/inside.py).

It lies under the attention and the text, closed: a closed panel draws nothing. It opens on a click
on a cell of the attention figure or on an entry of the head's matrices (assets/explore.js puts
"layer,head,query,key" in `decoderLab.cell` and presses the hidden #pick_cell), on "Use the selected
token", or by hand (its header); the four boxes name the cell and can be typed in. While it is open
the page asks for it again when the text changes (#inside_refresh). "The whole head as matrices"
inside it is drawn only while that section is open too.

The events are bound after every other event of the page (app.py): they have no API names, and the
numbers gradio gives the API's endpoints stay as they were.
"""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from lab.checks import UserError

from .common import RAW, handler, message_plot
from .explore import colour_caption
from .inside import CLOSED, download_cell, draw_matrices, head_matrices, open_panel, pick_cell, selected_token

ROW_HINT = ("Each figure names its formula; hover any bar or cell for its numbers. Columns: "
            "**1** what the head reads, **2** the query and the key, **3** their dot product; "
            "**4** the whole row through the softmax, **5** the values it averages, **6** what each head adds.")
MATRICES_NOTE = "Open this to see the head's Q, K, V and QKᵀ; a click on an entry works that cell through above."


def build_inside_section(views: dict) -> SimpleNamespace:
    """Lay out the panel (call inside the Explore tab, under its main row). `views`: the Explore's
    Layer and Head menus (the panel starts from the head they show)."""
    s = SimpleNamespace(view_layer=views["layer"], view_head=views["head"], views=views)
    with gr.Accordion("Inside one cell: how an attention weight is computed", open=False,
                      elem_id="inside") as s.panel:
        with gr.Row(elem_id="inside_controls", equal_height=True):
            # text boxes, not number boxes: a blank number box reads 0, and blank means "no cell yet"
            box = dict(lines=1, max_lines=1, min_width=80)
            s.layer = gr.Textbox("", label="Layer", elem_id="inside_layer", **box)
            s.head = gr.Textbox("", label="Head", elem_id="inside_head", **box)
            s.query = gr.Textbox("", label="Query i", elem_id="inside_query", **box)
            s.key = gr.Textbox("", label="Key j", elem_id="inside_key", **box)
            s.selected = gr.Button("Use the selected token", elem_id="inside_selected", min_width=160)
        s.header = gr.Markdown(CLOSED, elem_id="inside_header")
        gr.Markdown(ROW_HINT, elem_id="inside_hint")
        with gr.Row(elem_id="inside_figures"):
            with gr.Column(min_width=300):
                s.plots = [gr.Plot(message_plot(""), show_label=False, elem_id=f"inside_{name}")
                           for name in ("inputs", "qk", "products")]
            with gr.Column(min_width=300):
                s.plots += [gr.Plot(message_plot(""), show_label=False, elem_id=f"inside_{name}")
                            for name in ("softmax", "values", "heads")]
        with gr.Row(equal_height=True):
            s.table = gr.Markdown("", elem_id="inside_numbers")
            with gr.Column(min_width=240, scale=0):
                s.fmt = gr.Radio(["csv", "json"], value="csv", label="The cell's numbers as", elem_id="inside_fmt")
                s.download = gr.Button("Download the cell's numbers", elem_id="inside_download")
                s.file = gr.File(label="Numbers", elem_id="inside_file", interactive=False, height=90)
        with gr.Accordion("The whole head as matrices: Q, K, V and QKᵀ", open=False,
                          elem_id="inside_matrices_section") as s.matrices_panel:
            s.matrices = gr.Plot(message_plot(MATRICES_NOTE), show_label=False, elem_id="inside_matrices")
    # outside the panel: a closed accordion leaves its contents out of the page
    s.matrices_open = gr.Checkbox(False, visible=False)
    s.cell = gr.Textbox(visible=False)
    s.pick = gr.Button("pick cell", elem_id="pick_cell", elem_classes="lab-hidden")
    s.refresh = gr.Button("refresh cell", elem_id="inside_refresh", elem_classes="lab-hidden")
    return s


def bind_inside_section(ses: gr.State, s: SimpleNamespace) -> None:
    """The panel's events (call after the page's other events)."""
    numbers = [s.layer, s.head, s.query, s.key]
    drawn = [s.header, s.table, *s.plots, *numbers]
    quiet = dict(api_name=False, show_progress="hidden", **RAW)
    matrices = dict(fn=_matrices_if_open, inputs=[ses, s.matrices_open, *numbers], outputs=s.matrices, **quiet)
    s.panel.expand(open_panel, [ses, *numbers, s.view_layer, s.view_head], drawn, **quiet).then(**matrices)
    for box in numbers:
        box.submit(open_panel, [ses, *numbers, s.view_layer, s.view_head], drawn, **quiet).then(**matrices)
    s.selected.click(selected_token, [ses, s.layer, s.head, s.query, s.view_layer, s.view_head], drawn, **quiet).then(
        **matrices)
    s.refresh.click(selected_token, [ses, s.layer, s.head, s.query, s.view_layer, s.view_head], drawn, **quiet).then(
        **matrices)
    s.pick.click(pick_cell, [ses, s.cell], [s.panel, *drawn],
                 js="(...a) => { a[1] = window.decoderLab ? window.decoderLab.cell : ''; return a; }",
                 **quiet).then(**matrices)
    s.download.click(download_cell, [ses, s.fmt, *numbers], s.file, **quiet)
    # the line above the attention says what the colour menu's colours are (value-weighted or weights)
    v = s.views
    v["colour"].change(colour_caption, [ses, v["colour"], v["model"], v["layer"], v["head"], v["view"]], v["caption"],
                       **quiet)
    s.matrices_panel.expand(None, None, s.matrices_open, js="() => true").then(
        draw_matrices, [ses, *numbers], s.matrices, **quiet)
    s.matrices_panel.collapse(None, None, s.matrices_open, js="() => false")


@handler(exclusive=False)
def _matrices_if_open(session, is_open, layer, head, query, key, request: gr.Request = None):
    """The matrices again for the cell just drawn, only while their section is open (`is_open`, which the
    page keeps)."""
    if not isinstance(is_open, bool):
        raise UserError("Whether the matrices are open must be true or false.")
    return head_matrices(session, layer, head, query, key) if is_open else gr.skip()
