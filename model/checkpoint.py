"""Checkpoints: one .safetensors file holding weights, with config and tokenizer as JSON metadata.

Loading treats every file as hostile. It checks the file size, the header length and JSON, and
the config's bounds (parameter count computed from the config alone) before building anything;
then, with a model of bounded size, the exact key set, shapes, dtypes and byte ranges of every
tensor; only then are the weights read, checked for NaN/inf and loaded with strict key matching. Nothing is ever
unpickled. Every failure is a ValueError whose message says what is wrong.

A checkpoint may carry the model's training film (model/film.py): its attention tensors under
the "film." prefix beside the weights and its metadata as JSON under "film" in the header's
metadata. A film is validated like the rest (`film_from_tensors`); a bad film refuses the whole
file. Files without a film load as before (`Checkpoint.film` is None).

Saving is atomic: the bytes go to a temp file in the target folder (named
``.decoder-lab-<random>.tmp``), which is then renamed over the target. A process killed
mid-save leaves its temp file behind; the next save into that folder removes such files
once they are stale (see :func:`sweep_stale_temp_files`).
"""

from __future__ import annotations

import io
import json
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from .config import ModelConfig
from .film import PREFIX as FILM_PREFIX
from .film import Film, film_from_tensors, film_to_tensors
from .heads import task_of
from .st_layout import check_layout, read_header as read_st_header
from .tokenizers import MAX_LOADED_VOCAB, Tokenizer, tokenizer_from_dict
from .transformer import DecoderLM

FORMAT = "decoder-lab/1"
MAX_FILE_BYTES = 20 * 1024 * 1024
MAX_CHECKPOINT_HEADER_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """Bounds a checkpoint's config must satisfy before a model is built from it."""

    max_file_bytes: int = MAX_FILE_BYTES
    max_params: int = 5_000_000
    max_layers: int = 6
    max_heads: int = 8
    max_d_model: int = 256
    max_d_ff: int = 1024
    max_block_size: int = 256
    max_vocab: int = MAX_LOADED_VOCAB  # the tokenizer loader's bound, stated once there
    # the JSON header (a converted pretrained model carries its tokenizer.json there: GPT-2's is 1.4 MB)
    max_header_bytes: int = MAX_CHECKPOINT_HEADER_BYTES

    def check(self, cfg: ModelConfig) -> None:
        bounds = {
            "n_layers": (cfg.n_layers, self.max_layers),
            "n_heads": (cfg.n_heads, self.max_heads),
            "d_model": (cfg.d_model, self.max_d_model),
            "d_ff": (cfg.ff_dim, self.max_d_ff),
            "block_size": (cfg.block_size, self.max_block_size),
            "vocab_size": (cfg.vocab_size, self.max_vocab),
        }
        for name, (value, limit) in bounds.items():
            if value > limit:
                shown = f"{value:,}" if value < 10**15 else "a number far too large"
                raise ValueError(f"{name} is {shown}, above this app's limit of {limit:,}")
        if cfg.n_params() > self.max_params:
            raise ValueError(f"the model would have {cfg.n_params():,} parameters; the limit is {self.max_params:,}")


DEFAULT_LIMITS = Limits()


@dataclass
class Checkpoint:
    model: DecoderLM
    tokenizer: Tokenizer
    meta: dict[str, Any]
    film: Film | None = None


def _state_for_saving(model: DecoderLM) -> dict[str, torch.Tensor]:
    # clone: a model in training by the hand-written step holds its weights as views of one buffer, and a
    # safetensors file wants every tensor in storage of its own
    state = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    if model.cfg.tie_weights:
        state.pop("head.weight")  # the same tensor as tok_emb.weight
    return state


def checkpoint_bytes(model: DecoderLM, tokenizer: Tokenizer, meta: dict[str, Any] | None = None,
                     film: Film | None = None) -> bytes:
    metadata = {
        "format": FORMAT,
        "config": json.dumps(model.cfg.to_dict()),
        "tokenizer": json.dumps(tokenizer.to_dict()),
        "meta": json.dumps(meta or {}),
    }
    state = _state_for_saving(model)
    if film is not None:
        tensors, film_meta = film_to_tensors(film, causal=model.cfg.mask == "causal")
        # a film that would not load back is refused now, not when the file is opened again
        film_from_tensors(tensors, film_meta, model.cfg, tokenizer.vocab_size)
        state.update(tensors)
        metadata["film"] = json.dumps(film_meta, allow_nan=False)
    return st_save(state, metadata=metadata)


# Temp files of atomic_write: a fixed prefix and suffix, so that the sweep below can tell
# them from everything else in a folder.
TEMP_PREFIX = ".decoder-lab-"
TEMP_SUFFIX = ".tmp"
# A temp file untouched this long belongs to no live save. Age, not the writer's process id:
# a pid in the name can be reused, or belong to another container sharing the folder, so
# "no such process" proves nothing; a save writes at most MAX_FILE_BYTES and finishes in
# well under a second, so ten minutes without a write means the writer is gone. Should a
# save ever stall that long, losing its temp file only makes that save fail (its rename
# finds nothing); the target file is never touched.
STALE_TEMP_SECONDS = 600


def sweep_stale_temp_files(folder: Path, max_age_s: float = STALE_TEMP_SECONDS) -> list[str]:
    """Remove the stale temp files a killed save left in ``folder``; return their names.

    Only regular files named ``TEMP_PREFIX…TEMP_SUFFIX`` whose modification time is more
    than ``max_age_s`` seconds old are removed; other files, links and folders are left
    alone. Best effort: a file that cannot be removed (already gone, no permission) is
    skipped, because cleaning up must never make a save fail.
    """
    removed: list[str] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not (name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX)):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or now - st.st_mtime <= max_age_s:
                continue
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(name)
    return removed


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory, fsync, rename, fsync the directory.

    Stale temp files of earlier, killed writes to that directory are swept first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temp_files(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_checkpoint(path: str | Path, model: DecoderLM, tokenizer: Tokenizer, meta: dict[str, Any] | None = None,
                    film: Film | None = None) -> Path:
    path = Path(path)
    if path.suffix != ".safetensors":
        path = path.with_suffix(".safetensors")
    atomic_write(path, checkpoint_bytes(model, tokenizer, meta, film))
    return path


def read_checkpoint_header(data: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[dict[str, Any], int]:
    """(header, offset of the tensors) of checkpoint bytes (model.st_layout.read_header, the one reader)."""
    if len(data) > limits.max_file_bytes:
        raise ValueError(f"file is {len(data):,} bytes; the limit is {limits.max_file_bytes:,}")
    return read_st_header(io.BytesIO(data), len(data), "the file", limits.max_header_bytes)


def parse_checkpoint(data: bytes, limits: Limits = DEFAULT_LIMITS,
                     before_build: Callable[[ModelConfig], None] | None = None) -> Checkpoint:
    """Validate and load checkpoint bytes. Raises ValueError with a clear message on any problem.

    `before_build(cfg)` is called once the config is known to be valid and before any tensor is
    allocated (a server checks its memory budget there); whatever it raises propagates.
    """
    header, body_start = read_checkpoint_header(data, limits)
    meta_raw = header.pop("__metadata__", None)
    if not isinstance(meta_raw, dict) or meta_raw.get("format") != FORMAT:
        raise ValueError(f"not a Decoder Lab checkpoint (missing '{FORMAT}' metadata)")
    try:
        cfg_dict = json.loads(meta_raw["config"])
        tok_dict = json.loads(meta_raw["tokenizer"])
        meta = json.loads(meta_raw.get("meta", "{}"))
    except (KeyError, TypeError, ValueError, RecursionError):  # ValueError: also a number of over 4,300 digits
        raise ValueError("checkpoint metadata must hold 'config' and 'tokenizer' as JSON") from None
    film_meta = None
    if "film" in meta_raw:
        try:
            film_meta = json.loads(meta_raw["film"], parse_constant=_refuse_constant)
        except (TypeError, ValueError, RecursionError):
            raise ValueError("film: its metadata is not valid JSON") from None
    cfg = ModelConfig.from_dict(cfg_dict)
    limits.check(cfg)
    tokenizer = tokenizer_from_dict(tok_dict, max_vocab=limits.max_vocab)
    used = cfg.vocab_size if cfg.vocab_used is None else cfg.vocab_used  # rows past vocab_used are padding
    if tokenizer.vocab_size != used:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens but the model expects {used}")

    if before_build is not None:
        before_build(cfg)
    # The config is within limits (at most a few MB of weights), so the model itself can give the
    # expected key set and shapes; tensor data is read only once the header matches it exactly.
    model = DecoderLM(cfg)
    expected = {k: tuple(v.shape) for k, v in _state_for_saving(model).items()}
    film_names = sorted(k for k in header if k.startswith(FILM_PREFIX))
    if film_names and film_meta is None:
        raise ValueError("film: the file holds film tensors but no film metadata")
    if film_meta is not None and not film_names:
        raise ValueError("film: the file holds film metadata but no film tensors")
    weight_names = set(header) - set(film_names)
    missing, extra = sorted(set(expected) - weight_names), sorted(weight_names - set(expected))
    if missing or extra:
        raise ValueError(f"tensor names do not match the config: missing {missing[:5]}, unexpected {extra[:5]}")
    body_len = len(data) - body_start
    for name in film_names:
        info = header[name]
        if not isinstance(info, dict) or info.get("dtype") != "F32":
            raise ValueError(f"film: tensor {name} must be float32 (F32)")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (isinstance(shape, list) and len(shape) <= 4
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise ValueError(f"film: tensor {name} has an invalid shape")
        if (
            not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= body_len
            or offsets[1] - offsets[0] != 4 * _numel(tuple(shape))
        ):
            raise ValueError(f"film: tensor {name} points outside the file or has the wrong byte length")
    for name, shape in expected.items():
        info = header[name]
        if not isinstance(info, dict) or info.get("dtype") != "F32":
            raise ValueError(f"tensor {name} must be float32 (F32)")
        if info.get("shape") != list(shape):
            raise ValueError(f"tensor {name} has shape {info.get('shape')}, expected {list(shape)}")
        offsets = info.get("data_offsets")
        if (
            not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= body_len
            or offsets[1] - offsets[0] != 4 * _numel(shape)
        ):
            raise ValueError(f"tensor {name} points outside the file or has the wrong byte length")

    # every tensor's bytes its own, and together exactly the file's: what the library would refuse in its own words
    check_layout(header, body_len, "the file")
    try:
        tensors = st_load(data)
    except Exception:  # safetensors raises its own error types; the layout was checked, so this is not reached
        raise ValueError("could not read the tensors: the file does not hold them as its header says") from None
    film_tensors = {k: tensors.pop(k) for k in film_names}
    for name, t in tensors.items():
        if not torch.isfinite(t).all():
            raise ValueError(f"tensor {name} contains NaN or infinite values")
    film = film_from_tensors(film_tensors, film_meta, cfg, tokenizer.vocab_size) if film_names else None
    if film is not None and film.task is None and isinstance(meta, dict):
        # a film recorded before its corpus's task was known (the grammar's pronoun → name) gets it from the file
        film.task = task_of(meta.get("corpus"))
    result = model.load_state_dict(tensors, strict=False)
    allowed_missing = {"head.weight"} if cfg.tie_weights else set()
    if set(result.missing_keys) != allowed_missing or result.unexpected_keys:
        raise ValueError("tensor names do not match the model")
    if cfg.tie_weights:
        model.head.weight = model.tok_emb.weight
    model.eval()
    return Checkpoint(model, tokenizer, meta if isinstance(meta, dict) else {}, film)


def load_checkpoint(path: str | Path, limits: Limits = DEFAULT_LIMITS,
                    before_build: Callable[[ModelConfig], None] | None = None) -> Checkpoint:
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError:
        raise ValueError(f"cannot read {path.name}") from None
    if size > limits.max_file_bytes:
        raise ValueError(f"file is {size:,} bytes; the limit is {limits.max_file_bytes:,}")
    return parse_checkpoint(path.read_bytes(), limits, before_build)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not allowed")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
