"""Positional-encoding figures: the table itself, position × position similarity, and "none".

Values travel as integer milli-units like the attention maps, so hover reads e.g. "-0.707".
Signed values use the shared `DIVERGING` scale (red = positive, blue = negative, white = zero) and
the backgrounds are transparent (see viz._common). presentation=True: tick labels ≥ 16 px.
"""

from __future__ import annotations

import numpy as np

from ._common import (
    CYCLIC,
    DIVERGING,
    FONT,
    MILLI,
    MILLI_FORMAT,
    MILLI_SEPARATORS,
    PRESENTATION_FONT_PX,
    TRANSPARENT,
    colorscale,
    encoded_milli,
    hover_label,
    message_figure,
    nice_ticks,
    tick_label,
    to_milli,
)
from .payload import FigureSpec

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


def _sizes(presentation: bool) -> dict:
    if presentation:
        return {"tick": PRESENTATION_FONT_PX, "title": 20, "axis": 17, "hover": 18, "cb": PRESENTATION_FONT_PX}
    return {"tick": 11, "title": 13, "axis": 11, "hover": 12, "cb": 10}


def _heatmap_figure(values: np.ndarray, *, lo: float, hi: float, scale, title: str, xtitle: str, ytitle: str,
                    hover: str, cbar: str, height: int, presentation: bool = False, square: bool = False) -> FigureSpec:
    """One milli-unit heatmap with integer position axes (position 0 on top)."""
    ticks = nice_ticks(lo, hi)
    size = _sizes(presentation)
    int_axis = {"showgrid": False, "zeroline": False, "tickformat": "d", "ticks": "outside", "ticklen": 3,
                "tickfont": {"size": size["tick"]}, "title": {"font": {"size": size["axis"]}}}
    grow = size["tick"] / 11
    layout = {
        "template": "none",
        "separators": MILLI_SEPARATORS,
        "font": {**FONT, "size": size["axis"]},
        "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": size["title"]}},
        "height": int(height * (1.15 if presentation else 1.0)),
        "margin": {"l": int(60 * grow), "r": 20, "t": int(50 * grow), "b": int(48 * grow)},
        "paper_bgcolor": TRANSPARENT,
        "plot_bgcolor": TRANSPARENT,
        "xaxis": {**int_axis, "title": {**int_axis["title"], "text": xtitle}, "constrain": "domain"},
        "yaxis": {**int_axis, "title": {**int_axis["title"], "text": ytitle}, "autorange": "reversed",
                  **({"scaleanchor": "x", "constrain": "domain"} if square else {})},
        "hoverlabel": hover_label(size["hover"]),
        "coloraxis": {
            "cmin": lo * MILLI,
            "cmax": hi * MILLI,
            "colorscale": colorscale(scale),
            "colorbar": {"title": {"text": cbar, "side": "right", "font": {"size": size["axis"]}},
                         "tickmode": "array", "tickvals": (ticks * MILLI).tolist(),
                         "ticktext": [tick_label(v) for v in ticks], "tickfont": {"size": size["cb"]},
                         "thickness": 18 if presentation else 12, "outlinewidth": 0},
        },
    }
    trace = {"type": "heatmap", "z": encoded_milli(to_milli(values)), "coloraxis": "coloraxis",
             "hovertemplate": hover + f"{MILLI_FORMAT}<extra></extra>"}
    return FigureSpec((trace,), layout)


def positional_table(table: np.ndarray, kind: str, *, presentation: bool = False) -> FigureSpec:
    """Positions × dimensions heatmap of a positional table.

    sinusoidal / learned: the (P, d_model) vectors added to the token embeddings, on the shared
    `DIVERGING` scale (red = positive, blue = negative), symmetric around 0.
    rope: (P, head_dim/2) rotation angles θ_i·pos in radians, shown wrapped to (−π, π] on a cyclic
    colour scale (a full turn brings the colour back, as it brings the rotation back).
    """
    _check_kind(kind)
    table = _check_table(table)
    p, d = table.shape
    common = {"ytitle": "position", "height": 380, "presentation": presentation}
    if kind == "rope":
        wrapped = np.angle(np.exp(1j * table))  # (−π, π]
        return _heatmap_figure(
            wrapped, lo=-np.pi, hi=np.pi, scale=CYCLIC,
            title="RoPE rotation angle θᵢ·pos (rad), wrapped to (−π, π]: "
                  "low pairs turn fast, high pairs slowly",
            xtitle=f"frequency pair i (rotates dims 2i, 2i+1), {d} pairs",
            hover="position %{y}, pair %{x}: θ·pos mod 2π = ", cbar="angle (rad)", **common,
        )
    bound = float(np.abs(table).max()) or 1.0
    title = ("Sinusoidal positional encoding (added to token embeddings)" if kind == "sinusoidal"
             else "Learned positional embeddings (added to token embeddings)")
    return _heatmap_figure(
        table, lo=-bound, hi=bound, scale=DIVERGING, title=title,
        xtitle=f"embedding dimension ({d})", hover="position %{y}, dim %{x}: ", cbar="value", **common,
    )


def positional_similarity(table: np.ndarray, kind: str = "learned", *, presentation: bool = False) -> FigureSpec:
    """Position × position cosine similarity of the positional vectors, on the `DIVERGING` scale
    from −1 (blue) through 0 (white) to +1 (red).

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
        sim, lo=-1.0, hi=1.0, scale=DIVERGING, title=f"Cosine similarity between positions: {what}",
        xtitle="position", ytitle="position", hover="position %{y} vs %{x}: cosine ", cbar="cosine",
        height=460, presentation=presentation, square=True,
    )


def no_positional_encoding(*, presentation: bool = False) -> FigureSpec:
    """Placeholder for models without positional encoding."""
    return message_figure(
        "This model has no positional encoding.\nApart from the causal mask, attention cannot tell "
        "token order:\nit is permutation-invariant over the visible tokens.", presentation=presentation,
    )

