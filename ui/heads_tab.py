"""The head tools' layout and events: a row of tabs under the Explore page's text and attention.

Head roles (every head's scores on the text, one small overview per score), the logit lens
(the prediction read out after each layer), ablation and attention edits with their effect on
the next token and a side-by-side regeneration, and prompt A against prompt B. They follow the
text: every Step, Generate, Undo, Reset and token click refreshes them (`refresh`).
"""

from __future__ import annotations

import gradio as gr

from lab.probing import ABLATION_MODES, MAX_REGENERATE
from lab.session import HEAD_TOOLS

from .common import RAW, api_example, message_plot
from .heads import (
    NO_SETTINGS, NO_TEXT, REGENERATE_TOKENS, ablate, clear_settings, compare, drop_stale_regeneration, edit_attention,
    head_roles_table, show_tool,
    lens_at, model_changed, pairs_for, pick_head, pick_pair, refresh, regenerate,
)

ROLES_INTRO = ("Every head's scores on the text above, recomputed at each Step: a cell is **outlined** when its "
               "score passes the role's threshold (hover for the formula). Scores say where a head looks, "
               "not what it does for the prediction: the Ablate tab tests that.")
LENS_INTRO = ("The residual stream after each layer, sent through the model's final norm and output head: "
              "what the model would predict if it stopped there. The last row is the model's own distribution. "
              "Click a token in the text to read the lens at that position.")
ABLATE_INTRO = ("Remove heads and see what the next token loses: **zero** drops a head's output, **mean** replaces "
                "it by its mean over the positions, **uniform** makes it attend equally to every allowed key. "
                "Or rewrite one attention row: the selected token's, in the head you choose.")
MODE_LABELS = {"zero": "zero", "mean": "mean over positions", "uniform": "uniform attention"}


def build_heads_section(ses: gr.State, ex: dict) -> None:
    """Lay out the head tools (call inside the Explore tab, under its main row) and bind their events.

    ex: the Explore tab's components ("model", "layer", "head", "sampling", "explore_group",
    "default_model", "layer_choices") and "redraw": the event (fn, inputs, outputs) that draws the
    attention and its caption again, for after the heads' settings change.
    """
    layer, head, model_dd = ex["layer"], ex["head"], ex["model"]
    with gr.Tabs(elem_id="head_tools"):
        with gr.Tab("Head roles", id="roles") as tab_roles:
            gr.Markdown(ROLES_INTRO, elem_classes="lab-intro")
            roles_note = gr.Markdown("", elem_id="roles_note")
            roles_plot = gr.Plot(message_plot(NO_TEXT), show_label=False, elem_id="head_roles")
        with gr.Tab("Logit lens", id="lens") as tab_lens:
            gr.Markdown(LENS_INTRO, elem_classes="lab-intro")
            lens_plot = gr.Plot(message_plot(NO_TEXT), show_label=False, elem_id="lens")
        with gr.Tab("Ablate & edit", id="ablate") as tab_ablate:
            gr.Markdown(ABLATE_INTRO, elem_classes="lab-intro")
            with gr.Row(equal_height=True):
                heads = gr.CheckboxGroup([], label="Heads to ablate", elem_id="ablate_heads", scale=3)
                mode = gr.Radio([(MODE_LABELS[m], m) for m in ABLATION_MODES], value="zero", label="Mode",
                                elem_id="ablate_mode", scale=2)
                with gr.Column(scale=2, min_width=200):
                    keep_only = gr.Checkbox(False, label="keep only these (ablate all the others)", elem_id="keep_only")
                    picking = gr.Checkbox(False, label="clicking a head (overview cell or attention panel) picks it",
                                          elem_id="picking")
            with gr.Row():
                query_md = gr.Markdown("", elem_id="query_note")
                edit_head = gr.Dropdown([], value=None, label="Edit the row of the selected token in head",
                                        elem_id="edit_head", scale=1, min_width=120)
                edit_key = gr.Dropdown([("no edit", "off")], value="off", elem_id="edit_key", scale=2,
                                       label="so that it attends to")
                clear_btn = gr.Button("Clear all changes", elem_id="clear_changes", scale=1, min_width=120)
            with gr.Row():
                effect_plot = gr.Plot(message_plot(NO_SETTINGS), show_label=False, elem_id="effect")
                with gr.Column():
                    effect_md = gr.Markdown("", elem_id="effect_note")
                    regen_n = gr.Slider(1, MAX_REGENERATE, value=REGENERATE_TOKENS, step=1, label="Tokens",
                                        elem_id="regen_n")
                    regen_btn = gr.Button("Regenerate with these changes", elem_id="regenerate")
                    regen_html = gr.HTML("", elem_id="regen")
        with gr.Tab("Compare A / B", id="compare") as tab_compare:
            with gr.Row(equal_height=True):
                pairs = pairs_for(ex["default_model"])
                pair = gr.Dropdown(pairs, value=None, label="Minimal pairs", elem_id="pair", scale=2)
                prompt_a = gr.Textbox(pairs[0][1].split("\u241e")[0] if pairs else "", label="Prompt A",
                                      elem_id="prompt_a", scale=3)
                prompt_b = gr.Textbox(pairs[0][1].split("\u241e")[1] if pairs else "", label="Prompt B",
                                      elem_id="prompt_b", scale=3)
                cmp_layer = gr.Dropdown(ex["layer_choices"], value=ex["layer_choices"][-1][1], label="Layer",
                                        elem_id="cmp_layer", scale=1, min_width=100)
                cmp_btn = gr.Button("Compare", variant="primary", elem_id="compare", scale=1, min_width=100)
            cmp_notes = gr.Markdown("", elem_id="cmp_notes")
            with gr.Row():
                diff_plot = gr.Plot(message_plot("Type two prompts and press Compare."), show_label=False,
                                    elem_id="cmp_diff")
                dist_plot = gr.Plot(message_plot(""), show_label=False, elem_id="cmp_dist")
            changes_plot = gr.Plot(message_plot(""), show_label=False, elem_id="cmp_scores")
    api_example(heads, ["L1H0"])
    api_example(keep_only, False)
    api_example(edit_key, "0")
    api_example(edit_head, "L2H3")
    if pairs:
        a, b = pairs[0][1].split("\u241e")
        api_example(prompt_a, a)
        api_example(prompt_b, b)
    api = [gr.JSON(visible=False) for _ in range(6)]
    pick_value = gr.Textbox(visible=False)
    index = gr.Number(None, visible=False)

    group = ex["explore_group"]
    # After a change of the heads' settings: the attention above is drawn again under them (it says so), and a
    # regeneration made for other settings or another text goes.
    after_change = dict(**ex["redraw"], api_visibility="private", show_progress="hidden", **group)
    stale = dict(fn=drop_stale_regeneration, inputs=[ses, regen_html], outputs=regen_html, api_visibility="private",
                 show_progress="hidden", queue=False)
    views = [roles_plot, roles_note, lens_plot, effect_plot, effect_md, heads, edit_head, edit_key, query_md]
    # The tools follow the text: the page asks for them once the text and the selected token have
    # stayed the same for a moment (assets/explore.js), so quick Steps never queue behind them.
    refresh_btn = gr.Button("refresh", elem_id="refresh_tools", elem_classes="lab-hidden")
    query = gr.Number(None, visible=False)
    refresh_btn.click(refresh, [ses, layer, head, query], views, api_name=False, show_progress="hidden",
                      js="(...a) => { a[3] = window.decoderLab ? window.decoderLab.query : null; return a; }",
                      **group).then(**stale)
    for tid, tab in zip(HEAD_TOOLS, (tab_roles, tab_lens, tab_ablate, tab_compare)):  # HEAD_TOOLS' order
        tab.select(show_tool, [ses, gr.State(tid), layer, head], views, api_name=False, show_progress="hidden",
                   **group)
    for control in (layer, head):  # the overview outlines the head shown
        control.input(refresh, [ses, layer, head], views, api_visibility="private", show_progress="hidden", **group)
    settings = [ses, heads, mode, keep_only, layer, head]
    for control in (heads, mode, keep_only):
        control.input(ablate, settings, [effect_plot, effect_md, roles_plot, api[0]], api_name=False,
                      show_progress="hidden", **group).then(**after_change).then(**stale)
    gr.Button(visible=False).click(ablate, settings, [effect_plot, effect_md, roles_plot, api[0]], api_name="ablate",
                                   **group)
    edit_key.input(edit_attention, [ses, edit_head, edit_key], [effect_plot, effect_md, api[1]],
                   api_name="edit_attention", show_progress="hidden", **group).then(**after_change).then(**stale)
    edit_head.input(edit_attention, [ses, edit_head, edit_key], [effect_plot, effect_md, api[1]], api_name=False,
                    show_progress="hidden", **group).then(**after_change).then(**stale)
    clear_btn.click(clear_settings, [ses, layer, head], views, api_name="clear_changes",
                    **group).then(**after_change).then(**stale)
    regen_btn.click(regenerate, [ses, *ex["sampling"], regen_n], [regen_html, api[2]], api_name="regenerate", **group)
    gr.Button(visible=False).click(head_roles_table, ses, api[3], api_name="head_roles", **group)
    gr.Button(visible=False).click(lens_at, [ses, index], [lens_plot, api[4]], api_name="logit_lens", **group)
    cmp_btn.click(compare, [ses, model_dd, prompt_a, prompt_b, cmp_layer],
                  [diff_plot, changes_plot, dist_plot, cmp_notes, api[5]], api_name="compare", **group)
    pair.input(pick_pair, pair, [prompt_a, prompt_b], api_name=False, queue=False, **RAW)
    # a click on a head in a figure: the page puts "layer,head" in `pick_value` (assets/explore.js)
    pick_btn = gr.Button("pick", elem_id="pick_head", elem_classes="lab-hidden")
    pick_btn.click(pick_head, [ses, pick_value, picking, heads, model_dd], [layer, head, heads], api_name=False,
                   js="(...a) => { a[1] = window.decoderLab ? window.decoderLab.pick : ''; return a; }",
                   show_progress="hidden", **RAW).success(
        ablate, settings, [effect_plot, effect_md, roles_plot, api[0]], api_name=False, show_progress="hidden",
        **group).then(**after_change).then(**stale)
    model_dd.change(model_changed, [ses, model_dd], [pair, cmp_layer, diff_plot, changes_plot, dist_plot, cmp_notes],
                    api_name=False, **RAW).then(**stale)
