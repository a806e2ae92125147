"""The shape of the code: imports run one way (model ← lab ← app; viz beside), and facts have one home.

Import direction is read from the source with `ast` (every `import` statement, wherever it is),
and also checked at run time: importing a layer loads none of the layers above it.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab import limits

ROOT = Path(__file__).resolve().parents[1]
# package → top-level modules it must never import
FORBIDDEN = {
    "model": {"lab", "viz", "app", "gradio", "plotly", "bench", "ui"},
    "viz": {"model", "lab", "app", "gradio", "torch", "bench", "ui"},  # the gr.Plot hand-off is ui/plots.py
    "lab": {"app", "gradio", "bench", "ui"},
    "ui": {"app", "model", "bench"},  # the wiring talks to the lab layer, never to the engine
}


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
    sources = sorted((ROOT / package).glob("*.py"))
    assert sources, f"no sources in {package}/"
    for path in sources:
        bad = imported_modules(path) & FORBIDDEN[package]
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


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
    for path in [ROOT / "app.py", *ROOT.glob("*/*.py")]:
        if ".venv" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        if "sys.path.insert" in text or "sys.path.append" in text or "noqa: E402" in text:
            offenders.append(str(path.relative_to(ROOT)))
    offenders = [o for o in offenders if o != "tests/test_layers.py"]
    assert offenders == []


@pytest.mark.parametrize("path", ["app.py", *sorted(p.name for p in (ROOT / "ui").glob("*.py"))])
def test_handlers_never_reach_past_the_session(path):
    """The wiring talks to a person's lab through Session's verbs and read-outs, not its insides."""
    text = (ROOT / path if path == "app.py" else ROOT / "ui" / path).read_text(encoding="utf-8")
    inside = re.findall(r"session\.(decoder|last_step|run|models|notices|prompt|entry)\b", text)
    assert inside == []
    assert not re.search(r"^from model\b|^import model\b", text, re.M), f"{path} imports the engine directly"


def test_the_wiring_is_small_enough_to_read():
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in [ROOT / "app.py", *(ROOT / "ui").glob("*.py")]}
    assert all(n <= 350 for n in sizes.values()), sizes


def test_readme_limits_table_is_what_the_limits_module_says():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
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
