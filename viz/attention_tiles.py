"""How an attention map travels: rectangular heatmap tiles that leave the masked cells out.

A causal map is sent as rectangular tiles: each band of B query rows becomes one
integer tile for the keys left of its diagonal block (u1 when every value ≤ 0.255, else u2) and
one float32 tile, NaN above the diagonal, for the diagonal block; fully masked tiles are not sent.
B is picked per head from {8, 16, 32, 64, T} by estimated size, and each tile overlaps its
right/lower neighbour by one cell (same values) so the separately drawn images show no seams.
Measured sizes and timings: bench/RESULTS.md. Pass the mask
(``mask=future_mask(T)``) or NaN/-inf: the model's exact zeros alone count as data, so the whole
square grid is sent instead of the tiles.
"""

from __future__ import annotations

import math

import numpy as np

from ._common import encoded_milli

_TILE_SIZES = (8, 16, 32, 64)
ATTENTION_BUDGET = 135_000  # bytes of cell data per figure, leaving room for the layout within a 150 KB target
# what one extra tile costs, in bytes-equivalent: its own JSON plus the browser's per-trace render work
_TRACE_OVERHEAD = 700


def _runs(masked: np.ndarray, b: int) -> list[tuple[int, int, int, int, bool]]:
    """Rectangles (r0, r1, c0, c1, mixed) covering every unmasked cell of a (T, T) mask.

    The grid is cut into b×b tiles; fully masked tiles are dropped, consecutive tiles of the same
    kind in a band are merged, and identical runs in consecutive bands are merged vertically.
    `mixed` rectangles hold some masked cells (sent as float32 NaN); the others hold none.
    """
    t = masked.shape[0]
    edges = np.arange(0, t, b)
    counts = np.add.reduceat(np.add.reduceat(masked.astype(np.int32), edges, 0), edges, 1)
    sizes = np.minimum(edges + b, t) - edges
    full = np.outer(sizes, sizes)
    kinds = np.where(counts == 0, 0, np.where(counts == full, 2, 1))  # 0 clean, 1 mixed, 2 masked
    done: list[list[int]] = []
    open_runs: dict[tuple[int, int, int], list[int]] = {}
    for bi, r0 in enumerate(edges):
        r1 = min(r0 + b, t)
        band: list[tuple[int, int, int]] = []
        for ci, kind in enumerate(kinds[bi]):
            if kind == 2:
                continue
            c0, c1 = int(edges[ci]), int(min(edges[ci] + b, t))
            if band and band[-1][2] == kind and band[-1][1] == c0:
                band[-1] = (band[-1][0], c1, kind)
            else:
                band.append((c0, c1, int(kind)))
        next_open: dict[tuple[int, int, int], list[int]] = {}
        for key in band:
            run = open_runs.pop(key, None)
            if run is not None and run[1] == r0:
                run[1] = r1
            else:
                run = [int(r0), int(r1), key[0], key[1], key[2]]
                done.append(run)
            next_open[key] = run
        open_runs = next_open
    return [(r0, r1, c0, c1, bool(kind)) for r0, r1, c0, c1, kind in done]


def _extend(masked: np.ndarray, run: tuple[int, int, int, int, bool]) -> tuple[int, int, int, int]:
    """Grow a rectangle by one cell right and down where that stays valid.

    Each tile is drawn as a separately positioned image at fractional pixel offsets, so abutting
    tiles leave a faint background-coloured seam. Overlapping the neighbour by one cell (same
    values) hides it. A clean tile only grows over unmasked cells; a mixed one over any cell
    row/column that holds at least one unmasked cell.
    """
    r0, r1, c0, c1, mixed = run
    t = masked.shape[0]

    def ok(region: np.ndarray) -> bool:
        return region.size > 0 and (not region.all() if mixed else not region.any())

    if c1 < t and ok(masked[r0:r1, c1]):
        c1 += 1
    if r1 < t and ok(masked[r1, c0:c1]):
        r1 += 1
    return r0, r1, c0, c1


def _run_cost(q: np.ndarray, masked: np.ndarray, run: tuple[int, int, int, int, bool]) -> int:
    r0, r1, c0, c1 = _extend(masked, run)
    width = 4 if run[4] else encoded_milli(q[r0:r1, c0:c1]).itemsize
    return math.ceil((r1 - r0) * (c1 - c0) * width / 3) * 4 + _TRACE_OVERHEAD


def heatmap_tiles(q: np.ndarray, masked: np.ndarray, xref: str, yref: str, budget: int, name: str) -> list[dict]:
    """Heatmap trace dicts (one per rectangle) for one panel of milli-unit values.

    In the browser a trace costs far more than its bytes (plotly.js draws each one separately), so
    the panel uses the fewest rectangles whose data fits in `budget` bytes (a whole panel is one
    trace when it fits); when nothing fits, the cheapest by bytes plus a per-trace cost. `name`
    ("layer 1, head 3") becomes each trace's meta, which the shared hovertemplate shows.
    """
    t = q.shape[0]  # q and masked are (T, T)
    # candidate tilings, largest tiles first; the whole panel (size t) is always one of them
    options = [_runs(masked, b) for b in sorted({b for b in _TILE_SIZES if b < t} | {t}, reverse=True)]
    # bytes only here (the per-trace cost taken back out); the trace count is weighed separately below
    costs = [sum(_run_cost(q, masked, r) - _TRACE_OVERHEAD for r in runs) for runs in options]
    fitting = [i for i, c in enumerate(costs) if c <= budget]
    if fitting:  # the fewest traces (plotly.js draws each one apart), then the fewest bytes
        best = options[min(fitting, key=lambda i: (len(options[i]), costs[i]))]
    else:  # none fits: the least bytes plus the per-trace cost
        best = options[min(range(len(options)), key=lambda i: costs[i] + _TRACE_OVERHEAD * len(options[i]))]
    q = np.where(masked, np.nan, q)  # masked cells as gaps, which the hatch shows through
    traces = []
    for run in best:
        r0, r1, c0, c1 = _extend(masked, run)  # one cell of overlap hides the seam between tiles
        trace: dict = {"type": "heatmap", "z": encoded_milli(q[r0:r1, c0:c1]), "meta": name}
        # offsets and axes only where they differ from plotly's defaults (0, x, y): less JSON per tile
        if c0:
            trace["x0"] = c0
        if r0:
            trace["y0"] = r0
        if xref != "x":
            trace["xaxis"] = xref
        if yref != "y":
            trace["yaxis"] = yref
        traces.append(trace)
    return traces
