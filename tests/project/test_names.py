"""One name, one concept (issue 38): a public top-level name of model/, lab/, viz/ or ui/ (a function, a class,
a module constant; not starting with `_`) is defined in one module only, so that `read_header` or `Frame`
means one thing wherever a reader meets it.

The exceptions listed below, each with its reason, are parallel families: several modules that answer the
same question each for its own case (each model family's importer defines `model_config`). Any other shared
name is renamed to say which concept it is (`causal_mask` in the engine, `future_mask` in the figures), or
kept once in the lower layer and imported. An entry must match the tree exactly: a family that loses a
member, or gains one, fails until the list says so.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("model", "lab", "viz", "ui")

# every Hugging Face family importer (model/families/*.py but the package and its shared helpers)
FAMILIES = tuple(sorted(f"model/families/{p.name}" for p in (ROOT / "model" / "families").glob("*.py")
                        if p.name not in ("__init__.py", "common.py")))

def public_names(tree: ast.Module) -> set[str]:
    """The names a module's top level defines: functions, classes and assigned constants (imports are
    uses of a name defined elsewhere, not definitions)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


IMPORTERS = (*FAMILIES, "model/nanogpt.py", "model/nanochat.py")

# Parallel families: the same name in each module on purpose (callers pick the module, then use the name).
PARALLEL = {
    # every importer answers the same questions for its own architecture: a Hugging Face family (its FAMILY,
    # model_config, expected_shapes, convert), and the two checkpoint formats read beside them (nanoGPT's and
    # nanochat's: their meta, their tensors)
    **{name: {f for f in IMPORTERS
           if (ROOT / f).exists() and name in public_names(ast.parse((ROOT / f).read_text(encoding="utf-8")))}
       for name in ("FAMILY", "model_config", "convert", "expected_shapes", "read_meta", "check_tensors")},
    # each module's refusal message for a page or export with no text yet, worded for that page
    "NO_TEXT": {"lab/export.py", "ui/explore.py", "ui/heads.py"},
    # each CSV export's own columns (the Inside lesson's numbers, the patching sweep's cells)
    "CSV_COLUMNS": {"lab/inside.py", "lab/patching.py"},
    # the module logger, one per module that logs
    "log": {"lab/server/warm.py", "ui/common.py", "ui/http.py"},
    # a module run with `python -m` has its own entry point
    "main": {"lab/catalogue/first_views.py", "model/convert.py", "model/film_series.py"},
    # the file format name and size bound of each file kind (a checkpoint, a session file)
    "FORMAT": {"lab/sessionfile.py", "model/checkpoint.py"},
    "MAX_FILE_BYTES": {"lab/sessionfile.py", "model/checkpoint.py"},
    # the same action at two layers: the lab does it, the ui handler wraps it for the page
    "compare": {"lab/compare.py", "ui/heads.py"},
    "regenerate": {"lab/heads.py", "ui/heads.py"},
    "pairs_for": {"lab/pairs.py", "ui/heads.py"},
    "open_link": {"lab/links.py", "ui/share.py"},
    "open_session": {"lab/sessionfile.py", "ui/share.py"},
    "generate": {"model/generate.py", "ui/explore.py"},
    "head_matrices": {"ui/inside.py", "viz/inside.py"},  # the ui handler draws viz's figure of the lab's numbers
    "probabilities": {"lab/export.py", "viz/sampling.py"},  # the export of the chart and the chart
}



def defined_in() -> dict[str, set[str]]:
    where: dict[str, set[str]] = defaultdict(set)
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in public_names(ast.parse(path.read_text(encoding="utf-8"))):
                where[name].add(path.relative_to(ROOT).as_posix())
    return where


def test_the_name_finder_sees_definitions_not_imports():
    tree = ast.parse("from x import a\nimport b\ndef c(): pass\nclass D: pass\nE = 1\nF: int = 2\n_g = 3\n"
                     "def _h(): pass\n")
    assert public_names(tree) == {"c", "D", "E", "F"}


def test_no_public_name_is_defined_in_two_modules_unless_listed():
    where = defined_in()
    assert "Shown" in where and "MAP_KINDS" in where  # the scan reached the packages it checks
    clashes = {name: mods for name, mods in where.items() if len(mods) > 1}
    unlisted = {name: sorted(mods) for name, mods in clashes.items() if PARALLEL.get(name) != mods}
    assert not unlisted, ("a public name defined in more than one module (give each concept its own name, or "
                          f"list a parallel family in tests/project/test_names.py with its reason): {unlisted}")


def test_every_listed_exception_is_still_needed():
    where = defined_in()
    stale = sorted(name for name in PARALLEL if len(where.get(name, ())) < 2)
    assert not stale, f"no longer defined in two modules: take them off tests/project/test_names.py's list: {stale}"
