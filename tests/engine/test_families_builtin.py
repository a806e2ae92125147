"""With the default settings of the options the imported families brought in (attention scale, GELU
form, norm kind, rotary fraction, parallel residual, local windows, per-part biases, grouped K/V,
padded vocabulary) the engine computes bit for bit what it computed before them.

The reference is the engine's forward as it was before those options, kept frozen in
tests/support/transformer_before.py. The same weights go into both, in the same process (same thread
count, same CPU), and every output must be torch.equal: the built-in assets' logits, attention, scores,
residuals and cached step-by-step logits on their own example prompts, and the same for small random
models of every older configuration choice. The parameters keep their names, so a checkpoint written
before loads unchanged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from model.checkpoint import load_checkpoint
from model.config import ModelConfig
from model.transformer import DecoderLM, KVCache
from tests.support import transformer_before as before

ROOT = Path(__file__).resolve().parents[2]
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


def _outputs(model, ids: list[list[int]], kv_cache) -> dict[str, np.ndarray]:
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
            cache, rows = kv_cache([]), []
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


def _variant(name: str) -> DecoderLM:
    cfg = ModelConfig(**{**BASE, **VARIANTS[name]})
    torch.manual_seed(len(name))
    return DecoderLM(cfg).eval()


def _as_before(model: DecoderLM) -> torch.nn.Module:
    """The frozen engine's model holding exactly `model`'s weights (under the same names)."""
    old = before.DecoderLM(model.cfg).eval()
    old.load_state_dict(model.state_dict(), strict=True)
    assert set(old.state_dict()) == set(model.state_dict())
    return old


def _assert_same(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert torch.equal(torch.from_numpy(got[key]), torch.from_numpy(value)), f"{key} changed"


@pytest.mark.parametrize("name", ASSETS)
def test_builtin_assets_compute_what_they_computed(name):
    model, ids = _asset(name)
    _assert_same(_outputs(model, ids, KVCache), _outputs(_as_before(model), ids, before.KVCache))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_older_configurations_compute_what_they_computed(name):
    model = _variant(name)
    _assert_same(_outputs(model, VARIANT_IDS, KVCache), _outputs(_as_before(model), VARIANT_IDS, before.KVCache))
