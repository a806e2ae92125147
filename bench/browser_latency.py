"""Click to picture: click Step in headless Chromium until the attention figure shows the new tokens.

Starts `python app.py` on a free 127.0.0.1 port (tests.support.server.AppServer, offline env), opens it in
headless Chromium (tests.support.server.CHROMIUM with the test suite's launch args) and, per prompt length,
types a new prompt of exactly T tokens and clicks Step. The time is taken inside the page: from
the button's click() to the first moment #attention holds new plotly traces (the old ones are marked) whose
layout.meta.T is the expected window length (the new picture), plus one animation frame
so it is painted. "first" = the first click on a new prompt; "next" = the click after it.

    python -m bench.browser_latency [--clicks 7] [--lengths 16,64,128] [--threads 1]
"""

from __future__ import annotations

import time

from bench.common import emit, grammar_prompt, served_default_model, served_parser, summary
from tests.support.server import CHROMIUM, CHROMIUM_ARGS

CLICK_AND_WAIT = """async ([n, timeoutMs]) => {
  const gd = () => document.querySelector('#attention .js-plotly-plot');
  const old = gd();
  if (old && old.data && old.data[0]) old.data[0].__benchOld = true;  // marks the picture shown now
  const fresh = () => { const g = gd();
    if (!g || !g.data || !g.data[0] || g.data[0].__benchOld || !g._fullLayout) return false;
    const meta = g._fullLayout.meta || (g.layout && g.layout.meta);
    return !!meta && Number(meta.T) === n && !!g._fullLayout.xaxis; };
  const tokenEls = () => document.querySelectorAll('#tokens .textfield .token');
  const nTokens = () => tokenEls().length;
  const tokenText = () => Array.from(tokenEls()).map(e => e.textContent).join('|');
  const tokensBefore = tokenText();
  let tTokens = -1;
  const btn = document.querySelector('#step');
  const t0 = performance.now();
  btn.click();
  return await new Promise((resolve) => {
    const check = () => {
      if (tTokens < 0 && nTokens() === n && tokenText() !== tokensBefore) tTokens = performance.now() - t0;
      if (fresh()) { const tp = performance.now() - t0;
        requestAnimationFrame(() => resolve([performance.now() - t0, tTokens, tp])); return true; }
      if (performance.now() - t0 > timeoutMs) { resolve([-1, tTokens, -1]); return true; }
      return false;
    };
    const obs = new MutationObserver(() => { if (check()) obs.disconnect(); });
    obs.observe(document.querySelector('#attention'), {subtree: true, childList: true, attributes: true});
    const poll = () => { if (!check()) setTimeout(poll, 4); else obs.disconnect(); };
    poll();
  });
}"""


# Clicking a token: from the click to the painted outline of its row in every panel and the shaded
# text (both drawn by the page itself, assets/explore.js).
SELECT_AND_WAIT = """async ([i, timeoutMs]) => {
  const els = document.querySelectorAll('#tokens .textfield .token');
  const t0 = performance.now();
  els[i].click();
  return await new Promise((resolve) => {
    const check = () => {
      const q = document.querySelector('#tokens .token.lab-query');
      const outlined = document.querySelectorAll('#attention .lab-outline').length;
      if (q === els[i] && outlined > 0) {
        requestAnimationFrame(() => resolve([performance.now() - t0, outlined])); return;
      }
      if (performance.now() - t0 > timeoutMs) { resolve([-1, outlined]); return; }
      setTimeout(check, 2);
    };
    check();
  });
}"""


def main() -> None:
    p = served_parser("browser_latency", __doc__, "16,64,128")
    p.add_argument("--clicks", type=int, default=7, help="new prompts per length (each: a first and a next click)")
    p.add_argument("--all-heads", action="store_true",
                   help="draw the layer's heads as a grid (the default is the model's first view: one head)")
    args = p.parse_args()

    from playwright.sync_api import sync_playwright

    from lab.catalogue.models import DEFAULT_MODEL

    with served_default_model(args.threads) as (entry, block, server), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
        page.goto(server.url, wait_until="load")
        page.wait_for_selector("#attention .js-plotly-plot", timeout=60_000)
        if args.all_heads:
            page.locator("#head input").click()
            page.get_by_role("option", name="all heads", exact=True).click()
            page.wait_for_function("() => document.querySelector('#head input').value === 'all heads'")
        # warm up: one step so gradio/plotly code paths are loaded
        page.fill("#prompt textarea", grammar_prompt(entry.tokenizer, 8, offset=999))
        page.evaluate(CLICK_AND_WAIT, [9, 30_000])
        page.evaluate(CLICK_AND_WAIT, [10, 30_000])
        for t in [int(x) for x in args.lengths.split(",")]:
            first, nxt, fails, tok_first, layout_first, select = [], [], 0, [], [], []
            for r in range(args.clicks):
                page.fill("#prompt textarea", grammar_prompt(entry.tokenizer, t, offset=53 * r + t))
                page.locator("#prompt textarea").blur()
                time.sleep(0.3)  # let the textbox change reach gradio's state
                n1 = min(t + 1, block)
                a, ta, la = page.evaluate(CLICK_AND_WAIT, [n1, 20_000])
                b, _tb, _lb = page.evaluate(CLICK_AND_WAIT, [min(t + 2, block), 20_000])
                if ta >= 0:
                    tok_first.append(ta / 1000)
                if la >= 0:
                    layout_first.append(la / 1000)
                fails += (a < 0) + (b < 0)
                # a token near the end: in view even where a long text opens on its last rows
                sel, _outlined = page.evaluate(SELECT_AND_WAIT, [min(t, block) - 3, 5_000])
                if sel >= 0:
                    select.append(sel / 1000)
                fails += sel < 0
                if a >= 0:
                    first.append(a / 1000)
                if b >= 0:
                    nxt.append(b / 1000)
            emit("click_to_picture", model=DEFAULT_MODEL, view="all heads" if args.all_heads else "first view",
                 threads=args.threads, prompt_tokens=t,
                 window_tokens=min(t + 1, block), block_size=block, first_click_ms=summary(first),
                 next_click_ms=summary(nxt),
                 first_click_tokens_shown_ms=summary(tok_first),
                 first_click_new_plot_before_paint_ms=summary(layout_first),
                 select_token_to_outline_ms=summary(select),
                 timeouts=fails, browser="chromium " + browser.version)
        browser.close()


if __name__ == "__main__":
    main()
