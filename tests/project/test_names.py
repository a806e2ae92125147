"""One name, one concept (issue 38): a public top-level name of model/, lab/, viz/ or ui/ (a function, a class,
a module constant; not starting with `_`) is defined in one module only, so that `read_header` or `Frame`
means one thing wherever a reader meets it.

Two kinds of exception are listed below, each with its reason: parallel families, where several modules
answer the same question each for its own case (each model family's importer defines `model_config`), and
names that are not yet one concept but cost more to rename than this test is worth today (kept visible
here so they are not forgotten; issue 38). An entry must match the tree exactly: a collision that goes
away, or spreads to another module, fails until the list says so.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("model", "lab", "viz", "ui")

FAMILIES = ("model/families/gpt2.py", "model/families/llama.py", "model/families/neo.py", "model/families/neox.py")

# Parallel families: the same name in each module on purpose (callers pick the module, then use the name).
PARALLEL = {
    # every Hugging Face family importer answers the same three questions for its own architecture
    "FAMILY": set(FAMILIES),
    "model_config": set(FAMILIES),
    "convert": set(FAMILIES),
    "expected_shapes": {*FAMILIES, "model/nanogpt.py"},  # nanoGPT checkpoints are read the same way
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

# Not yet one concept: to rename (issue 38), listed so that no new collision joins them unnoticed.
TO_RENAME = {
    "ACTIVATIONS": {"model/config.py", "model/families/gpt2.py", "model/families/neox.py"},  # ours vs HF's names
    "KINDS": {"lab/export.py", "viz/panels.py"},  # both ("weights", "scores"): could be one constant
    "LEVELS": {"viz/layer_heads.py", "viz/linking.py"},  # opacity steps vs colour steps
    "MAX_HEADER_BYTES": {"model/checkpoint.py", "model/families/common.py"},  # two different bounds
    "NARROW_PX": {"lab/display.py", "viz/heads.py", "viz/patching.py"},  # three different widths
    "Opened": {"lab/sessionfile.py", "model/convert.py"},  # an opened session file vs an opened model source
    "causal_mask": {"model/attention.py", "viz/attention.py"},  # a torch mask vs the numpy one viz draws
    "check_size": {"model/families/common.py", "model/nanogpt.py", "viz/_common.py"},  # model size vs a figure's
    "colorscale": {"viz/_common.py", "viz/overview.py"},
    "effect": {"lab/export.py", "lab/heads.py"},  # the export of an effect and the effect
    "first_view": {"lab/catalogue/realmodels.py", "ui/explore.py"},
    "from_state": {"model/families/common.py", "model/families/gpt2.py"},
    "open_folder": {"model/families/__init__.py", "model/families/gpt2.py"},
    "open_source": {"lab/catalogue/realmodels.py", "model/convert.py"},
    "opening": {"lab/catalogue/realmodels.py", "ui/film.py"},  # a model's opening view vs a film's first frame
    "prepare": {"lab/patching.py", "lab/training.py"},
    "read_header": {"model/checkpoint.py", "model/families/common.py", "model/st_layout.py"},
    "upload_refusal": {"lab/catalogue/uploads.py", "model/convert.py"},
}

ALLOWED = {**PARALLEL, **TO_RENAME}


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
    unlisted = {name: sorted(mods) for name, mods in clashes.items() if ALLOWED.get(name) != mods}
    assert not unlisted, ("a public name defined in more than one module (give each concept its own name, or "
                          f"list a parallel family in tests/project/test_names.py with its reason): {unlisted}")


def test_every_listed_exception_is_still_needed():
    where = defined_in()
    stale = sorted(name for name in ALLOWED if len(where.get(name, ())) < 2)
    assert not stale, f"no longer defined in two modules: take them off tests/project/test_names.py's list: {stale}"


def test_a_listed_name_is_either_a_family_or_to_rename():
    assert not set(PARALLEL) & set(TO_RENAME)
