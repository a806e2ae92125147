"""Helpers for the Save & share section in a real Chromium."""

from __future__ import annotations

from tests.support.browser import Page


def share_section(p: Page) -> None:
    if not p.page.locator("#save_session").is_visible():
        p.page.get_by_text("Save & share").click()
    p.page.locator("#save_session").wait_for(state="visible", timeout=10_000)
