"""Inside one attention cell: the arithmetic of scaled dot-product attention with the model's own numbers.

For one layer, head, query token i and key token j this module rebuilds, from the residual stream the
forward fed into the layer and the layer's own modules (norm, qkv weights, q/k norms, this layer's rotary
tables, W_O), every intermediate number:  x_i -norm-> x̂_i -W_Q-> q_i (-q/k norm->) -rotary-> q_i · k_j
-×scale (-soft-cap), mask-> s_ij; a_i = softmax(s_i) (exp(s_ij - max), their sum, the share a_ij);
z_i = Σ_j a_ij v_j -W_O-> the head's addition to the residual of token i (-post_norm1-> in a block that
normalises its branches' outputs) -> the residual after the attention. Steps in brackets exist in some
models only (ModelConfig.qk_norm, attn_softcap, norm "sandwich" / "post_branch"); each is reported with
its own numbers where it is present (`CellWork`). `inside_cell` returns a `CellWork`, `inside_head` a `HeadWork`
(Q, K, V and QKᵀ as matrices), `value_weighted` ‖a_ij · v_j W_O‖ for a layer (Kobayashi et al. 2020).
They compute in the model's dtype by calling the forward's own code (model/attention.py: the layer's
`split_heads`, then `attend`, the one written-out attention), and check that the weights they rebuilt
equal the ones the forward multiplied V with (`RebuildMismatch`): the numbers are the forward's.
Under an intervention the numbers used are reported beside the model's own (`used_row`, `head_value`);
what the intervention does is the plan's (model/interventions.py), here as in the forward.
The output projection's bias b_O is added once to the sum of the heads; it belongs to no single head,
so it is reported on its own (`out_bias`): attention output at i = Σ_h head_out_h + b_O.
Positions are positions in `ids` (0-based); the forward runs over `ids` from position 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .attention import AttentionWork, LayerCache, attend, per_query_head
from .inside_types import CellWork, HeadWork, QKNormStep
from .interventions import Intervention, LayerPlan
from .transformer import DecoderLM, ForwardOutput, KVCache

REBUILD_TOL = 1e-5  # largest difference allowed between the rebuilt weights and the forward's


class RebuildMismatch(RuntimeError):
    """The attention rebuilt here differs from the forward's: a bug, never a person's mistake."""


@dataclass
class _Layer:
    """The heads of one layer rebuilt at some query positions `rows` (R of the T positions; tensors in the
    model's dtype, one sequence: no batch dimension)."""

    rows: list[int]
    x: torch.Tensor  # (R, C) residual input at the rows
    xn: torch.Tensor  # (R, C) what the attention reads there
    a: AttentionWork  # q_raw, q (H, R, hs); k_raw (Hkv, R, hs); k, v (Hkv, T, hs): every key, from the
    # same rebuild or from the cache; raw, scores, weights, used (H, R, T); allowed (R, T); values (H, R, hs)
    plan: LayerPlan | None

    def at(self, position: int) -> int:
        return self.rows.index(position)


def run_forward(model: DecoderLM, ids, intervention: Intervention | None = None) -> ForwardOutput:
    """The forward the numbers come from: residual streams and attention weights of every layer."""
    with torch.inference_mode():
        return model(_ids(ids, model), return_attention=True, return_residuals=True, intervention=intervention)


def _ids(ids, model: DecoderLM) -> torch.Tensor:
    """One sequence of token ids as a (1, T) tensor on the model's device."""
    t = ids if isinstance(ids, torch.Tensor) else torch.tensor(list(ids), dtype=torch.long)
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.shape[0] != 1:
        raise ValueError(f"ids must be one sequence of token ids, got shape {tuple(t.shape)}")
    return t.to(model.tok_emb.weight.device)


def _forward(model: DecoderLM, ids: torch.Tensor, intervention: Intervention | None,
             forward: ForwardOutput | None) -> ForwardOutput:
    """The given forward (it must hold residuals of as many positions as `ids`), or a new one."""
    if forward is None:
        return run_forward(model, ids, intervention)
    if forward.residuals is None or forward.residuals[0].shape[1] != ids.shape[1]:
        raise ValueError("the forward given must hold the residual streams of these ids (run_forward)")
    return forward


def _check(model: DecoderLM, T: int, layer, head, query=None, key=None) -> None:
    cfg = model.cfg
    for name, value, n in (("layer", layer, cfg.n_layers), ("head", head, cfg.n_heads),
                           ("query", query, T), ("key", key, T)):
        if value is None and name in ("query", "key"):
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < n:
            raise ValueError(f"{name} must be a whole number from 0 to {n - 1}, got {value!r}")


def rebuild_refusal(cfg) -> str | None:
    """Why this view cannot rebuild a model's cells exactly (None when it can): nanochat's blocks read the
    embedding again (x0 lambdas), mix a gated value embedding into v and smear each token's embedding with
    the previous one's, which the rebuild from one layer's residual input does not carry."""
    parts = [what for on, what in ((cfg.x0_mix, "each block's mix of the stream with the embedding (x0 lambdas)"),
                                   (cfg.value_embed_layers, "the gated value embeddings"),
                                   (cfg.smear_width, "the smear of the previous token's embedding")) if on]
    if not parts:
        return None
    return ("Inside one cell does not rebuild this model's attention yet: it cannot carry "
            + " or ".join(parts[:2]) + (", nor " + parts[2] if len(parts) > 2 else "")
            + "; the attention maps, head roles, lens and patching show its exact numbers")


def kv_head_of(model: DecoderLM, head: int) -> int:
    """The key/value head query head `head` reads: h // (H / Hkv) (itself without grouping)."""
    cfg = model.cfg
    return head // (cfg.n_heads // cfg.kv_heads)


def _rebuild(model: DecoderLM, out: ForwardOutput, layer: int, intervention: Intervention | None) -> _Layer:
    """The attention of `layer` at every position, rebuilt from the residual the forward fed it."""
    x = out.residuals[layer][0]  # (T, C): the layer's residual input
    T = x.shape[0]
    plan = None
    if intervention is not None and not intervention.is_empty:
        # the same plan the forward made for this layer (positions from 0: a forward without a cache)
        plan = intervention.layer_plans(model.cfg, T)[layer]
    given = out.attentions[layer][0] if out.attentions is not None else None  # (H, T, T): the weights used
    return _attend(model, layer, x, list(range(T)), None, plan, given)


def _attend(model: DecoderLM, layer: int, x: torch.Tensor, rows: list[int], kv: LayerCache | None,
            plan: LayerPlan | None, given: torch.Tensor | None) -> _Layer:
    """Layer `layer`'s attention for the queries at positions `rows` (their residual input x: (R, C)),
    with the forward's own code. kv: every key and value of the text (after the rotary step) from its
    cache; None: the rows are every position and give them. given (H, R, T): the weights the forward
    used at these rows, which the rebuilt ones must equal (RebuildMismatch)."""
    cfg = model.cfg
    block = model.blocks[layer]
    with torch.inference_mode():
        xn = block.attn_input(x)  # what the attention reads: a post-norm block's reads x itself
        q_raw, k_raw, v_raw = block.attn.split_heads(xn[None])  # a batch of one: (1, H or Hkv, R, hs)
        # each row turns by its own position, which need not be consecutive (a cell's query and key)
        rope = model.rope_at(layer, rows)
        # with a cache the rows sit anywhere in the text and the cache holds every key (rows=);
        # without one they are the whole text, in order, and are its keys (rows=None: the forward's case)
        work = attend(block.attn, q_raw, k_raw, v_raw, rope, kv, rows=rows if kv is not None else None,
                      plan=plan).one()
        if given is not None:
            diff = float((given.to(device=work.used.device, dtype=work.used.dtype) - work.used).abs().max())
            if not diff <= REBUILD_TOL:
                raise RebuildMismatch(f"layer {layer}: rebuilt attention differs from the forward's by {diff:.3g}")
    return _Layer(rows, x, xn, work, plan)


def _cached(model: DecoderLM, ids: torch.Tensor, layer: int, positions: list[int], cache: KVCache,
            attention, inputs: list[torch.Tensor] | None = None) -> _Layer:
    """Layer `layer` at `positions` from the key/value cache of the forward over `ids`, without running
    the whole text again: the positions' residual streams are carried up through the blocks below
    `layer` (`_carry`), or taken from `inputs` (`layer_inputs` of every position, already carried);
    every key and value comes from the cache, and the rebuilt weights of these rows are checked
    against `attention` (one (H, T, T) per layer: the weights that forward used; None: not checked)."""
    rows = sorted(set(positions))
    if inputs is not None and len(inputs) > layer:
        x = inputs[layer][rows]
    else:
        x = _carry(model, ids, rows, cache, attention, layer)[layer]
    return _attend(model, layer, x, rows, cache.layers[layer], None, _given(attention, layer, rows))


def _given(attention, layer: int, rows: list[int]) -> torch.Tensor | None:
    return None if attention is None else torch.as_tensor(np.asarray(attention[layer])[:, rows])  # (H, R, T)


def _carry(model: DecoderLM, ids: torch.Tensor, rows: list[int], cache: KVCache, attention, upto: int,
           known: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """The residual input (R, C) of layers 0..upto at `rows`: the embedding, then each block as
    `Block.forward` runs it, its attention reading every key and value from the cache (and checked
    against `attention`). known: the first layers' inputs, already carried."""
    cfg = model.cfg
    with torch.inference_mode():
        xs = list(known or [])
        if not xs:
            # (R, C): the embedding, then the positions, as the forward adds them
            xs.append(model.embed(ids[0, rows], torch.tensor(rows, device=ids.device)))
        for m in range(len(xs) - 1, upto):
            work = _attend(model, m, xs[m], rows, cache.layers[m], None, _given(attention, m, rows))
            xs.append(_block_rest(model.blocks[m], xs[m], work.a.values))
    return xs


def layer_inputs(model: DecoderLM, ids, upto: int, cache: KVCache, attention=None,
                 known: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """The residual input (T, C) of layers 0..upto at every position of `ids`, carried up from the
    cache of the forward over them (`known`: the first layers', from an earlier call). Pass it as
    `inputs` to `inside_cell` / `inside_head` / `value_weighted`: then only their own layer is rebuilt."""
    ids_t = _ids(ids, model)
    _check(model, ids_t.shape[1], upto, 0)
    return _carry(model, ids_t, list(range(ids_t.shape[1])), cache, attention, upto, known)


def _block_rest(block, x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The rest of a block (`Block.rest`) after its heads' outputs `values` (H, R, hs) at rows x (R, C)."""
    y = values.transpose(0, 1).reshape(x.shape[0], -1)  # heads side by side again: (R, attn_dim)
    return block.rest(x, block.attn.proj(y) if block.attn.proj is not None else y)


def _ablation(plan: LayerPlan | None, head: int) -> str | None:
    return None if plan is None else plan.ablation_of(head)


def _row_source(plan: LayerPlan | None, head: int, query: int) -> str:
    return "softmax" if plan is None else plan.row_source(head, query)


def _heads_out(model: DecoderLM, layer: int, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every head's addition to the residual, (H, T, C), from what the heads passed on, and b_O."""
    attn, cfg = model.blocks[layer].attn, model.cfg
    H, hs = cfg.n_heads, cfg.head_dim
    T = values.shape[1]
    if attn.proj is None:  # the heads' values, each in its own hs dimensions
        out = torch.zeros(H, T, cfg.d_model, dtype=values.dtype, device=values.device)
        for h in range(H):
            out[h, :, h * hs : (h + 1) * hs] = values[h]
        return out, None
    w = attn.proj.weight.view(cfg.d_model, H, hs).permute(1, 2, 0)  # (H, hs, C): W_O's columns per head
    return values @ w, attn.proj.bias


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().double().cpu().numpy()


def inside_cell(model: DecoderLM, ids, layer: int, head: int, query: int, key: int,
                intervention: Intervention | None = None, forward: ForwardOutput | None = None,
                cache: KVCache | None = None, attention=None, inputs: list[torch.Tensor] | None = None) -> CellWork:
    """Cell (query, key) of head `head` in layer `layer`, worked through for the forward over `ids`.

    forward: that forward's output if it was already run (it must hold `residuals`, from
    `run_forward` or `return_residuals=True`, with the same ids and intervention); its attention,
    when present, is what the rebuilt weights are checked against. cache (no intervention): the
    key/value cache of the forward over exactly `ids` (a Decoder's), with `attention`, its weights
    (one (H, T, T) per layer), to check against: then only the query's and the key's tokens are run
    (after the cached keys before them), not the whole text; with `inputs` (`layer_inputs`), only
    this layer is rebuilt. A key after the query (masked) is
    allowed: its dot product exists, its score is -inf and its weight 0.
    """
    ids_t = _ids(ids, model)
    _check(model, ids_t.shape[1], layer, head, query, key)
    work = _work(model, ids_t, layer, intervention, forward, cache, attention, [query, key], inputs)
    return _cell(model, work, layer, head, query, key)


def _work(model: DecoderLM, ids: torch.Tensor, layer: int, intervention: Intervention | None,
          forward: ForwardOutput | None, cache: KVCache | None, attention, positions: list[int] | None,
          inputs: list[torch.Tensor] | None) -> _Layer:
    """The layer rebuilt from the cache (no intervention; at `positions`, None: all) or from a forward."""
    T = ids.shape[1]
    # the cache holds the model's own keys and values; under an intervention the layers below changed
    # them, so only a forward run with that intervention has the right residual streams
    if cache is not None and (intervention is None or intervention.is_empty) and forward is None:
        if cache.length != T:
            raise ValueError(f"the cache holds {cache.length} positions, not the {T} of these ids")
        return _cached(model, ids, layer, list(range(T)) if positions is None else positions, cache, attention, inputs)
    return _rebuild(model, _forward(model, ids, intervention, forward), layer, intervention)


def _cell(model: DecoderLM, work: _Layer, layer: int, head: int, query: int, key: int) -> CellWork:
    cfg, g, a = model.cfg, kv_head_of(model, head), work.a
    i, j = work.at(query), work.at(key)  # their rows in `work` (the key's gives its own x and k_raw)
    with torch.inference_mode():
        q, k = a.q[head, i], a.k[g, key]
        products = q * k  # (hs,)
        row = a.scores[head, i]  # (T,)
        row_max = row.max()
        exp_row = torch.exp(row - row_max)  # exp(-inf) = 0 where masked
        heads_out, bias = _heads_out(model, layer, a.values[:, i : i + 1])
        heads_out = heads_out[:, 0]  # (H, C)
        attn_out = heads_out.sum(0) + (bias if bias is not None else 0.0)
        attn_normed = _post_norm(model.blocks[layer], attn_out)
        weighted = a.used[head, i] @ a.v[g]
        dot = float(a.raw[head, i, key])
        score = float(a.scaled[head, i, key])  # before the cap and the mask: a masked key's score is still a number
        capped = float(a.capped[head, i, key])
    rope = model.rope_at(layer, [query, key])  # this layer's (cos, sin) at the two positions, or None
    proj, hs = model.blocks[layer].attn.proj, cfg.head_dim
    w_o = None if proj is None else proj.weight[:, head * hs : (head + 1) * hs]  # the head's columns of W_O
    softmax_row = _np(a.weights[head, i])
    used_row = _np(a.used[head, i])
    return CellWork(
        layer=layer, head=head, query=query, key=key, kv_head=g, n_heads=cfg.n_heads, kv_heads=cfg.kv_heads,
        head_dim=cfg.head_dim, norm=cfg.norm, norm_kind=cfg.norm_kind, parallel=cfg.parallel_residual,
        x_i=_np(work.x[i]), x_j=_np(work.x[j]), xn_i=_np(work.xn[i]), xn_j=_np(work.xn[j]),
        q_proj=_np(a.q_proj[head, i]), k_proj=_np(a.k_proj[g, j]), qk_norm=cfg.qk_norm,
        q_norm=_qk_step(model, layer, "q", a.q_proj[:, i], head), k_norm=_qk_step(model, layer, "k", a.k_proj[:, j], g),
        q_raw=_np(a.q_raw[head, i]), k_raw=_np(a.k_raw[g, j]), q=_np(q), k=_np(k),
        rotary=rope is not None, rope_base=cfg.rope_base(layer), rope_local=_local_rope(cfg, layer),
        rope_scaling=cfg.rope_scaled(layer) if rope else (),
        rotary_dims=cfg.rope_dim if rope else 0, rotary_fraction=cfg.rope_fraction if rope else 0.0,
        rope_cos_i=_np(rope[0][0]) if rope else None, rope_sin_i=_np(rope[1][0]) if rope else None,
        rope_cos_j=_np(rope[0][1]) if rope else None, rope_sin_j=_np(rope[1][1]) if rope else None,
        products=_np(products), dot=dot, scale=a.scale, scale_kind=cfg.attn_scale, scale_dim=_scale_dim(cfg),
        score=score, softcap=a.softcap, capped=capped,
        allowed=a.allowed[i].cpu().numpy(), masked=not bool(a.allowed[i, key]),
        scores_row=_np(row), row_max=float(row_max), exp_row=_np(exp_row), exp_sum=float(exp_row.sum()),
        softmax_row=softmax_row, weight=float(softmax_row[key]), used_row=used_row, used_weight=float(used_row[key]),
        row_source=_row_source(work.plan, head, query), v=_np(a.v[g]), weighted=_np(weighted),
        ablation=_ablation(work.plan, head), head_value=_np(a.values[head, i]), w_o=_np(w_o),
        head_out=_np(heads_out[head]), out_bias=_np(bias), heads_out=_np(heads_out), attn_out=_np(attn_out),
        attn_normed=_np(attn_normed),
        residual_after=_np(work.x[i] + (attn_out if attn_normed is None else attn_normed)),
    )


def _post_norm(block, attn_out: torch.Tensor) -> torch.Tensor | None:
    """The attention's output as it joins the residual stream in a block that normalises each branch's
    output (`Block.rest`: "sandwich", "post_branch"): post_norm1(attn_out). None in every other block,
    where attn_out joins it as it is."""
    if block.norm_mode not in ("sandwich", "post_branch"):
        return None
    with torch.inference_mode():
        return block.post_norm1(attn_out)


def _local_rope(cfg, layer: int) -> bool:
    """Whether layer `layer` rotates with the local layers' own base (Gemma 3's windowed layers)."""
    return cfg.rope_base(layer) is not None and cfg.local_rope_base is not None and bool(cfg.window(layer))


def _scale_dim(cfg) -> int | None:
    """d in the scale 1/√d: the model's query_scale_dim, else head_dim; None for unscaled scores."""
    if cfg.attn_scale == "none":
        return None
    return cfg.query_scale_dim or cfg.head_dim


def _qk_step(model: DecoderLM, layer: int, side: str, proj: torch.Tensor, head: int) -> QKNormStep | None:
    """The q/k norm of head `head`'s vector worked through (None without a q/k norm). side: "q" or "k";
    proj (heads, hs): the projections of every head at the position, which a norm over the whole
    position ("whole", OLMo 2) reads together."""
    cfg = model.cfg
    if cfg.qk_norm == "none":
        return None
    norm = getattr(model.blocks[layer].attn, f"{side}_norm")
    hs = cfg.head_dim
    x = proj.detach().double().cpu()
    x = x[head] if cfg.qk_norm == "head" else x.reshape(-1)  # what the norm reads: (hs,) or (heads * hs,)
    at = slice(0, hs) if cfg.qk_norm == "head" else slice(head * hs, (head + 1) * hs)  # this head's dimensions
    layer_norm = cfg.norm_kind == "layernorm"
    mean = float(x.mean()) if layer_norm else None
    centred = x - mean if layer_norm else x
    weight, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
    return QKNormStep(
        over=cfg.qk_norm, width=int(x.numel()), kind=cfg.norm_kind, eps=float(norm.eps), mean=mean,
        rms=float(torch.sqrt((centred * centred).mean() + norm.eps)),
        weight=None if weight is None else _np(weight[at]), offset=float(getattr(norm, "offset", 0.0)),
        bias=None if bias is None else _np(bias[at]), gain=float(cfg.qk_gain),
    )


def _value_weighted(model: DecoderLM, layer: int, work: _Layer) -> tuple[torch.Tensor, torch.Tensor]:
    """value_norms (H, T) = ‖v_j W_O,hᵀ‖ and value_weighted (H, T, T) = ‖a_ij v_j W_O,h‖, as used."""
    cfg, a = model.cfg, work.a
    H, hs = cfg.n_heads, cfg.head_dim
    v_all = per_query_head(a.v, H)  # (H, T, hs)
    attn = model.blocks[layer].attn
    if attn.proj is None:  # each head's value sits in its own dimensions of the output, unchanged
        norms = v_all.norm(dim=-1)  # (H, T)
    else:  # what the value becomes once W_O has mixed it into the residual's C dimensions
        w = attn.proj.weight.view(cfg.d_model, H, hs).permute(1, 2, 0)  # (H, hs, C)
        norms = (v_all @ w).norm(dim=-1)  # (H, T)
    vw = a.used.abs() * norms.unsqueeze(1)  # (H, T, T): query rows, key columns
    # an output ablation acts on each query row as on the values it weighs: a zeroed head moves nothing,
    # a mean-ablated one passes on the mean over queries in every row
    return norms, (vw if work.plan is None else work.plan.apply_to_outputs(vw))


def value_weighted(model: DecoderLM, ids, layer: int, intervention: Intervention | None = None,
                   forward: ForwardOutput | None = None, cache: KVCache | None = None, attention=None,
                   inputs: list[torch.Tensor] | None = None) -> np.ndarray:
    """‖a_ij · v_j W_O,h‖ for every head h, query i and key j of `layer`: (H, T, T) float64."""
    ids_t = _ids(ids, model)
    _check(model, ids_t.shape[1], layer, 0)
    work = _work(model, ids_t, layer, intervention, forward, cache, attention, None, inputs)
    with torch.inference_mode():
        return _np(_value_weighted(model, layer, work)[1])


def inside_head(model: DecoderLM, ids, layer: int, head: int, intervention: Intervention | None = None,
                forward: ForwardOutput | None = None, cache: KVCache | None = None, attention=None,
                inputs: list[torch.Tensor] | None = None) -> HeadWork:
    """Head `head` of layer `layer` as matrices for the forward over `ids` (`forward`, `cache`: as in
    `inside_cell`; from a cache every position is carried up through the layers below)."""
    ids_t = _ids(ids, model)
    _check(model, ids_t.shape[1], layer, head)
    work = _work(model, ids_t, layer, intervention, forward, cache, attention, None, inputs)
    g, a, plan = kv_head_of(model, head), work.a, work.plan
    with torch.inference_mode():
        norms, vw = _value_weighted(model, layer, work)
        scaled, capped = a.scaled[head], a.capped[head]  # (T, T), before the mask
    edited = plan.edited_rows(head) if plan is not None else []
    return HeadWork(
        layer=layer, head=head, kv_head=g, scale=a.scale, scale_kind=model.cfg.attn_scale,
        rotary=model.cfg.rope_base(layer) is not None, ablation=_ablation(plan, head), edited_rows=edited,
        q_proj=_np(a.q_proj[head]), k_proj=_np(a.k_proj[g]),
        q_raw=_np(a.q_raw[head]), k_raw=_np(a.k_raw[g]), q=_np(a.q[head]), k=_np(a.k[g]),
        v=_np(a.v[g]), raw=_np(a.raw[head]), scaled=_np(scaled), softcap=a.softcap, capped=_np(capped),
        allowed=a.allowed.cpu().numpy(),
        masked=_np(a.scores[head]), weights=_np(a.weights[head]), used=_np(a.used[head]),
        value_norms=_np(norms[head]), value_weighted=_np(vw[head]),
    )

