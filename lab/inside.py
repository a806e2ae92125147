"""Inside one attention cell, for one person's text: model.inside's numbers as plain lists, each with
its formula, ready for the figures, the API's /inside and a numbers download (CSV / JSON).

The numbers come from one forward over the text's window, with the head tools' settings (heads ablated, a row
edited: lab.headsettings) applied, so what is shown is what the model computed for the text as the other tools
see it. That forward is kept while the window and settings stay (`_Memo`): another cell reruns one layer.

Positions are window positions (0 = the first token shown). Masked scores (-inf) are None in the lists
(JSON has no infinity) and empty cells in the CSV. The view runs the own engine's modules.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from model.inside import (CellWork, HeadWork, inside_cell, inside_head, layer_inputs, rebuild_refusal, run_forward,
                          value_weighted)
from model.interventions import Intervention
from model.transformer import ForwardOutput

from .checks import UserError, check_int
from .downloads import Export, to_csv
from .headsettings import ProbeSettings, head_label, need_text, position, window_intervention
from .server.files import file_name, model_stem
from .text import Text

MEMO_BYTES = 16 * 2**20  # a text's kept forward (residuals and attention) larger than this is not kept
# all texts' kept forwards together: past this the least recently used (a shortcut, recomputed) is dropped
MEMO_TOTAL_BYTES = 64 * 2**20
CSV_COLUMNS = ["quantity", "formula", "index", "token", "value"]


def _list(a) -> list:
    """An array as nested lists of floats, None where a value is not finite (a masked -inf)."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 0:
        return _num(a)
    out = a.tolist()
    if np.isfinite(a).all():
        return out
    return _finite(out)


def _finite(x):
    """Nested lists with None in place of every infinity or NaN."""
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x if math.isfinite(x) else None


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


# ----------------------------------------------------------------------------- the kept forward


@dataclass
class _Kept:
    key: tuple
    value: object
    size: int = 0
    used: int = 0  # the memo's clock when last put or read: the smallest is dropped first


class _Memo:
    """What a text's cells share, held only as long as the text itself (weakly keyed) and only while its
    window (and the settings) stay: the forward under the head tools' settings, and the residual inputs
    of the layers carried up from the decoder's cache."""

    def __init__(self) -> None:
        self._forwards: weakref.WeakKeyDictionary[Text, _Kept] = weakref.WeakKeyDictionary()
        self._inputs: weakref.WeakKeyDictionary[Text, _Kept] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._clock = 0

    def _get(self, table, text: Text, key: tuple):
        with self._lock:
            kept = table.get(text)
            if kept is None or kept.key != key:
                return None
            self._clock += 1
            kept.used = self._clock
            return kept.value

    def _put(self, table, text: Text, key: tuple, value, size: int) -> None:
        with self._lock:
            table.pop(text, None)
            if size > MEMO_BYTES:
                return
            self._clock += 1
            table[text] = _Kept(key, value, size, self._clock)
            self._fit()

    def _fit(self) -> None:
        """Drop the least recently used entries until all kept bytes fit MEMO_TOTAL_BYTES (lock held)."""
        entries = [(k.used, t, text) for t in (self._forwards, self._inputs) for text, k in list(t.items())]
        total = sum(t[text].size for _, t, text in entries)
        for _, t, text in sorted(entries, key=lambda e: e[0]):
            if total <= MEMO_TOTAL_BYTES:
                break
            total -= t.pop(text).size

    def nbytes(self) -> int:
        """Bytes kept for all texts together (never more than MEMO_TOTAL_BYTES)."""
        with self._lock:
            return sum(k.size for t in (self._forwards, self._inputs) for k in list(t.values()))

    def forward(self, text: Text, iv: Intervention | None) -> ForwardOutput:
        d = text.decoder
        key = (id(text.entry), id(d), tuple(d.window), iv)
        out = self._get(self._forwards, text, key)
        if out is None:
            out = run_forward(text.entry.model, d.window, iv)
            # logits and scores are not needed here: only residuals and attention are kept
            out = ForwardOutput(logits=out.logits[:, -1:], attentions=out.attentions, residuals=out.residuals)
            size = sum(t.numel() * t.element_size() for t in (*out.residuals, *out.attentions))
            self._put(self._forwards, text, key, out, size)
        return out

    def inputs(self, text: Text, layer: int, carry: bool = True) -> list | None:
        """The residual input of layers 0..layer at every position (model.inside.layer_inputs), carried
        up from the decoder's cache once per window and kept, so a text's next cells rebuild one layer.
        carry=False: only what is kept (None when it does not reach `layer`)."""
        d = text.decoder
        key = (id(text.entry), id(d), tuple(d.window))
        known = self._get(self._inputs, text, key)
        if known is not None and len(known) > layer:
            return known
        if not carry:
            return None
        xs = layer_inputs(text.entry.model, d.window, layer, d.cache, d.attention, known)
        self._put(self._inputs, text, key, xs, sum(x.numel() * x.element_size() for x in xs))
        return xs


MEMO = _Memo()


# ----------------------------------------------------------------------------- checks


def _shape(text: Text) -> tuple[int, int, int]:
    need_text(text)
    text.entry.require("inside")  # the rebuild calls the own engine's layer modules
    if why := rebuild_refusal(cfg := text.entry.cfg):  # a model whose cells this view cannot rebuild
        raise UserError(why)
    return cfg.n_layers, cfg.n_heads, len(text.decoder.window)


def _layer_head(text: Text, layer, head) -> tuple[int, int]:
    n_layers, n_heads, _ = _shape(text)
    return check_int("layer", layer, 0, n_layers - 1), check_int("head", head, 0, n_heads - 1)


def _facts(text: Text, layer: int) -> dict:
    """What kind of attention this layer computes (the view names each step after these). Rotary facts
    are this layer's: a layer may turn with a local base, or not at all (rope_off)."""
    cfg = text.entry.cfg
    attn = text.entry.model.blocks[layer].attn
    base = cfg.rope_base(layer)
    return dict(d_model=cfg.d_model, n_heads=cfg.n_heads, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                attn_dim=cfg.attn_dim, layer=layer, embed_scale=cfg.embed_scale, norm=cfg.norm, norm_kind=cfg.norm_kind,
                norm_offset=cfg.norm_offset, norm_weight=cfg.norm_weight, positional=cfg.pos_encoding,
                rotary=base is not None, rotary_dims=cfg.rope_dim if base else 0, rope_base=base,
                rope_off=cfg.pos_encoding == "rope" and not base,
                rope_local=bool(base and cfg.local_rope_base and cfg.window(layer)),
                rope_scaling=list(cfg.rope_scaled(layer)) if base else [], qk_norm=cfg.qk_norm, qk_gain=cfg.qk_gain,
                scale_kind=cfg.attn_scale, query_scale_dim=cfg.query_scale_dim, scale=attn.score_scale,
                softcap=cfg.attn_softcap, mask=cfg.mask, window=cfg.window(layer),
                parallel_residual=cfg.parallel_residual, qkv_bias=attn.qkv.bias is not None,
                out_projection=attn.proj is not None, out_bias=attn.proj is not None and attn.proj.bias is not None,
                post_attn_norm=cfg.norm in ("sandwich", "post_branch"))


def _changes(text: Text, settings: ProbeSettings) -> tuple[Intervention | None, dict]:
    iv = window_intervention(text, settings)
    d = text.decoder
    what = settings.describe([text.entry.pieces[i] for i in d.window], d.start)
    return iv, {"changed": iv is not None, "what": what}


def _base(text: Text, what: str, layer: int, head: int) -> dict:
    d = text.decoder
    pieces = text.entry.pieces
    return {"what": what, "model": text.entry.name, "tokens": [pieces[i] for i in d.window],
            "text_offset": int(d.start), "layer": layer, "head": head, "head_label": head_label(layer, head)}


# ----------------------------------------------------------------------------- formulas


def _norm_name(facts: dict) -> str:
    """The block norms' name as a formula writes it, with Gemma's 1 + w or a norm without a weight."""
    if facts["norm_kind"] == "layernorm":
        return "LayerNorm"
    if facts["norm_offset"]:
        return "RMSNorm·(1 + w)"  # the model stores w − 1: its norms multiply by 1 + w
    return "RMSNorm" if facts["norm_weight"] else "RMSNorm (no weight)"


def _reads(facts: dict) -> str:
    """x̂ = what the attention reads, by where the block's norms sit."""
    norm = _norm_name(facts)
    return {"pre": f"x̂ = {norm}(x) (the block's first norm)",
            "sandwich": f"x̂ = {norm}(x) (the block's first norm; its output is normalised again after the attention)",
            "post": "x̂ = x (a post-norm block normalises after adding)",
            "post_branch": "x̂ = x (this block normalises what each branch writes, not what it reads)",
            }.get(facts["norm"], "x̂ = x (no normalisation)")


def _qk_formulas(facts: dict) -> dict[str, str]:
    """The projections and, where the model has one, the q/k norm before the rotary step."""
    bq, bk = (" + b_Q", " + b_K") if facts["qkv_bias"] else ("", "")
    if facts["qk_norm"] == "none":
        return {"q_raw": f"q_i = W_Q · x̂_i{bq}", "k_raw": f"k_j = W_K · x̂_j{bk}"}
    hs, H, Hkv = facts["head_dim"], facts["n_heads"], facts["kv_heads"]
    out = {"q_proj": f"p_i = W_Q · x̂_i{bq} (the query's projection, before the q/k norm)",
           "k_proj": f"p_j = W_K · x̂_j{bk} (the key's projection, before the q/k norm)"}
    for side, v, heads, name in (("q", "i", H, "query"), ("k", "j", Hkv, "key")):
        over = (f"over this head's {hs} dimensions" if facts["qk_norm"] == "head" else
                f"over all {heads} {name} heads of the position at once ({heads}·{hs} = {heads * hs} numbers)")
        w = (f"(1 + w_{side})" if facts["norm_offset"] else f"w_{side}") if facts["norm_weight"] else ""
        gain = f" × {facts['qk_gain']:g}" if facts["qk_gain"] != 1 else ""
        if facts["norm_kind"] == "layernorm":
            out[f"{side}_norm"] = f"μ, σ(p_{v}) = mean and √(variance + ε) {over}"
            normed = f"(p_{v} − μ) / σ(p_{v}) · w_{side} + b_{side}"
        else:
            out[f"{side}_norm"] = f"rms(p_{v}) = √(mean p_{v}[d]² + ε) {over}"
            normed = f"p_{v} / rms(p_{v})" + (f" · {w}" if w else "")
        out[f"{side}_raw"] = f"{side}_{v} = {normed}{gain} (the q/k norm, before the rotary step)"
    return out


def _rotary(facts: dict) -> str:
    """This layer's rotary step: its base (local or global) and frequency change, or why there is none."""
    if facts["rope_off"]:
        return "no rotary step: this layer does not rotate (one of the model's layers without rotary positions)"
    if not facts["rotary"]:
        return "no rotary step"
    rd = facts["rotary_dims"]
    base = f"base {facts['rope_base']:g}" + (" (this local layer's own base)" if facts["rope_local"] else "")
    scaling = facts["rope_scaling"]
    change = ("" if not scaling else f", each frequency ÷ {scaling[1]:g} (linear scaling)" if scaling[0] == "linear"
              else f", frequencies changed by Llama 3's rule (factor {scaling[1]:g})")
    return (f"q_i ← R(i)·q_i, k_j ← R(j)·k_j: rotary positions turn each pair (2d, 2d+1) of the first {rd} "
            f"dimensions by position × base^(−2d/{rd}), {base}{change}")


def _score_formulas(facts: dict) -> dict[str, str]:
    """The scale, the soft-cap where the model has one, and the mask."""
    if facts["scale_kind"] != "inverse_sqrt":
        scale = "1 (this model does not scale its scores)"
    elif facts["query_scale_dim"]:
        scale = (f"1/√query_pre_attn_scalar = 1/√{facts['query_scale_dim']} (the model's own constant, "
                 f"not the head width {facts['head_dim']})")
    else:
        scale = "1/√d_head = 1/√" + str(facts["head_dim"])
    mask = ("−∞ where j > i (a token may not look ahead)" if facts["mask"] == "causal" else "no mask")
    if facts["window"]:
        mask += f", and where j ≤ i − {facts['window']} (this layer sees its last {facts['window']} keys)"
    out = {"scale": f"scale = {scale}", "score": "s_ij = (q_i · k_j) × scale", "mask": f"mask: {mask}",
           "scores_row": "s_i· : the scores of the whole row, masked"}
    if facts["softcap"] is not None:
        c = facts["softcap"]
        out["capped"] = (f"s_ij ← c · tanh(s_ij / c), c = {c:g}: the soft-cap squashes the score into "
                         f"(−{c:g}, {c:g}), before the mask")
        out["scores_row"] = "s_i· : the scores of the whole row, capped, then masked"
    return out


def _output_formulas(facts: dict) -> dict[str, str]:
    """From the head's output to the residual stream after the attention."""
    b_o = " + b_O" if facts["out_bias"] else ""
    out = {"attn_out": f"Σ_h o_i^h{b_o}: the attention sublayer's output at i"}
    if facts["post_attn_norm"]:
        out["attn_normed"] = (f"post_norm1(Σ_h o_i^h{b_o}) with {_norm_name(facts)}: the attention's output, "
                              "normalised before it joins the residual")
        out["residual_after"] = f"x_i + post_norm1(Σ_h o_i^h{b_o})"
    else:
        out["residual_after"] = (f"x_i + Σ_h o_i^h{b_o}" + (" (then the block's norm)" if facts["norm"] == "post"
                                 else " (the MLP branch is added beside it)" if facts["parallel_residual"] else ""))
    return out


def formulas(facts: dict) -> dict[str, str]:
    """Each quantity's label, as the view and the download write it (i: query, j: key, h: head). Steps a
    model does not have (a q/k norm, a soft-cap, a norm of the attention's output) have no label."""
    reads = _reads(facts)
    bv = " + b_V" if facts["qkv_bias"] else ""
    rot = facts["rotary"]
    w_o = ("o_i^h = W_O[:, h] · z_i^h (the head's columns of the output projection)" if facts["out_projection"]
           else "o_i^h = z_i^h placed in the head's own dimensions (no output projection)")
    x_i = "x_i: the residual stream entering this layer at the query token"
    if facts["layer"] == 0 and facts["embed_scale"] != 1:
        x_i += f" (here the token's embedding × {facts['embed_scale']:.6g}, the model's embedding scale)"
    return {
        "x_i": x_i, "x_j": "x_j: the same at the key token",
        "xn_i": reads.replace("x̂", "x̂_i").replace("(x)", "(x_i)").replace("= x ", "= x_i ").rstrip(),
        "xn_j": reads.replace("x̂", "x̂_j").replace("(x)", "(x_j)").replace("= x ", "= x_j ").rstrip(),
        **_qk_formulas(facts), "rotary": _rotary(facts),
        "q": "q_i (after the rotary step)" if rot else "q_i", "k": "k_j (after the rotary step)" if rot else "k_j",
        "products": "q_i[d] · k_j[d], one per head dimension d", "dot": "q_i · k_j = Σ_d q_i[d] · k_j[d]",
        **_score_formulas(facts), "row_max": "m = max_j s_ij",
        "exp_row": "exp(s_ij − m) (subtracting m leaves the shares unchanged and avoids overflow)",
        "exp_sum": "Σ_j exp(s_ij − m)", "softmax_row": "a_ij = exp(s_ij − m) / Σ_j exp(s_ij − m)",
        "weight": "a_ij: the clicked cell's share of the row",
        "used_row": "the row that multiplied V (a uniform or edited row replaces a_i·)",
        "v": f"v_j = W_V · x̂_j{bv}, for every key j", "weighted": "z_i^h = Σ_j a_ij · v_j",
        "head_value": "what the head passed on (z_i^h; 0 when zeroed; its mean over the positions when mean-ablated)",
        "head_out": w_o, "out_bias": "b_O: added once to the sum of the heads; it belongs to no single head",
        "heads_out": "o_i^h for every head h of the layer (the numbers used)", **_output_formulas(facts),
    }


# ----------------------------------------------------------------------------- one cell


VECTORS = ("x_i", "x_j", "xn_i", "xn_j", "q_raw", "k_raw", "q", "k", "products", "weighted", "head_value",
           "head_out", "attn_out", "residual_after")
ROWS = ("scores_row", "exp_row", "softmax_row", "used_row")
SCALARS = ("dot", "scale", "score", "row_max", "exp_sum", "weight", "used_weight")


def _source(text: Text, iv: Intervention | None, layer: int, rows_only: bool = False) -> dict:
    """Where the numbers come from: the decoder's key/value cache and attention (the text as it was
    computed: every position's layer inputs carried up once and kept; rows_only: unless they are kept
    already, only the rows asked for are carried, which is what a first cell costs), or, under the head
    tools' settings or when the decoder holds no cache, a forward over the window with them (kept)."""
    d, cfg = text.decoder, text.entry.cfg
    cache = getattr(d, "cache", None)
    if iv is None and cache is not None and cache.length == len(d.window) and len(d.attention) == cfg.n_layers:
        return {"cache": cache, "attention": d.attention, "inputs": MEMO.inputs(text, layer, carry=not rows_only)}
    return {"intervention": iv, "forward": MEMO.forward(text, iv)}


def cell(text: Text, settings: ProbeSettings, layer, head, query=None, key=None) -> dict:
    """Cell (query, key) of head `head` in `layer` on the text's window, worked through.

    query: a window position (default: the selected token, else the last); key: a window position
    (default: the key the query gives the largest share). Refuses a bad value with a sentence and
    changes nothing.
    """
    layer, head = _layer_head(text, layer, head)
    query = position(text, query)
    T = len(text.decoder.window)
    key = None if key is None else check_int("key position", key, 0, T - 1)
    iv, changes = _changes(text, settings)
    source = _source(text, iv, layer, rows_only=True)
    if key is None:  # the key the query gives the largest share
        if "cache" in source:
            weights = source["attention"][layer]
        else:
            weights = source["forward"].attentions[layer][0].float().cpu().numpy()
        key = int(np.argmax(weights[head, query]))
    w = inside_cell(text.entry.model, text.decoder.window, layer, head, query, key, **source)
    return cell_dict(text, w, changes)


def cell_dict(text: Text, w: CellWork, changes: dict) -> dict:
    """A `CellWork` as plain lists and numbers, with its formulas."""
    facts = _facts(text, w.layer)
    data = _base(text, "inside attention cell", w.layer, w.head)
    tokens = data["tokens"]
    order = sorted(range(len(w.products)), key=lambda d: -w.products[d])
    data.update({
        "query": w.query, "key": w.key, "query_token": tokens[w.query], "key_token": tokens[w.key],
        "kv_head": w.kv_head, "model_facts": facts, "formulas": formulas(facts), "masked": w.masked,
        "active": {**changes, "ablation": w.ablation, "row_source": w.row_source},
        "allowed": [bool(a) for a in w.allowed], "products_order": order,
        "rotary": None if not w.rotary else {"dims": w.rotary_dims, "fraction": w.rotary_fraction,
                                             "base": w.rope_base, "local": w.rope_local,
                                             "scaling": list(w.rope_scaling),
                                             "cos_i": _list(w.rope_cos_i), "sin_i": _list(w.rope_sin_i),
                                             "cos_j": _list(w.rope_cos_j), "sin_j": _list(w.rope_sin_j)},
        "v": _list(w.v), "scale_dim": w.scale_dim,
        "out_bias": None if w.out_bias is None else _list(w.out_bias),
        "heads_out": [{"head": h, "label": head_label(w.layer, h), "norm": float(np.linalg.norm(o)), "vector": _list(o)}
                      for h, o in enumerate(w.heads_out)],
    })
    data.update({name: _list(getattr(w, name)) for name in VECTORS + ROWS})
    data.update({name: _num(getattr(w, name)) for name in SCALARS})
    return {**data, **_optional_steps(w)}


def _optional_steps(w: CellWork) -> dict:
    """The steps only some models have, each present only where the model has it: the q/k norm (the
    projections, then each side's rms and multiplier offset + w), the soft-cap, the norm of the
    attention's output."""
    out: dict[str, Any] = {}
    if w.q_norm is not None:
        sides = {side: {"width": n.width, "mean": n.mean, "rms": n.rms,
                        "bias": None if n.bias is None else _list(n.bias),
                        "weight": None if n.weight is None else _list(n.weight),
                        "multiplier": None if n.weight is None else _list(n.offset + n.weight)}
                 for side, n in (("query", w.q_norm), ("key", w.k_norm))}
        out.update(q_proj=_list(w.q_proj), k_proj=_list(w.k_proj), qk_norm={
            "over": w.qk_norm, "kind": w.q_norm.kind, "eps": w.q_norm.eps, "offset": w.q_norm.offset,
            "gain": w.q_norm.gain, **sides})
    if w.softcap is not None:
        out.update(softcap=w.softcap, capped=_num(w.capped))
    if w.attn_normed is not None:
        out["attn_normed"] = _list(w.attn_normed)
    return out


def cell_export(text: Text, settings: ProbeSettings, layer, head, query=None, key=None) -> Export:
    """The cell's numbers to download: the JSON is `cell`'s; the CSV one line per number, with its formula."""
    data = cell(text, settings, layer, head, query, key)
    f, tokens = data["formulas"], data["tokens"]
    rows: list[list[Any]] = []
    for name in SCALARS + tuple(n for n in ("softcap", "capped") if n in data):
        rows.append([name, f.get(name, name), None, None, data[name]])
    for name in VECTORS + tuple(n for n in ("q_proj", "k_proj", "attn_normed") if n in data):
        rows += [[name, f[name], d, None, v] for d, v in enumerate(data[name])]
    for side, v in (("query", "q"), ("key", "k")):  # the q/k norm's divisor and multiplier, where there is one
        if "qk_norm" in data:
            n = data["qk_norm"][side]
            rows.append([f"{v}_rms", f[f"{v}_norm"], None, None, n["rms"]])
            rows += [[f"{v}_norm_multiplier", f[f"{v}_raw"], d, None, x] for d, x in enumerate(n["multiplier"] or [])]
    for name in ROWS:
        rows += [[name, f[name], j, tokens[j], v] for j, v in enumerate(data[name])]
    rows += [["v", f["v"], f"{j},{d}", tokens[j], x] for j, vec in enumerate(data["v"]) for d, x in enumerate(vec)]
    if data["out_bias"] is not None:
        rows += [["out_bias", f["out_bias"], d, None, v] for d, v in enumerate(data["out_bias"])]
    name = file_name(model_stem(text.entry.name), f"L{data['layer']}H{data['head']}",
                     f"q{data['query']}k{data['key']}", "inside")
    return Export(name, to_csv(CSV_COLUMNS, rows), data)


# ----------------------------------------------------------------------------- the head as matrices


def head(text: Text, settings: ProbeSettings, layer, head) -> dict:
    """Head `head` of `layer` as matrices: Q, K, V (tokens × head dimensions), QKᵀ raw, scaled and
    masked, the softmax, the rows used, and value-weighted attention ‖a_ij v_j W_O‖; with a q/k norm the
    projections before it (q_proj, k_proj), with a soft-cap the capped scores (softcap, capped)."""
    layer, head = _layer_head(text, layer, head)
    iv, changes = _changes(text, settings)
    w: HeadWork = inside_head(text.entry.model, text.decoder.window, layer, head, **_source(text, iv, layer))
    data = _base(text, "inside attention head", layer, head)
    data.update({"kv_head": w.kv_head, "scale": w.scale, "model_facts": _facts(text, layer),
                 "active": {**changes, "ablation": w.ablation, "edited_rows": w.edited_rows},
                 "allowed": w.allowed.tolist()})
    extra = (("q_proj", "k_proj") if text.entry.cfg.qk_norm != "none" else ()) + \
        (("capped",) if w.softcap is not None else ())
    for name in ("q_raw", "k_raw", "q", "k", "v", "raw", "scaled", "masked", "weights", "used", "value_norms",
                 "value_weighted") + extra:
        data[name] = _list(getattr(w, name))
    return data if w.softcap is None else {**data, "softcap": w.softcap}


_head_of = head  # `head` by a name that Inside.head's argument `head` does not hide


def layer_value_weighted(text: Text, settings: ProbeSettings, layer) -> dict:
    """‖a_ij v_j W_O,h‖ for every head of `layer`: "value_weighted" is (H, T, T) as nested lists."""
    n_layers, _, _ = _shape(text)
    layer = check_int("layer", layer, 0, n_layers - 1)
    iv, changes = _changes(text, settings)
    vw = value_weighted(text.entry.model, text.decoder.window, layer, **_source(text, iv, layer))
    data = _base(text, "value-weighted attention", layer, None)
    data.pop("head_label")
    data.update({"active": changes, "value_weighted": _list(vw)})
    return data


# ----------------------------------------------------------------------------- one person's panel


class Inside:
    """Inside one cell for one person (the session's `inside`): the text's cells and heads worked through
    under the head tools' settings as they are at each call (`heads`: the session's lab.heads.Heads)."""

    def __init__(self, text: Text, heads) -> None:
        self.text, self.heads = text, heads

    @property
    def has_text(self) -> bool:
        """Whether there is a text to work through (none before the first Step, after Reset or another model)."""
        return self.text.decoder is not None

    def cell(self, layer, head, query=None, key=None) -> dict:
        """`cell` on this person's text and settings."""
        return cell(self.text, self.heads.settings, layer, head, query, key)

    def cell_export(self, layer, head, query=None, key=None) -> Export:
        """`cell_export` on this person's text and settings."""
        return cell_export(self.text, self.heads.settings, layer, head, query, key)

    def head(self, layer, head) -> dict:
        """`head` on this person's text and settings."""
        return _head_of(self.text, self.heads.settings, layer, head)
