"""The Space's CPU-only torch (pre-requirements.txt) stays the build of the torch requirements.txt pins.

A Space installs pre-requirements.txt first, then requirements.txt: the CPU wheel is kept only while
requirements.txt's pin accepts it, so a torch bump in one file and not the other would make the Space
download the CUDA build again. The README's own install reads requirements.txt only, from PyPI.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lines(name: str) -> list[str]:
    text = (ROOT / name).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def torch_pin(name: str) -> str:
    pins = [m.group(1) for line in lines(name) if (m := re.fullmatch(r"torch==(\S+)", line))]
    assert len(pins) == 1, (name, pins)
    return pins[0]


def test_the_space_takes_the_cpu_build_of_the_pinned_torch():
    assert torch_pin("pre-requirements.txt") == torch_pin("requirements.txt") + "+cpu"
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines("pre-requirements.txt")


def test_the_readmes_install_needs_pypi_only():
    assert not [line for line in lines("requirements.txt") if line.startswith("-")]  # no index, no other file
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "pip install -r requirements.txt -c constraints.txt && python app.py" in readme
    operating = (ROOT / "docs" / "operating.md").read_text(encoding="utf-8")
    assert "pre-requirements.txt" in operating.split("## Hugging Face Spaces", 1)[1]  # where a Space's install is told
