"""Comparing two sessions' texts value for value; sessions offered a model of 12 heads, as `--model` offers one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from lab.catalogue.external import ExternalModels, parse_source
from lab.catalogue.models import BUILTINS
from lab.session import Session
from model.checkpoint import save_checkpoint
from model.transformer import DecoderLM

TWELVE = "twelve_heads (file)"  # as the model list names the Decoder Lab file `twelve_heads` writes


def twelve_heads(folder: Path) -> ExternalModels:
    """A model of 2 layers × 12 heads (random weights, the sort model's characters: "503124=" reads) written
    as a Decoder Lab file in `folder` and offered as `python app.py --model FILE` offers it: shared by the
    sessions, named in a session file by its source and hash. Its layers show their heads six at a time."""
    sort = BUILTINS.get("sort digits (built-in)")
    with torch.random.fork_rng():  # the same weights every time, and the tests' random state untouched
        torch.manual_seed(0)
        model = DecoderLM(dataclasses.replace(sort.model.cfg, n_heads=12, d_model=48)).eval()
    path = save_checkpoint(folder / "twelve_heads.safetensors", model, sort.tokenizer)
    external = ExternalModels([parse_source(str(path))], folder / "hashes.json")
    assert external.names == [TWELVE]
    return external


def offered(external: ExternalModels) -> Session:
    """A new session offered these added models (what the app gives every session)."""
    s = Session()
    s.external = external
    return s


def assert_same_text(a: Session, b: Session) -> None:
    assert a.tokens() == b.tokens()
    for x, y in zip(a.attention().weights + a.attention().scores, b.attention().weights + b.attention().scores):
        np.testing.assert_array_equal(x, y)  # value for value
    assert len(a.drawn) == len(b.drawn)
    for x, y in zip(a.drawn, b.drawn):
        assert x.token_id == y.token_id
        np.testing.assert_array_equal(x.probs, y.probs)
        np.testing.assert_array_equal(x.adjusted, y.adjusted)
