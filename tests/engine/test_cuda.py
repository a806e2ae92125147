"""On a CUDA GPU (skipped without one): the CLI and the Train tab train there under bf16 autocast,
the checkpoint loads on the CPU, stepping stays on the CPU, and the ZeroGPU decorator asks for time
in proportion to the run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


@pytest.mark.cuda
@cuda
def test_the_cli_trains_on_cuda_with_bf16(tmp_path):
    r = subprocess.run([sys.executable, "-m", "model.train", "--corpus", "sort", "--steps", "200", "--device", "cuda",
                        "--film", "10", "--out", str(tmp_path / "m")], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    head = json.loads(r.stdout.splitlines()[0])
    assert head["device"].startswith("cuda") and head["bf16"] is True
    done = json.loads([line for line in r.stdout.splitlines() if '"done": true' in line][0])
    assert done["val_loss"] < 2.3  # it learned (the sort corpus starts near ln 13 = 2.56)
    ck = load_checkpoint(tmp_path / "m.safetensors")
    assert next(ck.model.parameters()).device.type == "cpu" and len(ck.film.frames) >= 10


@pytest.mark.cuda
@cuda
def test_the_train_tab_trains_on_cuda_and_steps_on_the_cpu(monkeypatch):
    import lab.session as ls
    import lab.training
    from model.generate import Sampling

    monkeypatch.setattr(lab.training, "TRAIN_DEVICE", "cuda")
    s = ls.Session()
    for p in s.train("sort", "", None, "char", 2, 4, 64, 256, "learned", "pre", "gelu", 0.0, 100, 3e-3, 0):
        pass
    entry = s.entry_for(p.run.name)
    assert next(entry.model.parameters()).device.type == "cpu"  # back on the CPU for stepping
    s.step(p.run.name, "503124=", Sampling(temperature=0.0))
    assert len(s.tokens()) == 8


def test_zerogpu_asks_for_time_in_proportion_to_the_run():
    pytest.importorskip("gradio")
    from ui.train import gpu_seconds

    short, long = gpu_seconds(None, "sort", "", None, "char", 2, 4, 64, 256, "learned", "pre", "gelu", 0.0, 100), \
        gpu_seconds(None, "sort", "", None, "char", 2, 4, 64, 256, "learned", "pre", "gelu", 0.0, 2000)
    assert short < long <= 200
    assert gpu_seconds(None, "sort", "", None, "char", 2, 4, 64, 256, "learned", "pre", "gelu", 0.0, "junk") == 20


def test_only_training_carries_the_zerogpu_decorator():
    decorated = []
    for path in (ROOT / "ui").glob("*.py"):
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.startswith("@gpu"):
                nxt = next(x for x in lines[i + 1:] if x.startswith("def "))
                decorated.append(nxt.split("(")[0].removeprefix("def "))
    assert decorated == ["train_model"]
