"""ARCHITECTURE.md stays a true map of the code: every module, file and name it gives in backticks is there,
and every module of lab/ and ui/ is on it.

The map names modules as paths (`lab/session.py`) or dotted (`lab.session`, `lab.session.Session.step`); a
dotted name is followed into the file with `ast` (a top-level name, then a name its class defines), so a
function renamed or moved away is caught as surely as a file. A module added to lab/ or ui/ without a place on
the map fails the second test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "ARCHITECTURE.md"
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
PACKAGES = ("app", "model", "lab", "ui", "viz", "bench")
PATH = re.compile(r"^(?:app\.py|(?:model|lab|ui|viz|bench|tests|docs|assets)/[\w./-]*)$")
DOTTED = re.compile(rf"^(?:{'|'.join(PACKAGES)})(?:\.\w+)*$")
RUN_MODULE = re.compile(r"python -m ((?:model|lab|ui|viz|bench)(?:\.\w+)+)")
MAPPED = ("lab", "ui")  # every module of these folders must be on the map


def spans(text: str) -> list[str]:
    """What the page gives in backticks, outside code blocks (the layer drawing is a picture, not names)."""
    return SPAN.findall(FENCE.sub("", text))


def module_file(root: Path, parts: list[str]) -> Path | None:
    base = root.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def defined_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body binds: functions, classes, assignments and imports."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update((n.id, node) for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
    return names


def resolve(root: Path, dotted: str) -> tuple[str | None, str | None]:
    """(the module `dotted` names or lies in, what of it is missing): the longest prefix that is a module,
    then each further part a name bound at module level, then in that class's body."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        path = module_file(root, parts[:i])
        if path is None:
            continue
        module = ".".join(parts[:i])
        body = ast.parse(path.read_text(encoding="utf-8")).body
        for name in parts[i:]:
            node = defined_names(body).get(name)
            if node is None:
                return module, f"{dotted}: {module} has no {name}"
            body = node.body if isinstance(node, ast.ClassDef) else []
        return module, None
    return None, f"{dotted}: no such module"


def check_map(root: Path, text: str) -> tuple[list[str], set[str]]:
    """(what the map names that is not there, the modules it names)."""
    missing, named = [], set()
    for span in spans(text):
        for module in RUN_MODULE.findall(span):
            if module_file(root, module.split(".")) is None:
                missing.append(f"python -m {module}: no such module")
            named.add(module)
        if PATH.match(span):
            if not (root / span).exists():
                missing.append(f"{span}: no such file or folder")
            elif span.endswith(".py"):
                parts = list(Path(span).with_suffix("").parts)
                named.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        elif DOTTED.match(span):
            module, problem = resolve(root, span)
            missing += [problem] if problem else []
            named.update([module] if module else [])
    return missing, named


def unmapped(root: Path, named: set[str]) -> list[str]:
    """The modules of lab/ and ui/ (each .py but __init__.py, subpackages too) the map never names."""
    modules = [".".join(p.relative_to(root).with_suffix("").parts)
               for folder in MAPPED for p in sorted((root / folder).rglob("*.py")) if p.name != "__init__.py"]
    return [m for m in modules if m not in named]


def test_every_module_and_name_the_map_gives_is_there():
    missing, named = check_map(ROOT, DOC.read_text(encoding="utf-8"))
    assert {"lab.session", "lab.server.budget", "lab.catalogue.models", "model.generate", "ui.explore"} <= named
    assert missing == [], "ARCHITECTURE.md names what is not there:\n" + "\n".join(missing)


def test_every_module_of_lab_and_ui_is_on_the_map():
    _, named = check_map(ROOT, DOC.read_text(encoding="utf-8"))
    assert unmapped(ROOT, named) == [], "modules ARCHITECTURE.md does not name (add each where it belongs)"


def test_the_map_check_catches_stale_files_names_and_modules_left_off(tmp_path):
    (tmp_path / "lab" / "server").mkdir(parents=True)
    (tmp_path / "lab" / "__init__.py").write_text("")
    (tmp_path / "lab" / "server" / "__init__.py").write_text("")
    (tmp_path / "lab" / "server" / "rates.py").write_text("LIMITER = 1\n\n\nclass Store:\n    def resolve(self):\n"
                                                          "        pass\n")
    (tmp_path / "lab" / "session.py").write_text("from .server.rates import LIMITER\n")
    (tmp_path / "lab" / "text.py").write_text("")
    text = ("`lab/server/rates.py`, `lab.server.rates.Store.resolve`, `lab.session.LIMITER`, `lab/gone.py`,\n"
            "`lab.server.rates.Store.gone`, `lab.missing`, `python -m lab.nothing`, `session.heads.lens`, `/step`\n"
            "```\n`lab.text` in a code block is a picture\n```\n")
    missing, named = check_map(tmp_path, text)
    assert missing == [
        "lab/gone.py: no such file or folder",
        "lab.server.rates.Store.gone: lab.server.rates has no gone",
        "lab.missing: lab has no missing",
        "python -m lab.nothing: no such module",
    ]
    assert unmapped(tmp_path, named) == ["lab.text"]
