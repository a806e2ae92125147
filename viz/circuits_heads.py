"""One head's circuits (Elhage et al., 2021) as figures, numpy in, `FigureSpec` out (helpers: viz.circuits).

* `ov_table`: what the head writes for each token it reads: a row per input token, a column per rank, each
  cell the written token with its OV-circuit entry as colour (`DIVERGING`, symmetric around 0); where the
  head writes the very token it reads the cell is outlined (copying). The copying score is in the note.
* `ov_spectrum`: the OV circuit's nonzero eigenvalues in the complex plane (red: positive real part, blue:
  negative): a copying head's lie on the positive real side, and its copying score Σ Re λ / Σ |λ| is near 1.
* `qk_map`: the QK circuit on the prompt's tokens, query token (rows) × key token (columns), `DIVERGING`:
  the bilinear score of the two tokens' embeddings alone, or with their positions; keys the layer's mask hides
  are left blank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ._common import (
    DIVERGING, MARK_LINES, ROW_OUTLINE, TRANSPARENT, check_width, colorscale, esc, short_token, text_width_em,
    tick_step, title_text,
)
from .circuits import SELECT_INSET, check_array, diverging_bar, fonts_for, head_frame, outline, signed
from .payload import FigureSpec

OV_CELL_CHARS = 8  # a written token is cut to this many characters in its cell (hover has it whole)


def _tokens(name: str, tokens: Sequence[str], n: int) -> list[str]:
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"{name} has {len(tokens)} labels for {n} rows")
    return tokens


def ov_table(inputs: Sequence[str], top_tokens: Sequence[Sequence[str]], top_values, *, copying: float,
             layer: int, head: int, title: str | None = None, presentation: bool = False,
             width_px: int | None = None) -> FigureSpec:
    """The top tokens the head writes for each input token (see the module docstring).

    inputs: n token labels; top_tokens: n rows of k written tokens, largest first; top_values (n, k): their
    entries of the OV circuit W_E W_OV W_U; copying: the head's copying score."""
    fonts = fonts_for(presentation)
    check_width(width_px)
    values = check_array("top_values", top_values, 2)
    n, k = values.shape
    inputs = _tokens("inputs", inputs, n)
    rows = [_tokens("top_tokens row", r, k) for r in top_tokens]
    if len(rows) != n:
        raise ValueError(f"top_tokens has {len(rows)} rows for {n} inputs")
    laid = width_px or 720
    left = math.ceil(max(text_width_em(short_token(t)) for t in inputs) * fonts.tick + 14)
    right = math.ceil(14 + (18 if presentation else 12) + 6 + 4 * fonts.tick + 10)
    cell_w = max(1.0, (laid - left - right) / k)
    room = max(1, min(OV_CELL_CHARS, int((cell_w - 6) / (0.6 * fonts.tick))))
    lim = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
    lim = lim or 1.0
    text = [[short_token(t, room) for t in r] for r in rows]
    hover = [[f"reads “{esc(inputs[i])}” → writes “{esc(rows[i][j])}” (rank {j + 1}): {signed(values[i, j], 4)}"
              for j in range(k)] for i in range(n)]
    trace = {"type": "heatmap", "z": values.astype(np.float32), "x0": 0, "dx": 1, "y0": 0, "dy": 1,
             "zmin": -lim, "zmax": lim, "colorscale": colorscale(DIVERGING), "xgap": 2, "ygap": 2,
             "text": text, "texttemplate": "%{text}", "textfont": {"size": fonts.tick}, "hovertext": hover,
             "hovertemplate": "%{hovertext}<extra></extra>", "colorbar": diverging_bar(lim, fonts, "OV entry",
                                                                                       presentation)}
    parts = [f"copying score {signed(copying)} (1: it writes what it reads)", "outlined = the token read"]
    default = f"L{int(layer)}H{int(head)}: the tokens it writes for each token it reads (OV circuit)"
    layout = head_frame(title_text(title, default), parts, fonts, laid, n * fonts.cell_h * 0.8 + 8, left, right,
                        top_extra=fonts.tick * 1.4 + 8)
    layout.update({
        "xaxis": {"side": "top", "range": [-0.5, k - 0.5], "tickmode": "array", "tickvals": list(range(k)),
                  "ticktext": [f"#{j + 1}" for j in range(k)], "tickfont": {"size": fonts.tick}, "showgrid": False,
                  "zeroline": False, "ticks": "", "fixedrange": True},
        "yaxis": {"range": [n - 0.5, -0.5], "tickmode": "array", "tickvals": list(range(n)),
                  "ticktext": [short_token(t) for t in inputs], "tickfont": {"size": fonts.tick}, "showgrid": False,
                  "zeroline": False, "ticks": "", "fixedrange": True},
        "uirevision": "ov_table",
        "meta": {"viz": "ov_table", "layer": int(layer), "head": int(head), "copying": float(copying)},
    })
    shapes = [s for i in range(n) for j in range(k) if rows[i][j] == inputs[i]
              for s in outline(i, j, MARK_LINES, 0.44)]
    if shapes:
        layout["shapes"] = shapes
    return FigureSpec([trace], layout)


def ov_spectrum(eigenvalues, *, copying: float, layer: int, head: int, title: str | None = None,
                presentation: bool = False, width_px: int | None = None) -> FigureSpec:
    """The OV circuit's nonzero eigenvalues as points of the complex plane (see the module docstring)."""
    fonts = fonts_for(presentation)
    check_width(width_px)
    lam = np.asarray(eigenvalues, dtype=np.complex128).ravel()
    if lam.size == 0 or not np.isfinite(lam).all():
        raise ValueError("eigenvalues must be a non-empty array of finite (complex) numbers")
    laid = width_px or 720
    side = max(160.0, min(laid - 120.0, 420.0))
    reach = float(np.abs(lam).max()) * 1.1 or 1.0
    colours = ["#b2182b" if v.real >= 0 else "#2166ac" for v in lam]
    trace = {"type": "scatter", "mode": "markers", "x": lam.real.astype(np.float32), "y": lam.imag.astype(np.float32),
             "marker": {"size": 9 if presentation else 7, "color": colours, "line": {"width": 0}},
             "hovertemplate": "λ = %{x:.4g} + %{y:.4g}i<extra></extra>", "name": "eigenvalues"}
    parts = [f"copying score Σ Re λ / Σ |λ| = {signed(copying)}", "red: Re λ ≥ 0 (copies), blue: Re λ < 0"]
    default = f"L{int(layer)}H{int(head)}: eigenvalues of its OV circuit"
    layout = head_frame(title_text(title, default), parts, fonts, laid, side, 60, max(20.0, laid - 60 - side))
    axis = {"range": [-reach, reach], "zeroline": True, "zerolinecolor": "rgba(128,128,128,0.6)", "showgrid": False,
            "tickfont": {"size": fonts.tick}, "fixedrange": True}
    # the axis titles a few px from their tick labels (plotly measures those), with room for the x axis's below
    layout["margin"]["b"] += math.ceil(fonts.tick * 2.9 + 10)
    layout["height"] += math.ceil(fonts.tick * 2.9 + 10)
    layout.update({"xaxis": {**axis, "title": {"text": "Re λ", "font": {"size": fonts.tick}, "standoff": 4}},
                   "yaxis": {**axis, "title": {"text": "Im λ", "font": {"size": fonts.tick}, "standoff": 4},
                             "scaleanchor": "x"},
                   "showlegend": False, "uirevision": "ov_spectrum",
                   "meta": {"viz": "ov_spectrum", "layer": int(layer), "head": int(head), "copying": float(copying)}})
    return FigureSpec([trace], layout)


def qk_map(scores, tokens: Sequence[str], allowed, *, layer: int, head: int, positional: bool,
           selected_query: int | None = None, title: str | None = None, presentation: bool = False,
           width_px: int | None = None) -> FigureSpec:
    """The QK circuit on the prompt's tokens (see the module docstring).

    scores (T, T): rows the query token, columns the key token; allowed (T, T) bool: the keys the layer's mask
    lets each query read (the others are blank); positional: whether the scores include the positions (the
    title says which). selected_query: a row outlined."""
    fonts = fonts_for(presentation)
    check_width(width_px)
    scores = check_array("scores", scores, 2)
    T = scores.shape[0]
    if scores.shape != (T, T):
        raise ValueError(f"scores must be square (T, T), got shape {scores.shape}")
    allowed = np.asarray(allowed, dtype=bool)
    if allowed.shape != (T, T):
        raise ValueError(f"allowed has shape {allowed.shape} but scores have {scores.shape}")
    tokens = _tokens("tokens", tokens, T)
    if selected_query is not None and (isinstance(selected_query, bool) or not isinstance(selected_query, int)
                                       or not 0 <= selected_query < T):
        raise ValueError(f"selected_query must be a row in 0..{T - 1}, got {selected_query!r}")
    laid = width_px or 720
    left = math.ceil(max(text_width_em(short_token(t)) for t in tokens) * fonts.tick + 14 + fonts.tick * 1.8)
    right = math.ceil(14 + (18 if presentation else 12) + 6 + 4 * fonts.tick + 10)
    side = max(60.0, laid - left - right)
    shown = np.where(allowed, scores, np.nan)
    lim = float(np.nanmax(np.abs(shown))) if np.isfinite(shown).any() else 1.0
    lim = lim or 1.0
    stride = tick_step(T, side, fonts.tick * 1.3)
    trace = {"type": "heatmap", "z": shown.astype(np.float32), "x0": 0, "dx": 1, "y0": 0, "dy": 1, "zmin": -lim,
             "zmax": lim, "colorscale": colorscale(DIVERGING), "hoverongaps": False,
             "hovertext": [[f"query “{esc(tokens[q])}” ({q}) → key “{esc(tokens[k])}” ({k})" for k in range(T)]
                           for q in range(T)],
             "hovertemplate": "%{hovertext}<br>score %{z:.4g}<extra></extra>",
             "colorbar": diverging_bar(lim, fonts, "score", presentation)}
    which = "with positions" if positional else "tokens alone (no positions)"
    parts = ["x_i W_Q W_Kᵀ x_jᵀ × scale, before the softmax", "blank = the mask hides the key"]
    default = f"L{int(layer)}H{int(head)}: QK circuit on the prompt's tokens, {which}"
    rotated = T > 8  # token labels stand upright above the columns: as tall as the longest is wide
    above = max(text_width_em(short_token(t)) for t in tokens) * fonts.tick if rotated else fonts.tick * 1.4
    layout = head_frame(title_text(title, default), parts, fonts, laid, side, left, right,
                        top_extra=above + fonts.tick * 1.4 + 8)
    ticks = list(range(0, T, stride))
    axis = {"tickmode": "array", "tickvals": ticks, "tickfont": {"size": fonts.tick}, "showgrid": False,
            "zeroline": False, "ticks": "", "fixedrange": True}
    layout.update({
        "xaxis": {**axis, "side": "top", "range": [-0.5, T - 0.5], "ticktext": [short_token(tokens[i]) for i in ticks],
                  "tickangle": -90 if rotated else 0, "constrain": "domain",
                  "title": {"text": "key token", "font": {"size": fonts.tick}}},
        "yaxis": {**axis, "range": [T - 0.5, -0.5], "ticktext": [short_token(tokens[i]) for i in ticks],
                  "scaleanchor": "x", "constrain": "domain",
                  "title": {"text": "query token", "font": {"size": fonts.tick}}},
        "uirevision": "qk_map",
        "meta": {"viz": "qk_map", "layer": int(layer), "head": int(head), "positional": bool(positional),
                 "tokens": [esc(t) for t in tokens], "selected_query": selected_query},
    })
    if selected_query is not None:
        q = selected_query
        layout["shapes"] = [{"type": "rect", "xref": "x", "yref": "y", "x0": -0.5, "x1": T - 0.5,
                             "y0": q - SELECT_INSET, "y1": q + SELECT_INSET, "line": dict(line),
                             "fillcolor": TRANSPARENT, "layer": "above"} for line in ROW_OUTLINE]
    return FigureSpec([trace], layout)
