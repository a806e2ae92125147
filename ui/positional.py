"""The Positional encoding tab: the table the selected model really uses, and its formulas."""

from __future__ import annotations

import gradio as gr

import viz
from lab.export import model_stem

from .common import handler, named
from .plots import to_plot

PE_FORMULAS = ("Sinusoidal: $PE_{pos,2i} = \\sin(pos / 10000^{2i/d})$, $PE_{pos,2i+1} = \\cos(pos / 10000^{2i/d})$. "
               "Learned: a trained table of the same shape. RoPE: queries and keys are rotated by the angle "
               "$pos \\cdot 10000^{-2i/d_{head}}$ per pair of dimensions.")


@handler
def positional(session, model_name, request: gr.Request = None):
    entry, kind, table = session.positional(model_name)
    large = session.display.presentation  # the page's "Large fonts" switch
    if table is None:
        fig = to_plot(viz.no_positional_encoding(presentation=large))
        return fig, fig, f"**{entry.name}** uses no positional encoding."
    what = "rotation angles (one per pair of dimensions in each head)." if kind == "rope" else "dimensions."
    stem = model_stem(entry.name)
    return (to_plot(named(viz.positional_table(table, kind, presentation=large), stem, kind, "positions")),
            to_plot(named(viz.positional_similarity(table, kind, presentation=large), stem, kind,
                                     "similarity")),
            f"**{entry.name}** uses **{kind}** positions: table of {table.shape[0]} positions × {table.shape[1]} "
            + what)
