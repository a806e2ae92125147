"""The documented examples run as written: the gradio_client snippet of docs/api.md against a live server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_python_snippet() -> str:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text.split("## Using it from Python", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no python snippet in docs/api.md's gradio_client section"
    return match.group(1)


@pytest.mark.slow
def test_readme_gradio_client_snippet_runs(app_server, capsys):
    code = readme_python_snippet()
    assert 'Client("http://127.0.0.1:7860/")' in code
    code = code.replace("http://127.0.0.1:7860/", app_server.url)
    scope: dict = {}
    exec(compile(code, "docs/api.md", "exec"), scope)  # noqa: S102 - our own docs, run as a reader would
    printed = capsys.readouterr().out.splitlines()
    assert scope["tokens"] and scope["attention"]["plot"]
    assert printed and printed[-1].startswith("Training finished"), printed[-3:]
