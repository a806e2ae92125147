"""The Circuits tab: its layout, its API endpoints and its page events (handlers in ui/circuits.py).

Four sections, each a method of the session's `circuits` part (lab/circuits.py): direct logit attribution
at the token selected in Explore, head composition (Compute with progress and Stop, a Q/K/V choice), one
head's OV and QK circuits, and attribution patching beside exact patching (Run with progress and Stop).
Each section's numbers download as CSV or JSON (the lab's exports).

`build_circuits_tab` lays the tab out and binds nothing: app.py calls it inside the page's tabs, then
`bind_circuits_api` after the other endpoints (/dla, /composition, /circuits, /atp come after them, so the
earlier endpoints keep their numbers) and `bind_circuits_tab` with the other page-only events.

The maps are linked with the rest of the page through assets/explore.js and hidden buttons, as the head-role
overview is. A head's cell of the DLA map carries [layer, head]: the page selects that head in Explore (the
hidden #pick_head) and presses #circuits_dla_pick, which outlines it and opens Explore's Inside one cell on it at
the selected token. A cell of a composition map carries [layer, head, layer, head] (a pair of the strongest-pairs
list is read from its text): the later head goes to #pick_head, the pair to #circuits_pair_pick, which puts the
earlier head in One head's circuits, draws them and names the pair.
"""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from lab import patching
from lab.catalogue.models import DEFAULT_MODEL
from lab.circuits import ATP_TOP, MAX_ATP_TOP, METHODS
from lab.limits import CONCURRENCY

from .circuits import (
    NO_ATP, NO_COMPOSITION, NO_DLA, NO_HEAD_CIRCUITS, atp_api, circuits_api, composition_api, composition_kind,
    dla_api, download_circuits, inside_for_head, job_progress_html, open_dla_head, open_pair, run_atp,
    run_composition, show_circuits, show_dla, stop_circuits,
)
from .common import RAW, api_example, message_plot
from .patching import DIRECTION_LABELS, METRIC_LABELS

CIRCUITS_INTRO = ("**Circuits**: where a prediction comes from, by four methods of the circuits papers. Direct logit "
         "attribution splits a logit into each head's and MLP's direct share; composition scores say which earlier "
         "head feeds which later one; a head's OV and QK circuits say what it writes and where it looks; "
         "attribution patching estimates every patching effect from one backward pass, checked against the exact "
         "sweep. Details in the Learn tab.")
PROMPT_A = "anna found the key . she gave it to tom because he asked"
PROMPT_B = "tom found the key . he gave it to anna because she asked"
ANSWERS = ("her", "him")  # what tells the two prompts' continuations apart (ui/patching.py PAIR_ANSWERS)
KIND_LABELS = {"q": "Q", "k": "K", "v": "V"}
DLA_CLICK = ("Red adds to the answer, blue takes away. **Click a head's cell** to open that head in Explore and in "
             "its Inside one cell panel, at the selected token.")
COMPOSITION_CLICK = ("**Click a cell** (or a pair of the list) to open both heads: the later head, which reads, "
                     "in Explore; the earlier head, which writes, in One head's circuits below.")
# what the page reads a clicked cell from (assets/explore.js puts it in window.decoderLab)
READ_PICK = "(...a) => { a[1] = window.decoderLab ? window.decoderLab.{key} : ''; return a; }"


def _progress_row(prefix: str, label: str, c: SimpleNamespace) -> None:
    with gr.Row(equal_height=True):
        setattr(c, f"{prefix}_run", gr.Button(label, variant="primary", elem_id=f"circuits_{prefix}_run", scale=0,
                                              min_width=160))
        setattr(c, f"{prefix}_stop", gr.Button("Stop", variant="stop", elem_id=f"circuits_{prefix}_stop", scale=0,
                                               min_width=90))
        with gr.Column(scale=4, min_width=200):
            setattr(c, f"{prefix}_progress", gr.HTML(job_progress_html(None), elem_id=f"circuits_{prefix}_progress"))


def build_circuits_tab() -> SimpleNamespace:
    """Lay out the tab (call inside its gr.Tab); binds no event."""
    c = SimpleNamespace()
    gr.Markdown(CIRCUITS_INTRO, elem_classes="lab-intro")
    box = dict(lines=1, max_lines=1, min_width=110)
    with gr.Column(elem_id="circuits_dla_section"), gr.Group():
        gr.Markdown("### Direct logit attribution at the selected token")
        with gr.Row(equal_height=True):
            c.dla_answer = gr.Textbox("", label="Answer token (blank: the model's prediction)",
                                      elem_id="circuits_dla_answer", **box)
            c.dla_other = gr.Textbox("", label="minus the logit of (blank: none)", elem_id="circuits_dla_other", **box)
            c.dla_run = gr.Button("Attribute", variant="primary", elem_id="circuits_dla_run", scale=0, min_width=140)
        c.dla_note = gr.Markdown("", elem_id="circuits_dla_note")
        gr.Markdown(DLA_CLICK, elem_id="circuits_dla_hint")
        c.dla_plot = gr.Plot(message_plot(NO_DLA), show_label=False, elem_id="circuits_dla")
        c.dla_link = gr.Markdown("", elem_id="circuits_dla_link")
    with gr.Column(elem_id="circuits_composition_section"), gr.Group():
        gr.Markdown("### Head composition")
        c.kind = gr.Radio([(label, k) for k, label in KIND_LABELS.items()], value="k", label="Kind",
                          elem_id="circuits_kind")
        _progress_row("composition", "Compute", c)
        c.composition_note = gr.Markdown("", elem_id="circuits_composition_note")
        gr.Markdown(COMPOSITION_CLICK, elem_id="circuits_composition_hint")
        c.pair_note = gr.Markdown("", elem_id="circuits_pair_note")
        with gr.Row():
            with gr.Column(scale=3, min_width=300):
                c.composition_plot = gr.Plot(message_plot(NO_COMPOSITION), show_label=False,
                                             elem_id="circuits_composition")
            with gr.Column(scale=1, min_width=220):
                c.pairs = gr.Markdown("", elem_id="circuits_pairs")
    with gr.Column(elem_id="circuits_head_section"), gr.Group():
        gr.Markdown("### One head's circuits")
        with gr.Row(equal_height=True):
            c.layer = gr.Number(0, label="Layer", precision=0, elem_id="circuits_layer", min_width=90)
            c.head = gr.Number(0, label="Head", precision=0, elem_id="circuits_head", min_width=90)
            c.head_run = gr.Button("Open", variant="primary", elem_id="circuits_head_run", scale=0, min_width=120)
        c.head_note = gr.Markdown("", elem_id="circuits_head_note")
        with gr.Row():  # side by side, one under the other on a phone
            with gr.Column(min_width=300):
                c.ov_plot = gr.Plot(message_plot(NO_HEAD_CIRCUITS), show_label=False, elem_id="circuits_ov")
            with gr.Column(min_width=300):
                c.spectrum_plot = gr.Plot(message_plot(""), show_label=False, elem_id="circuits_spectrum")
        c.qk_plot = gr.Plot(message_plot(""), show_label=False, elem_id="circuits_qk")
    with gr.Column(elem_id="circuits_atp_section"), gr.Group():
        gr.Markdown("### Attribution patching beside exact patching")
        with gr.Row(equal_height=True):
            c.prompt_a = gr.Textbox(PROMPT_A, label="Prompt A (clean)", elem_id="circuits_prompt_a", scale=2)
            c.prompt_b = gr.Textbox(PROMPT_B, label="Prompt B (corrupted)", elem_id="circuits_prompt_b", scale=2)
        with gr.Row(equal_height=True):
            c.metric = gr.Radio([(METRIC_LABELS[m], m) for m in patching.METRICS], value="logit_diff",
                                label="Metric at the last position", elem_id="circuits_metric", scale=2, min_width=200)
            c.answer = gr.Textbox(ANSWERS[0], label="Answer token", elem_id="circuits_answer", **box)
            c.other = gr.Textbox(ANSWERS[1], label="minus the logit of", elem_id="circuits_other", **box)
            c.what = gr.Dropdown([(label, key) for key, label in patching.SWEEPS.items()], value="heads",
                                 label="What to patch", elem_id="circuits_what", scale=2, min_width=180)
            c.direction = gr.Radio([(DIRECTION_LABELS[d], d) for d in patching.DIRECTIONS], value="denoising",
                                   label="Direction", elem_id="circuits_direction", scale=2, min_width=200)
            c.k = gr.Number(ATP_TOP, label=f"Cells re-run exactly (1–{MAX_ATP_TOP})", precision=0,
                            elem_id="circuits_k", min_width=120)
        _progress_row("atp", "Run attribution patching", c)
        c.atp_note = gr.Markdown("", elem_id="circuits_atp_note")
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                c.scatter_plot = gr.Plot(message_plot(NO_ATP), show_label=False, elem_id="circuits_atp_scatter")
            with gr.Column(scale=2, min_width=300):
                c.maps_plot = gr.Plot(message_plot(""), show_label=False, elem_id="circuits_atp_maps")
    with gr.Accordion("Download the numbers", open=False, elem_id="circuits_numbers"), gr.Row():
        c.method = gr.Radio([(label, key) for key, label in METHODS.items()], value="dla", label="Of",
                            elem_id="circuits_method", scale=2, min_width=200)
        c.fmt = gr.Radio(["csv", "json"], value="csv", label="As", elem_id="circuits_fmt", scale=1, min_width=120)
        c.download = gr.Button("Download", elem_id="circuits_download", scale=0, min_width=120)
        c.file = gr.File(label="Numbers", elem_id="circuits_file", interactive=False, height=90, scale=2)
    # what a click on a map sends (assets/explore.js fills window.decoderLab, then presses the button)
    c.pick_value = gr.Textbox(visible=False)
    c.dla_pick = gr.Button("pick", elem_id="circuits_dla_pick", elem_classes="lab-hidden")
    c.pair_pick = gr.Button("pick pair", elem_id="circuits_pair_pick", elem_classes="lab-hidden")
    return c


API_EXAMPLES = {
    "dla": (" tom", " anna", None),
    "composition": (DEFAULT_MODEL,),
    "circuits": (1, 2),
    "atp": (DEFAULT_MODEL, PROMPT_A, PROMPT_B, "logit_diff", *ANSWERS, "heads", "denoising", 5),
}


def bind_circuits_api(ses: gr.State) -> None:
    """The hidden components and events of /dla, /composition, /circuits and /atp, in that order (call after
    the page's other endpoints)."""
    handlers = {"dla": dla_api, "composition": composition_api, "circuits": circuits_api, "atp": atp_api}
    lanes = {"dla": "tools", "composition": "patch", "circuits": "tools", "atp": "patch"}
    for name, examples in API_EXAMPLES.items():
        boxes = [gr.Number(visible=False, precision=0) if isinstance(e, int) or e is None else gr.Textbox(visible=False)
                 for e in examples]
        for box, example in zip(boxes, examples):
            api_example(box, example)
        answer = gr.JSON(visible=False)
        gr.Button(visible=False).click(handlers[name], [ses, *boxes], answer, api_name=name,
                                       concurrency_limit=CONCURRENCY[lanes[name]], concurrency_id=lanes[name], **RAW)


def bind_circuits_tab(ses: gr.State, c: SimpleNamespace, model_dd, inside: SimpleNamespace | None = None) -> None:
    """The tab's page-only events (no API names; call after every endpoint). `model_dd`: Explore's model menu,
    the model composition and attribution patching read. `inside`: Explore's Inside one cell panel
    (ui/inside_tab.build_inside_section's namespace), which a click on a DLA head opens on that head; without
    it the click only selects the head in Explore."""
    quiet = dict(api_name=False, show_progress="hidden", **RAW)
    read_head = READ_PICK.replace("{key}", "circuitsHead")
    c.dla_pick.click(open_dla_head, [ses, c.pick_value], [c.dla_plot, c.dla_link], js=read_head, **quiet)
    if inside is not None:  # a second listener of the same click: the panel is drawn beside the map
        c.dla_pick.click(inside_for_head, [ses, c.pick_value, inside.matrices_open],
                         [inside.panel, inside.header, inside.table, *inside.plots, inside.layer, inside.head,
                          inside.query, inside.key, inside.matrices], js=read_head, **quiet)
    c.pair_pick.click(open_pair, [ses, c.pick_value],
                      [c.layer, c.head, c.pair_note, c.composition_plot, c.head_note, c.ov_plot, c.spectrum_plot,
                       c.qk_plot], js=READ_PICK.replace("{key}", "circuitsPair"), **quiet)
    # a new map: the line about a head or a pair opened from the last one goes (on the page, no round trip)
    for run, line in ((c.dla_run, c.dla_link), (c.composition_run, c.pair_note)):
        run.click(None, None, line, js="() => ''", queue=False, api_name=False)
    c.dla_run.click(show_dla, [ses, c.dla_answer, c.dla_other], [c.dla_plot, c.dla_note], **quiet)
    c.composition_run.click(run_composition, [ses, model_dd, c.kind],
                            [c.composition_progress, c.composition_note, c.composition_plot, c.pairs], **quiet)
    c.composition_stop.click(stop_circuits, ses, c.composition_progress, api_name=False, queue=False, **RAW)
    c.kind.input(composition_kind, [ses, c.kind], [c.composition_plot, c.pairs], **quiet)
    c.head_run.click(show_circuits, [ses, c.layer, c.head], [c.head_note, c.ov_plot, c.spectrum_plot, c.qk_plot],
                     **quiet)
    c.atp_run.click(run_atp, [ses, model_dd, c.prompt_a, c.prompt_b, c.metric, c.answer, c.other, c.what,
                              c.direction, c.k], [c.atp_progress, c.atp_note, c.scatter_plot, c.maps_plot], **quiet)
    c.atp_stop.click(stop_circuits, ses, c.atp_progress, api_name=False, queue=False, **RAW)
    c.download.click(download_circuits, [ses, c.method, c.fmt], c.file, **quiet)
