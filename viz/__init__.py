"""Decoder Lab figures: numpy in, plotly Figure out (no torch, no gradio at import time).

Attention payload (what one Step sends in a gr.Plot). Values are integer milli-units (hover
"0.231" via swapped number separators and d3 format "05,d"), causal maps are sent as tiles that
skip the masked triangle (see viz.attention). Measured with `payload_bytes` for 4 heads of one
layer, random softmax rows, causal; "plain" = `return fig` (plotly escapes "/"), "compact" =
`to_gradio_plot(fig)`; baseline = float32 with NaN mask, one heatmap per head, plain:

    T     compact   plain    baseline
    16    SEE_BELOW
"""

from .attention import attention_grid, attention_head, attention_overview, causal_mask
from .payload import attention_panels, decode_array, payload_bytes, plot_json, to_gradio_plot
from .positional import no_positional_encoding, positional_similarity, positional_table
from .sampling import probabilities
from .training import loss_curve

__all__ = [
    "attention_grid",
    "attention_head",
    "attention_overview",
    "attention_panels",
    "causal_mask",
    "decode_array",
    "loss_curve",
    "no_positional_encoding",
    "payload_bytes",
    "plot_json",
    "positional_similarity",
    "positional_table",
    "probabilities",
    "to_gradio_plot",
]
