"""Attribution patching beside exact patching, numpy in, `FigureSpec` out (helpers: viz.circuits).

* `atp_scatter`: every cell of a sweep as a point, the exact share (x) against the estimated share (y), with
  the line where they are equal; cells where the estimate disagrees are red crosses, the cells re-run exactly
  as the estimate's top are ringed. Each point names its cell in the hover.
* `atp_maps`: the estimate's map and the exact sweep's map side by side (stacked when narrow) on one
  `DIVERGING` scale, symmetric around 0 and never narrower than ±1, as viz.patching draws a sweep; the cells
  where the two disagree are outlined in both, and cells not run exactly are blank.

Shares are lab.patching's: 0 = the patch changes nothing, 1 = it moves the metric all the way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ._common import (
    DIVERGING, MARK_LINES, check_flag, check_width, colorscale, esc, short_token, text_width_em, tick_step, title_text,
)
from .circuits import check_array, diverging_bar, fonts_for, head_frame, label_stride, outline
from .payload import FigureSpec

AGREE_COLOUR = "#4393c3"
DISAGREE_COLOUR = "#d6604d"
STACK_MAPS_PX = 560  # `atp_maps` laid out narrower than this puts the exact map under the estimate's


def _checked(estimate, exact, disagree, rows, columns):
    est, ex = check_array("estimate", estimate, 2), check_array("exact", exact, 2)
    if ex.shape != est.shape:
        raise ValueError(f"exact has shape {ex.shape} but estimate has {est.shape}")
    dis = np.asarray(disagree, dtype=bool)
    if dis.shape != est.shape:
        raise ValueError(f"disagree has shape {dis.shape} but estimate has {est.shape}")
    rows, columns = [str(r) for r in rows], [str(c) for c in columns]
    if (len(rows), len(columns)) != est.shape:
        raise ValueError(f"{len(rows)} row and {len(columns)} column labels for a grid of {est.shape}")
    return est, ex, dis, rows, columns


def _name(rows: list[str], columns: list[str], r: int, c: int, heads: bool) -> str:
    return f"{esc(rows[r])}{esc(columns[c])}" if heads else f"{esc(rows[r])} · “{esc(columns[c])}” ({c})"


def atp_scatter(estimate, exact, disagree, *, rows: Sequence[str], columns: Sequence[str], heads: bool,
                verified: Sequence[tuple[int, int]] = (), title: str | None = None, presentation: bool = False,
                width_px: int | None = None) -> FigureSpec:
    """Estimated against exact share, one point per cell with both (see the module docstring).

    estimate, exact (R, C): shares (NaN: not computed); disagree (R, C) bool; rows, columns: the grid's labels
    (heads: the columns are heads, else positions); verified: the cells re-run exactly as the top estimates."""
    fonts = fonts_for(presentation)
    check_width(width_px)
    check_flag("heads", heads)
    est, ex, dis, rows, columns = _checked(estimate, exact, disagree, rows, columns)
    verified = {(int(r), int(c)) for r, c in verified}
    both = np.isfinite(est) & np.isfinite(ex)
    laid = width_px or 720
    side = max(160.0, min(laid - 110.0, 460.0))
    values = np.concatenate([est[both], ex[both]]) if both.any() else np.zeros(1)
    lo, hi = min(-0.1, float(values.min())), max(1.1, float(values.max()))
    pad = 0.05 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    data = []
    for name, pick, marker in (
            ("agrees", both & ~dis, {"color": AGREE_COLOUR, "symbol": "circle", "size": 8 if presentation else 6}),
            ("disagrees", both & dis, {"color": DISAGREE_COLOUR, "symbol": "x", "size": 11 if presentation else 9})):
        rr, cc = np.nonzero(pick)
        data.append({"type": "scatter", "mode": "markers", "name": name, "x": ex[rr, cc].astype(np.float32),
                     "y": est[rr, cc].astype(np.float32), "marker": {**marker, "line": {"width": 0}},
                     "customdata": [[int(r), int(c)] for r, c in zip(rr, cc)],
                     "hovertext": [_name(rows, columns, r, c, heads) for r, c in zip(rr, cc)],
                     "hovertemplate": "%{hovertext}<br>exact %{x:.1%} · estimate %{y:.1%}<extra></extra>"})
    ring = [(r, c) for r, c in sorted(verified) if both[r, c]]
    data.append({"type": "scatter", "mode": "markers", "name": "re-run exactly (top estimates)",
                 "x": np.array([ex[r, c] for r, c in ring], dtype=np.float32),
                 "y": np.array([est[r, c] for r, c in ring], dtype=np.float32), "hoverinfo": "skip",
                 "marker": {"symbol": "circle-open", "size": 15 if presentation else 12, "color": "#808080",
                            "line": {"width": 1.5}}})
    parts = ["on the line: the estimate is exact", "red crosses: they disagree", "rings: the top cells re-run"]
    default = "Attribution patching against exact patching: each cell's share"
    layout = head_frame(title_text(title, default), parts, fonts, laid, side, 64, max(20.0, laid - 64 - side))
    axis = {"range": [lo, hi], "tickformat": ".0%", "tickfont": {"size": fonts.tick}, "showgrid": True,
            "gridcolor": "rgba(128,128,128,0.2)", "zeroline": True, "zerolinecolor": "rgba(128,128,128,0.5)",
            "fixedrange": True}
    layout.update({
        "xaxis": {**axis, "title": {"text": "exact share (patched run)", "font": {"size": fonts.tick}}},
        "yaxis": {**axis, "scaleanchor": "x", "title": {"text": "estimated share", "font": {"size": fonts.tick}}},
        "shapes": [{"type": "line", "xref": "x", "yref": "y", "x0": lo, "y0": lo, "x1": hi, "y1": hi,
                    "line": {"color": "rgba(128,128,128,0.7)", "width": 1, "dash": "dot"}, "layer": "below"}],
        "showlegend": True,  # under the x axis's ticks and title
        "legend": {"orientation": "h", "x": 0.0, "y": round(-(fonts.tick * 3.4 + 14) / side, 5), "yanchor": "top",
                   "font": {"size": fonts.tick}},
        "uirevision": "atp_scatter",
        "meta": {"viz": "atp_scatter", "pick": "cell", "heads": bool(heads), "disagree": int((both & dis).sum())},
    })
    below = math.ceil(fonts.tick * 3.4 + 14 + 3 * fonts.tick * 1.7)  # the axis title, then up to 3 legend lines
    layout["margin"]["b"] += below
    layout["height"] += below
    return FigureSpec(data, layout)


def _map_title(text: str, x: float, y: float, fonts) -> dict:
    return {"text": esc(text), "xref": "paper", "yref": "paper", "x": round(x, 5), "y": round(y, 5),
            "xanchor": "left", "yanchor": "bottom", "showarrow": False, "font": {"size": fonts.tick}}


def atp_maps(estimate, exact, disagree, *, rows: Sequence[str], columns: Sequence[str], heads: bool,
             title: str | None = None, presentation: bool = False, width_px: int | None = None) -> FigureSpec:
    """The estimate's map beside the exact sweep's, disagreements outlined in both (see the module docstring).

    estimate, exact (R, C): shares (NaN: not computed, blank); disagree (R, C) bool; rows, columns: labels;
    heads: a head sweep (its cells carry [layer, head], ``layout.meta.pick == "head"``)."""
    fonts = fonts_for(presentation)
    check_width(width_px)
    check_flag("heads", heads)
    est, ex, dis, rows, columns = _checked(estimate, exact, disagree, rows, columns)
    R, C = est.shape
    laid = width_px or 720
    stacked = laid < STACK_MAPS_PX
    left = math.ceil(max(text_width_em(r) for r in rows) * fonts.tick + 14)
    right = math.ceil(14 + (18 if presentation else 12) + 6 + 4 * fonts.tick + 10)
    gap = 16.0
    plot_w = max(120.0, laid - left - right)
    map_w = plot_w if stacked else (plot_w - gap) / 2
    both = np.concatenate([est[np.isfinite(est)], ex[np.isfinite(ex)]])
    lim = max(1.0, float(np.abs(both).max()) if both.size else 1.0)
    stride = label_stride(columns, map_w, fonts) if heads else tick_step(C, map_w, fonts.tick * 1.3)
    limit = max(2, min(12, int((map_w * stride / C - 4) / (0.6 * fonts.tick))))
    title_h = fonts.tick * 1.5 + 4
    map_h = R * max(fonts.cell_h, 150 / R)  # a map of few rows keeps a readable colour bar
    tick_h = fonts.tick * 1.4 + 8
    block = title_h + tick_h + map_h
    plot_h = 2 * block + gap if stacked else block
    data, shapes, notes = [], [], []
    for i, (name, values) in enumerate((("estimate (one backward pass)", est), ("exact (patched runs)", ex))):
        suffix = "" if i == 0 else "2"
        if stacked:
            x = (0.0, 1.0)
            top = 1 - (i * (block + gap) + title_h + tick_h) / plot_h
        else:
            x0 = i * (map_w + gap) / plot_w
            x = (x0, min(1.0, x0 + map_w / plot_w))
            top = 1 - (title_h + tick_h) / plot_h
        bottom = top - map_h / plot_h
        hover = [[f"{_name(rows, columns, r, c, heads)}<br>{esc(name.split(' (')[0])}: "
                  + (f"{100 * values[r, c]:.1f} %" if np.isfinite(values[r, c]) else "not run")
                  + ("<br>the estimate disagrees here" if dis[r, c] else "") for c in range(C)] for r in range(R)]
        trace = {"type": "heatmap", "z": values.astype(np.float32), "x0": 0, "dx": 1, "y0": 0, "dy": 1,
                 "zmin": -lim, "zmax": lim, "colorscale": colorscale(DIVERGING), "xgap": 1, "ygap": 1,
                 "hovertext": hover, "hovertemplate": "%{hovertext}<extra></extra>", "hoverongaps": False,
                 "name": name, "showscale": i == 0}
        if i == 0:
            trace["colorbar"] = diverging_bar(lim, fonts, "share", presentation)
            if stacked:  # beside the first map only
                trace["colorbar"].update(len=round(map_h / plot_h, 5), y=round(top, 5), yanchor="top")
        else:
            trace.update(xaxis="x2", yaxis="y2")
        if heads:
            trace["customdata"] = [[[r, c] for c in range(C)] for r in range(R)]
        data.append(trace)
        ticks = list(range(0, C, stride))
        x_axis = {"domain": [round(x[0], 5), round(x[1], 5)], "anchor": f"y{suffix}", "side": "top",
                  "range": [-0.5, C - 0.5], "tickmode": "array", "tickvals": ticks,
                  "ticktext": [short_token(columns[c], limit) for c in ticks], "tickfont": {"size": fonts.tick},
                  "showgrid": False, "zeroline": False, "ticks": "", "fixedrange": True}
        y_axis = {"domain": [round(max(0.0, bottom), 5), round(top, 5)], "anchor": f"x{suffix}",
                  "range": [R - 0.5, -0.5], "tickmode": "array", "tickvals": list(range(R)),
                  "ticktext": [esc(r) for r in rows], "showticklabels": i == 0 or stacked,
                  "tickfont": {"size": fonts.tick}, "showgrid": False, "zeroline": False, "ticks": "",
                  "fixedrange": True}
        notes.append(_map_title(name, x[0], min(1.0, top + tick_h / plot_h), fonts))
        shapes += [s for r, c in zip(*np.nonzero(dis))
                   for s in outline(r, c, MARK_LINES, 0.4, f"x{suffix}", f"y{suffix}")]
        data[-1]["_axes"] = (x_axis, y_axis)
    parts = ["0 = the patch changes nothing, 1 = it moves the metric all the way", "outlined = they disagree",
             "blank = not run"]
    default = "Attribution patching beside exact patching: share of the difference per cell"
    layout = head_frame(title_text(title, default), parts, fonts, laid, plot_h, left, right)
    for i, trace in enumerate(data):
        x_axis, y_axis = trace.pop("_axes")
        suffix = "" if i == 0 else "2"
        layout[f"xaxis{suffix}"], layout[f"yaxis{suffix}"] = x_axis, y_axis
    layout.update({"annotations": notes, "uirevision": "atp_maps",
                   "meta": {"viz": "atp_maps", "stacked": stacked, "range": lim,
                            "disagree": [[int(r), int(c)] for r, c in zip(*np.nonzero(dis))],
                            **({"pick": "head", "layers": R, "heads": C} if heads else {})}})
    if shapes:
        layout["shapes"] = shapes
    return FigureSpec(data, layout)
