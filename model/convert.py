"""Every kind of model Decoder Lab opens, and writing any of them in its own format.

`open_source(src)` opens, by what `src` is:

* a `.safetensors` file: a Decoder Lab checkpoint (model/checkpoint.py), under LOCAL_LIMITS;
* a folder: a Hugging Face model folder (model/families: GPT-2, GPT-Neo, GPT-NeoX, Llama), or a nanochat
  checkpoint folder of model_<step>.pt files (model/nanochat.py: its largest step);
* a nanochat model_<step>.pt with its meta_<step>.json beside it: that step (model/nanochat.py);
* any other file: a nanoGPT `ckpt.pt` (model/nanogpt.py), with its meta.pkl or GPT-2's tokenizer.

These are files the person at the command line chose, so the app's upload limits (sized for
visitors' files) do not apply; every file is still checked as the upload checks it.

    python -m model.convert out-shakespeare-char/ckpt.pt --meta data/shakespeare_char/meta.pkl --out shakespeare.safetensors
    python -m model.convert ./pythia-70m --out pythia-70m.safetensors

The file written is what `model.checkpoint.save_checkpoint` writes; the app's upload opens it when
the model is within the upload limits (`checkpoint.DEFAULT_LIMITS`), and says so otherwise.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoint import DEFAULT_LIMITS, Limits, load_checkpoint, save_checkpoint
from .families.common import MAX_LAYERS, MAX_PARAMS, MAX_POSITIONS
from .sources import kind_of, local_path, refuse, shortened
from .tokenizers import MAX_PRETRAINED_VOCAB, STORED_TOKENIZER_KINDS, Tokenizer, tokenizer_from_dict
from .transformer import DecoderLM

# Bounds for files the person running the command chose: any model the importers read (up to
# model.families.common.MAX_PARAMS parameters) passes, and the checkpoint loader still checks it.
# The header holds the tokenizer.json of a pretrained model (safetensors itself reads at most 100 MB).
LOCAL_LIMITS = Limits(max_file_bytes=16 * 1024**3, max_params=MAX_PARAMS, max_layers=MAX_LAYERS, max_heads=256,
                      max_d_model=16_384, max_d_ff=65_536, max_block_size=MAX_POSITIONS, max_vocab=MAX_PRETRAINED_VOCAB,
                      max_header_bytes=100_000_000)


@dataclass
class OpenedSource:
    """A model ready to run, its tokenizer, and where it came from (saved as the checkpoint's meta)."""

    model: DecoderLM
    tokenizer: Tokenizer
    meta: dict[str, Any] = field(default_factory=dict)


def open_source(src: str | Path, meta: str | Path | None = None, tokenizer: str | Path | None = None,
                stored: bool = False) -> OpenedSource:
    """The model at `src` (see the module docstring). meta / tokenizer: a nanoGPT run's meta.pkl or
    GPT-2 tokenizer.json (only for a ckpt.pt). Any problem is a ValueError with one sentence."""
    path = local_path(src)  # a name no file can have is a sentence, not an OSError
    kind = kind_of(path)
    if kind is None:
        raise ValueError(f"{shortened(src)} does not exist")
    if kind == "other":
        raise ValueError(f"{shortened(src)} is neither a file nor a folder")
    from .nanochat import is_nanochat

    nanochat = is_nanochat(path)
    nanogpt = kind == "file" and path.suffix != ".safetensors" and not nanochat
    if not nanogpt and (meta is not None or tokenizer is not None):
        raise ValueError("--meta and --tokenizer apply to a nanoGPT ckpt.pt only")
    if nanochat:
        from .nanochat import load_nanochat

        run = load_nanochat(path)
        return OpenedSource(run.model, run.tokenizer, run.meta)
    if kind == "folder":
        from .families import open_folder

        model, tok = open_folder(path, stored=stored)  # stored: 16-bit weights kept as the files hold them
        return OpenedSource(model, tok, {"source": "Hugging Face folder", "name": path.resolve().name})
    if not nanogpt:
        ckpt = load_checkpoint(path, LOCAL_LIMITS)
        return OpenedSource(ckpt.model, ckpt.tokenizer, ckpt.meta)
    from .nanogpt import load_nanogpt

    run = load_nanogpt(path, meta=meta, tokenizer=tokenizer)
    return OpenedSource(run.model, run.tokenizer, run.meta)


def check_storable(opened: OpenedSource) -> None:
    """Refuse, before anything is written, a model whose file the checkpoint loader could not open
    again: its tokenizer must come back from the file's JSON, through the loader's own checks, the
    same tokenizer (a tokenizer.json with a step the checks do not allow is refused here, by name)."""
    kind = opened.tokenizer.kind
    if kind not in STORED_TOKENIZER_KINDS:
        raise ValueError(f"a Decoder Lab file cannot hold this model's {kind} tokenizer, so nothing was written")
    try:
        again = tokenizer_from_dict(opened.tokenizer.to_dict(), LOCAL_LIMITS.max_vocab)
    except ValueError as exc:
        raise ValueError(f"a Decoder Lab file cannot hold this model's tokenizer, so nothing was written: {exc}; "
                         f"python -m model.generate --checkpoint opens the source itself") from None
    if again != opened.tokenizer:
        raise ValueError("this model's tokenizer does not read back the same from a Decoder Lab file, so nothing "
                         "was written; python -m model.generate --checkpoint opens the source itself")


def predicted_upload_refusal(model: DecoderLM, path: Path) -> str | None:
    """Why the app's upload would refuse the file written at `path`, or None: past the size and
    config bounds, the upload's own loader opens it under the upload limits."""
    size = path.stat().st_size
    if size > DEFAULT_LIMITS.max_file_bytes:
        return f"the file is {size:,} bytes; the upload takes at most {DEFAULT_LIMITS.max_file_bytes:,}"
    try:
        DEFAULT_LIMITS.check(model.cfg)
        load_checkpoint(path, DEFAULT_LIMITS)
    except ValueError as exc:
        return str(exc)
    return None


def _out_path(text: str) -> Path:
    """argparse type: the file to write, ending in .safetensors."""
    path = Path(text)
    if path.suffix != ".safetensors":
        raise argparse.ArgumentTypeError(f"{text!r} must end in .safetensors")
    return path


def convert_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m model.convert",
        description="Write a model (Decoder Lab file, Hugging Face folder, nanoGPT ckpt.pt or nanochat checkpoint) "
                    "as a Decoder Lab checkpoint.",
    )
    p.add_argument("source", help="a .safetensors Decoder Lab checkpoint, a Hugging Face model folder, a nanoGPT "
                                  "ckpt.pt, or a nanochat checkpoint folder (or its model_<step>.pt)")
    p.add_argument("--out", required=True, type=_out_path, help="the .safetensors file to write")
    p.add_argument("--meta", help="a nanoGPT run's meta.pkl (character vocabulary); looked for beside ckpt.pt")
    p.add_argument("--tokenizer", help="GPT-2's tokenizer.json for a nanoGPT run on GPT-2's tokens "
                                       "(default: the local Hugging Face cache; nothing is downloaded)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = convert_parser()
    args = parser.parse_args(argv)
    try:
        opened = open_source(args.source, args.meta, args.tokenizer)
        check_storable(opened)
        path = save_checkpoint(args.out, opened.model, opened.tokenizer, opened.meta)
    except ValueError as exc:
        refuse(parser, str(exc))  # one line, exit status 2
    size = path.stat().st_size
    print(f"wrote {path} ({opened.model.n_params():,} parameters, {size:,} bytes)")
    refusal = predicted_upload_refusal(opened.model, path)
    if refusal:
        print(f"the app's upload will not take it ({refusal}); python -m model.generate --checkpoint opens it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
