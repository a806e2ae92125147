"""Links that open the app in a state: `?model=…&prompt=…&seed=…&steps=…&layer=…&head=…&view=…`.

A teacher puts such a link in a slide: the page opens on that model and prompt, presses Step
`steps` times with that seed (and `temperature`, when given) and shows that layer, head and view
(`head` is a head, `all`, or a page of a layer's heads such as `6-11`, as the Head menu offers them).
Every parameter is checked like the form's own value; an unknown or out-of-range one is left out
and named in a notice, never an error page. `link_query` writes the link of what a person sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlencode

from model.generate import Sampling

from .catalogue.models import DEFAULT_MODEL
from .checks import UserError, check_choice, check_float, check_int, number_from_text, quoted
from .display import check_head
from .limits import ATTENTION_VIEWS, MAX_NEW_TOKENS, MAX_PROMPT_CHARS, SEED_RANGE, TEMPERATURE_RANGE
from .session import Session, View

PARAMS = ("model", "prompt", "seed", "temperature", "steps", "layer", "head", "view")
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
    cfg = session.entry_for(model).model.cfg

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
    notes += [f"Ignored the link's {item}." for item in ignored]
    fv = session.entry_for(model).first_view
    if layer is None:
        layer = fv.layer if fv is not None else 0
    if head is None:
        head = check_head(fv.head if fv is not None and "layer" not in params else "all", cfg.n_heads)
    head, page = head
    return Link(model, prompt, View(layer, head, view, page), Sampling(temperature=temperature, seed=seed), steps,
                notes, given=any(k in PARAMS for k in params))


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
    if sampling.top_k or sampling.top_p < 1.0:
        note = note or "Links carry temperature and seed, not top-k or top-p: the text may differ."
    return urlencode(params), note
