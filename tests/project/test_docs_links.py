"""The README and docs/ point at things that exist: every relative link and picture resolves (with its
#anchor, where it names one), and every repository path or `python -m` module the text names is there.

The pages move and the code is reorganised; a link or a module name that went stale would send a reader
to nothing, so each is checked against the working tree rather than by eye.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
# a path inside the repository, as the text names it in backticks: a top folder, then at least one part
REPO_PATH = re.compile(r"^(?:model|lab|ui|viz|bench|tests|assets|docs|\.ci)/[\w./-]*[\w/]$")
MODULE = re.compile(r"python -m ((?:model|lab|ui|viz|bench)(?:\.[a-z_]+)+)")
PLACEHOLDER = re.compile(r"\b(?:NAME|FILE|SRC|FOLDER|COMMIT)\b")  # `assets/NAME.json`: one file per model


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def prose(text: str) -> str:
    """The page without its code: links inside code blocks or code spans are examples, not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """The anchors a Markdown renderer (GitHub's rule) gives the page's headings."""
    seen: dict[str, int] = {}
    out = set()
    for title in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_there_are_pages_to_check():
    assert (ROOT / "README.md").exists() and len(PAGES) >= 6, [page_id(p) for p in PAGES]


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_and_picture_resolves(page: Path):
    text = prose(page.read_text(encoding="utf-8"))
    targets = [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # not http:, mailto:
    assert targets, f"{page_id(page)} links to nothing"
    broken = []
    for target in targets:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert broken == [], f"{page_id(page)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_path_and_module_the_page_names_exists(page: Path):
    text = page.read_text(encoding="utf-8")
    spans = [s.strip("`") for s in INLINE_CODE.findall(FENCE.sub("", text))]
    paths = {s.split("::")[0] for s in spans if REPO_PATH.match(s.split("::")[0]) and not PLACEHOLDER.search(s)}
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    for module in set(MODULE.findall(text)):
        base = ROOT / module.replace(".", "/")
        if not (base.with_suffix(".py").exists() or (base / "__init__.py").exists()):
            missing.append(f"python -m {module}")
    assert missing == [], f"{page_id(page)} names what is not there: {missing}"
