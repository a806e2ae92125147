"""Test files are collected by their module name (pytest's default import mode), so two files of the same
name in different folders stop the whole run at collection: every name must be unique."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_name_is_unique_across_the_folders():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []
