"""Session files: one JSON file holds what a person saw, so that anyone can open it again and get
the same tokens and the same numbers.

What a file holds: the model (a built-in by name and the SHA-256 of its shipped file, or an own
model's whole checkpoint: weights, tokenizer and film), the prompt and seed, every action that
made the text (Step, Generate, Undo, each with its sampling settings and the tokens it produced),
the view (layer, head or page of heads, view, colour mode, large fonts, selected token, head tool), the head
settings (ablated heads, mode, edited row), the sampling settings of the form and, once the person has used
the Circuits tab, what it shows ("circuits", lab.links.CircuitsView: the DLA answer tokens, the composition
kind, the head opened, the attribution patching form; files without it, saved before, open as they did).

Opening one replays the actions with the engine's own code (`Session.step` / `Session.generate` /
`Session.undo`, each token forced to the recorded one: the sampler still advances as it did), so
the text, its attention and every distribution are computed again, not read from the file. All of
it happens on a scratch session first; only a file that replays completely replaces anything.
A hostile or inconsistent file is refused with a sentence and changes nothing. The replay's cost
(lab.server.rates.replay_cost: its Steps and its model's work) is taken from the importer's address's share
once the model is known and before the first action runs, so no replay runs past that share.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import tempfile
from pathlib import Path

from model.generate import Sampling

from . import links
from .catalogue.models import ModelEntry, encode_prompt
from .catalogue.uploads import checkpoint_data
from .checks import UserError, check_choice, check_sampling, is_int, quoted
from .headsettings import ProbeSettings, head_label
from .limits import COLOUR_MODES, MAX_LOG, MAX_NEW_TOKENS, MAX_PROMPT_CHARS, SEED_RANGE, UPLOAD_MAX_MB
from .server import files
from .server.budget import MODEL_BUDGET
from .server.rates import ModelWork, charge, replay_cost
from .session import HEAD_TOOLS, Session, View

FORMAT = "decoder-lab-session"
VERSION = 1
MAX_FILE_BYTES = UPLOAD_MAX_MB * 2**20  # the same bound as a model upload (an own model's weights are inside)
_CHECKSUMS: dict[str, str] = {}


def builtin_checksum(session: Session, name: str) -> str:
    """SHA-256 of a built-in model's shipped file (computed once per process)."""
    if name not in _CHECKSUMS:
        _CHECKSUMS[name] = hashlib.sha256(session.builtins.path(name).read_bytes()).hexdigest()
    return _CHECKSUMS[name]


def check_form_prompt(prompt, entry: ModelEntry) -> list[str]:
    """A file without a text keeps the prompt box as it was: blank, or a prompt the model can read
    within the limits of typing one (`encode_prompt`'s checks, its notices returned)."""
    if not isinstance(prompt, str):
        raise UserError("The prompt must be text.")
    if not prompt.strip() and len(prompt) <= MAX_PROMPT_CHARS:
        return []
    return encode_prompt(prompt, entry)[1]


# ------------------------------------------------------------------------------- export


def export_session(session: Session, model_name, prompt, sampling: Sampling, view: View) -> bytes:
    """The session as a file (UTF-8 JSON). With a text: its model, prompt and log; without: the
    model and prompt of the form (opening it shows them, ready for a Step)."""
    if session.decoder is not None:
        entry, prompt, seed, log = session.entry, session.prompt, session.decoder.sampling.seed, session.log
        if log and log[-1] is None:
            raise UserError(f"This text was made with more than {MAX_LOG} actions (Steps, Undos): too many to "
                            "save. Reset and make it again to save it.")
    else:
        entry, seed, log = session.entry_for(model_name), sampling.seed, []
        check_form_prompt(prompt, entry)  # refused here as it would be when the file is opened
    if entry.builtin:
        model = {"builtin": entry.name, "sha256": builtin_checksum(session, entry.name)}
    elif entry.name in session.external and session.external.get(entry.name) is entry:
        # a model the person running the app added: named by its source and the hash of its files
        model = {"external": entry.meta["source"], "sha256": entry.meta["sha256"]}
    else:
        model = {"name": entry.name, "checkpoint": base64.b64encode(checkpoint_data(entry)).decode("ascii")}
    probe = session.heads.settings
    if session.decoder is None:
        # no text (after Reset): the heads chosen stay for the next text on this model (on another model
        # they would go); an edited row went with its text
        probe = dataclasses.replace(probe, edit=None) if session.entry is entry else ProbeSettings()
    e = probe.edit
    doc = {
        "format": FORMAT, "version": VERSION, "model": model, "prompt": prompt, "seed": seed,
        "actions": log,
        "view": {"layer": view.layer, "head": view.menu_head, "view": view.view, "colour": session.display.colour,
                 "presentation": session.display.presentation, "tool": session.display.tool,
                 "query": session.query},
        "probe": {"heads": [head_label(*h) for h in probe.heads], "mode": probe.mode,
                  "keep_only": probe.keep_only,
                  "edit": None if e is None else {"layer": e.layer, "head": e.head, "query": e.query, "key": e.key}},
        "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                     "seed": sampling.seed},
    }
    circuits = links.circuits_view(session, entry.name)
    if circuits is not None:
        doc["circuits"] = links.circuits_doc(circuits)
    data = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if len(data) > MAX_FILE_BYTES:
        raise UserError(f"This session would be {len(data) / 2**20:.1f} MB, over the {UPLOAD_MAX_MB} MB limit "
                        "for opening it again.")
    return data


# ------------------------------------------------------------------------------- import


@dataclasses.dataclass
class OpenedSession:
    """What an opened session restores besides the text itself (the wiring sets its controls)."""

    model: str  # its name in the model list
    prompt: str
    view: View
    sampling: Sampling
    notes: list[str]
    circuits: links.CircuitsView | None = None  # what the Circuits tab shows (None: the file says nothing of it)


def _bad(reason: str) -> UserError:
    return UserError(f"This file is not a Decoder Lab session this app can open: {reason}.")


def _get(doc: dict, key: str, kind, what: str | None = None):
    value = doc.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _bad(f"its {what or key} is missing or of the wrong kind")
    return value


def read_session_file(path) -> dict:
    """The file's JSON, within the size limit, before anything is done with it."""
    if not path or not isinstance(path, str):
        raise UserError("Choose a session file (.json) first.")
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise _bad(f"it has {size / 2**20:.1f} MB, over the {UPLOAD_MAX_MB} MB limit")
        raw = p.read_bytes()
    except OSError:
        raise UserError("The session file could not be read.") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _bad("it is not JSON text") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise _bad("it is not a session file (saved with “Save session”)")
    if doc.get("version") != VERSION:
        raise _bad(f"it is version {quoted(doc.get('version'), 20)}, this app reads version {VERSION}")
    return doc


def _sampling(values, seed: int) -> Sampling:
    if not isinstance(values, list) or len(values) != 3:
        raise _bad("an action's sampling settings are not [temperature, top-k, top-p]")
    t, k, p = values
    try:
        return check_sampling(t, k, p, seed)
    except UserError as exc:
        raise _bad(f"an action's {exc}".rstrip(".")) from None


def _external_model(scratch: Session, model: dict) -> str:
    """The app's model from the source a file names, when its files have the file's hash."""
    source = model["external"]
    if not isinstance(source, str):
        raise _bad("its model's source is not text")
    name = scratch.external.by_label(source)
    if name is None:
        raise UserError(f"This session was made with {quoted(source, 120)}, which this app does not offer, so it "
                        "cannot be reproduced here.")
    if model.get("sha256") != scratch.entry_for(name).meta["sha256"]:
        raise UserError(f"This session was saved with other weights of '{source[:120]}' (their checksum "
                        "differs), so it cannot be reproduced here.")
    return name


def _load_model(scratch: Session, model: dict) -> str:
    """The file's model in the scratch session: a built-in (its checksum must match) or an own model."""
    if "builtin" in model:
        name = model["builtin"]
        if not isinstance(name, str) or name not in scratch.builtins.models:
            raise _bad(f"its built-in model {str(name)[:60]!r} is not one of this app's")
        if model.get("sha256") != builtin_checksum(scratch, name):
            raise UserError(f"This session was saved with another version of '{name}' (its checksum differs), so "
                            "it cannot be reproduced here.")
        return name
    if "external" in model:
        return _external_model(scratch, model)
    data = model.get("checkpoint")
    if not isinstance(data, str):
        raise _bad("its model is neither a built-in nor a saved checkpoint")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _bad("its model's checkpoint is not valid base64") from None
    stored = model.get("name") if isinstance(model.get("name"), str) else "model"
    with tempfile.TemporaryDirectory() as tmp:  # the upload checks read a file
        path = Path(tmp) / f"{files.safe_file_stem(stored)[:40] or 'model'}.safetensors"
        path.write_bytes(raw)
        return scratch.upload(str(path))


def model_work(entry: ModelEntry, prompt) -> ModelWork | None:
    """What a replay of `prompt` on this model costs besides its Steps (None: a prompt it cannot read, whose
    first Step is refused before the model runs)."""
    try:
        prompt_tokens = len(encode_prompt(prompt, entry)[0])
    except UserError:
        return None
    params = entry.n_params()
    return ModelWork(params, entry.cfg.block_size, prompt_tokens)


def _replay(scratch: Session, name: str, prompt: str, seed: int, actions: list, payer: Session) -> None:
    if len(actions) > MAX_LOG:
        raise _bad(f"it lists {len(actions)} actions, more than {MAX_LOG}")
    charge(payer, "replay", replay_cost(actions, model_work(scratch.entry_for(name), prompt)))  # before it runs
    vocab = scratch.entry_for(name).tokenizer.vocab_size
    for i, action in enumerate(actions):
        if not isinstance(action, dict) or action.get("do") not in ("step", "generate", "undo"):
            raise _bad(f"action {i + 1} is not a Step, Generate or Undo")
        if action["do"] == "undo":
            if scratch.decoder is None or not scratch.undo().undone:
                raise _bad(f"action {i + 1} undoes a token the text does not have")
            continue
        sampling = _sampling(action.get("sampling"), seed)
        tokens = action.get("tokens")
        if (not isinstance(tokens, list) or not 1 <= len(tokens) <= MAX_NEW_TOKENS
                or not all(is_int(t) and 0 <= t < vocab for t in tokens)):
            raise _bad(f"action {i + 1} lists tokens this model does not have")
        if action["do"] == "step" and len(tokens) != 1:
            raise _bad(f"action {i + 1} is a Step of {len(tokens)} tokens")
        try:
            if action["do"] == "step":
                scratch.step(name, prompt, sampling, force=tokens[0])
            else:
                made = [f.step.token_id for f in scratch.generate(name, prompt, sampling, len(tokens), force=tokens)]
                if made != tokens:  # a text ended by <EOS> cannot go on
                    raise ValueError("the text ended early")
        except UserError:
            raise  # already a sentence (a word the model does not know, the server's memory…)
        except ValueError as exc:  # the engine's: a token these settings could not have produced
            raise _bad(f"action {i + 1} cannot be replayed on this model ({str(exc)[:120].rstrip('.')})") from None


def _view(scratch: Session, doc: dict, name: str) -> View:
    v = doc.get("view") if isinstance(doc.get("view"), dict) else {}
    try:
        head = v.get("head", "all")
        view = scratch.check_view(name, v.get("layer", 0), "all" if head is None else head,  # null: all heads
                                  v.get("view", "weights"))
        colour = check_choice("colour", v.get("colour", "linear"), COLOUR_MODES)
        tool = check_choice("head tool", v.get("tool", "roles"), HEAD_TOOLS)
    except UserError as exc:
        raise _bad(f"its view settings are out of range ({str(exc).rstrip('.')})") from None
    presentation = v.get("presentation", False)
    if not isinstance(presentation, bool):
        raise _bad("its large-fonts setting is not true or false")
    scratch.set_display(colour=colour, presentation=presentation)
    scratch.show_tool(tool)
    query = v.get("query")
    if query is not None:
        if scratch.decoder is None:
            raise _bad("it selects a token of a text it does not have")
        try:
            scratch.select(query)
        except UserError:
            raise _bad("its selected token is not in the text") from None
    return view


def _probe(scratch: Session, doc: dict, name: str) -> None:
    p = doc.get("probe")
    if p is None:
        return
    if not isinstance(p, dict):
        raise _bad("its head settings are not an object")
    heads, mode, keep_only, edit = p.get("heads", []), p.get("mode", "zero"), p.get("keep_only", False), p.get("edit")
    try:
        if not heads and not keep_only:  # no head ablated: only the mode the form shows
            scratch.heads.restore_mode(mode)
        else:
            if scratch.decoder is None:  # kept after Reset, for the next text on this model
                scratch.select_model(name)
            scratch.heads.set_ablation(heads, mode, keep_only)
        if edit is not None and scratch.decoder is not None:  # (without a text: an edit of a text gone, dropped)
            if not isinstance(edit, dict):
                raise UserError("the edit is not an object")
            scratch.heads.restore_edit(edit.get("layer"), edit.get("head"), edit.get("query"), edit.get("key"))
    except UserError as exc:
        raise _bad(f"its head settings do not fit ({str(exc).rstrip('.')})") from None


def open_session(session: Session, path) -> OpenedSession:
    """Open a session file into `session`: everything is replayed on a scratch session, then taken
    over at once (own model, text, view, head settings). Refused files change nothing."""
    doc = read_session_file(path)
    model = _get(doc, "model", dict)
    prompt = _get(doc, "prompt", str)
    seed = _get(doc, "seed", int)
    if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise _bad("its seed is out of range")
    actions = _get(doc, "actions", list)
    s = doc.get("sampling") if isinstance(doc.get("sampling"), dict) else {}
    try:
        form = check_sampling(s.get("temperature", 0.8), s.get("top_k", 0), s.get("top_p", 1.0), s.get("seed", seed))
    except UserError as exc:
        raise _bad(f"its sampling settings are out of range ({str(exc).rstrip('.')})") from None
    scratch = Session(session.builtins)
    scratch.external = session.external  # the models added with --model that this session is offered
    scratch.client = getattr(session, "client", None)  # what it holds while it replays counts for the importer
    scratch.display = dataclasses.replace(session.display)
    try:
        name = _load_model(scratch, model)
        if actions:
            _replay(scratch, name, prompt, seed, actions, session)
            notes = []
        else:
            try:
                notes = check_form_prompt(prompt, scratch.entry_for(name))
            except UserError as exc:
                raise _bad(f"its prompt cannot be typed here ({str(exc).rstrip('.')})") from None
        view = _view(scratch, doc, name)
        _probe(scratch, doc, name)
        circuits = _circuits(scratch, doc, name)
        notes = [f"Opened a session of '{name}': {_told(scratch)}.", *notes]
        name = session.adopt(scratch, name)
    finally:
        MODEL_BUDGET.release(scratch)
    return OpenedSession(name, prompt, view, form, notes, circuits)


def _circuits(scratch: Session, doc: dict, name: str) -> links.CircuitsView | None:
    value = doc.get("circuits")
    if value is None:
        return None
    try:
        return links.read_circuits_doc(value, scratch.entry_for(name))
    except (UserError, ValueError) as exc:
        raise _bad(f"its circuits settings do not fit ({str(exc).rstrip('.')})") from None


def _told(scratch: Session) -> str:
    d = scratch.decoder
    if d is None:
        return "no text yet (press Step)"
    made = len(d.ids) - d.prompt_len
    return f"{made} generated token{'s' if made != 1 else ''} replayed and checked"
