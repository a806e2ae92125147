"""Decoder Lab figures: numpy in, plotly Figure out (no torch, no gradio at import time).

Attention payload: what one Step sends when a gr.Plot shows ``to_gradio_plot(attention_grid(...))``,
measured with `payload_bytes` for 4 heads of one layer (plotly 7.1.0, gradio 6.31.0), KB = 1000 B.
Values travel as integer milli-units, hover reads "0.231" (number separators swapped and d3
format "05,d"; see viz._common); causal maps are sent as tiles that skip the masked triangle
(see viz.attention). "peaky" = random softmax rows (logits ~ N(0, 3²)), the worst case found;
"uniform" = 1/(i+1) rows (an untrained model); "plain" = returning the Figure itself (plotly
escapes "/" as \\u002f); baseline = float32 + NaN mask, one heatmap per head, plain.

    T    peaky   (plain)   uniform   scores   no mask (bidirectional)   baseline   build
    16   11.1    (11.6)    10.7      11.0      8.9                        9.7       11 ms
    64   49.5    (51.7)    38.7      49.4     52.4                      113.7       24 ms
    128  143.4   (147.8)   97.2     143.4    186.4                      439.2       47 ms
    256  473.6   (491.3)   287.9    473.6    716.4                     1727.3       54 ms

Only the unmasked (bidirectional) map misses the 150 KB target at T=128: with no triangle to drop
it needs ~2 bytes per cell. Rendering and hover were checked in chromium with plotly.js 4.1.1
(the plotly wheel) and 3.3.1 (Gradio's bundle).
"""

from .attention import attention_grid, attention_head, attention_overview, causal_mask
from .payload import attention_panels, decode_array, payload_bytes, plot_json, to_gradio_plot
from .positional import message_figure, no_positional_encoding, positional_similarity, positional_table
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
    "message_figure",
    "no_positional_encoding",
    "payload_bytes",
    "plot_json",
    "positional_similarity",
    "positional_table",
    "probabilities",
    "to_gradio_plot",
]
