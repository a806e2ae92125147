"""The status line names the last token's probability readably: a rare draw reads "6.7e-4", never "0.000"
(viz.probability_text; its rule: tests/viz/test_viz_gpt2_sizes.py)."""

from __future__ import annotations

from lab.session import Session
from model.generate import Sampling
from viz import probability_text

SHAKESPEARE = "shakespeare (built-in)"


def test_a_rare_draw_reads_as_a_power_of_ten_in_the_status():
    """Hot sampling (temperature 2, seed 0) on the character model draws, within a few dozen Steps, a token the
    adjusted distribution gave less than 1/1000; every Step's status names its probability as the helper writes it."""
    s = Session()
    rare = None
    for _ in range(80):
        frame = s.step(SHAKESPEARE, "JULIET:\nO Romeo", Sampling(temperature=2.0, seed=0))
        p = s.probabilities()
        drawn = float(p.adjusted[p.chosen])
        assert f"sampled with probability {probability_text(drawn)})." in frame.status
        if drawn < 1e-3:
            rare = frame.status
            break
    assert rare is not None, "no draw under 1/1000 in 80 Steps"
    assert "e-" in rare and "0.000" not in rare
