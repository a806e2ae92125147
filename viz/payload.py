"""Figure containers and the wire: `FigureSpec`, the figure JSON, sizes, decoding back to numbers.

Every figure builder returns a `FigureSpec` (plain dicts, fast JSON); the helpers here also accept a
plotly `go.Figure` (the `Figure` alias), for tests and one-off pages. A gr.Plot ships ``{"type":
"plotly", "plot": <figure JSON>}`` JSON-encoded inside the SSE stream, without compression.
plotly's own JSON writes every "/" as ``\\u002f`` (an HTML-safety escape); inside base64 array data,
where "/" is one of the 64 symbols, that swells those characters several-fold once the text is
JSON-encoded again. `plot_json` therefore writes the JSON with that escape undone, and the wiring
(ui/plots.py) hands that text to gradio as it is.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

_DTYPES = {"i1": np.int8, "u1": np.uint8, "u1c": np.uint8, "i2": np.int16, "u2": np.uint16,
           "i4": np.int32, "u4": np.uint32, "f4": np.float32, "f8": np.float64}


_SPEC_DTYPES = {np.dtype(v).str[1:]: k for k, v in _DTYPES.items() if k != "u1c"}


def _narrow_wide_int(arr: np.ndarray) -> np.ndarray:
    """int64 / uint64 (which plotly.js typed arrays lack) in the smallest type plotly.py would pick."""
    lo, hi = int(arr.min()), int(arr.max())
    signed = arr.dtype.kind == "i"
    for dtype in ((np.int8, np.int16, np.int32) if signed else (np.uint8, np.uint16, np.uint32)):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return arr.astype(dtype)
    return arr


def _typed_array(arr: np.ndarray) -> dict | list:
    """A numpy array as plotly.js's typed-array spec, following plotly.py's rules for numpy data:
    empty arrays and dtypes plotly.js cannot take become plain lists, 64-bit integers are narrowed
    when their values allow it."""
    arr = np.ascontiguousarray(arr)
    if arr.size and arr.dtype.kind in "iu" and arr.dtype.itemsize == 8:
        arr = _narrow_wide_int(arr)
    code = _SPEC_DTYPES.get(arr.dtype.str[1:])
    if code is None or arr.size == 0:
        return arr.tolist()
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


@dataclass(frozen=True, eq=False, repr=False)
class FigureSpec:
    """A figure held as the plain dicts plotly.js receives: ``data`` (trace dicts) and ``layout``.

    This is not a `go.Figure` and does not pretend to be one: it has no ``update_layout``, no
    ``.data[0].z`` attribute access, and its fields cannot be reassigned. `to_json` writes the
    dicts directly (numpy arrays become plotly typed arrays), which skips plotly's per-trace
    validation; the attention views with many heatmap tiles are built this way for speed.
    `to_plotly` builds and validates a real, independent `go.Figure` for anyone who needs one
    (to edit it, or to compare with plotly's own serialisation). A string ``layout["template"]``
    is replaced by the named template itself, because plotly.js cannot look names up.
    """

    data: tuple[dict, ...]
    layout: dict

    def __post_init__(self) -> None:
        if not isinstance(self.layout, dict):
            raise TypeError(f"layout must be a dict, got {type(self.layout).__name__}")
        data = tuple(self.data)
        for i, trace in enumerate(data):
            if not isinstance(trace, dict) or "type" not in trace:
                raise TypeError(f"trace {i} must be a dict with a 'type' key, got {trace!r:.60}")
        layout = self.layout
        if isinstance(layout.get("template"), str):
            import plotly.io as pio

            layout = {**layout, "template": pio.templates[layout["template"]].to_plotly_json()}
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "layout", layout)

    def __repr__(self) -> str:
        kinds = sorted({str(trace["type"]) for trace in self.data})
        return f"FigureSpec({len(self.data)} traces: {', '.join(kinds) or 'none'})"

    def to_json(self) -> str:
        """The figure as plotly.js JSON, written straight from the dicts ("/" left unescaped)."""
        spec = {"data": list(self.data), "layout": self.layout}
        return json.dumps(_encode(spec), separators=(",", ":"), allow_nan=False)

    def to_plotly(self) -> go.Figure:
        """A new, validated `go.Figure` with the same traces and layout (changes to it stay there)."""
        return go.Figure(data=list(self.data), layout=self.layout)


Figure = FigureSpec | go.Figure
"""Anything the viz helpers accept: a `FigureSpec` or a plotly `go.Figure`."""


def _check_figure(fig: Any) -> None:
    if not isinstance(fig, (FigureSpec, go.Figure)):
        raise TypeError(f"expected a viz.FigureSpec or a plotly go.Figure, got {type(fig).__name__}")


def plot_json(fig: Figure) -> str:
    """Figure JSON as a gr.Plot sends it (ui/plots.py): for a `go.Figure`, plotly's JSON without the "/" escape."""
    _check_figure(fig)
    if isinstance(fig, FigureSpec):
        return fig.to_json()
    return fig.to_json().replace("\\u002f", "/")


def with_filename(fig: Figure, name: str) -> Figure:
    """`fig` with ``layout.meta.filename`` set: the name the page gives its PNG / SVG download
    (assets/explore.js). Returns the same figure."""
    if isinstance(fig, FigureSpec):
        fig.layout.setdefault("meta", {})["filename"] = name
    else:
        meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
        fig.update_layout(meta={**meta, "filename": name})
    return fig


def payload_bytes(fig: Figure, *, compact: bool = True) -> int:
    """Bytes gradio puts on the wire for this figure in a gr.Plot.

    compact=True measures `plot_json(fig)` as ui/plots.py sends it; compact=False a plain ``return fig`` of the
    equivalent `go.Figure` (`FigureSpec.to_plotly` for a spec). Equal to
    ``len(json.dumps(gr.Plot().postprocess(x).model_dump()))`` for the corresponding x.
    """
    _check_figure(fig)
    if compact:
        text = plot_json(fig)
    else:
        text = (fig.to_plotly() if isinstance(fig, FigureSpec) else fig).to_json()
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


def attention_panels(fig: Figure | dict) -> np.ndarray:
    """The values a viewer of an attention figure sees: (panels, T, T) float64, NaN where masked.

    fig: a figure, the figure's JSON already parsed (``json.loads(result["plot"])`` of what the
    app's API returns), or that returned ``{"type": "plotly", "plot": <JSON>}`` value itself.
    These are the coloured values: the weights themselves for colour="linear", the row-normalised
    or log10 values for colour="row" / "log" (``layout.meta.colour`` says which).

    Decodes the JSON actually sent (tiles, integer milli-units) back to floats. Tiles overlap by a
    cell to hide seams; overlapping cells must agree.
    """
    spec = _figure_dict(fig)
    meta = spec["layout"].get("meta")
    if not isinstance(meta, dict) or not {"panels", "T", "unit"} <= meta.keys():
        raise ValueError("not an attention figure: its layout.meta has no panels, T and unit (attention_panels "
                         "reads the figures of the attention views)")
    panels = meta["panels"]  # a list of {xaxis, yaxis, layer, head} (older figures: a count)
    t, unit = int(meta["T"]), float(meta["unit"])
    n = len(panels) if isinstance(panels, list) else int(panels)
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


def _figure_dict(fig: Figure | dict) -> dict:
    """A figure as the plain dict plotly.js reads ({"data": [...], "layout": {...}})."""
    if isinstance(fig, dict):
        if isinstance(fig.get("plot"), str):  # a gr.Plot value, as gradio_client returns it
            return json.loads(fig["plot"])
        if isinstance(fig.get("data"), list) and isinstance(fig.get("layout"), dict):
            return fig
        raise TypeError("expected a figure's JSON (a dict with 'data' and 'layout') or a gr.Plot value "
                        f"(a dict with 'plot'), got a dict with keys {sorted(map(str, fig))[:6]}")
    return json.loads(plot_json(fig))
