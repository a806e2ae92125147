"""Figures as self-contained HTML files: one figure (`standalone_html`) or a whole training film (`film_html`).

Each file opens offline from a disk or a USB stick: plotly.js is inlined from the installed plotly
package (`plotly.offline.get_plotlyjs()`), the page uses the system's fonts and no
style sheet, image or script from elsewhere, so a browser fetches nothing. The figures travel as
JSON in ``<script type="application/json">`` elements, with "<", ">" and "&" written as JSON
escapes so no text in a figure (a token such as ``</script>``) can end the element; titles, notes
and captions are HTML-escaped, or set as text by the page's script.

The film is a slider over frames, Play / Pause and the caption of the frame shown, drawn with
``Plotly.react`` on one div (plotly's own animation frames cannot swap the tiled heatmaps of an
attention grid reliably). Each frame's figure is embedded once; layout entries a frame shares with
the first frame (the template, colour axis, axes that did not change) are written once, in the
first frame, and the page puts them back. Page sizes are in bench/RESULTS.md.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Sequence
from typing import Any

from .payload import Figure, plot_json

__all__ = ["film_html", "film_layout", "film_payload", "standalone_html"]

FILM_FRAME_MS = 700  # how long Play shows each frame


@functools.lru_cache(maxsize=1)
def _plotlyjs() -> str:
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    if "</script" in js.lower():  # never so far; inlining would end the element early
        raise RuntimeError("the installed plotly.js contains '</script' and cannot be inlined")
    return js


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element: "<", ">", "&" and the JS line separators as escapes."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _figure_dict(fig: Figure) -> dict:
    spec = json.loads(plot_json(fig))
    return {"data": spec.get("data", []), "layout": spec.get("layout", {})}


def _text(name: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    return value


_STYLE = """
:root { color-scheme: light dark; }
body { margin: 0; font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       background: #ffffff; color: #222222; }
main { max-width: 1240px; margin: 0 auto; padding: 16px; box-sizing: border-box; }
h1 { font-size: 1.35rem; margin: 0 0 6px; font-weight: 600; }
.note { margin: 0 0 10px; color: #555555; white-space: pre-wrap; }
.figure { width: 100%; margin: 0 auto; }
.controls { display: flex; flex-wrap: wrap; align-items: center; gap: 8px; margin: 8px 0; }
.controls button { font: inherit; padding: 4px 14px; border-radius: 6px; border: 1px solid #8a93a3;
                   background: #f3f4f6; color: inherit; cursor: pointer; }
.controls button:disabled { opacity: 0.45; cursor: default; }
.controls input[type=range] { flex: 1 1 220px; min-width: 160px; }
#step-label { font-variant-numeric: tabular-nums; min-width: 6.5em; font-weight: 600; }
#caption { margin: 4px 0 8px; min-height: 1.4em; white-space: pre-wrap; }
@media (prefers-color-scheme: dark) {
  body { background: #15181d; color: #e6e6e6; }
  .note { color: #b8bec8; }
  .controls button { background: #262b33; border-color: #6b7688; }
  .js-plotly-plot .main-svg text { fill: #e6e6e6 !important; }
}
"""

# Shared by both pages: lay a figure out for this page (its width becomes the div's largest width,
# so it follows the window below that) and draw it with plotly.js from the page.
_DRAW_JS = """
function labLayout(layout, div) {
  layout = layout || {};
  if (typeof layout.width === "number") { div.style.maxWidth = layout.width + "px"; delete layout.width; }
  layout.autosize = true;
  return layout;
}
function labConfig(name) {
  return {responsive: true, displaylogo: false,
          toImageButtonOptions: {format: "png", filename: name, scale: 2}};
}
"""


def _page(title: str, body: str, data_id: str, data, program: str) -> str:
    """The HTML page: `body`, then `data` as JSON in <script id=data_id>, the figure's file name,
    the shared drawing helpers and `program` (the page's own script)."""
    scripts = (
        f"<script type=\"application/json\" id=\"{data_id}\">{_script_json(data)}</script>\n"
        f"<script type=\"application/json\" id=\"figure-name\">{_script_json(_slug(title))}</script>\n"
        "<script>\n" + _DRAW_JS + program + "</script>")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n"
        f"<script>{_plotlyjs()}</script>\n</head>\n<body>\n<main>\n{body}\n</main>\n{scripts}\n</body>\n</html>\n"
    )


def _slug(title: str) -> str:
    out = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in title)
    out = "_".join(part for part in out.split("_") if part).strip("._-")
    return out[:100] or "figure"


def standalone_html(figure: Figure, *, title: str, note: str = "") -> str:
    """One self-contained HTML page drawing `figure` (a viz `FigureSpec` or a plotly `go.Figure`).

    The page has `title` as its heading (and window title), `note` under it (both escaped; the
    note keeps its line breaks), and the figure at the page's width (at most the figure's own
    width, when it has one). plotly.js is inlined and nothing is fetched; the figure's JSON is in
    the element ``<script type="application/json" id="figure-data">`` ({"data", "layout"}).
    """
    title, note = _text("title", title), _text("note", note)
    spec = _figure_dict(figure)
    body = (f"<h1>{html.escape(title)}</h1>\n"
            + (f"<p class=\"note\">{html.escape(note)}</p>\n" if note else "")
            + "<div id=\"figure\" class=\"figure\"></div>")
    return _page(title, body, "figure-data", spec, """
(function () {
  var spec = JSON.parse(document.getElementById("figure-data").textContent);
  var name = JSON.parse(document.getElementById("figure-name").textContent);
  var div = document.getElementById("figure");
  Plotly.newPlot(div, spec.data, labLayout(spec.layout, div), labConfig(name));
})();
""")


def _layout_patch(base: dict, layout: dict) -> dict:
    """The entries of `layout` that differ from `base`, and "__drop__": the base keys it lacks."""
    patch = {k: v for k, v in layout.items() if k not in base or base[k] != v}
    dropped = [k for k in base if k not in layout]
    if dropped:
        patch["__drop__"] = dropped
    return patch


def film_payload(frames: Sequence[Figure], steps: Sequence[int], captions: Sequence[str] | None) -> dict:
    """What `film_html` embeds: {"steps", "captions", "base", "frames": [{"data", "layout"}]}.

    "base" is the first frame's layout; each frame's "layout" holds only its entries that differ
    from it (and "__drop__", the base's keys it does not have). `film_layout` rebuilds a frame's.
    """
    figs = [_figure_dict(f) for f in frames]
    base = figs[0]["layout"]
    return {
        "steps": [int(s) for s in steps],
        "captions": list(captions) if captions is not None else [""] * len(figs),
        "base": base,
        "frames": [{"data": f["data"], "layout": _layout_patch(base, f["layout"])} for f in figs],
    }


def film_layout(payload: dict, i: int) -> dict:
    """Frame i's full layout from a `film_payload` (what the page does before drawing it)."""
    patch = dict(payload["frames"][i]["layout"])
    dropped = patch.pop("__drop__", [])
    return {**{k: v for k, v in payload["base"].items() if k not in dropped}, **patch}


# The film page's program: draws frame i (the shared layout with the frame's own entries put back),
# one drawing at a time, and plays the frames every FILM_FRAME_MS.
_FILM_SCRIPT = """
(function () {
  var film = JSON.parse(document.getElementById("film-data").textContent);
  var name = JSON.parse(document.getElementById("figure-name").textContent);
  var div = document.getElementById("figure");
  var slider = document.getElementById("slider"), label = document.getElementById("step-label");
  var caption = document.getElementById("caption");
  var playBtn = document.getElementById("play"), pauseBtn = document.getElementById("pause");
  var n = film.frames.length, current = -1, wanted = 0, drawing = false, timer = null;
  var clone = function (v) { return JSON.parse(JSON.stringify(v)); };  // plotly.js writes into what it is given
  function frame(i) {
    var patch = clone(film.frames[i].layout), drop = patch.__drop__ || [], layout = clone(film.base);
    delete patch.__drop__;
    drop.forEach(function (k) { delete layout[k]; });
    Object.keys(patch).forEach(function (k) { layout[k] = patch[k]; });
    return {data: clone(film.frames[i].data), layout: labLayout(layout, div)};
  }
  function draw() {  // one drawing at a time; a frame asked for meanwhile is drawn next
    if (drawing || wanted === current) return;
    drawing = true;
    var i = wanted, f = frame(i);
    Plotly.react(div, f.data, f.layout, labConfig(name + "_step" + film.steps[i])).then(function () {
      current = i; div.dataset.frame = String(i);
    }).catch(function (e) { console.error(e); }).then(function () { drawing = false; draw(); });
  }
  function show(i) {
    i = Math.max(0, Math.min(n - 1, Math.round(Number(i)) || 0));
    wanted = i;
    slider.value = String(i);
    label.textContent = "step " + film.steps[i];
    caption.textContent = film.captions[i] || "";
    draw();
  }
  function pause() {
    if (timer !== null) clearInterval(timer);
    timer = null; playBtn.disabled = false; pauseBtn.disabled = true;
  }
  function play() {
    if (timer !== null || n < 2) return;
    if (wanted >= n - 1) show(0);
    playBtn.disabled = true; pauseBtn.disabled = false;
    timer = setInterval(function () {
      if (wanted >= n - 1) return pause();
      show(wanted + 1);
    }, """ + str(FILM_FRAME_MS) + """);
  }
  slider.addEventListener("input", function () { pause(); show(slider.value); });
  playBtn.addEventListener("click", play);
  pauseBtn.addEventListener("click", pause);
  if (n < 2) { playBtn.disabled = true; slider.disabled = true; }
  window.labFilm = {show: show, play: play, pause: pause, index: function () { return wanted; },
                    drawn: function () { return current; }, playing: function () { return timer !== null; }};
  show(0);
})();
"""


def film_html(frames: Sequence[Figure], *, title: str, steps: list[int], captions: list[str] | None = None) -> str:
    """A whole training film in one self-contained HTML page.

    frames: one figure per film frame (a `FigureSpec` or `go.Figure`, e.g. that frame's attention
    grid from `attention_view`); steps: the training step of each frame (the slider reads
    "step N"); captions: an optional text per frame, shown under the controls. The page has a
    slider over the frames, Play (from the first frame when at the last) and Pause, and draws the
    frame with ``Plotly.react`` on one div. ``window.labFilm`` = {show(i), index(), play(), pause(),
    playing()} is there for scripts and tests. The data is in ``<script type="application/json"
    id="film-data">`` (`film_payload`).
    """
    title = _text("title", title)
    frames = list(frames)
    if not frames:
        raise ValueError("a film needs at least one frame")
    steps = list(steps)
    if len(steps) != len(frames):
        raise ValueError(f"{len(frames)} frames but {len(steps)} steps")
    for s in steps:
        if isinstance(s, bool) or not isinstance(s, int) and not hasattr(s, "__index__"):
            raise TypeError(f"steps must be whole numbers, got {s!r}")
    if captions is not None:
        captions = [_text("caption", c) for c in captions]
        if len(captions) != len(frames):
            raise ValueError(f"{len(frames)} frames but {len(captions)} captions")
    payload = film_payload(frames, steps, captions)
    n = len(frames)
    body = (
        f"<h1>{html.escape(title)}</h1>\n"
        "<div class=\"controls\">\n"
        "  <button type=\"button\" id=\"play\">Play</button>\n"
        "  <button type=\"button\" id=\"pause\" disabled>Pause</button>\n"
        f"  <input type=\"range\" id=\"slider\" min=\"0\" max=\"{n - 1}\" step=\"1\" value=\"0\" "
        "aria-label=\"film frame\">\n"
        "  <span id=\"step-label\" aria-live=\"polite\"></span>\n"
        "</div>\n<p id=\"caption\"></p>\n<div id=\"figure\" class=\"figure\"></div>"
    )
    return _page(title, body, "film-data", payload, _FILM_SCRIPT)
