"""model.fastpath: the hand-written training step against autograd on the same model.

The reference is the plain one: `model.train.loss_fn` (the module's own forward) and `loss.backward()`.
In float64 the loss and every gradient must agree to rounding; in fp32 whole training runs must agree step by
step; in bf16 the run must learn as well as fp32 does.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model.checkpoint import load_checkpoint, save_checkpoint
from model.config import ModelConfig
from model.corpora import build_corpus
from model.fastpath import FlatAdamW, ManualStep, unsupported
from model.train import TrainConfig, evaluate, loss_fn, manual_step_blocker, train, uses_manual_step
from model.transformer import DecoderLM

VARIANTS = [
    {},
    {"bias": False, "tie_weights": True},
    {"pos_encoding": "sinusoidal", "activation": "relu", "head_bias": True},
    {"pos_encoding": "none", "norm": "none", "attn_out_proj": False},
    {"d_ff": 0, "tie_weights": True},
    {"n_heads": 1, "d_model": 12, "bias": False},
]


def _model(dtype=torch.float64, seed=0, **kw) -> DecoderLM:
    torch.manual_seed(seed)
    base = dict(vocab_size=13, block_size=10, n_layers=2, n_heads=2, d_model=16, dropout=0.0)
    return DecoderLM(ModelConfig(**{**base, **kw})).to(dtype)


def _batch(seed=1, B=3, T=9, V=13, ignored=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (B, T), generator=g)
    y = torch.randint(0, V, (B, T), generator=g)
    if ignored:
        y[0, :4] = -100  # ignored targets, as the task corpora have for their prompts
    return x, y


@pytest.mark.parametrize("ignored", [True, False], ids=["some targets ignored", "every target counted"])
@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_loss_and_every_gradient_equal_autograd_in_float64(kw, ignored):
    model = _model(**kw)
    reference = copy.deepcopy(model)
    x, y = _batch(ignored=ignored)
    loss = loss_fn(reference, x, y)
    loss.backward()
    step = ManualStep(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))
    manual = step.forward_backward(x, y)
    assert abs(manual.item() - loss.item()) < 1e-12
    grads = dict(reference.named_parameters())
    assert set(step.grad) == set(grads)  # every parameter, tied ones once
    for name, p in grads.items():
        scale = p.grad.abs().max().item()
        assert scale > 0 or name.startswith("pos_emb"), name  # the check is not vacuous
        torch.testing.assert_close(step.grad[name], p.grad, rtol=1e-9, atol=1e-12, msg=name)


def test_shorter_batches_leave_the_unused_positions_without_gradient():
    model = _model()
    x, y = _batch(T=4)
    step = ManualStep(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))
    step.forward_backward(x, y)
    assert step.grad["pos_emb.weight"][4:].abs().max() == 0
    assert step.grad["pos_emb.weight"][:4].abs().max() > 0


def test_the_model_keeps_its_parameters_as_views_of_the_master_weights_until_released():
    model = _model(torch.float32)
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    step = ManualStep(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), bf16=True)
    assert all(a is b for a, b in zip(params, model.parameters()))  # the same Parameter objects
    for p, b in zip(params, before):
        assert torch.equal(p, b) and p.dtype == torch.float32
    step.step(*_batch(), grad_clip=1.0)
    assert all(not torch.equal(p, b) for p, b in zip(params, before))  # the step moved the module's weights
    storages = {p.untyped_storage().data_ptr() for p in params}
    assert len(storages) == 1  # one master buffer: decayed matrices, then undecayed vectors
    step.release()
    assert len({p.untyped_storage().data_ptr() for p in params}) == len(params)


def _train(corpus, model, **kw):
    base = dict(steps=40, batch_size=8, lr=3e-3, warmup=5, eval_every=10, eval_batches=2, grad_clip=0.5,
                sdpa="math")
    return list(train(model, corpus, TrainConfig(**{**base, **kw})))


@pytest.fixture(scope="module")
def grammar():
    return build_corpus("grammar")


def _grammar_model(corpus, **kw):
    torch.manual_seed(0)
    base = dict(vocab_size=corpus.tokenizer.vocab_size, block_size=32, n_layers=2, n_heads=2, d_model=32,
                dropout=0.0)
    return DecoderLM(ModelConfig(**{**base, **kw}))


@pytest.mark.parametrize("kw", [{}, {"tie_weights": True, "bias": False, "pos_encoding": "sinusoidal"}])
def test_fp32_training_equals_the_autograd_loop_at_every_step(grammar, kw):
    a, m = _grammar_model(grammar, **kw), _grammar_model(grammar, **kw)
    ev_a = _train(grammar, a, backward="autograd")
    ev_m = _train(grammar, m, backward="manual")
    assert len(ev_a) == len(ev_m) == 41
    for ea, em in zip(ev_a, ev_m):
        assert abs(ea.train_loss - em.train_loss) < 1e-5, ea.step
        if ea.val_loss is not None:
            assert abs(ea.val_loss - em.val_loss) < 1e-5
    assert ev_a[-1].train_loss < ev_a[0].train_loss - 0.5  # it learned, so the comparison means something
    for (name, pa), pm in zip(a.named_parameters(), m.parameters()):
        torch.testing.assert_close(pm, pa, rtol=1e-4, atol=2e-5, msg=name)


def test_gradient_clipping_and_weight_decay_take_effect_as_in_the_autograd_loop(grammar):
    # a clip far below the gradient norm and a large weight decay: a wrong norm or decay group would show. In
    # float64, because Adam turns fp32 rounding in a near-zero gradient into a full-size step of either sign
    results = []
    for backward in ("autograd", "manual"):
        model = _grammar_model(grammar).double()
        _train(grammar, model, backward=backward, steps=10, grad_clip=0.01, weight_decay=0.5, lr=0.05)
        results.append(model.state_dict())
    for name in results[0]:
        torch.testing.assert_close(results[1][name], results[0][name], rtol=1e-9, atol=1e-10, msg=name)
    start = _grammar_model(grammar).double().state_dict()
    assert all(not torch.equal(results[1][k], start[k]) for k in start)  # every weight moved


@pytest.mark.slow  # two 150-step runs
def test_bf16_learns_as_well_as_fp32_and_keeps_fp32_weights(grammar):
    fp32, bf16 = _grammar_model(grammar), _grammar_model(grammar)
    ev32 = _train(grammar, fp32, backward="autograd", steps=150, eval_every=50)
    ev16 = _train(grammar, bf16, backward="manual", bf16=True, steps=150, eval_every=50)
    assert all(p.dtype == torch.float32 for p in bf16.parameters())
    assert ev16[-1].val_loss < ev16[0].train_loss - 1.0
    assert abs(ev16[-1].val_loss - ev32[-1].val_loss) < 0.05


def test_a_model_trained_by_hand_saves_and_loads(grammar, tmp_path):
    model = _grammar_model(grammar)
    _train(grammar, model, backward="manual", bf16=True, steps=5)
    path = save_checkpoint(tmp_path / "m", model, grammar.tokenizer, {"corpus": "grammar"})
    loaded = load_checkpoint(path).model
    for (name, p), q in zip(model.named_parameters(), loaded.parameters()):
        assert torch.equal(p, q), name


SHAKESPEARE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "tinyshakespeare.txt"


@pytest.mark.slow  # two 300-step runs of a 2-layer model
@pytest.mark.skipif(not SHAKESPEARE.exists(), reason="needs ../shared/data/tinyshakespeare.txt")
def test_keep_best_and_the_film_work_with_the_manual_step():
    # 1.5 k characters of real text: a 2-layer model memorises them, validation is best at step 60 of 300 (2.55,
    # against 3.36 at the end), so keep_best has to bring weights back
    corpus = build_corpus("text", "char", seed=0, text=SHAKESPEARE.read_text(encoding="utf-8")[:1500])

    def model():
        torch.manual_seed(0)
        return DecoderLM(ModelConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=64, n_layers=2, n_heads=4,
                                     d_model=64, dropout=0.0))

    run = dict(backward="manual", steps=300, keep_best=True, warmup=30, eval_every=30, batch_size=16, eval_batches=4)
    kept = model()
    events = _train(corpus, kept, film_frames=4, **run)
    last = events[-1]
    assert last.film is not None and len(last.film.frames) == 4
    assert last.kept_step < last.step and last.end_val_loss > last.val_loss + 0.3
    assert last.val_loss == min(e.val_loss for e in events if e.val_loss is not None)
    assert evaluate(kept, corpus.val, 4, 16, 64, 1) == pytest.approx(last.val_loss, abs=1e-6)  # the kept weights
    # recording a film changes nothing in the training, on this path too
    plain = model()
    _train(corpus, plain, **run)
    for p, q in zip(kept.parameters(), plain.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("kw, why", [
    ({"pos_encoding": "rope"}, "rotary"),
    ({"norm": "post"}, "norm='post'"),
    ({"activation": "swiglu"}, "swiglu"),
    ({"mask": "bidirectional"}, "bidirectional"),
    ({"dropout": 0.1}, "dropout"),
])
def test_models_it_does_not_handle_are_named_and_left_to_autograd(grammar, kw, why):
    model = _grammar_model(grammar, **kw)
    assert why in unsupported(model)
    with pytest.raises(ValueError, match="does not handle"):
        ManualStep(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))
    assert not uses_manual_step(model, TrainConfig(backward="auto"))
    with pytest.raises(ValueError, match=r"^backward='manual' cannot train this run: .*" + why):
        _train(grammar, model, backward="manual", steps=2)
    events = _train(grammar, model, backward="auto", steps=2)  # auto: the autograd loop, as before
    assert events[-1].done and events[-1].step == 2


def test_compile_keeps_the_autograd_step(grammar):
    model = _grammar_model(grammar)
    cfg = TrainConfig(backward="auto", compile="default")
    assert "torch.compile" in manual_step_blocker(model, cfg)
    assert not uses_manual_step(model, cfg)
    assert uses_manual_step(model, TrainConfig(backward="auto"))
    assert not uses_manual_step(model, TrainConfig())  # the config's default is the autograd loop


def test_cli_takes_the_hand_written_step_by_default_and_refuses_it_clearly(capsys):
    from model.cli import train_main

    assert train_main(["--corpus", "sort", "--steps", "3", "--eval-every", "0", "--film", "0", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["backward"] == "manual"
    assert train_main(["--corpus", "sort", "--steps", "3", "--film", "0", "--quiet", "--backward", "autograd"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["backward"] == "autograd"
    assert train_main(["--corpus", "sort", "--steps", "3", "--film", "0", "--pos", "rope", "--backward", "manual"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("--backward: backward='manual' cannot train this run: rotary positions")
    assert "Traceback" not in err


def test_the_train_tab_takes_the_hand_written_step_and_bf16_only_where_it_pays():
    from lab.recipe import BF16_PAYS_FROM, amx_available, train_tab_recipe

    sort = build_corpus("sort")
    arch = dict(layers=2, heads=4, d_ff=256, pos_encoding="learned", norm="pre", activation="gelu", dropout=0.0,
                steps=10, lr=3e-3, seed=0, max_seconds=None)
    mcfg, tcfg = train_tab_recipe(sort, d_model=64, **arch)
    assert tcfg.backward == "auto" and uses_manual_step(DecoderLM(mcfg), tcfg)
    assert mcfg.d_model * tcfg.batch_size * mcfg.block_size < BF16_PAYS_FROM and not tcfg.bf16  # measured: fp32 wins
    big, tbig = train_tab_recipe(sort, d_model=128, **arch)
    assert big.d_model * tbig.batch_size * big.block_size >= BF16_PAYS_FROM and tbig.bf16 == amx_available()
    dropout_model, with_dropout = train_tab_recipe(sort, d_model=64, **{**arch, "dropout": 0.1})
    assert not uses_manual_step(DecoderLM(dropout_model), with_dropout)  # dropout: the autograd loop, as before


def test_one_rule_decides_bf16_for_the_train_tab_and_the_benchmark():
    """lab.recipe.bf16_choice is the rule: CUDA always; a CPU only with AMX tiles and matrices past
    BF16_PAYS_FROM (AVX-512 BF16 alone measured slower than fp32). The Train tab and `python -m bench.train_bench`
    both follow it, each saying why; a flag overrides the benchmark's default and says so."""
    from bench.train_bench import BATCH_SIZE, arguments, bench_config, precision
    from lab.recipe import BF16_PAYS_FROM, amx_available, bf16_choice, tab_bf16

    small = ModelConfig(vocab_size=20, block_size=16, n_layers=2, n_heads=4, d_model=64)  # 64 x 16 x 16 = 16 K
    bench = bench_config(65)  # 128 x 12 x 64 = 98 K
    assert small.d_model * 16 * small.block_size < BF16_PAYS_FROM <= bench.d_model * BATCH_SIZE * bench.block_size
    assert bf16_choice(bench, BATCH_SIZE, amx=True) == (True, "AMX and d_model x tokens per step = 98,304 >= 20,000")
    assert bf16_choice(bench, BATCH_SIZE, amx=False) == (False, "this CPU has no AMX tiles: bf16 matrix products do "
                                                                "not beat fp32 here")
    off, why = bf16_choice(small, 16, amx=True)
    assert not off and why.startswith("AMX, but d_model x tokens per step = 16,384 < 20,000")
    assert bf16_choice(small, 16, "cuda", amx=False)[0] and bf16_choice(bench, BATCH_SIZE, "cuda")[0]
    for mcfg, batch in ((small, 16), (bench, BATCH_SIZE)):  # on this CPU: asked of the CPU itself
        assert bf16_choice(mcfg, batch) == bf16_choice(mcfg, batch, amx=amx_available())
        assert tab_bf16(mcfg, batch) == bf16_choice(mcfg, batch)[0]
    # the benchmark's default is the rule's answer for its own model and batch, with the rule's reason
    assert arguments([]).bf16 is None and arguments(["--no-bf16"]).bf16 is False
    for device in ("cpu", "cuda"):
        on, why = bf16_choice(bench, BATCH_SIZE, device)
        assert precision(None, device) == (on, f"default, the app's rule (lab.recipe.bf16_choice): {why}")
    assert precision(True, "cpu") == (True, "--bf16 asked") and precision(False, "cuda") == (False, "--no-bf16 asked")


def _race_run(ms: float, wall: float | None, **kw) -> dict:
    """A train_bench result line, as bench.train_race reads it."""
    return {"ms_per_iter_median": ms, "target_reached_at": {"wall_s_from_process_start": wall} if wall else None,
            "val_loss": 1.8, "compile": None, "bf16": True, "backward": "manual", **kw}


def test_the_training_race_takes_its_ratios_against_the_faster_fp32_loop():
    """The race's arithmetic on fixed numbers (the race itself is `python -m bench.train_race`, a benchmark):
    per iteration and in wall clock, each against its own faster fp32 eager loop."""
    from bench.train_race import summarize

    runs = {"default": _race_run(15.0, 30.0), "fp32_eager": _race_run(30.0, 60.0, bf16=False),
            "fp32_eager_sdpa_auto": _race_run(25.0, 64.0, bf16=False), "fp32_manual": _race_run(20.0, 40.0)}
    race = summarize(runs)
    assert race["ms_per_iter"] == {"default": 15.0, "fp32_eager": 30.0, "fp32_eager_sdpa_auto": 25.0,
                                   "fp32_manual": 20.0}
    assert (race["per_iter_baseline"], race["per_iter_ratio"]) == ("fp32_eager_sdpa_auto", 0.6)
    assert (race["wall_baseline"], race["wall_ratio"]) == ("fp32_eager", 0.5)
    assert race["ratios_vs"] == {"fp32_eager": {"per_iter": 0.5, "wall": 0.5},
                                 "fp32_eager_sdpa_auto": {"per_iter": 0.6, "wall": 0.469}}
    assert race["default_bf16"] is True and race["default_backward"] == "manual" and race["default_compile"] is None

    runs["fp32_eager"] = _race_run(30.0, None)  # the faster wall-clock loop never reached the target
    race = summarize(runs)
    assert (race["wall_baseline"], race["wall_ratio"]) == ("fp32_eager_sdpa_auto", 0.469)
    assert race["ratios_vs"]["fp32_eager"] == {"per_iter": 0.5, "wall": None}
    runs["fp32_eager_sdpa_auto"] = _race_run(25.0, None)  # neither did: no wall-clock ratio at all
    assert (summarize(runs)["wall_baseline"], summarize(runs)["wall_ratio"]) == (None, None)
    runs["default"] = _race_run(15.0, None)
    assert summarize(runs)["wall_ratio"] is None and summarize(runs)["per_iter_ratio"] == 0.6


@pytest.mark.slow
def test_a_tiny_train_bench_run_gives_the_race_what_it_reads(tmp_path):
    """One train_bench process, four iterations, its defaults: its line has what the race reads, and the
    default it races is the hand-written step, uncompiled, in bf16 where the app's rule says so (and why).
    No timing is checked."""
    from bench.train_race import summarize

    text = tmp_path / "t.txt"
    text.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 300, encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "bench.train_bench", "--iters", "4", "--check-every", "2",
                          "--target", "9", "--eval-batches", "2", "--text", str(text)],
                         capture_output=True, text=True, timeout=600, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    run = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    from bench.train_bench import precision

    assert (run["backward"], run["compile"]) == ("manual", None)
    assert [run["bf16"], run["bf16_why"]] == list(precision(None, "cpu"))  # lab.recipe.bf16_choice's answer
    race = summarize({name: run for name in ("default", "fp32_eager", "fp32_eager_sdpa_auto", "fp32_manual")})
    assert race["per_iter_ratio"] == 1.0 and race["wall_ratio"] == 1.0  # one run against itself
    assert race["val_loss"]["default"] == run["val_loss"] < 9


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_flat_adamw_is_torch_fused_adamw_bit_for_bit(dtype):
    """The step's AdamW calls the fused kernel directly: every update must equal torch.optim.AdamW(fused=True)'s."""
    g = torch.Generator().manual_seed(0)
    start = torch.randn(50, generator=g, dtype=dtype)
    weights, grads = start.clone(), torch.zeros(50, dtype=dtype)
    ours = FlatAdamW([(weights[:30], grads[:30], 0.1), (weights[30:], grads[30:], 0.0)], lr=1e-2, betas=(0.9, 0.99))
    ref = [torch.nn.Parameter(start[:30].clone()), torch.nn.Parameter(start[30:].clone())]
    theirs = torch.optim.AdamW([{"params": [ref[0]], "weight_decay": 0.1}, {"params": [ref[1]], "weight_decay": 0.0}],
                               lr=1e-2, betas=(0.9, 0.99), fused=True)
    for step in range(30):
        grads.copy_(torch.randn(50, generator=g, dtype=dtype) * (10.0 ** (step % 5 - 2)))  # small and large gradients
        for group in ours.param_groups + theirs.param_groups:
            group["lr"] = 1e-2 * (1 - step / 60)
        ref[0].grad, ref[1].grad = grads[:30].clone(), grads[30:].clone()
        ours.step()
        theirs.step()
        assert torch.equal(weights[:30], ref[0].detach()) and torch.equal(weights[30:], ref[1].detach()), step
    assert not torch.equal(weights, start)


def test_a_hand_written_run_does_not_import_the_compiler_stack():
    """torch.optim's first use imports torch._dynamo (over a second on a 2-vCPU box); the hand-written step's own
    AdamW does not, so neither a benchmark run nor the app's first training pays for it."""
    code = (
        "import sys\n"
        "from model.config import ModelConfig\n"
        "from model.corpora import build_corpus\n"
        "from model.train import TrainConfig, train, uses_manual_step\n"
        "from model.transformer import DecoderLM\n"
        "corpus = build_corpus('grammar', 'word', seed=0)\n"
        "model = DecoderLM(ModelConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=16, n_layers=1, n_heads=2,"
        " d_model=16, dropout=0.0))\n"
        "cfg = TrainConfig(steps=5, batch_size=4, eval_every=0, eval_batches=2, backward='manual')\n"
        "assert uses_manual_step(model, cfg)\n"
        "events = list(train(model, corpus, cfg))\n"
        "assert events[-1].done and events[-1].step == 5\n"
        "print('dynamo' if 'torch._dynamo' in sys.modules else 'no dynamo')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip().splitlines()[-1] == "no dynamo"
