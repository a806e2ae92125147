"""The command-line programs: training (`python -m model.train`) and generation (`python -m model.generate`).

Each has a parser (every flag with its help, as nanochat's scripts) and a main that returns the exit
status; `model/train.py` and `model/generate.py` only hand their `__main__` over to these, so the
engine's modules hold no argparse. A refusal is one sentence on stderr in the words of the command
line (a config's field named by its flag) and exit status 2, argparse's own; a model file or prompt the
generator refuses is that one line alone (model.sources.refuse), without the usage.

    python -m model.train --corpus sort --steps 2000 --out assets/sort
    python -m model.train --preset shakespeare --text tinyshakespeare.txt --out assets/shakespeare
    python -m model.generate --checkpoint assets/sort.safetensors --prompt 503124= --temperature 0
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import torch

from . import distributed
from .checkpoint import save_checkpoint
from .config import ACTIVATIONS, NORMS, POS_ENCODINGS, ModelConfig
from .corpora import CORPUS_NAMES, build_corpus, read_text_file
from .distributed import DEFAULT_TIMEOUT_S
from .film import FILM_FRAMES, MAX_FILM_FRAMES, clip_probe, default_probe_ids
from .generate import SEED_RANGE, TEMPERATURE_RANGE, TOP_P_RANGE, Decoder, Sampling, generate
from .presets import PRESETS
from .sources import refuse
from .tokenizers import TOKENIZER_KINDS, Tokenizer
from .train import BACKWARDS, SCHEDULES, TrainConfig, train, uses_manual_step
from .transformer import DecoderLM


# ------------------------------------------------------------------------------ training


def train_parser() -> argparse.ArgumentParser:
    """The flags of `python -m model.train`, each with its help."""
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


def train_main(argv: list[str] | None = None) -> int:
    """`python -m model.train`: train, print one JSON line per event, save the checkpoint; the exit status
    (0 done, 2 a refused flag or setup). A distributed run that stopped ends the process with status 1."""
    parser = train_parser()
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
        return _run_training(parser, args, argv, ranks, device)
    except distributed.DistributedError as exc:
        print(f"rank {ranks.rank}: cannot train: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a collective that failed: another process died or stopped answering
        if not ranks.active:
            raise
        print(f"rank {ranks.rank}: the distributed run stopped ({str(exc).splitlines()[0][:200]}); "
              "no checkpoint was written", file=sys.stderr)
        # The process group is broken: tearing it down (or letting the interpreter end gloo's threads) can abort
        # the process with SIGABRT ("terminate called without an active exception") instead of this status, so
        # a process whose peer died ends here, its output flushed, with the status the sentence goes with.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
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


def _run_training(parser, args, argv, ranks: distributed.Ranks, device: torch.device) -> int:
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


# ---------------------------------------------------------------------------- generation


def _number_in(kind: type, bounds: tuple[float, float]) -> Callable[[str], float]:
    """argparse type: a number of `kind` within the closed interval `bounds`."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not (bounds[0] <= value <= bounds[1]):
            raise argparse.ArgumentTypeError(f"{value} is outside [{bounds[0]}, {bounds[1]}]")
        return value

    return parse


def _whole(text: str) -> int:
    """argparse type: an int >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is below 0")
    return value


def generate_parser() -> argparse.ArgumentParser:
    """The flags of `python -m model.generate`, each with its help."""
    defaults = Sampling()
    t_lo, t_hi = TEMPERATURE_RANGE
    p_lo, p_hi = TOP_P_RANGE
    p = argparse.ArgumentParser(
        prog="python -m model.generate",
        description="Continue a prompt with a saved checkpoint, one token at a time.",
    )
    p.add_argument("--checkpoint", required=True,
                   help="a .safetensors Decoder Lab checkpoint, a Hugging Face model folder, a nanoGPT ckpt.pt, "
                        "or a nanochat checkpoint folder (or its model_<step>.pt)")
    p.add_argument("--meta", help="a nanoGPT run's meta.pkl (character vocabulary); looked for beside ckpt.pt")
    p.add_argument("--tokenizer", help="GPT-2's tokenizer.json for a nanoGPT run on GPT-2's tokens "
                                       "(default: the local Hugging Face cache; nothing is downloaded)")
    p.add_argument("--prompt", required=True, help="text to continue, encoded with the checkpoint's tokenizer")
    p.add_argument("--max-new-tokens", type=_whole, default=50,
                   help="stop after this many new tokens, or at <EOS> (default %(default)s)")
    p.add_argument("--temperature", type=_number_in(float, TEMPERATURE_RANGE), default=defaults.temperature,
                   help=f"softmax temperature in [{t_lo}, {t_hi}]; 0 is greedy (default %(default)s)")
    p.add_argument("--top-k", type=_whole, default=defaults.top_k,
                   help="keep the k most likely tokens; 0 = off (default %(default)s)")
    p.add_argument("--top-p", type=_number_in(float, TOP_P_RANGE), default=defaults.top_p,
                   help=f"nucleus sampling mass in [{p_lo}, {p_hi}]; 1 = off (default %(default)s)")
    p.add_argument("--seed", type=_whole, default=defaults.seed,
                   help="seed of the sampler's own random generator (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object per generated token instead of the text")
    p.add_argument("--weights", choices=("float32", "stored"), default="float32",
                   help="a Hugging Face folder's bfloat16/float16 weights: float32 (exact; default) or kept as "
                        "stored (half the memory, computed as transformers computes in that dtype)")
    p.add_argument("--backend", choices=("own", "nnsight"), default="own",
                   help="what runs the model: own = Decoder Lab's engine (default); nnsight = transformers' own code "
                        "through nnsight (requirements-scale.txt), for a Hugging Face folder too large for the own "
                        "engine (one forward of the whole text per new token)")
    p.add_argument("--device-map", metavar="MAP",
                   help="with --backend nnsight: transformers' device_map, e.g. auto to spread the model over the "
                        "GPUs and the CPU (needs the accelerate package)")
    p.add_argument("--remote", action="store_true",
                   help="with --backend nnsight: run on NDIF; --checkpoint is a Hub repo id NDIF hosts, the key is "
                        "read from the environment variable NDIF_API_KEY (NDIF_HOST names another host)")
    return p


def open_model(source: str, meta: str | None = None, tokenizer: str | None = None,
               stored: bool = False) -> tuple[DecoderLM, Tokenizer]:
    """The model and tokenizer that --checkpoint names (ValueError says why a file cannot be opened)."""
    from .convert import open_source

    opened = open_source(source, meta, tokenizer, stored)
    return opened.model, opened.tokenizer


def prompt_ids(tok: Tokenizer, prompt: str) -> list[int]:
    """The prompt's token ids; as the app does, a prompt with characters (or words) the vocabulary
    lacks is refused with a sentence naming them, never run as <unk>."""
    enc = tok.encode_verbose(prompt)
    if enc.unknown:
        unit = "words" if tok.kind == "word" else "characters"
        shown = ", ".join(repr(u[:20]) for u in enc.unknown[:8]) + (" …" if len(enc.unknown) > 8 else "")
        raise ValueError(f"the prompt has {unit} this model's vocabulary lacks: {shown}")
    if not enc.ids:
        raise ValueError("the prompt has no tokens for this model")
    return enc.ids


def generate_main(argv: list[str] | None = None) -> int:
    """`python -m model.generate`: continue the prompt and print the text (or one JSON line per token);
    the exit status (0 done, 2 a refused flag or file)."""
    parser = generate_parser()
    args = parser.parse_args(argv)
    try:
        sampling = Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
        if args.backend == "nnsight":
            steps, tok = _nnsight_steps(args, sampling)
        else:
            if args.device_map is not None or args.remote:
                raise ValueError("--device-map and --remote choose where nnsight runs the model: add --backend nnsight")
            model, tok = open_model(args.checkpoint, args.meta, args.tokenizer, args.weights == "stored")
            decoder = Decoder(model, prompt_ids(tok, args.prompt), sampling, capture_attention=False,
                              eos_id=tok.eos_id, piece=tok.piece)
            steps = generate(decoder, args.max_new_tokens, attention="none")
    except ValueError as exc:
        refuse(parser, str(exc))  # one line, exit status 2
    new: list[int] = []
    for step in _refusing(parser, steps):
        new.append(step.token_id)
        if args.json:
            record = {
                "position": step.position,
                "token_id": step.token_id,
                "text": tok.decode([step.token_id]),
                "prob": float(step.probs[step.token_id]),
                "sampled_prob": float(step.adjusted[step.token_id]),
                "cropped": step.cropped,
                "eos": step.eos,
            }
            print(json.dumps(record, ensure_ascii=False), flush=True)
    if not args.json:
        print(tok.decode(new))
    return 0


def _nnsight_steps(args, sampling: Sampling):
    """--backend nnsight: the steps of the generation loop on model.nnsight_backend (imported only
    now: nnsight and transformers load with it), and the folder's tokenizer."""
    if args.meta or args.tokenizer:
        raise ValueError("--meta and --tokenizer are for nanoGPT checkpoints; the nnsight backend reads the "
                         "folder's tokenizer.json")
    if args.remote and args.weights == "stored":
        raise ValueError("--weights is for a model run on this machine; NDIF holds the weights as it keeps them")
    from .backend_decoder import make_decoder
    from .nnsight_backend import open_nnsight

    backend = open_nnsight(args.checkpoint, args.device_map, args.remote, args.weights)
    tok = backend.tokenizer
    ids = prompt_ids(tok, args.prompt)
    decoder = make_decoder(backend, ids, sampling, tok.eos_id, tok.piece, capture_attention=False)
    return generate(decoder, args.max_new_tokens, attention="none"), tok


def _refusing(parser: argparse.ArgumentParser, steps):
    """The steps, with a refusal met while generating (NDIF refusing a request) said in one line, exit status 2."""
    try:
        yield from steps
    except ValueError as exc:
        refuse(parser, str(exc))
