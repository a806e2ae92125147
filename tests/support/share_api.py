"""Helpers for Save & share through the running app's API."""

from __future__ import annotations


def value(x):
    """A component's value as the client returns it (an update dict carries it in "value")."""
    return x["value"] if isinstance(x, dict) and x.get("__type__") == "update" else x
