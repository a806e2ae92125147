"""Token-by-token generation that reports, for every step, what the model computed.

`Decoder` keeps a growing context, its key/value cache and the attention rows of every
position, so the app can draw the full (T x T) attention after each step while the model
only computes one new row. Sampling uses a per-decoder `torch.Generator`, never the global RNG.

`generate(decoder, n)` is the one generation loop: the app's Step and Generate, the CLI and
the tests all continue a decoder's text through it.

CLI (model/cli.py): python -m model.generate --checkpoint assets/sort.safetensors --prompt 503124= --temperature 0
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from .interventions import WHOLE_TEXT_MODES, Intervention
from .transformer import DecoderLM, KVCache

TEMPERATURE_RANGE = (0.0, 2.0)
TOP_P_RANGE = (0.05, 1.0)
SEED_RANGE = (0, 2**31 - 1)  # a seed a browser's number input holds exactly (and torch takes)
# How much attention `generate` records: at every step, only for the final window, or never.
GENERATE_ATTENTION = ("all", "last", "none")


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
        lo, hi = SEED_RANGE
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not lo <= self.seed <= hi:
            raise ValueError(f"seed must be a whole number between {lo} and {hi}, got {self.seed!r}")


def adjust_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The distribution actually sampled from, after temperature, top-k and top-p (1-D).

    top-k keeps the k most likely tokens (and any tied with the k-th). top-p then keeps the smallest set of
    most likely tokens whose mass reaches p (of the mass top-k left): a token is kept while the tokens more
    likely than it hold less than p, so at exactly p the set is complete and the next token is left out."""
    logits = logits.float()  # (V,)
    # temperature 0 is the limit of dividing by ever smaller numbers: all the mass on the top token
    # (the first one on a tie), so greedy decoding is a one-hot distribution like any other
    if s.temperature == 0:
        out = torch.zeros_like(logits)
        out[int(torch.argmax(logits))] = 1.0
        return out
    # shift by the max first: a tiny temperature must not turn logits into inf - inf = NaN
    probs = torch.softmax((logits.double() - logits.max()) / s.temperature, dim=-1).float()
    if s.top_k and s.top_k < probs.numel():  # a k of the whole vocabulary or more keeps everything
        kth = torch.topk(probs, s.top_k).values[-1]  # the k-th largest probability: the bar to clear
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if s.top_p < 1.0:
        # decide in sorted order, then scatter the decisions back to vocabulary order through `order`
        sorted_p, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_p, dim=0) - sorted_p  # mass of strictly more likely tokens
        keep_sorted = before < s.top_p * sorted_p.sum()  # p of what is left after top-k, not of 1
        keep = torch.zeros_like(keep_sorted)
        keep[order] = keep_sorted
        probs = torch.where(keep, probs, torch.zeros_like(probs))
    return probs / probs.sum()  # the kept tokens renormalised to sum to 1


def mask_padding(logits: torch.Tensor, vocab_used: int | None) -> torch.Tensor:
    """Logits (..., V) with the padded vocabulary rows (ids >= vocab_used, which no tokenizer
    token stands for; ModelConfig.vocab_used) set to -inf: probability 0, never sampled."""
    if vocab_used is None or vocab_used >= logits.shape[-1]:  # no padding rows: nothing to hide
        return logits
    out = logits.clone()  # the caller's logits stay as the model produced them
    out[..., vocab_used:] = float("-inf")
    return out


@dataclass
class Step:
    """One generated token and what produced it.

    probs: softmax of the logits the token was chosen from (V,); adjusted: the distribution
    after temperature/top-k/top-p that was actually sampled. rows: per layer, the new query
    row(s) of attention, (H, n_new, T) — one row normally, the whole recomputed matrix when
    the context was cropped (`cropped=True`). sampling: the settings it was drawn with (with the
    logits, they give `adjusted` again).
    """

    token_id: int
    piece: str
    probs: np.ndarray
    adjusted: np.ndarray
    rows: list[np.ndarray]
    position: int
    cropped: bool
    eos: bool
    sampling: Sampling | None = None


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
    # heads to ablate and rows to edit at every forward (model.interventions); edit positions are
    # positions in the whole text (ids), moved into the window as it slides
    intervention: Intervention | None = None

    def __post_init__(self) -> None:
        if not self.ids:
            raise ValueError("the prompt must contain at least one token")
        if self.model.cfg.mask != "causal":
            # every query sees every key: a new token changes every earlier row, so nothing can be cached
            self.use_cache = False
        iv = self.intervention
        if iv is not None and not isinstance(iv, Intervention):
            raise ValueError(f"intervention must be an Intervention, got {type(iv).__name__}")
        if iv is not None and iv.mode in WHOLE_TEXT_MODES and iv.ablated_heads(self.model.cfg):
            self.use_cache = False  # a mean over the positions needs the whole text at every step
        self.ids = list(self.ids)  # the decoder appends to its own copy, never to the caller's list
        self.block_size = self.model.cfg.block_size
        self.device = self._device()
        self.cropped_prompt = len(self.ids) > self.block_size
        self.start = max(0, len(self.ids) - self.block_size)  # index of the window's first token
        self.prompt_len = len(self.ids)
        self.generator = torch.Generator().manual_seed(self.sampling.seed)
        self._rng_history: list[torch.Tensor] = []  # generator state before each step, for undo
        self.attention: list[np.ndarray] = []  # per layer, (H, T, T) weights for the current window
        self.scores: list[np.ndarray] = []  # per layer, (H, T, T) pre-softmax scores (-inf where masked)
        self._attention: list[Grown] = []  # the buffers these are read-only views of
        self._scores: list[Grown] = []
        self._prefill()

    def _device(self) -> torch.device:
        """Where the window's token ids go (the model's embedding's device)."""
        return self.model.tok_emb.weight.device

    @property
    def window(self) -> list[int]:
        return self.ids[self.start :]

    @property
    def undo_bytes(self) -> int:
        """Bytes of the sampler states kept for undo (one ByteTensor per generated token)."""
        return sum(s.numel() for s in self._rng_history)

    @torch.inference_mode()
    def _prefill(self) -> None:
        """Run the whole window through the model: fresh cache, next-token logits, attention."""
        ids = torch.tensor([self.window], device=self.device)  # (1, T)
        # only the last position's logits are read out: the next token is all a Step samples
        out = self.model(ids, return_attention=self.capture_attention, cache=KVCache([]) if self.use_cache else None,
                         intervention=self._intervention(0, ids.shape[1]), logits="last", return_residuals=True)
        self.cache = out.cache
        self.logits = out.logits[0, -1]  # (V,) for the token after the window
        # the last token's residual streams, (1, 1, C) each, copied out of the (1, T, C) ones: the logit lens
        # reads the newest token from them without running the model again
        self.streams = tuple(r[:, -1:].clone() for r in out.residuals)
        # drop the batch dimension: (1, H, T, T) -> (H, T, T) per layer, each inside a buffer with room
        # for more rows (see Grown)
        cap = rows_held(ids.shape[1], self.block_size)
        self._attention = [Grown(a[0].float().cpu().numpy(), 0.0, cap) for a in out.attentions or []]
        self._scores = [Grown(a[0].float().cpu().numpy(), -np.inf, cap) for a in out.scores or []]
        self.attention = [g.view for g in self._attention]
        self.scores = [g.view for g in self._scores]

    @property
    def attention_nbytes(self) -> int:
        """Bytes held for the window's attention and scores, with the room for rows still to come."""
        return sum(g.nbytes for g in (*self._attention, *self._scores))

    @property
    def warm_nbytes(self) -> int:
        """Bytes `cool` gives up: the attention and scores, the cache's keys and values, the next-token
        logits and the last token's residual streams (with the storage they are a view of)."""
        tensors = [t for c in (self.cache.layers if self.cache is not None else []) for t in (c.k, c.v)]
        tensors += [*([] if self.logits is None else [self.logits]), *(self.streams or ())]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()  # each storage once: a view
                    for t in tensors}  # keeps all of it
        return self.attention_nbytes + sum(storages.values())

    @property
    def warm(self) -> bool:
        """Whether the decoder holds its window's cache, logits and attention (`cool` drops them)."""
        return self.logits is not None

    def cool(self) -> None:
        """Drop what a prefill of the window computes again: the key/value cache, the next-token logits,
        the attention and the scores. The tokens, the sampler's state and its history for undo stay, so
        the text goes on exactly where it was. `rewarm` computes them again."""
        self.cache, self.logits, self.streams = None, None, None
        self._attention, self._scores, self.attention, self.scores = [], [], [], []

    def rewarm(self) -> None:
        """After `cool`: run the window through the model again, with the same weights and intervention.
        The numbers equal the dropped ones within float32 rounding, not bit for bit: rows grown one token
        at a time came from other matmul shapes than one forward over the window (allclose, atol 1e-6)."""
        if self.logits is None:
            self._prefill()

    def _intervention(self, start: int, seq_len: int) -> Intervention | None:
        """The intervention for a forward over the window whose new positions begin at `start`."""
        return None if self.intervention is None else self.intervention.within(self.start, start, seq_len)

    def capture(self, on: bool) -> None:
        """Turn attention capture on or off; turning it on recomputes the window's attention now."""
        was, self.capture_attention = self.capture_attention, on
        # While capture was off nothing was recorded, so there are no old rows to grow from:
        # the whole window has to be computed once.
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
    def step(self, sampling: Sampling | None = None, force: int | None = None) -> Step:
        """Sample the next token and run it through the model. force: take this token instead of
        the sampled one (a replay of a recorded text); the sampler advances exactly as it would,
        and a token the settings could not have produced (probability 0) is refused (ValueError)."""
        s = sampling or self.sampling
        self.rewarm()  # a cooled decoder computes its window again first
        # sample on the CPU with the CPU generator, whatever the device; padded rows never come next
        logits = mask_padding(self.logits.float().cpu(), self.model.cfg.vocab_used)
        probs = torch.softmax(logits, dim=-1)
        adjusted = adjust_probs(logits, s)
        if force is not None and not (isinstance(force, int) and 0 <= force < adjusted.numel() and adjusted[force] > 0):
            raise ValueError(f"token {force!r} cannot come next with these sampling settings")
        self._rng_history.append(self.generator.get_state())
        token = int(torch.multinomial(adjusted, 1, generator=self.generator)) if s.temperature else int(adjusted.argmax())
        token = token if force is None else force
        self.ids.append(token)
        cropped = len(self.ids) - self.start > self.block_size
        if cropped:
            # The context is full: the window slides one token to the right. Every position
            # shifts, so the cached keys/values (computed at their old positions, and seeing a
            # token that has now left the window) are wrong; recompute the whole new window.
            self.start = len(self.ids) - self.block_size
            self._prefill()
            rows = [a.copy() for a in self.attention]  # (H, T, T): every row changed
        elif self.use_cache:
            # Cache: only the new token is run, as one query row per layer against all cached
            # keys. Older rows never change (a causal query never sees later tokens), so the
            # matrices grow by one row and one masked column.
            T = len(self.ids) - self.start
            out = self.model(torch.tensor([[token]], device=self.device), return_attention=self.capture_attention,
                             cache=self.cache, intervention=self._intervention(T - 1, T), return_residuals=True)
            self.cache, self.logits, self.streams = out.cache, out.logits[0, -1], out.residuals
            rows = [a[0].float().cpu().numpy().copy() for a in out.attentions] if out.attentions else []  # (H, 1, T)
            self.attention = [g.grow(r, self.block_size) for g, r in zip(self._attention, rows)]
            # Without capture there are no new rows and zip() leaves both lists empty, so scores
            # cannot go stale while capture is off.
            new_scores = [a[0].float().cpu().numpy() for a in out.scores] if out.scores else []
            self.scores = [g.grow(r, self.block_size) for g, r in zip(self._scores, new_scores)]
        else:
            # No cache: recompute the whole window (slower, but nothing is kept between steps).
            self._prefill()
            rows = [a[:, -1:, :].copy() for a in self.attention]  # (H, 1, T): the new query row
        return Step(
            token_id=token,
            piece=self.piece(token),
            probs=probs.numpy(),
            adjusted=adjusted.numpy(),
            rows=rows,
            position=len(self.ids) - 1,
            cropped=cropped,
            eos=self.eos_id is not None and token == self.eos_id,
            sampling=s,
        )


def rows_held(T: int, block_size: int) -> int:
    """Rows (and columns) a window of T tokens holds room for in its attention buffers: half as many
    again, at least 16 more, within the context. For a window that grew to T, never more than this."""
    return min(block_size, T + max(16, T // 2))


class Grown:
    """An (H, T, T) matrix of a causal window that grows by one query row per token, in place.

    The buffer has room for more rows and columns, already filled with `masked` (0 for weights, -inf
    for scores): a new token is a key that every earlier query comes before, so under the causal mask
    the earlier rows never attend to it, and `masked` is exactly what the model would have computed
    there. Growing writes only the new row; when the room runs out the buffer is copied into a larger
    one. `view` is the current (H, T, T) matrix, read-only: a view handed out earlier never changes,
    since only rows and columns past it are written.
    """

    def __init__(self, matrix: np.ndarray, masked: float, cap: int):
        H, T, _ = matrix.shape
        self.masked = masked
        self.buf = np.full((H, max(cap, T), max(cap, T)), masked, dtype=matrix.dtype)
        self.buf[:, :T, :T] = matrix
        self.T = T
        self.view = self._view()

    def _view(self) -> np.ndarray:
        v = self.buf[:, : self.T, : self.T]
        v.flags.writeable = False
        return v

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes

    def grow(self, row: np.ndarray, limit: int) -> np.ndarray:
        """Append the new query row (H, 1, T+1); the matrix (H, T+1, T+1)."""
        T = self.T
        if T + 1 > self.buf.shape[1]:
            cap = max(rows_held(T + 1, limit), T + 1)
            old = self.buf
            self.buf = np.full((old.shape[0], cap, cap), self.masked, dtype=old.dtype)
            self.buf[:, :T, :T] = old[:, :T, :T]
        self.buf[:, T, : T + 1] = row[:, 0, :]
        self.T = T + 1
        self.view = self._view()
        return self.view


def generate(
    decoder: Decoder,
    max_new_tokens: int,
    sampling: Sampling | None = None,
    attention: str = "all",
    force: Sequence[int] | None = None,
) -> Iterator[Step]:
    """Continue the decoder's text: yield one `Step` per new token.

    Stops after `max_new_tokens` steps or right after a step with `eos=True`. `sampling`
    overrides the decoder's own for these steps. `attention` (one of GENERATE_ATTENTION):

    * "all": capture attention at every step (turning capture on first if it was off), so
      every Step carries its new rows.
    * "last": decode with capture off (the fused attention path, no per-step copies). When the
      loop ends (limit, end of sequence, or the consumer closes the generator) the final
      window's attention is computed once, so `decoder.attention` / `decoder.scores` are
      available as with "all"; Steps carry no rows. On the final step this happens before
      the Step is yielded, so the consumer can draw it. The result is bit-for-bit what "all"
      leaves when "all" also computed the final window whole (no cache, or the window slid
      on the final step); otherwise "all" grew it row by row from the cache, and the two
      agree only up to float rounding (different matmul shapes).
    * "none": decode with capture off and leave it off; `decoder.attention` and
      `decoder.scores` are empty afterwards (`decoder.capture(True)` brings them back).

    "all" and "last" put the decoder's capture setting back to what it was when the loop ends.
    force: the tokens to take instead of sampling (a replay; see `Decoder.step`), at most one per step.
    Arguments are checked here, when `generate` is called, not at the first `next()`.
    """
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a whole number >= 0, got {max_new_tokens!r}")
    if attention not in GENERATE_ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(GENERATE_ATTENTION)}, got {attention!r}")
    # a forced token past the last step would be silently dropped, so the mismatch is refused
    if force is not None and len(force) > max_new_tokens:
        raise ValueError(f"{len(force)} forced tokens for {max_new_tokens} steps")
    # the loop lives in a second function: a generator function's body (its checks too) would only
    # start at the first next(), so the checks above run eagerly here instead
    return _generate(decoder, max_new_tokens, sampling, attention, force)


def _generate(decoder: Decoder, max_new_tokens: int, sampling: Sampling | None, attention: str,
              force: Sequence[int] | None = None) -> Iterator[Step]:
    was = decoder.capture_attention  # restored at the end: the loop borrows the setting, never keeps it
    # "last" and "none" decode with capture off, the cheaper fused path; "all" records every step
    decoder.capture(attention == "all")
    try:
        for i in range(max_new_tokens):
            # forced tokens come first; once they run out, the remaining steps sample as usual
            step = decoder.step(sampling, force=None if force is None or i >= len(force) else force[i])
            last = step.eos or i == max_new_tokens - 1
            if last and attention == "last":
                decoder.capture(True)  # the consumer of the final step sees the final attention
            yield step
            if step.eos:  # the end-of-sequence token ends the text, even with steps left
                return
    finally:
        # Also runs when the consumer stops early (generator closed or garbage-collected).
        if attention == "last":
            decoder.capture(True)  # a no-op when the final step already did it
        if attention != "none":
            decoder.capture(was)  # turning capture off only sets the flag: the attention stays


if __name__ == "__main__":
    from .cli import generate_main

    sys.exit(generate_main())
