"""Save & share (Explore tab): session files, links, the numbers of a view and standalone pages.

A session file or a link sets the whole Explore page at once (`explore_state`): model, prompt,
text, figures, view and sampling controls, with a notice of anything left out. What it says of the
Circuits tab is drawn in the same call (ui/circuits_reopen.py) and shown by the event chained after it,
so the outputs of /import_session stay Explore's.
"""

from __future__ import annotations

import html
from urllib.parse import parse_qs

import gradio as gr

import viz

from lab import export, links, sessionfile
from lab.checks import UserError, check_int, check_sampling, check_text
from lab.limits import MAX_NEW_TOKENS, MAX_PROMPT_CHARS
from lab.server.rates import charge, replay_cost
from lab.session import Session, View

from .circuits_reopen import reopened
from .common import file_path, handler, known_model
from .door import charged_at_door
from .explore import (
    attention_figure, attention_spec, example_choices, head_choices, layer_choices, probs_figure, redisplay,
    view_caption,
)

SAVED = "Saved: the file below holds this session; “Open session” (here, or on any copy of the app) brings it back."


def explore_state(session: Session, model: str, prompt: str | None, view: View, sampling, notes: list[str]):
    """Every Explore control and figure for the session as a file or link left it (see explore_tab:
    `state_outputs`)."""
    entry = session.entry_for(model)
    cfg = entry.cfg
    examples = list(entry.examples)
    head = view.menu_head  # as the Head menu and the figure name it: a head, "all" or a page ("6-11")
    caption = view_caption(session, model, view.layer, head, view.view)
    session.keep_on_select = model  # the model list's change event that follows keeps this text
    has_text = bool(session.tokens())
    return (session, gr.update(choices=session.model_names(), value=model),
            prompt if prompt is not None else (examples[0] if examples else ""),
            gr.update(choices=example_choices(examples), value=prompt if prompt in examples else None), caption,
            session.tokens(), session.status() if has_text else entry.summary, probs_figure(session),
            attention_figure(session, view.layer, head, view.view),
            gr.update(choices=layer_choices(cfg.n_layers), value=view.layer),
            gr.update(choices=head_choices(cfg.n_heads), value=head), view.view,
            session.display.colour, session.display.presentation,
            sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed,
            gr.update(value=" ".join(html.escape(n, quote=False) for n in notes), visible=bool(notes)))


@handler(rate="export")
def save_session(session, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view,
                 request: gr.Request = None):
    """The session as a file to download (`lab.sessionfile`)."""
    known_model(session, model_name)
    check_text("prompt", prompt)
    sampling = check_sampling(temperature, top_k, top_p, seed)
    v = session.check_view(model_name if session.model_name is None else None, layer, head, view)
    data = sessionfile.export_session(session, model_name, prompt, sampling, v)
    name = session.model_name or model_name
    path = session.save_file(f"session {name} {len(session.tokens())} tokens", ".json", data)
    return str(path), f"{SAVED} ({len(data) / 1024:.1f} KB)"


@handler(rate="import")
def open_session(session, upload, request: gr.Request = None):
    """A session file chosen: the page shows exactly what was saved. Its replay is paid first, its Steps
    and its model's work, from the address's share of replays (lab.sessionfile: refused with a sentence
    before any of it runs)."""
    path = file_path(upload, ".json")
    opened = sessionfile.open_session(session, path)
    state = explore_state(session, opened.model, opened.prompt, opened.view, opened.sampling, opened.notes)
    reopened(session, opened.model, opened.circuits)  # the Circuits tab, for the event chained after this one
    return state


def link_steps(params: dict) -> int:
    """The Steps a page load with these link parameters replays (as `links.read_link` reads them: a
    prompt and a number of steps), so the door can charge them when the load joins the queue."""
    prompt = params.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        return 0
    try:
        return check_int("steps", params.get("steps", 0), 0, MAX_NEW_TOKENS)
    except UserError:
        return 0


@handler(replays=link_steps)
def page_load(session, colour, presentation, screen, layer, head, view, request: gr.Request = None):
    """The page loaded: it tells its window size (figures are laid out for it; a narrow window gets
    one head), and link parameters (?model=…&prompt=…&steps=…) set it up. One answer, so nothing of
    the load is still on its way when a person clicks or leaves (see explore_tab: `state_outputs`)."""
    attention, probs, head = redisplay(session, colour, presentation, screen, layer, head, view)
    params = dict(request.query_params) if request is not None else {}
    if not params:
        return (session, *[gr.skip()] * 6, probs, attention, gr.skip(), head, *[gr.skip()] * 8)
    return open_link(session, params, paid="replay" in charged_at_door(request))


def open_link(session: Session, params: dict, paid: bool = False):
    """Set the page up as the link parameters ask (its steps `paid` when the load joined the queue)."""
    link = links.read_link(session, params)
    if not link.given and not link.notes:
        return (session, *[gr.skip()] * 18)
    if link.prompt is not None and link.steps:
        # a link's replay is paid before it runs, as a file's: its Steps (when the load joined the queue, `paid`)
        # and its model's work, known now
        work = sessionfile.model_work(session.entry_for(link.model), link.prompt)
        cost = replay_cost([{"do": "step"}] * link.steps, work) - (link.steps if paid else 0)
        if cost > 0:
            charge(session, "replay", cost)
        session.reset()
        links.open_link(session, link)
    state = explore_state(session, link.model, link.prompt, link.view, link.sampling,
                          link.notes or ["Opened from a link."])
    reopened(session, link.model, link.circuits, link.notes)  # the Circuits tab, for the event chained after the load
    return state


@handler
def make_link(session, model_name, prompt, temperature, top_k, top_p, seed, layer, head, view,
              request: gr.Request = None):
    """A link to this view: the page answers with it as a relative link (it opens on this page's address).
    The model and prompt of the form are checked even where the link carries the text's own."""
    known_model(session, model_name)
    check_text("prompt", prompt)
    sampling = check_sampling(temperature, top_k, top_p, seed)
    v = session.check_view(model_name if session.model_name is None else None, layer, head, view)
    query, note = links.link_query(session, model_name, prompt, sampling, v)
    given = set(parse_qs(query, keep_blank_values=True))
    circuits = " and what the Circuits tab shows" if given & set(links.CIRCUIT_PARAMS) else ""
    return (f'<a id="share_link_a" href="?{html.escape(query)}" target="_blank">Link to this view</a> '
            f"(copy it from the box below; it opens the app on this model, prompt, seed, steps and view"
            f"{circuits}). {html.escape(note, quote=False)}")


NUMBERS = {  # what the numbers download offers: label → the kind's name in the API
    "attention weights (layer / head shown)": "weights", "attention scores (layer / head shown)": "scores",
    "next-token probabilities (selected token)": "probabilities", "head roles": "head_roles",
    "logit lens (selected token)": "logit_lens", "ablation / edit effect": "effect",
    "loss history (this model)": "loss_history",
}
# the lab.export function of each other kind (the attention's and the loss history's take more than the session,
# so export_numbers spells those calls out)
EXPORTS = {"probabilities": export.probabilities, "head_roles": export.head_roles, "logit_lens": export.lens_export,
           "effect": export.effect_export}


@handler(rate="export")
def export_numbers(session, what, fmt, model_name, layer, head, request: gr.Request = None):
    """The numbers behind a view as CSV or JSON (`lab.export`), to download."""
    if what not in NUMBERS.values():
        raise UserError(f"Choose what to download: one of {', '.join(NUMBERS.values())}.")
    if fmt not in ("csv", "json"):
        raise UserError("The format must be csv or json.")
    known_model(session, model_name)  # checked whatever is downloaded (most kinds are the text's own model's)
    v = session.check_view(None if session.model_name else model_name, layer, head, "weights")
    if what in ("weights", "scores"):
        exp = export.attention(session, v.layer, v.head, kind=what)
    elif what == "loss_history":
        exp = export.loss_history(session, model_name)
    else:
        exp = EXPORTS[what](session)
    data = exp.csv.encode("utf-8-sig") if fmt == "csv" else exp.json_text().encode("utf-8")
    path = session.save_file(exp.name, f".{fmt}", data)
    return str(path)


@handler(rate="export")
def save_view_page(session, layer, head, view, request: gr.Request = None):
    """The attention view shown, as one web page that opens offline (plotly.js inside)."""
    spec = attention_spec(session, layer, head, view)
    if spec is None:
        raise UserError("Press Step first: the page holds the attention of the text.")
    text = " ".join(p for p, _ in session.tokens())
    page = viz.standalone_html(spec, title=f"{session.model_name}: attention",
                               note=f"Decoder Lab · text: {text[:300]}")
    name = spec.layout["meta"]["filename"]
    return str(session.save_file(name, ".html", page.encode("utf-8")))
