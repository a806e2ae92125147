"""Activation patching between two prompts: the share of the A → B difference each patch restores.

* `patching_map`: one sweep as a heatmap, rows = layers, columns = heads (a head sweep) or token
  positions (the residual stream, attention output or MLP output at each position). A cell's colour
  is its share on the `DIVERGING` scale, symmetric around 0 and never narrower than ±1, so 0 (the
  patch changes nothing) is white and 1 (the patch moves the metric all the way) is deep red; the
  colour bar names both ends. Cells of a head sweep carry [layer, head] as customdata, so a click
  names the head (``layout.meta.pick == "head"``). The best cells are outlined, the selected one in
  magenta (`ROW_OUTLINE`); cells not computed (a stopped sweep) are NaN and show a dash.
* `head_on_two_prompts`: one head's attention weights on prompt A and on prompt B side by side,
  drawn like the attention grid (viz.panels); viz.compare draws B − A.

Numbers in cells and hover are percentages of the difference; every caller string is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ._common import (
    DIVERGING,
    EXPORT_BAR_PX,
    MARK_INSET,
    MARK_LINES,
    PRESENTATION_FONT_PX,
    ROW_OUTLINE,
    TEXT_GREY,
    TRANSPARENT,
    check_flag,
    check_width,
    colorscale,
    esc,
    hover_label,
    layout_frame,
    nice_ticks,
    short_token,
    text_width_em,
    tick_label,
    tick_step,
    title_text,
    wrap_parts,
    wrapped,
)
from .attention import GRID_LABEL_LIMIT, future_mask
from .panels import check_tokens, masked_cells, panels_figure
from .payload import FigureSpec

MAP_KINDS = ("heads", "positions")  # what a sweep map's rows are (model.patching.PATCH_KINDS: what one patch replaces)
NOT_RUN = "–"  # a cell the sweep did not reach
_SELECT_INSET = 0.47
STACK_PROMPTS_PX = 480  # `head_on_two_prompts` laid out narrower than this puts B under A


def _percent(value: float) -> str:
    """A share as a whole percentage ("84%", "−3%"); "0%" for values that round to zero."""
    return f"{round(100 * value) + 0:d}%".replace("-", "−")


def _check_cell(name: str, cell, n_rows: int, n_cols: int) -> tuple[int, int]:
    if not isinstance(cell, (tuple, list)) or len(cell) != 2:
        raise ValueError(f"{name} must be a (row, column) pair, got {cell!r}")
    r, c = cell
    for what, value, count in (("row", r, n_rows), ("column", c, n_cols)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < count:
            raise ValueError(f"{name} {what} must be a whole number in 0..{count - 1}, got {value!r}")
    return int(r), int(c)


def patching_map(
    share: np.ndarray,
    *,
    kind: str,
    columns: Sequence[str] | None = None,
    rows: Sequence[str] | None = None,
    metric: np.ndarray | None = None,
    ends: tuple[str, str] = ("B", "A"),
    best: Sequence[tuple[int, int]] = (),
    selected: tuple[int, int] | None = None,
    title: str | None = None,
    note: str | None = None,
    caution: str | None = None,
    scale_title: str = "share restored",
    presentation: bool = False,
    width_px: int | None = None,
) -> FigureSpec:
    """One patching sweep: `share` (R, C), the share of the difference each patch restores.

    kind "heads": rows are layers and columns heads (labels "L0", "H0" unless given); kind
    "positions": columns are token positions, `columns` their labels (required; "a→b" where the
    prompts differ). rows: R row labels. metric: (R, C) the metric of each patched run, shown in
    hover. ends: what the metric equals at share 0 and at share 1 (("B", "A") when A's activations
    are patched into B's run), named on the colour bar. best: cells outlined as the best; selected:
    the cell outlined in magenta. note: plain text under the title; caution: plain text in bold, first
    under the title, behind a warning sign (a difference too small to read, or of the wrong sign);
    scale_title: the colour bar's title (plain text, e.g. "share made" for noising). width_px: the width
    laid out for (default 720); cell text is left out where a cell is too narrow for it. Raises ValueError
    for inconsistent shapes or labels.
    """
    share, metric, columns, rows, best, selected = _checked(
        share, kind, columns=columns, rows=rows, metric=metric, ends=ends, best=best, selected=selected,
        presentation=presentation, width_px=width_px)
    n_rows, n_cols = share.shape  # (R, C): layers × heads, or layers × positions
    tick = PRESENTATION_FONT_PX if presentation else 11
    title_px = 20 if presentation else 13
    cell_h = max(40 if presentation else 28, 150 / n_rows)  # a map of few layers keeps a readable colour bar
    laid = width_px or 720
    row_labels = [esc(r) for r in rows]  # labels are the caller's text: escaped before they reach the HTML
    left = math.ceil(max(text_width_em(r) for r in rows) * tick + 14)
    right = math.ceil(14 + (18 if presentation else 12) + 6 + 5 * tick + 10)  # colour bar and its labels
    cell_px = max(1.0, (laid - left - right) / n_cols)  # a column's width; never 0, it divides below
    show_text = cell_px >= text_width_em("−100%") * tick + 6  # numbers only where the widest fits; hover has them
    col_limit = max(2, min(12, int((cell_px - 4) / (0.6 * tick))))  # a token cut to what its column holds
    # every head is numbered; token columns are thinned until their labels do not overlap
    stride = 1 if kind == "heads" else tick_step(n_cols, laid - left - right, tick * 1.3)
    col_ticks = [short_token(c, col_limit) for c in columns]
    # colours over ±1 (1 = wholly restored), wider where a share overshoots; nothing computed: ±1
    lim = max(1.0, float(np.nanmax(np.abs(share))) if np.isfinite(share).any() else 1.0)
    text, hover = _cells(share, metric, rows, columns, kind, ends, show_text)
    title = wrapped(title_text(title, _default_title(kind, ends)), (laid - 20) / title_px)
    sub_px = PRESENTATION_FONT_PX if presentation else 11
    parts = [esc(note)] if note else []
    parts.append(f"0 = the run as {esc(ends[0])}, 1 = as {esc(ends[1])}; outlined = best")
    legend = wrap_parts(parts, sub_px, laid - 20)
    if caution:  # on lines of its own, first: the map below is read through it
        warn = wrapped(f"⚠ {esc(str(caution))}", (laid - 20) / (sub_px * 1.1))  # bold runs wider
        legend = "<br>".join(f"<b>{line}</b>" for line in warn.split("<br>")) + "<br>" + legend
    x_ticks = tick * 1.4 + 8  # the column labels stand above the map (side "top"), inside the top margin
    margin = {"l": left, "r": right, "b": EXPORT_BAR_PX,
              "t": math.ceil(8 + title_px * 1.25 * (title.count("<br>") + 1)
                             + sub_px * (1.6 + 1.3 * (legend.count("<br>") + 1)) + 6 + x_ticks)}
    height = math.ceil(margin["t"] + margin["b"] + n_rows * cell_h)
    trace = _trace(share, hover, text if show_text else None, lim, ends, tick, presentation)
    trace["colorbar"]["title"]["text"] = esc(scale_title)
    if kind == "heads":  # a head's cell carries its (layer, head): a click opens that head
        trace["customdata"] = [[[r, c] for c in range(n_cols)] for r in range(n_rows)]
    layout = {
        **layout_frame(font_px=tick, height=height, margin=margin, title=title, title_px=title_px, subtitle=legend,
                       subtitle_px=sub_px),
        "xaxis": {"side": "top", "range": [-0.5, n_cols - 0.5], "tickmode": "array",
                  "tickvals": list(range(0, n_cols, stride)), "ticktext": col_ticks[::stride],
                  "tickfont": {"size": tick}, "showgrid": False, "zeroline": False, "ticks": "", "fixedrange": True},
        "yaxis": {"range": [n_rows - 0.5, -0.5], "tickmode": "array", "tickvals": list(range(n_rows)),
                  "ticktext": row_labels, "tickfont": {"size": tick}, "showgrid": False, "zeroline": False,
                  "ticks": "", "fixedrange": True},
        "hoverlabel": hover_label(18 if presentation else 12),
        "hovermode": "closest",
        "uirevision": f"patching_{kind}",
        "meta": {"viz": "patching_map", "kind": kind, "range": lim, "ends": [esc(e) for e in ends],
                 "best": [list(b) for b in best], "selected": None if selected is None else list(selected),
                 **({"pick": "head", "layers": n_rows, "heads": n_cols} if kind == "heads" else {})},
    }
    shapes, annotations = _marks(share, best, selected, tick)  # outlines of best and selected, "–" on cells not run
    if shapes:
        layout["shapes"] = shapes
    if annotations:
        layout["annotations"] = annotations
    return FigureSpec([trace], layout)


def _checked(share, kind, columns, rows, metric, ends, best, selected, presentation, width_px):
    """`patching_map`'s input checked: share (and metric) as float64, the labels as strings
    (defaults filled in), the marked cells as (row, column) pairs."""
    check_flag("presentation", presentation)
    check_width(width_px)
    if kind not in MAP_KINDS:
        raise ValueError(f"kind must be one of {MAP_KINDS}, got {kind!r}")
    share = np.asarray(share, dtype=np.float64)
    if share.ndim != 2 or share.shape[0] < 1 or share.shape[1] < 1:
        raise ValueError(f"share must be 2-D (rows, columns) with at least one of each, got shape {share.shape}")
    n_rows, n_cols = share.shape
    # NaN is allowed (a cell the sweep did not reach, drawn as a dash); an infinity has no colour to give
    if np.isinf(share).any():
        raise ValueError("share must be finite (NaN marks a cell not computed)")
    if metric is not None:  # each patched run's own metric, which the hover gives beside its share
        metric = np.asarray(metric, dtype=np.float64)
        if metric.shape != share.shape:
            raise ValueError(f"metric has shape {metric.shape} but share has {share.shape}")
    if kind == "positions" and columns is None:
        raise ValueError("a position sweep needs its token labels (columns)")
    # a head sweep may leave the labels out: heads "H0", "H1", … across, layers "L0", "L1", … down
    columns = [f"H{c}" for c in range(n_cols)] if columns is None else [str(c) for c in columns]
    rows = [f"L{r}" for r in range(n_rows)] if rows is None else [str(r) for r in rows]
    if len(columns) != n_cols:
        raise ValueError(f"share has {n_cols} columns but {len(columns)} column labels were given")
    if len(rows) != n_rows:
        raise ValueError(f"share has {n_rows} rows but {len(rows)} row labels were given")
    if isinstance(ends, str) or len(ends) != 2:  # "BA" has length 2 too: a string is refused before the length
        raise ValueError(f"ends must be two names (share 0, share 1), got {ends!r}")
    best = [_check_cell("best", b, n_rows, n_cols) for b in best]
    selected = None if selected is None else _check_cell("selected", selected, n_rows, n_cols)

    return share, metric, columns, rows, best, selected


def _trace(share: np.ndarray, hover: list, text: list | None, lim: float, ends: tuple[str, str], tick: float,
           presentation: bool) -> dict:
    """The sweep's heatmap: shares on the diverging scale ±`lim`, the colour bar naming 0 and 1."""
    ticks = sorted(set(nice_ticks(-lim, lim, 5).tolist()) | {0.0, 1.0})
    trace = {
        "type": "heatmap", "z": share.astype(np.float32), "x0": 0, "dx": 1, "y0": 0, "dy": 1,
        "zmin": -lim, "zmax": lim, "colorscale": colorscale(DIVERGING), "xgap": 2, "ygap": 2,
        "hovertext": hover, "hovertemplate": "%{hovertext}<extra></extra>", "hoverongaps": False,
        "colorbar": {"title": {"text": "share restored", "side": "right", "font": {"size": tick}},
                     "tickmode": "array", "tickvals": ticks,
                     "ticktext": [_end_tick(v, ends) for v in ticks],
                     "tickfont": {"size": tick}, "thickness": 18 if presentation else 12, "outlinewidth": 0,
                     "len": 1.0},
    }
    if text is not None:
        trace.update(text=text, texttemplate="%{text}", textfont={"size": tick})
    return trace


def _default_title(kind: str, ends: tuple[str, str]) -> str:
    what = "each head's output" if kind == "heads" else "each layer at each position"
    return f"Patching {what}: share of the {esc(ends[0])} → {esc(ends[1])} difference restored"


def _end_tick(value: float, ends: tuple[str, str]) -> str:
    if value == 0.0:
        return f"0 = {esc(ends[0])}"
    if value == 1.0:
        return f"1 = {esc(ends[1])}"
    return tick_label(value)


def _cells(share: np.ndarray, metric: np.ndarray | None, rows: list[str], columns: list[str], kind: str,
           ends: tuple[str, str], show_text: bool) -> tuple[list[list[str]], list[list[str]]]:
    """Each cell's text (its percentage, "" where not computed) and hover."""
    text, hover = [], []
    for r, row in enumerate(rows):
        text_row, hover_row = [], []
        for c, col in enumerate(columns):
            v = share[r, c]
            where = f"{esc(row)}{esc(col)}" if kind == "heads" else f"{esc(row)} · “{esc(col)}” (position {c})"
            if not np.isfinite(v):
                text_row.append("")
                hover_row.append(f"{where}<br>not computed (the sweep was stopped)")
                continue
            text_row.append(_percent(v) if show_text else "")
            line = f"{where}<br>restores {100 * v:.1f} % of the {esc(ends[0])} → {esc(ends[1])} difference"
            if metric is not None and np.isfinite(metric[r, c]):
                line += f"<br>metric of the patched run: {metric[r, c]:.4f}"
            hover_row.append(line)
        text.append(text_row)
        hover.append(hover_row)
    return text, hover


def _marks(share: np.ndarray, best: list[tuple[int, int]], selected: tuple[int, int] | None,
           tick: float) -> tuple[list[dict], list[dict]]:
    """Outlines of the best cells and the selected one, and a dash on each cell not computed."""
    shapes: list[dict] = []
    for r, c in best:
        for line in MARK_LINES:
            shapes.append({"type": "rect", "xref": "x", "yref": "y", "x0": c - MARK_INSET, "x1": c + MARK_INSET,
                           "y0": r - MARK_INSET, "y1": r + MARK_INSET, "line": dict(line),
                           "fillcolor": TRANSPARENT, "layer": "above"})
    if selected is not None:
        r, c = selected
        for line in ROW_OUTLINE:
            shapes.append({"type": "rect", "xref": "x", "yref": "y", "x0": c - _SELECT_INSET, "x1": c + _SELECT_INSET,
                           "y0": r - _SELECT_INSET, "y1": r + _SELECT_INSET, "line": dict(line),
                           "fillcolor": TRANSPARENT, "layer": "above"})
    annotations = [{"text": NOT_RUN, "xref": "x", "yref": "y", "x": int(c), "y": int(r), "showarrow": False,
                    "font": {"size": tick, "color": TEXT_GREY}} for r, c in zip(*np.nonzero(np.isnan(share)))]
    return shapes, annotations


def head_on_two_prompts(
    weights_a: np.ndarray,
    weights_b: np.ndarray,
    tokens: Sequence[str],
    *,
    layer: int,
    head: int,
    causal: bool,
    width_px: int = 720,
    max_height_px: int | None = None,
    presentation: bool = False,
    title: str | None = None,
) -> FigureSpec:
    """One head's attention weights on prompt A and on prompt B, side by side on one scale (0–1).

    weights_a, weights_b: (T, T) each, over the same positions; tokens: T labels ("a→b" where the
    prompts differ). Drawn by viz.panels like the attention grid (rows = queries; under `STACK_PROMPTS_PX`
    wide, B under A); causal: the future
    cells are hatched. Both panels name [layer, head] in layout.meta.panels. Raises ValueError for
    inconsistent shapes.
    """
    check_flag("causal", causal)
    check_flag("presentation", presentation)
    arrays = []
    for name, w in (("weights_a", weights_a), ("weights_b", weights_b)):
        w = np.asarray(w, dtype=np.float64)
        if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 1:
            raise ValueError(f"{name} must be square (T, T), got shape {w.shape}")
        arrays.append(w)
    if arrays[0].shape != arrays[1].shape:
        raise ValueError(f"weights_a has shape {arrays[0].shape} but weights_b has {arrays[1].shape}")
    for what, value in (("layer", layer), ("head", head)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{what} must be a whole number ≥ 0, got {value!r}")
    t = arrays[0].shape[0]
    tokens = check_tokens(tokens, t)
    values = np.stack(arrays)  # (2, T, T)
    masked = np.broadcast_to(masked_cells(values, future_mask(t) if causal else None), values.shape)
    default = f"L{int(layer)}H{int(head)}: attention weights on prompt A and on prompt B"
    return panels_figure(
        values, masked, tokens, ncols=1 if width_px < STACK_PROMPTS_PX else 2, panels=[(int(layer), int(head))] * 2, panel_titles=["prompt A", "prompt B"],
        row_titles=None, kind="weights", title=title_text(title, default), width_px=width_px,
        max_height_px=max_height_px, focus=GRID_LABEL_LIMIT, presentation=presentation,
    )
