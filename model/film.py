"""The training film: the attention of every head on one probe prompt, recorded while a model learns.

A film is a list of frames, one per chosen step (`frame_steps`: denser early, where most of the
change happens; always step 0 — the untrained model — and the last step run). A frame holds
exactly what `model.train.probe` returns for the weights at that step (per layer an (H, T, T)
float32 array), and the train and validation loss of those weights, measured by
`model.train.evaluate` on a few fixed batches (generators of their own: recording never touches
the training's random numbers, so the trained weights are bit-identical with or without a film).

From the frames, `Film.scores()` gives every head score of `model.heads` over the steps, and
`Film.phases()` finds, for each head, the short window where one of its scores changed most
(the moment it "becomes an induction head").

In a checkpoint a film is stored beside the weights (`film_to_tensors`, `film_from_tensors`):
per layer one float32 tensor ``film.attention.<layer>`` of shape (F, H, T·(T+1)/2) — the lower
triangles, row by row, of a causal model's matrices (above the diagonal is zero by
construction) — or (F, H, T, T) for a bidirectional model, plus JSON metadata (steps, losses,
probe ids and display pieces, task, kept_step, total_steps). A film read from a file is
validated as strictly as the rest of it.

A film can also be made from a series of published checkpoints of one model, one frame per checkpoint:
``python -m model.film SRC --revisions R1,R2,… --probe TEXT --out FILE`` (model/film_series.py).

Conventions: layers and heads are numbered from 0, as everywhere in the app. A frame's `step` is
the number of optimizer steps taken. When keep_best brought earlier weights back at the end, the
last frame still sits at the last step run but shows the final (kept) model, and `Film.kept_step`
says which step's weights those are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .corpora import FEMALE_NAMES, MALE_NAMES
from .heads import MATCH_THRESHOLD, ROLES, TASK_ROLES, TASKS, Role, head_scores, task_score, task_targets
from .json_bounds import is_int

FILM_FRAMES = 40  # default number of frames of a run
MAX_FILM_FRAMES = 100
MAX_PROBE_TOKENS = 32  # the probe prompt is cut to its last 32 tokens (and to the model's block size)
FILM_EVAL_BATCHES = 2  # batches per loss of a frame (at most the run's eval_batches): a frame must stay cheap
NAME_GENDERS = {**{n: "f" for n in FEMALE_NAMES}, **{n: "m" for n in MALE_NAMES}}  # the grammar corpus's names
MAX_PIECE_CHARS = 200  # a stored display piece longer than this is refused
PHASE_WINDOW_FRAC = 0.05  # a phase window spans ~5 % of the run ...
PHASE_WINDOW_FRAMES = 2  # ... or 2 frames, whichever is larger
MIN_PHASE_CHANGE = 0.15  # a phase is reported only when the score moves by at least this much
ROW_SUM_TOL = 1e-3
PREFIX = "film."


def frame_steps(total_steps: int, n_frames: int = FILM_FRAMES) -> list[int]:
    """The steps at which a run of `total_steps` steps records a frame.

    Sorted, unique, always 0 and `total_steps`, exactly min(n_frames, total_steps + 1) of them.
    Denser early, where attention changes fastest: frame k of n falls at round(total·(k/(n−1))²),
    so half of the frames lie in the first quarter of the run and the gaps grow linearly to
    about 2·total/n at the end; steps that rounding made equal are pushed apart (the first
    ones become consecutive).
    """
    if not isinstance(total_steps, int) or isinstance(total_steps, bool) or total_steps < 0:
        raise ValueError(f"total_steps must be a whole number >= 0, got {total_steps!r}")
    if not isinstance(n_frames, int) or isinstance(n_frames, bool) or not 2 <= n_frames <= MAX_FILM_FRAMES:
        raise ValueError(f"n_frames must be a whole number in [2, {MAX_FILM_FRAMES}], got {n_frames!r}")
    if total_steps + 1 <= n_frames:
        return list(range(total_steps + 1))
    # quadratic spacing: frame k at total·(k/(n−1))², so half of the frames fall in the first
    # quarter of the run; then pushed apart where rounding made them meet (the earliest steps
    # become consecutive), never past the end
    steps = [int(round(total_steps * (k / (n_frames - 1)) ** 2)) for k in range(n_frames)]
    for k in range(1, n_frames):
        steps[k] = max(steps[k], steps[k - 1] + 1)
    for k in range(n_frames - 1, -1, -1):
        steps[k] = min(steps[k], total_steps - (n_frames - 1 - k))
    return steps


@dataclass
class Frame:
    step: int
    attention: list[np.ndarray]  # per layer (H, T, T) float32: what probe() returns at that step
    train_loss: float
    val_loss: float | None


@dataclass
class Phase:
    layer: int
    head: int
    score: str  # a key of model.heads.ROLES, or "match"
    step: int  # the frame where half of the window's change has happened
    before: float  # the score at the window's start ...
    after: float  # ... and at its end
    loss_before: float  # the loss (validation where measured, else train) at the window's start ...
    loss_after: float  # ... and at its end
    task: str | None = None  # the film's task, which names its "match" score
    loss_name: str = "the loss"  # which loss that is, as the sentence names it (`Film.phase_loss_name`)

    def sentence(self) -> str:
        thr = score_threshold(self.score)
        who = f"layer {self.layer} · head {self.head}"
        loss = (f"as {self.loss_name} {'falls' if self.loss_after < self.loss_before else 'rises'} "
                f"from {self.loss_before:.2f} to {self.loss_after:.2f}")
        role = "the task's ideal pattern"
        noun = None if self.score == "match" else _ROLE_NOUNS.get(self.score, ROLES[self.score].name + " head")
        if thr is not None and self.before < thr <= self.after:
            what = f"starts to follow {role}" if noun is None else f"becomes {_article(noun)} {noun}"
        elif thr is not None and self.after < thr <= self.before:
            what = f"stops following {role}" if noun is None else f"stops being {_article(noun)} {noun}"
        else:
            name = TASK_ROLES[self.task].name if self.score == "match" and self.task in TASK_ROLES else (
                "task-match" if self.score == "match" else ROLES[self.score].name)
            what = (f": its {name} score {'rises' if self.after > self.before else 'falls'} "
                    f"from {self.before:.2f} to {self.after:.2f}")
            return f"{who}{what} around step {self.step}, {loss}"
        return f"{who} {what} around step {self.step}, {loss}"


_ROLE_NOUNS = {
    "previous_token": "previous-token head",
    "first_token": "first-token (sink) head",
    "self_attention": "self-attending head",
    "induction": "induction head",
}


def _article(noun: str) -> str:
    return "an" if noun[0] in "aeiou" else "a"


def _spread(series: np.ndarray) -> np.ndarray:
    """Highest minus lowest over the first axis (frames), NaN frames left out; -1 where every frame is NaN."""
    ok = np.isfinite(series)
    top = np.where(ok, series, -np.inf).max(axis=0)
    low = np.where(ok, series, np.inf).min(axis=0)
    return np.where(ok.any(axis=0), top - low, -1.0)


def score_threshold(score: str) -> float | None:
    """The threshold from which a head plays the role of `score` (None: no role, as entropy)."""
    if score == "match":
        return MATCH_THRESHOLD
    return ROLES[score].threshold


@dataclass
class Film:
    probe_ids: list[int]
    probe_tokens: list[str]  # display pieces of the probe
    frames: list[Frame]  # in step order
    total_steps: int  # the steps the run was set to take (the last frame is the last step run)
    task: str | None = None  # one of model.heads.TASKS or None (enables the task's own "match" score)
    kept_step: int | None = None  # when keep_best brought earlier weights back: their step
    # what a frame's train_loss was measured on: "training" (batches of the training data, with val_loss on
    # held-out batches), or "probe" (a film from a checkpoint series: the probe prompt itself, with val_loss
    # on a held-out text when one was given)
    loss_source: str = "training"

    def loss_names(self) -> tuple[str, str]:
        """How the frames' two losses are named (train_loss, val_loss) in figures and captions."""
        return ("loss on the probe", "held-out loss") if self.loss_source == "probe" else ("train", "validation")

    def phase_loss_name(self) -> str:
        """The loss a phase sentence quotes (`losses`), by what it was measured on."""
        if self.loss_source != "probe":
            return "the loss"
        return "the held-out loss" if any(f.val_loss is not None for f in self.frames) else "the loss on the probe"

    def steps(self) -> np.ndarray:
        return np.asarray([f.step for f in self.frames], dtype=np.int64)

    def losses(self) -> np.ndarray:
        """The loss a learner follows, per frame: validation where measured, else train."""
        return np.asarray([f.train_loss if f.val_loss is None else f.val_loss for f in self.frames], dtype=np.float64)

    def loss_at(self, step: int) -> float:
        """The loss (as `losses`) of the last frame at or before `step` (the first frame before it)."""
        i = max(0, int(np.searchsorted(self.steps(), step, side="right")) - 1)
        return float(self.losses()[i])

    def frame_index(self, step: int) -> int:
        """The index of the frame nearest to `step`."""
        return int(np.argmin(np.abs(self.steps() - step)))

    def match_keys(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The (queries, keys) of the task's ideal attention on the probe, or None without a task."""
        if self.task not in TASKS:
            return None
        return task_targets(self.task, self.probe_tokens, NAME_GENDERS)

    def role(self, score: str) -> Role:
        """The role a score of this film stands for (its name, formula and threshold): one of
        model.heads.ROLES, or for "match" the task's own (TASK_ROLES: sort match, copy match, pronoun → name)."""
        if score == "match":
            if self.task not in TASK_ROLES:
                raise ValueError("this film has no task, so no match score")
            return TASK_ROLES[self.task]
        return ROLES[score]

    def scores(self) -> dict[str, np.ndarray]:
        """Score name -> (F, L, H) float array (NaN where undefined): the keys of model.heads.ROLES,
        plus "match" (the task's own score, `model.heads.task_score`) when the film has a task."""
        per_frame = [head_scores(f.attention, self.probe_ids) for f in self.frames]
        out = {k: np.stack([s[k] for s in per_frame]).astype(np.float64) for k in ROLES}
        keys = self.match_keys()
        if keys is not None:
            out["match"] = np.stack([task_score(self.task, np.stack(f.attention), *keys)
                                     for f in self.frames]).astype(np.float64)
        return out

    def largest_change(self) -> tuple[str, int, int, float] | None:
        """(score, layer, head, change): the head and score whose curve moves most over the film.

        The change of a head's score is its range over the frames (highest minus lowest, NaN frames
        left out). Only the scores of a role are compared (those with a threshold: every one lies in
        [0, 1]; entropy, in bits, is not a role). Ties go to the first in score order, then layer, then
        head. None when the film has no frames or no role score is defined anywhere.
        """
        best = None
        for key, s in (self.scores().items() if self.frames else ()):
            if score_threshold(key) is None:
                continue
            spread = _spread(s)  # (L, H)
            layer, head = np.unravel_index(int(np.argmax(spread)), spread.shape)
            if spread[layer, head] >= 0 and (best is None or spread[layer, head] > best[3] + 1e-12):
                best = (key, int(layer), int(head), float(spread[layer, head]))
        return best

    def head_of_largest_change(self, score: str, layer: int) -> int | None:
        """The head of `layer` whose `score` moves most over the film (as `largest_change`), or None when
        the score is undefined for every head of that layer."""
        spread = _spread(self.scores()[score][:, layer, :])  # (H,)
        head = int(np.argmax(spread))
        return head if spread[head] >= 0 else None

    def phase_window(self) -> float:
        """The window of `phases`, in steps: PHASE_WINDOW_FRAC of the run (at least 1 step)."""
        run = int(self.frames[-1].step) if self.frames else 0
        return max(1.0, PHASE_WINDOW_FRAC * run)

    def phases(self) -> list[Phase]:
        """At most one phase per head, strongest first.

        For each head and each score with a threshold (entropy has none), every window is tried
        that starts at a frame i and ends at frame j, the first frame at least `phase_window()`
        steps later and at least PHASE_WINDOW_FRAMES frames later. The window where the score
        changed most (|s[j] − s[i]|, relative to the score's threshold) is the head's phase, if
        that change is at least MIN_PHASE_CHANGE. Its step is the first frame in (i, j] where half
        of the change has happened. Ranked by the change relative to the threshold.
        """
        F = len(self.frames)
        if F < 2:
            return []
        steps = self.steps()
        window = self.phase_window()
        ends = []
        for i in range(F - 1):
            j = int(np.searchsorted(steps, steps[i] + window, side="left"))
            ends.append(min(F - 1, max(j, i + PHASE_WINDOW_FRAMES)))
        losses = self.losses()
        scores = {k: v for k, v in self.scores().items() if score_threshold(k) is not None}
        L, H = next(iter(scores.values())).shape[1:]
        found: list[tuple[float, Phase]] = []
        for layer in range(L):
            for head in range(H):
                best = None
                for key, s in scores.items():
                    series = s[:, layer, head]
                    thr = score_threshold(key)
                    for i, j in enumerate(ends):
                        a, b = series[i], series[j]
                        if not (math.isfinite(a) and math.isfinite(b)):
                            continue
                        change = abs(b - a)
                        if change < MIN_PHASE_CHANGE:
                            continue
                        rel = change / thr
                        if best is None or rel > best[0] + 1e-12:
                            best = (rel, key, i, j)
                if best is None:
                    continue
                rel, key, i, j = best
                series = scores[key][:, layer, head]
                half = series[i] + (series[j] - series[i]) / 2
                rising = series[j] > series[i]
                k = next(k for k in range(i + 1, j + 1)
                         if (series[k] >= half if rising else series[k] <= half))
                found.append((rel, Phase(layer, head, key, int(steps[k]), float(series[i]), float(series[j]),
                                         float(losses[i]), float(losses[j]), self.task, self.phase_loss_name())))
        found.sort(key=lambda x: (-x[0], x[1].step, x[1].layer, x[1].head))
        return [p for _, p in found]


# ------------------------------------------------------------------------------- storage


def _tri_indices(T: int) -> tuple[np.ndarray, np.ndarray]:
    return np.tril_indices(T)


def film_to_tensors(film: Film, causal: bool | None = None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The film as checkpoint tensors (names start with "film.") and JSON-able metadata.

    Per layer `film.attention.<l>`: float32 (F, H, T·(T+1)/2), the lower triangles row by row, for a
    causal model, else (F, H, T, T). `causal`: the model's mask is causal (None: decided from the
    matrices, causal when all of them are zero above the diagonal).
    """
    if not film.frames:
        raise ValueError("a film needs at least one frame")
    n_layers = len(film.frames[0].attention)
    T = len(film.probe_ids)
    rows, cols = _tri_indices(T)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(n_layers):
        stack = np.stack([np.asarray(f.attention[layer], dtype=np.float32) for f in film.frames])  # (F, H, T, T)
        tri = (not np.triu(stack, k=1).any()) if causal is None else causal
        data = stack[..., rows, cols] if tri else stack
        tensors[f"{PREFIX}attention.{layer}"] = torch.from_numpy(np.ascontiguousarray(data))
    meta = {
        "steps": [int(f.step) for f in film.frames],
        "train_loss": [float(f.train_loss) for f in film.frames],
        "val_loss": [None if f.val_loss is None else float(f.val_loss) for f in film.frames],
        "probe_ids": [int(i) for i in film.probe_ids],
        "probe_tokens": [str(t) for t in film.probe_tokens],
        "task": film.task,
        "kept_step": None if film.kept_step is None else int(film.kept_step),
        "total_steps": int(film.total_steps),
    }
    if film.loss_source != "training":  # written only where it says something (older files lack it)
        meta["loss_source"] = film.loss_source
    return tensors, meta


def _finite_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def film_from_tensors(tensors: dict[str, torch.Tensor], meta: Any, model_cfg, vocab_size: int) -> Film:
    """Rebuild and validate a film read from a file; ValueError (starting "film: ") on any problem.

    Checks: the metadata's fields and types; 1 ≤ frames ≤ MAX_FILM_FRAMES; steps strictly increasing
    within [0, total_steps]; finite losses; probe ids in the vocabulary, 1 ≤ length ≤
    min(block_size, MAX_PROBE_TOKENS), one display piece per id; task None or one of model.heads.TASKS; kept_step
    within the steps; exactly one float32 tensor per layer of shape (F, H, T·(T+1)/2) (a causal model,
    lower triangles) or (F, H, T, T) (zero above the diagonal for a causal model); values finite in
    [0, 1]; every row sums to 1 (± 1e-3) over the keys it may see.
    """
    def bad(msg: str) -> ValueError:
        return ValueError(f"film: {msg}")

    if not isinstance(meta, dict):
        raise bad("its metadata must be a JSON object")
    need = ("steps", "train_loss", "val_loss", "probe_ids", "probe_tokens", "task", "kept_step", "total_steps")
    missing = [k for k in need if k not in meta]
    if missing:
        raise bad(f"metadata lacks {', '.join(missing)}")
    extra = sorted(set(meta) - set(need) - {"loss_source"})
    if extra:
        raise bad(f"unexpected metadata fields {extra[:5]}")
    total = meta["total_steps"]
    if not is_int(total) or total < 0:
        raise bad(f"total_steps must be a whole number >= 0, got {str(total)[:40]!r}")
    steps = meta["steps"]
    if not isinstance(steps, list) or not all(is_int(s) for s in steps):
        raise bad("steps must be a list of whole numbers")
    F = len(steps)
    if not 1 <= F <= MAX_FILM_FRAMES:
        raise bad(f"it has {F} frames; between 1 and {MAX_FILM_FRAMES} are allowed")
    if any(b <= a for a, b in zip(steps, steps[1:])):
        raise bad("frame steps must be strictly increasing")
    if steps[0] < 0 or steps[-1] > total:
        raise bad(f"frame steps must lie within 0 … {total} (the run's steps)")
    train_loss, val_loss = meta["train_loss"], meta["val_loss"]
    if not isinstance(train_loss, list) or len(train_loss) != F or not all(_finite_number(v) for v in train_loss):
        raise bad(f"train_loss must be {F} finite numbers, one per frame")
    if not isinstance(val_loss, list) or len(val_loss) != F or not all(v is None or _finite_number(v) for v in val_loss):
        raise bad(f"val_loss must be {F} finite numbers (or nulls), one per frame")
    ids, pieces = meta["probe_ids"], meta["probe_tokens"]
    if not isinstance(ids, list) or not all(is_int(i) for i in ids):
        raise bad("probe_ids must be a list of token ids")
    T = len(ids)
    limit = min(model_cfg.block_size, MAX_PROBE_TOKENS)
    if not 1 <= T <= limit:
        raise bad(f"the probe has {T} tokens; between 1 and {limit} are allowed for this model")
    if any(not 0 <= i < vocab_size for i in ids):
        raise bad(f"a probe token id is outside the vocabulary of {vocab_size}")
    if (not isinstance(pieces, list) or len(pieces) != T
            or not all(isinstance(p, str) and len(p) <= MAX_PIECE_CHARS for p in pieces)):
        raise bad(f"probe_tokens must be {T} strings (at most {MAX_PIECE_CHARS} characters), one per probe id")
    task = meta["task"]
    if task is not None and task not in TASKS:
        raise bad(f"task must be null, {' or '.join(TASKS)}, got {str(task)[:40]!r}")
    source = meta.get("loss_source", "training")
    if source not in ("training", "probe"):
        raise bad(f"loss_source must be training or probe, got {str(source)[:40]!r}")
    kept = meta["kept_step"]
    if kept is not None and not (is_int(kept) and 0 <= kept <= steps[-1]):
        raise bad(f"kept_step must be null or a step within 0 … {steps[-1]}")

    L, H = model_cfg.n_layers, model_cfg.n_heads
    causal = model_cfg.mask == "causal"
    names = {f"{PREFIX}attention.{layer}" for layer in range(L)}
    if set(tensors) != names:
        extra_t, missing_t = sorted(set(tensors) - names), sorted(names - set(tensors))
        raise bad(f"attention tensors do not match the model's {L} layers: missing {missing_t[:5]}, "
                  f"unexpected {extra_t[:5]}")
    rows, cols = _tri_indices(T)
    per_layer = []
    for layer in range(L):
        t = tensors[f"{PREFIX}attention.{layer}"]
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            raise bad(f"attention of layer {layer} must be float32")
        shape = tuple(t.shape)
        tri_shape, sq_shape = (F, H, T * (T + 1) // 2), (F, H, T, T)
        a = t.detach().cpu().numpy()
        if not np.isfinite(a).all():
            raise bad(f"attention of layer {layer} contains NaN or infinite values")
        if a.size and (a.min() < 0 or a.max() > 1 + 1e-6):
            raise bad(f"attention of layer {layer} has values outside [0, 1]")
        if causal and shape == tri_shape:
            full = np.zeros(sq_shape, dtype=np.float32)
            full[..., rows, cols] = a
        elif shape == sq_shape:
            full = np.array(a, dtype=np.float32)
            if causal and np.triu(full, k=1).any():
                raise bad(f"attention of layer {layer} looks at later tokens (non-zero above the diagonal) "
                          "in a causal model")
        else:
            want = f"{list(tri_shape)} or {list(sq_shape)}" if causal else f"{list(sq_shape)}"
            raise bad(f"attention of layer {layer} has shape {list(shape)}; this model and film need {want} "
                      f"(frames, heads, probe tokens)")
        sums = full.sum(axis=-1, dtype=np.float64)
        if np.abs(sums - 1).max() > ROW_SUM_TOL:
            raise bad(f"attention rows of layer {layer} do not sum to 1")
        per_layer.append(full)
    frames = [Frame(step=int(steps[f]), attention=[per_layer[layer][f] for layer in range(L)],
                    train_loss=float(train_loss[f]), val_loss=None if val_loss[f] is None else float(val_loss[f]))
              for f in range(F)]
    return Film(probe_ids=[int(i) for i in ids], probe_tokens=list(pieces), frames=frames, total_steps=int(total),
                task=task, kept_step=None if kept is None else int(kept), loss_source=source)


# --------------------------------------------------------------------------- the probe


def clip_probe(ids, block_size: int) -> list[int]:
    """The probe as a film records it: its last min(block_size, MAX_PROBE_TOKENS) tokens."""
    ids = [int(i) for i in ids]
    return ids[-min(block_size, MAX_PROBE_TOKENS):]


def default_probe_ids(corpus, block_size: int) -> list[int]:
    """A held-out example of the corpus, as token ids: for example corpora (sort, copy, toy) the
    first validation example (its input row: the prompt and the answer), for text the start of
    the validation text; cut to min(block_size, MAX_PROBE_TOKENS) tokens from its start."""
    n = min(block_size, MAX_PROBE_TOKENS)
    x = corpus.val.x
    row = x[0] if x.dim() == 2 else x
    return [int(i) for i in row[:n].tolist()]


def default_probe(corpus, corpus_name: str | None = None, block_size: int = MAX_PROBE_TOKENS) -> list[int]:
    """`default_probe_ids` by another name (corpus_name is not needed: the corpus knows its examples)."""
    return default_probe_ids(corpus, block_size)


if __name__ == "__main__":
    import sys

    from .film_series import main

    sys.exit(main())
