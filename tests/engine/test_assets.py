"""The shipped checkpoints in assets/ load and meet the quality bar recorded next to them.

A missing asset fails the run, unless DECODER_LAB_ALLOW_MISSING_ASSETS is set (then it is skipped).
The Shakespeare model's held-out data is the shared Tiny Shakespeare text, which the repository
never holds: its tests read it from ../shared/data (the path its recorded command names) and are
skipped where that file is absent.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import statistics
from functools import cache
from pathlib import Path

import pytest

from lab.catalogue.models import BUILTIN_MODELS
from lab.limits import MAX_PROMPT_CHARS
from model.checkpoint import Checkpoint, Limits, load_checkpoint
from model.corpora import build_corpus, read_text_file
from model.evaluation import held_out_examples, task_accuracy
from model.generate import Decoder, Sampling, generate
from model.presets import PRESETS
from model.tokenizers import EOS
from model.cli import train_parser
from model.train import evaluate

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "assets"
NAMES = ("toy", "sort", "copy", "grammar", "shakespeare")
ALLOW_MISSING = bool(os.environ.get("DECODER_LAB_ALLOW_MISSING_ASSETS"))
ASSETS_MAX_BYTES = 12_000_000  # everything under assets/ (models, their records, screenshots, notes)
SHAKESPEARE_TEXT = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
needs_shakespeare_text = pytest.mark.skipif(not SHAKESPEARE_TEXT.exists(),
                                            reason=f"the shared Tiny Shakespeare text is not at {SHAKESPEARE_TEXT}")
# the task models' built-in entries and the answer each example prompt must get
TASKS = {
    "sort": ("sort digits (built-in)", lambda prompt: "".join(sorted(prompt[:-1]))),
    "copy": ("copy / induction (built-in)", lambda prompt: prompt[:-1]),
}
SHAKESPEARE = "shakespeare (built-in)"


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
    return train_parser().parse_args(argv[3:])


@cache
def corpus_for(name: str):
    """The corpus the recorded command trained on, built again (a text preset's text read from its --text)."""
    args = command_args(name)
    preset = PRESETS[args.preset] if args.preset else None
    text = None
    if args.text is not None:
        path = ROOT / args.text  # the CLI runs in the repository root
        if not path.exists():
            pytest.skip(f"{args.text} (the text {name} was trained on) is not here")
        text = read_text_file(path)
    corpus = build_corpus(preset.corpus if preset else args.corpus, preset.tokenizer if preset else args.tokenizer,
                          seed=args.seed, text=text)
    assert corpus.tokenizer == checkpoint(name).tokenizer  # the held-out data is encoded like the model's
    return corpus


def train_seed(name: str) -> int:
    args = command_args(name)
    return args.seed if args.seed != train_parser().get_default("seed") else PRESETS[args.preset].train.seed


@pytest.mark.parametrize("name", NAMES)
def test_asset_loads_and_matches_its_record(name):
    ck = checkpoint(name)
    rec = record(name)
    for key in ("command", "final_val_loss", "quality"):
        assert key in rec, f"assets/{name}.json lacks {key!r}"
    assert rec["quality"].strip()
    args = command_args(name)
    assert args.preset == name or args.corpus == name
    if args.preset:  # the record states the bar its preset names
        assert (rec["quality"], rec["summary"]) == (PRESETS[name].quality, PRESETS[name].summary)
    assert args.out is not None and Path(args.out) == Path("assets") / name
    assert ck.meta.get("command") == rec["command"]  # the json describes this very file
    assert ck.meta.get("final_val_loss") == pytest.approx(rec["final_val_loss"])
    assert ck.model.cfg.vocab_size == ck.tokenizer.vocab_size


def test_every_builtin_is_a_shipped_asset_within_the_upload_limits():
    """The app loads built-ins through the same checks as uploads; their example prompts are all known tokens."""
    assert SHAKESPEARE in BUILTIN_MODELS
    for display, builtin in BUILTIN_MODELS.items():
        name = Path(builtin.file).stem
        assert name in NAMES and builtin.file == f"{name}.safetensors", display
        ck = load_checkpoint(require(ASSETS / builtin.file), Limits())
        assert 1 <= len(builtin.examples) <= 8, display
        for prompt in builtin.examples:
            assert prompt.strip() and len(prompt) <= MAX_PROMPT_CHARS, (display, prompt)
            assert ck.tokenizer.encode_verbose(prompt).unknown == [], (display, prompt)
            assert len(ck.tokenizer.encode(prompt)) < ck.model.cfg.block_size, (display, prompt)


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
    assert len(examples) == 200 and all("=" in e and EOS not in e for e in examples)
    acc = task_accuracy(ck.model, ck.tokenizer, examples, "=")
    assert acc["n"] == 200
    assert acc["exact"] >= 0.99, acc
    assert acc["exact_end"] >= 0.99, acc  # and it says so: <EOS> right after the answer


def test_copy_second_half_at_least_95_percent():
    ck = checkpoint("copy")
    examples = held_out_examples(corpus_for("copy"), 200)
    assert len(examples) == 200 and all(e.split("|")[0] == e.split("|")[1] for e in examples)
    acc = task_accuracy(ck.model, ck.tokenizer, examples, "|")
    assert acc["token"] >= 0.95, acc
    assert acc["end"] >= 0.95, acc  # <EOS> right after the eighth copied letter


@pytest.mark.parametrize("name, prompt", [(name, prompt) for name, (display, _) in TASKS.items()
                                          for prompt in BUILTIN_MODELS[display].examples])
def test_task_example_prompts_answer_then_stop_at_eos(name, prompt):
    """Greedy generation from each example prompt gives the answer and then ends: "503124=" -> "012345<EOS>"."""
    display, answer_of = TASKS[name]
    assert BUILTIN_MODELS[display].file == f"{name}.safetensors"
    ck = checkpoint(name)
    tok = ck.tokenizer
    assert tok.eos_id is not None and tok.piece(tok.eos_id) == EOS
    answer = answer_of(prompt)
    decoder = Decoder(ck.model, tok.encode(prompt), Sampling(temperature=0), eos_id=tok.eos_id, piece=tok.piece)
    steps = list(generate(decoder, 3 * len(answer)))  # room to run on if it did not stop
    assert tok.decode([s.token_id for s in steps]) == answer + EOS, prompt
    assert len(steps) == len(answer) + 1 and steps[-1].eos and not any(s.eos for s in steps[:-1])
    assert len(decoder.ids) <= ck.model.cfg.block_size  # prompt, answer and <EOS> fit the context


@pytest.mark.parametrize("name", ["grammar", pytest.param("shakespeare", marks=needs_shakespeare_text)])
def test_text_model_reaches_recorded_loss(name):
    """The held-out loss in the json, recomputed on the same bounded sample of the held-out 10 %."""
    ck = checkpoint(name)
    rec = record(name)
    corpus = corpus_for(name)
    tcfg = PRESETS[name].train
    val = evaluate(ck.model, corpus.val, tcfg.eval_batches, tcfg.batch_size, ck.model.cfg.block_size,
                   train_seed(name) + 1)
    assert val <= rec["final_val_loss"] + 0.05, (val, rec["final_val_loss"])
    # and it learned something: far below a uniform guess over the vocabulary
    assert val < 0.5 * math.log(ck.tokenizer.vocab_size)


@needs_shakespeare_text
def test_shakespeare_is_a_real_character_model():
    ck = checkpoint("shakespeare")
    rec = record("shakespeare")
    args = command_args("shakespeare")
    assert args.preset == "shakespeare" and (ROOT / args.text).resolve() == SHAKESPEARE_TEXT.resolve()
    assert 1.80 <= rec["final_val_loss"] <= 1.95, rec  # the training benchmark's recipe lands at ≈ 1.85
    cfg = ck.model.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.block_size) == (4, 4, 128, 64)
    assert ck.tokenizer.kind == "char" and ck.tokenizer.eos_id is None
    assert set(ck.tokenizer.vocab) >= set("ROMEO: JULIET\nthe king,.;!?'")


@needs_shakespeare_text
@pytest.mark.parametrize("prompt", BUILTIN_MODELS[SHAKESPEARE].examples)
def test_shakespeare_is_uncertain(prompt):
    """Real text leaves real choices: the most likely next character is far from certain at most steps."""
    ck = checkpoint("shakespeare")
    tok = ck.tokenizer
    tops = {}
    for label, sampling in (("greedy", Sampling(temperature=0)), ("sampled", Sampling(temperature=1.0, seed=0))):
        decoder = Decoder(ck.model, tok.encode(prompt), sampling, eos_id=tok.eos_id)
        tops[label] = [float(s.probs.max()) for s in generate(decoder, 120, attention="none")]
    for label, top in tops.items():
        assert len(top) == 120
        assert statistics.median(top) < 0.9, (label, statistics.median(top))
        assert sum(p < 0.5 for p in top) >= 12, label  # often a real choice between characters


def test_assets_total_size_under_12_mb():
    total = sum(p.stat().st_size for p in ASSETS.rglob("*") if p.is_file())
    assert total < ASSETS_MAX_BYTES, f"assets/ holds {total:,} bytes; the bound is {ASSETS_MAX_BYTES:,}"


def test_text_preset_reads_its_text_from_the_command_line(capsys):
    """A preset of the text corpus stores no text: the CLI needs --text for it, and refuses --text for the others."""
    from model.cli import train_main

    assert PRESETS["shakespeare"].corpus == "text"
    assert train_main(["--preset", "shakespeare", "--steps", "1"]) == 2
    assert "needs --text" in capsys.readouterr().err
    assert train_main(["--preset", "sort", "--text", str(SHAKESPEARE_TEXT), "--steps", "1"]) == 2
    assert "leave out --text" in capsys.readouterr().err


@pytest.mark.parametrize("name", NAMES)
def test_remade_initial_weights_and_frame_zero_match_the_shipped_film(name):
    """What re-making a built-in reproduces on any CPU: the initial weights (drawn from the recorded seed,
    bit for bit) and so the film's frame 0 (the probe's attention under them, up to float rounding).
    Later frames and the final weights depend on the CPU's kernels and thread count, so they are not
    compared here: README says so."""
    import torch

    from model.train import probe
    from model.transformer import DecoderLM

    ck = checkpoint(name)
    if ck.film is None:
        pytest.skip(f"{name} carries no film")
    args = command_args(name)
    cfg = PRESETS[args.preset].model_config(ck.tokenizer.vocab_size)
    assert cfg == ck.model.cfg  # the preset still builds this very architecture
    made = []
    for _ in range(2):
        torch.manual_seed(train_seed(name))
        made.append(DecoderLM(cfg))
    for (key, a), b in zip(made[0].state_dict().items(), made[1].state_dict().values()):
        assert torch.equal(a, b), key
    frame0 = ck.film.frames[0]
    assert frame0.step == 0
    again = probe(made[0], tuple(ck.film.probe_ids))
    assert len(again) == len(frame0.attention)
    for layer, (shipped, now) in enumerate(zip(frame0.attention, again)):
        assert shipped.shape == now.shape, layer
        assert abs(shipped - now).max() < 1e-5, (layer, abs(shipped - now).max())
