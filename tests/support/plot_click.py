"""A real mouse click on a point of a Plotly figure of the page, made so that it lands and counts.

A click computed from a figure's layout misses when the figure is drawn again between the reading and the
click (an answer redraws it, a tab shown resizes it), when a loading overlay lies over it, or when plotly has
no hover on that point (plotly reports a click with the points its hover found). So `click_plot` waits until
nothing is on its way (`Page.idle`), reads the point until two frames in a row agree and nothing but the
figure lies over it, moves the mouse there and waits until plotly's hover is on that panel, then clicks.

It then reads what the page's own handler (assets/explore.js) recorded for the server: a pick of a head
("layer,head" in `window.decoderLab.pick` or `.patchPick`) or a cell (`.cell`). The handler runs during the
click's own events, so an empty record after the click proves the click did not count, and only then is it
made again: a click that counted is never repeated (a second pick would take the head back out).
"""

from __future__ import annotations

from tests.support.browser import ANSWER_MS, Page

# `where` functions, (gd, arg) => {x, y, xaxis, yaxis}: a point in the figure's own pixels (from the top-left
# of its plot area's svg) and the axes of the panel it lies in.

# The centre of cell [row, col] of panel k (0: the first) of a heatmap figure.
CELL = """(gd, [row, col, k]) => {
  const L = gd._fullLayout, sfx = k ? String(k + 1) : '';
  const xa = L['xaxis' + sfx], ya = L['yaxis' + sfx];
  return {x: xa._offset + xa.l2p(col), y: ya._offset + ya.l2p(row), xaxis: xa._id, yaxis: ya._id};
}"""

# A point inside the attention panel of head `h` (layout.meta.panels names each panel's axes), off its diagonal.
PANEL = """(gd, h) => {
  const L = gd._fullLayout, panel = L.meta.panels.find(q => q.head === h);
  const xa = L['xaxis' + panel.xaxis.slice(1)], ya = L['yaxis' + panel.yaxis.slice(1)];
  return {x: xa._offset + xa._length * 0.2, y: ya._offset + ya._length * 0.9, xaxis: xa._id, yaxis: ya._id};
}"""

# Which record the page's click handler writes for each figure: a head's pick, a patched head, a cell.
RECORD = {"head_roles": "pick", "cmp_scores": "pick", "patch_map": "patchPick", "attention": "cell",
          "inside_matrices": "cell"}
HOOK = {"pick": "_labPick", "patchPick": "_labPick", "cell": "_labCell"}  # set once explore.js listens

STEADY = """([e, a, hook]) => {
  const gd = document.querySelector('#' + e + ' .js-plotly-plot');
  const svg = gd && gd.querySelector('.main-svg');
  if (!svg || !gd._fullLayout || !gd[hook]) return false;
  const where = WHERE;
  const w = where(gd, a), box = svg.getBoundingClientRect();
  const point = [box.x + w.x, box.y + w.y, w.xaxis, w.yaxis];
  const seen = JSON.stringify(point), before = gd.__labSteady;
  gd.__labSteady = seen;  // kept on this figure's element: a figure made anew starts over
  if (point[1] < 0 || point[1] >= innerHeight || point[0] < 0 || point[0] >= innerWidth) {
    window.scrollBy(point[0] < 0 || point[0] >= innerWidth ? point[0] - innerWidth / 2 : 0,
                    point[1] < 0 || point[1] >= innerHeight ? point[1] - innerHeight / 2 : 0);
    return false;
  }
  if (seen !== before) return false;
  const hit = document.elementFromPoint(point[0], point[1]);
  return hit && gd.contains(hit) ? point : false;
}"""

HOVERED = """([e, xa, ya]) => {
  const gd = document.querySelector('#' + e + ' .js-plotly-plot');
  const h = gd && gd._hoverdata;
  return !!h && h.length > 0 && h.some(d => d.xaxis && d.xaxis._id === xa && d.yaxis && d.yaxis._id === ya);
}"""


def click_plot(p: Page, elem: str, where: str, arg, record: str | None = None, tries: int = 4) -> str:
    """A real mouse click at the point of figure #`elem` that `where` (a JS function, see CELL) gives for `arg`,
    made again only while it provably did not count; what the page recorded for the server (`record`, by
    default RECORD[elem]: "layer,head" for a head, "layer,head,query,key" for a cell)."""
    record = record or RECORD[elem]
    steady = STEADY.replace("WHERE", where)
    for _ in range(tries):
        p.idle()
        x, y, xa, ya = p.page.wait_for_function(steady, arg=[elem, arg, HOOK[record]], timeout=ANSWER_MS).json_value()
        p.page.evaluate("k => { window.decoderLab[k] = null; }", record)
        p.page.mouse.move(0, 0)  # off the figure first: plotly forgets its hover, and the next one is this point's
        p.page.mouse.move(x, y)
        try:
            p.page.wait_for_function(HOVERED, arg=[elem, xa, ya], timeout=10_000)
        except Exception:  # noqa: BLE001 - drawn again under the pointer before plotly hovered: start over
            continue
        p.page.mouse.click(x, y)
        got = p.page.evaluate("k => new Promise(r => requestAnimationFrame(() => r(window.decoderLab[k] ?? null)))",
                              record)
        if got is not None:
            return got
    raise AssertionError(f"a click on #{elem} ({arg}) never reached the page's handler in {tries} tries")


def click_cell(p: Page, elem: str, row: float, col: float, panel: int = 0, record: str | None = None) -> str:
    """A real mouse click on the centre of cell (row, col) of a figure's panel (an overview: row = layer, col =
    head); what the page recorded."""
    return click_plot(p, elem, CELL, [row, col, panel], record)
