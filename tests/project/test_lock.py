"""constraints.txt, the lock: every package requirements.txt and requirements-test.txt install, pinned.

The lock must resolve (each requirement file's line and each pinned package's own requirements are met by
pins in it, nothing is pinned twice, every pin is a plain PyPI release), and the packages installed here must
be the pinned ones, so the tests always run on what a fresh install gets. The walk below is written apart
from .ci/lock.py's on purpose: the two reading the same metadata the same way is part of what is checked.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
REFRESH = "refresh it with `python .ci/lock.py` once the tests pass on what is installed"
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def pin_lines() -> list[str]:
    text = (ROOT / "constraints.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def pins() -> dict[str, Version]:
    found = {}
    for line in pin_lines():
        match = PIN.fullmatch(line)
        assert match, f"constraints.txt: {line!r} is not a name==version pin"
        found[canonicalize_name(match.group(1))] = Version(match.group(2))
    return found


def file_requirements(name: str) -> list[Requirement]:
    """A requirements file's requirement lines, its -r files' included (-c, -e and the project's line are not
    requirements of their own: pyproject.toml takes the project's dependencies from requirements.txt)."""
    found = []
    for raw in (ROOT / name).read_text(encoding="utf-8").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line.startswith("-r "):
            found += file_requirements(line[3:].strip())
        elif line and not line.startswith(("#", "-")) and line != ".":
            found.append(Requirement(line))
    return found


def roots() -> list[Requirement]:
    return [r for name in ("requirements.txt", "requirements-test.txt") for r in file_requirements(name)]


def holds(req: Requirement, extras: frozenset[str]) -> bool:
    return req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras)


def needed() -> dict[str, list[tuple[str, Requirement]]]:
    """Every package the requirement files need here, by name, with who asks for it and how.

    Follows the installed packages' own requirements (markers for this interpreter and platform, the
    extras asked for); a pinned package that is not installed is not followed (the last test names it).
    """
    wanted: dict[str, list[tuple[str, Requirement]]] = {}
    done: set[tuple[str, frozenset[str]]] = set()
    queue = [(r, "requirement files") for r in roots() if holds(r, frozenset({""}))]
    while queue:
        req, by = queue.pop()
        name = canonicalize_name(req.name)
        wanted.setdefault(name, []).append((by, req))
        extras = frozenset({""} | req.extras)
        if (name, extras) in done:
            continue
        done.add((name, extras))
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        queue += [(Requirement(line), name) for line in requires if holds(Requirement(line), extras)]
    return wanted


def test_every_line_is_one_pin_of_a_plain_release():
    names = [canonicalize_name(PIN.fullmatch(line).group(1)) for line in pin_lines() if PIN.fullmatch(line)]
    assert len(names) == len(pin_lines()), "every line of constraints.txt is name==version"
    assert sorted({n for n in names if names.count(n) > 1}) == [], "pinned twice"
    local = {name: str(v) for name, v in pins().items() if v.local}
    assert local == {}, "a local label (+cpu) is no PyPI release; the README's install needs PyPI only"


def test_the_requirement_files_are_met_by_their_pins():
    locked = pins()
    lines = [req for req in roots() if holds(req, frozenset({""}))]
    assert {"torch", "gradio", "pytest"} <= {canonicalize_name(req.name) for req in lines}
    unmet = [
        f"{req}: pinned {locked.get(canonicalize_name(req.name), 'nowhere')}"
        for req in lines
        if canonicalize_name(req.name) not in locked
        or not req.specifier.contains(locked[canonicalize_name(req.name)], prereleases=True)
    ]
    assert unmet == [], unmet


def test_the_lock_is_closed_every_pinned_package_needs_only_pinned_packages():
    locked = pins()
    wanted = needed()
    missing = sorted(name for name in wanted if name not in locked)
    assert missing == [], f"needed here but not pinned: {missing}; {REFRESH}"
    clashes = [
        f"{name}=={locked[name]}, but {by} wants {req}"
        for name, asks in wanted.items()
        for by, req in asks
        if not req.specifier.contains(locked[name], prereleases=True)
    ]
    assert clashes == [], clashes
    stale = sorted(set(locked) - set(wanted))
    assert stale == [], f"pinned but needed by nothing: {stale}; {REFRESH}"
    assert "gradio" in wanted and "starlette" in wanted, "the walk reaches the packages under gradio"


def test_the_installed_packages_are_the_pinned_ones():
    differences = []
    for name, pin in sorted(pins().items()):
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            differences.append(f"{name}: pinned {pin}, not installed")
            continue
        if Version(installed.public) != pin:  # torch's "+cpu" build is a build of the pinned release
            differences.append(f"{name}: pinned {pin}, installed {installed}")
    listed = "".join(f"\n  {line}" for line in differences)
    assert differences == [], (
        f"installed packages differ from constraints.txt:{listed}\n"
        f"{REFRESH}, or install the pinned ones: pip install -r requirements-test.txt"
    )


def test_the_installs_read_the_lock_and_requirements_txt_stays_plain():
    test_lines = (ROOT / "requirements-test.txt").read_text(encoding="utf-8").splitlines()
    assert "-c constraints.txt" in test_lines
    # pyproject.toml reads requirements.txt as the project's dependencies, where an option line is an error
    app_lines = (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    assert file_requirements("requirements.txt") and not [line for line in app_lines if line.startswith("-")]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "pip install -r requirements.txt -c constraints.txt && python app.py" in readme
    test_command = "pip install -r requirements-test.txt && python tests/setup_browser.py && python -m pytest"
    assert test_command in readme
    ci = [line for line in (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines() if line.strip()]
    assert ci[-1] == test_command, ".ci/run runs exactly the README's test command"
