"""The Learn tab's Circuits sections (20 to 23) quote the grammar model's numbers: each one must be what the
session's Circuits part (lab/circuits.py) computes on the same text, as tests/lab/test_learn_patching.py holds
section 18 to lab.patching. The text is section 18's prompt A stepped once in Explore (the model writes "her"),
the position its "asked"; a number in the text that the model no longer gives fails here."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from lab import patching
from lab.circuits_atp import ATP_TOP
from lab.session import Session
from model.attribution import ATP_ABS_SHARE, ATP_REL_TOL
from model.generate import Sampling

GRAMMAR = "grammar (built-in)"
A = "anna found the key . she gave it to tom because he asked"
B = "tom found the key . he gave it to anna because she asked"
ASKED = 12  # window position of "asked", the last token of A
LEARN = Path(__file__).resolve().parents[2] / "assets" / "learn.md"
TITLES = ["20. Direct logit attribution", "21. Head composition", "22. A head's OV and QK circuits",
          "23. Attribution patching and when to trust it"]


def section(number: int) -> str:
    """Section `number` of learn.md, its white space collapsed (line breaks do not matter to a phrase)."""
    text = LEARN.read_text(encoding="utf-8")
    start = text.index(f"## {number}. ")
    end = text.find("\n## ", start + 1)
    return " ".join((text[start:] if end < 0 else text[start:end]).split())


def num(x: float, digits: int = 2, sign: bool = False) -> str:
    """A number as the sections write it: a real minus sign, "+" in front when signed."""
    return (f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}").replace("-", "−")


def pct(x: float, digits: int = 0) -> str:
    return f"{num(100 * x, digits)} %"


@pytest.fixture(scope="module")
def session() -> Session:
    s = Session()
    s.step(GRAMMAR, A, Sampling(temperature=0.0))
    pieces = [s.entry.pieces[i] for i in s.decoder.window]
    assert " ".join(pieces[:ASKED + 1]) == A and pieces[ASKED + 1] == "her"  # "the model writes 'her'"
    return s


@pytest.fixture(scope="module")
def atp():
    """The tab's default run: section 18's pair, her − him, the heads, denoising, its default top cells."""
    return Session().circuits.atp(GRAMMAR, A, B, "logit_diff", " her", " him", "heads", "denoising", k=ATP_TOP)


def test_the_four_sections_follow_section_19_in_order():
    text = LEARN.read_text(encoding="utf-8")
    heads = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert heads[-5].startswith("19. ") and heads[-4:] == TITLES
    for n in range(20, 24):  # each explains itself with a formula on a line of its own
        assert section(n).count("$$") == 2, n


def test_the_sections_they_point_to_say_what_is_meant():
    """Every "section N" in 20 to 23 names a section that exists and is about what the sentence needs."""
    titles = {int(line[3:].split(".")[0]): line[3:] for line in LEARN.read_text(encoding="utf-8").splitlines()
              if line.startswith("## ")}
    about = {8: "Residual connections", 18: "Activation patching", 20: "Direct logit attribution",
             21: "Head composition"}
    for n in range(20, 24):
        for pair in re.findall(r"sections? (\d+)(?: and (\d+))?", section(n)):
            for ref in filter(None, pair):
                assert int(ref) in about and about[int(ref)] in titles[int(ref)], (n, ref)


def test_direct_logit_attribution(session, atp):
    s = section(20)
    d = session.circuits.dla(ASKED, " her", " him")
    assert d.tokens[d.position] == "asked" and (d.answer_piece, d.other_piece) == ("her", "him")
    assert f"`{A}`" in s
    assert f"The final norm's $\\sigma$ there is {num(d.scale)}." in s
    top = d.top(5)
    assert [name for name, _ in top] == ["MLP L2", "L1H0", "MLP L1", "L2H0", "MLP L0"]
    assert "The largest shares: " + ", ".join(f"{n} {num(v, sign=True)}" for n, v in top) + "." in s
    emb = d.embedding
    assert set(emb) == {"token", "position"} and d.mlps.size == 3 and d.heads.size == 12
    assert (f"The twelve heads add {num(d.heads.sum(), sign=True)} together, the three MLPs "
            f"{num(d.mlps.sum(), sign=True)}, the embedding {num(emb['token'] + emb['position'], sign=True)} "
            f"(token {num(emb['token'], sign=True)}, position {num(emb['position'], sign=True)})") in s
    assert (f"All parts make {num(d.direct_sum, sign=True)}, the remainder {num(d.remainder, sign=True)}, and "
            f"together they are the model's own logit difference, {num(d.actual)} (section 18's $m_A$)") in s
    assert abs(d.gap) < 1e-5 and num(d.actual) == num(atp.metric_a)
    assert set(d.biases) == {"attn_out L0", "attn_out L1", "attn_out L2", "final_norm", "head"}
    assert d.biases["head"] == 0.0 and d.cap == 0.0  # the remainder is the attention outputs' and final norm's
    exact = atp.exact_share[1, 0]  # L1H0, denoising: section 18's number
    assert (f"Patching credited L1H0 with {pct(exact)} of the difference; here it writes only "
            f"{num(d.heads[1, 0], sign=True)} of {num(d.actual)} straight into the logits") in s


def test_head_composition(session, atp):
    s = section(21)
    c = session.circuits.composition()
    cfg = session.entry.model.cfg
    assert cfg.d_model == 96 and cfg.kv_heads == cfg.n_heads  # no grouped-query attention here
    assert f"1/\\sqrt{{{cfg.d_model}}} \\approx$ {num(1 / np.sqrt(cfg.d_model))}" in s
    finite = np.isfinite(c.q)
    assert finite.sum() == np.isfinite(c.k).sum() == np.isfinite(c.v).sum()
    medians = [np.median(c.of(k)[finite]) for k in "qkv"]
    assert (f"over its {finite.sum()} pairs of heads in different layers, the median is {num(medians[0])} for Q, "
            f"{num(medians[1])} for K and {num(medians[2])} for V") in s
    v, q, k = c.top["v"][0], c.top["q"][0], c.top["k"][0]
    assert (f"The strongest pairs are V {v.name} {num(v.score)}, Q {q.name} {num(q.score)} and K {k.name} "
            f"{num(k.score)}.") in s
    into_q, into_k = c.q[0, :, 1, 0], c.k[0, :, 1, 0]  # layer 0's heads into L1H0
    assert int(np.argmax(into_q)) == int(np.argmax(into_k)) == 2
    assert num(into_q[2]) == num(into_k[2])
    assert f"is L0H2 ({num(into_q[2])} on both), which patching ranked second" in s
    second = np.argsort(-atp.exact_share.ravel(), kind="stable")[1]  # section 18's denoising sweep of the heads
    assert np.unravel_index(second, atp.exact_share.shape) == (0, 2)
    assert f"{num(into_q[2])} is barely above the median" in s
    assert into_q[2] > medians[0] and into_q[2] - medians[0] < 0.02
    every = np.concatenate([c.of(k)[finite] for k in "qkv"])
    assert "The score lies between 0" in s and every.min() >= 0 and every.max() <= 1


def test_unrelated_heads_score_about_one_over_root_d_model():
    """The yardstick: random W_V, W_O, W_Q, W_K of the grammar model's shapes (96 × 24) score about 1/√96."""
    rng = np.random.default_rng(0)
    C, hs = 96, 24

    def w(*shape):
        return rng.standard_normal((50, *shape))  # 50 pairs at once

    ov, qk = w(C, hs) @ w(hs, C), w(C, hs) @ w(hs, C)
    frob = lambda m: np.linalg.norm(m, axis=(1, 2))  # noqa: E731
    scores = frob(ov @ qk) / (frob(ov) * frob(qk))
    assert f"{scores.mean():.2f}" == num(1 / np.sqrt(C)) == "0.10"


def test_ov_and_qk_circuits(session):
    s = section(22)
    r = session.circuits.circuits(1, 0)
    cfg = session.entry.model.cfg
    assert (cfg.vocab_size, cfg.head_dim) == (97, 24) and r.eigenvalues.size == 24
    assert (f"The table is {cfg.vocab_size} × {cfg.vocab_size} here, but its rank is at most the head size, "
            f"{cfg.head_dim}, so at most {r.eigenvalues.size} of its eigenvalues are not zero") in s
    assert f"**Open** layer {r.layer}, head {r.head}, with section 20's text" in s
    positive = int((r.eigenvalues.real > 0).sum())
    assert f"{positive} of its 24 eigenvalues have a positive real part and its copying score is " \
           f"{num(r.copying, sign=True)}, so it is no copier" in s
    top = dict(zip(r.input_pieces, (row[0] for row in r.top_pieces)))
    assert (top["anna"], top["tom"], top["she"]) == ("her", "he", "her")
    assert 'reading "anna" it raises "her" most, reading "tom" "he", reading "she" "her"' in s
    rank = dict(zip(r.input_pieces, r.own_rank.tolist()))
    assert f'"anna" itself has {rank["anna"]} tokens above it in its own row' in s
    assert len(r.inputs) == 14 and int((r.own_rank == 0).sum()) == 0
    assert "For none of the text's 14 distinct tokens is the token itself the top entry" in s
    c = session.circuits.composition()
    best, worst = np.unravel_index(np.nanargmax(c.copying), c.copying.shape), \
        np.unravel_index(np.nanargmin(c.copying), c.copying.shape)
    assert (best, worst) == ((2, 2), (0, 1))
    assert (f"the highest copying score is L2H2's, {num(c.copying[best], sign=True)}, and the lowest L0H1's, "
            f"{num(c.copying[worst], sign=True)}") in s
    assert num(c.copying[1, 0]) == num(r.copying)  # the model-wide table and the one head agree

    tokens = r.qk_tokens
    anna, tom = tokens.index("anna"), tokens.index("tom")
    assert tokens[ASKED] == "asked" and r.allowed[ASKED, : ASKED + 1].all()
    plain, positional = 1000 * r.plain[ASKED, : ASKED + 1], 1000 * r.positional[ASKED, : ASKED + 1]
    assert list(np.argsort(-plain)[:2]) == [tom, anna]  # "the best keys are the two names"
    assert (f'the best keys are "tom" {num(plain[tom])} and "anna" {num(plain[anna])}, the two names, almost tied; '
            f'with positions "anna" falls to {num(positional[anna])} and "tom" to {num(positional[tom])}') in s
    model = session.entry.model
    with torch.inference_mode():
        out = model(torch.tensor([list(session.decoder.window)[: ASKED + 1]]), return_attention=True)
    row = out.attentions[1][0, 0, ASKED].numpy()
    assert int(np.argmax(row)) == anna
    assert f'L1H0 at "asked" puts {num(row[anna])} of its weight on "anna"' in s


def test_attribution_patching(session, atp):
    s = section(23)
    entry = session.entry
    T = len(atp.tokens_a)
    sizes = {what: int(np.prod([len(x) for x in patching.grid(entry, what, T)[:2]])) for what in ("heads", "resid")}
    assert atp.estimate.size == sizes["heads"] == 12 and sizes["resid"] == (entry.model.cfg.n_layers + 1) * T == 52
    assert "12 for the grammar model's heads, 52 for its residual stream (4 places × 13 positions)" in s
    H = len(atp.columns)

    def best_two(grid: np.ndarray) -> list[str]:
        return [f"{atp.rows[i // H]}{atp.columns[i % H]}" for i in np.argsort(-grid.ravel(), kind="stable")[:2]]

    assert best_two(atp.estimate_share) == best_two(atp.exact_share) == ["L1H0", "L0H2"]
    assert "AtP ranks the heads as the sweep does: L1H0 first, L0H2 second" in s
    checked = {c.name: c for c in atp.verified}
    l2h0, l1h0 = checked["L2H0"], checked["L1H0"]
    assert not l2h0.disagrees and l1h0.disagrees and atp.disagree[1, 0] and not atp.disagree[2, 0]
    assert (f"On L2H0 it agrees: {pct(atp.estimate_share[2, 0], 1)} estimated, {pct(atp.exact_share[2, 0], 1)} "
            f"exact. On L1H0 it falls short: {pct(atp.estimate_share[1, 0])} estimated against "
            f"{pct(atp.exact_share[1, 0])} exact, and the tab flags the cell") in s
    assert (f"off by more than {pct(ATP_REL_TOL)} of the exact change and by more than {pct(ATP_ABS_SHARE)} of "
            "the difference between A and B") in s
    assert f"it changes L1H0's output by {pct(l1h0.relative_change)} of its length" in s
    assert entry.model.cfg.n_layers == 3  # after L1H0 (layer 1): the MLPs of layers 1 and 2, layer 2's attention
    assert "(the layer norms, the MLPs of layers 1 and 2, the softmaxes of layer 2)" in s
    for said in ("saturated softmax", "cancellation", "Norms"):
        assert said in s
