"""The shipped checkpoints in assets/ load and meet the quality bar recorded next to them.

A missing asset fails the run, unless DECODER_LAB_ALLOW_MISSING_ASSETS is set (then it is skipped).
"""

from __future__ import annotations

import json
import math
import os
import shlex
from pathlib import Path

import pytest

from model.checkpoint import Checkpoint, load_checkpoint
from model.corpora import build_corpus
from model.evaluation import held_out_examples, task_accuracy
from model.generate import Decoder, Sampling, generate
from model.presets import PRESETS
from model.train import build_parser, evaluate

ASSETS = Path(__file__).resolve().parents[1] / "assets"
NAMES = ("toy", "sort", "copy", "grammar")
ALLOW_MISSING = bool(os.environ.get("DECODER_LAB_ALLOW_MISSING_ASSETS"))


def require(path: Path) -> Path:
    if not path.exists():
        if ALLOW_MISSING:
            pytest.skip(f"{path.name} is missing (DECODER_LAB_ALLOW_MISSING_ASSETS is set)")
        pytest.fail(f"shipped asset {path} is missing")
    return path


_cache: dict[str, Checkpoint] = {}


def checkpoint(name: str) -> Checkpoint:
    if name not in _cache:
        _cache[name] = load_checkpoint(require(ASSETS / f"{name}.safetensors"))
    return _cache[name]


def record(name: str) -> dict:
    return json.loads(require(ASSETS / f"{name}.json").read_text(encoding="utf-8"))


def command_args(name: str):
    """The recorded training command, parsed by the real CLI parser."""
    argv = shlex.split(record(name)["command"])
    assert argv[:3] == ["python", "-m", "model.train"]
    return build_parser().parse_args(argv[3:])


def corpus_for(name: str):
    args = command_args(name)
    preset = PRESETS[args.preset] if args.preset else None
    corpus = build_corpus(preset.corpus if preset else args.corpus, preset.tokenizer if preset else args.tokenizer,
                          seed=args.seed)
    assert corpus.tokenizer == checkpoint(name).tokenizer  # the held-out data is encoded like the model's
    return corpus


@pytest.mark.parametrize("name", NAMES)
def test_asset_loads_and_matches_its_record(name):
    ck = checkpoint(name)
    rec = record(name)
    for key in ("command", "final_val_loss", "quality"):
        assert key in rec, f"assets/{name}.json lacks {key!r}"
    assert rec["quality"].strip()
    args = command_args(name)
    assert args.preset == name or args.corpus == name
    assert args.out is not None and Path(args.out) == Path("assets") / name
    assert ck.meta.get("command") == rec["command"]  # the json describes this very file
    assert ck.meta.get("final_val_loss") == pytest.approx(rec["final_val_loss"])
    assert ck.model.cfg.vocab_size == ck.tokenizer.vocab_size


def test_toy_answers_exciting_eos():
    ck = checkpoint("toy")
    tok = ck.tokenizer
    prompts = build_corpus("toy").sample_prompts
    assert prompts == ["how is living in amsterdam <EOS>", "living in amsterdam is how <EOS>"]
    for prompt in prompts:
        decoder = Decoder(ck.model, tok.encode(prompt), Sampling(temperature=0), eos_id=tok.eos_id)
        steps = list(generate(decoder, 10))
        assert tok.decode([s.token_id for s in steps]) == "exciting <EOS>", prompt


def test_sort_is_at_least_99_percent_exact():
    ck = checkpoint("sort")
    examples = held_out_examples(corpus_for("sort"), 200)
    assert len(examples) == 200 and all("=" in e for e in examples)
    acc = task_accuracy(ck.model, ck.tokenizer, examples, "=")
    assert acc["n"] == 200
    assert acc["exact"] >= 0.99, acc


def test_copy_second_half_at_least_95_percent():
    ck = checkpoint("copy")
    examples = held_out_examples(corpus_for("copy"), 200)
    assert len(examples) == 200 and all(e.split("|")[0] == e.split("|")[1] for e in examples)
    acc = task_accuracy(ck.model, ck.tokenizer, examples, "|")
    assert acc["token"] >= 0.95, acc


def test_grammar_reaches_recorded_loss():
    ck = checkpoint("grammar")
    rec = record("grammar")
    corpus = corpus_for("grammar")
    tcfg = PRESETS["grammar"].train
    args = command_args("grammar")
    seed = args.seed if args.seed != build_parser().get_default("seed") else tcfg.seed
    val = evaluate(ck.model, corpus.val, tcfg.eval_batches, tcfg.batch_size, ck.model.cfg.block_size, seed + 1)
    assert val <= rec["final_val_loss"] + 0.05, (val, rec["final_val_loss"])
    # and it learned something: far below a uniform guess over the vocabulary
    assert val < 0.5 * math.log(ck.tokenizer.vocab_size)


def test_assets_total_size_under_10_mb():
    total = sum(p.stat().st_size for p in ASSETS.rglob("*") if p.is_file())
    assert total < 10 * 1024 * 1024, f"assets/ holds {total:,} bytes"
