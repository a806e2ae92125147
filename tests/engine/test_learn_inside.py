"""The Learn tab's walk through one attention cell (section 19) holds the article toy model's own numbers.

Every number with three decimals in that section is recomputed here from the model's weights by a
float64 path written out in the test (embedding + sinusoidal position, W_Q / W_K / W_V, the scaled and
masked scores, the softmax, the weighted sum, ‖a_ij v_j‖), in the order the text gives them; the
same cell through model.inside (what the app's "Inside one cell" panel draws) agrees with it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from lab.catalogue.models import BUILTINS
from model.inside import inside_cell, value_weighted

ROOT = Path(__file__).resolve().parents[2]
TOY = "article toy (built-in)"
PROMPT = "how is living in amsterdam <EOS>"
QUERY, KEY, OTHER = 5, 1, 4  # <EOS> looks at "is", and at "amsterdam"


def section() -> str:
    learn = (ROOT / "assets" / "learn.md").read_text(encoding="utf-8")
    start = learn.index("## 19. Inside one cell")
    end = learn.find("\n## ", start + 1)
    return learn[start:] if end < 0 else learn[start:end]


def by_hand() -> dict:
    """The cell in float64 from the weights, without the engine's attention code."""
    entry = BUILTINS.get(TOY)
    model, cfg = entry.model, entry.model.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.norm, cfg.attn_out_proj) == (1, 1, 4, "none", False)
    ids = entry.tokenizer.encode(PROMPT)
    emb = model.tok_emb.weight.detach().double().numpy()[ids]  # (T, C)
    pos = np.arange(len(ids))[:, None] / cfg.pe_base ** (np.arange(0, cfg.d_model, 2) / cfg.d_model)
    pe = np.zeros_like(emb)
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos), np.cos(pos)
    x = emb + pe  # no norm: the head reads this
    w = model.blocks[0].attn.qkv.weight.detach().double().numpy()  # (3 × hs, C): W_Q, W_K, W_V stacked
    q, k, v = x @ w[0:4].T, x @ w[4:8].T, x @ w[8:12].T
    s = q @ k.T / np.sqrt(4)
    s[np.triu(np.ones(s.shape, bool), 1)] = -np.inf
    m = s.max(axis=1, keepdims=True)
    e = np.exp(s - m)
    a = e / e.sum(axis=1, keepdims=True)
    z = a @ v
    return {"x": x, "q": q, "k": k, "v": v, "s": s, "m": m[:, 0], "e": e, "sum": e.sum(axis=1), "a": a, "z": z,
            "ids": ids}


def expected_numbers(h: dict) -> list[float]:
    """The section's numbers in the order it gives them."""
    i, j = QUERY, KEY
    p = h["q"][i] * h["k"][j]
    order = np.argsort(-np.abs(p), kind="stable")
    row = slice(0, i + 1)
    out = [*h["x"][i], *h["x"][j], *h["q"][i], *h["k"][j]]
    out += [x for d in order for x in (h["q"][i][d], h["k"][j][d], p[d])]
    out += [p.sum(), p.sum(), h["s"][i, j]]
    out += [h["m"][i], h["sum"][i]]
    out += [x for jj in range(i + 1) for x in (h["s"][i, jj], h["e"][i, jj], h["a"][i, jj])]
    out += [h["e"][i, j], h["sum"][i], h["a"][i, j], h["a"][i, OTHER]]
    out += [*h["v"][j], *h["v"][OTHER], *h["z"][i], h["a"][i, j], h["a"][i, OTHER]]
    out += [*(h["x"][i] + h["z"][i])]
    out += [h["a"][i, j] * np.linalg.norm(h["v"][j]), h["a"][i, OTHER] * np.linalg.norm(h["v"][OTHER])]
    assert not np.isinf(h["s"][i, row]).any()
    return out


def test_every_number_of_the_learn_tabs_cell_is_the_models_own():
    text = section()
    shown = [float(x) for x in re.findall(r"-?\d+\.\d{3}\b", text)]
    want = expected_numbers(by_hand())
    assert len(shown) == len(want), (len(shown), len(want))
    for k, (a, b) in enumerate(zip(shown, want)):
        assert abs(a - b) <= 0.0005 + 1e-6, (k, a, b)  # three decimals, rounded


def test_the_panels_numbers_for_that_cell_are_the_same():
    """What the app draws for the cell (model.inside) equals the float64 path above."""
    h = by_hand()
    model = BUILTINS.get(TOY).model
    w = inside_cell(model, h["ids"], 0, 0, QUERY, KEY)
    tol = dict(atol=1e-5, rtol=1e-5)
    assert np.allclose(w.xn_i, h["x"][QUERY], **tol) and np.allclose(w.q, h["q"][QUERY], **tol)
    assert np.allclose(w.k, h["k"][KEY], **tol) and np.allclose(w.products, h["q"][QUERY] * h["k"][KEY], **tol)
    assert np.isclose(w.score, h["s"][QUERY, KEY], **tol) and np.isclose(w.exp_sum, h["sum"][QUERY], **tol)
    assert np.allclose(w.softmax_row, h["a"][QUERY], **tol) and np.allclose(w.weighted, h["z"][QUERY], **tol)
    vw = value_weighted(model, h["ids"], 0)[0, QUERY]
    assert np.allclose(vw, h["a"][QUERY] * np.linalg.norm(h["v"], axis=1), **tol)
    with torch.inference_mode():
        logits = model(torch.tensor([h["ids"]])).logits[0, -1]
    assert BUILTINS.get(TOY).tokenizer.piece(int(logits.argmax())) == "exciting"  # what the text says it predicts
