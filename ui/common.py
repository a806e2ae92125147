"""What every handler of the wiring shares: errors as messages, one action per session, API values.

`handler` wraps each event handler: it trades the page's session key (its gr.State holds a
lab.server.sessionstore.SessionKey, never a session) for the server's own session of the tab
(lab.server.sessionstore.SessionStore, the one home of a person's session), checks the client's rate for
costly actions (unless the door of ui/door.py took that token when the call joined the queue),
holds the session for the whole action, and turns every error into a message for the person.
"""

from __future__ import annotations

try:  # ZeroGPU needs `spaces` imported before torch touches CUDA; locally it is absent
    from spaces import GPU as gpu
except ImportError:  # pragma: no cover - depends on the environment
    def gpu(fn=None, **_kwargs):
        return fn if callable(fn) else (lambda f: f)

import contextlib
import functools
import html
import inspect
import logging

import gradio as gr

import viz
from lab.checks import UserError, quoted
from lab.export import file_name
from lab.server.rates import LIMITER, client_key
from lab.server.sessionstore import SessionKey
from lab.session import SESSIONS, Session

from .plots import to_plot
from .door import charged_at_door

log = logging.getLogger("decoder_lab")


def handler(fn=None, *, exclusive: bool = True, rate: str | None = None, replays=None):
    """Wrap an event handler so that every error reaches the person as a message.

    A refusal (`UserError`, or a ValueError from a check) shows its own text; anything else is
    logged with its traceback and shown as a generic message, never with internal details.
    With `exclusive`, the handler holds its session (first argument) for the whole call, a
    streaming one until its last update or its cancellation: one action per session at a time.
    `replays(params)`: the Steps a call with these page parameters (the query of the page's
    address) replays, which the door charges when the call joins the queue.
    """
    if fn is None:
        return functools.partial(handler, exclusive=exclusive, rate=rate, replays=replays)

    def prepared(args) -> tuple[list, SessionKey | None]:
        """The arguments with the server's own session for this tab in place of the page's key (a
        Session that a Python caller gives is used as it is when the call carries no session hash),
        after the client's rate for `rate` actions is checked; and the page's key, if one came."""
        args = list(args)
        key = args[0] if args and isinstance(args[0], SessionKey) else None
        request = next((a for a in args if isinstance(a, gr.Request)), None)
        if key is not None and request is None:
            raise RuntimeError(f"{fn.__name__} takes the page's session key but no gr.Request to find the session by")
        if request is not None and args and isinstance(args[0], (SessionKey, Session)):
            host = request.client.host if request.client else None
            client = client_key(host, request.headers.get("x-forwarded-for"))
            charged = charged_at_door(request)
            given = None if key is not None else args[0]
            args[0] = SESSIONS.resolve(request.session_hash, client, given, paid="session" in charged)
            if key is not None:
                key.session_hash = request.session_hash
            if rate is not None and rate not in charged:
                LIMITER.check(client, rate)
        return args, key

    def keyed(result, session, key: SessionKey | None):
        """What the handler returned, with the page's key wherever it returned the session (the page's
        gr.State holds the key, never the session)."""
        if key is None:
            return result
        if result is session:
            return key
        if isinstance(result, (tuple, list)):
            return type(result)(key if r is session else r for r in result)
        return result

    def turn(args):
        held = exclusive and args and isinstance(args[0], Session)
        return args[0].turn() if held else contextlib.nullcontext()

    def message(exc: Exception) -> gr.Error:
        if isinstance(exc, gr.Error):
            return exc
        if isinstance(exc, ValueError):
            # a lone surrogate (JSON's \\udfff) in a message, had one slipped past lab.checks.quoted, is written
            # as its escape: gradio cannot send it, and the page's event stream would never say the call ended
            text = str(exc).encode("utf-8", "backslashreplace").decode("utf-8")
            log.info("refused %s: %s", fn.__name__, text)  # one line: a refusal is not a fault
            # gradio shows a message as HTML: escaped, "<EOS>" or a typed "<b>" reads as written
            return gr.Error(html.escape(text, quote=False), print_exception=False)
        log.exception("unexpected error in %s", fn.__name__)
        return gr.Error("Something went wrong on the server; the error was logged. Try again or reset.")

    def wrapped(*args):
        try:
            args, key = prepared(args)
            with turn(args):
                return keyed(fn(*args), args[0], key)
        except Exception as exc:
            raise message(exc) from None

    def wrapped_gen(*args):  # gradio streams a handler only if it is a generator function itself
        try:
            args, key = prepared(args)
            with turn(args), contextlib.closing(fn(*args)) as updates:  # a cancelled stream stops the handler too
                for update in updates:
                    yield keyed(update, args[0], key)
        except Exception as exc:
            raise message(exc) from None

    out = functools.wraps(fn)(wrapped_gen if inspect.isgeneratorfunction(fn) else wrapped)
    out.exclusive, out.rate, out.replays = exclusive, rate, replays  # what the door (ui/door.py) admits a call by
    return out


# Every event hands its inputs to the handler as they were sent (`preprocess=False`): gradio's own
# input checks refuse bad API values before any handler runs, with messages that show Python type
# reprs and server paths and name no argument. Our handlers check every value first (lab.checks)
# and refuse it by name, changing nothing. Files still pass gradio's upload checks and arrive as
# a FileData dict, whose cached path `file_path` takes.
RAW = dict(preprocess=False)

# How Markdown in the page marks formulas (the Positional and Learn tabs): $$…$$ on a line of its own, $…$ inline.
LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]


def file_path(value, suffix: str) -> str | None:
    """The server-side path of an uploaded file as a handler receives it (None when there is none).

    Its name must end with `suffix` (gradio's own check of `file_types` is one we skip).
    """
    path = value.get("path") if isinstance(value, dict) else value
    if path is None or path == "":
        return None
    name = value.get("orig_name") or path if isinstance(value, dict) else path
    if not isinstance(path, str) or not isinstance(name, str) or not name.lower().endswith(suffix):
        raise UserError(f"Choose a {suffix} file.")
    return path


def known_model(session: Session, name) -> str:
    """`name` when it is a model of the session's list (or its text's own model), checked without loading
    it: a handler that takes a model name it may not need (a text goes on with its own model) still
    refuses one that is not known, as a handler that needs it would."""
    if not isinstance(name, str):
        raise UserError("The model must be given by its name in the list.")
    if name != session.model_name and name not in session.model_names():
        raise UserError(f"Unknown model {quoted(name, 60)}. Pick one from the list.")
    return name


def api_example(component, value):
    """Show `value` as this input's example in view_api() (a valid prompt; no file from the web)."""
    component.example_payload = component.example_value = lambda: value


def named(fig, *parts):
    """`fig` with the file name its PNG / SVG download gets: the parts (model, layer, head, step…)
    as ASCII, joined by "_"."""
    return viz.with_filename(fig, file_name(*parts))


def message_plot(text: str):
    return to_plot(viz.message_figure(text))
