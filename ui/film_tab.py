"""The training film's section of the Train tab: a scrubber over the frames a training recorded
(attention on the probe prompt, the loss, every head's score), a player, and the phase sentences.

Built-in models carry the film the CLI recorded when it made them, so a visitor can scrub one
without training; a model trained here records its own, frame by frame, while it trains.
"""

from __future__ import annotations

import gradio as gr

from lab.catalogue.models import DEFAULT_MODEL
from lab.limits import CONCURRENCY
from lab.session import Session

from .common import RAW
from .film import (
    film_choices, film_opening, follow_model, next_frame, open_film, redraw_film, save_film_page, score_choices,
    score_names, show_film,
)

INTRO = ("### Training film\nWatch attention form while a model learns. Each frame is the attention of every head "
         "on the probe prompt at one training step (denser early, where most changes), with the loss and each "
         "head's score at that step. The scores are defined in the Learn tab; hover a curve for its value.")


def build_film_section(ses: gr.State, model_dd: gr.Dropdown, first: Session, tab: gr.Tab) -> None:
    """Lay out the film section (inside the Train tab, `tab`) and bind its events. It shows the film
    of the model chosen in "Film of", which follows Explore's model list."""
    film = first.film(DEFAULT_MODEL)
    n = len(film.frames) if film is not None else 1
    layers = len(film.frames[0].attention) if film is not None and film.frames else 1
    first_layer, first_score = film_opening(film)  # where the default model's film changes most
    gr.Markdown(INTRO, elem_id="film_intro")
    with gr.Row(equal_height=True):
        film_model = gr.Dropdown(first.model_names(), value=DEFAULT_MODEL, label="Film of", elem_id="film_model",
                                 scale=2)
        film_layer = gr.Dropdown([(f"layer {i}", i) for i in range(layers)], value=first_layer, label="Layer",
                                 elem_id="film_layer", scale=1)
        film_score = gr.Dropdown(score_choices(score_names(film), film), value=first_score, label="Head score",
                                 elem_id="film_score", scale=2)
        play = gr.Button("▶ Play / ❚❚ Pause", elem_id="film_play", scale=1)
    frame = gr.Slider(0, max(1, n - 1), value=n - 1, step=1, label="Frame (drag to scrub through training)",
                      elem_id="film_frame")
    caption = gr.Markdown(elem_id="film_caption")
    with gr.Row():
        film_attention = gr.Plot(show_label=False, elem_id="film_attention")
        with gr.Column():
            film_loss = gr.Plot(show_label=False, elem_id="film_loss")
            film_scores = gr.Plot(show_label=False, elem_id="film_scores")
    phases = gr.Markdown(elem_id="film_phases")
    with gr.Row():
        page_btn = gr.Button("Save this film as a web page", elem_id="film_page_btn", scale=1, min_width=200)
        page_file = gr.File(label="Film page (opens offline)", elem_id="film_page", interactive=False, scale=2,
                            height=90)
    timer = gr.Timer(0.7, active=False)
    playing = gr.State(False)

    frame_inputs = [ses, film_model, frame, film_layer, film_score]
    frame_outputs = [film_attention, film_loss, film_scores, phases, caption]
    group = dict(concurrency_limit=CONCURRENCY["explore"], concurrency_id="film", show_progress="hidden", **RAW)
    # The API's /film: one frame of a model's film (an invisible button: the same handler).
    gr.Button(visible=False).click(show_film, frame_inputs, frame_outputs, api_name="film", **group)
    for control in (frame, film_layer, film_score):
        control.change(redraw_film, frame_inputs, frame_outputs, api_name=False, trigger_mode="always_last", **group)
    film_model.change(open_film, [ses, film_model], [frame, film_layer, film_score], api_name=False,
                      **RAW).then(show_film, frame_inputs, frame_outputs, api_name=False, **group)
    # a saved page is one model's film at one layer: it leaves the box when either changes
    for control in (film_model, film_layer):
        control.change(lambda: None, None, page_file, api_name=False, queue=False, show_progress="hidden")
    # The film follows Explore's model: a model trained here is shown as soon as its run ends.
    model_dd.change(follow_model, [ses, model_dd], film_model, api_name=False, **RAW)
    film_model.focus(film_choices, [ses, film_model], film_model, api_name=False, **RAW)  # a run's model, mid-run
    # drawn when the tab is shown, never while it is hidden (a hidden plot is laid out at the wrong width)
    tab.select(show_film, frame_inputs, frame_outputs, api_name=False, **group)
    play.click(lambda on: (not on, gr.Timer(active=not on)), playing, [playing, timer], api_name=False, queue=False)
    page_btn.click(save_film_page, [ses, film_model, film_layer], page_file, api_name="export_film_page", **group)
    timer.tick(next_frame, [ses, film_model, frame], frame, api_name=False, **group)
