"""The head tools' layout and events: a row of tabs under the Explore page's text and attention.

Head roles (every head's scores on the text, one small overview per score), the logit lens
(the prediction read out after each layer), ablation and attention edits with their effect on
the next token and a side-by-side regeneration, and prompt A against prompt B. They follow the
text: every Step, Generate, Undo, Reset and token click refreshes them (`refresh`).
"""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from lab.heads import ABLATION_MODE_WORDS, ABLATION_MODES, MAX_REGENERATE
from lab.session import HEAD_TOOLS

from .common import RAW, api_example, message_plot
from .pairs import lay_out_pair_helper
from .patching import lay_out_patching
from .heads import (
    NO_SETTINGS, NO_TEXT, REGENERATE_TOKENS, ablate, clear_settings, compare, drop_stale_regeneration, edit_attention,
    head_roles_table, show_tool,
    lens_at, model_changed, pairs_for, pick_head, pick_pair, refresh, regenerate,
)

ROLES_INTRO = ("Every head's scores on the text above, recomputed at each Step: a cell is **outlined** when its "
               "score passes the role's threshold (hover for the formula; a model of a thousand heads or more "
               "shows colours only). Scores say where a head looks, not what it does for the prediction: the "
               "Ablate tab tests that.")
LENS_INTRO = ("The residual stream after each layer, sent through the model's final norm and output head: "
              "what the model would predict if it stopped there. The last row is the model's own distribution. "
              "Click a token in the text to read the lens at that position.")
ABLATE_INTRO = ("Remove heads and see what the next token loses: **zero** drops a head's output, **mean** replaces "
                "it by its mean over the positions, **uniform** makes it attend equally to every allowed key. "
                "Or rewrite one attention row: the selected token's, in the head you choose.")


def build_heads_section(ses: gr.State, ex: dict) -> SimpleNamespace:
    """Lay out the head tools (call inside the Explore tab, under its main row) and bind their events.

    ex: the Explore tab's components ("model", "layer", "head", "sampling", "explore_group",
    "default_model", "layer_choices") and "redraw": the event (fn, inputs, outputs) that draws the
    attention and its caption again, for after the heads' settings change. The components are made,
    and the events bound, in one fixed order: the API page lists the endpoints in that order and
    gradio numbers them (fn_index) by it. Returns the section's components: the Patching part's events
    are bound after every endpoint (ui/patching.py `bind_patching`, from app.py).
    """
    h = SimpleNamespace(ex=ex)  # the section's components, by name, for the helpers below
    with gr.Tabs(elem_id="head_tools"):
        _lay_out_roles_and_lens(h)
        _lay_out_ablate(h)
        _lay_out_compare(h, ex)
    api_example(h.heads, ["L1H0"])
    api_example(h.keep_only, False)
    api_example(h.edit_key, "0")
    api_example(h.edit_head, "L2H3")
    if h.pairs:
        a, b = h.pairs[0][1].split("\u241e")
        api_example(h.prompt_a, a)
        api_example(h.prompt_b, b)
    h.api = [gr.JSON(visible=False) for _ in range(6)]  # the API's own answers, one per endpoint that has one
    h.pick_value = gr.Textbox(visible=False)
    h.index = gr.Number(None, visible=False)

    # After a change of the heads' settings: the attention above is drawn again under them (it says so), and a
    # regeneration made for other settings or another text goes.
    h.after_change = dict(**ex["redraw"], api_visibility="private", show_progress="hidden", **ex["explore_group"])
    h.stale = dict(fn=drop_stale_regeneration, inputs=[ses, h.regen_html], outputs=h.regen_html,
                   api_visibility="private", show_progress="hidden", queue=False)
    h.views = [h.roles_plot, h.roles_note, h.lens_plot, h.effect_plot, h.effect_md, h.heads, h.edit_head, h.edit_key,
               h.query_md]
    h.settings = [ses, h.heads, h.mode, h.keep_only, ex["layer"], ex["head"]]
    _bind_following(ses, h, ex)
    _bind_changes(ses, h, ex)
    _bind_readouts(ses, h, ex)
    _bind_picking_and_model(ses, h, ex)
    return h


def _lay_out_roles_and_lens(h: SimpleNamespace) -> None:
    """The Head roles and Logit lens tabs."""
    with gr.Tab("Head roles", id="roles") as h.tab_roles:
        gr.Markdown(ROLES_INTRO, elem_classes="lab-intro")
        h.roles_note = gr.Markdown("", elem_id="roles_note")
        h.roles_plot = gr.Plot(message_plot(NO_TEXT), show_label=False, elem_id="head_roles")
    with gr.Tab("Logit lens", id="lens") as h.tab_lens:
        gr.Markdown(LENS_INTRO, elem_classes="lab-intro")
        h.lens_plot = gr.Plot(message_plot(NO_TEXT), show_label=False, elem_id="lens")


def _lay_out_ablate(h: SimpleNamespace) -> None:
    """The Ablate & edit tab: the heads and the mode, one row's edit, the effect and a regeneration."""
    with gr.Tab("Ablate & edit", id="ablate") as h.tab_ablate:
        gr.Markdown(ABLATE_INTRO, elem_classes="lab-intro")
        with gr.Row(equal_height=True):
            h.heads = gr.CheckboxGroup([], label="Heads to ablate", elem_id="ablate_heads", scale=3)
            h.mode = gr.Radio([(ABLATION_MODE_WORDS[m].label, m) for m in ABLATION_MODES], value="zero", label="Mode",
                              elem_id="ablate_mode", scale=2)
            with gr.Column(scale=2, min_width=200):
                h.keep_only = gr.Checkbox(False, label="keep only these (ablate all the others)",
                                          elem_id="keep_only")
                h.picking = gr.Checkbox(False, label="clicking a head (overview cell or attention panel) picks it",
                                        elem_id="picking")
        with gr.Row():
            h.query_md = gr.Markdown("", elem_id="query_note")
            h.edit_head = gr.Dropdown([], value=None, label="Edit the row of the selected token in head",
                                      elem_id="edit_head", scale=1, min_width=120)
            h.edit_key = gr.Dropdown([("no edit", "off")], value="off", elem_id="edit_key", scale=2,
                                     label="so that it attends to")
            h.clear_btn = gr.Button("Clear all changes", elem_id="clear_changes", scale=1, min_width=120)
        with gr.Row():
            h.effect_plot = gr.Plot(message_plot(NO_SETTINGS), show_label=False, elem_id="effect")
            with gr.Column():
                h.effect_md = gr.Markdown("", elem_id="effect_note")
                h.regen_n = gr.Slider(1, MAX_REGENERATE, value=REGENERATE_TOKENS, step=1, label="Tokens",
                                      elem_id="regen_n")
                h.regen_btn = gr.Button("Regenerate with these changes", elem_id="regenerate")
                h.regen_html = gr.HTML("", elem_id="regen")


def _lay_out_compare(h: SimpleNamespace, ex: dict) -> None:
    """The Compare A / B tab, on the default model's first minimal pair."""
    with gr.Tab("Compare A / B", id="compare") as h.tab_compare:
        with gr.Row(equal_height=True):
            h.pairs = pairs = pairs_for(ex["default_model"])
            h.pair = gr.Dropdown(pairs, value=None, label="Minimal pairs", elem_id="pair", scale=2)
            h.prompt_a = gr.Textbox(pairs[0][1].split("\u241e")[0] if pairs else "", label="Prompt A",
                                    elem_id="prompt_a", scale=3)
            h.prompt_b = gr.Textbox(pairs[0][1].split("\u241e")[1] if pairs else "", label="Prompt B",
                                    elem_id="prompt_b", scale=3)
            h.cmp_layer = gr.Dropdown(ex["layer_choices"], value=ex["layer_choices"][-1][1], label="Layer",
                                      elem_id="cmp_layer", scale=1, min_width=100)
            h.cmp_btn = gr.Button("Compare", variant="primary", elem_id="compare", scale=1, min_width=100)
        lay_out_pair_helper(h)  # which words keep the token count: a pair for any model (ui/pairs.py)
        h.cmp_notes = gr.Markdown("", elem_id="cmp_notes")
        with gr.Row():
            h.diff_plot = gr.Plot(message_plot("Type two prompts and press Compare."), show_label=False,
                                  elem_id="cmp_diff")
            h.dist_plot = gr.Plot(message_plot(""), show_label=False, elem_id="cmp_dist")
        h.changes_plot = gr.Plot(message_plot(""), show_label=False, elem_id="cmp_scores")
        lay_out_patching(h, ex["default_model"])


def _bind_following(ses: gr.State, h: SimpleNamespace, ex: dict) -> None:
    """The tools follow the text, the tab shown and the head shown."""
    layer, head, group = ex["layer"], ex["head"], ex["explore_group"]
    # The page asks for the tools once the text and the selected token have stayed the same for a
    # moment (assets/explore.js), so quick Steps never queue behind them.
    refresh_btn = gr.Button("refresh", elem_id="refresh_tools", elem_classes="lab-hidden")
    query = gr.Number(None, visible=False)
    refresh_btn.click(refresh, [ses, layer, head, query], h.views, api_name=False, show_progress="hidden",
                      js="(...a) => { a[3] = window.decoderLab ? window.decoderLab.query : null; return a; }",
                      **group).then(**h.stale)
    tabs = (h.tab_roles, h.tab_lens, h.tab_ablate, h.tab_compare)
    for tid, tab in zip(HEAD_TOOLS, tabs):  # HEAD_TOOLS' order
        tab.select(show_tool, [ses, gr.State(tid), layer, head], h.views, api_name=False, show_progress="hidden",
                   **group)
    for control in (layer, head):  # the overview outlines the head shown
        control.input(refresh, [ses, layer, head], h.views, api_visibility="private", show_progress="hidden", **group)


def _bind_changes(ses: gr.State, h: SimpleNamespace, ex: dict) -> None:
    """Ablations, attention edits, Clear and Regenerate, and the API's /ablate."""
    group = ex["explore_group"]
    ablated = [h.effect_plot, h.effect_md, h.roles_plot, h.api[0]]
    for control in (h.heads, h.mode, h.keep_only):
        control.input(ablate, h.settings, ablated, api_name=False, show_progress="hidden",
                      **group).then(**h.after_change).then(**h.stale)
    gr.Button(visible=False).click(ablate, h.settings, ablated, api_name="ablate", **group)
    edited = [h.effect_plot, h.effect_md, h.api[1]]
    h.edit_key.input(edit_attention, [ses, h.edit_head, h.edit_key], edited, api_name="edit_attention",
                     show_progress="hidden", **group).then(**h.after_change).then(**h.stale)
    h.edit_head.input(edit_attention, [ses, h.edit_head, h.edit_key], edited, api_name=False,
                      show_progress="hidden", **group).then(**h.after_change).then(**h.stale)
    h.clear_btn.click(clear_settings, [ses, ex["layer"], ex["head"]], h.views, api_name="clear_changes",
                      **group).then(**h.after_change).then(**h.stale)
    h.regen_btn.click(regenerate, [ses, *ex["sampling"], h.regen_n], [h.regen_html, h.api[2]],
                      api_name="regenerate", **group)


def _bind_readouts(ses: gr.State, h: SimpleNamespace, ex: dict) -> None:
    """The API's /head_roles and /logit_lens, and Compare with its minimal pairs."""
    group = ex["explore_group"]
    gr.Button(visible=False).click(head_roles_table, ses, h.api[3], api_name="head_roles", **group)
    gr.Button(visible=False).click(lens_at, [ses, h.index], [h.lens_plot, h.api[4]], api_name="logit_lens", **group)
    h.cmp_btn.click(compare, [ses, ex["model"], h.prompt_a, h.prompt_b, h.cmp_layer],
                    [h.diff_plot, h.changes_plot, h.dist_plot, h.cmp_notes, h.api[5]], api_name="compare", **group)
    h.pair.input(pick_pair, h.pair, [h.prompt_a, h.prompt_b], api_name=False, queue=False, **RAW)


def _bind_picking_and_model(ses: gr.State, h: SimpleNamespace, ex: dict) -> None:
    """A click on a head in a figure picks it; a new model resets the Compare tab."""
    model_dd = ex["model"]
    # the page puts "layer,head" in `pick_value` (assets/explore.js)
    pick_btn = gr.Button("pick", elem_id="pick_head", elem_classes="lab-hidden")
    pick_btn.click(pick_head, [ses, h.pick_value, h.picking, h.heads, model_dd, ex["view"]],
                   [ex["layer"], ex["head"], h.heads, ex["view"]],
                   api_name=False, show_progress="hidden",
                   js="(...a) => { a[1] = window.decoderLab ? window.decoderLab.pick : ''; return a; }",
                   **RAW).success(
        ablate, h.settings, [h.effect_plot, h.effect_md, h.roles_plot, h.api[0]], api_name=False,
        show_progress="hidden", **ex["explore_group"]).then(**h.after_change).then(**h.stale)
    model_dd.change(model_changed, [ses, model_dd], [h.pair, h.prompt_a, h.prompt_b, h.cmp_layer, h.diff_plot,
                                                     h.changes_plot, h.dist_plot,
                                                     h.cmp_notes], api_name=False, **RAW).then(**h.stale)
