"""One training loop for the CLI, the benchmark and the app.

`train()` is a generator of `TrainEvent`s: the caller decides how to show progress and can
stop it at any time (by a callable, a wall-clock deadline, or simply by not asking for the
next event); the model keeps whatever it learned so far.

With cfg.film_frames > 0 a run records a training film (model/film.py): at the steps of
`frame_steps` (and at step 0, before the first step) the attention on a probe prompt and the
train and validation loss; the final event carries the `Film`.

CLI (model/cli.py): python -m model.train --corpus sort --steps 2000 --out assets/sort
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass, field, fields
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from .distributed import Ranks, wrap
from .fastpath import ManualStep, unsupported
from .film import FILM_EVAL_BATCHES, MAX_FILM_FRAMES, Film, Frame, clip_probe, default_probe_ids, frame_steps
from .heads import task_of
from .json_bounds import is_int
from .transformer import DecoderLM


ADAMW_IMPLS = ("fused", "foreach", "loop")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
SDPA_BACKENDS = ("auto", "math", "flash")
SCHEDULES = ("cosine", "wsd", "constant")
BACKWARDS = ("autograd", "manual", "auto")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 12
    lr: float = 1e-3
    min_lr: float | None = None  # default lr / 10
    warmup: int = 50
    schedule: str = "cosine"  # "cosine", "wsd" (warm-up, stable, decay) or "constant"
    decay_frac: float = 0.3  # wsd: the last fraction of steps that decays linearly to min_lr
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    seed: int = 0
    max_seconds: float | None = None
    bf16: bool = False  # matrix products in bfloat16 (fast on CPUs with AMX): autocast on the autograd step, a bf16
    # copy of the fp32 master weights on the hand-written one
    adamw: str = "fused"  # AdamW kernel: "fused" (one kernel for all params), "foreach" or "loop"
    compile: str | None = None  # torch.compile the forward+loss (and its backward): a mode name or "default"
    sdpa: str = "auto"  # attention kernel while training: "auto" (torch's choice), "math" or "flash"
    backward: str = "autograd"  # "autograd"; "manual": model/fastpath's hand-written step on flat weights (CPU, one
    # process, no compile, the models it handles); "auto": manual where it can run, else autograd
    probe_ids: tuple[int, ...] = field(default_factory=tuple)  # the film's probe prompt (empty: a held-out example)
    keep_best: bool = False  # end with the weights of the lowest validation loss seen (at an evaluation)
    film_frames: int = 0  # record a training film of this many frames on probe_ids (0 = no film; see model/film.py)

    def __post_init__(self) -> None:
        # Every field is checked here, so a bad value fails when the config is built, with the
        # field's name in the message, not steps later inside the optimizer or the loop.
        for name in ("steps", "batch_size", "eval_batches"):
            if not is_int(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive whole number, got {getattr(self, name)!r}")
        for name in ("warmup", "eval_every"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a whole number >= 0, got {getattr(self, name)!r}")
        if not is_int(self.seed):
            raise ValueError(f"seed must be a whole number, got {self.seed!r}")
        if not (_is_number(self.lr) and 0 < self.lr <= 1):
            raise ValueError(f"lr must be in (0, 1], got {self.lr!r}")
        if self.min_lr is not None and not (_is_number(self.min_lr) and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"min_lr must be None (lr / 10) or in [0, lr], got {self.min_lr!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if not (_is_number(self.decay_frac) and 0 < self.decay_frac <= 1):
            raise ValueError(f"decay_frac must be in (0, 1], got {self.decay_frac!r}")
        if not (_is_number(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be a number >= 0, got {self.weight_decay!r}")
        if not (isinstance(self.betas, tuple) and len(self.betas) == 2
                and all(_is_number(b) and 0 <= b < 1 for b in self.betas)):
            raise ValueError(f"betas must be a pair of numbers in [0, 1), got {self.betas!r}")
        if self.grad_clip is not None and not (_is_number(self.grad_clip) and self.grad_clip > 0):
            raise ValueError(f"grad_clip must be None (off) or a number > 0, got {self.grad_clip!r}")
        if self.max_seconds is not None and not (_is_number(self.max_seconds) and self.max_seconds > 0):
            raise ValueError(f"max_seconds must be None (no limit) or a number > 0, got {self.max_seconds!r}")
        for name in ("bf16", "keep_best"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.adamw not in ADAMW_IMPLS:
            raise ValueError(f"adamw must be one of {', '.join(ADAMW_IMPLS)}, got {self.adamw!r}")
        if self.compile is not None and self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be None or one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        if self.backward not in BACKWARDS:
            raise ValueError(f"backward must be one of {', '.join(BACKWARDS)}, got {self.backward!r}")
        if self.sdpa not in SDPA_BACKENDS:
            raise ValueError(f"sdpa must be one of {', '.join(SDPA_BACKENDS)}, got {self.sdpa!r}")
        if not (isinstance(self.probe_ids, tuple) and all(is_int(i) and i >= 0 for i in self.probe_ids)):
            raise ValueError(f"probe_ids must be a tuple of token ids >= 0, got {self.probe_ids!r}")
        if not (is_int(self.film_frames) and (self.film_frames == 0 or 2 <= self.film_frames <= MAX_FILM_FRAMES)):
            raise ValueError(f"film_frames must be 0 (no film) or a whole number in [2, {MAX_FILM_FRAMES}], "
                             f"got {self.film_frames!r}")

    def lr_at(self, step: int) -> float:
        """Learning rate of step `step` (0-based): linear warm-up to lr, then decay to min_lr.

        cosine: a half cosine from the end of warm-up to the last step.
        wsd (warm-up, stable, decay): hold lr, then fall linearly to min_lr over the last
        `decay_frac` of the steps. On short runs it spends longer at the peak, which is where
        a small model learns fastest (bench/TRAINING.md compares the two).
        constant: lr at every step, no warm-up.
        """
        if self.schedule == "constant":
            return self.lr
        if step < self.warmup:
            # Warm-up: AdamW's moment estimates start from nothing, so early updates are noisy;
            # ramp up so the first steps cannot throw the weights far. (step + 1) makes step 0
            # already move and step warmup-1 reach the peak.
            return self.lr * (step + 1) / self.warmup
        low = self.lr / 10 if self.min_lr is None else self.min_lr
        last = self.steps - 1  # the last step (index steps-1) runs at min_lr
        if self.schedule == "wsd":
            # The decay never starts inside the warm-up, even if decay_frac covers the whole run.
            start = max(self.warmup, round(self.steps * (1 - self.decay_frac)))
            if step < start:
                return self.lr  # stable phase: hold the peak
            # decay phase: a straight line from lr at `start` to min_lr at `last`
            progress = min(1.0, (step - start) / max(1, last - start))
            return self.lr + progress * (low - self.lr)
        # cosine: half a cosine period from the peak (end of warm-up) to min_lr (last step);
        # min() keeps steps past the end (and max() a one-step decay) at min_lr, never below
        progress = min(1.0, (step - self.warmup) / max(1, last - self.warmup))
        return low + 0.5 * (1 + math.cos(math.pi * progress)) * (self.lr - low)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class TrainEvent:
    """What `train` reports after each step (and once more, with done=True, at the end)."""

    step: int  # steps completed
    total_steps: int
    train_loss: float  # loss of this step's batch
    val_loss: float | None  # set on evaluation steps
    eval_train_loss: float | None
    lr: float
    tokens_per_s: float
    elapsed: float
    done: bool = False
    stop_reason: str | None = None  # "finished" | "stopped" | "time limit"
    best_val_loss: float | None = None  # the lowest validation loss so far (this event's included)
    best_step: int | None = None  # the step it was measured at
    kept_step: int | None = None  # done: the step whose weights the model holds (best_step when keep_best
    # brought them back, else `step`)
    end_val_loss: float | None = None  # done: the validation loss of the last weights trained (val_loss is
    # the kept weights'; the two differ only when keep_best brought earlier weights back)
    frame: Frame | None = None  # film on: the next frame of the film, in step order, one per event at most
    # (frame.step <= step: frame 0, recorded before the first step, comes with the first event, so while
    # frames fall on consecutive steps each comes one event late); None on the final event
    film: Film | None = None  # done, film on: the whole film (its last frame shows the final weights)

    def log_dict(self) -> dict:
        """The event's numbers as a JSON-able dict (no attention arrays, frame or film)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("frame", "film")}


def well_above_best(val_loss: float, best: float) -> bool:
    """Whether a validation loss is well above the best one seen: more than max(0.1, 10 % of the best)
    higher, a rise that batch noise does not explain (the model is memorising its training text)."""
    return val_loss > best + max(0.1, 0.1 * best)


def loss_fn(model: DecoderLM, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x).logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100)


@torch.no_grad()
def evaluate(model: DecoderLM, split, batches: int, batch_size: int, block_size: int, seed: int) -> float:
    was_training = model.training
    model.eval()
    g = torch.Generator().manual_seed(seed)
    device = model.tok_emb.weight.device
    losses = []
    for _ in range(batches):
        x, y = split.get_batch(batch_size, block_size, g)
        losses.append(loss_fn(model, x.to(device), y.to(device)).item())
    model.train(was_training)
    return sum(losses) / len(losses)


def make_optimizer(model: DecoderLM, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay only on matrices (not on biases, norms or embeddings' 1-D params)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    impl = {"fused": {"fused": True}, "foreach": {"foreach": True}, "loop": {"foreach": False}}[cfg.adamw]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, **impl)


def _sdpa_context(name: str):
    """Context manager that pins the scaled-dot-product-attention kernel (or does nothing for "auto")."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH if name == "math" else SDPBackend.FLASH_ATTENTION)


def make_loss_fn(cfg: TrainConfig) -> Callable[[DecoderLM, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The training-step loss: `loss_fn`, compiled with torch.compile when cfg.compile is set.

    dynamic=False: the batch shape is fixed, so one static graph (compiled on the first step).
    """
    if cfg.compile is None:
        return loss_fn
    mode = None if cfg.compile == "default" else cfg.compile
    return torch.compile(loss_fn, mode=mode, dynamic=False)


def manual_step_blocker(model: DecoderLM, cfg: TrainConfig, ranks: Ranks | None = None) -> str | None:
    """Why this run cannot take the hand-written training step (model.fastpath), or None when it can."""
    if cfg.compile is not None:
        return "torch.compile compiles the autograd step"
    if ranks is not None and ranks.world > 1:
        return "several processes (DDP averages gradients through autograd's hooks)"
    device = model.tok_emb.weight.device.type
    if device != "cpu":
        return f"the {device} device (the hand-written step is measured and tested on the CPU only)"
    return unsupported(model)


def uses_manual_step(model: DecoderLM, cfg: TrainConfig, ranks: Ranks | None = None) -> bool:
    """Whether `train` takes the hand-written step for this run (cfg.backward "manual", or "auto" where it can)."""
    if cfg.backward == "autograd":
        return False
    why = manual_step_blocker(model, cfg, ranks)
    if why is not None and cfg.backward == "manual":
        raise ValueError(f"backward='manual' cannot train this run: {why}; use 'auto' or 'autograd'")
    return why is None


def train(
    model: DecoderLM,
    corpus,
    cfg: TrainConfig,
    should_stop: Callable[[], bool] | None = None,
    ranks: Ranks | None = None,
) -> Iterator[TrainEvent]:
    """Train `model` in place on `corpus.train`, yielding one event per step.

    Stops at cfg.steps, when should_stop() returns True, or after cfg.max_seconds; the
    last event has done=True and says why. Evaluation on `corpus.val` every eval_every
    steps and at the end. With cfg.keep_best, the weights of the lowest validation loss seen
    (a copy taken at that evaluation) are put back at the end if the final ones are worse; the
    last event's kept_step says which step's weights the model holds.

    The backward pass: cfg.backward picks it. "autograd" is the module's forward and
    loss.backward(); "manual" is the hand-written step of model/fastpath.py (`ManualStep`);
    "auto" takes the hand-written one wherever `manual_step_blocker` finds nothing against it
    (CPU, one process, no compile, a model fastpath covers) and autograd elsewhere. The Train tab
    and the CLI run with "auto", so the Train tab trains its models with the hand-written
    backward. The result is the same because the hand-written step computes the same loss and
    the same gradients as autograd, only with fewer operations: in float64 they agree on every
    gradient, and an fp32 run of either kind gives the same losses at every step and the same
    weights up to float rounding (tests/engine/test_fastpath.py); clipping and AdamW are applied alike.

    With cfg.film_frames > 0 a film is recorded on cfg.probe_ids (cut to its last
    min(block_size, MAX_PROBE_TOKENS) tokens; empty: `default_probe_ids(corpus)`, a held-out
    example): frame 0 before the first step, a frame after each step of
    `frame_steps(cfg.steps, cfg.film_frames)` but the last, and a last frame of the final model
    (after keep_best put earlier weights back) at the last step run, also when the run stops
    early. Recording changes nothing in the training: the weights are bit-identical without it.
    The film is the one record of attention during training. Its probe_tokens are the corpus
    tokenizer's display pieces; its task is the corpus's (model.heads.task_of) or None.

    ranks: this process's place in a distributed run (model.distributed; the process group
    already started): every rank draws the same global batch and trains on its share through
    DDP, the loss reported is the mean over the ranks, and only rank 0 records the film.
    Evaluations run on every rank (the same batches, the same weights: the same numbers), so
    keep_best and stopping decide alike everywhere.
    """
    ranks = ranks or Ranks()
    ranks.check_batch(cfg.batch_size)
    torch.manual_seed(cfg.seed)
    g = torch.Generator().manual_seed(cfg.seed)
    block = model.cfg.block_size
    device = model.tok_emb.weight.device
    optimizer_step = _OptimizerStep(model, cfg, ranks, device)
    share = ranks.share(cfg.batch_size)
    start = time.perf_counter()
    tokens = 0
    model.train()
    step = 0
    reason = "finished"
    best_val, best_step, best_state = None, None, None
    film = _FilmRecording(model, corpus, cfg) if cfg.film_frames and ranks.main else None
    try:
        while step < cfg.steps:
            reason = _stop_reason(should_stop, cfg.max_seconds, start, ranks) or reason
            if reason != "finished":
                break
            lr = cfg.lr_at(step)
            x, y = corpus.train.get_batch(cfg.batch_size, block, g)  # the global batch, on every rank
            x, y = x[share].to(device, non_blocking=True), y[share].to(device, non_blocking=True)
            loss = optimizer_step(x, y, lr)
            step += 1
            tokens += x.numel() * ranks.world
            elapsed = time.perf_counter() - start
            ev = TrainEvent(
                step=step, total_steps=cfg.steps, train_loss=ranks.mean(loss).item(), val_loss=None, eval_train_loss=None,
                lr=lr, tokens_per_s=tokens / elapsed, elapsed=elapsed,
            )
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                ev.val_loss = evaluate(model, corpus.val, cfg.eval_batches, cfg.batch_size, block, cfg.seed + 1)
                if best_val is None or ev.val_loss < best_val:
                    best_val, best_step = ev.val_loss, step
                    if cfg.keep_best:  # a copy, not a view: the next optimizer step changes the weights in place
                        best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            ev.best_val_loss, ev.best_step = best_val, best_step
            if film is not None:
                ev.frame = film.after_step(step)
            yield ev
    finally:
        optimizer_step.release()
        model.eval()
    elapsed = time.perf_counter() - start
    # The same batches as every evaluation during the run, so the losses compare exactly.
    val = end_val = evaluate(model, corpus.val, cfg.eval_batches, cfg.batch_size, block, cfg.seed + 1)
    kept_step = step
    if best_val is None or val <= best_val:
        best_val, best_step = val, step
    elif best_state is not None:  # keep_best: the weights of the best evaluation come back
        model.load_state_dict(best_state)
        val = evaluate(model, corpus.val, cfg.eval_batches, cfg.batch_size, block, cfg.seed + 1)
        kept_step = best_step
    tr = evaluate(model, corpus.train, cfg.eval_batches, cfg.batch_size, block, cfg.seed + 2)
    # The final event's losses are fresh evaluations of the finished model, so train_loss is
    # the evaluated train loss rather than the last batch's.
    yield TrainEvent(
        step=step, total_steps=cfg.steps, train_loss=tr, val_loss=val, eval_train_loss=tr,
        lr=cfg.lr_at(max(0, step - 1)), tokens_per_s=tokens / max(elapsed, 1e-9), elapsed=elapsed,
        done=True, stop_reason=reason, best_val_loss=best_val, best_step=best_step, kept_step=kept_step,
        end_val_loss=end_val, film=None if film is None else film.finish(step, kept_step),
    )


def _stop_reason(should_stop: Callable[[], bool] | None, max_seconds: float | None, start: float,
                 ranks: Ranks) -> str | None:
    """Why the run stops before its next step ("stopped", "time limit"), or None to go on. The ranks stop
    together: one alone would leave the others waiting."""
    stop = 0
    if should_stop is not None and should_stop():
        stop = 1
    elif max_seconds is not None and time.perf_counter() - start > max_seconds:
        stop = 2
    stop = ranks.largest(stop)
    return {0: None, 1: "stopped", 2: "time limit"}[stop]


class _OptimizerStep:
    """One training step of a run (forward, backward, clipping, AdamW) at a given learning rate, with the
    backward pass `uses_manual_step` picks: the hand-written one of model/fastpath.py or autograd's."""

    def __init__(self, model: DecoderLM, cfg: TrainConfig, ranks: Ranks, device: torch.device) -> None:
        self.model, self.cfg = model, cfg
        self.manual = None
        if uses_manual_step(model, cfg, ranks):
            # one hand-written step on flat weights (model/fastpath.py): the same loss and gradients with a fifth
            # of the operations; the model's parameters become views of its fp32 master weights until release()
            self.manual = ManualStep(model, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas, bf16=cfg.bf16)
            self.optimizer = self.manual.optimizer
        else:
            self.trained = wrap(model, ranks, device)  # DDP averages the gradients of the ranks' shares
            self.optimizer = make_optimizer(model, cfg)
            self.loss_fn = make_loss_fn(cfg)
            self.autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if cfg.bf16
                             else contextlib.nullcontext())

    def __call__(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> torch.Tensor:
        """Take the step on batch (x, y); the batch's loss (before the update)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.manual is not None:
            return self.manual.step(x, y, self.cfg.grad_clip)
        with self.autocast, _sdpa_context(self.cfg.sdpa):
            loss = self.loss_fn(self.trained, x, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        return loss

    def release(self) -> None:
        """Every parameter its own storage again, as before the run (the hand-written step's flat weights)."""
        if self.manual is not None:
            self.manual.release()


class _FilmRecording:
    """A run's film as it is recorded (see `train`): frame 0 on creation, a frame after each step of
    `frame_steps` but the last, handed out one per event in step order, and the final model's frame at the end.

    evaluate() and probe() draw batches from generators of their own and run in eval mode (no dropout):
    recording touches none of the training's random numbers or weights."""

    def __init__(self, model: DecoderLM, corpus, cfg: TrainConfig) -> None:
        block = model.cfg.block_size
        self.probe_ids = clip_probe(cfg.probe_ids, block) if cfg.probe_ids else default_probe_ids(corpus, block)
        if not self.probe_ids or max(self.probe_ids) >= model.cfg.vocab_size:
            raise ValueError(f"the film's probe must be 1 or more token ids below the vocabulary size "
                             f"{model.cfg.vocab_size}")
        self.model, self.corpus, self.cfg = model, corpus, cfg
        self.at = set(frame_steps(cfg.steps, cfg.film_frames))
        self.batches = min(cfg.eval_batches, FILM_EVAL_BATCHES)
        self.frames: list[Frame] = []
        self.pending: list[Frame] = []  # recorded, not yet handed out with an event
        self._record(0)

    def _record(self, step: int) -> None:
        m, split, cfg = self.model, self.corpus, self.cfg
        block = m.cfg.block_size
        frame = Frame(
            step=step, attention=probe(m, tuple(self.probe_ids)),
            train_loss=evaluate(m, split.train, self.batches, cfg.batch_size, block, cfg.seed + 2),
            val_loss=evaluate(m, split.val, self.batches, cfg.batch_size, block, cfg.seed + 1),
        )
        self.frames.append(frame)
        self.pending.append(frame)

    def after_step(self, step: int) -> Frame | None:
        """Record the frame of `step` when it has one (the last step's is the final model's: `finish`), and
        hand out the next frame due."""
        if step in self.at and step < self.cfg.steps:
            self._record(step)
        return self.pending.pop(0) if self.pending else None

    def finish(self, step: int, kept_step: int) -> Film:
        """The whole film, its last frame the final model's (after keep_best) at the last step run."""
        if self.frames[-1].step == step:  # stopped right after a frame (or before the first step)
            self.frames.pop()
        self._record(step)
        pieces = [self.corpus.tokenizer.piece(i) for i in self.probe_ids]
        return Film(probe_ids=list(self.probe_ids), probe_tokens=pieces, frames=self.frames,
                    total_steps=self.cfg.steps, task=task_of(self.corpus.name),
                    kept_step=kept_step if kept_step != step else None)


@torch.no_grad()
def probe(model: DecoderLM, ids: tuple[int, ...]) -> list:
    """The attention of every layer on `ids` (its last block_size tokens), per layer (H, T, T) float32
    numpy, in eval mode (no dropout): what a film's frame holds."""
    was_training = model.training
    model.eval()
    ids = ids[-model.cfg.block_size :]
    out = model(torch.tensor([list(ids)], device=model.tok_emb.weight.device), return_attention=True)
    model.train(was_training)
    return [a[0].float().cpu().numpy() for a in out.attentions]


if __name__ == "__main__":
    from .cli import train_main

    sys.exit(train_main())
