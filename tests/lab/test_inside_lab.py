"""lab.inside: one cell of a person's text, worked through, with the head tools' settings and the window;
its formulas, its numbers download, its refusals (a sentence, nothing changed); and the article's
worked example on the article toy model."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest
import torch

from lab import inside
from lab.checks import UserError
from lab.headsettings import window_intervention
from lab.session import Session
from model.generate import Sampling
from tests.support.inside_ref import embed, reference

GRAMMAR, SHAKESPEARE, TOY = "grammar (built-in)", "shakespeare (built-in)", "article toy (built-in)"
LONG = "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo? Deny thy father and refuse thy name"[:64]
P = "anna found the key . she gave it to tom because he"
REL = 2e-5


def stepped(model=GRAMMAR, prompt=P, steps=1) -> Session:
    s = Session()
    for _ in range(steps):
        s.step(model, prompt, Sampling(temperature=0.0))
    return s


def close(got, want, what="", rel=REL):
    got = np.array([np.nan if g is None else g for g in np.ravel(np.asarray(got, dtype=object))], dtype=np.float64)
    want = np.ravel(np.asarray(want, dtype=np.float64))
    want = np.where(np.isinf(want), np.nan, want)  # a masked -inf is None (null) in the lists
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: masked entries differ"
    g, w = np.nan_to_num(got), np.nan_to_num(want)
    bound = rel * max(1.0, float(np.abs(w).max(initial=0.0)))
    assert np.abs(g - w).max(initial=0.0) <= bound, f"{what}: differs by {np.abs(g - w).max():.3g}"


def check_against_reference(s: Session, data: dict) -> None:
    """The cell's lists are the float64 path's numbers for the text's window and settings."""
    iv = window_intervention(s.text, s.heads.settings)
    ref = reference(s.text.entry.model, s.decoder.window, iv)[data["layer"]]
    h, i, j = data["head"], data["query"], data["key"]
    for name, want in (("x_i", ref.x[i]), ("xn_j", ref.xn[j]), ("q", ref.q[h, i]), ("k", ref.k[h, j]),
                       ("products", ref.q[h, i] * ref.k[h, j]), ("scores_row", ref.scores[h, i]),
                       ("softmax_row", ref.weights[h, i]), ("used_row", ref.used[h, i]), ("v", ref.v[h]),
                       ("head_value", ref.values[h, i]), ("head_out", ref.heads_out[h, i]),
                       ("attn_out", ref.attn_out[i]), ("residual_after", ref.x[i] + ref.attn_out[i])):
        close(data[name], want, name)
    close(data["weight"], ref.weights[h, i, j], "weight")
    close([o["vector"] for o in data["heads_out"]], ref.heads_out[:, i], "heads_out")


def test_a_cell_of_the_text_is_the_models_arithmetic():
    s = stepped()
    data = inside.cell(s.text, s.heads.settings, 1, 0, 11, 9)
    assert (data["query_token"], data["key_token"], round(data["weight"], 3)) == ("he", "tom", 0.756)
    assert data["tokens"] == [p for p, _ in s.tokens()] and data["head_label"] == "L1H0"
    assert data["active"] == {"changed": False, "what": "nothing changed", "ablation": None, "row_source": "softmax"}
    assert data["products_order"] == sorted(range(24), key=lambda d: -data["products"][d])
    assert set(data["formulas"]) >= set(inside.VECTORS + inside.ROWS) | {"dot", "scale", "score", "exp_sum", "v"}
    assert data["formulas"]["q_raw"] == "q_i = W_Q · x̂_i + b_Q" and "1/√24" in data["formulas"]["scale"]
    check_against_reference(s, data)
    json.dumps(data, allow_nan=False)  # JSON as it is: masked scores are null, not -inf


def test_defaults_follow_the_selected_token_and_its_strongest_key():
    s = stepped()
    s.select(11)
    data = inside.cell(s.text, s.heads.settings, 1, 0)
    assert data["query"] == 11 and data["key"] == int(np.argmax(data["used_row"])) == 9
    s.select_last()
    assert inside.cell(s.text, s.heads.settings, 1, 0)["query"] == len(s.decoder.window) - 1


def test_the_window_of_a_long_text_and_a_grown_text():
    s = stepped(SHAKESPEARE, LONG, steps=2)  # 66 tokens > the context of 64: the window slides
    assert s.decoder.start == 2
    data = inside.cell(s.text, s.heads.settings, 1, 3, 63, 40)
    assert len(data["tokens"]) == 64 and data["text_offset"] == 2
    check_against_reference(s, data)
    g = stepped()
    before = inside.cell(g.text, g.heads.settings, 2, 1, 3, 1)
    g.step(GRAMMAR, P, Sampling(temperature=0.0))  # the kept forward is for the old text: not reused
    after = inside.cell(g.text, g.heads.settings, 2, 1, 3, 1)
    assert len(after["tokens"]) == len(before["tokens"]) + 1
    check_against_reference(g, after)


@pytest.mark.parametrize("how", ["zero", "mean", "uniform", "edit"])
def test_the_head_tools_settings_are_applied_and_said(how):
    s = stepped()
    s.select(11)
    if how == "edit":
        s.heads.edit_selected("L1H0", "3")
    else:
        s.heads.set_ablation(["L1H0", "L0H2"], how, False)
    data = inside.cell(s.text, s.heads.settings, 1, 0, 11, 9)
    assert data["active"]["changed"] and data["active"]["what"] == s.heads.settings.describe(
        [p for p, _ in s.tokens()], s.decoder.start)
    if how == "edit":
        assert data["active"]["row_source"] == "edit: key 3" and data["used_row"][3] == 1.0
    else:
        assert data["active"]["ablation"] == how
    if how == "zero":
        assert not any(data["head_value"]) and not any(data["head_out"])
    check_against_reference(s, data)
    h = inside.head(s.text, s.heads.settings, 1, 0)  # the head's matrices under the same settings
    ref = reference(s.text.entry.model, s.decoder.window, window_intervention(s.text, s.heads.settings))[1]
    close(h["used"], ref.used[0], "rows used")
    if how == "zero":  # a zeroed head moves nothing, whatever its weights
        assert not np.any(h["value_weighted"])
    assert h["active"]["edited_rows"] == ([11] if how == "edit" else [])
    s.heads.clear_probe()
    assert not inside.cell(s.text, s.heads.settings, 1, 0, 11, 9)["active"]["changed"]


def test_the_head_as_matrices_and_value_weighted_attention():
    s = stepped()
    h = inside.head(s.text, s.heads.settings, 1, 0)
    ref = reference(s.text.entry.model, s.decoder.window)[1]
    for name, want in (("q", ref.q[0]), ("k", ref.k[0]), ("v", ref.v[0]), ("raw", ref.raw[0]),
                       ("scaled", ref.raw[0] * ref.scale), ("masked", ref.scores[0]), ("weights", ref.weights[0])):
        close(h[name], want, name)
    w_o = s.text.entry.model.blocks[1].attn.proj.weight.detach().double().numpy()[:, :24]
    norms = np.linalg.norm(ref.v[0] @ w_o.T, axis=-1)
    close(h["value_weighted"], ref.weights[0] * norms[None, :], "value-weighted")
    layer = inside.layer_value_weighted(s.text, s.heads.settings, 1)
    close(layer["value_weighted"][0], h["value_weighted"], "layer's value-weighted")
    assert np.shape(layer["value_weighted"]) == (4, 13, 13)


@pytest.mark.parametrize("args, sentence", [
    ((3, 0, 11, 9), "layer must be a whole number between 0 and 2"),
    ((1, 4, 11, 9), "head must be a whole number between 0 and 3"),
    ((1, "x", 11, 9), "head must be a whole number"),
    ((1, 0, 13, 9), "token position must be a whole number between 0 and 12"),
    ((1, 0, 11, 13), "key position must be a whole number between 0 and 12"),
    ((1, 0, 11, [1]), "key position must be a whole number"),
    ((None, 0, 11, 9), "layer must be a whole number"),
])
def test_bad_values_are_refused_with_a_sentence_and_change_nothing(args, sentence):
    s = stepped()
    s.select(5)
    probe, window = s.heads.settings, list(s.decoder.window)
    with pytest.raises(UserError, match=sentence):
        inside.cell(s.text, s.heads.settings, *args)
    assert s.heads.settings is probe and s.decoder.window == window and s.text.query == 5
    with pytest.raises(UserError, match="Press Step first"):
        inside.cell(Session().text, s.heads.settings, 0, 0)


def test_the_numbers_download_holds_q_k_v_and_the_row():
    s = stepped()
    e = inside.cell_export(s.text, s.heads.settings, 1, 0, 11, 9)
    assert e.name == "grammar_L1H0_q11k9_inside"
    assert e.json == inside.cell(s.text, s.heads.settings, 1, 0, 11, 9)
    rows = list(csv.DictReader(io.StringIO(e.csv)))
    assert list(rows[0]) == inside.CSV_COLUMNS
    by = {}
    for r in rows:
        by.setdefault(r["quantity"], []).append(r)
    for name in ("q", "k", "softmax_row", "scores_row", "weighted", "head_out"):
        values = [float(r["value"]) if r["value"] else -math.inf for r in by[name]]
        assert values == [-math.inf if v is None else v for v in e.json[name]], name  # exact: full precision
        assert by[name][0]["formula"] == e.json["formulas"][name]
    assert [r["token"] for r in by["softmax_row"]] == e.json["tokens"]
    assert len(by["v"]) == 13 * 24 and by["v"][24]["index"] == "1,0"
    assert float(by["weight"][0]["value"]) == e.json["weight"]


# ------------------------------------------------------------------ the article's worked example


def test_the_article_example_on_the_article_toy_model():
    """Article 001 builds its decoder as: word embedding + the sin/cos table, q = W_q x, k = W_k x,
    v = W_v x (no bias), similarities q kᵀ divided by √4, a mask filled with -1e9, softmax over
    the row, the weighted sum of the values, the residual, and a fully connected layer. It gives
    the encoding of the first token as (0, 1, 0, 1) and, for the prompt "how is living in
    amsterdam <EOS>", the prediction "exciting" then "<EOS>". The article's own weights are random
    and never printed, so its forward is written out here, as the article states it, over the toy
    model's weights, and the cell view must give each of its numbers."""
    s = stepped(TOY, "how is living in amsterdam <EOS>")
    model = s.text.entry.model
    ids = s.decoder.window[:6]
    assert ids == [0, 1, 2, 3, 4, 6]  # the article's token numbers
    W = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    w_q, w_k, w_v = np.split(W["blocks.0.attn.qkv.weight"], 3)
    x = embed(model, ids)
    assert x[0] - W["tok_emb.weight"][0] == pytest.approx([0.0, 1.0, 0.0, 1.0], abs=1e-7)  # PE of "how"
    q, k, v = x @ w_q.T, x @ w_k.T, x @ w_v.T
    sims = q @ k.T / math.sqrt(4)
    sims = np.where(np.tril(np.ones((6, 6))) == 0, -1e9, sims)
    pct = np.exp(sims - sims.max(1, keepdims=True))
    pct /= pct.sum(1, keepdims=True)
    residual = x + pct @ v
    logits = residual @ W["head.weight"].T + W["head.bias"]
    for i in range(6):
        for j in (0, i):
            c = inside.cell(s.text, s.heads.settings, 0, 0, i, j)
            assert c["scale"] == 0.5  # ÷√d_k with d_k = 4
            close(c["x_i"], x[i], "x_i"), close(c["q"], q[i], "q"), close(c["k"], k[j], "k")
            close(c["dot"], (q[i] @ k[j]), "q·k"), close(c["score"], sims[i, j] if j <= i else q[i] @ k[j] / 2)
            close(c["softmax_row"][:6], pct[i], "softmax row"), close(c["v"][:6], v, "v")
            assert c["softmax_row"][6] == 0.0  # "exciting", written after the prompt, is masked for every row here
            close(c["head_out"], pct[i] @ v, "attention values (no output projection)")
            close(c["residual_after"], residual[i], "residual connection")
            assert c["out_bias"] is None and c["model_facts"]["out_projection"] is False
    assert s.text.entry.tokenizer.piece(int(np.argmax(logits[5]))) == "exciting"
    assert s.tokens()[6][0] == "exciting"  # the app's greedy Step writes it too
    c = inside.cell(s.text, s.heads.settings, 0, 0, 5, 1)
    residual = torch.tensor(c["residual_after"], dtype=torch.float64)
    head = residual @ model.head.weight.double().T + model.head.bias.double()
    assert s.text.entry.tokenizer.piece(int(head.argmax())) == "exciting"


def test_one_forward_is_kept_per_text_and_settings():
    s = stepped()
    plain = inside.MEMO.forward(s.text, None)
    assert inside.MEMO.forward(s.text, None) is plain  # another cell of the same text: no new forward
    s.heads.set_ablation(["L0H1"], "zero", False)
    changed = inside.MEMO.forward(s.text, window_intervention(s.text, s.heads.settings))
    assert changed is not plain and not torch.equal(changed.residuals[2], plain.residuals[2])
    other = stepped()
    assert inside.MEMO.forward(other.text, None) is not plain  # each text its own


def test_what_all_texts_keep_together_stays_under_the_server_wide_cap(monkeypatch):
    s, t = stepped(), stepped()
    first = inside.MEMO.forward(s.text, None)
    one = sum(x.numel() * x.element_size() for x in (*first.residuals, *first.attentions))
    monkeypatch.setattr(inside, "MEMO_TOTAL_BYTES", one + one // 2)  # room for one text's forward, not two
    inside.MEMO.forward(t.text, None)  # the newer text stays, the older one is dropped
    assert inside.MEMO.nbytes() <= inside.MEMO_TOTAL_BYTES
    again = inside.MEMO.forward(s.text, None)  # asked for again: computed again, the same numbers
    assert again is not first
    assert all(torch.equal(a, b) for a, b in zip(again.residuals, first.residuals))
    assert inside.MEMO.nbytes() <= inside.MEMO_TOTAL_BYTES
