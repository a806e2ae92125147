"""Helpers for calling the running app through gradio_client: clean refusals, decoded figures."""

from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go
from gradio_client.exceptions import AppError

import viz


QUANT = 0.0005 + 1e-9


def panels(plot: dict) -> np.ndarray:
    spec = json.loads(plot["plot"])
    assert spec["layout"]["meta"]["viz"] == "attention", spec["layout"].get("meta")
    return viz.attention_panels(go.Figure(spec))


def words(tokens: list[dict]) -> list[str]:
    return [t["token"] for t in tokens]


def assert_clean_error(exc: AppError, pattern: str) -> None:
    import html
    import re

    # A message is HTML (gradio shows it as such): escaped, so "<EOS>" reads as written; compare what it shows.
    assert "<" not in str(exc), str(exc)
    msg = html.unescape(str(exc))
    assert re.search(pattern, msg), msg
    for leak in ("Traceback", 'File "', "/work", "/tmp", ".py", "Something went wrong"):
        assert leak not in msg, msg
