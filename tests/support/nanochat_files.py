"""nanochat checkpoints for the tests: the fixture nanochat itself wrote (tests/assets/nanochat, see its
README.md), and checkpoints of other shapes written here in nanochat's file format (a torch.save of the
state dict with nanochat's names, meta_<step>.json, the fixture's tokenizer.pkl), with random weights
that make every part of the forward matter."""

from __future__ import annotations

import json
import shutil
from collections import OrderedDict
from pathlib import Path

import torch
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets" / "nanochat"
CHECKPOINT = ASSETS / "base_checkpoints" / "d3"  # nanochat's cache layout: ../../tokenizer/tokenizer.pkl
TOKENIZER = ASSETS / "tokenizer" / "tokenizer.pkl"
VOCAB = 300  # the fixture tokenizer's: 291 ranks and 9 special tokens (<|bos|> is 291)
BOS = 291
# the fixture's GPTConfig (nanochat's meta_000007.json holds it)
FIXTURE_CONFIG = {"sequence_len": 64, "vocab_size": VOCAB, "n_layer": 3, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
                  "window_pattern": "SSSL"}


def expected() -> tuple[list[dict], list[dict]]:
    """nanochat's own outputs for the fixture: per prompt its text, ids (<|bos|> first), the logits at some
    positions (`rows`), the argmax at every position and 12 greedy tokens of nanochat's Engine; and texts
    with the ids of tiktoken's encode_ordinary and its decode of them."""
    with safe_open(str(ASSETS / "expected.safetensors"), "pt") as f:
        meta = f.metadata()
        cases = [{"text": text, **{key: f.get_tensor(f"case{k}.{key}") for key in
                                   ("ids", "rows", "logits", "argmax", "greedy")}}
                 for k, text in enumerate(json.loads(meta["texts"]))]
    return cases, json.loads(meta["encodings"])


def has_ve(i: int, n_layer: int) -> bool:
    return i % 2 == (n_layer - 1) % 2


def random_state(mc: dict, seed: int = 0, scale: float = 0.35) -> "OrderedDict[str, torch.Tensor]":
    """A state dict of nanochat's current model for GPTConfig `mc`, in nanochat's names and order."""
    g = torch.Generator().manual_seed(seed)
    V = -(-mc["vocab_size"] // 64) * 64
    L, C, H, KV = mc["n_layer"], mc["n_embd"], mc["n_head"], mc["n_kv_head"]
    kvd = KV * (C // H)

    def rnd(*shape, s=scale):
        return torch.randn(*shape, generator=g) * s

    sd: OrderedDict[str, torch.Tensor] = OrderedDict()
    sd["resid_lambdas"] = 1.0 + rnd(L, s=0.1)
    sd["x0_lambdas"] = 0.2 + rnd(L, s=0.1)
    sd["smear_lambda"] = torch.tensor([0.6])
    sd["backout_lambda"] = torch.tensor([0.25])
    sd["transformer.wte.weight"] = rnd(V, C, s=1.0)
    for i in range(L):
        p = f"transformer.h.{i}."
        sd[p + "attn.c_q.weight"], sd[p + "attn.c_k.weight"] = rnd(C, C), rnd(kvd, C)
        sd[p + "attn.c_v.weight"], sd[p + "attn.c_proj.weight"] = rnd(kvd, C), rnd(C, C)
        if has_ve(i, L):
            sd[p + "attn.ve_gate.weight"] = rnd(KV, 12)
        sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_proj.weight"] = rnd(4 * C, C), rnd(C, 4 * C)
    sd["lm_head.weight"] = rnd(V, C)
    sd["smear_gate.weight"] = rnd(1, 24)
    for i in range(L):
        if has_ve(i, L):
            sd[f"value_embeds.{i}.weight"] = rnd(V, kvd, s=1.0)
    return sd


def write_checkpoint(folder: Path, state: dict, mc: dict, step: int = 5, tokenizer: Path | None = TOKENIZER,
                     meta_extra: dict | None = None) -> Path:
    """A flat checkpoint folder as nanochat's save_checkpoint writes one, with tokenizer.pkl beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / f"model_{step:06d}.pt")
    meta = {"step": step, "val_bpb": None, "model_config": mc, "loop_state": {"min_val_bpb": float("inf")},
            **(meta_extra or {})}
    (folder / f"meta_{step:06d}.json").write_text(json.dumps(meta, indent=2))  # Python writes Infinity
    if tokenizer is not None:
        shutil.copy(tokenizer, folder / "tokenizer.pkl")
    return folder


def fixture_state() -> dict[str, torch.Tensor]:
    """The fixture's state dict as nanochat's build_model holds it on a CPU (bfloat16 tensors in float32)."""
    sd = torch.load(CHECKPOINT / "model_000007.pt", map_location="cpu", weights_only=True)
    return {k: v.float() for k, v in sd.items()}
