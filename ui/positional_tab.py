"""The Positional encoding tab: the table the selected model adds (or RoPE's angles), its similarity
map and the formulas.

The figures are drawn when the tab is shown, never while it is hidden: a plot drawn hidden is laid
out at the wrong width (clipped colour bars) until the window resizes.
"""

from __future__ import annotations

import gradio as gr

from .common import LATEX, RAW
from .positional import PE_FORMULAS, positional


def build_positional_tab() -> list:
    """Lay out the tab's contents (call inside its `gr.Tab`); returns what `bind_positional_tab` draws into."""
    pe_info = gr.Markdown(elem_id="pe_info")
    gr.Markdown(PE_FORMULAS, latex_delimiters=LATEX)
    with gr.Row():
        pe_table = gr.Plot(label="Positions × dimensions", elem_id="pe_table")
        pe_sim = gr.Plot(label="Similarity of positions (cosine)", elem_id="pe_sim")
    return [pe_table, pe_sim, pe_info]


def bind_positional_tab(ses: gr.State, model_dd: gr.Dropdown, tab: gr.Tab, outputs: list) -> None:
    """Draw the tab for Explore's model whenever `tab` is selected: the API's /positional.

    app.py binds it after every other event of the page, so that the API page lists /positional
    last and the other endpoints keep their numbers (fn_index)."""
    tab.select(positional, [ses, model_dd], outputs, api_name="positional", **RAW)
