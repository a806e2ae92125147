"""With the default settings of the options the imported families brought in (attention scale, GELU
form, norm kind, rotary fraction, parallel residual, local windows, per-part biases, grouped K/V,
padded vocabulary) the engine computes bit for bit what it computed before them.

The reference tensors in tests/data/builtin_forward.npz were recorded by the engine as it was
before those options existed (`python tests/test_families_builtin.py --record` on that code): the
built-in assets' logits, attention and scores on their own example prompts (whole forward and
cached step by step), and the same for small random models of every older configuration choice,
whose weights are stored beside their outputs. Here the current code runs the same inputs and must
give torch.equal tensors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from model.checkpoint import load_checkpoint
from model.config import ModelConfig
from model.transformer import DecoderLM, KVCache

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = Path(__file__).resolve().parent / "data" / "builtin_forward.npz"
ASSETS = ("toy", "sort", "copy", "grammar", "shakespeare")
PROMPTS = {  # a short text each model's tokenizer encodes without <unk>
    "toy": "how is living in",
    "sort": "503124=",
    "copy": "4821|",
    "grammar": "tom went to the park and he",
    "shakespeare": "ROMEO: what light",
}
# Older configuration choices, each on top of a small base; weights are random and stored.
VARIANTS = {
    "base": {},
    "sinusoidal": {"pos_encoding": "sinusoidal"},
    "rope": {"pos_encoding": "rope", "pe_base": 500.0},
    "nopos": {"pos_encoding": "none"},
    "post": {"norm": "post"},
    "nonorm": {"norm": "none"},
    "relu": {"activation": "relu"},
    "swiglu": {"activation": "swiglu", "d_ff": 24},
    "nobias_tied": {"bias": False, "tie_weights": True, "head_bias": True},
    "noproj_noffn": {"attn_out_proj": False, "d_ff": 0},
    "bidirectional": {"mask": "bidirectional"},
}
BASE = dict(vocab_size=13, block_size=12, n_layers=2, n_heads=4, d_model=16)
VARIANT_IDS = [[1, 5, 2, 9, 12, 0, 7, 3, 3, 8], [4, 4, 11, 6, 2, 10, 1, 5, 9, 0]]


def _outputs(model: DecoderLM, ids: list[list[int]]) -> dict[str, np.ndarray]:
    """Whole-forward logits/attention/scores and, for a causal model, the cached step-by-step ones."""
    x = torch.tensor(ids)
    out = {}
    with torch.inference_mode():
        full = model(x, return_attention=True)
        fused = model(x)
        out["logits"] = full.logits.numpy()
        out["fused_logits"] = fused.logits.numpy()
        for i, (a, s) in enumerate(zip(full.attentions, full.scores)):
            out[f"attn{i}"] = a.numpy()
            out[f"scores{i}"] = s.numpy()
        if model.cfg.mask == "causal":
            cache, rows = KVCache([]), []
            for t in range(x.shape[1]):
                step = model(x[:, t : t + 1], return_attention=True, cache=cache)
                cache = step.cache
                rows.append(step.logits)
            out["cached_logits"] = torch.cat(rows, dim=1).numpy()
            res = model(x, return_residuals=True).residuals
            out["residuals"] = torch.stack(res).numpy()
    return out


def _asset(name: str):
    ckpt = load_checkpoint(ROOT / "assets" / f"{name}.safetensors")
    return ckpt.model.eval(), [ckpt.tokenizer.encode(PROMPTS[name])]


def _variant(name: str, weights: dict[str, np.ndarray] | None = None) -> DecoderLM:
    cfg = ModelConfig(**{**BASE, **VARIANTS[name]})
    torch.manual_seed(len(name))
    model = DecoderLM(cfg).eval()
    if weights is not None:
        state = {k: torch.from_numpy(v) for k, v in weights.items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and set(missing) <= {"head.weight"}, (missing, unexpected)
        if cfg.tie_weights:
            model.head.weight = model.tok_emb.weight
    return model


def record() -> None:
    """Write the reference file from the code as it is now (run on the engine before the options)."""
    data = {}
    for name in ASSETS:
        model, ids = _asset(name)
        for key, value in _outputs(model, ids).items():
            data[f"asset/{name}/{key}"] = value
    for name in VARIANTS:
        model = _variant(name)
        for key, value in model.state_dict().items():
            data[f"variant/{name}/weight/{key}"] = value.numpy()
        for key, value in _outputs(model, VARIANT_IDS).items():
            data[f"variant/{name}/{key}"] = value
    REFERENCE.parent.mkdir(exist_ok=True)
    np.savez_compressed(REFERENCE, **data)


@pytest.fixture(scope="module")
def reference():
    with np.load(REFERENCE) as f:
        return {k: f[k] for k in f.files}


def _assert_same(prefix: str, got: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> None:
    expected = {k[len(prefix):]: v for k, v in reference.items() if k.startswith(prefix) and "/weight/" not in k}
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert torch.equal(torch.from_numpy(got[key]), torch.from_numpy(value)), f"{prefix}{key} changed"


@pytest.mark.parametrize("name", ASSETS)
def test_builtin_assets_compute_what_they_computed(name, reference):
    model, ids = _asset(name)
    _assert_same(f"asset/{name}/", _outputs(model, ids), reference)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_older_configurations_compute_what_they_computed(name, reference):
    prefix = f"variant/{name}/weight/"
    weights = {k[len(prefix):]: v for k, v in reference.items() if k.startswith(prefix)}
    model = _variant(name, weights)
    # the same parameters under the same names: a checkpoint written before loads unchanged
    assert set(model.state_dict()) == set(weights)
    _assert_same(f"variant/{name}/", _outputs(model, VARIANT_IDS), reference)


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    record()
