"""What a Plotly figure of the page actually draws, read in the browser: the heatmaps' painted pixels, the
bars and lines with a size, and whether any two labels of an axis or colour bar, or the figure's title and
its edges, or the export buttons and its text, run into each other.

Each reader takes a Playwright page and the CSS selector of a gr.Plot (e.g. "#attention") and waits for
nothing: call it once the figure shows what the test waits for.
"""

from __future__ import annotations

# Per figure: the traces plotly.js holds (type, number of values, visible), every heatmap image's size and
# share of painted (non-transparent) pixels, the bars, lines and markers drawn with a size, the annotations'
# text and the title. A heatmap whose cells are narrower than their gaps paints nothing: its share reads 0.
DRAWN = """async (sel) => {
  const gd = document.querySelector(sel + ' .js-plotly-plot');
  if (!gd || !gd._fullLayout || !gd.calcdata) return null;
  const L = gd._fullLayout;
  const sized = (e) => { const b = e.getBoundingClientRect(); return b.width >= 0.5 && b.height >= 0.5; };
  const images = [];
  for (const im of gd.querySelectorAll('g.hm image')) {
    const b = im.getBoundingClientRect();
    const src = im.getAttribute('href') || im.getAttribute('xlink:href');
    const pic = new Image();
    pic.src = src;
    await pic.decode();
    const c = document.createElement('canvas');
    c.width = pic.naturalWidth; c.height = pic.naturalHeight;
    const ctx = c.getContext('2d');
    ctx.drawImage(pic, 0, 0);
    const d = ctx.getImageData(0, 0, c.width, c.height).data;
    let painted = 0;
    for (let i = 3; i < d.length; i += 4) if (d[i] > 0) painted++;
    images.push({w: b.width, h: b.height, painted: painted / Math.max(1, c.width * c.height)});
  }
  const traces = gd._fullData.map((t, i) => {
    const cd = gd.calcdata[i] || [];
    const z = cd[0] && cd[0].z;
    const n = t.type === 'heatmap' ? (z ? z.length * (z[0] ? z[0].length : 0) : 0) : cd.length;
    return {type: t.type, mode: t.mode || '', n, visible: t.visible === true};
  });
  return {
    title: (L.title && L.title.text) || '',
    notes: (L.annotations || []).map(a => a.text || ''),
    traces, images,
    bars: [...gd.querySelectorAll('.barlayer .point path')].filter(sized).length,
    lines: [...gd.querySelectorAll('.scatterlayer .js-line')].filter(sized).length,
    markers: [...gd.querySelectorAll('.scatterlayer .point')].filter(sized).length,
    box: (() => { const b = gd.getBoundingClientRect(); return [b.width, b.height]; })(),
  };
}"""

# Pairs of labels that overlap, per axis and colour bar: [where, text, text]. Labels closer than a pixel count.
OVERLAPS = """(sel) => {
  const gd = document.querySelector(sel + ' .js-plotly-plot');
  const out = [];
  const groups = [...gd.querySelectorAll('.xaxislayer-above, .yaxislayer-above, .colorbar .cbaxis')];
  for (const g of groups) {
    const boxes = [...g.querySelectorAll('text')].filter(t => t.textContent.trim())
      .map(t => [t.textContent, t.getBoundingClientRect()]).filter(([, b]) => b.width > 0 && b.height > 0);
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
      const [ta, a] = boxes[i], [tb, b] = boxes[j];
      const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (w > 1 && h > 1) out.push([g.getAttribute('class'), ta, tb]);
    }
  }
  return out;
}"""

# Titles, subtitles, notes, tick labels and bar numbers that reach past the figure's left or right edge:
# [text, left, right, width].
CUT = """(sel) => {
  const gd = document.querySelector(sel + ' .js-plotly-plot');
  const svg = gd.querySelector('.main-svg').getBoundingClientRect();
  const texts = '.infolayer .gtitle, .infolayer [class*=subtitle], .annotation-text, .xtick text, .ytick text, .bartext';
  return [...gd.querySelectorAll(texts)]
    .filter(e => e.textContent.trim())
    .map(e => [e.textContent, e.getBoundingClientRect()])
    .filter(([, b]) => b.width > 0 && (b.left < svg.left - 1 || b.right > svg.right + 1))
    .map(([t, b]) => [t, b.left - svg.left, b.right - svg.left, svg.width]);
}"""

# The page's PNG / SVG buttons of a figure, where they show (a touch screen shows them always), against the
# figure's text: [button box, text] for each text they cover.
EXPORT_COVERS = """(sel) => {
  const gd = document.querySelector(sel + ' .js-plotly-plot');
  const bar = gd.querySelector(':scope > .lab-export');
  if (!bar || getComputedStyle(bar).opacity === '0') return null;
  const a = bar.getBoundingClientRect();
  return [...gd.querySelectorAll('.main-svg text')].filter(t => t.textContent.trim() && !t.closest('.hoverlayer'))
    .map(t => [t.textContent, t.getBoundingClientRect()])
    .filter(([, b]) => b.width > 0 && Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1
                       && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1)
    .map(([t]) => t);
}"""


def drawn(p, sel: str) -> dict:
    return p.page.evaluate(DRAWN, sel)


def check_drawn(p, sel: str) -> dict:
    """The figure at `sel` draws its data: every heatmap paints most of its image (masked cells aside), every
    bar and line trace with values has marks with a size. Returns what `DRAWN` read."""
    got = drawn(p, sel)
    assert got is not None, f"{sel}: no figure"
    data = [t for t in got["traces"] if t["visible"] and t["n"] > 0]
    assert data, f"{sel}: no data drawn: {got['title']!r} {got['notes']}"
    kinds = {t["type"] for t in data}
    if "heatmap" in kinds:
        area = sum(im["w"] * im["h"] for im in got["images"])
        painted = sum(im["w"] * im["h"] * im["painted"] for im in got["images"])
        assert area >= 400 and painted >= 0.25 * area, (sel, got["title"], got["images"])
    if "bar" in kinds:
        assert got["bars"] >= 1, (sel, got["title"], got["traces"])
    if any(t["type"] == "scatter" and "lines" in t["mode"] for t in data):
        assert got["lines"] >= 1, (sel, got["title"], got["traces"])
    assert got["box"][0] > 50 and got["box"][1] > 50, (sel, got["box"])
    return got


def check_readable(p, sel: str) -> None:
    """No two labels of an axis or colour bar overlap, and no title, subtitle or note is cut at an edge."""
    overlaps = p.page.evaluate(OVERLAPS, sel)
    assert overlaps == [], (sel, overlaps)
    cut = p.page.evaluate(CUT, sel)
    assert cut == [], (sel, cut)
