"""The numbers of what the page shows, to download as CSV and JSON.

Each function takes a `Session` (and the view settings the page has) and returns an `Export`:
a file stem that says what it holds (`name`), the CSV text (`csv`) and a JSON-serialisable dict
(`json`, always with "what" and "model"). Nothing here changes the session; whatever does not
fit (no text yet, a layer out of range, a model without a loss history) raises `UserError` with
a sentence for the person.

Conventions:
- Values are the numbers the model computed, at full precision: a float32 is written as the
  Python float it equals (`repr`), so reading it back gives exactly that float32.
- Tokens are the display pieces the page shows (`Tokenizer.piece`: a space is "␣", a newline
  "⏎"); the csv module quotes whatever needs it (commas, quotes, line breaks), so every piece
  reads back exactly as written. Pieces are written as they are, never altered for spreadsheets.
- Positions are positions in the window shown (0 = its first token, as everywhere on the page);
  the JSON's "text_offset" is where the window starts in the whole text.
- Cells the causal mask hides (a key after its query) are empty in the CSV and null in the JSON;
  so is any score that is undefined on the text (NaN), and a loss that was not measured.
- Attention is what the Explore figure draws: under the head tools' change, the changed attention,
  named as such, with the model's own beside it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .checks import UserError, check_choice, check_int
from .downloads import Export, to_csv  # noqa: F401 (Export read from here by the wiring and tests)
from .limits import ATTENTION_KINDS
from .shown import shown_attention
from .heads import ranks
from .server.files import file_name, model_stem, slug  # noqa: F401 (read from here by the wiring)

if TYPE_CHECKING:
    from .session import Session

EXPORT_LENS_TOP = 10
MAX_TOP = 1000
NO_TEXT = "Press Step first: there is no text to export yet."
ATTENTION_COLUMNS = ["layer", "head", "query_position", "query_token", "key_position", "key_token", "value"]
CHANGED_COLUMNS = ["unchanged_value", "change"]  # added while the head tools change the attention drawn
PROBABILITY_COLUMNS = ["rank", "token_id", "piece", "probability", "adjusted", "chosen"]
LOSS_COLUMNS = ["step", "train_loss", "val_loss"]
LENS_COLUMNS = ["stage", "rank", "token_id", "piece", "probability"]
EFFECT_COLUMNS = ["rank_before", "rank_after", "token_id", "piece", "before", "after"]


# ----------------------------------------------------------------------------- helpers


def _number(value) -> float | None:
    """A float for JSON: the value as the Python float it equals; None when not finite."""
    value = float(value)
    return value if math.isfinite(value) else None


def _stem(*parts) -> str:
    return "_".join(p for p in (str(x) for x in parts) if p)


def _need_text(session: Session) -> None:
    if session.decoder is None or session.entry is None:
        raise UserError(NO_TEXT)


def _window(session: Session) -> tuple[list[str], list[int]]:
    d = session.decoder
    return [p for p, _ in session.tokens()], list(d.window)


def _text_json(session: Session, what: str) -> dict:
    """What every export of the current text starts with: its model, tokens and positions."""
    tokens, ids = _window(session)
    return {"what": what, "model": session.entry.name, "tokens": tokens, "token_ids": ids,
            "positions": list(range(len(ids))), "text_offset": int(session.decoder.start)}


# --------------------------------------------------------------------------- attention


def attention(session: Session, layer, head, kind="weights") -> Export:
    """The attention of one head (`head` None or "all": every head of `layer`) on the current
    window, as the Explore figure draws it: its weights, or its scores before the softmax (`kind`).
    While the head tools ablate heads or edit a row, that is the attention the model computes under
    the change; the file then says so ("drawn", "change") and adds the model's own attention beside
    it (column `unchanged_value`, JSON "unchanged_values")."""
    _need_text(session)
    kind = check_choice("kind", kind, ATTENTION_KINDS)
    view = session.check_view(None, layer, "all" if head is None else head, "weights")
    att = session.attention()
    drawn, change = shown_attention(session.text, session.heads.settings)  # the figure's numbers (lab.shown)
    pick = (lambda a: (a.weights if kind == "weights" else a.scores)[view.layer])  # (H, T, T) float32
    matrices, own = pick(drawn), pick(att) if change else None
    heads = list(range(matrices.shape[0])) if view.head is None else [view.head]
    tokens = att.tokens
    T = len(tokens)
    causal = att.causal

    def value(m: np.ndarray, q: int, k: int) -> float | None:
        if causal and k > q:
            return None  # hidden by the mask: weight 0, score -inf
        return _number(m[q, k])

    def grid(m: np.ndarray) -> list:
        return [[[value(m[h], q, k) for k in range(T)] for q in range(T)] for h in heads]

    values = grid(matrices)
    unchanged = grid(own) if change else None
    columns = ATTENTION_COLUMNS + (CHANGED_COLUMNS if change else [])
    rows = [[view.layer, h, q, tokens[q], k, tokens[k], values[i][q][k],
             *([unchanged[i][q][k], change] if change else [])]
            for i, h in enumerate(heads) for q in range(T) for k in range(T)]
    data = {**_text_json(session, "attention"), "kind": kind, "layer": view.layer, "heads": heads,
            "causal": causal, "masked": "null where the causal mask hides a key after its query",
            "drawn": "changed" if change else "unchanged", "change": change,
            "values_are": (f"the attention drawn, computed under the head tools' change ({change}); "
                           "unchanged_values: the model's own attention without it") if change else
                          "the attention drawn: the model's own (no head ablated, no row edited)",
            "values": values}
    if change:
        data["unchanged_values"] = unchanged
    which = f"L{view.layer}H{view.head}" if view.head is not None else f"L{view.layer}-all-heads"
    name = _stem(model_stem(session.entry.name), which, "changed" if change else "", "attention", kind, f"{T}tokens")
    return Export(name, to_csv(columns, rows), data)


# ----------------------------------------------------------------------- probabilities


def probabilities(session: Session, index=None) -> Export:
    """The distribution the token at window position `index` (default: the token selected in the
    text, as the chart shows it; else the last) was drawn from, every token of the vocabulary, most
    probable first (`Session.probabilities`)."""
    _need_text(session)
    if index is None and session.query is not None:
        index = session.query
    p = session.probabilities(index)  # checks the index
    if p is None:
        first = session.tokens()[0][0]
        raise UserError(f"“{first}” is the first token of the text: nothing comes before it to predict it from, "
                        "so it has no distribution to export.")
    order = np.argsort(-np.asarray(p.probs, dtype=np.float64), kind="stable")
    rows = [[rank, int(i), p.pieces[i], _number(p.probs[i]),
             None if p.adjusted is None else _number(p.adjusted[i]), int(i) == int(p.chosen)]
            for rank, i in enumerate(order.tolist(), start=1)]
    d = session.decoder
    data = {**_text_json(session, "probabilities"), "index": p.index, "position_in_text": d.start + p.index,
            "token": p.pieces[p.chosen], "token_id": int(p.chosen), "typed": p.typed,
            "note": ("typed: the token came from the prompt; probability is what the model predicted there "
                     "and nothing was sampled (adjusted is null)") if p.typed else
                    ("generated: probability is the model's softmax, adjusted the distribution sampled from "
                     "(after temperature, top-k and top-p)"),
            "columns": PROBABILITY_COLUMNS, "rows": rows}
    name = _stem(model_stem(session.entry.name), f"pos{p.index}", "probabilities", f"{len(d.window)}tokens")
    return Export(name, to_csv(PROBABILITY_COLUMNS, rows), data)


# -------------------------------------------------------------------------- head roles


def _role_json(role) -> dict:
    return {"key": role.key, "name": role.name, "formula": role.formula, "threshold": role.threshold,
            "meaning": role.meaning}


def head_roles(session: Session) -> Export:
    """Every head's scores on the current window (`Heads.head_roles`), at full precision, with
    the role each plays most clearly; the JSON adds each score's formula and threshold."""
    _need_text(session)
    roles = session.heads.head_roles()
    columns = roles.columns()
    rows = roles.rows(digits=None)  # the page's table at full precision
    data = {**_text_json(session, "head_roles"), "columns": columns, "rows": rows,
            "roles": [_role_json(r) for r in roles.roles],
            "thresholds": {r.key: r.threshold for r in roles.roles},
            "formulas": {r.key: r.formula for r in roles.roles}}
    name = _stem(model_stem(session.entry.name), "head_roles", f"{len(session.decoder.window)}tokens")
    return Export(name, to_csv(columns, rows), data)


# ------------------------------------------------------------------------ loss history


def _merge(steps: list[int], train_loss: list[float], val_steps: list[int], val_loss: list[float]) -> list[list]:
    """One row per step (a step measured twice, as a run's last one, gets two rows): reading the
    train_loss column's filled cells in order gives `train_loss` back, and so for val_loss."""
    rows, i, j = [], 0, 0
    while i < len(steps) or j < len(val_steps):
        step = min(steps[i] if i < len(steps) else math.inf, val_steps[j] if j < len(val_steps) else math.inf)
        tr = []
        while i < len(steps) and steps[i] == step:
            tr.append(train_loss[i])
            i += 1
        va = []
        while j < len(val_steps) and val_steps[j] == step:
            va.append(val_loss[j])
            j += 1
        for k in range(max(len(tr), len(va))):
            rows.append([int(step), _number(tr[k]) if k < len(tr) else None, _number(va[k]) if k < len(va) else None])
    return rows


def loss_history(session: Session, model_name) -> Export:
    """The losses a model was trained with: the session's training run when `model_name` is its
    model (as far as it has gone), else the losses of the model's training film."""
    run = session.run
    if run is not None and isinstance(model_name, str) and model_name == run.name:
        # a training may be appending meanwhile: take each series as far as both of its lists go
        steps, train_loss, val_steps, val_loss = (list(run.steps), list(run.train_loss), list(run.val_steps),
                                                  list(run.val_loss))
        n, m = min(len(steps), len(train_loss)), min(len(val_steps), len(val_loss))
        steps, train_loss, val_steps, val_loss = steps[:n], train_loss[:n], val_steps[:m], val_loss[:m]
        if not n and not m:
            raise UserError(f"'{run.name}' has no losses yet: its training has not finished a step.")
        data = {"what": "loss_history", "model": run.name, "source": "training run",
                "steps": [int(s) for s in steps], "train_loss": [_number(v) for v in train_loss],
                "val_steps": [int(s) for s in val_steps], "val_loss": [_number(v) for v in val_loss],
                "total_steps": run.total_steps, "done": run.done, "kept_step": run.kept_step}
        rows = _merge(steps, train_loss, val_steps, val_loss)
    else:
        entry = session.entry_for(model_name)
        film = entry.film
        frames = list(film.frames) if film is not None else []
        if not frames:
            raise UserError(f"'{entry.name}' has no loss history: it was not trained in this session and its "
                            "file carries no training film.")
        rows = [[int(f.step), _number(f.train_loss), None if f.val_loss is None else _number(f.val_loss)]
                for f in frames]
        data = {"what": "loss_history", "model": entry.name, "source": "training film",
                "steps": [r[0] for r in rows], "train_loss": [r[1] for r in rows],
                "val_steps": [r[0] for r in rows if r[2] is not None],
                "val_loss": [r[2] for r in rows if r[2] is not None],
                "total_steps": film.total_steps, "kept_step": film.kept_step}
    data["columns"], data["rows"] = LOSS_COLUMNS, rows
    last = max(r[0] for r in rows)
    name = _stem(model_stem(data["model"]), "loss_history", f"{last}steps")
    return Export(name, to_csv(LOSS_COLUMNS, rows), data)


# -------------------------------------------------------------------------- logit lens


def lens_export(session: Session, index=None, top=EXPORT_LENS_TOP) -> Export:
    """The logit lens at window position `index` (default: the selected token, else the last):
    the `top` most probable next tokens after the embedding and after each layer."""
    _need_text(session)
    top = min(check_int("top", top, 1, MAX_TOP), session.entry.tokenizer.vocab_size)  # a small vocabulary: all of it
    lens = session.heads.lens(index)
    rows = []
    for label, row in zip(lens.labels, lens.probs):  # as Lens.top, at full precision and with the token ids
        for rank, i in enumerate(np.argsort(-row, kind="stable")[:top].tolist(), start=1):
            rows.append([label, rank, int(i), lens.pieces[i], _number(row[i])])
    data = {**_text_json(session, "logit_lens"), "index": lens.index, "token": lens.token, "top": top,
            "stages": list(lens.labels), "columns": LENS_COLUMNS, "rows": rows}
    name = _stem(model_stem(session.entry.name), f"pos{lens.index}", "logit_lens", f"top{top}",
                 f"{len(session.decoder.window)}tokens")
    return Export(name, to_csv(LENS_COLUMNS, rows), data)


# ------------------------------------------------------------------------------ effect


def effect_export(session: Session, index=None) -> Export:
    """The next-token distribution after window position `index` without and with the session's
    ablation or edit (`lab.heads.effect`), every token, most probable before first."""
    _need_text(session)
    e = session.heads.effect(index)
    before_rank, after_rank = ranks(e.before), ranks(e.after)
    order = np.argsort(-e.before, kind="stable").tolist()
    rows = [[int(before_rank[i]), int(after_rank[i]), int(i), e.pieces[i], _number(e.before[i]), _number(e.after[i])]
            for i in order]
    data = {**_text_json(session, "effect"), "index": e.index, "token": e.token, "changed": e.what,
            "kl_bits": _number(e.kl_bits), "columns": EFFECT_COLUMNS, "rows": rows}
    name = _stem(model_stem(session.entry.name), f"pos{e.index}", "ablation_effect",
                 f"{len(session.decoder.window)}tokens")
    return Export(name, to_csv(EFFECT_COLUMNS, rows), data)


# ----------------------------------------------------------------------------- compare


def comparison(session: Session, model_name, prompt_a, prompt_b) -> Export:
    """Prompt A against prompt B (`lab.compare`): every head's scores on each prompt and B − A,
    at full precision; the JSON adds the tokens, B − A attention on the common positions per
    layer and head (null where masked), and both next-token distributions."""
    c = session.heads.compare(model_name, prompt_a, prompt_b)
    columns = c.columns()
    rows = c.rows(digits=None)  # full precision, None where undefined
    n = c.common
    diff = [[[[None if c.causal and k > q else _number(m[h, q, k]) for k in range(n)] for q in range(n)]
             for h in range(m.shape[0])] for m in c.diff]
    entry = session.entry_for(model_name)
    data = {"what": "comparison", "model": entry.name, "prompt_a": prompt_a, "prompt_b": prompt_b,
            "tokens_a": c.tokens_a, "tokens_b": c.tokens_b, "common": n, "notes": c.notes, "causal": c.causal,
            "columns": columns, "rows": rows,
            "roles": [_role_json(r) for r in c.roles_a.roles],
            "attention_diff": diff, "attention_diff_is": "B's weights − A's, [layer][head][query][key]",
            "kl_bits": _number(c.kl_bits()),
            "next_token": {"columns": ["token_id", "piece", "probability_a", "probability_b"],
                           "rows": [[i, c.pieces[i], _number(c.probs_a[i]), _number(c.probs_b[i])]
                                    for i in range(len(c.pieces))]}}
    name = _stem(model_stem(entry.name), "compare", f"{len(c.tokens_a)}vs{len(c.tokens_b)}tokens")
    return Export(name, to_csv(columns, rows), data)
