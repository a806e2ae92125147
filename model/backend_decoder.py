"""Token-by-token decoding through any backend of the contract (model/backend.py).

The lab continues a text with a `Decoder` (model/generate.py). On the own engine that decoder keeps a key/value
cache and computes one new attention row per token. A backend that runs a model the lab does not own (nnsight,
locally or on NDIF) offers only the contract's forward, so `BackendDecoder` asks it for the whole window at
every token: the next token's logits, and, while attention is captured, every head's probabilities and
pre-softmax scores. Everything else is `Decoder`'s own: the sampling (same settings, same generator, so the
same seed draws the same tokens on both), undo, the sliding window and the intervention moved along with it.

`make_decoder` is what the lab calls: the cached decoder on the own engine, this one on any other backend.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .backend import Backend, ForwardRequest, OwnBackend, per_layer
from .generate import Decoder, Grown, Sampling, rows_held


@dataclass
class BackendDecoder(Decoder):
    """A `Decoder` whose `model` is a backend: one forward of the whole window per token (no cache).

    `seconds` is how long the backend took for the last forward, to show what a Step costs where the model
    runs. `streams` stays None: the logit lens reads the own engine's residual streams (the lab refuses it on
    another backend)."""

    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.use_cache = False  # the contract has no cache: each token is a forward over the window
        super().__post_init__()

    def _device(self) -> torch.device:
        return torch.device("cpu")  # the ids go to the backend as a list; what comes back is on the CPU

    def _prefill(self) -> None:
        """With attention captured, the forward now (the picture needs the new token's row); without, it waits
        until a Step reads the logits (`rewarm`): n new tokens cost n forwards, not one more for nothing."""
        if self.capture_attention:
            self._forward()
        else:
            self.cool()

    def rewarm(self) -> None:
        if self.logits is None:
            self._forward()

    @torch.inference_mode()
    def _forward(self) -> None:
        window = tuple(self.window)
        wanted = "all" if self.capture_attention else ()
        request = ForwardRequest(window, attention=wanted, scores=self.capture_attention, logits="last",
                                 intervention=self._intervention(0, len(window)))
        started = time.perf_counter()
        out = self.model.forward(request)
        self.seconds = time.perf_counter() - started
        self.cache, self.streams = None, None
        self.logits = out.logits[-1]
        cfg, T = self.model.cfg, len(window)
        cap = rows_held(T, self.block_size)
        self._attention, self._scores = [], []
        if self.capture_attention:
            self._attention = [Grown(w, 0.0, cap) for w in per_layer(out.attention, cfg)]
            self._scores = [Grown(w, -np.inf, cap) for w in per_layer(out.scores, cfg)]
        self.attention = [g.view for g in self._attention]
        self.scores = [g.view for g in self._scores]


def make_decoder(backend: Backend, ids: list[int], sampling: Sampling | None = None, eos_id: int | None = None,
                 piece=str, intervention=None, capture_attention: bool = True) -> Decoder:
    """The decoder the lab continues a text with: cached on the own engine, a forward per token elsewhere."""
    options = dict(sampling=sampling or Sampling(), eos_id=eos_id, piece=piece, intervention=intervention,
                   capture_attention=capture_attention)
    if isinstance(backend, OwnBackend):
        return Decoder(backend.model, list(ids), **options)
    return BackendDecoder(backend, list(ids), **options)
