"""The lab's Explore tools talk to the backend contract (model/backend.py) only: outside the modules of the tools
that read the own engine's modules and weights (each refused by name on another backend, ModelEntry.require),
no lab module reaches a model entry's own-engine model (`entry.model`) or a decoder's (`decoder.model`); they
run the model through `entry.backend` (and model.backend_decoder.make_decoder). A new tool that reached for the
own engine in a contract module would run on the own engine alone and fail on nnsight: this test names it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The modules allowed to read the own engine's model, and why (the tool each serves is refused by name on a
# model another backend runs: lab.catalogue.models.OWN_ENGINE_TOOLS, model.backend.BACKEND_TOOLS).
OWN_ENGINE_MODULES = {
    "lab/inside.py": "Inside one cell rebuilds a cell with the own engine's layer modules",
    "lab/circuits.py": "the Circuits view reads the own engine's weights",
    "lab/circuits_atp.py": "attribution patching takes gradients through the own engine",
    "lab/circuits_heads.py": "OV/QK circuits read the own engine's weights",
    "lab/circuits_records.py": "DLA and composition read the own engine's weights",
    "lab/training.py": "training trains an own-engine model",
    "lab/shown.py": "the ‖a·v·W_O‖ colouring reads the own engine's values",
    "lab/session.py": "the positional table is the own engine's embedding",
    "lab/heads.py": "the logit lens reads the own engine's final norm and output head",
    "lab/catalogue/first_views.py": "the built-ins' first views are computed on their own-engine models",
    "lab/catalogue/ownmodels.py": "a person's own models are counted by their weights",
    "lab/catalogue/uploads.py": "a model file to download is written from its weights",
}
HOLDERS = ("entry", "decoder", "d")  # names (or attribute names) that hold a model entry or a decoder


def own_engine_reads(path: Path) -> list[int]:
    """Lines where the module reads `<entry or decoder>.model`."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr == "model":
            holder = node.value
            name = holder.id if isinstance(holder, ast.Name) else holder.attr if isinstance(holder, ast.Attribute) else ""
            if name in HOLDERS:
                lines.append(node.lineno)
    return lines


def test_only_the_own_engine_tools_reach_the_own_engine():
    found = {}
    for path in sorted((ROOT / "lab").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in OWN_ENGINE_MODULES and (lines := own_engine_reads(path)):
            found[rel] = lines
    assert not found, f"lab modules reading the own engine's model outside the contract: {found}"


def test_every_module_listed_still_needs_the_own_engine():
    """The list stays true: a module that no longer reads the own engine's model leaves it."""
    stale = [rel for rel in OWN_ENGINE_MODULES if not own_engine_reads(ROOT / rel)]
    assert not stale, f"listed as reading the own engine's model but do not: {stale}"
