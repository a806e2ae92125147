"""Standalone HTML pages (viz.standalone): one figure, or a whole training film, in a file that opens offline.

The pages are read back as text (nothing external, the figure's numbers inside, hostile titles kept as
text) and opened in a real Chromium from file:// with the network cut off (offline context and every
non-file request aborted): the figure must render and the film's slider and Play must change the frame.
"""

from __future__ import annotations

import html.parser
import json
import re

import numpy as np
import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs

import viz
from viz.standalone import film_html, film_layout, film_payload, standalone_html

HOSTILE = "</script><script>alert(1)</script>"


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def film():
    from lab.session import Session

    film = Session().film("sort digits (built-in)")
    assert film is not None and len(film.frames) >= 3
    return film


def frame_figure(film, frame):
    return viz.attention_view(frame.attention, None, film.probe_tokens, layer=0, head=None, view="weights",
                              causal=True, overview_max_tokens=48)


@pytest.fixture(scope="module")
def film_figures(film):
    return [frame_figure(film, f) for f in film.frames]


@pytest.fixture(scope="module")
def film_page(film, film_figures) -> str:
    steps = [f.step for f in film.frames]
    return film_html(film_figures, title="Sort digits: layer 0 while it learns", steps=steps,
                     captions=[f"step {f.step}: train loss {f.train_loss:.3f}" for f in film.frames])


@pytest.fixture(scope="module")
def attention_figure(film):
    return frame_figure(film, film.frames[-1])


# ---------------------------------------------------------------------------------------- reading
class _Elements(html.parser.HTMLParser):
    """Every start tag with its attributes, and the text of each <script> element."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self.h1: list[str] = []
        self.title: list[str] = []
        self._in: str | None = None
        self._attrs: dict = {}

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "h1", "title"):
            self._in, self._attrs = tag, dict(attrs)
            if tag == "script":
                self.scripts.append((self._attrs, ""))
            else:
                getattr(self, tag).append("")

    def handle_endtag(self, tag):
        if tag == self._in:
            self._in = None

    def handle_data(self, data):
        if self._in == "script":
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)
        elif self._in in ("h1", "title"):
            getattr(self, self._in)[-1] += data


def elements(page: str) -> _Elements:
    parser = _Elements()
    parser.feed(page)
    parser.close()
    return parser


def embedded(page: str, elem_id: str):
    for attrs, text in elements(page).scripts:
        if attrs.get("id") == elem_id:
            assert attrs.get("type") == "application/json"
            return json.loads(text)
    raise AssertionError(f"no <script id={elem_id}> in the page")


EXTERNAL = re.compile(r"""(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*(?:https?:)?//"""
                      r"""|@import|<link\b|<iframe\b|<img\b|<object\b|<embed\b""", re.IGNORECASE)


def assert_self_contained(page: str) -> None:
    js = get_plotlyjs()
    assert page.count(js) == 1, "plotly.js is inlined exactly once"
    rest = page.replace(js, "")
    # outside plotly.js's own code (which mentions URLs it never loads here), no URL at all but XML
    # namespace names (the hatch of masked cells is an SVG data: URI with xmlns='http://www.w3.org/2000/svg')
    rest = re.sub(r"xmlns(?::\w+)?=(['\"]?)http://www\.w3\.org/[\w/.]+\1", "", rest)
    assert "http://" not in rest and "https://" not in rest, re.findall(r"https?://\S{0,40}", rest)
    assert not EXTERNAL.search(rest), EXTERNAL.search(rest)
    parsed = elements(page)
    for tag, attrs in parsed.tags:
        assert "src" not in attrs and tag != "link", (tag, attrs)  # no script, style or image from a file
        for key in ("href", "src", "poster", "action"):
            assert key not in attrs or attrs[key].startswith("#"), (tag, attrs)
    # every image a figure carries (the hatch of masked cells) is a data: URI
    assert not re.search(r'"source"\s*:\s*"(?!data:)', rest)


def z_values(fig_json: dict) -> list[np.ndarray]:
    return [viz.decode_array(t["z"]) for t in fig_json["data"] if "z" in t]


# ------------------------------------------------------------------------------------------- pages
def test_single_page_is_self_contained_and_holds_the_figure(film, attention_figure):
    page = standalone_html(attention_figure, title="Sort digits, layer 0", note="Weights after training.")
    assert page.startswith("<!DOCTYPE html>")
    assert_self_contained(page)
    spec = embedded(page, "figure-data")
    assert spec == json.loads(viz.plot_json(attention_figure))  # the figure, every value as given
    # and the numbers read back are the model's weights (milli-units, masked upper triangle)
    panels = viz.attention_panels(viz.FigureSpec(spec["data"], spec["layout"]))
    weights = film.frames[-1].attention[0]
    t = weights.shape[-1]
    lower = np.tril(np.ones((t, t), dtype=bool))
    assert panels.shape == weights.shape
    assert np.allclose(panels[:, lower], weights[:, lower], atol=6e-4)
    assert np.isnan(panels[:, ~lower]).all()
    parsed = elements(page)
    assert parsed.h1 == ["Sort digits, layer 0"] and parsed.title == ["Sort digits, layer 0"]
    assert "Weights after training." in page


def test_single_page_takes_a_plotly_figure(film):
    fig = go.Figure(go.Scatter(x=[0, 1, 2], y=np.array([0.5, -1.25, 3.0]), name="a < b"),
                    layout={"title": {"text": "plain plotly"}, "width": 640})
    page = standalone_html(fig, title="A go.Figure")
    assert_self_contained(page)
    spec = embedded(page, "figure-data")
    assert spec["layout"]["title"]["text"] == "plain plotly" and spec["layout"]["width"] == 640
    assert np.array_equal(viz.decode_array(spec["data"][0]["y"]), [0.5, -1.25, 3.0])
    assert spec["data"][0]["name"] == "a < b" and "a < b" not in page  # kept as JSON escapes in the page
    # a positional-encoding figure as the app draws it
    pe = viz.positional_table(np.arange(12, dtype=np.float32).reshape(3, 4), "learned")
    assert embedded(standalone_html(pe, title="PE"), "figure-data") == json.loads(viz.plot_json(pe))


def test_titles_notes_and_figure_text_cannot_break_out():
    tokens = [HOSTILE, "<!--", "&amp;", "\u2028"]
    fig = go.Figure(go.Heatmap(z=np.eye(4, dtype=np.float32), x=tokens, y=tokens),
                    layout={"title": {"text": HOSTILE}})
    page = standalone_html(fig, title=HOSTILE, note=HOSTILE + "\n & <b>bold</b>")
    assert "<script>alert(1)" not in page and "</script><script>" not in page
    parsed = elements(page)
    # plotly.js, the figure's JSON, its file name and the drawing code: nothing else became a script
    assert len(parsed.scripts) == 4, [a for a, _ in parsed.scripts]
    assert parsed.h1 == [HOSTILE] and parsed.title == [HOSTILE]  # shown as text
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    spec = embedded(page, "figure-data")
    assert spec["data"][0]["x"] == tokens and spec["layout"]["title"]["text"] == HOSTILE
    name = embedded(page, "figure-name")
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,100}", name)

    film = film_html([fig, fig], title=HOSTILE, steps=[1, 2], captions=[HOSTILE, "<!-- x"])
    assert "<script>alert(1)" not in film and "</script><script>" not in film
    parsed = elements(film)
    assert len(parsed.scripts) == 4 and parsed.h1 == [HOSTILE]
    assert embedded(film, "film-data")["captions"] == [HOSTILE, "<!-- x"]


def test_film_embeds_every_frame_once(film, film_figures, film_page):
    assert_self_contained(film_page)
    payload = embedded(film_page, "film-data")
    assert payload == json.loads(json.dumps(film_payload(film_figures, [f.step for f in film.frames], [
        f"step {f.step}: train loss {f.train_loss:.3f}" for f in film.frames])))
    assert payload["steps"] == [f.step for f in film.frames]
    assert len(payload["frames"]) == len(film.frames)
    for i, (fig, fr) in enumerate(zip(film_figures, film.frames)):
        want = json.loads(viz.plot_json(fig))
        assert payload["frames"][i]["data"] == want["data"]
        assert film_layout(payload, i) == want["layout"]
        got = viz.attention_panels(viz.FigureSpec(payload["frames"][i]["data"], film_layout(payload, i)))
        t = fr.attention[0].shape[-1]
        lower = np.tril(np.ones((t, t), dtype=bool))
        assert np.allclose(got[:, lower], fr.attention[0][:, lower], atol=6e-4)
    # each frame's data once, the shared layout once: the page is plotly.js plus about the figures' JSON
    data_chars = sum(len(viz.plot_json(f)) for f in film_figures)
    assert len(film_page) - len(get_plotlyjs()) < 1.05 * data_chars + 20_000
    assert film_page.replace(get_plotlyjs(), "").count('"template":') == 1  # in the first frame only


def test_film_layout_patches_differing_frames():
    a = go.Figure(go.Bar(y=[1, 2]), layout={"title": {"text": "first"}, "height": 300, "width": 500})
    b = go.Figure(go.Bar(y=[3, 4]), layout={"title": {"text": "second"}, "height": 300})
    payload = film_payload([a, b], [0, 10], None)
    assert set(payload["frames"][1]["layout"]) == {"title", "__drop__"}
    assert payload["frames"][1]["layout"]["__drop__"] == ["width"]
    assert payload["frames"][0]["layout"] == {}
    for i, fig in enumerate((a, b)):
        assert film_layout(payload, i) == json.loads(viz.plot_json(fig))["layout"]
    assert payload["captions"] == ["", ""]


@pytest.mark.parametrize("kwargs, error", [
    ({"frames": [], "steps": []}, ValueError),
    ({"steps": [1]}, ValueError),
    ({"steps": [1, 2], "captions": ["only one"]}, ValueError),
    ({"steps": [1, 2], "captions": ["a", 3]}, TypeError),
    ({"steps": [1.5, 2]}, TypeError),
    ({"steps": [1, 2], "title": None}, TypeError),
])
def test_film_refuses_bad_arguments(kwargs, error):
    fig = go.Figure(go.Bar(y=[1]))
    args = {"frames": [fig, fig], "title": "t", **kwargs}
    with pytest.raises(error):
        film_html(args.pop("frames"), **args)


def test_single_page_refuses_what_is_not_a_figure():
    with pytest.raises(TypeError):
        standalone_html({"data": []}, title="t")
    with pytest.raises(TypeError):
        standalone_html(go.Figure(), title=None)


# ----------------------------------------------------------------------------------- in a browser
@pytest.fixture
def offline_page(browser):
    """A page in an offline context where every request that is not for a local file is aborted
    (and recorded)."""
    context = browser.new_context(viewport={"width": 1100, "height": 900}, offline=True)
    requests: list[str] = []
    errors: list[str] = []
    context.route("**/*", lambda r: r.abort() if not r.request.url.startswith("file:") else r.continue_())
    page = context.new_page()
    page.on("request", lambda req: requests.append(req.url))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: (errors.append("dialog: " + d.message), d.dismiss()))
    page.requests, page.errors = requests, errors
    yield page
    context.close()


def _outside(requests: list[str]) -> list[str]:
    return [u for u in requests if not u.startswith(("file:", "data:", "blob:", "about:"))]


PLOTTED = """() => {
    const gd = document.querySelector('#figure.js-plotly-plot');
    const sum = (z) => { let s = 0, n = 0; const walk = (v) => {
        if (v == null) return; if (typeof v === 'number') { if (Number.isFinite(v)) { s += v; n++; } return; }
        if (typeof v.length === 'number') for (let i = 0; i < v.length; i++) walk(v[i]); };
        walk(z); return [s, n]; };
    return {traces: gd.data.length, drawn: gd.dataset.frame, label: document.querySelector('#step-label').textContent,
            caption: document.querySelector('#caption').textContent, slider: document.querySelector('#slider').value,
            images: gd.querySelectorAll('g.hm image').length,
            sums: gd._fullData.filter(t => t.z).map(t => sum(t.z))};
}"""


def same_sums(got, fig) -> bool:
    want = _sums(fig)
    return len(got) == len(want) and all(n == m and s == pytest.approx(t, rel=1e-9, abs=1e-9)
                                         for (s, n), (t, m) in zip(got, want))


def _sums(fig) -> list[list[float]]:
    out = []
    for z in z_values(json.loads(viz.plot_json(fig))):
        z = z.astype(np.float64)
        out.append([float(z[np.isfinite(z)].sum()), int(np.isfinite(z).sum())])
    return out


@pytest.mark.browser
def test_single_page_renders_offline(offline_page, attention_figure, tmp_path):
    path = tmp_path / "attention.html"
    path.write_text(standalone_html(attention_figure, title=HOSTILE, note="offline"), encoding="utf-8")
    page = offline_page
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_selector("#figure.js-plotly-plot g.hm image", timeout=20_000)
    state = page.evaluate("""() => { const gd = document.querySelector('#figure.js-plotly-plot');
        return {traces: gd.data.length, full: gd._fullData.length, images: gd.querySelectorAll('g.hm image').length,
                h1: document.querySelector('h1').textContent, title: gd._fullLayout.title.text,
                width: gd.getBoundingClientRect().width, scripts: document.scripts.length}; }""")
    n = len(json.loads(viz.plot_json(attention_figure))["data"])
    assert state["traces"] == n and state["full"] == n and state["images"] >= 1
    assert state["h1"] == HOSTILE and state["scripts"] == 4
    assert state["title"] == attention_figure.layout["title"]["text"]
    assert state["width"] > 600  # stretched to the page
    assert _outside(page.requests) == [] and page.errors == []


@pytest.mark.browser
def test_film_slider_and_play_change_the_frame(offline_page, film, film_figures, film_page, tmp_path, shots):
    path = tmp_path / "film.html"
    path.write_text(film_page, encoding="utf-8")
    page = offline_page
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function("() => document.querySelector('#figure')?.dataset.frame === '0'", timeout=20_000)
    steps = [f.step for f in film.frames]
    state = page.evaluate(PLOTTED)
    assert state["label"] == f"step {steps[0]}" and state["slider"] == "0"
    assert state["traces"] == len(json.loads(viz.plot_json(film_figures[0]))["data"])
    assert same_sums(state["sums"], film_figures[0]) and state["caption"].startswith(f"step {steps[0]}:")

    # the slider, moved as a person would (keyboard on the focused range input), then set directly
    page.focus("#slider")
    page.keyboard.press("End")
    last = len(steps) - 1
    page.wait_for_function("n => document.querySelector('#figure').dataset.frame === String(n)", arg=last)
    state = page.evaluate(PLOTTED)
    assert state["label"] == f"step {steps[last]}" and same_sums(state["sums"], film_figures[last])
    mid = len(steps) // 2
    page.fill("#slider", str(mid))
    page.wait_for_function("n => document.querySelector('#figure').dataset.frame === String(n)", arg=mid)
    state = page.evaluate(PLOTTED)
    assert state["label"] == f"step {steps[mid]}" and state["slider"] == str(mid)
    assert same_sums(state["sums"], film_figures[mid]) and not same_sums(state["sums"], film_figures[0])
    page.screenshot(path=str(shots / "standalone-film.png"), full_page=True)

    # Play moves on by itself; Pause holds the frame
    page.click("#play")
    page.wait_for_function("n => Number(document.querySelector('#figure').dataset.frame) >= n + 2", arg=mid,
                           timeout=15_000)
    page.click("#pause")
    held = page.evaluate("() => [window.labFilm.index(), window.labFilm.playing()]")
    assert held[1] is False and held[0] >= mid + 2
    page.wait_for_timeout(1_600)
    page.wait_for_function("i => document.querySelector('#figure').dataset.frame === String(i)", arg=held[0])
    state = page.evaluate(PLOTTED)
    assert state["label"] == f"step {steps[held[0]]}" and same_sums(state["sums"], film_figures[held[0]])
    # Play at the last frame starts over from the first
    page.evaluate("() => window.labFilm.show(1e9)")
    page.wait_for_function("n => document.querySelector('#figure').dataset.frame === String(n)", arg=last)
    page.click("#play")
    page.wait_for_function("() => { const f = Number(document.querySelector('#figure').dataset.frame); return f < 3; }")
    page.click("#pause")
    assert _outside(page.requests) == [] and page.errors == []
