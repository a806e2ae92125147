"""Head composition, OV and QK circuits (model/circuits.py) against dense float64 definitions.

Each score is checked against the definition written out with explicit matrices (tests/support/circuits_ref.py):
W_OV = W_V W_O and W_QK = W_Q W_Kᵀ as C × C matrices, the composition scores ||A B||_F / (||A||_F ||B||_F)
(Elhage et al. 2021), the OV circuit as the full vocabulary × vocabulary matrix with numpy's eigenvalues, and
the QK circuit as token × token products, on GPT-2-, NeoX-, Llama- (grouped keys), sandwich- and
post-branch-like random float64 models, with the norms folded and without.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch

from model.circuits import composition_scores, copying_scores, ov_circuit, qk_circuit
from tests.support.circuits_ref import CONFIGS, dense_heads, make, norm_matrix, rotate, w64
from tests.support.patch_reference import one_thread  # noqa: F401 (fixture)

TOL = 1e-6
NAMES = list(CONFIGS) + ["no-proj"]


def build(name):
    return make("gpt2", attn_out_proj=False) if name == "no-proj" else make(name)


def fro(m):
    return float(torch.linalg.matrix_norm(m))


@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_composition_scores_equal_the_dense_definition(name, fold):
    model = build(name)
    got = composition_scores(model, fold=fold)
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    heads = [dense_heads(model, layer, fold) for layer in range(L)]
    for l1 in range(L):
        for l2 in range(L):
            if l2 <= l1:  # only a later layer can read what an earlier one wrote
                assert np.isnan(got.q[l1, :, l2]).all() and np.isnan(got.v[l1, :, l2]).all()
                continue
            for i in range(H):
                ov = heads[l1]["v"][i] @ heads[l1]["o"][i]  # (C, C)
                for j in range(H):
                    qk = heads[l2]["q"][j] @ heads[l2]["k"][j].T
                    ov2 = heads[l2]["v"][j] @ heads[l2]["o"][j]
                    want = {"q": fro(ov @ qk) / (fro(ov) * fro(qk)), "k": fro(ov @ qk.T) / (fro(ov) * fro(qk)),
                            "v": fro(ov @ ov2) / (fro(ov) * fro(ov2))}
                    for kind, value in want.items():
                        assert abs(got.of(kind)[l1, i, l2, j] - value) < TOL, (kind, l1, i, l2, j)
    assert got.done == got.total == L and not got.stopped and got.folded == fold


def test_composition_on_grouped_keys_uses_each_query_heads_own_key_value_head():
    # query heads 0, 1 share key/value head 0: their K- and V-composition with an earlier head differ only
    # through their queries (K) or outputs (V), and a query head of the other group reads other keys
    model = make("llama")
    got = composition_scores(model)
    heads = dense_heads(model, 1, True)
    assert torch.equal(heads["k"][0], heads["k"][1]) and not torch.equal(heads["k"][1], heads["k"][2])
    assert len({round(float(x), 9) for x in got.k[0, 0, 1]}) == 4  # four distinct query heads, four scores


def test_composition_top_pairs_progress_and_stop():
    model = make("gpt2")
    seen = []
    got = composition_scores(model, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 3), (2, 3), (3, 3)]
    top = got.top("k", 5)
    assert [t[-1] for t in top] == sorted((t[-1] for t in top), reverse=True)
    l1, i, l2, j, s = top[0]
    assert l1 < l2 and s == np.nanmax(got.k)
    stop = threading.Event()
    partial = composition_scores(model, progress=lambda done, total: stop.set(), stop=stop)
    assert partial.stopped and partial.done == 1 and np.isnan(partial.q).all()  # layer 0 reads nothing earlier
    with pytest.raises(ValueError, match="one of q, k, v"):
        got.of("x")


def full_ov(model, layer, head, fold):
    """W_E (times embed_scale) W_V W_O W_U over the used vocabulary, the final norm folded: (V, V)."""
    cfg = model.cfg
    n = cfg.vocab_used or cfg.vocab_size
    h = dense_heads(model, layer, fold)
    final = norm_matrix(model.norm_f, cfg.d_model) if fold else torch.eye(cfg.d_model, dtype=torch.float64)
    e = w64(model.tok_emb.weight)[:n] * cfg.embed_scale
    return e @ h["v"][head] @ h["o"][head] @ final @ w64(model.head.weight)[:n].T


@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_ov_circuit_copying_score_and_top_tokens_equal_the_full_matrix(name, fold):
    model = build(name)
    inputs = [0, 3, 11, 16]
    scores = copying_scores(model, fold=fold)
    for layer, head in ((0, 0), (1, 3), (2, 1)):
        got = ov_circuit(model, layer, head, inputs=inputs, top_k=4, fold=fold)
        full = full_ov(model, layer, head, fold).numpy()
        lam = np.linalg.eigvals(full)  # the whole vocabulary's spectrum, zeros included
        want = lam.real.sum() / np.abs(lam).sum()
        assert abs(got.copying - want) < TOL and abs(scores[layer, head] - want) < TOL
        # the small factor's spectrum is the full one's nonzero part
        big = np.sort_complex(lam[np.abs(lam) > 1e-9 * np.abs(lam).max()])
        assert np.allclose(np.sort_complex(got.eigenvalues[np.abs(got.eigenvalues) > 1e-9 * np.abs(lam).max()]),
                           big, atol=TOL)
        for r, a in enumerate(inputs):
            row = full[a]
            order = np.argsort(-row, kind="stable")[:4]
            assert list(got.top_ids[r]) == list(order)
            assert np.allclose(got.top_values[r], row[order], atol=TOL)
            assert abs(got.own_value[r] - row[a]) < TOL and got.own_rank[r] == int((row > row[a]).sum())


def test_ov_circuit_refuses_what_it_cannot_read():
    model = make("sandwich-ln")  # vocab_used 17: the padding rows are no tokens
    with pytest.raises(ValueError, match="from 0 to 16"):
        ov_circuit(model, 0, 0, inputs=[18])
    with pytest.raises(ValueError, match="head must be"):
        ov_circuit(model, 0, 4)
    whole_ln = make("post-branch", norm_kind="layernorm", bias=False)  # one LayerNorm over every head's queries
    with pytest.raises(ValueError, match="centres across heads"):
        composition_scores(whole_ln)
    assert np.isfinite(composition_scores(whole_ln, fold=False).q[0, 0, 1]).all()  # the raw weights are per head


def qk_reference(model, layer, head, tokens, fold):
    cfg = model.cfg
    T, hs = len(tokens), cfg.head_dim
    h = dense_heads(model, layer, fold)
    x = w64(model.tok_emb.weight)[tokens] * cfg.embed_scale
    scale = 1 / math.sqrt(hs)

    def scores(x_q, x_k, turn=False):
        q, k = x_q @ h["q"][head], x_k @ h["k"][head]
        if turn:
            cos, sin = w64(model.rope_cos)[:T], w64(model.rope_sin)[:T]
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        return (q @ k.T * scale).numpy()

    plain = scores(x, x)
    if cfg.pos_encoding == "learned":
        xp = x + w64(model.pos_emb.weight)[:T]
        return plain, scores(xp, xp)
    if cfg.pos_encoding == "sinusoidal":
        xp = x + w64(model.pe_table)[:T]
        return plain, scores(xp, xp)
    return plain, scores(x, x, turn=True)


@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_qk_circuit_equals_the_token_by_token_products(name, fold):
    model = build(name)
    tokens = [5, 1, 5, 9, 2, 5, 7]
    for layer, head in ((0, 1), (2, 3)):
        got = qk_circuit(model, layer, head, tokens, fold=fold)
        plain, positional = qk_reference(model, layer, head, tokens, fold)
        assert np.abs(got.plain - plain).max() < TOL and np.abs(got.positional - positional).max() < TOL
        assert got.positions == model.cfg.pos_encoding
        assert got.allowed.tolist() == np.tril(np.ones((7, 7), dtype=bool)).tolist()
        # the same token as key gives the same plain score wherever it stands
        assert abs(got.plain[1, 0] - got.plain[1, 2]) < 1e-12


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_qk_circuit_of_layer_0_is_the_models_own_scores_where_it_reads_the_embedding_directly(pos):
    # no norms, no biases: layer 0's queries and keys are linear in the embedding (plus positions), so the
    # positional circuit is exactly the scores the forward computed before its softmax
    model = make("gpt2", pos_encoding=pos, norm="none", bias=False, tie_weights=False)
    tokens = [3, 8, 3, 12, 0, 6]
    with torch.no_grad():
        out = model(torch.tensor([tokens]), return_attention=True)
    for head in range(4):
        got = qk_circuit(model, 0, head, tokens)
        seen = out.scores[0][0, head].double().numpy()
        assert np.abs(np.where(got.allowed, got.positional - seen, 0.0)).max() < 1e-5  # scores come back in float32
        assert np.isneginf(seen[~got.allowed]).all()


def test_qk_circuit_window_and_refusals():
    model = make("llama", attn_window=(3, 0, 0))
    got = qk_circuit(model, 0, 0, [1, 2, 3, 4, 5])
    assert not got.allowed[4, 1] and got.allowed[4, 2] and not got.allowed[0, 1]
    with pytest.raises(ValueError, match="1 to 16 tokens"):
        qk_circuit(model, 0, 0, [])
    with pytest.raises(ValueError, match="token ids"):
        qk_circuit(model, 0, 0, [1, 20])
    with pytest.raises(ValueError, match="layer must be"):
        qk_circuit(model, 3, 0, [1])
    nope = make("llama", rope_off_layers=(1,))
    assert qk_circuit(nope, 1, 0, [1, 2]).positions == "none"
