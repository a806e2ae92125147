"""Positional-encoding figures: the table itself, position × position similarity, and "none".

Values travel as integer milli-units like the attention maps, so hover reads e.g. "-0.707".
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ._common import (
    FONT,
    MILLI,
    MILLI_FORMAT,
    MILLI_SEPARATORS,
    empty_note,
    esc,
    encoded_milli,
    nice_ticks,
    tick_label,
    to_milli,
)

PE_KINDS = ("sinusoidal", "learned", "rope")


def _check_table(table: np.ndarray) -> np.ndarray:
    table = np.asarray(table, dtype=np.float64)
    if table.ndim != 2:
        raise ValueError(f"positional table must be 2-D (positions, dimensions), got shape {table.shape}")
    if 0 in table.shape:
        raise ValueError(f"positional table is empty ({table.shape[0]}×{table.shape[1]})")
    if not np.isfinite(table).all():
        raise ValueError("positional table holds NaN or infinite values")
    return table


def _check_kind(kind: str) -> None:
    if kind not in PE_KINDS:
        raise ValueError(f"kind must be one of {', '.join(PE_KINDS)}, got {kind!r}")


def _heatmap_figure(values: np.ndarray, *, lo: float, hi: float, colorscale: str, title: str,
                    xtitle: str, ytitle: str, hover: str, cbar: str, height: int) -> go.Figure:
    """One milli-unit heatmap with integer position axes (position 0 on top)."""
    ticks = nice_ticks(lo, hi)
    int_axis = {"showgrid": False, "zeroline": False, "tickformat": "d", "ticks": "outside", "ticklen": 3}
    layout = {
        "template": "none",
        "separators": MILLI_SEPARATORS,
        "font": FONT,
        "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 13}},
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 50, "b": 48},
        "xaxis": {**int_axis, "title": {"text": xtitle}, "constrain": "domain"},
        "yaxis": {**int_axis, "title": {"text": ytitle}, "autorange": "reversed"},
        "coloraxis": {
            "cmin": lo * MILLI,
            "cmax": hi * MILLI,
            "colorscale": colorscale,
            "reversescale": colorscale == "RdBu",  # red = positive, as in the attention scores
            "colorbar": {"title": {"text": cbar, "side": "right"}, "tickmode": "array",
                         "tickvals": (ticks * MILLI).tolist(), "ticktext": [tick_label(v) for v in ticks],
                         "thickness": 12, "outlinewidth": 0},
        },
    }
    trace = {"type": "heatmap", "z": encoded_milli(to_milli(values)), "coloraxis": "coloraxis",
             "hovertemplate": hover + f"{MILLI_FORMAT}<extra></extra>"}
    return go.Figure(data=[trace], layout=layout)


def positional_table(table: np.ndarray, kind: str) -> go.Figure:
    """Positions × dimensions heatmap of a positional table.

    sinusoidal / learned: the (P, d_model) vectors added to the token embeddings.
    rope: (P, head_dim/2) rotation angles θ_i·pos in radians, shown wrapped to (−π, π] on a cyclic
    colour scale (a full turn brings the colour back, as it brings the rotation back).
    """
    _check_kind(kind)
    table = _check_table(table)
    p, d = table.shape
    common = {"ytitle": "position", "height": 380}
    if kind == "rope":
        wrapped = np.angle(np.exp(1j * table))  # (−π, π]
        return _heatmap_figure(
            wrapped, lo=-np.pi, hi=np.pi, colorscale="Twilight",
            title="RoPE rotation angle θᵢ·pos (rad), wrapped to (−π, π]: low pairs turn fast, high pairs slowly",
            xtitle=f"frequency pair i (rotates dims 2i, 2i+1), {d} pairs",
            hover="position %{y}, pair %{x}: θ·pos mod 2π = ", cbar="angle (rad)", **common,
        )
    bound = float(np.abs(table).max()) or 1.0
    title = ("Sinusoidal positional encoding (added to token embeddings)" if kind == "sinusoidal"
             else "Learned positional embeddings (added to token embeddings)")
    return _heatmap_figure(
        table, lo=-bound, hi=bound, colorscale="RdBu", title=title,
        xtitle=f"embedding dimension ({d})", hover="position %{y}, dim %{x}: ", cbar="value", **common,
    )


def positional_similarity(table: np.ndarray, kind: str = "learned") -> go.Figure:
    """Position × position cosine similarity of the positional vectors.

    For kind="rope" the table holds angles; each position is then described by the features
    [cos θ·pos, sin θ·pos] (the rotation it applies), so similarity depends only on the offset.
    """
    _check_kind(kind)
    table = _check_table(table)
    feats = np.concatenate([np.cos(table), np.sin(table)], axis=1) if kind == "rope" else table
    norms = np.linalg.norm(feats, axis=1, keepdims=True)
    unit = feats / np.where(norms == 0, 1.0, norms)
    sim = np.clip(unit @ unit.T, -1.0, 1.0)
    what = {"rope": "RoPE rotations (cos/sin of the angles)", "sinusoidal": "sinusoidal encodings",
            "learned": "learned position embeddings"}[kind]
    return _heatmap_figure(
        sim, lo=-1.0, hi=1.0, colorscale="RdBu", title=f"Cosine similarity between positions: {what}",
        xtitle="position", ytitle="position", hover="position %{y} vs %{x}: cosine ", cbar="cosine",
        height=460,
    )


def no_positional_encoding() -> go.Figure:
    """Placeholder for models without positional encoding."""
    return message_figure(
        "This model has no positional encoding.\nApart from the causal mask, attention cannot tell "
        "token order:\nit is permutation-invariant over the visible tokens."
    )


def message_figure(text: str) -> go.Figure:
    """An empty figure carrying a short message (lines separated by newlines; text is escaped)."""
    note = "<br>".join(esc(line) for line in text.split("\n"))
    layout = {
        "template": "none",
        "font": FONT,
        "height": 220,
        "margin": {"l": 20, "r": 20, "t": 20, "b": 20},
        "xaxis": {"visible": False},
        "yaxis": {"visible": False},
        "annotations": [empty_note(note)],
    }
    return go.Figure(data=[], layout=layout)
