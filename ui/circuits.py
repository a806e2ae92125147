"""The Circuits tab's handlers: direct logit attribution at the selected token, head composition, one head's OV
and QK circuits, and attribution patching beside exact patching (the session's `circuits` part, lab/circuits.py;
figures from viz.circuits, viz.circuits_heads and viz.circuits_atp).

Each method has two handlers: the API's (`dla_api`, `composition_api`, `circuits_api`, `atp_api`: /dla,
/composition, /circuits, /atp), which answers the record's JSON, and the page's (`show_dla`,
`run_composition`, `show_circuits`, `run_atp`), which draws it. The two long
jobs (composition, attribution patching) stream their progress as the patching sweep does (ui/patching.py), and
Stop ends them after their current step. The layout and the events are ui/circuits_tab.py's.

The maps link to the other views: a head's cell of the DLA map (`open_dla_head`, `inside_for_head`) opens that
head in Explore and in its "Inside one cell" panel at the selected token; a cell of a composition map or a pair
of its list (`open_pair`) opens the reading head in Explore and the writing head's circuits here.
"""

from __future__ import annotations

import html
import time

import gradio as gr
import numpy as np

from lab.checks import UserError, check_choice, whole_numbers
from lab.circuits_records import DIRECT_ONLY, KIND_NAMES
from lab.export import model_stem
from viz.circuits import composition_map, dla_map
from viz.circuits_atp import atp_maps, atp_scatter
from viz.circuits_heads import ov_spectrum, ov_table, qk_map

from .common import handler, message_plot, named
from .heads import width_for
from .inside import draw_cell, head_matrices, no_text
from .plots import to_plot

NO_DLA = "Step a text in Explore, select a token, then press Attribute."
NO_COMPOSITION = "Press Compute: the scores are the model's, computed once and kept."
NO_HEAD_CIRCUITS = "Choose a layer and a head, then press Open."
NO_ATP = "Choose the answer tokens and press Run attribution patching."
OPEN_PAIR_HINT = "Click a pair to open both heads, as a cell of the map does."
PROGRESS_EVERY_S = 0.25  # a progress is sent to the page at most this often (the steps between are not drawn)
FORMATS = ("csv", "json")
# the page's width each figure is laid out for (ui/circuits_tab.py's columns): the scatter beside the two maps
SCATTER_SHARE = 0.33
COMPOSITION_SHARE = 0.75  # the map beside the strongest pairs (3 : 1)
QK_SHARE = 0.6  # the QK map alone on its row, square cells: the whole width would make them too large


def _optional(value):
    """An absent value: None or a blank string (a cleared box)."""
    return None if value is None or (isinstance(value, str) and not value.strip()) else value


def job_progress_html(done: int | None, total: int = 1, text: str = "") -> str:
    """A progress bar of a long job's steps (an empty one before the first job)."""
    done = 0 if done is None else done
    total = max(1, total)
    text = text or ("Not run yet." if done == 0 else f"{done} / {total} steps")
    return ('<div class="patch-progress" style="display:flex;flex-direction:column;gap:2px">'
            f'<progress value="{done}" max="{total}" aria-label="circuits progress" style="width:100%;height:14px">'
            f'{100 * done / total:.0f}%</progress>'
            f'<span style="font-size:var(--text-sm)">{html.escape(text)}</span></div>')


def _md(text: str) -> str:
    return html.escape(text, quote=False)


# ------------------------------------------------------------------------------ direct logit attribution


def dla_figure(session, r, selected: tuple[int, int] | None = None):
    """The DLA heatmap of record `r` (`selected`: a head outlined), MLP cells blank where a layer has none."""
    L = r.heads.shape[0]
    mlps = np.full(L, np.nan)
    for layer in r.mlp_layers:
        mlps[layer] = r.mlps[layer]
    fig = dla_map(r.heads, mlps, embedding=r.embedding, remainder=r.remainder, actual=r.actual, label=r.label,
                  selected=selected, presentation=session.display.presentation, width_px=width_for(session))
    return to_plot(named(fig, model_stem(r.model), "dla", f"pos{r.position}"))


def dla_note(r) -> str:
    """What was attributed, the sum against the actual value, and that it is the direct effect only."""
    return "  \n".join([f"**{_md(r.summary())}**",
                        f"Sum of the direct terms {r.direct_sum:+.4f} + remainder {r.remainder:+.4f} = "
                        f"{r.direct_sum + r.remainder:+.4f}; actual {_md(r.label)} {r.actual:+.4f}.",
                        _md(DIRECT_ONLY)])


@handler
def dla_api(session, answer=None, other=None, position=None, request: gr.Request = None):
    """Direct logit attribution at window position `position` (blank: the selected token) of logit(answer)
    − logit(other) (answer blank: the model's own prediction; other blank: the answer's logit alone)."""
    return session.circuits.dla(_optional(position), _optional(answer), _optional(other)).to_json()


@handler
def show_dla(session, answer=None, other=None, request: gr.Request = None):
    """The page's DLA at the selected token: the heatmap and the note."""
    r = session.circuits.dla(None, _optional(answer), _optional(other))
    return dla_figure(session, r), dla_note(r)


# ------------------------------------------------------------------------------ head composition


def composition_figure(session, r, kind: str, selected: tuple[int, int, int, int] | None = None):
    kind = check_choice("kind", kind, KIND_NAMES)
    fig = composition_map(r.of(kind), kind=kind, top=[(*p.earlier, *p.later) for p in r.top.get(kind, [])],
                          selected=selected, presentation=session.display.presentation,
                          width_px=width_for(session, COMPOSITION_SHARE),
                          max_height_px=session.display.screen_height)
    return to_plot(named(fig, model_stem(r.model), "composition", kind))


def pairs_list(r, kind: str) -> str:
    """The strongest pairs of one kind, one line each."""
    pairs = r.top.get(kind, [])
    if not pairs:
        return "No pairs: this model has one layer, or the scores were stopped before any."
    lines = [f"{i}. {_md(p.name)}: {p.score:.3f}" for i, p in enumerate(pairs, 1)]
    return (f"**Strongest {kind.upper()}-composition pairs** ({_md(KIND_NAMES[kind])})\n\n" + "\n".join(lines)
            + f"\n\n{OPEN_PAIR_HINT}")


def composition_note(r) -> str:
    said = "read from the server's cache" if r.cached else "computed now"
    return f"**{_md(r.summary())}**  \n{_md(r.model)}: scores {said}."


@handler
def composition_api(session, model_name=None, request: gr.Request = None):
    """Q-, K- and V-composition scores between every pair of heads in different layers, and each head's
    copying score, of `model_name` (blank: the text's model)."""
    return session.circuits.composition(_optional(model_name)).to_json()


@handler
def run_composition(session, model_name, kind, request: gr.Request = None):
    """Compute (or read from the cache) the composition scores, streaming progress; ends with the map of
    `kind` and the strongest pairs."""
    kind = check_choice("kind", kind, KIND_NAMES)
    last = 0.0
    for p in session.circuits.composition_steps(_optional(model_name)):
        if p.result is not None:
            r = p.result
            text = f"stopped after {r.done} / {r.total} layers" if r.stopped else "done"
            yield (job_progress_html(1, 1, text), composition_note(r), composition_figure(session, r, kind),
                   pairs_list(r, kind))
        elif time.perf_counter() - last > PROGRESS_EVERY_S:
            last = time.perf_counter()
            yield (job_progress_html(p.done, p.total, f"{p.phase}: {p.done} / {p.total}"), gr.skip(), gr.skip(),
                   gr.skip())


@handler(exclusive=False)
def composition_kind(session, kind, request: gr.Request = None):
    """Another kind (Q, K, V): the map and the pairs of the last scores, nothing computed."""
    kind = check_choice("kind", kind, KIND_NAMES)
    r = session.circuits.last.get("composition")
    if r is None:
        return message_plot(NO_COMPOSITION), ""
    return composition_figure(session, r, kind), pairs_list(r, kind)


# ------------------------------------------------------------------------------ one head's circuits


def circuits_figures(session, r) -> tuple:
    p, w = session.display.presentation, width_for(session, 0.5)
    stem = model_stem(r.model)
    label = f"L{r.layer}H{r.head}"
    table = ov_table(r.input_pieces, r.top_pieces, r.top_values, copying=r.copying, layer=r.layer, head=r.head,
                     presentation=p, width_px=w)
    spectrum = ov_spectrum(r.eigenvalues, copying=r.copying, layer=r.layer, head=r.head, presentation=p, width_px=w)
    qk = qk_map(r.positional, r.qk_tokens, r.allowed, layer=r.layer, head=r.head, positional=True, presentation=p,
                width_px=width_for(session, QK_SHARE))
    return (to_plot(named(table, stem, "ov", label)), to_plot(named(spectrum, stem, "ov-spectrum", label)),
            to_plot(named(qk, stem, "qk", label)))


@handler
def circuits_api(session, layer, head, request: gr.Request = None):
    """Head `head` of `layer`: its OV circuit (copying score, spectrum, top tokens written) and its QK circuit
    on the text's tokens."""
    return session.circuits.circuits(layer, head).to_json()


@handler
def show_circuits(session, layer, head, request: gr.Request = None):
    """The page's OV table, spectrum and QK map of one head, with the summary."""
    r = session.circuits.circuits(layer, head)
    note = "  \n".join([f"**{_md(r.summary())}**", *(_md(n) for n in r.notes)])
    return (note, *circuits_figures(session, r))


# ------------------------------------------------------------------------------ attribution patching


def atp_figures(session, r) -> tuple:
    heads = r.what == "heads"
    verified = [(c.row, c.column) for c in r.verified]
    stem = model_stem(r.model)
    p, w = session.display.presentation, width_for(session, 1 - SCATTER_SHARE)
    scatter = atp_scatter(r.estimate_share, r.exact_share, r.disagree, rows=r.rows, columns=r.columns, heads=heads,
                          verified=verified, presentation=p, width_px=width_for(session, SCATTER_SHARE))
    maps = atp_maps(r.estimate_share, r.exact_share, r.disagree, rows=r.rows, columns=r.columns, heads=heads,
                    presentation=p, width_px=w)
    return (to_plot(named(scatter, stem, "atp", r.what, r.direction, "scatter")),
            to_plot(named(maps, stem, "atp", r.what, r.direction, "maps")))


def atp_note(r) -> str:
    m = r.metric
    lines = [f"**{_md(m.label)}**: {r.metric_a:.3f} on A, {r.metric_b:.3f} on B (difference {r.difference:+.3f}).",
             f"**{_md(r.summary())}**",
             *(f"⚠ {_md(c)}" for c in r.cautions), *(_md(n) for n in r.notes)]
    return "  \n".join(lines)


@handler(rate="patch")
def atp_api(session, model_name, prompt_a, prompt_b, metric, answer, other=None, what="heads", direction="denoising",
        k=10, request: gr.Request = None):
    """Attribution patching of the A/B pair beside the exact sweep of `what`, its top `k` cells re-run exactly."""
    return session.circuits.atp(model_name, prompt_a, prompt_b, metric, answer, _optional(other), what, direction,
                                k).to_json()


@handler(rate="patch")
def run_atp(session, model_name, prompt_a, prompt_b, metric, answer, other, what, direction, k,
            request: gr.Request = None):
    """The page's attribution patching, streaming progress; ends with the scatter and the two maps."""
    last = 0.0
    for p in session.circuits.atp_steps(model_name, prompt_a, prompt_b, metric, answer, _optional(other), what,
                                        direction, k):
        if p.result is not None:
            r = p.result
            yield (job_progress_html(1, 1, "stopped" if r.stopped else "done"), atp_note(r), *atp_figures(session, r))
        elif time.perf_counter() - last > PROGRESS_EVERY_S:
            last = time.perf_counter()
            yield (job_progress_html(p.done, p.total, f"{p.phase}: {p.done} / {p.total}"), gr.skip(), gr.skip(),
                   gr.skip())


# ------------------------------------------------------------------------------ links to the other views


def _head_pick(pick, shape: tuple[int, int]) -> tuple[int, int]:
    """A DLA cell's "layer,head" (assets/explore.js), checked against the map's model."""
    parts = whole_numbers(pick, ",", 2)
    if parts is None or not (0 <= parts[0] < shape[0] and 0 <= parts[1] < shape[1]):
        raise UserError("Click a head's cell of the direct logit attribution map to open that head.")
    return parts[0], parts[1]


@handler(exclusive=False)
def open_dla_head(session, pick, request: gr.Request = None):
    """A head's cell of the DLA map was clicked ("layer,head"; the page also selects it in Explore): the map
    with that head outlined and a line saying where it opened."""
    r = session.circuits.last.get("dla")
    if r is None:
        raise UserError(NO_DLA)
    layer, head = _head_pick(pick, r.heads.shape)
    note = (f"**L{layer}H{head}** is open in Explore (its attention) and in Explore's Inside one cell (how it "
            f"weighs the selected token's keys); it adds {r.heads[layer, head]:+.3f} to {_md(r.label)} directly.")
    return dla_figure(session, r, (layer, head)), note


@handler(exclusive=False)
def inside_for_head(session, pick, matrices_open=False, request: gr.Request = None):
    """Explore's Inside one cell panel, opened on the clicked DLA head at the selected token (at the key that
    token gives the largest share), and the head's matrices when their section is open (`matrices_open`)."""
    r = session.circuits.last.get("dla")
    if r is None:
        raise UserError(NO_DLA)
    layer, head = _head_pick(pick, r.heads.shape)
    if not isinstance(matrices_open, bool):
        raise UserError("Whether the matrices are open must be true or false.")
    if not session.inside.has_text:  # the text went since the map was drawn
        return (gr.skip(), *no_text(), gr.skip())
    drawn = draw_cell(session, layer, head, None, None)
    matrices = head_matrices(session, *drawn[-4:]) if matrices_open else gr.skip()
    return (gr.update(open=True), *drawn, matrices)


def _pair_pick(pair, r) -> tuple[str, tuple[int, int, int, int]]:
    """A composition cell's "kind,layer,head,layer,head" (earlier head first), checked against the record."""
    kind, _, rest = pair.partition(",") if isinstance(pair, str) else ("", "", "")
    parts = whole_numbers(rest, ",", 4)
    L, H = r.shape
    if (kind not in KIND_NAMES or parts is None or not all(0 <= p < n for p, n in zip(parts, (L, H, L, H)))
            or parts[0] >= parts[2]):
        raise UserError("Click a cell of the composition map (an earlier head and a head of a later layer) to "
                        "open that pair.")
    return kind, tuple(parts)


@handler(exclusive=False)
def open_pair(session, pair, request: gr.Request = None):
    """A cell of a composition map or a pair of its list was clicked ("kind,layer,head,layer,head"; the page
    also selects the later head in Explore): the earlier head in the layer and head boxes with its circuits
    drawn, the pair outlined on the map, and a line naming the pair."""
    r = session.circuits.last.get("composition")
    if r is None:
        raise UserError(NO_COMPOSITION)
    kind, (l0, h0, l1, h1) = _pair_pick(pair, r)
    score = float(r.of(kind)[l0, h0, l1, h1])
    writer, reader = f"L{l0}H{h0}", f"L{l1}H{h1}"
    shown = "not computed (stopped)" if np.isnan(score) else f"{score:.3f}"
    note = (f"**{writer} → {reader}**, {kind.upper()}-composition {shown}: {reader} (reads) is open in Explore, "
            f"{writer} (writes) in One head's circuits below.")
    if not session.inside.has_text or session.model_name != r.model:  # the text's model draws a head's circuits
        why = f"Step a text on {r.model} in Explore to draw {writer}'s circuits."
        drawn = (_md(why), message_plot(why), message_plot(""), message_plot(""))
    else:
        c = session.circuits.circuits(l0, h0)
        drawn = ("  \n".join([f"**{_md(c.summary())}**", *(_md(n) for n in c.notes)]), *circuits_figures(session, c))
    return (l0, h0, note, composition_figure(session, r, kind, (l0, h0, l1, h1)), *drawn)


# ------------------------------------------------------------------------------ Stop and downloads


@handler(exclusive=False)  # Stop must not wait for the job it stops
def stop_circuits(session, request: gr.Request = None):
    if not session.circuits.stop():
        return gr.skip()
    return job_progress_html(0, 1, "Stopping after the current step…")


@handler(rate="export")
def download_circuits(session, method, fmt, request: gr.Request = None):
    """The last record of `method` ("dla", "composition", "circuits", "atp") as CSV or JSON."""
    if fmt not in FORMATS:
        raise UserError("The format must be csv or json.")
    exp = session.circuits.export(method)
    data = exp.csv.encode("utf-8-sig") if fmt == "csv" else exp.json_text().encode("utf-8")
    return str(session.save_file(exp.name, f".{fmt}", data))
