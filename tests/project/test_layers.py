"""The shape of the code: imports run one way (model ← lab ← app; viz beside), and facts have one home.

Import direction is read from the source with `ast` (every `import` statement, wherever it is),
and also checked at run time: importing a layer loads none of the layers above it. The rules that keep
the code in shape read the same `ast` scan of the project (app.py, model/, lab/, ui/, viz/, bench/):
no import loops, no module reading another's `_private` names, no page policy in the engine, and a
size cap per file and per function with named exceptions.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from lab import limits

ROOT = Path(__file__).resolve().parents[2]
# package → top-level modules it must never import
FORBIDDEN = {
    "model": {"lab", "viz", "app", "gradio", "plotly", "bench", "ui"},
    "viz": {"model", "lab", "app", "gradio", "torch", "bench", "ui"},  # the gr.Plot hand-off is ui/plots.py
    "lab": {"app", "gradio", "plotly", "bench", "ui"},  # the lab hands numbers to viz, never figures
    "ui": {"app", "model", "bench"},  # the wiring talks to the lab layer, never to the engine
}
for _banned in FORBIDDEN.values():  # transformers is the tests' reference (and the benchmarks'), never the app's
    _banned.add("transformers")


def test_the_app_never_imports_transformers():
    assert "transformers" not in imported_modules(ROOT / "app.py")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_run_in_one_direction(package):
    sources = sorted((ROOT / package).rglob("*.py"))
    assert sources, f"no sources in {package}/"
    offenders = {str(p.relative_to(ROOT)): sorted(imported_modules(p) & FORBIDDEN[package]) for p in sources}
    assert {p: bad for p, bad in offenders.items() if bad} == {}


def test_the_ast_check_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    import gradio as gr\n    from lab.session import Session\n")
    assert imported_modules(f) == {"gradio", "lab"}


@pytest.mark.parametrize("module,absent", [
    ("model.train", ("lab", "viz", "app", "gradio")),
    ("lab.session", ("app", "gradio")),
    ("viz", ("torch", "gradio", "model", "lab")),
])
def test_importing_a_layer_loads_nothing_above_it(module, absent):
    code = f"import sys, {module}; print([m for m in {list(absent)!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def test_no_sys_path_edits_or_e402_imports():
    offenders = []
    for path in sorted({ROOT / "app.py", *ROOT.glob("*/*.py"), *ROOT.glob("tests/**/*.py")} - {Path(__file__).resolve()}):
        if ".venv" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        if "sys.path.insert" in text or "sys.path.append" in text or "noqa: E402" in text:
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


@pytest.mark.parametrize("path", ["app.py", *sorted(p.name for p in (ROOT / "ui").glob("*.py"))])
def test_handlers_never_reach_past_the_session(path):
    """The wiring talks to a person's lab through Session's verbs and read-outs, not its insides."""
    text = (ROOT / path if path == "app.py" else ROOT / "ui" / path).read_text(encoding="utf-8")
    inside = re.findall(r"session\.(decoder|last_step|run|models|notices|prompt|entry)\b", text)
    assert inside == []
    assert not re.search(r"^from model\b|^import model\b", text, re.M), f"{path} imports the engine directly"


# What a person's lab keeps that the wiring must reach only through a verb: the text (lab.text.Text) and the
# head tools' settings. ui/ has no other object with these attributes, so any receiver counts (session, ses, s).
SESSION_INSIDES = {"text", "probe"}


def session_insides(path: Path) -> list[str]:
    """Where a file reads `.text` or `.probe` of anything (also by getattr): `line: the expression`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in SESSION_INSIDES:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2
              and node.func.id in ("getattr", "setattr", "hasattr") and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in SESSION_INSIDES):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", ["app.py", *sorted(f"ui/{p.name}" for p in (ROOT / "ui").glob("*.py"))])
def test_handlers_reach_the_lab_through_one_door_per_tool(path):
    """A handler calls a verb of the session or of one of its parts (`session.heads.set_ablation(...)`,
    `session.inside.cell(...)`, `session.sweeps.run(...)`): never a lab function over the session's text or
    head settings, which would put the tool's steps in the wiring."""
    assert session_insides(ROOT / path) == []


def test_the_door_check_sees_any_receiver(tmp_path):
    f = tmp_path / "h.py"
    f.write_text("def h(ses, s):\n    lab.cell(ses.text, s.probe, 1)\n    return getattr(ses, 'probe').heads\n")
    assert session_insides(f) == ["2: ses.text", "2: s.probe", "3: getattr(ses, 'probe')"]


# Per-person state lives on the person's Session (its parts), never in a module-level table keyed by session:
# such a table outlives nobody's turn lock, and is one more door to a person's state. A module-level mapping
# is allowed only as a constant table: an all-caps name, not weakly keyed, that no file of lab/, ui/ or app.py
# ever changes (item assignment or deletion, or a call of a mutating method).
# Named exceptions, each with why it is no person's state (a stale one fails the test below).
STATE_TABLES_ALLOWED = {
    "lab/sessionfile.py::_CHECKSUMS": "the SHA-256 of each built-in model's shipped file, by model name: the same "
    "for every person, computed once per process",
}
MAPPING_CALLS = {"dict", "OrderedDict", "defaultdict", "Counter", "ChainMap"}
WEAK_MAPPINGS = {"WeakKeyDictionary", "WeakValueDictionary"}
MUTATORS = {"pop", "popitem", "setdefault", "update", "clear", "__setitem__", "__delitem__"}


def _mapping_kind(value: ast.AST | None) -> str | None:
    """"weak", "mapping" or None: what a module-level value is."""
    if isinstance(value, (ast.Dict, ast.DictComp)):
        return "mapping"
    if isinstance(value, ast.Call):
        name = (_dotted(value.func) or [""])[-1]
        return "weak" if name in WEAK_MAPPINGS else "mapping" if name in MAPPING_CALLS else None
    return None


def _module_statements(tree: ast.Module):
    """The statements that run at import: the module's body, and the bodies of its top-level if/try/with."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            stack.extend([*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                          *[s for h in getattr(node, "handlers", []) for s in h.body]])


def _mutated_names(tree: ast.AST) -> set[str]:
    """Names (bare, or the last part of `module.NAME`) whose items a file assigns or deletes, or on which it
    calls a mutating method."""
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = assigned(node)
        elif isinstance(node, ast.Delete):
            targets = node.targets
        targets = [t.value for t in targets if isinstance(t, ast.Subscript)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets.append(node.func.value)
        found.update(chain[-1] for t in targets if (chain := _dotted(t)))
    return found


def module_state_tables(root: Path = ROOT, allowed=STATE_TABLES_ALLOWED) -> list[str]:
    """Module-level mappings in lab/, ui/ and app.py that are not constant tables (see above), but those `allowed`."""
    paths = [p for p in [root / "app.py", *sorted((root / "lab").rglob("*.py")), *sorted((root / "ui").rglob("*.py"))]
             if p.exists()]
    trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in paths}
    mutated = set().union(*(_mutated_names(t) for t in trees.values()))
    found = []
    for path, tree in trees.items():
        for node in _module_statements(tree):
            kind = _mapping_kind(getattr(node, "value", None)) if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            for name in (t.id for t in assigned(node) if kind and isinstance(t, ast.Name)):
                why = ("a weakly keyed table" if kind == "weak" else "not an all-caps constant"
                       if not re.fullmatch(r"_?[A-Z][A-Z0-9_]*", name) else "changed after import" if name in mutated
                       else None)
                if why and f"{path.relative_to(root)}::{name}" not in allowed:
                    found.append((str(path.relative_to(root)), node.lineno, f"{name}: {why}"))
    return [f"{where}:{line} {what}" for where, line, what in sorted(found)]


def test_no_module_level_table_keeps_per_session_state():
    tables = module_state_tables()
    assert not tables, "module-level tables that keep state (keep it on the Session's parts):\n" + "\n".join(tables)
    flagged = {line.split(":")[0] + "::" + line.split(" ")[1].rstrip(":") for line in module_state_tables(allowed={})}
    assert set(STATE_TABLES_ALLOWED) <= flagged, "an exception no longer needed: drop it"
    assert all(why.strip() for why in STATE_TABLES_ALLOWED.values())


def test_the_table_check_catches_state_kept_by_session(tmp_path):
    (tmp_path / "lab").mkdir()
    (tmp_path / "ui").mkdir()
    (tmp_path / "lab" / "patching.py").write_text(
        "import threading, weakref\nfrom collections import OrderedDict\n\n"
        "_RUNNING: 'weakref.WeakKeyDictionary' = weakref.WeakKeyDictionary()\n"
        "SWEEPS = {'heads': 'head outputs'}\nseen = OrderedDict()\n\n\n"
        "def run(session):\n    _RUNNING[session] = threading.Event()\n")
    (tmp_path / "ui" / "patching.py").write_text(
        "_LAST = {}\nLABELS = dict(a=1)\n\n\ndef keep(session, r):\n    _LAST[session] = r\n")
    (tmp_path / "ui" / "train.py").write_text(
        "from lab import patching\nif True:\n    _REFUSALS = dict()\n\n\n"
        "def told(session):\n    patching.SWEEPS.update(x=1)\n    return _REFUSALS.pop(session, None)\n")
    assert module_state_tables(tmp_path) == [
        "lab/patching.py:4 _RUNNING: a weakly keyed table",
        "lab/patching.py:5 SWEEPS: changed after import",
        "lab/patching.py:6 seen: not an all-caps constant",
        "ui/patching.py:1 _LAST: changed after import",
        "ui/train.py:3 _REFUSALS: changed after import",
    ]


def test_the_wiring_is_small_enough_to_read():
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in [ROOT / "app.py", *(ROOT / "ui").glob("*.py")]}
    assert all(n <= 350 for n in sizes.values()), sizes


def test_readme_limits_table_is_what_the_limits_module_says():
    readme = (ROOT / "docs" / "operating.md").read_text(encoding="utf-8")  # the operators' page holds the table
    section = readme.split("## Limits", 1)[1]
    table = [line for line in section.splitlines() if line.startswith("|")]
    table = table[: len(limits.limits_table())]
    assert table == limits.limits_table()


def test_the_ui_reads_its_ranges_from_the_limits_module():
    """Every slider and number input that bounds a checked value shows the checked range."""
    import gradio as gr

    import app

    demo = app.build_demo()
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    expect = {
        "temperature": limits.TEMPERATURE_RANGE, "top_k": limits.TOP_K_RANGE, "top_p": limits.TOP_P_RANGE,
        "layers": limits.TRAIN_LIMITS["layers"], "heads": limits.TRAIN_LIMITS["heads"],
        "d_model": limits.TRAIN_LIMITS["d_model"], "d_ff": limits.TRAIN_LIMITS["d_ff"],
        "dropout": limits.TRAIN_LIMITS["dropout"],
    }
    for elem_id, (lo, hi) in expect.items():
        block = by_id[elem_id]
        assert isinstance(block, gr.Slider) and (block.minimum, block.maximum) == (lo, hi), elem_id
    assert by_id["max_new"].maximum == limits.MAX_NEW_TOKENS
    assert by_id["prompt"].max_length == limits.MAX_PROMPT_CHARS
    assert (by_id["seed"].minimum, by_id["seed"].maximum) == limits.SEED_RANGE
    assert by_id["view"].choices == [(v, v) for v in limits.ATTENTION_VIEWS]
    assert [c[0] for c in by_id["corpus"].choices] == list(limits.TRAIN_CORPORA)
    assert [c[1] for c in by_id["pos"].choices] == list(limits.POS_ENCODINGS)


# The project as modules: the rules below share one `ast` scan of app.py and every .py file under the packages.
PROJECT = ("app.py", "model", "lab", "ui", "viz", "bench")


def project_files(root: Path = ROOT) -> dict[str, Path]:
    """Module name (`lab.session`, `model.families`, `app`) → its file."""
    files = {}
    for entry in PROJECT:
        top = root / entry
        for path in [top] if top.suffix == ".py" else sorted(top.rglob("*.py")):
            if path.exists():
                parts = list(path.relative_to(root).with_suffix("").parts)
                files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def assigned(node: ast.AST) -> list[ast.AST]:
    """The targets of an assignment statement (none for other nodes)."""
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []


class Import(NamedTuple):
    line: int
    target: str  # the project module it loads
    name: str | None  # the name it takes from that module; None: the module itself
    bound: str  # the name it binds in the file
    bound_module: str | None  # the module that name stands for (`import a.b` binds a); None: not a module


def importable_nodes(tree: ast.AST):
    """Every node of a file but those under `if __name__ == "__main__":`: that block runs only when the file is
    the program (as module `__main__`, as `python -m model.train` hands over to model/cli.py), never when the
    file is imported, so its imports cannot close a loop."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node)
                     if not (isinstance(child, ast.If) and ast.unparse(child.test) == "__name__ == '__main__'"))


def project_imports(module: str, path: Path, modules) -> list[Import]:
    """Every import statement of one file, module level and inside functions, that names a project module."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in importable_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                prefixes = [".".join(alias.name.split(".")[:i]) for i in range(alias.name.count(".") + 1, 0, -1)]
                target = next((m for m in prefixes if m in modules), None)
                if target:
                    bound = alias.asname or alias.name.split(".")[0]
                    found.append(Import(node.lineno, target, None, bound, target if alias.asname else bound))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)] if package else []
                base = ".".join([*up, *([node.module] if node.module else [])])
            for alias in node.names:
                bound = alias.asname or alias.name
                if f"{base}.{alias.name}" in modules:
                    found.append(Import(node.lineno, f"{base}.{alias.name}", None, bound, f"{base}.{alias.name}"))
                elif base in modules:
                    found.append(Import(node.lineno, base, None if alias.name == "*" else alias.name, bound, None))
    return found


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module → {project module it imports: the line of the first such import}."""
    files = project_files(root)
    graph = {m: {} for m in files}
    for module, path in files.items():
        for imp in project_imports(module, path, files):
            if imp.target != module:
                graph[module].setdefault(imp.target, imp.line)
    return graph


def reachable(graph: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    """module → every module it reaches through imports (itself only when on a loop)."""
    out = {}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo.extend(graph.get(node, ()))
        out[start] = seen
    return out


def import_cycles(graph: dict[str, dict[str, int]], limit: int = 100) -> list[str]:
    """Every elementary cycle (up to `limit`), each written from its smallest module round to it again with the
    line of each import, e.g. `lab.session →(35) lab.probing →(12) lab.session`. The walk only enters modules
    from which start can be reached again: without that, a project with no loop at all would still have every
    path through its import graph walked (about a minute here), since no path can be ruled out early."""
    cycles = []
    reach = reachable(graph)

    def walk(start, node, path, seen):
        for nxt in sorted(graph.get(node, ())):
            if len(cycles) >= limit:
                return
            if start not in reach.get(nxt, ()):  # no way back to start from there: no loop through it
                continue
            if nxt == start:
                steps = [f"{a} →({graph[a][b]}) " for a, b in zip(path, path[1:] + [start])]
                cycles.append("".join(steps) + start)
            elif nxt > start and nxt not in seen:
                walk(start, nxt, path + [nxt], seen | {nxt})

    for start in sorted(graph):
        walk(start, start, [start], {start})
    return cycles


def test_no_import_loops_anywhere_in_the_project():
    """No module imports, at module level or inside a function (or under `if TYPE_CHECKING:`: a loop that only
    types see is still two files that need each other), a module that imports it back, however far round. Only
    a file's `if __name__ == "__main__":` block is left out (see importable_nodes)."""
    graph = import_graph()
    assert {"app", "model.transformer", "lab.session", "ui.common", "viz", "bench.common"} <= set(graph)
    cycles = import_cycles(graph)
    assert not cycles, "import loops (the line of each import):\n" + "\n".join(cycles)


def test_the_loop_finder_sees_a_loop_through_a_function_level_and_a_relative_import(tmp_path):
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "__init__.py").write_text("")
    (tmp_path / "lab" / "a.py").write_text("from . import b\n")
    (tmp_path / "lab" / "b.py").write_text("import os\n\n\ndef f():\n    from lab.c import g\n")
    (tmp_path / "lab" / "c.py").write_text("import lab.a as a\nfrom lab import b\n")
    graph = import_graph(tmp_path)
    assert graph["lab.a"] == {"lab.b": 1} and graph["lab.b"] == {"lab.c": 5}
    assert import_cycles(graph) == ["lab.a →(1) lab.b →(5) lab.c →(1) lab.a", "lab.b →(5) lab.c →(2) lab.b"]


def test_a_program_block_hands_over_without_a_loop(tmp_path):
    # model/train.py's `if __name__ == "__main__":` imports model/cli.py, which imports model/train.py: the
    # block runs only as the program, so it is no loop; the same import anywhere else in the file is one
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "__init__.py").write_text("")
    (tmp_path / "model" / "cli.py").write_text("from .train import train\n")
    (tmp_path / "model" / "train.py").write_text(
        'def train():\n    pass\n\n\nif __name__ == "__main__":\n    from .cli import main\n')
    assert import_graph(tmp_path)["model.train"] == {} and import_cycles(import_graph(tmp_path)) == []
    (tmp_path / "model" / "train.py").write_text("def train():\n    from .cli import main\n")
    assert import_cycles(import_graph(tmp_path)) == ["model.cli →(1) model.train →(2) model.cli"]


# namedtuple's public API spells its names with one underscore
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def class_private_names(tree: ast.AST) -> set[str]:
    """The private names a file's classes define: methods and class attributes, and `self._x` / `cls._x`
    assigned in their methods."""
    names = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            else:
                names.update(t.id for t in assigned(node) if isinstance(t, ast.Name))
        for node in ast.walk(cls):
            for t in assigned(node):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"):
                    names.add(t.attr)
    return {n for n in names if is_private(n)} - PUBLIC_UNDERSCORE


def _dotted(node: ast.AST) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None for anything but names and attributes."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return inner and [*inner, node.attr]
    return None


def private_reads(root: Path = ROOT) -> list[str]:
    """Where a project file reads a private name that another file defines (see the test below)."""
    files = project_files(root)
    trees = {m: ast.parse(p.read_text(encoding="utf-8")) for m, p in files.items()}
    owners: dict[str, set[str]] = {}
    for module, tree in trees.items():
        for name in class_private_names(tree):
            owners.setdefault(name, set()).add(module)
    found = []
    for module, path in files.items():
        where = str(path.relative_to(root))
        own = class_private_names(trees[module])
        bound = {}
        for imp in project_imports(module, path, files):
            package = imp.target.rpartition(".")[0]
            if is_private(imp.target.rpartition(".")[2]) and module != package and not module.startswith(package + "."):
                found.append(f"{where}:{imp.line} imports {imp.target}, private to its package")
            if imp.name and is_private(imp.name) and imp.target != module:
                found.append(f"{where}:{imp.line} imports {imp.name} from {imp.target}")
            if imp.bound_module:
                bound[imp.bound] = imp.bound_module
        for node in ast.walk(trees[module]):
            if isinstance(node, ast.Attribute):
                value, attr = node.value, node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2
                  and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                value, attr = node.args[0], node.args[1].value
            else:
                continue
            if not is_private(attr) or attr in PUBLIC_UNDERSCORE:
                continue
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            chain = _dotted(value)
            if chain and chain[0] in bound:
                target = ".".join([bound[chain[0]], *chain[1:]])
                if target in files and target != module:
                    found.append(f"{where}:{node.lineno} reads {target}.{attr}")
                    continue
            others = owners.get(attr, set()) - {module}
            if others and attr not in own:
                found.append(f"{where}:{node.lineno} reads .{attr} of a class in {', '.join(sorted(others))}")
    return sorted(set(found))


def test_no_module_reads_another_modules_private_names():
    """A name that starts with one underscore belongs to the file that defines it (a private module, like
    viz/_common.py, to its package). Caught, in app.py, model/, lab/, ui/, viz/ and bench/:
    - `from x import _y`, and importing a private module from outside its package;
    - `x._y` (and `getattr(x, "_y")`) where `x` is a project module the file imported;
    - `obj._y` where `obj` is not `self`/`cls` and `_y` is a private method or attribute (`self._y = …`) that a
      class of another file defines, e.g. `session._turn` in lab/export.py.
    Limits: types are not inferred, so the last check goes by name. It says nothing when the reading file's own
    classes define the same name (`other._y` in `__eq__` is fine, but so, unseen, is a foreign object's `_y`
    of that name), nor for names built at run time (`getattr(x, name)`) or private names of other libraries."""
    reads = private_reads()
    assert not reads, "private names read across files:\n" + "\n".join(reads)


def test_the_private_check_sees_imports_modules_and_foreign_objects(tmp_path):
    (tmp_path / "lab").mkdir()
    (tmp_path / "viz").mkdir()
    (tmp_path / "lab" / "session.py").write_text(
        "class Session:\n    def __init__(self):\n        self._turn = 1\n\n    def _draw(self):\n"
        "        return self._turn\n\n\ndef _helper():\n    pass\n")
    (tmp_path / "viz" / "_common.py").write_text("def shared():\n    pass\n")
    (tmp_path / "viz" / "film.py").write_text("from ._common import shared\n")  # its own package: fine
    (tmp_path / "lab" / "export.py").write_text(
        "from lab.session import _helper\nimport lab.session as ls\nfrom viz._common import shared\n\n\n"
        "def f(session):\n    ls._helper()\n    getattr(session, '_turn')\n    return session._draw(), p._replace()\n")
    assert private_reads(tmp_path) == [
        "lab/export.py:1 imports _helper from lab.session",
        "lab/export.py:3 imports viz._common, private to its package",
        "lab/export.py:7 reads lab.session._helper",
        "lab/export.py:8 reads ._turn of a class in lab.session",
        "lab/export.py:9 reads ._draw of a class in lab.session",
    ]


def top_level_names(path: Path) -> set[str]:
    """The names a file defines at module level (functions, classes, assignments), not those it imports."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        else:
            for t in assigned(node):
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def test_the_engine_holds_no_page_policy():
    """model/ is the engine, what the CLI and any page share. Beyond importing nothing above it (FORBIDDEN above:
    no lab, ui, viz, app, bench, gradio or plotly), it holds none of the page's policy:
    - no top-level name that lab/recipe.py (the Train tab's recipe: sizes, batch, window, bf16 choice) defines;
    - no top-level name that names a tab (`train_tab_recipe`, `TAB_BATCH_SIZE`): the page's choices live in lab/;
    - no `DECODER_LAB_*` setting read: the server's limits, budgets and rates are the lab's."""
    recipe = ROOT / "lab" / "recipe.py"
    recipe_names = top_level_names(recipe) if recipe.exists() else set()
    offenders = []
    for path in sorted((ROOT / "model").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        names = top_level_names(path)
        offenders += [f"{where} defines {n}, the Train tab's recipe" for n in sorted(names & recipe_names)]
        offenders += [f"{where} defines {n}" for n in sorted(names) if re.search(r"(?i)(^|_)tabs?(_|$)", n)]
        settings = {n.value for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("DECODER_LAB_")}
        offenders += [f"{where} reads {s}" for s in sorted(settings)]
    assert not offenders, "page policy in the engine:\n" + "\n".join(offenders)


MAX_FILE_LINES = 500  # app.py, model/, lab/, ui/, viz/, bench/
MAX_TEST_FILE_LINES = 700  # a test file is a list of independent cases, read one at a time, not top to bottom
MAX_FUNCTION_LINES = 80  # from `def` to its last line, its docstring not counted
# Each exception is named and says why it is better whole. A file or function not listed here keeps the cap.
LONG_FILES: dict[str, str] = {}
LONG_FUNCTIONS = {
    "model/fastpath.py::ManualStep.forward_backward": "the hand-written forward and backward of the whole network "
    "in one pass, each gradient a few lines under the forward step it undoes (as llm.c writes it); split, a reader "
    "loses that pairing",
    "model/checkpoint.py::parse_checkpoint": "every check of an untrusted file in the order they run, so the refusals "
    "can be audited top to bottom",
    "model/film.py::film_from_tensors": "every check of a film read from an untrusted file in the order they run, as "
    "its docstring lists them",
}


def function_lengths(path: Path) -> dict[str, int]:
    """`Class.method` or `function` → its length in lines, its docstring not counted (nested ones too)."""
    lengths = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = child.end_lineno - child.lineno + 1
                first = child.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                        and isinstance(first.value.value, str):
                    n -= first.end_lineno - first.lineno + 1
                lengths[prefix + child.name] = n
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return lengths


def test_every_file_and_function_keeps_to_its_size_cap():
    sources = [*project_files().values(), *sorted((ROOT / "tests").rglob("*.py"))]
    too_long = {}
    for path in sources:
        where = str(path.relative_to(ROOT))
        cap = MAX_TEST_FILE_LINES if where.startswith("tests/") else MAX_FILE_LINES
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > cap and where not in LONG_FILES:
            too_long[where] = f"{lines} lines (cap {cap})"
        for name, n in function_lengths(path).items():
            if n > MAX_FUNCTION_LINES and f"{where}::{name}" not in LONG_FUNCTIONS:
                too_long[f"{where}::{name}"] = f"{n} lines (cap {MAX_FUNCTION_LINES})"
    assert not too_long, "over the size cap:\n" + "\n".join(f"{k}: {v}" for k, v in sorted(too_long.items()))


def test_every_size_exception_names_something_that_still_needs_it():
    """An exception whose file shrank, or whose function moved, goes: the list says what is long today."""
    stale = [key for key in LONG_FILES if len((ROOT / key).read_text(encoding="utf-8").splitlines()) <= MAX_FILE_LINES]
    for key in LONG_FUNCTIONS:
        file, name = key.split("::")
        if function_lengths(ROOT / file).get(name, 0) <= MAX_FUNCTION_LINES:
            stale.append(key)
    assert stale == []
    assert all(why.strip() for why in [*LONG_FILES.values(), *LONG_FUNCTIONS.values()])


# lab/ by audience: the person's lab at the top reads the catalogue and the server's shared budgets; those two
# never read the person's lab. Only lab.limits and lab.checks, which every part of lab/ reads, sit beside them.
# Package → the project modules (and their submodules) it may import; anything else of the project is refused.
LAB_AUDIENCES = {
    "lab.server": ("lab.limits", "lab.checks", "lab.server", "model"),
    "lab.catalogue": ("lab.limits", "lab.checks", "lab.catalogue", "lab.server", "model"),
}


def audience_offenders(root: Path = ROOT) -> list[str]:
    """Where a module of lab/server/ or lab/catalogue/ imports a project module its package may not read."""
    files = project_files(root)
    found = []
    for module, path in files.items():
        package = next((p for p in LAB_AUDIENCES if module == p or module.startswith(p + ".")), None)
        if package is None:
            continue
        for imp in project_imports(module, path, files):
            if not any(imp.target == ok or imp.target.startswith(ok + ".") for ok in LAB_AUDIENCES[package]):
                found.append(f"{path.relative_to(root)}:{imp.line} imports {imp.target}")
    return sorted(found)


def test_the_servers_budgets_and_the_catalogue_never_import_a_persons_lab():
    """lab/server/ (sessions, rates, budgets, warm texts, files) imports only lab.limits, lab.checks, lab.server.*
    and the engine (besides the standard library and third-party packages); lab/catalogue/ may read the server's
    budgets too, but neither reads a person's lab (lab.session, lab.text, ...), viz, ui or app."""
    assert {"lab.server.budget", "lab.catalogue.models"} <= set(project_files())
    offenders = audience_offenders()
    assert not offenders, "lab/server/ or lab/catalogue/ reaching up:\n" + "\n".join(offenders)


def test_the_audience_check_sees_relative_absolute_and_function_level_imports(tmp_path):
    for folder in ("lab", "lab/server", "lab/catalogue", "model"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    for name in ("limits", "checks", "session", "text"):
        (tmp_path / "lab" / f"{name}.py").write_text("")
    (tmp_path / "model" / "film.py").write_text("")
    (tmp_path / "lab" / "server" / "warm.py").write_text(
        "import os\nfrom ..limits import A\nfrom model.film import F\nfrom . import rates\n\n\n"
        "def f():\n    from ..session import Session\n")
    (tmp_path / "lab" / "server" / "rates.py").write_text("from lab.checks import UserError\nimport lab.text\n")
    (tmp_path / "lab" / "catalogue" / "models.py").write_text("from ..server import warm\nfrom lab import session\n")
    assert audience_offenders(tmp_path) == [
        "lab/catalogue/models.py:2 imports lab.session",
        "lab/server/rates.py:2 imports lab.text",
        "lab/server/warm.py:8 imports lab.session",
    ]
