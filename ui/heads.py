"""The head tools' handlers (Explore tab, below the text): head roles, the logit lens, ablation
and attention edits, regeneration side by side, and prompt A against prompt B.

Each checks its inputs, calls a verb of the person's head tools (`session.heads`, lab.heads.Heads),
draws with one viz function and returns what the page shows. `probe_views` runs after every change of
the text (Step, Generate, Undo, Reset) and of the selected token, so every tool follows the text as it
grows.
"""

from __future__ import annotations

import hashlib
import html
import re

import gradio as gr

import viz
from lab.heads import LENS_TOP, Regeneration, head_label
from lab.roles import HeadRoles
from lab.checks import UserError, check_int, check_sampling, check_text, whole_numbers
from lab.export import model_stem
from lab.pairs import pairs_for as made_pairs, template_pair
from lab.session import Session

from .common import handler, known_model, message_plot, named
from .plots import to_plot

NO_TEXT = "Press Step (or Enter in the prompt): the head tools work on the text above."
NO_SETTINGS = ("Choose heads above (or click their cells with “click picks heads” on), or edit a row below; "
               "the chart then shows the next-token distribution before and after.")
REGENERATE_TOKENS = 24
PAIRS = {  # minimal pairs per built-in: (A, B)
    "grammar (built-in)": [("anna found the key . she gave it to tom because he asked",
                            "tom found the key . he gave it to anna because she asked"),
                           ("anna found the key . she", "tom found the key . he"),
                           ("tom found the key . he gave it to anna because",
                            "anna found the key . she gave it to tom because")],
    "copy / induction (built-in)": [("hcbpadlk|hcb", "hcbpadlk|hcp")],
    "sort digits (built-in)": [("503124=", "503125=")],
    "shakespeare (built-in)": [("ROMEO:\nO, she doth teach", "JULIET:\nO, she doth teach")],
    "article toy (built-in)": [("how is living in amsterdam <EOS>", "living in amsterdam is how <EOS>")],
}


def width_for(session: Session, share: float = 1.0) -> int:
    """The width a head tool's figure is laid out for: the page's, less its margins (`share` of it
    beside another figure; the whole width on a phone)."""
    d = session.display
    return max(300, int((d.width - 64) * (1.0 if d.narrow else share)))


def roles_figure(session: Session, layer=None, head=None):
    roles = session.heads.head_roles()
    if roles is None:
        return message_plot(NO_TEXT), ""
    selected = None
    if isinstance(layer, int) and isinstance(head, int):
        selected = (layer, head)
    marked = session.heads.ablated()
    fig = viz.role_overview(roles.scores, roles.roles, selected=selected, marked=marked,
                            presentation=session.display.presentation, width_px=width_for(session))
    fig = named(fig, model_stem(session.model_name), "head-roles", f"{len(roles.tokens)}tokens")
    return to_plot(fig), roles_note(roles)


def roles_note(roles: HeadRoles) -> str:
    """The labelled heads in words, with each label's threshold, and what each score means."""
    L, H = roles.shape
    found = [f"**{head_label(layer, h)}** {lab}" for layer in range(L) for h in range(H)
             if (lab := roles.label(layer, h))]
    said = "Labelled on this text: " + ("; ".join(found) if found else "no head passes a threshold yet") + "."
    return said + " Click a cell to show that head above; hover for the formula."


def show_lens(session: Session):
    if session.heads.selected() is None:
        return message_plot(NO_TEXT)
    lens = session.heads.lens()
    title = f"Logit lens after “{lens.token}” (position {lens.index}): the prediction read out after each layer"
    fig = viz.lens_grid(lens.probs, lens.pieces, top=LENS_TOP, row_labels=lens.labels, title=title,
                         presentation=session.display.presentation, width_px=width_for(session, 0.6))
    return to_plot(named(fig, model_stem(session.model_name), f"pos{lens.index}", "logit-lens"))


def effect_views(session: Session):
    """The before/after chart, its sentence and its numbers (for the API), for the selected token,
    from one computation of the effect (a message and {"active": false} without settings)."""
    if session.heads.selected() is None:
        return message_plot(NO_TEXT), "", {"active": False}
    if not session.heads.settings.active:
        return message_plot(NO_SETTINGS), "", {"active": False}
    e = session.heads.effect()
    title = f"After “{e.token}” (position {e.index}): KL(before ‖ after) = {e.kl_bits:.3f} bits"
    fig = viz.compare_distributions(e.pieces, e.before, e.after, labels=("model as trained", "with the change"),
                                    title=title, presentation=session.display.presentation)
    fig = named(fig, model_stem(session.model_name), f"pos{e.index}", "ablation-effect")
    data = {"active": True, "what": e.what, "index": e.index, "token": e.token, "kl_bits": e.kl_bits,
            "moves": [vars(m) for m in e.moves]}
    return to_plot(fig), html.escape(e.summary(), quote=False), data


def probe_views(session: Session, layer, head):
    """The head tools for the current text and selected token: the figures of the tool shown (the
    others wait until their tab is shown: drawing hidden figures slows the next Step), the controls
    of all."""
    tool = session.display.tool
    roles_fig, note = roles_figure(session, layer, head) if tool == "roles" else (gr.skip(), gr.skip())
    effect_fig, effect_md, _ = effect_views(session) if tool == "ablate" else (gr.skip(), gr.skip(), None)
    lens = show_lens(session) if tool == "lens" else gr.skip()
    edit_head, current = session.heads.edit_state()
    choices = session.heads.key_choices()
    if current not in [v for _, v in choices]:
        current = "off"
    heads = session.heads.head_labels()
    if edit_head is None:
        shown = head_label(layer, head) if isinstance(layer, int) and isinstance(head, int) else None
        edit_head = shown if shown in heads else (heads[0] if heads else None)
    return (roles_fig, note, lens, effect_fig, effect_md,
            gr.update(choices=heads, value=[head_label(*h) for h in session.heads.settings.heads]),
            gr.update(choices=heads, value=edit_head), gr.update(choices=choices, value=current), query_note(session))


def query_note(session: Session) -> str:
    q = session.heads.selected()
    if q is None:
        return ""
    return (f"Query: “{html.escape(session.tokens()[q][0], quote=False)}” (position {q}), the token selected in the "
            "text (click another to change it).")


# ------------------------------------------------------------------------------ handlers


@handler
def refresh(session, layer, head, query=None, request: gr.Request = None):
    """The head tools after the text or the selected token (`query`, a window position; None =
    the last token; one the text no longer has, after an Undo: the last too) changed."""
    layer, head = session.heads.follow(layer, head, query)
    return probe_views(session, layer, head)


@handler
def show_tool(session, tool, layer, head, request: gr.Request = None):
    """A head tool's tab was shown: draw it for the current text."""
    layer, head = session.heads.check_shown(layer, head)
    session.show_tool(tool)
    return probe_views(session, layer, head)


@handler
def head_roles_table(session, request: gr.Request = None):
    """The scores of every head on the session's current text, one row per head."""
    roles = session.heads.head_roles()
    if roles is None:
        raise UserError("Press Step first: head roles are computed on the text in the Explore tab.")
    return {"columns": roles.columns(), "data": roles.rows(), "tokens": roles.tokens,
            "thresholds": {r.key: r.threshold for r in roles.roles},
            "formulas": {r.key: r.formula for r in roles.roles}}


@handler
def lens_at(session, index, request: gr.Request = None):
    """The next-token distribution after each layer at token `index` (None: the selected one)."""
    lens = session.heads.lens_at(index)
    return show_lens(session), {"index": lens.index, "token": lens.token,
                                  "columns": ["stage", "rank", "token", "probability"], "data": lens.top()}


@handler
def ablate(session, heads, mode, keep_only, layer=None, head=None, request: gr.Request = None):
    """Ablate these heads (zero / mean / uniform; or all others with keep_only) and show the effect."""
    layer, head = session.heads.check_shown(layer, head)
    session.heads.set_ablation(heads or [], mode, keep_only)
    fig, md, data = effect_views(session)
    roles = roles_figure(session, layer, head)[0] if session.display.tool == "roles" else gr.skip()
    return fig, md, roles, data


@handler
def edit_attention(session, head, key, request: gr.Request = None):
    """Replace the selected token's row of one head ("L1H0"): only `key` (a position), "uniform", or "off".
    The head is checked even when `key` is "off" (nothing to edit): one that is not the model's is refused."""
    session.heads.edit_selected(head, key)
    return effect_views(session)


@handler
def clear_settings(session, layer, head, request: gr.Request = None):
    layer, head = session.heads.check_shown(layer, head)
    session.heads.clear_probe()
    return probe_views(session, layer, head)


@handler(rate="generate")
def regenerate(session, temperature, top_k, top_p, seed, n, request: gr.Request = None):
    """The text continued twice with the same seed, plainly and with the change, side by side."""
    sampling = check_sampling(temperature, top_k, top_p, seed)
    r = session.heads.regenerate(sampling, n)
    return continuations_html(r, regeneration_key(session)), {"normal": r.normal, "changed": r.changed,
                                   "first_difference": r.first_difference, "what": r.what}


def continuations_html(r: Regeneration, key: str = "") -> str:
    """The two continuations one above the other, the first differing token marked in both; `key`
    (`regeneration_key`) says what they continued."""
    def row(label: str, pieces: list[str]) -> str:
        cells = []
        for i, p in enumerate(pieces):
            cls = "lab-diff" if r.first_difference is not None and i >= r.first_difference else ""
            first = " lab-first" if i == r.first_difference else ""
            cells.append(f'<span class="lab-piece {cls}{first}">{html.escape(p)}</span>')
        return f'<div class="lab-cont"><b>{html.escape(label)}</b> {" ".join(cells)}</div>'

    where = ("the two continuations are the same" if r.first_difference is None
             else f"they part at generated token {r.first_difference + 1}")
    return (f'<div class="lab-regen" data-key="{html.escape(key)}"><p>Same seed, same sampling; {where}.</p>'
            + row("model as trained:", r.normal) + row(f"with {r.what}:", r.changed) + "</div>")


def regeneration_key(session: Session) -> str:
    """A short fingerprint of what a regeneration continued: the model, the text and the head settings."""
    what = repr((session.model_name, session.tokens(), session.generated_text(), session.heads.settings))
    return hashlib.sha256(what.encode()).hexdigest()[:16]


@handler
def drop_stale_regeneration(session, shown, request: gr.Request = None):
    """The regeneration shown goes once its text or its changes are no longer the current ones
    (after Clear all changes, another ablation or edit, a Step): it would be read as theirs."""
    if shown is not None and not isinstance(shown, str):
        raise UserError("The regeneration shown must be text (the page's own HTML).")
    if not shown:
        return gr.skip()
    made_for = re.search(r'data-key="([0-9a-f]*)"', shown)
    return gr.skip() if made_for and made_for.group(1) == regeneration_key(session) else ""


@handler
def pick_head(session, pick, picking, chosen, model_name, view=None, request: gr.Request = None):
    """A cell of the head-role overview or a panel of the attention was clicked ("layer,head"):
    with `picking` it joins (or leaves) the heads to ablate; otherwise the attention shows it (its
    weights, where the view was every layer's panels or every head's thumbnails)."""
    cell = whole_numbers(pick, ",", 2)  # "layer,head"
    if cell is None:
        raise UserError("Click a cell of the overview or a panel of the attention.")
    if not isinstance(picking, bool):
        raise UserError("“Clicking a head picks it” must be on or off.")
    if chosen is not None and not (isinstance(chosen, list) and all(isinstance(c, str) for c in chosen)):
        raise UserError("The heads to ablate must be a list of heads such as L1H0.")
    known_model(session, model_name)
    check_text("view", view, optional=True)
    ((layer, head),) = session.heads.parse_heads([cell])  # "Press Step first." before there is a model
    if picking is True:
        chosen = list(chosen or [])
        label = head_label(layer, head)
        chosen = [c for c in chosen if c != label] if label in chosen else [*chosen, label]
        return gr.skip(), gr.skip(), chosen, gr.skip()
    return layer, head, gr.skip(), "weights" if view in ("all layers", viz.THUMBNAILS_VIEW) else gr.skip()


@handler
def compare(session, model_name, prompt_a, prompt_b, layer, request: gr.Request = None):
    """Prompt A against prompt B on one model: attention B − A per head, score changes, next tokens."""
    c = session.heads.compare(model_name, prompt_a, prompt_b)
    L = len(c.diff)
    layer = check_int("layer", layer, 0, L - 1) if layer is not None else L - 1
    return compare_views(session, model_name, c, layer)


def compare_views(session: Session, model_name, c, layer: int, panel_notes: dict | None = None) -> tuple:
    """What Compare shows for comparison `c` at `layer`: B − A (`panel_notes`: head → a note in its
    panel's title), the score changes, both next-token distributions, the notes and the API's answer."""
    p = session.display.presentation
    diff = viz.attention_difference(c.diff[layer], c.aligned_tokens(), layer=layer, causal=c.causal,
                                    width_px=width_for(session, 0.6), max_height_px=session.display.screen_height,
                                    presentation=p, title=f"Layer {layer}: attention of B minus A",
                                    panel_notes=panel_notes)
    changes = viz.score_changes(c.roles_a.scores, c.roles_b.scores, c.roles_a.roles, presentation=p,
                                width_px=width_for(session))
    dist = viz.compare_distributions(c.pieces, c.probs_a, c.probs_b, labels=("prompt A", "prompt B"),
                                     title=f"Next token: KL(A ‖ B) = {c.kl_bits():.3f} bits", presentation=p)
    notes = " ".join(html.escape(n, quote=False) for n in c.notes) or "Both prompts have the same number of tokens."
    data = {"tokens_a": c.tokens_a, "tokens_b": c.tokens_b, "common": c.common, "notes": c.notes,
            "columns": c.columns(), "data": c.rows(), "kl_bits": c.kl_bits()}
    stem = model_stem(model_name if isinstance(model_name, str) else "model")
    return (to_plot(named(diff, stem, "compare", f"L{layer}", "attention-B-minus-A")),
            to_plot(named(changes, stem, "compare", "head-scores-B-minus-A")),
            to_plot(named(dist, stem, "compare", "next-token")), notes, data)


def pairs_for(model_name, entry=None) -> list[tuple[str, str]]:
    """The example pairs of a model as "A ⇄ B" choices: a built-in's own, else (given its `entry`) pairs made
    for its tokenizer (lab.pairs: same token counts, one-token answers)."""
    found = PAIRS.get(model_name) or ([(p.a, p.b) for p in made_pairs(entry)] if entry is not None else [])
    return [(f"{a}  ⇄  {b}", f"{a}\u241e{b}") for a, b in found]


@handler
def pick_pair(value):
    """An example pair chosen: both prompt boxes. The menu's value arrives as sent (RAW): one of the
    built-in models' pairs, or nothing chosen (the menu cleared); anything else is refused."""
    if value is None or value == "":
        return gr.skip(), gr.skip()
    pairs = {f"{a}\u241e{b}": (a, b) for examples in PAIRS.values() for a, b in examples}
    parts = value.split("\u241e") if isinstance(value, str) else []
    # a built-in's pair, or one lab.pairs makes; anything else (a list, an object) is refused below
    if isinstance(value, str) and (value in pairs or (len(parts) == 2 and template_pair(*parts))):
        return tuple(parts)
    raise UserError("Minimal pairs: choose one of the pairs in the list.")


@handler
def model_changed(session, model_name, request: gr.Request = None):
    """Another model: its example pairs and layers, prompts A and B its first pair (empty without one: the
    last model's pair need not fit this one); the last comparison goes."""
    entry = session.entry_for(model_name)
    n_layers, pairs = entry.cfg.n_layers, pairs_for(model_name, entry)
    empty = message_plot("Type two prompts and press Compare.")
    first = pairs[0][1].split("\u241e") if pairs else ("", "")
    return (gr.update(choices=pairs, value=None), *first,
            gr.update(choices=[(f"layer {i}", i) for i in range(n_layers)], value=n_layers - 1),
            empty, message_plot(""), message_plot(""), "")
