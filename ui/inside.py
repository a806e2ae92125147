"""The Explore tab's "Inside one cell" panel: handlers that draw one attention cell worked through.

A cell is (layer, head, query i, key j) of the text on screen. Its numbers come from lab.inside
(the model's own forward, under the head tools' changes); this module only lays them out: a line
naming the cell, a table of every single number with its formula, and the viz.inside figures (the
inputs after the norm, q and k, the dot product's per-dimension products, the whole row through the
softmax, v_j and the weighted sum, what each head adds to the residual stream). The head's Q, K, V
and QKᵀ as matrices are drawn only when their own section is open.

The panel is drawn only while it is open: the page opens it on a click on an attention cell (or a
matrix entry, assets/explore.js puts "layer,head,query,key" in `lab.cell`), and "Use the selected
token" works the selected token's row through, at the key it gives the largest share.
"""

from __future__ import annotations

import html

import gradio as gr
import numpy as np

import viz
from viz import inside as cell_viz
from lab.checks import UserError, check_int, whole_numbers
from lab.export import file_name, model_stem

from .common import handler, message_plot
from .plots import to_plot

CLOSED = "Click a cell of the attention above (or press “Use the selected token”) to see how its weight was computed."
N_FIGURES = 6  # inputs, q and k, products, the row's softmax, the values, the heads' additions


def _cellsafe(text: str) -> str:
    """Text for a Markdown table cell: escaped, with its bars kept out of the table's syntax."""
    return html.escape(text, quote=False).replace("|", "\\|")


def _num(x) -> str:
    return "−∞" if x is None else f"{x:.4f}"


def _tok(data: dict, j: int) -> str:
    return f"“{data['tokens'][j]}” ({j})"


def _width(session, share: float = 0.5) -> int:
    """The width a figure of the panel is laid out for: half the page (two columns), the page on a phone (less
    the margins of the panel's boxes around it: 298 px of a 390 px screen)."""
    d = session.display
    return max(280, d.width - 92) if d.narrow else max(360, int((d.width - 96) * share))


def header(data: dict) -> str:
    """The line naming the cell and what is active (an ablation or an edited row), as Markdown."""
    i, j = data["query"], data["key"]
    line = (f"**Layer {data['layer']}, head {data['head']}** · query i = {html.escape(_tok(data, i))} → key j = "
            f"{html.escape(_tok(data, j))} · weight a_ij = **{_num(data['weight'])}**")
    active = data["active"]
    if data["masked"]:
        line += " · this key comes after the query: it is masked (s_ij = −∞, weight 0)"
    if active.get("changed"):
        line += f"<br>⚠ The head tools change the model now: {html.escape(active.get('what') or 'a change')}."
        if active.get("ablation"):
            line += f" This head is {active['ablation']}-ablated: the numbers below are the ones it actually used."
        if active.get("row_source") and active["row_source"] != "softmax":
            line += f" Its row is replaced ({html.escape(active['row_source'])}): the weights used differ from the softmax."
    return line


def numbers_table(data: dict) -> str:
    """Every single number of the cell, each with its formula, as a Markdown table."""
    f = data["formulas"]
    i, j = data["query"], data["key"]
    norm_rows = _norm_rows(data)  # the q/k norm, then the rotary step (inserted below), then the scores
    rows = norm_rows + [
        ("q_i · k_j", f["dot"], _num(data["dot"])),
        ("scale", f["scale"], _num(data["scale"])),
        ("s_ij", f["score"], _num(data["score"])),
    ]
    if "capped" in data:  # the soft-cap, before the mask: the softmax reads the capped score
        c = data["softcap"]
        rows.append(("capped s_ij", f["capped"],
                     f"{c:g} · tanh({_num(data['score'])} / {c:g}) = {_num(data['capped'])}"))
    rows += [
        ("mask", f["mask"], "allowed" if not data["masked"] else "masked: s_ij = −∞"),
        ("m", f["row_max"], _num(data["row_max"])),
        (f"exp(s_{i},{j} − m)", f["exp_row"], _num(data["exp_row"][j])),
        ("Σ", f["exp_sum"], _num(data["exp_sum"])),
        ("a_ij", f["softmax_row"], f"{_num(data['exp_row'][j])} / {_num(data['exp_sum'])} = {_num(data['weight'])}"),
    ]
    if data["used_weight"] is not None and data["used_weight"] != data["weight"]:
        rows.append(("used a_ij", f["used_row"], _num(data["used_weight"])))
    rows += [
        ("‖z_i‖", f["weighted"], _num(float(np.linalg.norm(data["weighted"])))),
        ("‖o_i^h‖", f["head_out"], _num(float(np.linalg.norm(data["head_out"])))),
    ]
    if "attn_normed" in data:  # a norm on the attention's output: that, not the sum, joins the residual
        rows.append(("‖post_norm1(a_i)‖", f["attn_normed"], _num(float(np.linalg.norm(data["attn_normed"])))))
    after = "‖x_i + post_norm1(a_i)‖" if "attn_normed" in data else "‖x_i + Σ_h o_i^h‖"
    rows.append((after, f["residual_after"], _num(float(np.linalg.norm(data["residual_after"])))))
    if data["rotary"]:
        rows.insert(len(norm_rows), ("rotary", f["rotary"], f"{data['rotary']['dims']} of {len(data['q'])} "
                                                            f"dimensions turn, base {data['rotary']['base']:g}"))
    elif data["model_facts"]["rope_off"]:
        rows.insert(len(norm_rows), ("rotary", f["rotary"], "none in this layer"))
    body = "\n".join(f"| {_cellsafe(a)} | {_cellsafe(b)} | {_cellsafe(c)} |" for a, b, c in rows)
    return "| number | formula | value |\n|---|---|---|\n" + body


def _norm_rows(data: dict) -> list[tuple[str, str, str]]:
    """The q/k norm's numbers (each side's rms, and the normed vector's length), where the model has one."""
    if "qk_norm" not in data:
        return []
    f, rows = data["formulas"], []
    for side, v, at in (("query", "q", data["query"]), ("key", "k", data["key"])):
        rows += [(f"rms(p_{at})", f[f"{v}_norm"], _num(data["qk_norm"][side]["rms"])),
                 (f"‖{v}_{at}‖ after the norm", f[f"{v}_raw"], _num(float(np.linalg.norm(data[f"{v}_raw"]))))]
    return rows


def _qk_rows(data: dict) -> list[tuple[str, list]]:
    """Figure 2's rows: the projections, and where the model has a q/k norm, its multiplier and the normed
    vectors (the rotary rows follow)."""
    i, j = data["query"], data["key"]
    if "qk_norm" not in data:
        return [(f"q_{i} = W_Q · x̂_{i}", data["q_raw"]), (f"k_{j} = W_K · x̂_{j}", data["k_raw"])]
    rows, n = [], data["qk_norm"]
    for side, v, at, w in (("query", "q", i, "W_Q"), ("key", "k", j, "W_K")):
        rows.append((f"p_{at} = {w} · x̂_{at} (projection)", data[f"{v}_proj"]))
        if n[side]["multiplier"] is not None:  # the norm's weight as the model multiplies by it
            rows.append((f"{'1 + ' if n['offset'] else ''}w_{v} (the norm's weight)", n[side]["multiplier"]))
        weight = "" if n[side]["multiplier"] is None else f" · ({'1 + ' if n['offset'] else ''}w_{v})"
        weight += f" + b_{v}" if n[side]["bias"] is not None else ""
        gain = f" × {n['gain']:g}" if n["gain"] != 1 else ""
        centred = f"(p_{at} − {n[side]['mean']:.4f})" if n[side]["mean"] is not None else f"p_{at}"  # LayerNorm
        rows.append((f"{v}_{at} = {centred} / {n[side]['rms']:.4f}{weight}{gain}", data[f"{v}_raw"]))
    return rows


def _rows(pairs) -> list[tuple[str, list[float]]]:
    return [(label, [np.nan if x is None else x for x in vec]) for label, vec in pairs]


def cell_figures(data: dict, width: int, presentation: bool) -> list:
    """The panel's figures for a cell (lab.inside.cell's numbers), in the order of N_FIGURES."""
    f, i, j = data["formulas"], data["query"], data["key"]
    style = dict(presentation=presentation, width_px=width)
    inputs = cell_viz.vector_rows(_rows([
        (f"x_{i} (residual in)", data["x_i"]), (f"x̂_{i} (what attention reads)", data["xn_i"]),
        (f"x_{j} (residual in)", data["x_j"]), (f"x̂_{j} (what attention reads)", data["xn_j"])]),
        title=f"1 · The inputs: {f['xn_i']}", subtitle=f"query {_tok(data, i)}, key {_tok(data, j)}", **style)
    qk = _qk_rows(data)
    if data["rotary"]:
        qk += [(f"q_{i} after rotary", data["q"]), (f"k_{j} after rotary", data["k"])]
    steps = (["the q/k norm"] if "qk_norm" in data else []) + (["the rotary step"] if data["rotary"] else [])
    said = ([f["q_norm"]] if "qk_norm" in data else []) + \
        ([f["rotary"]] if data["rotary"] or data["model_facts"]["rope_off"] else [f["q_raw"], f["k_raw"]])
    qk_fig = cell_viz.vector_rows(_rows(qk), title="2 · The query and the key" + (
        ": then " + " and ".join(steps) if steps else ""), subtitle="; ".join(said), **style)
    products = cell_viz.dot_products(data["q"], data["k"], products=data["products"], total=data["dot"],
                                       scale=data["scale"], score=data["score"], softcap=data.get("softcap"),
                                       capped=data.get("capped"), **style)
    scores = [-np.inf if s is None else s for s in data["scores_row"]]
    used = None if data["used_row"] == data["softmax_row"] else data["used_row"]
    softmax = cell_viz.softmax_row(scores, data["exp_row"], data["softmax_row"], data["tokens"], query=i, key=j,
                                     total=data["exp_sum"], used=used, **style)
    weight = data["used_weight"] if data["used_weight"] is not None else data["weight"]
    values = cell_viz.vector_rows(_rows([
        (f"v_{j} = W_V · x̂_{j}", data["v"][j]), (f"a_{i},{j} · v_{j}", [weight * x for x in data["v"][j]]),
        (f"z_{i} = Σ_j a_{i}j · v_j", data["weighted"]), ("what the head passed on", data["head_value"])]),
        title=f"5 · The values: z_i = Σ_j a_ij · v_j (a_{i},{j} = {weight:.4f})", subtitle=f["head_value"], **style)
    norms = [h["norm"] for h in data["heads_out"]]
    bias = None if data["out_bias"] is None else float(np.linalg.norm(data["out_bias"]))
    heads = cell_viz.head_additions(norms, head=data["head"], layer=data["layer"], token=data["tokens"][i],
                                      bias=bias, **style)
    stem = model_stem(data["model"])
    name = f"L{data['layer']}H{data['head']}"
    figs = [inputs, qk_fig, products, softmax, values, heads]
    parts = ["inputs", "q-k", "products", "softmax-row", "values", "head-additions"]
    return [to_plot(viz.with_filename(fig, file_name(stem, name, f"q{i}k{j}", part))) for fig, part in zip(figs, parts)]


def no_text() -> tuple:
    """The panel without a text: its note, the figures emptied, the cell's boxes cleared."""
    return (CLOSED, "", *[message_plot("Press Step first.")] * N_FIGURES, "", "", "", "")


def draw_cell(session, layer, head, query, key) -> tuple:
    """(header, table, six figures, layer, head, query, key) of a cell; query None: the selected token."""
    data = session.inside.cell(layer, head, query, key)
    d = session.display
    figures = cell_figures(data, _width(session), d.presentation)
    return (header(data), numbers_table(data), *figures, data["layer"], data["head"], data["query"], data["key"])


def _given(value):
    """A box's value: None when blank (no cell chosen yet), else the value as typed or drawn (text or a
    number, checked where it is used; anything else is refused here)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UserError("The cell's boxes (layer, head, query i, key j) take whole numbers, or nothing.")
    return value


def _view_head(layer, head) -> tuple:
    """The Explore view's layer and head as the panel's (a grid of heads: its first head). The menu sends
    a head, "all" or a page of heads ("6-11"); any other text is left to the cell's own check, which names it."""
    if head == "all":
        return layer, 0
    if isinstance(head, str) and "-" in head:
        page = whole_numbers(head, "-", 2)
        return layer, head if page is None else page[0]
    return layer, head


@handler(exclusive=False)
def open_panel(session, layer, head, query, key, view_layer, view_head, request: gr.Request = None):
    """The panel was opened (or its numbers typed): the cell it names, else the selected token of the
    head shown in the Explore view."""
    layer, head, query, key = (_given(v) for v in (layer, head, query, key))
    if not session.inside.has_text:
        return no_text()
    if query is None or layer is None or head is None:  # no cell yet (a blank box may read 0, not None)
        layer, head = _view_head(view_layer, view_head)
        query = key = None
    return draw_cell(session, layer, head, query, key)


@handler(exclusive=False)
def pick_cell(session, cell, request: gr.Request = None):
    """A cell of the attention or an entry of the head's matrices was clicked: "layer,head,query,key"."""
    parts = whole_numbers(cell, ",", 4)
    if parts is None:
        raise UserError("Click a cell of the attention figure to see how its weight was computed.")
    layer, head, query, key = parts
    return (gr.update(open=True), *draw_cell(session, layer, head, query, key))


@handler(exclusive=False)
def selected_token(session, layer, head, query, view_layer, view_head, request: gr.Request = None):
    """The selected token's row (the last token when none is selected), at the key it gives the largest share,
    in the panel's head (the head the Explore view shows when no cell is drawn yet)."""
    layer, head, query = (_given(v) for v in (layer, head, query))
    if not session.inside.has_text:  # the text went (another model, Reset): nothing to work through
        return no_text()
    if query is None or layer is None or head is None:
        layer, head = _view_head(view_layer, view_head)
    return draw_cell(session, layer, head, None, None)


@handler(exclusive=False)
def draw_matrices(session, layer, head, query, key, request: gr.Request = None):
    """The head's Q, K, V and QKᵀ (raw, scaled, masked), the panel's cell outlined."""
    return head_matrices(session, layer, head, query, key)


def head_matrices(session, layer, head, query, key):
    """`draw_matrices`'s figure (a message without a cell)."""
    layer, head, query, key = (_given(v) for v in (layer, head, query, key))
    if not session.inside.has_text or layer is None or head is None:
        return message_plot("Open a cell first: the matrices are those of its head.")
    data = session.inside.head(layer, head)
    t = len(data["tokens"])
    query = t - 1 if query is None else check_int("query", query, 0, t - 1)
    key = query if key is None else check_int("key", key, 0, t - 1)
    as_array = lambda name: np.array([[np.nan if x is None else x for x in row] for row in data[name]])  # noqa: E731
    masked = np.where(np.array(data["allowed"], dtype=bool), as_array("masked"), -np.inf)
    fig = cell_viz.head_matrices(as_array("q"), as_array("k"), as_array("v"), as_array("raw"), as_array("scaled"),
                                   masked, data["tokens"], layer=data["layer"], head=data["head"], query=query,
                                   key=key, scale=data["scale"], softcap=data.get("softcap"),
                                   presentation=session.display.presentation,
                                   width_px=_width(session, 1.0))
    name = file_name(model_stem(data["model"]), f"L{data['layer']}H{data['head']}", "matrices")
    return to_plot(viz.with_filename(fig, name))


@handler(rate="export")
def download_cell(session, fmt, layer, head, query, key, request: gr.Request = None):
    """The cell's numbers (q, k, v, the row's softmax and the rest, each with its formula) as CSV or JSON."""
    if fmt not in ("csv", "json"):
        raise UserError("The format must be csv or json.")
    layer, head, query, key = (_given(v) for v in (layer, head, query, key))
    if query is None or key is None:
        raise UserError("Open a cell first: click a cell of the attention, or use the selected token.")
    exp = session.inside.cell_export(layer, head, query, key)
    data = exp.csv.encode("utf-8-sig") if fmt == "csv" else exp.json_text().encode("utf-8")
    return str(session.save_file(exp.name, f".{fmt}", data))
