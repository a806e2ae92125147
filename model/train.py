"""One training loop for the CLI, the benchmark and the app.

`train()` is a generator of `TrainEvent`s: the caller decides how to show progress and can
stop it at any time (by a callable, a wall-clock deadline, or simply by not asking for the
next event); the model keeps whatever it learned so far.

With cfg.film_frames > 0 a run records a training film (model/film.py): at the steps of
`frame_steps` (and at step 0, before the first step) the attention on a probe prompt and the
train and validation loss; the final event carries the `Film`.

CLI: python -m model.train --corpus sort --steps 2000 --out assets/sort
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from .config import ACTIVATIONS, NORMS, POS_ENCODINGS, ModelConfig
from . import distributed
from .distributed import DEFAULT_TIMEOUT_S, Ranks, wrap
from .film import (
    FILM_EVAL_BATCHES, FILM_FRAMES, MAX_FILM_FRAMES, Film, Frame, clip_probe, default_probe_ids, frame_steps, task_of,
)
from .fastpath import ManualStep, unsupported
from .generate import SEED_RANGE
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
    probe_every: int = 0  # capture attention on probe_ids every N steps (0 = never)
    probe_ids: tuple[int, ...] = field(default_factory=tuple)
    keep_best: bool = False  # end with the weights of the lowest validation loss seen (at an evaluation)
    film_frames: int = 0  # record a training film of this many frames on probe_ids (0 = no film; see model/film.py)

    def __post_init__(self) -> None:
        # Every field is checked here, so a bad value fails when the config is built, with the
        # field's name in the message, not steps later inside the optimizer or the loop.
        for name in ("steps", "batch_size", "eval_batches"):
            if not _is_int(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive whole number, got {getattr(self, name)!r}")
        for name in ("warmup", "eval_every", "probe_every"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a whole number >= 0, got {getattr(self, name)!r}")
        if not _is_int(self.seed):
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
        if not (isinstance(self.probe_ids, tuple) and all(_is_int(i) and i >= 0 for i in self.probe_ids)):
            raise ValueError(f"probe_ids must be a tuple of token ids >= 0, got {self.probe_ids!r}")
        if not (_is_int(self.film_frames) and (self.film_frames == 0 or 2 <= self.film_frames <= MAX_FILM_FRAMES)):
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


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # True is an int to Python, not to us


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
    probe_attention: list | None = None  # per layer (H, T, T) numpy, on probe steps
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
                if f.name not in ("probe_attention", "frame", "film")}


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

    With cfg.film_frames > 0 a film is recorded on cfg.probe_ids (cut to its last
    min(block_size, MAX_PROBE_TOKENS) tokens; empty: `default_probe_ids(corpus)`, a held-out
    example): frame 0 before the first step, a frame after each step of
    `frame_steps(cfg.steps, cfg.film_frames)` but the last, and a last frame of the final model
    (after keep_best put earlier weights back) at the last step run, also when the run stops
    early. Recording changes nothing in the training: the weights are bit-identical without it.
    The film's probe_tokens are the corpus tokenizer's display pieces; its task is the corpus's
    ("sort", "copy") or None.

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
    if uses_manual_step(model, cfg, ranks):
        # one hand-written step on flat weights (model/fastpath.py): the same loss and gradients with a fifth
        # of the operations; the model's parameters become views of its fp32 master weights until the end
        manual = ManualStep(model, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas, bf16=cfg.bf16)
        opt = manual.optimizer
    else:
        manual = None
        trained = wrap(model, ranks, device)  # DDP averages the gradients of the ranks' shares
        opt = make_optimizer(model, cfg)
        step_loss = make_loss_fn(cfg)
    share = ranks.share(cfg.batch_size)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if cfg.bf16 else contextlib.nullcontext()
    start = time.perf_counter()
    tokens = 0
    model.train()
    step = 0
    reason = "finished"
    best_val, best_step, best_state = None, None, None
    frames: list[Frame] = []
    pending: list[Frame] = []  # recorded, not yet handed out with an event
    film_frames = cfg.film_frames if ranks.main else 0
    if film_frames:
        probe_ids = (clip_probe(cfg.probe_ids, block) if cfg.probe_ids
                     else default_probe_ids(corpus, block))
        if not probe_ids or max(probe_ids) >= model.cfg.vocab_size:
            raise ValueError(f"the film's probe must be 1 or more token ids below the vocabulary size "
                             f"{model.cfg.vocab_size}")
        film_at = set(frame_steps(cfg.steps, cfg.film_frames))
        film_batches = min(cfg.eval_batches, FILM_EVAL_BATCHES)

        def record(at: int) -> Frame:
            # evaluate() and probe() draw batches from generators of their own and run in eval
            # mode (no dropout): nothing here touches the training's random numbers or weights
            return Frame(
                step=at, attention=probe(model, tuple(probe_ids)),
                train_loss=evaluate(model, corpus.train, film_batches, cfg.batch_size, block, cfg.seed + 2),
                val_loss=evaluate(model, corpus.val, film_batches, cfg.batch_size, block, cfg.seed + 1),
            )

        frames.append(record(0))
        pending.append(frames[-1])
    try:
        while step < cfg.steps:
            stop = 0
            if should_stop is not None and should_stop():
                stop = 1
            elif cfg.max_seconds is not None and time.perf_counter() - start > cfg.max_seconds:
                stop = 2
            stop = ranks.largest(stop)  # the ranks stop together (one alone would leave the others waiting)
            if stop:
                reason = "stopped" if stop == 1 else "time limit"
                break
            lr = cfg.lr_at(step)
            for group in opt.param_groups:
                group["lr"] = lr
            x, y = corpus.train.get_batch(cfg.batch_size, block, g)  # the global batch, on every rank
            x, y = x[share].to(device, non_blocking=True), y[share].to(device, non_blocking=True)
            if manual is not None:
                loss = manual.step(x, y, cfg.grad_clip)  # forward, backward, clipping and AdamW
            else:
                with autocast, _sdpa_context(cfg.sdpa):
                    loss = step_loss(trained, x, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                opt.step()
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
            if cfg.probe_every and cfg.probe_ids and step % cfg.probe_every == 0:
                ev.probe_attention = probe(model, cfg.probe_ids)
            if film_frames and step in film_at and step < cfg.steps:  # the last frame: on the final model
                frames.append(record(step))
                pending.append(frames[-1])
            if pending:
                ev.frame = pending.pop(0)
            yield ev
    finally:
        if manual is not None:
            manual.release()  # every parameter its own storage again, as before the run
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
    film = None
    if film_frames:
        if frames[-1].step == step:  # stopped right after a frame (or before the first step): the final model's
            frames.pop()
        frames.append(record(step))
        film = Film(probe_ids=list(probe_ids), probe_tokens=[corpus.tokenizer.piece(i) for i in probe_ids],
                    frames=frames, total_steps=cfg.steps, task=task_of(corpus.name),
                    kept_step=kept_step if kept_step != step else None)
    # The final event's losses are fresh evaluations of the finished model, so train_loss is
    # the evaluated train loss rather than the last batch's.
    yield TrainEvent(
        step=step, total_steps=cfg.steps, train_loss=tr, val_loss=val, eval_train_loss=tr,
        lr=cfg.lr_at(max(0, step - 1)), tokens_per_s=tokens / max(elapsed, 1e-9), elapsed=elapsed,
        done=True, stop_reason=reason, best_val_loss=best_val, best_step=best_step, kept_step=kept_step,
        end_val_loss=end_val, film=film,
    )


@torch.no_grad()
def probe(model: DecoderLM, ids: tuple[int, ...]) -> list:
    was_training = model.training
    model.eval()
    ids = ids[-model.cfg.block_size :]
    out = model(torch.tensor([list(ids)], device=model.tok_emb.weight.device), return_attention=True)
    model.train(was_training)
    return [a[0].float().cpu().numpy() for a in out.attentions]


# ----------------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    from .corpora import CORPUS_NAMES
    from .tokenizers import TOKENIZER_KINDS

    p = argparse.ArgumentParser(
        prog="python -m model.train",
        description="Train a small decoder-only transformer and save it as a checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--corpus", default="sort", choices=CORPUS_NAMES, help="built-in corpus (text needs --text)")
    p.add_argument("--text", type=Path,
                   help="train on this UTF-8 text file (implies --corpus text; a preset of the text corpus needs it)")
    p.add_argument("--tokenizer", default=None, choices=TOKENIZER_KINDS,
                   help="tokenizer for text corpora (default: the corpus's own)")
    p.add_argument("--preset", help="use a named model+training preset (see model/presets.py); --steps, --lr, --seed, --max-seconds, --bf16, --schedule, --decay-frac and --keep-best override it; architecture flags are ignored")
    p.add_argument("--layers", type=int, default=2, help="number of transformer blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads per block")
    p.add_argument("--d-model", type=int, default=64, help="embedding / residual width")
    p.add_argument("--d-ff", type=int, default=None, help="feed-forward width (default 4*d_model; 0 = none)")
    p.add_argument("--block-size", type=int, default=64, help="context length in tokens")
    p.add_argument("--pos", default="learned", choices=POS_ENCODINGS, help="positional encoding")
    p.add_argument("--norm", default="pre", choices=NORMS, help="layer-norm placement")
    p.add_argument("--activation", default="gelu", choices=ACTIVATIONS, help="feed-forward activation")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability")
    p.add_argument("--no-bias", action="store_true", help="linear layers and norms without bias")
    p.add_argument("--tie", action="store_true", help="tie input embedding and output head weights")
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=12, help="sequences per batch")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--min-lr", type=float, default=None, help="learning rate the cosine or wsd decay ends at (default lr/10)")
    p.add_argument("--warmup", type=int, default=50, help="linear warm-up steps")
    p.add_argument("--schedule", default="cosine", choices=SCHEDULES,
                   help="learning-rate decay after warm-up: cosine, wsd (hold, then linear decay over the last --decay-frac) or constant")
    p.add_argument("--decay-frac", type=float, default=0.3, help="wsd: fraction of the steps spent decaying to --min-lr")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay")
    p.add_argument("--eval-every", type=int, default=100, help="evaluate on held-out data every N steps")
    p.add_argument("--keep-best", action="store_true",
                   help="end with the weights of the lowest validation loss seen at an evaluation, if the final ones are worse")
    p.add_argument("--seed", type=int, default=0, help="seed for data, initialisation and batches")
    p.add_argument("--max-seconds", type=float, default=None, help="stop after this many seconds (model is kept)")
    p.add_argument("--bf16", action="store_true",
                   help="matrix products in bfloat16 (fast on CPUs with AMX; always on with CUDA): a bf16 copy of the "
                        "fp32 weights on the hand-written step, autocast on autograd's")
    p.add_argument("--backward", default="auto", choices=BACKWARDS,
                   help="training step: auto = the hand-written step of model/fastpath.py where it can run (CPU, one "
                        "process, pre-norm or no norm, no rope, gelu/relu, no dropout), else autograd; manual = "
                        "refuse when it cannot; autograd = always the module's forward and loss.backward()")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where to train: auto = CUDA when there is a GPU; under torchrun each process takes its "
                        "LOCAL_RANK's GPU")
    p.add_argument("--dist-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help="under torchrun: how long a process waits for the others before giving up")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--film", type=int, default=FILM_FRAMES, metavar="N",
                   help=f"record a training film of N frames (0 = none; at most {MAX_FILM_FRAMES}) into the checkpoint")
    p.add_argument("--probe", default=None, metavar="TEXT",
                   help="the film's probe prompt (its last 32 tokens; default: a held-out example of the corpus, "
                        "one validation example of sort/copy/toy or the start of the validation text)")
    p.add_argument("--out", type=Path, help="checkpoint path to save (.safetensors is added; a .json beside it)")
    p.add_argument("--quiet", action="store_true", help="print only evaluation steps and the result")
    return p


# the config fields a CLI flag sets, for its refusals ("steps must be …" is said as "--steps must be …")
FLAGS = {"steps": "--steps", "batch_size": "--batch-size", "lr": "--lr", "min_lr": "--min-lr", "warmup": "--warmup",
         "decay_frac": "--decay-frac", "weight_decay": "--weight-decay", "eval_every": "--eval-every",
         "seed": "--seed", "max_seconds": "--max-seconds", "block_size": "--block-size", "n_layers": "--layers",
         "n_heads": "--heads", "d_model": "--d-model", "d_ff": "--d-ff", "dropout": "--dropout"}


def _as_flags(message: str) -> str:
    """A config's refusal in the words of the command line: its field names as their flags."""
    return re.sub(r"\b(" + "|".join(FLAGS) + r")\b(=?)", lambda m: FLAGS[m.group(1)] + (" " if m.group(2) else ""),
                  message)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be a whole number >= 1, got {args.threads}")
    if not SEED_RANGE[0] <= args.seed <= SEED_RANGE[1]:
        parser.error(f"--seed must be a whole number in [{SEED_RANGE[0]}, {SEED_RANGE[1]:,}], got {args.seed}")
    if args.dist_timeout is not None and not args.dist_timeout > 0:
        parser.error(f"--dist-timeout must be a number of seconds > 0, got {args.dist_timeout}")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        ranks = distributed.from_env()
        device = pick_device(args.device, ranks)
        distributed.start(ranks, device, args.dist_timeout)
    except distributed.DistributedError as exc:
        print(f"cannot train: {exc}", file=sys.stderr)
        return 2
    try:
        return _main(parser, args, argv, ranks, device)
    except distributed.DistributedError as exc:
        print(f"rank {ranks.rank}: cannot train: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a collective that failed: another process died or stopped answering
        if not ranks.active:
            raise
        print(f"rank {ranks.rank}: the distributed run stopped ({str(exc).splitlines()[0][:200]}); "
              "no checkpoint was written", file=sys.stderr)
        return 1
    finally:
        distributed.stop()


def pick_device(name: str, ranks: distributed.Ranks) -> torch.device:
    """--device: "auto" is CUDA when there is a GPU; under torchrun each process takes its LOCAL_RANK's."""
    cuda = torch.cuda.is_available()
    if name == "cuda" and not cuda:
        raise distributed.DistributedError("--device cuda, but this machine has no CUDA GPU")
    if name == "cpu" or not cuda:
        return torch.device("cpu")
    index = ranks.local_rank if ranks.active else 0
    if index >= torch.cuda.device_count():
        raise distributed.DistributedError(f"process {ranks.rank} wants GPU {index}, but this machine has "
                                           f"{torch.cuda.device_count()}")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _setup(parser, args):
    """The corpus and the two configs the flags ask for (ValueError names a bad value), or an exit
    status after saying what is wrong."""
    from .corpora import build_corpus, read_text_file
    from .presets import PRESETS

    if args.preset:
        if args.preset not in PRESETS:
            print(f"unknown preset {args.preset!r}; choose from {', '.join(PRESETS)}", file=sys.stderr)
            return 2
        preset = PRESETS[args.preset]
        if (preset.corpus == "text") != (args.text is not None):
            need = "needs --text PATH" if preset.corpus == "text" else "brings its own corpus: leave out --text"
            print(f"preset {args.preset!r} {need}", file=sys.stderr)
            return 2
        text = read_text_file(args.text) if args.text else None  # a text preset never stores its text
        corpus = build_corpus(preset.corpus, preset.tokenizer, seed=args.seed, text=text)
        mcfg = preset.model_config(corpus.tokenizer.vocab_size)
        tcfg = preset.train
        overrides = {
            k: getattr(args, k)
            for k in ("steps", "lr", "seed", "max_seconds", "bf16", "schedule", "decay_frac", "keep_best")
            if getattr(args, k) != parser.get_default(k)
        }
        overrides["backward"] = args.backward
        tcfg = TrainConfig(**{**asdict(tcfg), **overrides})
    else:
        text = read_text_file(args.text) if args.text else None
        corpus = build_corpus("text" if text else args.corpus, args.tokenizer, seed=args.seed, text=text)
        mcfg = ModelConfig(
            vocab_size=corpus.tokenizer.vocab_size, block_size=args.block_size, n_layers=args.layers,
            n_heads=args.heads, d_model=args.d_model, d_ff=args.d_ff, pos_encoding=args.pos, norm=args.norm,
            activation=args.activation, dropout=args.dropout, bias=not args.no_bias, tie_weights=args.tie,
        )
        tcfg = TrainConfig(
            steps=args.steps, batch_size=args.batch_size, lr=args.lr, min_lr=args.min_lr, warmup=args.warmup,
            weight_decay=args.weight_decay, eval_every=args.eval_every, seed=args.seed,
            max_seconds=args.max_seconds, bf16=args.bf16, schedule=args.schedule, decay_frac=args.decay_frac,
            keep_best=args.keep_best, backward=args.backward,
        )
    probe_ids: list[int] = []
    probe_text = args.probe if args.probe is not None else (PRESETS[args.preset].probe if args.preset else None)
    if probe_text is not None:
        probe_ids = clip_probe(corpus.tokenizer.encode(probe_text), mcfg.block_size)
        if not probe_ids:
            print("--probe gives no tokens; type some text, or leave it out for the default probe", file=sys.stderr)
            return 2
    elif args.film:
        probe_ids = default_probe_ids(corpus, mcfg.block_size)
    try:
        tcfg = replace(tcfg, film_frames=args.film, probe_ids=tuple(probe_ids) if args.film else tcfg.probe_ids)
    except ValueError as exc:
        print(f"--film: {exc}", file=sys.stderr)
        return 2
    return corpus, mcfg, tcfg


def _main(parser, args, argv, ranks: distributed.Ranks, device: torch.device) -> int:
    from .checkpoint import save_checkpoint
    from .presets import PRESETS

    say = print if ranks.main else (lambda *a, **k: None)  # only rank 0 speaks
    try:  # every value is checked where its config is built: a bad one ends the run with its sentence
        setup = _setup(parser, args)
    except OSError as exc:
        parser.error(f"cannot read {args.text}: {exc.strerror or exc}")
    except ValueError as exc:
        parser.error(_as_flags(str(exc)))
    if isinstance(setup, int):
        return setup
    corpus, mcfg, tcfg = setup
    if device.type == "cuda":
        tcfg = replace(tcfg, bf16=True)  # CUDA trains under bfloat16 autocast
    torch.manual_seed(tcfg.seed)  # every rank builds the same initial weights
    model = DecoderLM(mcfg).to(device)
    try:
        manual = uses_manual_step(model, tcfg, ranks)
    except ValueError as exc:  # --backward manual on a run it cannot take
        print(f"--backward: {exc}", file=sys.stderr)
        return 2
    say(json.dumps({"corpus": corpus.name, "params": model.n_params(), "model": mcfg.to_dict(),
                    "device": str(device), "bf16": tcfg.bf16, "processes": ranks.world,
                    "backward": "manual" if manual else "autograd"}))
    last = None
    for ev in train(model, corpus, tcfg, ranks=ranks):
        last = ev
        if ev.done or ev.val_loss is not None or not args.quiet:
            say(json.dumps(ev.log_dict()), flush=True)
    model.to("cpu")
    if args.out and ranks.main:  # one writer; written whole or not at all (atomic_write)
        meta = {
            "corpus": corpus.name,
            "command": "python -m model.train " + " ".join(argv if argv is not None else sys.argv[1:]),
            "steps": last.step,
            "final_val_loss": round(last.val_loss, 4),
            "final_train_loss": round(last.eval_train_loss, 4),
            "seconds": round(last.elapsed, 1),
            **({"kept_step": last.kept_step} if tcfg.keep_best else {}),
            "summary": PRESETS[args.preset].summary if args.preset else "",
            "quality": PRESETS[args.preset].quality if args.preset else "",
            **({"film_frames": len(last.film.frames), "film_probe": corpus.tokenizer.decode(last.film.probe_ids)}
               if last.film is not None else {}),
        }
        path = save_checkpoint(args.out, model, corpus.tokenizer, meta, film=last.film)
        path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
        say(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
