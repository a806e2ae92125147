"""Direct logit attribution (model/circuits_dla.py, through model/circuits.py) against a float64 reference.

The reference runs the float64 forward written out by hand (tests/support/patch_reference.reference: every
head's output, every branch, the residual stream, no engine code) and applies the definition term by term:
each head's o_h W_O^h, each MLP's output, the token embedding and the position pass through the branch's
output norm (sandwich, post_branch) frozen at its own forward scale, then the final norm frozen at the final
stream's scale (each part centred on its own for LayerNorm), then dot the unembedding difference; biases and
the soft-cap's share make the remainder. The decomposition must add up: sum + remainder == actual, to 1e-10
on float64 models and to 1e-5 against the float32 forward's own logits, also for nanochat's x0 mix, backout,
smear and value embeddings, which the reference does not write out.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.circuits import direct_logit_attribution, stream_coefficients
from model.transformer import KVCache
from tests.support.circuits_ref import CONFIGS, frozen, make, w64
from tests.support.patch_reference import one_thread, reference  # noqa: F401 (fixture)

TOL = 1e-6
IDS = [3, 7, 1, 12, 7, 0, 5, 9]
NAMES = list(CONFIGS) + ["no-proj", "no-norm"]
NANOCHAT = dict(pos_encoding="rope", norm_kind="rmsnorm", norm_weight=False, bias=False, activation="relu2",
                x0_mix=True, backout_layer=1, smear_width=4, embed_norm=True, value_embed_layers=(0, 2),
                value_gate_width=4, qk_gain=1.2, qk_norm="head")


def build(name, dtype=torch.float64):
    extra = {"no-proj": dict(attn_out_proj=False), "no-norm": dict(norm="none")}.get(name, {})
    return make("gpt2" if name in ("no-proj", "no-norm") else name, dtype, **extra)


def run(model, ids, **kw):
    with torch.no_grad():
        return model(torch.tensor([ids]), record=True, **kw)


@torch.no_grad()
def reference_dla(model, ids, t, answer, other=None):
    """The definition, term by term, on the hand-written float64 forward."""
    cfg = model.cfg
    logits, acts = reference(model, ids)
    H, hs, eps = cfg.n_heads, cfg.head_dim, cfg.norm_eps
    W_U = w64(model.head.weight)
    u = W_U[answer] - (0 if other is None else W_U[other])
    fin, fin_bias = frozen(model.norm_f if cfg.has_final_norm else None, acts["resid"][-1][t], eps)

    def direct(c):
        return float(fin(c) @ u)

    heads, mlps = np.zeros((cfg.n_layers, H)), np.zeros(cfg.n_layers)
    biases = {}
    for layer, blk in enumerate(model.blocks):
        proj = blk.attn.proj
        parts = []
        for h in range(H):
            o = acts["head"][layer][h][t]
            parts.append(o @ w64(proj.weight)[:, h * hs : (h + 1) * hs].T if proj is not None
                         else torch.cat([torch.zeros(h * hs), o, torch.zeros((H - h - 1) * hs)]).double())
        b_o = w64(proj.bias) if proj is not None and proj.bias is not None else None
        a = sum(parts) + (0 if b_o is None else b_o)
        post, post_bias = (lambda c: c), None
        if cfg.norm in ("sandwich", "post_branch"):
            post, post_bias = frozen(blk.post_norm1, a, eps)
            if post_bias is not None:
                biases[f"post_attn_norm L{layer}"] = direct(post_bias)
        heads[layer] = [direct(post(c)) for c in parts]
        if b_o is not None:
            biases[f"attn_out L{layer}"] = direct(post(b_o))
        m = acts["mlp"][layer][t]
        b2 = getattr(getattr(blk, "post_norm2", None), "bias", None)
        if b2 is not None:
            m = m - w64(b2)
            biases[f"post_mlp_norm L{layer}"] = direct(w64(b2))
        mlps[layer] = direct(m)
    embedding = {"token": direct(w64(model.tok_emb.weight)[ids[t]] * cfg.embed_scale), "position": 0.0}
    if cfg.pos_encoding == "learned":
        embedding["position"] = direct(w64(model.pos_emb.weight)[t])
    elif cfg.pos_encoding == "sinusoidal":
        embedding["position"] = direct(w64(model.pe_table)[t])
    biases["final_norm"] = 0.0 if fin_bias is None else float(fin_bias @ u)
    b = w64(model.head.bias) if model.head.bias is not None else torch.zeros(cfg.vocab_size, dtype=torch.float64)
    biases["head"] = float(b[answer] - (0 if other is None else b[other]))
    x = acts["resid"][-1][t]
    uncapped = float((fin(x) + (0 if fin_bias is None else fin_bias)) @ u) + biases["head"]
    actual = float(logits[t, answer] - (0 if other is None else logits[t, other]))
    return dict(heads=heads, mlps=mlps, embedding=embedding, biases=biases, uncapped=uncapped, actual=actual,
                cap=actual - uncapped)


@pytest.mark.parametrize("name", NAMES)
def test_every_term_equals_the_definition_on_float64_models(name):
    model = build(name)
    out = run(model, IDS)
    for t, answer, other in ((7, 4, 11), (3, 2, None), (0, 19, 0)):
        got = direct_logit_attribution(model, out, t, answer, other)
        want = reference_dla(model, IDS, t, answer, other)
        assert np.abs(got.heads - want["heads"]).max() < TOL
        assert np.abs(got.mlps - want["mlps"]).max() < TOL
        assert got.embedding.keys() == want["embedding"].keys()
        assert all(abs(got.embedding[k] - v) < TOL for k, v in want["embedding"].items())
        assert got.biases.keys() == want["biases"].keys()
        assert all(abs(got.biases[k] - v) < TOL for k, v in want["biases"].items())
        for key in ("uncapped", "actual", "cap"):
            assert abs(getattr(got, key) - want[key]) < TOL, key
        # the decomposition adds up, in the model's own float64
        assert abs(got.direct_sum + got.remainder - got.actual) < 1e-10
        assert abs(got.direct_sum - (got.heads.sum() + got.mlps.sum() + sum(got.embedding.values()))) < 1e-12
        assert got.mlp_layers == (0, 1, 2) and got.coefficients == (1.0, 1.0, 1.0, 1.0)
        assert (got.cap != 0.0) == (model.cfg.logit_softcap is not None)


@pytest.mark.parametrize("name", NAMES + ["nanochat"])
def test_sum_and_remainder_equal_the_float32_forwards_logit_difference(name):
    model = make("gpt2", torch.float32, **NANOCHAT) if name == "nanochat" else build(name, torch.float32)
    out = run(model, IDS)
    for t in range(len(IDS)):
        got = direct_logit_attribution(model, out, t, 4, 11)
        forward = float(out.logits[0, t, 4] - out.logits[0, t, 11])
        assert abs(got.direct_sum + got.remainder - forward) < 1e-5
        assert abs(got.actual - forward) < 1e-5


def test_nanochat_parts_enter_the_final_stream_with_their_coefficients():
    # the x0 mix and the backout make the final stream a fixed combination of the parts: the coefficients
    # rebuild the forward's own last residual from the recorded embedding and branches
    model = make("gpt2", torch.float64, **NANOCHAT)
    with torch.no_grad():
        for block in model.blocks:
            block.resid_lambda.fill_(0.7)
            block.x0_lambda.fill_(0.4)
        model.backout_lambda.fill_(0.3)
    out = run(model, IDS)
    acts = out.activations
    coef = stream_coefficients(model)
    rebuilt = coef[0] * acts.residuals[0] + sum(c * (acts.attn[i] + acts.mlp[i]) for i, c in enumerate(coef[1:]))
    assert torch.allclose(rebuilt, acts.residuals[-1], atol=1e-12, rtol=0)
    assert coef != [1.0] * 4
    for t in (0, 5, 7):
        got = direct_logit_attribution(model, out, t, 2, 9)
        assert abs(got.direct_sum + got.remainder - got.actual) < 1e-10
        assert list(got.embedding) == ["embedding"] and got.biases.keys() == {"final_norm", "head"}


def test_a_cached_call_a_last_only_forward_and_a_batch_row_give_the_same_terms():
    model = build("gpt2")  # learned positions: a cached call's tokens sit after the cache
    full = direct_logit_attribution(model, run(model, IDS), 6, 4, 11)
    with torch.no_grad():
        cache = model(torch.tensor([IDS[:3]]), cache=KVCache([])).cache
        later = model(torch.tensor([IDS[3:7]]), cache=cache, record=True)
    cached = direct_logit_attribution(model, later, 3, 4, 11)
    last = direct_logit_attribution(model, run(model, IDS[:7], logits="last"), -1, 4, 11)
    with torch.no_grad():
        batch = model(torch.tensor([IDS[1:8], IDS[:7]]), record=True)
    row = direct_logit_attribution(model, batch, 6, 4, 11, row=1)
    for other in (cached, last, row):
        assert np.abs(other.heads - full.heads).max() < 1e-9 and np.abs(other.mlps - full.mlps).max() < 1e-9
        assert all(abs(other.embedding[k] - v) < 1e-9 for k, v in full.embedding.items())
        assert abs(other.actual - full.actual) < 1e-9 and other.position in (3, 6)
    assert full.embedding["position"] != 0.0


def test_one_logit_and_the_scales_reported():
    model = build("sandwich-ln")
    out = run(model, IDS)
    got = direct_logit_attribution(model, out, 5, 7)
    x = out.activations.residuals[-1][0, 5]
    assert abs(got.scale - float(torch.sqrt(((x - x.mean()) ** 2).mean() + 1e-5))) < 1e-12
    assert got.branch_scales.shape == (3, 2) and (got.branch_scales > 0).all()
    assert abs(got.direct_sum + got.remainder - float(reference(model, IDS)[0][5, 7])) < 1e-10
    assert direct_logit_attribution(build("gpt2"), run(build("gpt2"), IDS), 2, 1).branch_scales is None


def test_refusals_say_why():
    model = build("gpt2")
    with torch.no_grad():
        plain = model(torch.tensor([IDS]))
    with pytest.raises(ValueError, match="record=True"):
        direct_logit_attribution(model, plain, 0, 1)
    out = run(model, IDS)
    with pytest.raises(ValueError, match="position must be"):
        direct_logit_attribution(model, out, 8, 1)
    with pytest.raises(ValueError, match="token ids"):
        direct_logit_attribution(model, out, 0, 1, 20)
    with pytest.raises(ValueError, match="row must be"):
        direct_logit_attribution(model, out, 0, 1, row=1)
    post = make("gpt2", norm="post")
    with pytest.raises(ValueError, match=r"post-norm models \(norm='post'\)"):
        direct_logit_attribution(post, run(post, IDS), 0, 1)
