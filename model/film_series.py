"""A film made from a series of checkpoints of one model, instead of recorded while training here.

Some models publish their training as a series of checkpoints (Pythia: hub revisions step0 …
step143000; OLMo 2: stage1-step1000-tokens3B …, then its mid-training's stage2-ingredient1-step1000-…).
Each checkpoint becomes one frame, computed as a training film's frame is: the
attention of every head on the probe prompt (`model.train.probe`), so the film's head scores and
phases (model/film.py) are those of a film recorded while training. A frame's first loss is that
checkpoint's mean next-token loss on the probe prompt itself, named "loss on the probe" wherever it is
shown (the film's `loss_source` is "probe"): a few dozen tokens the film also looks at, not the training
data. With `--heldout FILE` each frame also holds the checkpoint's loss on that text (its first
HELDOUT_TOKENS tokens), the "held-out loss", which the phases then quote.

    python -m model.film EleutherAI/pythia-14m --revisions step0,step1000,step143000 \\
        --probe "..." --heldout some-text.txt --out pythia-14m-film.safetensors

SRC is a folder holding one Hugging Face model folder per revision (SRC/step0, SRC/step1000, …), or a
hub repo id whose revisions are read from the local Hugging Face cache (nothing is downloaded). The
file written is a Decoder Lab checkpoint (model/checkpoint.py): the last revision's weights and
tokenizer, with the film beside them. The app opens it as it opens any model file with a film.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from .film import MAX_FILM_FRAMES, Film, Frame, clip_probe
from .sources import kind_of, local_path, refuse, shortened, shown_name

HELDOUT_TOKENS = 4096  # the held-out text's first tokens that are scored (a frame must stay cheap on a CPU)
HELDOUT_BYTES = 256 * 1024  # what is read of the held-out file: far more text than HELDOUT_TOKENS tokens
_STEP = re.compile(r"(\d+)$")
# a name that says its step between dashes (OLMo 2's stage1-step1000-tokens3B): the run it belongs to is what
# comes before "step" ("stage1-", "stage2-ingredient1-"; Pythia's step1000 has none), its stage the number
# after a leading "stage"
_NAMED_STEP = re.compile(r"(.*?)(?<![^\W_])step(\d+)(?![^\W_])")
_STAGE = re.compile(r"stage(\d+)(?![^\W_])")
_REVISION = re.compile(r"[\w.-]{1,100}")


def _step_of(revision: str) -> tuple[str, int, int] | None:
    """(run, stage, step) of a revision name, or None when it names no step: the number after "step"
    (OLMo 2's stage1-step1000-tokens3B -> 1000), else the number the name ends with (Pythia's step1000,
    checkpoint-500); the stage is 0 for a name without one."""
    named = _NAMED_STEP.match(revision)
    if named:
        run, step = named.group(1), int(named.group(2))
    else:
        found = _STEP.search(revision)
        if not found:
            return None
        run, step = "", int(found.group(1))
    stage = _STAGE.match(run)
    return run, int(stage.group(1)) if stage else 0, step


def revision_steps(revisions: list[str]) -> list[int]:
    """Each revision's step when every name has one (see _step_of); otherwise the revisions' places in the
    series (0, 1, 2, …). The revisions are given in training order: within one run the steps increase.
    OLMo 2 counts the steps of each stage from 0 again, so a series that goes on into a later stage (stage 1,
    then one of stage 2's runs) is in order when its stages increase, and its frames are numbered by place;
    two runs of one stage (stage 2's ingredients, trained side by side) are not one training and are refused."""
    found = [_step_of(r) for r in revisions]
    if any(f is None for f in found):
        return list(range(len(revisions)))
    for rev, (run0, stage0, step0), (run, stage, step) in zip(revisions[1:], found, found[1:]):
        if run == run0 and step <= step0:
            raise ValueError(f"revision {rev} is step {step}, not after step {step0}: give the revisions in "
                             "training order")
        if run != run0 and stage < stage0:
            raise ValueError(f"revision {rev} is of stage {stage}, after a revision of stage {stage0}: give the "
                             "revisions in training order")
        if run != run0 and stage == stage0:
            raise ValueError(f"revision {rev} is of another run ({run.rstrip('-_.') or 'none'}) of the same stage as "
                             f"the revision before it ({run0.rstrip('-_.') or 'none'}): a film follows one training")
    if len({run for run, _, _ in found}) > 1:
        return list(range(len(revisions)))
    return [step for _, _, step in found]


def series_folders(src: str, revisions: list[str]) -> list[Path]:
    """The model folder of each revision: SRC/<revision> for a local folder, else the hub cache's
    snapshot of SRC at that revision. A missing one is a ValueError naming it."""
    root = local_path(src)  # a name no file can have is a sentence, not an OSError
    local = kind_of(root) == "folder"
    folders = []
    for rev in revisions:
        if local:
            if not _REVISION.fullmatch(rev) or rev in (".", ".."):
                raise ValueError(f"revision {shown_name(rev)} is not a plain folder name")
            folder = root / rev
            if kind_of(folder) != "folder":
                raise ValueError(f"{root.name} has no folder {rev} (one folder per revision is expected)")
        else:
            from huggingface_hub import snapshot_download

            try:
                folder = Path(snapshot_download(src, revision=rev, local_files_only=True))
            except Exception:  # not cached, an unknown revision, an invalid id: one answer
                src_, rev_ = shortened(src), shortened(rev, 60)
                raise ValueError(f"{src_} is not a folder here, and revision {rev_} of it is not in the local "
                                 f"Hugging Face cache (fetch it once with: hf download {src_} --revision {rev_})") from None
        folders.append(folder)
    return folders


@torch.no_grad()
def probe_loss(model, ids: list[int]) -> float:
    """The model's mean next-token cross-entropy (nats) over the probe: each token after the first,
    predicted from those before it, over the vocabulary's real rows (padded rows left out)."""
    used = model.cfg.vocab_used or model.cfg.vocab_size
    logits = model(torch.tensor([ids])).logits[0, :-1, :used].double()
    return float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])))


@torch.no_grad()
def text_loss(model, ids: list[int]) -> float:
    """The model's mean next-token cross-entropy (nats) over a text longer than its context: windows of
    block_size tokens, each starting at the last token of the one before, so that every token after the
    first is predicted once (from at most block_size − 1 tokens before it); padded rows left out."""
    used = model.cfg.vocab_used or model.cfg.vocab_size
    block, total, count = model.cfg.block_size, 0.0, 0
    if block < 2 or len(ids) < 2:
        raise ValueError("a loss on a text needs a context of 2 tokens and a text of at least 2")
    for start in range(0, len(ids) - 1, block - 1):
        window = ids[start:start + block]
        logits = model(torch.tensor([window])).logits[0, :-1, :used].double()
        total += float(torch.nn.functional.cross_entropy(logits, torch.tensor(window[1:]), reduction="sum"))
        count += len(window) - 1
    return total / count


def read_heldout(path: str) -> str:
    """The held-out text of `--heldout`: UTF-8, its first HELDOUT_BYTES bytes (a character cut at that end is
    left out). A ValueError names what is wrong."""
    try:
        with open(path, "rb") as f:
            data = f.read(HELDOUT_BYTES)
    except OSError as exc:
        raise ValueError(f"cannot read the held-out text {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(data) < HELDOUT_BYTES or exc.start < len(data) - 3:
            raise ValueError(f"the held-out text {path} is not UTF-8 text (byte {exc.start})") from None
        text = data[:exc.start].decode("utf-8")
    if not text.strip():
        raise ValueError(f"the held-out text {path} is empty")
    return text


def series_film(folders: list[Path], revisions: list[str], probe_text: str, heldout_text: str | None = None):
    """(film, model, tokenizer): the film of the series (one frame per folder, in order) and the last
    revision's model and tokenizer. Every revision must be the same model: the same config and the same
    tokens for the probe (and for the held-out text, whose loss, when it is given, is each frame's
    validation loss)."""
    from .families import open_folder
    from .train import probe

    if not 1 <= len(folders) <= MAX_FILM_FRAMES:
        raise ValueError(f"a film has between 1 and {MAX_FILM_FRAMES} frames; {len(folders)} revisions were given")
    if len(set(revisions)) != len(revisions):
        raise ValueError("a revision is named twice")
    steps = revision_steps(revisions)
    frames, first = [], None
    for rev, folder, step in zip(revisions, folders, steps):
        try:
            model, tok = open_folder(folder)
        except ValueError as exc:
            raise ValueError(f"revision {rev}: {exc}") from None
        model.eval()
        ids = clip_probe(tok.encode(probe_text), model.cfg.block_size)
        held = None if heldout_text is None else tok.encode(heldout_text)[:HELDOUT_TOKENS]
        if first is None:
            if len(ids) < 2:
                raise ValueError("the probe prompt needs at least 2 tokens (a loss needs a token to predict)")
            if held is not None and len(held) < 2:
                raise ValueError("the held-out text needs at least 2 tokens (a loss needs a token to predict)")
            first = (rev, model.cfg.to_dict(), ids, tok, held)
        elif model.cfg.to_dict() != first[1]:
            raise ValueError(f"revision {rev} is not the same model as {first[0]}: its config differs")
        elif ids != first[2]:
            raise ValueError(f"revision {rev} reads the probe as other tokens than {first[0]} does")
        elif held != first[4]:
            raise ValueError(f"revision {rev} reads the held-out text as other tokens than {first[0]} does")
        frames.append(Frame(step=step, attention=probe(model, tuple(ids)), train_loss=probe_loss(model, ids),
                            val_loss=None if held is None else text_loss(model, held)))
    _, _, ids, first_tok, _ = first
    film = Film(probe_ids=ids, probe_tokens=[first_tok.piece(i) for i in ids], frames=frames,
                total_steps=steps[-1], loss_source="probe")
    return film, model, tok


def film_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m model.film",
        description="Make a film from a series of checkpoints of one model: one frame per revision, the "
                    "attention of every head on the probe prompt, with its head scores and phases.")
    p.add_argument("source", help="a folder holding one Hugging Face model folder per revision, or a hub repo "
                                  "id read from the local Hugging Face cache (nothing is downloaded)")
    p.add_argument("--revisions", required=True,
                   help="the revisions in training order, separated by commas (Pythia's step0,step1000,…; "
                        "OLMo 2's stage1-step1000-tokens3B,…)")
    p.add_argument("--probe", required=True, help="the probe prompt (its last 32 tokens are kept)")
    p.add_argument("--heldout", metavar="FILE",
                   help="a UTF-8 text the model did not train on: each frame also shows the loss on its first "
                        f"{HELDOUT_TOKENS} tokens (without it, the only loss is the one on the probe prompt)")
    p.add_argument("--out", required=True, help="the .safetensors file to write (a Decoder Lab model file)")
    return p


def main(argv: list[str] | None = None) -> int:
    from .checkpoint import save_checkpoint
    from .convert import OpenedSource, check_storable, predicted_upload_refusal

    parser = film_parser()
    args = parser.parse_args(argv)
    revisions = [r.strip() for r in args.revisions.split(",") if r.strip()]
    if not args.out.endswith(".safetensors"):
        parser.error(f"{args.out!r} must end in .safetensors")
    if not args.probe.strip():
        parser.error("the probe prompt is empty")
    try:
        heldout = None if args.heldout is None else read_heldout(args.heldout)
        folders = series_folders(args.source, revisions)
        film, model, tok = series_film(folders, revisions, args.probe, heldout)
        meta = {"source": "checkpoint series", "name": Path(args.source).name or args.source,
                "revisions": revisions, "examples": [args.probe]}
        check_storable(OpenedSource(model, tok, meta))
        path = save_checkpoint(args.out, model, tok, meta, film=film)
    except ValueError as exc:
        refuse(parser, str(exc))  # one line, exit status 2, nothing written
    print(f"wrote {path}: {len(film.frames)} frames (steps {film.frames[0].step} … {film.frames[-1].step}), "
          f"probe of {len(film.probe_ids)} tokens, the weights of revision {revisions[-1]}")
    first, last = film.frames[0], film.frames[-1]
    print(f"  loss on the probe {first.train_loss:.2f} -> {last.train_loss:.2f}"
          + (f", held-out loss {first.val_loss:.2f} -> {last.val_loss:.2f}" if last.val_loss is not None else
             " (give --heldout FILE for a loss on text the film does not look at)"))
    for phase in film.phases()[:5]:
        print(f"  {phase.sentence()}")
    refusal = predicted_upload_refusal(model, path)
    if refusal:
        print(f"the app's upload will not take it ({refusal})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
