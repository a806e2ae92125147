"""Where the attention panels go: fonts, panel size, margins, columns and tick-label stride.

A figure is laid out for a width (and at most a height): panels stay square, and the tick labels
take the largest font whose labels do not overlap, else every k-th token is labelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._common import PRESENTATION_FONT_PX, READABLE_TICK_PX

@dataclass(frozen=True)
class Fonts:
    tick_min: float  # below this the labels are thinned instead of shrunk
    tick_max: float
    title: float
    sub: float
    axis_title: float
    panel_title: float
    hover: float
    colorbar: float
    cb_thick: int
    gap: float  # px between panel columns
    goal_cell: float  # px per cell a grid tries to give every token label
    # Large fonts (projecting) stay readable at any text length: a panel is never smaller than its visible
    # tokens × min_cell px (one head / a grid of them), up to min_panel_cap px, even where the figure then
    # passes its height limit (the page scrolls; layout.meta.raised says so): a projector's 720 px would
    # otherwise leave GPT-2's one head ~115 px and six heads ~60 px each, labelled every 8th token.
    min_cell_one: float = 0.0
    min_cell_grid: float = 0.0
    min_panel_cap_one: float = 0.0
    min_panel_cap_grid: float = 0.0


NORMAL_FONTS = Fonts(tick_min=READABLE_TICK_PX, tick_max=12, title=14, sub=11, axis_title=11, panel_title=11, hover=12,
                 colorbar=10, cb_thick=12, gap=12, goal_cell=16)
PRESENTING_FONTS = Fonts(tick_min=PRESENTATION_FONT_PX, tick_max=20, title=22, sub=16, axis_title=17, panel_title=17,
                     hover=18, colorbar=16, cb_thick=18, gap=18, goal_cell=PRESENTATION_FONT_PX * 1.25,
                     # one head: every 2nd token labelled at 16 px (up to 220 px panels); a grid: every 3rd (up to 140 px)
                     min_cell_one=10, min_cell_grid=6.7, min_panel_cap_one=220, min_panel_cap_grid=140)
_LINE = 1.25  # label pitch / font size: labels closer than this overlap
SCALE_BELOW_PX = 480  # figures laid out narrower than this (phones) put the colour bar under the panels
_MIN_PANEL_PX = 24


@dataclass(frozen=True)
class Labels:
    font: float
    step: int
    rotate: bool


@dataclass(frozen=True)
class Geometry:
    ncols: int
    nrows: int
    panel: float
    height: int
    margin: dict
    hgap: float
    vgap: float
    labels: Labels
    raised: bool = False  # the panels were kept at their readable minimum past the height limit


def below_y(geo: "Geometry", labels: "Labels", fonts: Fonts, plot_h: float) -> float:
    """Paper y of a colour bar laid under the panels: below the key labels and the axis title."""
    label_em = (geo.margin["b"] - (fonts.cb_thick + fonts.colorbar * 1.5 + fonts.axis_title * 1.5 + 14)) / plot_h
    return round(-label_em, 4)


def _labels_for(cell: float, fonts: Fonts, label_em: float) -> Labels:
    """Tick font and stride for cells `cell` px apart: the largest font up to tick_max whose labels
    do not overlap, every label while that font is ≥ tick_min, else tick_min and every step-th."""
    font = min(fonts.tick_max, math.floor(cell / _LINE))
    if font >= fonts.tick_min:
        step = 1
    else:
        font = fonts.tick_min
        step = math.ceil(font * _LINE / cell)
    rotate = label_em * font + 4 > cell * step
    return Labels(float(font), step, rotate)


def min_panel(fonts: Fonts, n: int, visible: int) -> float:
    """The smallest panel (px) readable with `visible` tokens across it: one head or a grid of n."""
    if n == 1:
        return min(fonts.min_panel_cap_one, visible * fonts.min_cell_one)
    return min(fonts.min_panel_cap_grid, visible * fonts.min_cell_grid)


def grid_geometry(n: int, ncols: int, visible: int, *, fonts: Fonts, label_em: float, cb_em: float, width_px: int,
              max_height_px: int | None, show_scale: bool, sub_lines: int, panel_titles: bool | int,
              row_title_lines: int, title_lines: int = 1) -> Geometry:
    """Margins, panel size and tick labels for n square panels in `ncols` columns, `visible`
    positions across each, laid out for `width_px` and (if given) at most `max_height_px` tall, but
    never smaller than `min_panel` where the width allows (the figure is then taller than the limit).
    panel_titles: the lines of the panels' titles (True = 1, False = none).
    Margins depend on the label font, which depends on the panel size: iterated to a fixed point,
    then the smaller font / larger stride of the last two rounds is kept so labels never overlap."""
    nrows = math.ceil(n / ncols)  # the last row may be partly empty
    title_rows = int(panel_titles)
    least = min_panel(fonts, n, visible)
    raised = False
    hgap = fonts.gap
    labels = Labels(fonts.tick_max, 1, True)  # start from the largest font, every label, rotated
    # at most six rounds: a layout that has not settled by then takes the loop's else branch below
    for _ in range(6):
        lab_w = label_em * labels.font
        xlab_h = lab_w if labels.rotate else labels.font * 1.3  # rotated key labels stand as tall as they are wide
        below = show_scale and width_px < SCALE_BELOW_PX  # a phone: the colour bar goes under the panels
        margin = {
            "l": math.ceil(lab_w + 6 + fonts.axis_title * 1.3 * row_title_lines + 10),
            # the colour bar, its labels and title at the right, unless it lies under the panels (or there is none)
            "r": math.ceil(10 + fonts.cb_thick + 6 + cb_em * fonts.colorbar + fonts.axis_title * 1.4 + 10)
            if show_scale and not below else 14,
            # title 8 px from the top; plotly.js puts a subtitle 1.6 em below the title's box
            "t": math.ceil(8 + fonts.title * 1.25 * title_lines
                           + (fonts.sub * (1.6 + 1.3 * sub_lines) if sub_lines else 0) + 8
                           + (fonts.panel_title * (0.3 + 1.2 * title_rows) if title_rows else 0)),
            # the key labels and axis title, then the colour bar where it lies under the panels
            "b": math.ceil(xlab_h + 6 + fonts.axis_title * 1.3 + 10
                           + (fonts.cb_thick + fonts.colorbar * 1.5 + fonts.axis_title * 1.5 + 14 if below else 0)),
        }
        vgap = (fonts.panel_title * (0.3 + 1.2 * title_rows) + 8) if title_rows else 12  # the next row's titles
        panel = (width_px - margin["l"] - margin["r"] - (ncols - 1) * hgap) / ncols
        if max_height_px is not None:  # shrink to the limit, but not under `least`: raised when that breaks it
            fit = (max_height_px - margin["t"] - margin["b"] - (nrows - 1) * vgap) / nrows
            raised = fit < least and panel > fit
            panel = min(panel, max(fit, least))
        panel = max(float(_MIN_PANEL_PX), panel)  # a floor even when the width cannot give `least`
        new = _labels_for(panel / visible, fonts, label_em)
        if new == labels:  # the labels the margins were sized for are the ones the panel gets: settled
            break
        last, labels = labels, new
    else:  # no fixed point (the font flips between two sizes): the safer of the last two
        labels = Labels(min(last.font, labels.font), max(last.step, labels.step), last.rotate or labels.rotate)
    height = margin["t"] + margin["b"] + nrows * panel + (nrows - 1) * vgap
    if max_height_px is not None and not raised:  # a raised figure keeps its readable panels, past the limit
        height = min(height, max_height_px)
    return Geometry(ncols=ncols, nrows=nrows, panel=panel, height=int(math.floor(height)), margin=margin, hgap=hgap,
                    vgap=vgap, labels=labels, raised=raised)


def pick_columns(n: int, visible: int, fonts: Fonts, max_height_px: int | None, **kw) -> Geometry:
    """Columns for a grid of n panels: the most columns (up to 4, or 6 for more than 4 panels, no
    emptier rows than needed) whose cells reach fonts.goal_cell px; if none does, the largest panels
    under a height limit (a page of 6 heads in a low figure: one row), else 2 columns (T > 12 at the
    default width: labels stay legible). Without a height limit a single column is never chosen for
    several panels."""
    most = 4 if n <= 4 else 6
    options = sorted({math.ceil(n / rows) for rows in range(1, n + 1) if math.ceil(n / rows) <= most}, reverse=True)
    if max_height_px is None:  # no height limit: one column would only make the figure taller
        options = [c for c in options if c >= min(n, 2)]
    geoms = [grid_geometry(n, c, visible, fonts=fonts, max_height_px=max_height_px, **kw) for c in options]
    for g in geoms:
        if g.panel / visible >= fonts.goal_cell:
            return g
    if max_height_px is not None:
        return max(geoms, key=lambda g: (round(g.panel), g.ncols))
    return next(g for g in geoms if g.ncols <= 2)
