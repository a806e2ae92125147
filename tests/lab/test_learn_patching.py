"""The Learn tab's section on activation patching quotes the grammar model's numbers: each one must be what
lab.patching computes (as tests/lab/test_probing.py holds section 16's worked example to the lab)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lab.session import Session

GRAMMAR = "grammar (built-in)"
A = "anna found the key . she gave it to tom because he asked"
B = "tom found the key . he gave it to anna because she asked"
LEARN = Path(__file__).resolve().parents[2] / "assets" / "learn.md"


@pytest.fixture(scope="module")
def section() -> str:
    text = LEARN.read_text(encoding="utf-8")
    start = text.index("## 18. Activation patching")
    end = text.find("\n## ", start + 1)
    return " ".join((text[start:] if end < 0 else text[start:end]).split())


@pytest.fixture(scope="module")
def sweeps() -> dict:
    s = Session()
    return {(what, d): s.sweeps.run(GRAMMAR, A, B, "logit_diff", "her", "him", what, d)
            for what, d in [("heads", "denoising"), ("heads", "noising"), ("resid", "denoising"),
                            ("attn", "denoising")]}


def pct(value: float) -> str:
    return f"{100 * value:.0f} %"


def test_the_pair_and_its_metric(section, sweeps):
    setup = sweeps["heads", "denoising"].setup
    assert f"`{A}`" in section and f"`{B}`" in section
    assert len(setup.ids_a) == len(setup.ids_b) == 13 and "13 tokens each" in section
    metric = f"is {setup.clean:.2f} on A and {setup.corrupted:.2f} on B".replace("-", "−")
    assert metric in section
    probs = Session().heads.compare(GRAMMAR, A, B)
    pieces = probs.pieces
    assert pieces[int(np.argmax(probs.probs_a))] == "her" and pieces[int(np.argmax(probs.probs_b))] == "him"


def test_the_head_sweeps(section, sweeps):
    den, noi = sweeps["heads", "denoising"], sweeps["heads", "noising"]
    (r0, c0, v0), (r1, c1, v1) = den.best(2)
    assert (den.cell_name(r0, c0), den.cell_name(r1, c1)) == ("L1H0", "L0H2")
    assert f"L1H0 restores {pct(v0)} of the difference and the next head, L0H2, {pct(v1)}" in section
    (r0, c0, v0), (r1, c1, v1) = noi.best(2)
    assert (noi.cell_name(r0, c0), noi.cell_name(r1, c1)) == ("L1H0", "L0H3")
    assert f"L1H0 makes {pct(v0)}, the next head, L0H3, {pct(v1)}" in section
    assert f"the twelve head cells above sum to {pct(den.values.sum())}" in section
    assert den.values.size == 12


def test_the_position_sweeps(section, sweeps):
    resid, attn = sweeps["resid", "denoising"], sweeps["attn", "denoising"]
    tokens = resid.setup.aligned_tokens()
    assert tokens[0] == "anna→tom" and tokens[-1] == "asked"
    assert resid.rows[0] == "embedding"
    assert f"right after the embedding at position 0, the first name (anna→tom), restores {pct(resid.values[0, 0])}" \
        in section
    assert attn.rows[1] == "L1"
    assert f"the attention output of layer 1 at the last token, \"asked\", restores {pct(attn.values[1, -1])}" \
        in section
    assert resid.values[-1, -1] == pytest.approx(1.0, abs=1e-6)  # "restores exactly 100 %"
    assert "restores exactly 100 %" in section
