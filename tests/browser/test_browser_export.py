"""Every figure downloads as PNG and SVG, offline, named for what it shows (assets/explore.js, "Figure export").

A real Chromium clicks the "PNG" and "SVG" buttons on the attention figure after a Step and reads the
downloaded files back: the name (layout.meta.filename when the app sets one, else the figure's title),
a PNG at twice the figure's size, an SVG with the figure's title in it. Every request the page makes
meanwhile must stay on the app's own host. A figure in another tab (Positional encoding) gets the
buttons too, and they read in dark mode and on a 390 px phone.
"""

from __future__ import annotations

import io
import re
import unicodedata
import xml.etree.ElementTree as ET
from urllib.parse import urlparse

import pytest
from PIL import Image
from tests.support.browser import ANSWER_MS, VIEWPORT, Page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def export_page(app_server, browser):
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    page = Page(context, app_server.url)
    page.requests: list[str] = []
    page.page.on("request", lambda req: page.requests.append(req.url))
    yield page
    context.close()


def slug(text: str) -> str:
    """What the page names a file after a title: ASCII letters, digits and ._- only, at most 100."""
    text = unicodedata.normalize("NFKD", re.sub(r"<[^>]*>", " ", text))
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = re.sub(r"_{2,}", "_", re.sub(r"[^A-Za-z0-9._-]+", "_", text))
    return re.sub(r"[._-]+$", "", re.sub(r"^[._-]+", "", text)[:100])


def figure_info(p: Page, elem: str) -> dict:
    return p.page.evaluate(
        """sel => { const gd = document.querySelector(sel + ' .js-plotly-plot'); const L = gd._fullLayout;
                    const meta = L.meta && typeof L.meta === 'object' ? L.meta : {};
                    return {title: (L.title && L.title.text) || '', filename: meta.filename || null,
                            width: L.width, height: L.height, name: window.decoderLab.exportName(gd),
                            buttons: [...gd.querySelectorAll(':scope > .lab-export button')].map(b => b.textContent)}; }""",
        "#" + elem)


def download(p: Page, elem: str, fmt: str):
    button = p.page.locator(f"#{elem} .lab-export button[data-format={fmt}]")
    p.page.locator(f"#{elem} .js-plotly-plot").hover()  # as a person would: the buttons are in plain view
    with p.page.expect_download(timeout=ANSWER_MS) as info:
        button.click()
    d = info.value
    assert d.failure() is None, d.failure()
    with open(d.path(), "rb") as f:
        return d.suggested_filename, f.read()


def title_words(title: str) -> list[str]:
    """The title's words as the SVG writes them (plotly turns tags into tspans, · etc. stay)."""
    plain = re.sub(r"<[^>]*>", " ", title).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    return plain.split()


def test_attention_figure_downloads_as_png_and_svg(export_page, app_server, shots):
    p = export_page
    p.click("step")
    p.wait_tokens(13)
    p.page.wait_for_function(
        "() => { const gd = document.querySelector('#attention .js-plotly-plot');"
        " return gd && gd._fullLayout && gd._fullLayout.meta && gd._fullLayout.meta.T === 13"
        " && gd.querySelectorAll('g.hm image').length > 0; }", timeout=ANSWER_MS)
    p.page.wait_for_selector("#attention .js-plotly-plot > .lab-export button", timeout=ANSWER_MS)
    p.idle()  # the head tools drawn under the text can add a scroll bar: the figure is laid out again
    info = figure_info(p, "attention")
    assert info["buttons"] == ["PNG", "SVG"]
    stem = info["filename"] if info["filename"] else slug(info["title"])
    assert stem and re.fullmatch(r"[A-Za-z0-9._-]{1,100}", info["name"])
    if info["filename"]:
        assert info["name"].startswith(slug(info["filename"])[:100])
    else:
        assert info["name"] == slug(info["title"]), (info["name"], info["title"])
    p.page.locator("#attention").screenshot(path=str(shots / "export-buttons.png"))

    seen_before = len(p.requests)
    name, png = download(p, "attention", "png")
    assert name.endswith(".png") and name.startswith(info["name"]), name
    if info["filename"]:
        assert name.startswith(info["filename"])
    assert png.startswith(PNG_SIGNATURE)
    img = Image.open(io.BytesIO(png))
    img.load()
    assert img.format == "PNG"
    # scale 2: twice the figure's size as laid out on the page (crisp on slides)
    assert img.size == (2 * round(info["width"]), 2 * round(info["height"])), (img.size, info)
    assert img.size[0] >= 800
    (shots / f"export-{name}").write_bytes(png)

    name, svg = download(p, "attention", "svg")
    assert name.endswith(".svg") and name.startswith(info["name"]), name
    text = svg.decode("utf-8")
    assert text.startswith("<svg"), text[:80]
    root = ET.fromstring(text)  # well-formed
    assert root.tag == SVG_NS + "svg"
    title_text = " ".join("".join(e.itertext()) for e in root.iter(SVG_NS + "text")
                          if "gtitle" in (e.get("class") or "").split())
    assert title_words(info["title"]) and title_words(info["title"]) == title_text.split(), (info["title"], title_text)
    assert info["title"].split(":")[0] in text  # the title's opening words, plainly in the file
    assert text.count("<image") >= 1  # the heatmaps came along

    # nothing left the app's host while the files were made and saved
    during = p.requests[seen_before:]
    host = urlparse(app_server.url).hostname
    outside = [u for u in during if not u.startswith(("data:", "blob:")) and urlparse(u).hostname != host]
    assert outside == [], outside
    assert p.outside == [] and host == "127.0.0.1"
    assert p.console_errors == []


def test_figures_in_other_tabs_get_buttons_too(export_page, shots):
    p = export_page
    p.tab("Positional encoding")
    p.page.wait_for_selector("#pe_table g.hm image", timeout=ANSWER_MS)
    p.page.wait_for_selector("#pe_table .js-plotly-plot > .lab-export button", timeout=ANSWER_MS)
    info = figure_info(p, "pe_table")
    assert info["buttons"] == ["PNG", "SVG"] and re.fullmatch(r"[A-Za-z0-9._-]{1,100}", info["name"])
    name, svg = download(p, "pe_table", "svg")
    assert name == info["name"] + ".svg" and svg.startswith(b"<svg")
    # every figure drawn on the page has exactly one pair of buttons
    counts = p.page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')]"
                             ".map(gd => gd.querySelectorAll(':scope > .lab-export button').length)")
    assert counts and all(c == 2 for c in counts), counts
    p.page.locator("#pe_table").screenshot(path=str(shots / "export-buttons-positional.png"))
    # where window.Plotly is not exposed, the modebar's camera makes the file, with the same name and scale
    p.page.evaluate("() => { window._labPlotly = window.Plotly; window.Plotly = undefined; }")
    try:
        name, png = download(p, "pe_table", "png")
    finally:
        p.page.evaluate("() => { window.Plotly = window._labPlotly; }")
    assert name == info["name"] + ".png" and png.startswith(PNG_SIGNATURE)
    assert Image.open(io.BytesIO(png)).size == (2 * round(info["width"]), 2 * round(info["height"]))
    assert p.page.evaluate("() => JSON.stringify(document.querySelector('#pe_table .js-plotly-plot')"
                           "._context.toImageButtonOptions)") == "{}"  # the camera's own settings are back
    assert p.outside == [] and p.console_errors == []


def _contrast(rgb_a: str, rgb_b: str) -> float:
    def lum(css: str) -> float:
        r, g, b = (int(v) / 255 for v in re.findall(r"[\d.]+", css)[:3])
        f = lambda c: c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
        return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b)

    a, b = sorted((lum(rgb_a), lum(rgb_b)), reverse=True)
    return (a + 0.05) / (b + 0.05)


def _button_colours(p: Page, elem: str) -> dict:
    return p.page.evaluate(
        """sel => { const b = document.querySelector(sel + ' .lab-export button'); const s = getComputedStyle(b);
                    const r = b.getBoundingClientRect(), g = b.closest('.js-plotly-plot').getBoundingClientRect();
                    return {fg: s.color, bg: s.backgroundColor, box: [r.x - g.x, r.y - g.y, r.width, r.height],
                            plot: [g.width, g.height]}; }""", "#" + elem)


def test_buttons_read_in_dark_mode_and_on_a_phone(app_server, browser, shots):
    context = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2,
                                  is_mobile=True, has_touch=True, accept_downloads=True)
    try:
        p = Page(context, app_server.url)
        p.click("step")
        p.wait_tokens(13)
        p.page.wait_for_selector("#attention g.hm image", timeout=ANSWER_MS)
        p.page.wait_for_selector("#attention .js-plotly-plot > .lab-export button", timeout=ANSWER_MS)
        p.idle()
        light = _button_colours(p, "attention")
        assert _contrast(light["fg"], light["bg"]) >= 4.5, light
        x, y, w, h = light["box"]
        assert 0 <= x <= 12 and w >= 24 and h >= 20 and y + h <= light["plot"][1] + 1, light  # bottom-left, in the plot
        p.page.evaluate("() => document.body.classList.add('dark')")
        dark = _button_colours(p, "attention")
        assert dark["bg"] != light["bg"] and _contrast(dark["fg"], dark["bg"]) >= 4.5, dark
        loc = p.page.locator("#attention")
        loc.scroll_into_view_if_needed()
        loc.screenshot(path=str(shots / "export-buttons-phone-dark.png"))
        with p.page.expect_download(timeout=ANSWER_MS) as info:
            p.page.locator("#attention .lab-export button[data-format=png]").tap()
        assert info.value.suggested_filename.endswith(".png")
        with open(info.value.path(), "rb") as f:
            assert f.read(8) == PNG_SIGNATURE
        assert p.outside == [] and p.console_errors == []
    finally:
        context.close()
