"""Make the Space's thumbnail, assets/thumbnail.png: a real screenshot of Explore, taken the way the browser
tests take theirs (the app started by tests.support.server, driven with Playwright's sync API in Chromium).

The grammar model Steps a few tokens, "he" is clicked (its row outlined, the text shaded by where it looks,
the chart showing what was predicted there), and the window is saved at the size of the hub's link card,
1200×630 (the hub documents no size for `thumbnail:`; 1200×630 is the common one), then made smaller as a
PNG. Not a test: run it after a change to the Explore page that the thumbnail should show,

    python -m tests.browser.make_thumbnail [OUT]

(OUT defaults to assets/thumbnail.png); tests/project/test_front_matter.py checks what it wrote.
"""

from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path

from tests.support.explore_page import open_page, step
from tests.support.server import CHROMIUM, CHROMIUM_ARGS, ROOT, AppServer

SIZE = (1200, 630)  # width, height: the link card the hub shows
OUT = ROOT / "assets" / "thumbnail.png"
STEPS = 3  # tokens the model adds after the 12 of its first example prompt
QUERY = "he"  # the token clicked: the pronoun whose attention finds the name
MAX_BYTES = 300_000


def small_png(png: bytes, limit: int = MAX_BYTES) -> bytes:
    """The screenshot as an optimised PNG; in 256 colours when it is over `limit` bytes in full colour (flat
    interface colours survive the palette, and the file is a third of the size)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    out = io.BytesIO()
    image.save(out, "PNG", optimize=True)
    if out.tell() > limit:
        out = io.BytesIO()
        image.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(out, "PNG", optimize=True)
    return out.getvalue()


def make_thumbnail(out: Path = OUT, size: tuple[int, int] = SIZE) -> Path:
    """Start the app, take Explore's picture after STEPS Steps with QUERY clicked, and write it to `out`."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        server = AppServer({"DECODER_LAB_BUSY_WAIT_S": "600"}, Path(tmp)).start()
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                context, p = open_page(server, browser, *size)
                tokens = []
                for n in range(STEPS):
                    tokens = step(p, 13 + n)
                i = tokens.index(QUERY)
                p.page.locator("#tokens .textfield .token").nth(i).click()
                p.page.wait_for_function("i => (document.querySelector('#probs .js-plotly-plot')?._fullLayout"
                                         ".title?.text || '').includes('position ' + i)", arg=i, timeout=120_000)
                p.idle()
                p.page.evaluate("() => window.scrollTo(0, 0)")
                png = p.page.screenshot()  # the window, as a visitor sees it
                context.close()
                browser.close()
        finally:
            server.stop()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(small_png(png))
    return out


if __name__ == "__main__":
    path = make_thumbnail(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
    print(f"{path} ({path.stat().st_size:,} bytes)")
