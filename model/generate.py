"""Token-by-token generation that reports, for every step, what the model computed.

`Decoder` keeps a growing context, its key/value cache and the attention rows of every
position, so the app can draw the full (T x T) attention after each step while the model
only computes one new row. Sampling uses a per-decoder `torch.Generator`, never the global RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch

from .transformer import DecoderLM, KVCache

TEMPERATURE_RANGE = (0.0, 2.0)
TOP_P_RANGE = (0.05, 1.0)


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy; top_k 0 disables top-k; top_p 1 disables nucleus sampling."""

    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        t, p = self.temperature, self.top_p
        if not isinstance(t, (int, float)) or not math.isfinite(t) or not TEMPERATURE_RANGE[0] <= t <= TEMPERATURE_RANGE[1]:
            raise ValueError(f"temperature must be between {TEMPERATURE_RANGE[0]} and {TEMPERATURE_RANGE[1]}, got {t!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be a whole number ≥ 0 (0 = off), got {self.top_k!r}")
        if not isinstance(p, (int, float)) or not math.isfinite(p) or not TOP_P_RANGE[0] <= p <= TOP_P_RANGE[1]:
            raise ValueError(f"top_p must be between {TOP_P_RANGE[0]} and {TOP_P_RANGE[1]}, got {p!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be a whole number between 0 and 2^63-1, got {self.seed!r}")


def adjust_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The distribution actually sampled from, after temperature, top-k and top-p (1-D)."""
    logits = logits.float()
    if s.temperature == 0:
        out = torch.zeros_like(logits)
        out[int(torch.argmax(logits))] = 1.0
        return out
    # shift by the max first: a tiny temperature must not turn logits into inf - inf = NaN
    probs = torch.softmax((logits.double() - logits.max()) / s.temperature, dim=-1).float()
    if s.top_k and s.top_k < probs.numel():
        kth = torch.topk(probs, s.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if s.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_p, dim=0) - sorted_p  # mass of strictly more likely tokens
        keep_sorted = before < s.top_p * sorted_p.sum()
        keep = torch.zeros_like(keep_sorted)
        keep[order] = keep_sorted
        probs = torch.where(keep, probs, torch.zeros_like(probs))
    return probs / probs.sum()


@dataclass
class Step:
    """One generated token and what produced it.

    probs: softmax of the logits the token was chosen from (V,); adjusted: the distribution
    after temperature/top-k/top-p that was actually sampled. rows: per layer, the new query
    row(s) of attention, (H, n_new, T) — one row normally, the whole recomputed matrix when
    the context was cropped (`cropped=True`).
    """

    token_id: int
    piece: str
    probs: np.ndarray
    adjusted: np.ndarray
    rows: list[np.ndarray]
    position: int
    cropped: bool
    eos: bool


@dataclass
class Decoder:
    """Incremental decoding over a context window of at most block_size tokens."""

    model: DecoderLM
    ids: list[int]
    sampling: Sampling = field(default_factory=Sampling)
    use_cache: bool = True
    capture_attention: bool = True
    eos_id: int | None = None
    piece: Callable[[int], str] = str

    def __post_init__(self) -> None:
        if not self.ids:
            raise ValueError("the prompt must contain at least one token")
        self.block_size = self.model.cfg.block_size
        self.device = self.model.tok_emb.weight.device
        self.cropped_prompt = len(self.ids) > self.block_size
        self.start = max(0, len(self.ids) - self.block_size)  # index of the window's first token
        self.prompt_len = len(self.ids)
        self.generator = torch.Generator().manual_seed(self.sampling.seed)
        self._rng_history: list[torch.Tensor] = []  # generator state before each step, for undo
        self.attention: list[np.ndarray] = []  # per layer, (H, T, T) weights for the current window
        self.scores: list[np.ndarray] = []  # per layer, (H, T, T) pre-softmax scores (-inf where masked)
        self._prefill()

    @property
    def window(self) -> list[int]:
        return self.ids[self.start :]

    @torch.inference_mode()
    def _prefill(self) -> None:
        ids = torch.tensor([self.window], device=self.device)
        out = self.model(ids, return_attention=self.capture_attention, cache=KVCache([]) if self.use_cache else None)
        self.cache = out.cache
        self.logits = out.logits[0, -1]
        self.attention = [a[0].float().cpu().numpy().copy() for a in out.attentions] if out.attentions else []
        self.scores = [a[0].float().cpu().numpy().copy() for a in out.scores] if out.scores else []

    def capture(self, on: bool) -> None:
        """Turn attention capture on or off; turning it on recomputes the window's attention now."""
        was, self.capture_attention = self.capture_attention, on
        if on and not was:
            self._prefill()

    def undo(self) -> bool:
        """Remove the last generated token (never the prompt) and restore the sampler's state."""
        if len(self.ids) <= self.prompt_len:
            return False
        self.ids.pop()
        self.generator.set_state(self._rng_history.pop())
        self.start = max(0, len(self.ids) - self.block_size)
        self._prefill()
        return True

    @torch.inference_mode()
    def step(self, sampling: Sampling | None = None) -> Step:
        s = sampling or self.sampling
        logits = self.logits.float().cpu()  # sample on the CPU with the CPU generator, whatever the device
        probs = torch.softmax(logits, dim=-1)
        adjusted = adjust_probs(logits, s)
        self._rng_history.append(self.generator.get_state())
        token = int(torch.multinomial(adjusted, 1, generator=self.generator)) if s.temperature else int(adjusted.argmax())
        self.ids.append(token)
        cropped = len(self.ids) - self.start > self.block_size
        if cropped:
            self.start = len(self.ids) - self.block_size
            self._prefill()
            rows = [a.copy() for a in self.attention]
        elif self.use_cache:
            out = self.model(torch.tensor([[token]], device=self.device), return_attention=self.capture_attention, cache=self.cache)
            self.cache, self.logits = out.cache, out.logits[0, -1]
            rows = [a[0].float().cpu().numpy().copy() for a in out.attentions] if out.attentions else []
            self.attention = [_grow(m, r, 0.0) for m, r in zip(self.attention, rows)]
            if out.scores:
                new_scores = [a[0].float().cpu().numpy() for a in out.scores]
                self.scores = [_grow(m, r, -np.inf) for m, r in zip(self.scores, new_scores)]
        else:
            self._prefill()
            rows = [a[:, -1:, :].copy() for a in self.attention]
        return Step(
            token_id=token,
            piece=self.piece(token),
            probs=probs.numpy(),
            adjusted=adjusted.numpy(),
            rows=rows,
            position=len(self.ids) - 1,
            cropped=cropped,
            eos=self.eos_id is not None and token == self.eos_id,
        )


def _grow(matrix: np.ndarray, row: np.ndarray, masked: float) -> np.ndarray:
    """Append a new query row (H, 1, T+1) to an (H, T, T) matrix; old rows gain a masked column."""
    H, T, _ = matrix.shape
    out = np.full((H, T + 1, T + 1), masked, dtype=matrix.dtype)
    out[:, :T, :T] = matrix
    out[:, T:, :] = row
    return out


def generate(
    model: DecoderLM,
    prompt_ids: list[int],
    sampling: Sampling,
    max_new_tokens: int,
    eos_id: int | None = None,
    piece: Callable[[int], str] = str,
    use_cache: bool = True,
    capture_attention: bool = True,
) -> Iterator[Step]:
    """Yield one `Step` per new token; stop after `max_new_tokens` or at `eos_id`."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
    dec = Decoder(model, list(prompt_ids), sampling, use_cache, capture_attention, eos_id, piece)
    for _ in range(max_new_tokens):
        step = dec.step()
        yield step
        if step.eos:
            return
