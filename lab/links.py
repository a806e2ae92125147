"""Links that open the app in a state: `?model=…&prompt=…&seed=…&steps=…&layer=…&head=…&view=…`.

A teacher puts such a link in a slide: the page opens on that model and prompt, presses Step
`steps` times with that seed (and `temperature`, when given) and shows that layer, head and view
(`head` is a head, `all`, or a page of a layer's heads such as `6-11`, as the Head menu offers them).
Every parameter is checked like the form's own value; an unknown or out-of-range one is left out
and named in a notice, never an error page. `link_query` writes the link of what a person sees.

A link can reopen the Circuits tab too (`CIRCUIT_PARAMS`): `tab` opens one of the page's tabs; `answer` and
`other` draw direct logit attribution (at the selected token, else the text's last); `kind` shows that kind of
composition map when the model's scores are in the server's cache (a link never starts the long job);
`circuit_layer` with `circuit_head` opens one head's OV and QK circuits. The page cannot send these with
"Link to this view" (its inputs are the API's), so what the person's Circuits tab shows is read from the
session: the records of lab.circuits, and the few settings no record holds (`CircuitsForm`, kept per session
by the page's events). Session files carry the same `CircuitsView` (lab.sessionfile).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlencode

from model.generate import Sampling

from . import patching
from .catalogue.models import DEFAULT_MODEL, ModelEntry
from .checks import UserError, check_choice, check_float, check_int, number_from_text, quoted
from .circuits_atp import MAX_ATP_TOP
from .circuits_records import KIND_NAMES
from .display import check_head
from .limits import ATTENTION_VIEWS, MAX_NEW_TOKENS, MAX_PROMPT_CHARS, SEED_RANGE, TEMPERATURE_RANGE
from .session import Session, View

TABS = ("explore", "positional", "circuits", "train", "learn")  # the page's tabs, by the ids app.py gives them
CIRCUIT_PARAMS = ("tab", "answer", "other", "kind", "circuit_layer", "circuit_head")
PARAMS = ("model", "prompt", "seed", "temperature", "steps", "layer", "head", "view", *CIRCUIT_PARAMS)
MAX_ANSWER_CHARS = 100  # an answer token as typed (a token is far shorter; the box keeps what was typed)
ATP_FORM = ("prompt_a", "prompt_b", "metric", "answer", "other", "what", "direction", "k")
# Gradio reads its own parameters from the same query string (`?__theme=dark` sets the page's theme): they
# are Gradio's business, neither unknown nor the app's to check
GRADIO_PREFIX = "__"
MAX_SHOWN = 40  # characters of a refused value quoted in the notice


@dataclass
class Link:
    """The state a link asks for, after its checks (what the page's controls are set to)."""

    model: str
    prompt: str | None
    view: View
    sampling: Sampling
    steps: int = 0
    notes: list[str] = field(default_factory=list)
    given: bool = False  # the URL had any of PARAMS
    circuits: "CircuitsView | None" = None  # what the Circuits tab shows (None: the link says nothing of it)


def _quote(value) -> str:
    return quoted(value, MAX_SHOWN)


def read_link(session: Session, params: dict) -> Link:
    """The link's parameters checked one by one; the ones that do not fit are left out, with a note."""
    params = {str(k)[:40]: v for k, v in (params or {}).items()}
    notes = [f"Ignored the unknown link parameter {_quote(k)}." for k in params
             if k not in PARAMS and not k.startswith(GRADIO_PREFIX)]
    ignored = []

    def take(name, check, default):
        if name not in params:
            return default
        try:
            return check(params[name])
        except (UserError, ValueError, TypeError) as exc:
            ignored.append(f"{name}={_quote(params[name])} ({str(exc).rstrip('.')})")
            return default

    model = take("model", lambda v: session.entry_for(v).name, DEFAULT_MODEL)
    cfg = session.entry_for(model).cfg

    def prompt_check(v):
        if not isinstance(v, str) or not v.strip() or len(v) > MAX_PROMPT_CHARS:
            raise UserError(f"a prompt must be 1 to {MAX_PROMPT_CHARS} characters")
        return v

    prompt = take("prompt", prompt_check, None)
    seed = take("seed", lambda v: check_int("seed", v, *SEED_RANGE), 0)  # check_int reads numbers as text too
    temperature = take("temperature", lambda v: check_float("temperature", _float(v), *TEMPERATURE_RANGE), 0.8)
    steps = take("steps", lambda v: check_int("steps", v, 0, MAX_NEW_TOKENS), 0)
    layer = take("layer", lambda v: check_int("layer", v, 0, cfg.n_layers - 1), None)
    head = take("head", lambda v: check_head(v, cfg.n_heads), None)  # a head, "all" or a page ("6-11")
    view = take("view", lambda v: check_choice("view", v, ATTENTION_VIEWS), "weights")
    circuits = _read_circuits(params, take, session.entry_for(model), ignored)
    notes += [f"Ignored the link's {item}." for item in ignored]
    fv = session.entry_for(model).first_view
    if layer is None:
        layer = fv.layer if fv is not None else 0
    if head is None:
        head = check_head(fv.head if fv is not None and "layer" not in params else "all", cfg.n_heads)
    head, page = head
    return Link(model, prompt, View(layer, head, view, page), Sampling(temperature=temperature, seed=seed), steps,
                notes, given=any(k in PARAMS for k in params), circuits=circuits)


def _float(v):
    """A number as a URL carries it (text), or as the API sends it."""
    if isinstance(v, str):
        number = number_from_text(v)
        if number is None:
            raise UserError("not a number")
        return number
    return v


def open_link(session: Session, link: Link) -> Link:
    """Press Step `link.steps` times on the link's model, prompt and sampling (the text goes on from
    the prompt). A prompt the model cannot read, or a text that ends early, is noted, not an error."""
    if link.prompt is None or link.steps == 0:
        return link
    try:
        for _ in range(link.steps):
            session.step(link.model, link.prompt, link.sampling)
    except UserError as exc:
        link.notes.append(f"The link's text stopped: {str(exc).rstrip('.')}.")
    return link


def link_query(session: Session, model_name, prompt, sampling: Sampling, view: View) -> tuple[str, str]:
    """(query, note): the query part of a link to what this person sees. With a text made by Steps
    of one sampling setting the link makes the same text; otherwise the note says what it cannot carry."""
    d = session.decoder
    steps, note = 0, ""
    if d is not None:
        model_name, prompt = session.entry.name, session.prompt
        steps = len(d.ids) - d.prompt_len
        settings = {tuple(a["sampling"]) for a in session.log if a and "sampling" in a}
        kinds = {a["do"] for a in session.log if a}
        if len(settings) > 1 or kinds - {"step"}:
            note = ("This text was made with Generate, Undo or changing sampling settings: the link presses Step "
                    f"{steps} times, so its text may differ. “Save session” keeps it exactly.")
        if settings:
            t, k, p = next(iter(settings))
            sampling = Sampling(temperature=t, top_k=k, top_p=p, seed=d.sampling.seed)
    params = {"model": model_name, "prompt": prompt, "seed": sampling.seed, "temperature": sampling.temperature,
              "steps": steps, "layer": view.layer, "head": view.menu_head, "view": view.view}
    params.update(circuits_params(circuits_view(session, model_name)))
    if sampling.top_k or sampling.top_p < 1.0:
        note = note or "Links carry temperature and seed, not top-k or top-p: the text may differ."
    return urlencode(params), note


# ------------------------------------------------------------------------------- the Circuits tab


@dataclass
class CircuitsView:
    """What a link or a session file asks the Circuits tab to show (None: it says nothing of that part).
    Drawing it (ui/circuits_reopen.py) costs little: the composition map only when its scores are cached,
    attribution patching only its form (the person presses Run)."""

    tab: str | None = None  # the tab the page opens on (TABS)
    dla: tuple[str, str] | None = None  # direct logit attribution drawn: (answer, other) as typed, "" for none
    kind: str | None = None  # the composition map's kind (KIND_NAMES), drawn when the scores are cached
    head: tuple[int, int] | None = None  # (layer, head) whose OV and QK circuits are opened
    atp: dict | None = None  # the attribution patching form (ATP_FORM; session files only)


@dataclass
class CircuitsForm:
    """What the person's Circuits tab holds that no record of lab.circuits does, kept as the page's events tell
    it (ui/circuits_reopen.py): the last tab opened besides Explore, the composition kind chosen, and the
    attribution patching form as it was last run; and `drawn`, the tab's values a link or a file has just
    drawn, until the event the page chains after the load or the opening takes them."""

    last_tab: str | None = None
    kind: str = "k"
    atp: dict | None = None
    drawn: dict | None = None


def circuits_form(session: Session) -> CircuitsForm:
    """The session's CircuitsForm, kept on its Circuits part (made on first use; it goes with the session)."""
    form = getattr(session.circuits, "form", None)
    if form is None:
        form = session.circuits.form = CircuitsForm()
    return form


def note_tab(session: Session, tab) -> None:
    """The person opened tab `tab` (one of TABS)."""
    tab = check_choice("tab", tab, TABS)
    if tab != "explore":  # "Link to this view" and "Save session" are on Explore: the tab before it counts
        circuits_form(session).last_tab = tab


def note_kind(session: Session, kind) -> None:
    circuits_form(session).kind = check_choice("kind", kind, KIND_NAMES)


def note_atp(session: Session, values: dict) -> None:
    circuits_form(session).atp = check_atp_form(values)


def keep_form(session: Session, view: CircuitsView | None) -> None:
    """A link or a file reopened `view`: what it set is the person's now (their next link or file carries it)."""
    if view is None:
        return
    form = circuits_form(session)
    if view.kind is not None:
        form.kind = view.kind
    if view.atp is not None:
        form.atp = dict(view.atp)
    if view.tab not in (None, "explore"):
        form.last_tab = view.tab


def _text(name: str, value, limit: int) -> str:
    """Text of a form's box: at most `limit` characters that UTF-8 can write (no lone surrogate); None is blank."""
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit:
        raise UserError(f"{name} must be text of at most {limit:,} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{name} holds a character that cannot be written") from None
    return value


def check_answer(entry: ModelEntry, value, which: str) -> str:
    """An answer token of direct logit attribution as typed: "" (none) or one token of the model, as the DLA
    box reads it (lab.patching.answer_token)."""
    value = _text(f"the {which} answer", value, MAX_ANSWER_CHARS)
    if value:
        try:
            patching.answer_token(entry, value, which)
        except (UserError, ValueError):
            raise UserError("not one token of this model") from None
    return value


def check_dla(entry: ModelEntry, answer: str, other: str) -> None:
    """The pair DLA can draw: a second token only after a first, and not the same token."""
    if other and not answer:
        raise UserError("the second answer token needs a first")
    if other and patching.answer_token(entry, answer, "first") == patching.answer_token(entry, other, "second"):
        raise UserError("the two answer tokens are the same token")


def check_atp_form(values) -> dict:
    """The attribution patching form (ATP_FORM) as the tab's boxes hold it: each value of the kind and within
    the bounds of its box (whether its answers are tokens of the model is for Run to say)."""
    if not isinstance(values, dict):
        raise UserError("the attribution patching form is not an object")
    form = {"prompt_a": _text("prompt A", values.get("prompt_a"), MAX_PROMPT_CHARS),
            "prompt_b": _text("prompt B", values.get("prompt_b"), MAX_PROMPT_CHARS),
            "metric": check_choice("metric", values.get("metric"), patching.METRICS),
            "answer": _text("the answer token", values.get("answer"), MAX_ANSWER_CHARS),
            "other": _text("the second answer token", values.get("other"), MAX_ANSWER_CHARS),
            "what": check_choice("what to patch", values.get("what"), patching.SWEEPS),
            "direction": check_choice("direction", values.get("direction"), patching.DIRECTIONS),
            "k": check_int("cells re-run exactly", values.get("k"), 1, MAX_ATP_TOP)}
    return form


def _read_circuits(params: dict, take, entry: ModelEntry, ignored: list[str]) -> CircuitsView | None:
    """The link's Circuits parameters, each checked as `read_link` checks the others (`take`); DLA is drawn
    when the link opens the Circuits tab or gives an answer."""
    if not any(k in params for k in CIRCUIT_PARAMS):
        return None
    cfg = entry.cfg
    tab = take("tab", lambda v: check_choice("tab", v, TABS), None)
    answer = take("answer", lambda v: check_answer(entry, v, "first"), None)
    other = take("other", lambda v: check_answer(entry, v, "second"), None)
    dla = None
    if answer is not None or tab == "circuits":
        dla = (answer or "", other or "")
        try:
            check_dla(entry, *dla)
        except UserError as exc:
            ignored.append(f"other={_quote(other)} ({exc})")
            dla = (dla[0], "")
    elif other is not None:
        ignored.append(f"other={_quote(other)} (give the answer token too)")
    kind = take("kind", lambda v: check_choice("kind", v, KIND_NAMES), None)
    layer = take("circuit_layer", lambda v: check_int("circuit layer", v, 0, cfg.n_layers - 1), None)
    head = take("circuit_head", lambda v: check_int("circuit head", v, 0, cfg.n_heads - 1), None)
    if (layer is None) != (head is None):  # one head needs both
        name, needs = ("circuit_layer", "circuit_head") if layer is not None else ("circuit_head", "circuit_layer")
        ignored.append(f"{name}={_quote(params[name])} (it opens a head with {needs})")
    return CircuitsView(tab, dla, kind, (layer, head) if layer is not None and head is not None else None)


def _typed(entry: ModelEntry, token: int) -> str:
    """The text a person types for `token` (what its DLA box reads back as it), else its display piece."""
    text = entry.tokenizer.decode([token])
    if isinstance(text, str) and 0 < len(text) <= MAX_ANSWER_CHARS:
        try:
            if patching.answer_token(entry, text, "first") == token:
                return text
        except (UserError, ValueError):
            pass
    return entry.pieces[token]


def circuits_view(session: Session, model_name) -> CircuitsView | None:
    """What this person's Circuits tab shows of `model_name` (None: they have not used it): the DLA, composition
    and head records of that model, the composition kind, the attribution patching form last run, and the
    Circuits tab when it was the last tab they opened besides Explore."""
    last, form = session.circuits.last, circuits_form(session)
    dla = head = kind = None
    r = last.get("dla")
    if r is not None and r.model == model_name:
        try:
            entry = session.entry_for(model_name)
        except UserError:  # an own model since removed: its records say nothing of this one
            entry = None
        if entry is not None:
            dla = ("" if r.default_answer else _typed(entry, r.answer),
                   "" if r.other is None else _typed(entry, r.other))
    r = last.get("composition")
    if r is not None and r.model == model_name:
        kind = form.kind
    r = last.get("circuits")
    if r is not None and r.model == model_name:
        head = (r.layer, r.head)
    if dla is None and kind is None and head is None and form.atp is None:
        return None
    return CircuitsView("circuits" if form.last_tab == "circuits" else None, dla, kind, head,
                        None if form.atp is None else dict(form.atp))


def circuits_params(view: CircuitsView | None) -> dict:
    """A link's Circuits parameters for `view` (its attribution patching form stays out: files carry it)."""
    if view is None:
        return {}
    params = {}
    if view.tab is not None:
        params["tab"] = view.tab
    if view.dla is not None:
        params["answer"] = view.dla[0]  # blank: the model's own prediction
        if view.dla[1]:
            params["other"] = view.dla[1]
    if view.kind is not None:
        params["kind"] = view.kind
    if view.head is not None:
        params["circuit_layer"], params["circuit_head"] = view.head
    return params


def circuits_doc(view: CircuitsView) -> dict:
    """`view` as a session file writes it (its "circuits" object)."""
    return {"tab": view.tab, "dla": None if view.dla is None else {"answer": view.dla[0], "other": view.dla[1]},
            "kind": view.kind, "head": None if view.head is None else {"layer": view.head[0], "head": view.head[1]},
            "atp": view.atp}


def read_circuits_doc(value, entry: ModelEntry) -> CircuitsView:
    """A session file's "circuits" object, every value checked (UserError: the first that does not fit)."""
    if not isinstance(value, dict):
        raise UserError("they are not an object")
    cfg = entry.cfg
    tab, kind, dla, head, atp = (value.get(k) for k in ("tab", "kind", "dla", "head", "atp"))
    if tab is not None:
        check_choice("tab", tab, TABS)
    if kind is not None:
        check_choice("kind", kind, KIND_NAMES)
    if dla is not None:
        if not isinstance(dla, dict):
            raise UserError("the direct logit attribution is not an object")
        dla = (check_answer(entry, dla.get("answer"), "first"), check_answer(entry, dla.get("other"), "second"))
        check_dla(entry, *dla)
    if head is not None:
        if not isinstance(head, dict):
            raise UserError("the head opened is not an object")
        head = (check_int("layer", head.get("layer"), 0, cfg.n_layers - 1),
                check_int("head", head.get("head"), 0, cfg.n_heads - 1))
    return CircuitsView(tab, dla, kind, head, None if atp is None else check_atp_form(atp))
