"""What the Explore page draws after an action (Step, Generate, Undo, Reset): one `Shown`.

(Named so as not to be taken for a training film's frame, model.film.Frame.) A Shown holds every number
and word of the text, the next-token chart and the attention figure for the view asked for, read off the
model's own results once, so the wiring draws it with viz without coming back to the lab. Under the head
tools' change (heads ablated, a row edited) the attention, its badges and its caption are the ones the
model computes under that change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from model.generate import Step

from model.inside import run_forward, value_weighted

from . import captions, headsettings
from .display import Display, View
from .roles import HeadRoles, compute_head_roles
from .server.files import file_name, model_stem
from .text import Attention, Probabilities, Text


@dataclass(frozen=True)
class Shown:
    """One action's result, as the page draws it.

    step: the token this action added (None when it added none). undone: Undo took a token back.
    complete: the figures' numbers are here (False for the tokens a Generate streams before its
    last, and for actions called without a view). tokens, status: the text and the lines under it.
    probs: the distribution the last token was drawn from (None: no text, or only its first token,
    whose piece is `first_token`). attention: the window's attention as drawn (under the change
    `change` names, '' for none); view, badges (head → its role and change) and caption go with it.
    value_weighted: with the colour "value", ‖a_ij · v_j W_O‖ (H, T, T) of each layer the view draws
    (None for the others; lab.inside), under the same change as the attention.
    The display sizes lay the figures out; `stem` is the model's name in file names, `attention_file`
    and `probs_file` the two figures' download names.
    """

    step: Step | None = None
    undone: bool = False
    complete: bool = False
    tokens: list[tuple[str, str]] = field(default_factory=list)
    status: str = ""
    probs: Probabilities | None = None
    first_token: str | None = None
    attention: Attention | None = None
    change: str = ""
    view: View | None = None
    badges: dict[int, str] = field(default_factory=dict)
    caption: str | None = None
    presentation: bool = False
    colour: str = "linear"
    plot_width: int = 0
    plot_height: int = 0
    chart_height: int = 0
    stem: str = "model"
    attention_file: str = ""
    probs_file: str = ""
    value_weighted: list | None = None


def shown_attention(text: Text, settings: headsettings.ProbeSettings) -> tuple[Attention | None, str]:
    """The attention the Explore figure draws, and the change it is drawn under in a few words ('' for
    none): the model's own attention on the text, or, while the head tools ablate heads or edit a row,
    the attention the model computes under that change."""
    att = text.attention()
    changed = headsettings.changed_attention(text, settings) if att is not None else None
    if changed is None:
        return att, ""
    return (Attention(changed[0], changed[1], att.tokens, att.causal),
            captions.change_mark(settings, text.decoder.start))


def drawn_caption(text: Text, att: Attention, change: str, view: View) -> str:
    """The line above the attention drawn (plain text), true of the numbers drawn."""
    return captions.caption(text.entry, att.weights, att.scores, att.tokens, text.decoder.window, view.layer,
                            view.head, view.view, change=change, heads=view.heads)


def make_shown(text: Text, settings: headsettings.ProbeSettings, *, display: Display, view: View | None,
               roles: Callable[[], HeadRoles | None], told: list[str] = (), step: Step | None = None,
               undone: bool = False) -> Shown:
    """The Shown of the text as it is now; with `view`, complete with the figures' numbers
    (`roles`: the heads' roles on the text as the model computed it, asked for only when drawn)."""
    tokens, status = text.tokens(), text.status(told)
    stem = model_stem(text.entry.name) if text.entry is not None else "model"
    if view is None or text.decoder is None:
        return Shown(step=step, undone=undone, complete=view is not None, tokens=tokens, status=status, view=view,
                     stem=stem, presentation=display.presentation, colour=display.colour,
                     plot_width=display.plot_width, plot_height=display.plot_height,
                     chart_height=display.chart_height)
    probs = text.probabilities()
    att, change = shown_attention(text, settings)
    # under a change, the panels' role badges are read off the attention drawn
    drawn_roles = (compute_head_roles(text.entry, text.decoder.window, att.weights, att.tokens)
                   if change else roles())
    badges = headsettings.badges(text, settings, view.layer, drawn_roles)
    heads = view.head if view.head is not None else "all" if view.heads is None else f"{view.heads[0]}-{view.heads[-1]}"
    which = "all-layers" if view.view == "all layers" else f"L{view.layer}H{heads}"
    return Shown(step=step, undone=undone, complete=True, tokens=tokens, status=status, probs=probs,
                 first_token=tokens[0][0] if probs is None else None, attention=att, change=change, view=view,
                 badges=badges, caption=drawn_caption(text, att, change, view), presentation=display.presentation,
                 colour=display.colour, plot_width=display.plot_width, plot_height=display.plot_height,
                 chart_height=display.chart_height, stem=stem,
                 attention_file=file_name(stem, which, f"attention {view.view}", f"{len(att.tokens)} tokens"),
                 probs_file="" if probs is None else file_name(stem, f"pos{probs.index}", "probabilities"),
                 value_weighted=drawn_value_weighted(text, settings, view)
                 if display.colour == "value" and view.view != "scores" else None)


def drawn_value_weighted(text: Text, settings: headsettings.ProbeSettings, view: View) -> list:
    """‖a_ij · v_j W_O‖ of the layers the view draws (every layer for "all layers"), None for the others."""
    text.entry.require("value")
    model, window = text.entry.model, text.decoder.window
    iv = headsettings.window_intervention(text, settings)  # the head tools' change, as the attention drawn
    forward = run_forward(model, window, iv)
    drawn = range(model.cfg.n_layers) if view.view == "all layers" else [view.layer]
    out: list = [None] * model.cfg.n_layers
    for layer in drawn:
        out[layer] = value_weighted(model, window, layer, iv, forward=forward)
    return out
