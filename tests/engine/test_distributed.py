"""Training on several processes (model.distributed): two CPU processes with torch.distributed (gloo)
and DDP give the loss of one process on the same global batches at every step (fp32, 1e-5); torchrun
runs the CLI with one writer; bad configurations and a process that dies end with a sentence and
leave a good checkpoint alone."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from model.config import ModelConfig
from model.corpora import build_corpus
from model.distributed import DistributedError, Ranks, from_env
from model.train import TrainConfig, train
from model.transformer import DecoderLM

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12
CFG = TrainConfig(steps=STEPS, batch_size=8, lr=3e-3, warmup=2, eval_every=5, seed=3, keep_best=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(ranks: Ranks) -> tuple[list[float], dict]:
    torch.set_num_threads(1)
    corpus = build_corpus("sort", seed=0)
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=32, n_layers=2, n_heads=2,
                                  d_model=32))  # no dropout: masks are drawn per process
    losses = [ev.train_loss for ev in train(model, corpus, CFG, ranks=ranks) if not ev.done]
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def _worker(rank: int, world: int, port: int, out) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        losses, state = run(Ranks(rank, world, rank))
        out.put((rank, losses, {k: v.numpy().copy() for k, v in state.items()}))  # no shared tensors: the child exits
    finally:
        dist.destroy_process_group()


def test_two_processes_give_the_loss_of_one_at_every_step():
    single, state = run(Ranks())
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        rank, losses, st = out.get(timeout=120)
        results[rank] = (losses, st)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(single) == STEPS
    for rank in (0, 1):
        losses, st = results[rank]
        assert losses == pytest.approx(single, abs=1e-5)  # the mean over both shares, step by step
        for k in state:
            torch.testing.assert_close(torch.from_numpy(st[k]), state[k], atol=1e-5, rtol=1e-5)  # the same weights


def test_torchrun_trains_with_one_writer(tmp_path):
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    out = tmp_path / "m"
    args = ["-m", "model.train", "--corpus", "sort", "--steps", "8", "--layers", "1", "--heads", "2", "--d-model", "32",
            "--batch-size", "8", "--film", "4", "--device", "cpu", "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = subprocess.run(["torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()), *args,
                          "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count("saved ") == 1 and two.stdout.count('"done": true') == 1  # rank 0 alone speaks
    one = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    import json

    last = [json.loads(line) for line in two.stdout.splitlines() if line.startswith('{"step"')][-1]
    ref = [json.loads(line) for line in one.stdout.splitlines() if line.startswith('{"step"')][-1]
    assert last["val_loss"] == pytest.approx(ref["val_loss"], abs=1e-5)
    assert '"processes": 2' in two.stdout and (tmp_path / "m.safetensors").exists()


@pytest.mark.parametrize("env, fragment", [
    ({"WORLD_SIZE": "2"}, "RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not"),
    ({"WORLD_SIZE": "2", "RANK": "5", "LOCAL_RANK": "0", "MASTER_ADDR": "x", "MASTER_PORT": "1"}, "does not fit"),
    ({"WORLD_SIZE": "two", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "x", "MASTER_PORT": "1"}, "whole numbers"),
])
def test_missing_or_wrong_environment_is_named(env, fragment):
    with pytest.raises(DistributedError, match=fragment):
        from_env(env)
    assert from_env({}) == Ranks()


@pytest.mark.parametrize("batch, world, fragment", [(3, 4, "at least 4"), (6, 4, "multiple of 4")])
def test_a_batch_that_does_not_split_is_refused(batch, world, fragment):
    with pytest.raises(DistributedError, match=fragment):
        Ranks(0, world, 0).check_batch(batch)


def test_the_cli_refuses_before_training(tmp_path):
    env = {**os.environ, "WORLD_SIZE": "2"}
    r = subprocess.run([sys.executable, "-m", "model.train", "--steps", "2"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 2 and "start distributed runs with torchrun" in r.stderr and "Traceback" not in r.stderr


def _dying_worker(rank: int, port: int, out_path: str) -> None:
    """Rank 1 dies after two steps; rank 0 runs the CLI, which must not replace the good checkpoint."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                      LOCAL_RANK=str(rank))
    import model.cli as cli

    if rank == 1:
        real = cli.train  # the loop the command line runs

        def dies(*a, **k):
            for i, ev in enumerate(real(*a, **k)):
                if i == 2:
                    os._exit(3)
                yield ev
        cli.train = dies
    code = cli.train_main(["--corpus", "sort", "--steps", "50", "--layers", "1", "--heads", "2", "--d-model", "32",
                          "--batch-size", "8", "--film", "0", "--device", "cpu", "--dist-timeout", "20",
                          "--out", out_path])
    sys.exit(code)


def test_a_process_that_dies_leaves_the_good_checkpoint_alone(tmp_path):
    good = tmp_path / "m.safetensors"
    good.write_bytes(b"the good checkpoint")
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_dying_worker, args=(r, port, str(tmp_path / "m"))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert procs[1].exitcode == 3
    assert procs[0].exitcode == 1  # a sentence, not a hang: the run stopped, nothing written
    assert good.read_bytes() == b"the good checkpoint"
