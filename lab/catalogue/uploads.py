"""Models in and out of a session as files: a checkpoint's bytes for its download, an uploaded
checkpoint loaded within the memory budget, and a refusal in a learner's words (the checks
themselves are model.checkpoint's)."""

from __future__ import annotations

from model.checkpoint import Checkpoint, checkpoint_bytes, load_checkpoint

from ..checks import UserError
from .models import ModelEntry

# the exact reason, shortened: a message stays a few lines (bench/fuzz/checks.py's MAX_MESSAGE_CHARS bounds it)
UPLOAD_DETAIL_CHARS = 160
CONVERT = "python -m model.convert FOLDER --out FILE.safetensors"  # what makes other models' files uploadable


def checkpoint_data(entry: ModelEntry) -> bytes:
    """The model as the bytes of one .safetensors file: weights, tokenizer, meta with its examples, film."""
    return checkpoint_bytes(entry.model, entry.tokenizer, {**entry.meta, "examples": list(entry.examples)},
                            film=entry.film)


def reserved_bytes(cfg) -> int:
    """Memory a checkpoint of this config takes once built: its weights and positional buffers (float32)."""
    return 4 * cfg.n_params() + 2 * 4 * cfg.block_size * cfg.d_model


def upload_refusal(reason: str) -> str:
    """A refused upload in a learner's words first; the exact reason after, for whoever needs it. A safetensors
    file without a Decoder Lab description (a Hugging Face model.safetensors, as a rule) is told the command that
    makes one."""
    advice = "Load a model saved with the Train tab's Download button."
    # model.st_layout.read_header's refusals of "the file" (and the size check's "file is …") mean no safetensors file
    if reason.startswith(("not a safetensors", "safetensors header", "file is ", "the file is not a safetensors",
                          "the file is not a sound safetensors", "the file is truncated", "the file's header")):
        what = "This file is not a Decoder Lab model (.safetensors): it is not a safetensors file at all."
    elif reason.startswith("not a Decoder Lab checkpoint"):
        what = "This file is a safetensors file, but not a Decoder Lab model: it lacks the model's description."
        advice = (f"For a Hugging Face model.safetensors, run {CONVERT} on its folder (config.json and the "
                  "tokenizer beside it) and upload the file that writes.")
    else:
        what = "This file is not a Decoder Lab model this app can load (.safetensors): part of it is damaged."
    reason = reason if len(reason) <= UPLOAD_DETAIL_CHARS else reason[: UPLOAD_DETAIL_CHARS - 1] + "…"
    return f"{what} {advice} Details: {reason}."


def load_upload(path: str, reserve, give_back) -> Checkpoint:
    """The checkpoint at `path`, checked; `reserve(cfg)` asks the memory budget before a tensor is
    allocated. A refusal calls `give_back()` (the budget's reservation goes) and says why in a
    sentence: the budget was full, or the file is not a model this app loads."""
    try:  # the file stays where gradio put it (its cache sweeps it): a path may name someone else's file
        return load_checkpoint(path, before_build=reserve)
    except UserError as exc:  # the memory budget's refusal in `reserve`: the file itself was read fine
        give_back()
        raise UserError(f"This model was refused because the server's memory budget is full (the file is "
                        f"not damaged): {str(exc).rstrip('.')}.") from None
    except ValueError as exc:
        give_back()  # a reservation for a file that failed later is given back
        raise UserError(upload_refusal(str(exc))) from None
