"""Links and session files reopen the Circuits tab.

A link (`?tab=circuits&answer=…`, lab.links) or an opened session file (lab.sessionfile) says what the
Circuits tab shows (lab.links.CircuitsView). `reopened` draws it inside the call that opens the link (the page
load) or the file (/import_session), in their lanes, and keeps the tab's values for the event `bind_reopen`
chains after each of them, which sets the tab's controls and figures and selects the tab. So the outputs of
/import_session stay Explore's, as its callers know them. After a page load that event runs only when the
page's address carries one of the link's Circuits parameters (`REOPEN_JS` presses its hidden button): run at
every load, an event with these outputs made every later click of the page slower (a Step's picture 87 → 180
ms, bench/RESULTS.md).

What is drawn is what costs little: direct logit attribution at the selected token (else the last) and one
head's OV and QK circuits, through ui/circuits.py's own handlers; the composition map only when the model's
scores are in the server's cache (a link or a file never starts that long job: the section says to press
Compute); attribution patching only its form (the person presses Run).

The page also tells the server what "Link to this view" and "Save session" cannot send, their inputs being the
API's (lab.links.CircuitsForm): each tab opened, the composition kind picked, the attribution patching form
when Run is pressed. These bookkeeping events only store checked values; they answer at once, outside the queue.
"""

from __future__ import annotations

import html
import json
from types import SimpleNamespace

import gradio as gr

from lab import links
from lab.checks import UserError
from lab.circuits_records import COMPOSITION, composition_record
from lab.session import Session

from .circuits import (
    NO_COMPOSITION, NO_DLA, NO_HEAD_CIRCUITS, composition_figure, composition_note, pairs_list, show_circuits,
    show_dla,
)
from .common import RAW, handler, log, message_plot

# the Circuits tab's components the chained event sets, by their names in build_circuits_tab's namespace
FIELDS = ("dla_answer", "dla_other", "dla_plot", "dla_note", "kind", "composition_note", "composition_plot", "pairs",
          "layer", "head", "head_note", "ov_plot", "spectrum_plot", "qk_plot", *links.ATP_FORM)
# after the page's load: the reopening's hidden button is pressed only for an address with a Circuits parameter
REOPEN_JS = ("() => { const q = new URLSearchParams(window.location.search); "
             f"if ({json.dumps(list(links.CIRCUIT_PARAMS))}.some((k) => q.has(k))) "
             "document.querySelector('#circuits_reopen')?.click(); }")
NOT_CACHED = ("The composition scores of this model are not computed yet: press Compute (about 10 s at most, "
              "once per model).")
FAULT = "This part could not be drawn again; press its button."


def _said(exc: Exception) -> str:
    return html.escape(str(exc), quote=False)


def _drawn(draw, empty: dict, note: str) -> dict:
    """`draw()`'s parts; where it is refused, the section's empty figures and the refusal in its `note`."""
    try:
        return draw()
    except (UserError, ValueError) as exc:
        return {**empty, note: _said(exc)}
    except Exception:  # a fault here must not undo the opening of the link or file: it is logged and said
        log.exception("the Circuits tab could not be drawn again")
        return {**empty, note: FAULT}


def _dla(session: Session, answer: str, other: str) -> dict:
    plot, note = show_dla.__wrapped__(session, answer, other)  # the page's own handler, without its wrapping
    return {"dla_plot": plot, "dla_note": note}


def _composition(session: Session, model: str, kind: str) -> dict:
    """The map of `kind` when the scores are cached (made into the session's record as a cached Compute
    makes it, so that Q/K/V and the download follow); otherwise the section asks for Compute."""
    entry = session.entry_for(model)
    kept = COMPOSITION.get(entry.model, True) if entry.own else None
    if kept is None:
        return {"composition_note": NOT_CACHED, "composition_plot": message_plot(NO_COMPOSITION), "pairs": ""}
    r = composition_record(entry, *kept, cached=True)
    session.circuits.last["composition"] = r
    return {"composition_note": composition_note(r), "composition_plot": composition_figure(session, r, kind),
            "pairs": pairs_list(r, kind)}


def _head(session: Session, layer: int, head: int) -> dict:
    note, ov, spectrum, qk = show_circuits.__wrapped__(session, layer, head)
    return {"head_note": note, "ov_plot": ov, "spectrum_plot": spectrum, "qk_plot": qk}


def reopened(session: Session, model: str, view: links.CircuitsView | None, notes: list[str] = ()) -> None:
    """Draw what `view` asks of the Circuits tab on `model` (the text the link or file has just opened) and
    keep it for the chained event (lab.links.CircuitsForm.drawn); None (it said nothing of the tab) leaves the
    tab as it is. `notes`: what a link left out, said above the DLA too when the page opens on this tab (the
    notice above Explore's figures is out of sight there)."""
    form = links.circuits_form(session)
    form.drawn = None
    if view is None:
        return
    links.keep_form(session, view)
    out: dict = {}
    if view.tab is not None:
        out["tabs"] = gr.Tabs(selected=view.tab)
    if view.dla is not None:
        out.update(dla_answer=view.dla[0], dla_other=view.dla[1])
        out.update(_drawn(lambda: _dla(session, *view.dla), {"dla_plot": message_plot(NO_DLA)}, "dla_note"))
    if view.kind is not None:
        out["kind"] = view.kind
        out.update(_drawn(lambda: _composition(session, model, view.kind),
                          {"composition_plot": message_plot(NO_COMPOSITION), "pairs": ""}, "composition_note"))
    if view.head is not None:
        out.update(layer=view.head[0], head=view.head[1])
        empty = {"ov_plot": message_plot(NO_HEAD_CIRCUITS), "spectrum_plot": message_plot(""),
                 "qk_plot": message_plot("")}
        out.update(_drawn(lambda: _head(session, *view.head), empty, "head_note"))
    if view.atp is not None:
        out.update(view.atp)
    if view.tab == "circuits" and notes and "dla_note" in out:
        out["dla_note"] = "  \n".join([*(f"⚠ {_said(n)}" for n in notes), out["dla_note"]])
    form.drawn = out


@handler(exclusive=False)
def reopen_circuits(session, request: gr.Request = None):
    """Chained after a page load and after an opened session file: the Circuits tab as the link or the file
    left it, drawn by that call (`reopened`); nothing changes when it said nothing of the tab."""
    out = {}
    if isinstance(session, Session):
        form = links.circuits_form(session)
        out, form.drawn = form.drawn or {}, None
    return tuple(out.get(name, gr.skip()) for name in ("tabs", *FIELDS))


@handler(exclusive=False)
def tab_opened(session, tab, request: gr.Request = None):
    """A tab opened (its id): the last one besides Explore is the tab a link or a file made next reopens."""
    links.note_tab(session, tab)


@handler(exclusive=False)
def kind_picked(session, kind, request: gr.Request = None):
    """The composition kind picked (Q, K, V): a link or a file made next shows that map."""
    try:
        links.note_kind(session, kind)
    except UserError:
        pass  # not a kind: the tab's own event says so


@handler(exclusive=False)
def atp_form_run(session, prompt_a, prompt_b, metric, answer, other, what, direction, k, request: gr.Request = None):
    """Run attribution patching pressed: its form, as a session file made next keeps it (the Run itself checks
    it again and says what does not fit, so a value that does not fit is not kept, without a second message)."""
    values = dict(zip(links.ATP_FORM, (prompt_a, prompt_b, metric, answer, other, what, direction, k)))
    try:
        links.note_atp(session, values)
    except UserError:
        pass


def _after(demo: gr.Blocks, api_name: str):
    """The event of endpoint `api_name` (bound where its tab is laid out, which keeps its Dependency), to chain
    another event after it."""
    for index, fn in demo.fns.items():
        if fn.api_name == api_name and fn.targets:
            return gr.events.Dependency(demo.blocks[fn.targets[0][0]], {}, index, fn.fn)
    raise LookupError(f"no endpoint {api_name}")


def bind_reopen(demo: gr.Blocks, ses: gr.State, c: SimpleNamespace, tabs: gr.Tabs, tab_items: dict, loaded) -> None:
    """Chain the Circuits tab's reopening after the page's load (`loaded`, its Dependency) and after
    /import_session, and bind the bookkeeping events (`tab_items`: each tab by its id). Page-only events: call
    after every endpoint, inside the page's Blocks."""
    quiet = dict(api_name=False, queue=False, show_progress="hidden", **RAW)
    outputs = [tabs, *(getattr(c, name) for name in FIELDS)]
    reopen = gr.Button("reopen", elem_id="circuits_reopen", elem_classes="lab-hidden")
    reopen.click(reopen_circuits, ses, outputs, **quiet)
    loaded.then(None, js=REOPEN_JS, api_name=False, queue=False, show_progress="hidden")
    _after(demo, "import_session").success(reopen_circuits, ses, outputs, **quiet)
    for tab_id, tab in tab_items.items():
        if tab_id != "explore":  # Explore changes nothing kept: the tab before it is the one that counts
            tab.select(tab_opened, [ses, gr.State(tab_id)], None, **quiet)
    c.kind.input(kind_picked, [ses, c.kind], None, **quiet)
    c.atp_run.click(atp_form_run, [ses, c.prompt_a, c.prompt_b, c.metric, c.answer, c.other, c.what, c.direction, c.k],
                    None, **quiet)
