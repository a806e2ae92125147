"""The Head menu of a layer with many heads: its pages ("H6–11": heads 6 to 11) and how the lab reads them back."""

from __future__ import annotations

import pytest

from lab.checks import UserError
from lab.display import HEAD_PAGE, check_head, head_pages, page_value
from ui.explore import head_choices


def test_the_head_menu_offers_pages_only_where_the_heads_do_not_fit():
    assert HEAD_PAGE == 6
    assert head_choices(4)[0] == ("all heads", "all") and len(head_choices(4)) == 5  # as it always was
    assert head_choices(6)[0] == ("all heads", "all")
    assert head_choices(12)[:2] == [("H0–5", "all"), ("H6–11", "6-11")]
    assert head_choices(12)[2:] == [(f"head {i}", i) for i in range(12)]
    assert [page_value(p) for p in head_pages(9)] == ["all", "6-8"]  # SmolLM2's 9 heads
    assert check_head("all", 4) == (None, None) and check_head(3, 4) == (3, None)
    assert check_head("all", 12) == (None, tuple(range(6)))
    assert check_head("6-11", 12) == (None, tuple(range(6, 12)))
    for bad, n in (("6-11", 6), ("5-10", 12), ("6-12", 12), (12, 12)):
        with pytest.raises(UserError, match="head must be a whole number between 0 and"):
            check_head(bad, n)
