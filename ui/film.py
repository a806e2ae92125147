"""The training film's handlers: one frame of a model's film (attention of a layer on the probe
prompt at that step, the loss curve and the head-score curves with that step marked), the
phase sentences, and the player's next frame."""

from __future__ import annotations

import html
import re

import gradio as gr
import numpy as np

import viz
from lab.checks import UserError, check_choice, check_int, check_text
from lab.export import model_stem
from lab.limits import HEAD_ROLES as ROLES
from lab.session import Session

from .common import handler, named
from .plots import to_plot

NO_FILM = ("This model has no training film: a training in this tab records one, and `python -m model.film` "
           "makes one from a series of saved checkpoints.")
MATCH = "match"


def plain(text: str) -> str:
    """A person's own text for a Markdown component, shown as typed: no HTML, no links, no emphasis."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|~])", r"\\\1", html.escape(text, quote=False))


def score_names(film) -> list[str]:
    """The scores a film offers (keys of model.heads.ROLES): the head roles, and the model's own task
    role ("match": sort match, copy match, pronoun → name) where its corpus has one."""
    names = list(ROLES)
    return names + [MATCH] if film is not None and film.match_keys() is not None else names


def score_choices(names: list[str], film=None) -> list[tuple[str, str]]:
    """The score menu: (what a learner reads, score key); the task role under its own name."""
    return [(film.role(n).name if film is not None else ROLES[n].name, n) for n in names]


def film_opening(film) -> tuple[int, str]:
    """(layer, score) a film opens on: those of the head whose score changes most over the film
    (`Film.largest_change`, from its frames); the last layer and previous-token for a film without one."""
    found = film.largest_change() if film is not None and film.frames else None
    if found is None:
        layers = len(film.frames[0].attention) if film is not None and film.frames else 1
        return layers - 1, "previous_token"
    score, layer, _, _ = found
    return layer, score


def film_figure_px(display) -> int:
    """The width of the film's loss and score figures: beside the attention on a wide page, the page's
    width on a phone. Kept a little short, so what is laid out for it fits."""
    return int(max(240, display.width - 64 if display.narrow else display.width * 0.45))


def loss_plot_px(display) -> int:
    """The width of the film's loss plot (the figure less its margins), for its phase labels."""
    return film_figure_px(display) - (90 if display.presentation else 70)


def loss_words(film, fr, sep: str = " · ") -> str:
    """A frame's losses named by what they were measured on ("train loss 2.31 · validation loss 2.40"; a
    film from a checkpoint series: "loss on the probe 6.79 · held-out loss 4.74")."""
    names = [n if "loss" in n else f"{n} loss" for n in film.loss_names()]
    return f"{names[0]} {fr.train_loss:.2f}" + (f"{sep}{names[1]} {fr.val_loss:.2f}" if fr.val_loss is not None else "")


def film_frame(session: Session, model_name, frame, layer, score) -> tuple:
    """(attention, loss, scores, phases markdown, caption) of one frame of the model's film."""
    film = session.film(model_name)
    if film is None or not film.frames:  # one line says so, and the last film's figures leave the page
        return None, None, None, "", NO_FILM
    n = len(film.frames)
    i = check_int("frame", frame, 0, max(0, n - 1)) if frame is not None else n - 1
    fr = film.frames[i]
    n_layers = len(fr.attention)
    layer = check_int("layer", layer, 0, n_layers - 1)
    score = check_choice("score", score, score_names(film))
    large = session.display.presentation
    steps = film.steps()
    scores = film.scores()[score]
    role = film.role(score)
    top = film.head_of_largest_change(score, layer)  # the head of this layer whose curve moves most
    value = np.nan if top is None else scores[i, layer, top]
    badges = {} if np.isnan(value) else {top: f"{role.name} {value:.2f}"}
    attention = viz.attention_view(
        fr.attention, None, film.probe_tokens, layer=layer, head=None, view="weights", causal=True,
        overview_max_tokens=48, width_px=min(session.display.plot_width, 760),
        max_height_px=max(420, session.display.screen_height - 120),
        presentation=large, title_prefix=f"Step {fr.step} of {film.total_steps} · ", badges=badges)
    phases = film.phases()
    highlight = None if top is None else (layer, top)
    curves = viz.score_curves(steps, scores, score=role.name, formula=role.formula, threshold=role.threshold,
                              marker_step=fr.step, highlight=highlight,
                              phases=[(p.layer, p.head, p.step) for p in phases if p.score == score],
                              presentation=large, height_px=460 if large else 400, total_steps=film.total_steps,
                              width_px=film_figure_px(session.display))
    train_loss = np.array([f.train_loss for f in film.frames], dtype=np.float32)
    val = [(f.step, f.val_loss) for f in film.frames if f.val_loss is not None]
    loss = viz.loss_curve(steps.astype(np.float32), train_loss, np.array([s for s, _ in val], dtype=np.float32),
                          np.array([v for _, v in val], dtype=np.float32), total_steps=film.total_steps,
                          marker_step=fr.step, phase_steps=[(p.step, f"L{p.layer}H{p.head}") for p in phases],
                          presentation=large, plot_px=loss_plot_px(session.display), names=film.loss_names())
    lines = "\n".join(f"- {p.sentence()}" for p in phases) or "- No head changed its role sharply in this run."
    caption = (f"Frame {i + 1} of {n}: step {fr.step} of {film.total_steps} · {loss_words(film, fr)}"
               + f" · probe: “{plain(session.film_probe_text(model_name)[:80])}”")
    stem = (model_stem(model_name), "film", f"step{fr.step}")
    return (to_plot(named(attention, *stem, f"L{layer}", "attention")),
            to_plot(named(loss, *stem, "loss")), to_plot(named(curves, *stem, score)),
            "**What changed, and when**\n" + lines, caption)


@handler
def show_film(session, model_name, frame, layer, score, request: gr.Request = None):
    """One frame of the film of `model_name` (a built-in's, or one trained or uploaded here)."""
    return film_frame(session, model_name, frame, layer, score)


def outside(value, n: int) -> bool:
    """Whether `value` is a whole number that is not one of 0 … n-1 (a frame or layer of another film)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer()
            and not 0 <= value < n)


@handler
def redraw_film(session, model_name, frame, layer, score, request: gr.Request = None):
    """`show_film` for the page's own frame, layer and score controls. When another model's film opens,
    `open_film` sets all three and each one's change is sent, one of them while another still holds the
    last film's value: a frame or a layer this film lacks. That draw is left out (the opening draws the
    new film right after); any other value is checked as `show_film` checks it."""
    film = session.film(model_name)
    if film is not None and film.frames and (outside(frame, len(film.frames))
                                             or outside(layer, len(film.frames[0].attention))):
        return gr.skip()
    return film_frame(session, model_name, frame, layer, score)


@handler
def open_film(session, model_name, request: gr.Request = None):
    """A model was picked for the film: the slider spans its frames and starts at the last; the layer
    and score are those whose change over the film is largest (`film_opening`). A model without a film (or
    with one frame) leaves the controls still: a slider needs two ends (gradio refuses 0 … 0)."""
    film = session.film(model_name)
    n = len(film.frames) if film is not None else 0
    layers = len(film.frames[0].attention) if n else 1
    layer, score = film_opening(film)
    return (gr.update(minimum=0, maximum=max(1, n - 1), value=max(0, n - 1), step=1, interactive=n > 1),
            gr.update(choices=[(f"layer {i}", i) for i in range(layers)], value=layer, interactive=n > 0),
            gr.update(choices=score_choices(score_names(film), film), value=score, interactive=n > 0))


@handler(exclusive=False)
def follow_model(session, model_name, request: gr.Request = None):
    """Explore's model changed (picked, trained or uploaded): the film section offers every model of
    the session (one in training too) and shows `model_name`'s."""
    check_text("model", model_name)
    names = session.model_names()
    return gr.update(choices=names, value=model_name if model_name in names else names[0])


@handler(exclusive=False)
def film_choices(session, model_name, request: gr.Request = None):
    """The list was opened: it offers every model of the session (one in training too). The value is
    left as the page has it, so an answer that comes after the person picked a model never takes
    their pick back; only a model that left the list is replaced."""
    check_text("model", model_name, optional=True)
    names = session.model_names()
    return gr.update(choices=names) if model_name in names else gr.update(choices=names, value=names[0])


@handler(exclusive=False)
def next_frame(session, model_name, frame, request: gr.Request = None):
    """The player's tick: the next frame, back to the first after the last."""
    film = session.film(model_name)
    if film is None or not film.frames:
        return gr.skip()
    n = len(film.frames)  # a film still recording grows: the slider grows with it
    i = check_int("frame", frame, 0, max(0, n - 1)) if frame is not None else -1
    return gr.update(maximum=max(1, n - 1), value=(i + 1) % n)


@handler
def save_film_page(session, model_name, layer, request: gr.Request = None):
    """The whole film of one layer as one web page with its slider and Play button (offline)."""
    film = session.film(model_name)
    if film is None or not film.frames:
        raise UserError(NO_FILM)
    layer = check_int("layer", layer, 0, len(film.frames[0].attention) - 1)
    frames, captions = [], []
    for fr in film.frames:
        frames.append(viz.attention_view(fr.attention, None, film.probe_tokens, layer=layer, head=None, view="weights",
                                         causal=True, overview_max_tokens=48, width_px=760, max_height_px=560,
                                         title_prefix=f"Step {fr.step} of {film.total_steps} · "))
        captions.append(f"step {fr.step}: {loss_words(film, fr, ', ')}")
    page = viz.film_html(frames, title=f"{model_name}: training film, layer {layer}",
                         steps=[fr.step for fr in film.frames], captions=captions)
    return str(session.save_file(f"{model_stem(model_name)}_film_L{layer}", ".html", page.encode("utf-8")))
