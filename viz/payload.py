"""What a figure costs on the wire, the Gradio hand-off, and decoding figures back to numbers.

gr.Plot sends ``{"type": "plotly", "plot": fig.to_json()}`` JSON-encoded inside the SSE stream
(uncompressed). plotly escapes every "/" as ``\\u002f`` for HTML safety; in base64 data that is
1 character in 64 costing 7 bytes on the wire instead of 1. `to_gradio_plot` undoes only that
escape ("<" and ">" stay escaped), which rendered identically in chromium.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import plotly.graph_objects as go

_DTYPES = {"i1": np.int8, "u1": np.uint8, "u1c": np.uint8, "i2": np.int16, "u2": np.uint16,
           "i4": np.int32, "u4": np.uint32, "f4": np.float32, "f8": np.float64}


_SPEC_DTYPES = {np.dtype(v).str[1:]: k for k, v in _DTYPES.items() if k != "u1c"}


def _typed_array(arr: np.ndarray) -> dict:
    """A numpy array as plotly.js's typed-array spec (what plotly.py sends for numpy data)."""
    arr = np.ascontiguousarray(arr)
    code = _SPEC_DTYPES.get(arr.dtype.str[1:])
    if code is None:
        raise ValueError(f"no plotly typed array for dtype {arr.dtype}")
    spec = {"dtype": code, "bdata": base64.b64encode(arr.tobytes()).decode("ascii")}
    if arr.ndim > 1:
        spec["shape"] = ", ".join(str(n) for n in arr.shape)
    return spec


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _typed_array(obj)
    if isinstance(obj, dict):
        return {k: _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


class LazyFigure:
    """A figure built from plain dicts whose JSON is written directly, skipping plotly's validation.

    Validating a figure of ~100 heatmap tiles dominated the cost of a Step (tens of ms), so the
    attention views are built this way. The dicts are the same ones plotly would send; anything
    that needs a real `go.Figure` (attribute access such as ``fig.data[0].z``, `to_dict`, tests)
    gets one, built and validated on first use.
    """

    def __init__(self, data: list[dict], layout: dict):
        if isinstance(layout.get("template"), str):  # plotly.js needs the template itself, not its name
            import plotly.io as pio

            layout = {**layout, "template": pio.templates[layout["template"]].to_plotly_json()}
        self._spec = {"data": data, "layout": layout}
        self._figure: go.Figure | None = None

    def to_json(self) -> str:
        return json.dumps(_encode(self._spec), separators=(",", ":"), allow_nan=False)

    @property
    def figure(self) -> go.Figure:
        if self._figure is None:
            self._figure = go.Figure(data=self._spec["data"], layout=self._spec["layout"])
        return self._figure

    def __getattr__(self, name: str) -> Any:
        return getattr(self.figure, name)


def plot_json(fig: go.Figure | LazyFigure) -> str:
    """Figure JSON as `to_gradio_plot` sends it (plotly's JSON without the "/" escape)."""
    if isinstance(fig, LazyFigure):
        return fig.to_json()
    return fig.to_json().replace("\\u002f", "/")


def to_gradio_plot(fig: go.Figure) -> Any:
    """gradio PlotData for `fig` with the smaller JSON; return it from a handler whose output is a gr.Plot."""
    from gradio.components.plot import PlotData  # the only gradio import in viz

    return PlotData(type="plotly", plot=plot_json(fig))


def payload_bytes(fig: go.Figure, *, compact: bool = True) -> int:
    """Bytes gradio puts on the wire for this figure in a gr.Plot.

    compact=True measures `to_gradio_plot(fig)`; compact=False a plain `return fig`. Equal to
    ``len(json.dumps(gr.Plot().postprocess(x).model_dump()))`` for the corresponding x.
    """
    plain = fig.figure if isinstance(fig, LazyFigure) else fig
    text = plot_json(fig) if compact else plain.to_json()
    return len(json.dumps({"type": "plotly", "plot": text}))


def decode_array(value: Any) -> np.ndarray:
    """A plotly data array as numpy: a typed-array spec {dtype, bdata, shape}, a list or an array."""
    if isinstance(value, dict) and "bdata" in value:
        arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=_DTYPES[value["dtype"]])
        shape = value.get("shape")
        if shape is not None:
            arr = arr.reshape([int(s) for s in str(shape).split(",")])
        return arr
    return np.asarray(value, dtype=np.float64)


def attention_panels(fig: go.Figure) -> np.ndarray:
    """The values a viewer of an attention figure sees: (panels, T, T) float64, NaN where masked.

    Decodes the JSON actually sent (tiles, integer milli-units) back to floats. Tiles overlap by a
    cell to hide seams; overlapping cells must agree.
    """
    spec = json.loads(plot_json(fig))
    meta = spec["layout"]["meta"]
    t, n, unit = int(meta["T"]), int(meta["panels"]), float(meta["unit"])
    out = np.full((n, t, t), np.nan)
    for trace in spec["data"]:
        panel = int(trace.get("xaxis", "x")[1:] or 1) - 1
        z = decode_array(trace["z"]).astype(np.float64)
        if z.ndim == 1:
            z = z[None]
        r0, c0 = int(trace.get("y0", 0)), int(trace.get("x0", 0))
        region = out[panel, r0 : r0 + z.shape[0], c0 : c0 + z.shape[1]]
        z = z * unit
        both = np.isfinite(region) & np.isfinite(z)
        if not np.array_equal(region[both], z[both]):
            raise AssertionError(f"overlapping tiles disagree in panel {panel} near row {r0}, col {c0}")
        region[...] = np.where(np.isfinite(z), z, region)
    return out
