"""The Page driver for the app in a real Chromium, and what every browser test shares."""

from __future__ import annotations

import io

from PIL import Image

from tests.support.page_events import ANSWERED, BUSY, FNS_NAMED, IDLE, TRACKER, UNCOVERED


VIEWPORT = {"width": 1280, "height": 800}

# How long a test waits for the app to answer: a hang guard, not a speed requirement. A busy two-core machine
# running both test workers can take tens of seconds for a model's first call.
ANSWER_MS = 120_000

# A model's first answer reads its weights (GPT-2 small's are 500 MB): longer still on a busy machine.
MODEL_MS = 300_000

# How many looks in a row, each a task of the page apart, find it quiet before a test acts on it
# (tests/support/page_events.py: an answer applied and the events chained after it sent).
QUIET_LOOKS = 5


class Page:
    """A thin driver over a Playwright page of the app, recording what would be a problem."""

    def __init__(self, context, url: str):
        self.url = url
        self.page = context.new_page()
        self.console_errors: list[str] = []
        self.outside: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.console_errors.append(str(e)))
        self.page.on("dialog", self._dialog)
        self.page.on("request", self._request)
        self.page.add_init_script(TRACKER)  # counts the calls on their way (tests/support/page_events.py)
        self.page.goto(url, wait_until="load")  # never "networkidle": Gradio's heartbeat keeps it busy
        self.page.wait_for_selector("#attention .js-plotly-plot", timeout=ANSWER_MS)
        # The page's load event (its window's size, a link's settings) answers into the model menu, the prompt,
        # the figures: until it has, its overlay covers them and its answer can undo what a test did meanwhile.
        self.wait_answered("load", 0)
        self.idle()

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def _request(self, req) -> None:
        if not req.url.startswith(("http://127.0.0.1", "data:", "blob:")):
            self.outside.append(req.url)

    # ----------------------------------------------------------------- what is on its way
    def idle(self, timeout: float = ANSWER_MS) -> None:
        """Wait until nothing the page asked for is on its way, no loading overlay shows and no head-tools
        refresh is due (tests/support/page_events.py), on QUIET_LOOKS looks in a row counted from now."""
        self.page.evaluate("() => { if (window.__labEvents) window.__labEvents.streak = 0; }")
        try:
            self.page.wait_for_function(IDLE, arg=QUIET_LOOKS, polling=50, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - say what was still going on
            raise AssertionError(f"the page never became idle: {self.page.evaluate(BUSY)}") from exc

    def answers(self) -> int:
        """How many calls the page has had answered so far: a mark for `wait_answered`."""
        return self.page.evaluate("() => (window.__labEvents?.done || []).length")

    def wait_answered(self, name: str, since: int, timeout: float = ANSWER_MS) -> None:
        """Wait until a call of the app's function `name` (its api_name; "load": the page's load event) has
        been answered after the first `since` answers (`answers()` taken before the action that sends it),
        so an answer that came before the action never counts."""
        fns = self.page.evaluate(FNS_NAMED, name)
        assert fns, f"the app has no function named {name!r}"
        try:
            self.page.wait_for_function(ANSWERED, arg=[fns, since], timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - say what was still going on
            raise AssertionError(f"no answer of {name!r} came: {self.page.evaluate(BUSY)}") from exc

    def wait_uncovered(self, selector: str, timeout: float = ANSWER_MS) -> None:
        """Wait until `selector` is shown with no loading overlay over it (an event answering into it runs),
        before a click or a key goes to it: Playwright's own wait gives up after 30 s."""
        self.page.wait_for_function(UNCOVERED, arg=selector, timeout=timeout)

    # ------------------------------------------------------------------ reading the screen
    def tokens(self) -> list[str]:
        return self.page.eval_on_selector_all("#tokens .textfield .token .text", "els => els.map(e => e.textContent)")

    def wait_tokens(self, n: int, timeout: float = ANSWER_MS) -> list[str]:
        self.page.wait_for_function(
            "n => document.querySelectorAll('#tokens .textfield .token').length === n", arg=n, timeout=timeout
        )
        return self.tokens()

    def figure(self, elem: str) -> dict:
        """Geometry and labels of a rendered Plotly figure, read from plotly.js itself."""
        return self.page.evaluate(
            """sel => {
                const gd = document.querySelector(sel + ' .js-plotly-plot');
                const L = gd._fullLayout;
                const axes = Object.keys(L).filter(k => /^[xy]axis\\d*$/.test(k)).sort();
                const out = {title: L.title && L.title.text, bg: L.plot_bgcolor, ntraces: gd.data.length,
                             images: gd.querySelectorAll('g.hm image').length, axes: {}};
                for (const k of axes) {
                    const a = L[k];
                    out.axes[k] = {ticktext: a.ticktext || null, offset: a._offset, length: a._length,
                                   range: a.range, title: a.title && a.title.text,
                                   centers: a.ticktext ? Array.from(a.tickvals, v => a._offset + a.l2p(v)) : null};
                }
                const box = gd.getBoundingClientRect();
                out.box = [box.x, box.y, box.width, box.height];
                return out;
            }""",
            "#" + elem,
        )

    def pixels(self, elem: str) -> Image.Image:
        loc = self.page.locator(f"#{elem} .js-plotly-plot")
        loc.scroll_into_view_if_needed()
        return Image.open(io.BytesIO(loc.screenshot())).convert("RGB")

    def toast_text(self) -> str:
        self.page.wait_for_selector(".toast-body", timeout=ANSWER_MS)
        return " ".join(self.page.eval_on_selector_all(".toast-body", "els => els.map(e => e.innerText)"))

    def close_toasts(self) -> None:
        self.page.evaluate("() => document.querySelectorAll('.toast-close').forEach(b => b.click())")

    # ---------------------------------------------------------------------------- actions
    def set_prompt(self, text: str) -> None:
        self.wait_uncovered("#prompt textarea")
        self.page.fill("#prompt textarea", text)

    def click(self, elem: str) -> None:
        self.wait_uncovered(f"#{elem}")
        self.page.click(f"#{elem}")

    def _type_until_held(self, selector: str, value: str, held: str, arg, what: str, enter: bool = False) -> None:
        """Type `value` into the box `selector` until the page holds it (`held`, a JS function of `arg`): an
        answer that redraws the form around it can undo a value typed at that moment; then it is typed again."""
        box = self.page.locator(selector)
        for _ in range(5):
            self.wait_uncovered(selector)
            box.fill(value)
            if enter:
                box.press("Enter")
            try:
                self.page.wait_for_function(held, arg=arg, timeout=2_000)
                return
            except Exception:  # noqa: BLE001 - typed while the page redrew: type it again
                continue
        raise AssertionError(f"{what} did not keep the value typed")

    def set_slider(self, elem: str, value) -> None:
        """Type the value into the slider's number box, and wait until the slider holds it."""
        self._type_until_held(f"#{elem} input[type=number]", str(value),
                              f"v => document.querySelector('#{elem} input[type=range]').value === v",
                              str(float(value)).rstrip("0").rstrip("."), f"the slider #{elem}", enter=True)

    def fill_text(self, elem: str, text: str) -> None:
        """Type `text` into the text box, and wait until the box holds it."""
        self._type_until_held(f"#{elem} textarea", text,
                              f"t => document.querySelector('#{elem} textarea').value === t", text,
                              f"the text box #{elem}")

    def set_number(self, elem: str, value) -> None:
        box = self.page.locator(f"#{elem} input")
        self.wait_uncovered(f"#{elem} input")
        box.fill(str(value))
        box.press("Enter")

    def choose(self, elem: str, option: str, settle: bool = True) -> None:
        """Choose `option` in the dropdown #`elem`. With `settle` (the default), wait until every call the choice
        set off has been answered (`idle`; for the model menu, its own answer first): two quick choices run side
        by side on the server, and the answer of the earlier one could land over the later one's."""
        # The option is looked up in this dropdown's own list (the one its input controls): another
        # dropdown's list may still be closing, and two lists can both hold an option called "1".
        box = self.page.locator(f"#{elem} input")
        self.wait_uncovered(f"#{elem} input")
        since, was = self.answers(), box.input_value()
        box.click()
        own = box.get_attribute("aria-controls")
        scope = self.page.locator(f"[id='{own}']") if own else self.page.locator(f"#{elem}")
        scope.get_by_role("option", name=option, exact=True).click()
        if not settle:
            return
        if elem == "model" and was != option:  # its first view, example prompt and menus come in one answer
            self.wait_answered("select_model", since, timeout=MODEL_MS)
            self.idle(timeout=MODEL_MS)
        else:
            self.idle()

    def large_fonts(self, on: bool = True) -> None:
        """Tick (or untick) Large fonts and wait until the page has drawn its figures again for it."""
        self.wait_uncovered("#presentation input")
        self.page.locator("#presentation input").set_checked(on)
        self.page.wait_for_function("on => document.body.classList.contains('presenting') === on", arg=on,
                                    timeout=ANSWER_MS)
        self.idle()

    def tab(self, name: str) -> None:
        """Show a tab and wait until what it asked the app for (a tab draws its figures when shown) has come."""
        self.page.get_by_role("tab", name=name).click()
        self.idle()

    def open_train_tab(self) -> None:
        """Show the Train tab and wait for its answer (the film's figures, drawn when the tab is shown), so that
        nothing of the tab is still on its way while a test fills its form."""
        self.tab("Train")
        self.page.wait_for_selector("#film_attention .js-plotly-plot", timeout=ANSWER_MS)

    def wait_training_end(self, timeout: float = 150_000) -> str:
        """Wait until the Train tab's run has ended (finished, stopped, hit the time limit) or was refused; the
        status, or the refusal's message. The limit covers a run queued behind another and the server's own
        time limit, so a run that ends the wrong way fails on its message rather than on this wait.

        The text is read in the same look that sees it (a toast closes by itself, and its text comes a moment
        after its box), and a toast counts once it has text."""
        return self.page.wait_for_function(
            "() => { const toasts = Array.from(document.querySelectorAll('.toast-body'), e => e.innerText.trim())"
            "          .filter(t => t);"
            " if (toasts.length) return toasts.join(' ');"
            " const status = document.querySelector('#train_status textarea').value;"
            " return /^Training (finished|stopped|hit)/.test(status) ? status : null; }", timeout=timeout).json_value()


def sampling_section(p: Page, open_it: bool) -> None:
    """Open or close the Sampling section, and wait until it is so. A click can land while an
    answer redraws the figures above it (the section moves): then it is clicked again."""
    state = "visible" if open_it else "hidden"
    for _ in range(5):
        if p.page.locator("#max_new").is_visible() == open_it:
            return
        p.page.get_by_text("Sampling", exact=True).click()  # not the chart's legend, "after sampling settings"
        try:
            p.page.locator("#max_new").wait_for(state=state, timeout=3_000)
            return
        except Exception:  # noqa: BLE001 - the click missed a moving target: try again
            continue
    raise AssertionError(f"the Sampling section did not become {state}")
