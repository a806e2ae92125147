"""Reading figures back as the browser receives them (decoded arrays, axes, strings)."""

from __future__ import annotations

import json

import numpy as np

from viz import decode_array, future_mask, plot_json


def softmax_attention(h: int, t: int, seed: int = 0, scale: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    """(weights with exact 0 above the diagonal, scores with -inf there), like the model returns."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(h, t, t)) * scale
    scores[:, future_mask(t)] = -np.inf
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True), scores


def sent(fig) -> dict:
    """The figure as the browser receives it: {"data": [...], "layout": {...}} (arrays still encoded)."""
    return json.loads(plot_json(fig))


def axis(layout: dict, name: str) -> dict:
    """An axis as plotly.js resolves it: the template's defaults for every x / y axis, then its own keys."""
    base = layout.get("template", {}).get("layout", {}).get(name.rstrip("0123456789"), {})
    ax = {**base, **layout.get(name, {})}
    if isinstance(ax.get("tickvals"), dict):
        ax["tickvals"] = decode_array(ax["tickvals"]).tolist()
    return ax


def all_strings(obj) -> list[str]:
    """Every string in a nested plotly JSON structure."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for k, v in obj.items() if k != "bdata" for s in all_strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in all_strings(v)]
    return []


def assert_same_values(a, b, where: str = "figure") -> None:
    """Two figure JSON structures carry the same content, typed arrays compared by decoded value."""
    typed = [isinstance(v, dict) and "bdata" in v for v in (a, b)]
    if any(typed):
        left, right = decode_array(a).astype(np.float64), decode_array(b).astype(np.float64)
        np.testing.assert_array_equal(left, right, err_msg=where)  # NaN (masked cells) equal NaN
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_values(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_values(x, y, f"{where}[{i}]")
    else:
        assert a == b, where
