"""Decoder Lab figures: numpy in, plotly figures out (no torch, no gradio at import time).

Every builder returns one figure type, `FigureSpec`: the attention maps (also a layer's heads as
lines, viz.layer_heads, and every head as a thumbnail, viz.overview), the probability bars,
the loss curve, the training film's score curves (viz.film), the head-role figures (role maps,
logit lens, before/after comparisons), the positional-encoding figures and `message_figure`. It
holds plain trace and layout dicts whose JSON is written directly, skipping plotly's validation
(which is slow for figures made of many heatmap tiles). It is not a `go.Figure`: call
`FigureSpec.to_plotly()` for a real, editable one.

`plot_json`, `payload_bytes` and `attention_panels` also take a plotly `go.Figure` (`Figure`). viz
never imports gradio: the wiring hands `plot_json`'s text to a gr.Plot (ui/plots.py).

One colour language (viz._common): `DIVERGING` for every signed quantity (red = positive, blue =
negative, near-white = zero), `SEQUENTIAL` (Viridis) for weights, masked cells hatched; `COLOUR_KEY`
says it in one line for the Learn text and the README. Backgrounds are transparent and text is a
mid grey, so the figures read on light and dark pages. The builders the app uses take
`presentation=True` for large fonts (tick labels ≥ 16 px).

How the attention payload is kept small: values are sent as integer milli-units (thousandths)
in the narrowest integer type, and plotly.js is made to print them as decimals by swapping the
number separators and formatting with d3 ``05,d`` (see viz._common), so hover reads "0.231".
A causal map is sent as rectangular tiles that leave out the fully masked upper triangle, with
the tile size picked per head by data size plus a per-trace cost (see viz.attention_tiles). gradio
receives the JSON without plotly's "/" escaping (see viz.payload). Measured payload sizes and
build / render timings are kept in bench/RESULTS.md.
"""

from ._common import COLOUR_KEY, DIVERGING, MASKED_HINT, READABLE_TICK_PX, ROW_OUTLINE, SEQUENTIAL
from .attention import (
    ATTENTION_VIEWS,
    GRID_LABEL_LIMIT,
    HEAD_LABEL_LIMIT,
    OVERVIEW_MAX_T,
    attention_grid,
    attention_head,
    attention_overview,
    attention_view,
    future_mask,
    overview_refusal,
)
from ._common import message_figure, probability_text, short_token
from .attention_colour import COLOUR_MODES
from .compare import attention_difference, compare_distributions
from .film import score_curves
from .heads import role_overview, score_changes
from .layer_heads import LINES_VIEW, head_colours, layer_heads
from .lens import lens_grid
from .linking import decode_shade, shade_payload, shading
from .overview import THUMBNAILS_VIEW, head_thumbnails
from .panels import ATTENTION_KINDS
from .payload import (
    Figure, FigureSpec, attention_panels, decode_array, payload_bytes, plot_json, with_filename,
)
from .positional import no_positional_encoding, positional_similarity, positional_table
from .sampling import probabilities
from .standalone import film_html, standalone_html
from .training import loss_curve

__all__ = [
    "ATTENTION_KINDS",
    "ATTENTION_VIEWS",
    "COLOUR_KEY",
    "COLOUR_MODES",
    "DIVERGING",
    "GRID_LABEL_LIMIT",
    "HEAD_LABEL_LIMIT",
    "LINES_VIEW",
    "MASKED_HINT",
    "OVERVIEW_MAX_T",
    "READABLE_TICK_PX",
    "ROW_OUTLINE",
    "SEQUENTIAL",
    "THUMBNAILS_VIEW",
    "Figure",
    "FigureSpec",
    "attention_difference",
    "attention_grid",
    "attention_head",
    "attention_overview",
    "attention_panels",
    "attention_view",
    "compare_distributions",
    "decode_array",
    "decode_shade",
    "film_html",
    "future_mask",
    "head_colours",
    "head_thumbnails",
    "layer_heads",
    "lens_grid",
    "loss_curve",
    "message_figure",
    "no_positional_encoding",
    "overview_refusal",
    "payload_bytes",
    "plot_json",
    "positional_similarity",
    "positional_table",
    "probabilities",
    "probability_text",
    "role_overview",
    "score_changes",
    "score_curves",
    "shade_payload",
    "shading",
    "short_token",
    "standalone_html",
    "with_filename",
]
