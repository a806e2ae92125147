"""Comparing two sessions' texts value for value."""

from __future__ import annotations

import numpy as np

from lab.session import Session


def assert_same_text(a: Session, b: Session) -> None:
    assert a.tokens() == b.tokens()
    for x, y in zip(a.attention().weights + a.attention().scores, b.attention().weights + b.attention().scores):
        np.testing.assert_array_equal(x, y)  # value for value
    assert len(a.drawn) == len(b.drawn)
    for x, y in zip(a.drawn, b.drawn):
        assert x.token_id == y.token_id
        np.testing.assert_array_equal(x.probs, y.probs)
        np.testing.assert_array_equal(x.adjusted, y.adjusted)
