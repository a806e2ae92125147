"""lab.inside and the Inside panel on models with the 2024-26 families' options: the cell's JSON and download carry
the q/k norm, the soft-cap and the norm of the attention's output only where the model has them, each with a
formula that says what this layer does (its scale, its rotary base or none, the norm's width), the numbers are
model.inside's (whose own tests recompute them from the weights: tests/engine/test_inside_options.py), and the
panel's figures and table draw them."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest
import torch

from lab import inside
from lab.catalogue.models import ModelEntry
from lab.session import Session
from model.config import ModelConfig
from model.generate import Sampling
from model.inside import inside_cell, inside_head
from model.tokenizers import CharTokenizer
from model.transformer import DecoderLM
from ui.inside import N_FIGURES, draw_cell, draw_matrices

PROMPT = "abcabcahgfab"  # 12 tokens, and one generated: longer than the windows below
BASE = dict(block_size=16, n_layers=2, n_heads=4, d_model=16, pos_encoding="rope", norm_kind="rmsnorm", bias=False)
MODELS = {
    "plain": dict(norm_kind="layernorm", bias=True),
    "gemma2_like": dict(norm="sandwich", norm_offset=1.0, embed_scale=4.0, query_scale_dim=12, head_size=8,
                        attn_softcap=3.0, attn_window=(4, 0), activation="geglu", n_kv_heads=2),
    "gemma3_like": dict(norm="sandwich", norm_offset=1.0, qk_norm="head", local_rope_base=100.0,
                        rope_scaling=("linear", 4.0), attn_window=(4, 0), query_scale_dim=8, head_size=8),
    "olmo2_like": dict(norm="post_branch", qk_norm="whole", n_kv_heads=2, activation="swiglu"),
    "no_rope_layer": dict(rope_off_layers=(1,), head_size=6, activation="swiglu"),
    "unscaled_weightless": dict(attn_scale="none", qk_norm="head", norm_weight=False, qk_gain=1.2),
}
STEPS = ("q_proj", "k_proj", "qk_norm", "softcap", "capped", "attn_normed")  # keys only some models have


def own_session(name: str) -> Session:
    """A session on a random model of these options (weights large enough that attention is far from uniform)."""
    tok = CharTokenizer.train("abcdefgh|=")
    cfg = ModelConfig(vocab_size=tok.vocab_size, **{**BASE, **MODELS[name]})
    torch.manual_seed(0)
    model = DecoderLM(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1 and "norm" in pname and pname.endswith("weight"):
                p.copy_(torch.randn(p.shape) * 0.3 + (1.0 - cfg.norm_offset))
            else:
                p.normal_(0.0, 0.5)
    s = Session()
    s._add_model(ModelEntry("mine", model, tok, {"corpus": "text"}))
    s.step("mine", PROMPT, Sampling(temperature=0.0))
    return s


@pytest.fixture(scope="module", params=list(MODELS))
def session(request) -> tuple[str, Session]:
    return request.param, own_session(request.param)


def has(cfg: ModelConfig) -> dict[str, bool]:
    return {"norm": cfg.qk_norm != "none", "cap": cfg.attn_softcap is not None,
            "post": cfg.norm in ("sandwich", "post_branch")}


def test_the_cell_names_only_the_steps_the_model_has(session):
    name, s = session
    cfg = s.text.entry.model.cfg
    T = len(s.decoder.window)
    present = has(cfg)
    for layer in range(cfg.n_layers):
        data = inside.cell(s.text, s.heads.settings, layer, 1, T - 1, 2)
        json.dumps(data, allow_nan=False)
        f = data["formulas"]
        assert ("q_norm" in f) == ("k_norm" in f) == ("q_proj" in f) == ("qk_norm" in data) == present["norm"]
        assert ("capped" in f) == ("capped" in data) == ("softcap" in data) == present["cap"]
        assert ("attn_normed" in f) == ("attn_normed" in data) == present["post"]
        text = " ".join(f.values())
        assert ("tanh" in text) == present["cap"] and ("q/k norm" in text) == present["norm"]
        assert ("post_norm1" in text) == present["post"]
        if present["post"]:
            assert f["residual_after"].startswith("x_i + post_norm1(")
        # the numbers are model.inside's for this window (the engine's tests recompute those from the weights)
        w = inside_cell(s.text.entry.model, s.decoder.window, layer, 1, T - 1, 2)
        for key in ("q_raw", "k_raw", "q", "k", "scores_row", "softmax_row", "attn_out", "residual_after"):
            got = np.array([np.nan if x is None else x for x in np.ravel(data[key])], dtype=float)
            assert np.allclose(np.nan_to_num(got, nan=-np.inf), np.ravel(getattr(w, key)), atol=1e-5), key
        if present["norm"]:
            assert np.allclose(data["q_proj"], w.q_proj, atol=1e-5)
            assert data["qk_norm"]["query"]["rms"] == pytest.approx(w.q_norm.rms, rel=1e-5)
            assert data["qk_norm"]["over"] == cfg.qk_norm and data["qk_norm"]["offset"] == cfg.norm_offset
        if present["cap"]:
            assert data["capped"] == pytest.approx(w.capped, rel=1e-5)
            assert data["capped"] == pytest.approx(3.0 * math.tanh(data["score"] / 3.0), rel=1e-6)
        if present["post"]:
            assert np.allclose(data["attn_normed"], w.attn_normed, atol=1e-5)
            assert np.allclose(data["residual_after"], np.add(data["x_i"], data["attn_normed"]), atol=1e-5)


@pytest.mark.parametrize("name, layer, says, never", [
    ("plain", 0, ["1/√d_head = 1/√4", "base 10000", "LayerNorm(x_i)"], ["query_pre_attn_scalar", "local"]),
    ("gemma2_like", 0, ["1/√query_pre_attn_scalar = 1/√12", "not the head width 8", "c = 3",
                        "RMSNorm·(1 + w)(x_i)", "x_i: the residual stream entering this layer at the query token (here the token's "
                        "embedding × 4"], ["1/√d_head"]),
    ("gemma2_like", 1, ["1/√12", "its output is normalised again after the attention"], ["embedding × 4"]),
    ("gemma3_like", 0, ["base 100 (this local layer's own base)", "q_i = p_i / rms(p_i) · (1 + w_q)",
                        "over this head's 8 dimensions", "1/√8"], ["÷ 4"]),
    ("gemma3_like", 1, ["base 10000", "each frequency ÷ 4 (linear scaling)"], ["local layer"]),
    ("olmo2_like", 0, ["over all 4 query heads of the position at once (4·4 = 16 numbers)",
                       "over all 2 key heads of the position at once (2·4 = 8 numbers)", "x̂_i = x_i (this block "
                       "normalises what each branch writes"], ["(1 + w"]),
    ("no_rope_layer", 1, ["this layer does not rotate", "1/√6"], ["R(i)"]),
    ("no_rope_layer", 0, ["first 6 dimensions"], ["does not rotate"]),
    ("unscaled_weightless", 0, ["scale = 1 (this model does not scale its scores)", "q_i = p_i / rms(p_i) × 1.2",
                                "RMSNorm (no weight)(x_i)"], ["w_q", "tanh"]),
])
def test_each_formula_describes_this_layers_step(name, layer, says, never):
    s = own_session(name)
    f = inside.cell(s.text, s.heads.settings, layer, 0, len(s.decoder.window) - 1, 1)["formulas"]
    text = " | ".join(f.values())
    for phrase in says:
        assert phrase in text, (phrase, text)
    for phrase in never:
        assert phrase not in text, (phrase, text)
    facts = inside._facts(s.text, layer)
    assert facts["head_dim"] == s.text.entry.model.cfg.head_dim and facts["attn_dim"] == 4 * facts["head_dim"]


def test_the_download_and_the_head_carry_the_steps_present(session):
    name, s = session
    cfg, T = s.text.entry.model.cfg, len(s.decoder.window)
    present = has(cfg)
    exp = inside.cell_export(s.text, s.heads.settings, 1, 2, T - 1, 3)
    quantities = {row["quantity"] for row in csv.DictReader(io.StringIO(exp.csv))}
    assert {"q_rms", "k_rms", "q_proj", "k_proj"} <= quantities if present["norm"] else "q_rms" not in quantities
    assert ("q_norm_multiplier" in quantities) == (present["norm"] and cfg.norm_weight)
    assert ("capped" in quantities) == present["cap"] and ("attn_normed" in quantities) == present["post"]
    json.loads(exp.json_text())
    h = inside.head(s.text, s.heads.settings, 1, 2)
    w = inside_head(s.text.entry.model, s.decoder.window, 1, 2)
    assert ("capped" in h) == ("softcap" in h) == present["cap"] and ("q_proj" in h) == present["norm"]
    if present["cap"]:
        assert np.allclose(h["capped"], w.capped, atol=1e-5)
    if present["norm"]:
        assert np.allclose(h["q_proj"], w.q_proj, atol=1e-5) and np.allclose(h["k_proj"], w.k_proj, atol=1e-5)
    assert np.shape(h["q"]) == (T, cfg.head_dim)


def test_the_panel_draws_every_step(session):
    name, s = session
    cfg, T = s.text.entry.model.cfg, len(s.decoder.window)
    present = has(cfg)
    data = inside.cell(s.text, s.heads.settings, 0, 3, T - 1, 1)
    header, table, *rest = draw_cell(s, 0, 3, T - 1, 1)
    figs = [json.loads(p.plot) for p in rest[:N_FIGURES]]
    assert rest[N_FIGURES:] == [0, 3, T - 1, 1]
    qk = figs[1]
    rows = qk["layout"]["meta"]["rows"]
    assert any("(projection)" in r for r in rows) == present["norm"]
    assert any("w_q (the norm" in r for r in rows) == (present["norm"] and cfg.norm_weight)
    assert ("q/k norm" in qk["layout"]["title"]["text"].replace("<br>", " ")) == present["norm"]
    assert len(rows) == (2 + 2 * (cfg.norm_weight and present["norm"]) + 2 * present["norm"]
                         + 2 * (cfg.rope_base(0) is not None))
    products = figs[2]["layout"]
    assert ("tanh" in json.dumps(products["title"], ensure_ascii=False)) == present["cap"]
    assert products["meta"]["capped"] == data.get("capped")
    assert ("| capped s_ij |" in table) == present["cap"] and ("‖post_norm1(a_i)‖" in table) == present["post"]
    assert ("rms(p_" in table) == present["norm"]
    if present["cap"]:
        assert f"= {data['capped']:.4f}" in table
    matrices = json.loads(draw_matrices(s, 0, 3, T - 1, 1).plot)
    titles = [a["text"] for a in matrices["layout"]["annotations"]]
    assert any("tanh" in t for t in titles) == present["cap"]
    assert "1/√" in titles[4] or cfg.attn_scale == "none"
