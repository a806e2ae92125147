"""What the fuzzer knows of its twin sessions: the models each may name (the built-ins from their
files' metadata, then what /select_model, /train and uploads tell), and the current text."""

from __future__ import annotations

import contextlib
import copy
import json
import struct
from dataclasses import dataclass
from typing import Any

from lab.catalogue.models import ASSETS, BUILTIN_MODELS

from .calls import Call, Endpoint
from .files import ST_HEADER
from .values import CORPUS_PROMPTS


@dataclass
class ModelInfo:
    layers: int
    heads: int
    prompts: list[str]


def builtin_models() -> dict[str, ModelInfo]:
    """The shipped models' shapes, from their files' config metadata (no weights are read)."""
    out = {}
    for name, b in BUILTIN_MODELS.items():
        try:
            with open(ASSETS / b.file, "rb") as f:
                (n,) = ST_HEADER.unpack(f.read(8))
                cfg = json.loads(json.loads(f.read(n))["__metadata__"]["config"])
            out[name] = ModelInfo(cfg["n_layers"], cfg["n_heads"], list(b.examples))
        except (OSError, ValueError, KeyError, struct.error):  # e.g. not there yet: /select_model tells later
            out[name] = ModelInfo(1, 1, list(b.examples))
    return out


BUILTINS = builtin_models()


class Knowledge:
    """What the fuzzer knows about its twin sessions: their models and the current text."""

    def __init__(self):
        self.models: dict[str, ModelInfo] = copy.deepcopy(BUILTINS)
        self.text: dict[str, Any] | None = None  # model_name, prompt, seed of the current text
        self.view: dict[str, Any] | None = None

    def learn(self, ep: Endpoint, call: Call, outputs: list) -> None:
        """Update from a successful call (the same answer came back on both twins)."""
        if call.transport == "raw":  # hand-made requests get the state outputs back too (as null)
            outputs = list(outputs)
            while len(outputs) > len(ep.returns) and None in outputs:
                outputs.remove(None)
        named = {p.name: a for p, a in zip(ep.params, call.args)}
        by_label = dict(zip(ep.returns, outputs))
        model = named.get("model_name")
        dd = by_label.get("Model")
        if isinstance(dd, dict) and isinstance(dd.get("choices"), list):
            names = [c[1] if isinstance(c, (list, tuple)) else c for c in dd["choices"]]
            for gone in set(self.models) - set(names):
                del self.models[gone]
            new = dd.get("value")
            if isinstance(new, str) and (new not in self.models or ep.name.endswith(("train", "upload_model"))):
                info = ModelInfo(1, 1, [])  # (a name can come back for another model once the first was dropped)
                if ep.name.endswith("train"):
                    with contextlib.suppress(TypeError, ValueError):
                        info = ModelInfo(int(named["layers"]), int(named["heads"]),
                                         [CORPUS_PROMPTS.get(named.get("corpus_name"), "a")])
                elif call.info is not None:
                    info = call.info
                self.models[new] = info
        if ep.name.endswith("select_model") and isinstance(model, str) and model in self.models:
            info = self.models[model]
            layer, head, prompt = by_label.get("Layer"), by_label.get("Head"), by_label.get("Prompt")
            if isinstance(layer, dict) and isinstance(layer.get("choices"), list):
                info.layers = len(layer["choices"])
            if isinstance(head, dict) and isinstance(head.get("choices"), list):
                info.heads = max(1, len(head["choices"]) - 1)
            if isinstance(prompt, dict) and isinstance(prompt.get("value"), str) and prompt["value"].strip():
                if prompt["value"] not in info.prompts:
                    info.prompts.insert(0, prompt["value"])
        if ep.name.endswith(("/step", "/generate")):
            self.text = {k: named.get(k) for k in ("model_name", "prompt", "seed")}
            self.view = {k: named.get(k) for k in ("layer", "head", "view")}
        elif ep.name.endswith(("/reset", "/select_model")):
            self.text = None
