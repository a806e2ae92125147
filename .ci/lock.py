"""Write constraints.txt: every package requirements.txt and requirements-test.txt install, direct or not,
pinned to the version installed here.

requirements.txt pins only what the project imports; the packages under them (fastapi, starlette, pydantic,
pillow, ...) would otherwise install at whatever is newest on the day, and ui/http.py leans on Gradio's
internals. The constraints file holds them to the versions the tests last passed with.

    python .ci/lock.py           rewrite constraints.txt from the packages installed in this environment
    python .ci/lock.py --check   change nothing; exit 1 listing each difference between the two

The walk starts at the lines of the two requirement files and follows each installed package's own
requirements (importlib.metadata), with their markers evaluated for this interpreter and platform and the
extras that were asked for. Only what the walk reaches is pinned, so pip, setuptools and wheel are left out
unless a package needs them here. A package's local version label (torch's "+cpu") is dropped: PyPI serves
no such build, and a pin without a label accepts every build of that release.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import platform
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
ROOT_FILES = ("requirements.txt", "requirements-test.txt")
LOCK = ROOT / "constraints.txt"
HEADER = """\
# Every package requirements.txt and requirements-test.txt install, direct or indirect, at the version the
# tests passed with; pip reads it with -c (it pins versions, it installs nothing by itself).
# Written by `python .ci/lock.py` on {where}; do not edit by hand.
# `python .ci/lock.py --check` lists what differs from the installed packages.
"""


def requirement_lines(path: Path) -> list[Requirement]:
    """The requirements a requirements file names, following its -r lines (relative to the file, as pip does).

    Other options are skipped: -c names a constraints file, not a requirement, and the project's own line
    (-e .) adds nothing, since pyproject.toml takes the project's dependencies from requirements.txt.
    """
    found: list[Requirement] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            found += requirement_lines(path.parent / line.split(None, 1)[1])
        elif not line.startswith("-") and line != ".":
            found.append(Requirement(line))
    return found


def applies(requirement: Requirement, extras: set[str]) -> bool:
    """Whether a requirement holds here for a package installed with these extras ("" = none)."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in extras)


def walk(roots: list[Requirement]) -> tuple[dict[str, str], list[str]]:
    """Every package the roots need here, by canonical name, at its installed version (without a local label).

    Also returns the problems met: a needed package that is not installed, or one whose installed version
    does not meet what a requirer asks for. A lock is written only when there are none.
    """
    versions: dict[str, str] = {}
    extras_done: dict[str, set[str]] = {}
    problems: list[str] = []
    queue = [(req, "the requirement files") for req in roots if applies(req, {""})]
    while queue:
        req, wanted_by = queue.pop()
        name = canonicalize_name(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{req} (wanted by {wanted_by}) is not installed")
            continue
        installed = Version(dist.version)
        if not req.specifier.contains(installed, prereleases=True):
            problems.append(f"{name} {installed} is installed but {wanted_by} wants {req}")
        new_extras = ({""} | set(req.extras)) - extras_done.get(name, set())
        if not new_extras:
            continue
        extras_done.setdefault(name, set()).update(new_extras)
        versions[name] = installed.public
        for line in dist.requires or []:
            sub = Requirement(line)
            if applies(sub, new_extras):
                queue.append((sub, f"{name} {installed.public}"))
    return versions, problems


def current() -> tuple[dict[str, str], list[str]]:
    roots = [req for name in ROOT_FILES for req in requirement_lines(ROOT / name)]
    return walk(roots)


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """The pins of a constraints file, by canonical name (an absent file has none)."""
    if not path.exists():
        return {}
    pins: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def differences(locked: dict[str, str], installed: dict[str, str]) -> list[str]:
    """One line per package whose pin and installed version disagree, in name order."""
    lines = []
    for name in sorted(locked.keys() | installed.keys()):
        pin, have = locked.get(name), installed.get(name)
        if pin is None:
            lines.append(f"{name}: needed here at {have}, not in constraints.txt")
        elif have is None:
            lines.append(f"{name}: pinned at {pin}, no longer needed")
        elif pin != have:
            lines.append(f"{name}: pinned at {pin}, installed {have}")
    return lines


def render(versions: dict[str, str]) -> str:
    where = f"{platform.system()} {platform.machine()}, Python {platform.python_version()}"
    pins = "".join(f"{name}=={versions[name]}\n" for name in sorted(versions))
    return HEADER.format(where=where) + pins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 listing differences")
    args = parser.parse_args(argv)
    versions, problems = current()
    if problems:
        print("The installed packages do not meet the requirement files:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    if args.check:
        diff = differences(read_lock(), versions)
        if diff:
            print("constraints.txt differs from the installed packages:", *diff, sep="\n  ", file=sys.stderr)
            print("Refresh it with: python .ci/lock.py", file=sys.stderr)
            return 1
        print(f"constraints.txt matches the {len(versions)} installed packages.")
        return 0
    LOCK.write_text(render(versions), encoding="utf-8")
    print(f"Wrote {LOCK.name}: {len(versions)} packages.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
