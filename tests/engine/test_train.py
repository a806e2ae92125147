"""Behaviour of model.train: config checks, lr schedule, the event stream, stopping, the CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from model.checkpoint import load_checkpoint
from model.config import ModelConfig
from model.corpora import build_corpus
from model.generate import Decoder, Sampling, generate
from model.presets import PRESETS
from model.cli import train_main, train_parser
from model.train import TrainConfig, evaluate, train
from model.transformer import DecoderLM

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sort_corpus():
    return build_corpus("sort")


def tiny_model(corpus, seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    return DecoderLM(ModelConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=16, n_layers=1, n_heads=2,
                                 d_model=32))


def quick(**kw) -> TrainConfig:
    base = dict(steps=20, batch_size=16, lr=3e-3, warmup=2, eval_every=0, eval_batches=2)
    return TrainConfig(**{**base, **kw})


# ------------------------------------------------------------------------------ TrainConfig


NAN, INF = float("nan"), float("inf")
# For every TrainConfig field, values it must refuse (with defaults for everything else).
INVALID = {
    "steps": [0, -5, True, 1.5],
    "batch_size": [0, False, 2.0],
    "lr": [0, -1e-3, NAN, INF, 1.5, "0.1", True],
    "min_lr": [-1e-4, NAN, 2e-3, "0"],  # 2e-3 is above the default lr
    "warmup": [-1, 2.5],
    "schedule": ["linear", None],
    "decay_frac": [0, 1.5, NAN],
    "weight_decay": [-0.1, NAN, None],
    "betas": [(0.9,), (0.9, 1.0), (-0.1, 0.95), [0.9, 0.95], "ab"],
    "grad_clip": [0, -1.0, NAN],
    "eval_every": [-1, 1.5],
    "eval_batches": [0, None],
    "seed": [1.5, True, "0"],
    "max_seconds": [0, -1, NAN],
    "bf16": ["yes", 1],
    "adamw": ["sgd"],
    "compile": ["fast"],
    "sdpa": ["cudnn"],
    "backward": ["fast", None, True],
    "probe_ids": [[1, 2], (1, -2), (1.5,)],
    "keep_best": ["yes", 1, None],
    "film_frames": [1, -1, 101, 2.5, True],
}


def test_every_train_config_field_has_refused_values():
    # a new field must come with a check (and a line above), or this fails
    assert set(INVALID) == {f.name for f in fields(TrainConfig)}


@pytest.mark.parametrize("name, value", [(n, v) for n, vs in INVALID.items() for v in vs])
def test_train_config_refuses_bad_values_naming_the_field(name, value):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        TrainConfig(**{name: value})


def test_default_schedule_is_the_documented_formula():
    cfg = TrainConfig()  # 1000 steps, lr 1e-3, 50 warm-up steps, cosine down to lr / 10
    assert (cfg.steps, cfg.lr, cfg.warmup, cfg.min_lr, cfg.schedule) == (1000, 1e-3, 50, None, "cosine")
    peak, low = 1e-3, 1e-4
    expected = {
        0: peak / 50,  # warm-up starts one step in, not at zero
        24: peak * 25 / 50,
        49: peak,  # the warm-up's last step reaches the peak
        50: peak,  # the cosine starts at the peak
        999: low,  # and ends at min_lr on the last step
        5000: low,
    }
    for step in (300, 524, 800):
        expected[step] = low + (peak - low) * (1 + math.cos(math.pi * (step - 50) / 949)) / 2
    for step, lr in expected.items():
        assert cfg.lr_at(step) == pytest.approx(lr, rel=1e-12), step


# ------------------------------------------------------------------------------ schedule


def test_warmup_is_linear():
    cfg = TrainConfig(steps=100, lr=1e-3, min_lr=1e-4, warmup=10)
    for s in range(10):
        assert cfg.lr_at(s) == pytest.approx(1e-3 * (s + 1) / 10)
    assert cfg.lr_at(9) == pytest.approx(1e-3)  # warm-up reaches the peak


def test_cosine_decays_to_min_lr_at_the_last_step():
    cfg = TrainConfig(steps=100, lr=1e-3, min_lr=1e-4, warmup=10)
    assert cfg.lr_at(10) == pytest.approx(1e-3)
    assert cfg.lr_at(99) == pytest.approx(1e-4)  # last step index
    assert cfg.lr_at(500) == pytest.approx(1e-4)  # never below min_lr
    lrs = [cfg.lr_at(s) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    # halfway through the decay, the cosine is at its midpoint
    mid = 10 + (99 - 10) / 2
    assert cfg.lr_at(int(mid)) == pytest.approx(
        1e-4 + 0.5 * (1 + math.cos(math.pi * (int(mid) - 10) / 89)) * 9e-4)
    assert 1e-4 < cfg.lr_at(int(mid)) < 1e-3


def test_default_min_lr_is_a_tenth():
    cfg = TrainConfig(steps=50, lr=2e-3, warmup=0)
    assert cfg.lr_at(0) == pytest.approx(2e-3)
    assert cfg.lr_at(49) == pytest.approx(2e-4)


def test_wsd_holds_the_peak_then_decays_linearly_to_min_lr():
    cfg = TrainConfig(steps=100, lr=1e-3, min_lr=1e-4, warmup=10, schedule="wsd", decay_frac=0.3)
    assert [cfg.lr_at(s) for s in range(10)] == pytest.approx([1e-3 * (s + 1) / 10 for s in range(10)])
    assert {cfg.lr_at(s) for s in range(9, 70)} == {1e-3}  # stable until the last 30 % of the steps
    assert cfg.lr_at(99) == pytest.approx(1e-4) and cfg.lr_at(400) == pytest.approx(1e-4)
    # linear between step 70 (peak) and step 99 (min_lr)
    for s in range(70, 100):
        assert cfg.lr_at(s) == pytest.approx(1e-3 + (s - 70) / 29 * (1e-4 - 1e-3))
    # the decay never starts inside the warm-up, even when decay_frac covers the whole run
    whole = TrainConfig(steps=100, lr=1e-3, min_lr=1e-4, warmup=10, schedule="wsd", decay_frac=1.0)
    assert whole.lr_at(9) == pytest.approx(1e-3) and whole.lr_at(99) == pytest.approx(1e-4)


def test_stream_loss_counts_every_target_once_exactly():
    from model.corpora import Split
    from model.evaluation import stream_loss

    torch.manual_seed(3)
    model = DecoderLM(ModelConfig(vocab_size=11, block_size=8, n_layers=1, n_heads=2, d_model=16))
    split = Split(torch.randint(0, 11, (8 * 5 + 4,)), None)  # 5 whole windows and 3 left-over targets
    # by hand: each window of 8 predicts the 8 tokens after its start, one window at a time
    losses = []
    for w in range(5):
        x = split.x[w * 8 : w * 8 + 8][None]
        y = split.x[w * 8 + 1 : w * 8 + 9]
        with torch.no_grad():
            losses.append(torch.nn.functional.cross_entropy(model(x).logits[0], y, reduction="none"))
    expected = torch.cat(losses).mean().item()
    for bs in (1, 2, 256):  # batching does not change the number
        assert stream_loss(model, split, batch_size=bs) == pytest.approx(expected, rel=1e-6)
    assert model.training  # the caller's mode is restored
    with pytest.raises(ValueError):
        stream_loss(model, Split(torch.arange(5) % 11, None))  # shorter than one window
    with pytest.raises(ValueError):
        stream_loss(model, Split(torch.zeros(3, 9, dtype=torch.long), torch.zeros(3, 9, dtype=torch.long)))


def test_constant_schedule():
    cfg = TrainConfig(steps=50, lr=5e-3, warmup=0, schedule="constant")
    assert {cfg.lr_at(s) for s in range(60)} == {5e-3}


# ------------------------------------------------------------------------------ train()


def test_one_event_per_step_then_done(sort_corpus):
    cfg = quick(steps=12)
    events = list(train(tiny_model(sort_corpus), sort_corpus, cfg))
    assert len(events) == 13
    assert [e.step for e in events[:-1]] == list(range(1, 13))
    assert not any(e.done for e in events[:-1])
    last = events[-1]
    assert last.done and last.stop_reason == "finished" and last.step == 12
    assert last.val_loss is not None and math.isfinite(last.val_loss)
    assert all(e.total_steps == 12 for e in events)
    for e in events[:-1]:
        assert e.lr == pytest.approx(cfg.lr_at(e.step - 1))
        assert math.isfinite(e.train_loss) and e.tokens_per_s > 0
    els = [e.elapsed for e in events]
    assert els == sorted(els)


def test_should_stop_ends_within_one_step_and_keeps_weights(sort_corpus):
    model = tiny_model(sort_corpus)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = quick(steps=10_000)
    loss0 = evaluate(model, sort_corpus.val, cfg.eval_batches, cfg.batch_size, 16, cfg.seed + 1)
    events = []
    k = 40
    for ev in train(model, sort_corpus, cfg, should_stop=lambda: len(events) >= k):
        events.append(ev)
    last = events[-1]
    assert last.done and last.stop_reason == "stopped"
    assert last.step == k and len(events) == k + 1
    assert any(not torch.equal(init[n], v) for n, v in model.state_dict().items())
    assert last.val_loss < loss0 - 0.2
    assert last.val_loss == pytest.approx(
        evaluate(model, sort_corpus.val, cfg.eval_batches, cfg.batch_size, 16, cfg.seed + 1))
    assert not model.training  # left in eval mode


def test_stopping_before_the_first_step(sort_corpus):
    model = tiny_model(sort_corpus)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    events = list(train(model, sort_corpus, quick(), should_stop=lambda: True))
    assert len(events) == 1 and events[0].done and events[0].step == 0 and events[0].stop_reason == "stopped"
    assert all(torch.equal(init[n], v) for n, v in model.state_dict().items())


def test_max_seconds_gives_time_limit(sort_corpus, monkeypatch):
    # the run's clock is the test's: it moves 0.1 s each time the loop asks whether to stop (once a step)
    import model.train as train_mod

    now = [0.0]

    def tick() -> bool:
        now[0] += 0.1
        return False

    monkeypatch.setattr(train_mod, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: now[0])}))
    events = list(train(tiny_model(sort_corpus), sort_corpus, quick(steps=1_000_000, max_seconds=0.25),
                        should_stop=tick))
    last = events[-1]
    assert last.done and last.stop_reason == "time limit"
    assert last.step == 2 and len(events) == 3  # 0.1 and 0.2 s are within the limit, 0.3 s is past it
    assert last.elapsed == pytest.approx(0.3)


def test_eval_events_carry_val_loss(sort_corpus):
    events = list(train(tiny_model(sort_corpus), sort_corpus, quick(steps=20, eval_every=5)))
    with_val = [e.step for e in events[:-1] if e.val_loss is not None]
    assert with_val == [5, 10, 15]
    assert all(math.isfinite(e.val_loss) and e.val_loss > 0 for e in events if e.val_loss is not None)
    assert events[-1].val_loss is not None


def test_the_film_records_the_attention_on_the_probe_during_training(sort_corpus):
    # the film is the one record of attention while a model trains: frames at its steps, none elsewhere
    probe = tuple(sort_corpus.tokenizer.encode("503124=0"))
    events = list(train(tiny_model(sort_corpus), sort_corpus, quick(steps=9, film_frames=4, probe_ids=probe)))
    framed = [e.frame for e in events if e.frame is not None]
    assert [f.step for f in framed] == [0, 1, 4]  # frame 0 comes with the first event; the last is in the film
    film = events[-1].film
    assert [f.step for f in film.frames] == [0, 1, 4, 9]
    for f in film.frames:
        assert len(f.attention) == 1  # one layer
        a = f.attention[0]
        assert a.shape == (2, len(probe), len(probe))
        assert abs(a.sum(-1) - 1).max() < 1e-5
        assert (a[:, 0, 1:] == 0).all()  # causal
    assert not any(hasattr(e, "probe_attention") for e in events)  # no second mechanism beside the film
    # a probe longer than the context is cropped to its last block_size tokens
    long = tuple(sort_corpus.tokenizer.encode("5031245031245031245"))
    film = list(train(tiny_model(sort_corpus), sort_corpus, quick(steps=1, film_frames=2, probe_ids=long)))[-1].film
    assert film.probe_ids == list(long[-16:])
    assert film.frames[-1].attention[0].shape == (2, 16, 16)


def test_same_seed_same_losses(sort_corpus):
    def run(seed):
        return [e.train_loss for e in train(tiny_model(sort_corpus, seed), sort_corpus, quick(steps=8, seed=seed))]

    a, b, c = run(0), run(0), run(1)
    assert a == b
    assert a != c


def _toy_answers(model, tok, prompts):
    out = []
    for p in prompts:
        dec = Decoder(model, tok.encode(p), Sampling(temperature=0), eos_id=tok.eos_id)
        steps = list(generate(dec, 6, attention="none"))
        out.append([tok.decode([s.token_id]) for s in steps])
    return out


def test_toy_preset_reproduces_article_001():
    preset = PRESETS["toy"]
    corpus = build_corpus(preset.corpus, preset.tokenizer)
    torch.manual_seed(preset.train.seed)
    model = DecoderLM(preset.model_config(corpus.tokenizer.vocab_size))
    events = list(train(model, corpus, preset.train))
    assert events[-1].stop_reason == "finished" and events[-1].step == 100
    assert len(corpus.sample_prompts) == 2
    assert _toy_answers(model, corpus.tokenizer, corpus.sample_prompts) == [["exciting", "<EOS>"]] * 2


def test_toy_preset_through_cli_in_process(tmp_path, capsys):
    assert train_main(["--preset", "toy", "--out", str(tmp_path / "toy"), "--quiet"]) == 0
    out = capsys.readouterr().out
    ckpt = load_checkpoint(tmp_path / "toy.safetensors")
    corpus = build_corpus("toy")
    assert _toy_answers(ckpt.model, ckpt.tokenizer, corpus.sample_prompts) == [["exciting", "<EOS>"]] * 2
    assert ckpt.meta["command"] == f"python -m model.train --preset toy --out {tmp_path / 'toy'} --quiet"
    assert "saved" in out


def test_cli_schedule_flags_override_a_preset(capsys):
    assert train_main(["--preset", "toy", "--steps", "10", "--schedule", "wsd", "--decay-frac", "0.5"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"step"')]
    expected = TrainConfig(**{**PRESETS["toy"].train.__dict__, "steps": 10, "schedule": "wsd", "decay_frac": 0.5})
    steps = [e for e in events if not e["done"]]
    assert [e["lr"] for e in steps] == pytest.approx([expected.lr_at(i) for i in range(10)])
    assert steps[0]["lr"] == pytest.approx(0.05) and steps[-1]["lr"] == pytest.approx(0.005)  # hold, then decay


# ------------------------------------------------------------------------------ CLI


@pytest.mark.slow
def test_cli_trains_and_saves_a_loadable_checkpoint(tmp_path, sort_corpus):
    out = tmp_path / "x"
    args = ["--corpus", "sort", "--steps", "30", "--layers", "1", "--d-model", "32", "--heads", "2",
            "--block-size", "16", "--out", str(out), "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "model.train", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert len(records) >= 2
    header, done = records[0], records[-1]
    assert header["corpus"] == "sort" and header["model"]["n_layers"] == 1 and header["model"]["d_model"] == 32
    assert done["done"] is True and done["stop_reason"] == "finished" and done["step"] == 30
    assert not any(r.get("done") is False and r.get("val_loss") is None for r in records[1:])  # --quiet
    assert lines[-1].startswith("saved")

    ckpt = load_checkpoint(out.with_suffix(".safetensors"))
    cfg = ckpt.model.cfg
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.block_size) == (1, 32, 2, 16)
    assert header["params"] == ckpt.model.n_params()
    assert ckpt.tokenizer == sort_corpus.tokenizer
    assert ckpt.meta["command"] == "python -m model.train " + " ".join(args)
    # the saved weights are the trained ones: they reproduce the reported held-out loss
    val = evaluate(ckpt.model, sort_corpus.val, 8, 12, 16, 1)
    assert val == pytest.approx(done["val_loss"], abs=1e-4)
    assert ckpt.meta["final_val_loss"] == pytest.approx(done["val_loss"], abs=1e-4)


def test_help_covers_every_flag():
    parser = train_parser()
    text = parser.format_help()
    flags = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert len(flags) >= 25
    for action in flags:
        assert action.help and action.help.strip(), f"{action.option_strings} has no help"
        assert any(opt in text for opt in action.option_strings)
    for needed in ("--corpus", "--steps", "--out", "--preset", "--layers", "--d-model", "--block-size", "--quiet"):
        assert needed in text


@pytest.mark.parametrize("args, said", [
    (["--preset", "toy", "--steps", "0"], "--steps must be a positive whole number, got 0"),
    (["--steps", "-3"], "--steps must be a positive whole number"),
    (["--preset", "toy", "--lr", "5"], "--lr must be in (0, 1], got 5.0"),
    (["--lr", "nan"], "--lr must be in (0, 1]"),
    (["--heads", "3", "--d-model", "64"], "--d-model (64) must be divisible by --heads (3); try --d-model 63"),
    (["--block-size", "0"], "--block-size must be a positive integer"),
    (["--batch-size", "0"], "--batch-size must be a positive whole number"),
    (["--dropout", "1.5"], "--dropout must be in [0, 1)"),
    (["--layers", "0"], "--layers must be a positive integer"),
    (["--warmup", "-1"], "--warmup must be a whole number >= 0"),
    (["--threads", "0"], "--threads must be a whole number >= 1"),
    (["--seed", "-1"], "--seed must be a whole number in [0, 2,147,483,647]"),
    (["--seed", "99999999999999999999"], "--seed must be a whole number"),
    (["--dist-timeout", "0"], "--dist-timeout must be a number of seconds > 0"),
    (["--text", "/no/such/file.txt"], "cannot read /no/such/file.txt: No such file or directory"),
    (["--steps", "ten"], "argument --steps: invalid int value: 'ten'"),  # argparse's own
])
def test_cli_refuses_a_bad_value_with_a_sentence(capsys, args, said):
    """A bad flag ends the run as argparse does: usage, one sentence naming the flag, exit status 2."""
    with pytest.raises(SystemExit) as info:
        train_main([*args, "--quiet"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert f"python -m model.train: error: {said}" in err.strip().splitlines()[-1], err
    assert "Traceback" not in err and "usage:" in err


def test_cli_bad_steps_exit_with_a_sentence_as_a_process():
    proc = subprocess.run([sys.executable, "-m", "model.train", "--preset", "toy", "--steps", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "python -m model.train: error: --steps must be a positive whole " \
        "number, got 0" and "Traceback" not in proc.stderr


def test_cli_rejects_unknown_preset(capsys):
    assert train_main(["--preset", "nope"]) == 2
    assert "unknown preset" in capsys.readouterr().err


def test_training_bench_runs_and_reports_the_exact_held_out_loss(tmp_path):
    """`python -m bench.train_bench` end to end, shortened: its JSON has every figure the issue asks for."""
    text = tmp_path / "t.txt"
    text.write_text(("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 400), encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "bench.train_bench", "--iters", "30", "--compile", "none",
         "--no-bf16", "--threads", "1", "--eval-batches", "2", "--text", str(text)],
        capture_output=True, text=True, timeout=300, check=True, cwd=ROOT,
    )
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["iters"] == 30 and d["schedule"] == "wsd" and d["threads"] == 1
    assert (d["bf16"], d["bf16_why"]) == (False, "--no-bf16 asked")
    for key in ("ms_per_iter_median", "tokens_per_s", "train_loss", "val_loss", "val_loss_50_batches", "peak_rss_mb"):
        assert isinstance(d[key], (int, float)) and math.isfinite(d[key]) and d[key] > 0, key
    assert d["params"] > 700_000  # the 4 x 4 x 128 model


# ------------------------------------------------------------------------------ keep best

# ~1.5 k characters: a 2-layer model memorises them within a few hundred steps, so validation rises
_SMALL_TEXT = (ROOT.parent / "shared" / "data" / "tinyshakespeare.txt")
_SMALL_TEXT = _SMALL_TEXT.read_text(encoding="utf-8")[:1500] if _SMALL_TEXT.exists() else None


def _overfit(keep_best: bool):
    if _SMALL_TEXT is None:
        pytest.skip("needs ../shared/data/tinyshakespeare.txt")
    corpus = build_corpus("text", "char", seed=0, text=_SMALL_TEXT)
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=64, n_layers=2, n_heads=4,
                                  d_model=64))
    cfg = TrainConfig(steps=300, batch_size=16, lr=3e-3, warmup=30, eval_every=30, eval_batches=4,
                      keep_best=keep_best)
    events = list(train(model, corpus, cfg))
    return model, corpus, cfg, events


@pytest.mark.slow  # 300 steps of a 2-layer model on real text
def test_keep_best_brings_back_the_weights_of_the_lowest_validation_loss():
    model, corpus, cfg, events = _overfit(keep_best=True)
    evals = [(e.val_loss, e.step) for e in events if e.val_loss is not None and not e.done]
    best_val, best_step = min(evals)
    last = events[-1]
    assert last.done and last.step == 300
    assert last.end_val_loss > best_val + 0.1  # it did overfit, so the test means something
    assert (last.kept_step, last.best_step) == (best_step, best_step) and last.best_val_loss == best_val
    # the model holds those weights: its validation loss is the best one, on the same batches
    again = evaluate(model, corpus.val, cfg.eval_batches, cfg.batch_size, 64, cfg.seed + 1)
    assert again == pytest.approx(best_val, abs=1e-5) and last.val_loss == pytest.approx(best_val, abs=1e-5)
    # every event carries the best so far
    assert all(e.best_step is None or e.best_step <= e.step for e in events)


@pytest.mark.slow  # 300 steps of a 2-layer model on real text
def test_without_keep_best_the_last_weights_stay():
    model, corpus, cfg, events = _overfit(keep_best=False)
    last = events[-1]
    assert last.kept_step == last.step == 300 and last.val_loss == last.end_val_loss
    assert last.best_val_loss < last.val_loss and last.best_step < 300


def test_keep_best_keeps_the_final_weights_when_they_are_the_best(sort_corpus):
    model = tiny_model(sort_corpus)
    last = list(train(model, sort_corpus, quick(steps=40, eval_every=10, keep_best=True)))[-1]
    assert last.kept_step == 40 and last.val_loss == last.end_val_loss == last.best_val_loss


def test_cli_keep_best_flag(tmp_path, capsys):
    assert train_parser().parse_args(["--keep-best"]).keep_best is True
    assert train_parser().parse_args([]).keep_best is False
    assert train_main(["--preset", "toy", "--steps", "10", "--keep-best", "--out", str(tmp_path / "toy"), "--quiet"]) == 0
    meta = json.loads((tmp_path / "toy.json").read_text())
    assert "--keep-best" in meta["command"] and meta["kept_step"] == 10  # the toy preset never evaluates mid-run


# ------------------------------------------------------------------------------ which backward pass


def test_the_train_tab_trains_with_the_hand_written_backward_as_the_learn_tab_and_train_say():
    from lab.recipe import train_tab_defaults, train_tab_recipe
    from model.train import uses_manual_step

    for name in ("sort", "copy", "grammar", "toy"):
        form = {k: v for k, v in train_tab_defaults(name).items() if k != "tokenizer"}
        mcfg, tcfg = train_tab_recipe(build_corpus(name), seed=0, max_seconds=None, **form)
        assert tcfg.backward == "auto"
        assert uses_manual_step(DecoderLM(mcfg), tcfg), name  # on the CPU: the hand-written step
    # with dropout the same recipe falls back to autograd, as both texts say
    mcfg, tcfg = train_tab_recipe(build_corpus("sort"), seed=0, max_seconds=None,
                                  **{**form, "dropout": 0.1})
    assert not uses_manual_step(DecoderLM(mcfg), tcfg)
    learn = (ROOT / "assets" / "learn.md").read_text(encoding="utf-8")
    assert "The Train tab computes its gradients with a hand-written backward pass" in learn
    assert "with PyTorch's autograd otherwise. The result is the same" in learn
    assert "the Train tab trains its models with the hand-written\n    backward" in train.__doc__
