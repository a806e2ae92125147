"""Decoder Lab figures: numpy in, plotly Figure out (no torch, no gradio at import time).

Attention payload: what one Step sends when a gr.Plot shows ``to_gradio_plot(attention_grid(...))``,
measured with `payload_bytes` for 4 heads of one layer (plotly 7.1.0, gradio 6.31.0), KB = 1000 B.
Values travel as integer milli-units, hover reads "0.231" (number separators swapped and d3
format "05,d"; see viz._common); causal maps are sent as tiles that skip the masked triangle
(see viz.attention). "peaky" = random softmax rows (logits ~ N(0, 3²)), the worst case found;
"uniform" = 1/(i+1) rows (an untrained model); "plain" = returning the Figure itself (plotly
escapes "/" as \\u002f); baseline = float32 + NaN mask, one heatmap per head, plain.

    T    peaky   uniform   tiles   build (dicts + JSON)
    16   12.0    12.0        4       5 ms
    64   52.6    43.9       28       5 ms
    128  146.9   106.3      60      13 ms
    256  474.7   300.6     124      43 ms

(float32 + NaN baseline: 9.7 / 113.7 / 439.2 / 1727.3 KB.) Tiles are at least 8 cells wide and the
tile size is chosen per head by bytes plus a per-trace cost, because Chromium's render time grows
with the number of traces (T=64: 60 traces 161 ms, 28 traces 78 ms, measured with plotly.js).
Attention figures are `LazyFigure`s: their JSON is written straight from the dicts (plotly's
validation of ~100 traces cost tens of ms per Step); attribute access builds the real go.Figure.
Only the unmasked (bidirectional) map misses the 150 KB target at T=128: with no triangle to drop
it needs ~2 bytes per cell. Rendering and hover were checked in chromium with plotly.js 4.1.1
(the plotly wheel) and 3.3.1 (Gradio's bundle).
"""

from .attention import attention_grid, attention_head, attention_overview, causal_mask
from .payload import LazyFigure, attention_panels, decode_array, payload_bytes, plot_json, to_gradio_plot
from .positional import message_figure, no_positional_encoding, positional_similarity, positional_table
from .sampling import probabilities
from .training import loss_curve

__all__ = [
    "LazyFigure",
    "attention_grid",
    "attention_head",
    "attention_overview",
    "attention_panels",
    "causal_mask",
    "decode_array",
    "loss_curve",
    "message_figure",
    "no_positional_encoding",
    "payload_bytes",
    "plot_json",
    "positional_similarity",
    "positional_table",
    "probabilities",
    "to_gradio_plot",
]
