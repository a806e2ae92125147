"""The hand-off from a viz figure to a gr.Plot: the one place the figures meet gradio.

viz builds every figure as a `viz.FigureSpec` and writes its JSON (`viz.plot_json`) without plotly's
"/" escape; a handler whose output is a gr.Plot returns `to_plot(fig)`, which wraps that JSON in
gradio's PlotData, so gradio sends it as it is instead of re-serialising the figure.
"""

from __future__ import annotations

from gradio.components.plot import PlotData

import viz


def to_plot(fig: viz.Figure) -> PlotData:
    """gradio PlotData carrying `fig`'s compact JSON; return it from a handler whose output is a gr.Plot."""
    return PlotData(type="plotly", plot=viz.plot_json(fig))
