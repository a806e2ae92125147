"""Training on several processes with PyTorch's own tools: `torchrun` starts them, `torch.distributed`
connects them (gloo on CPU, nccl on CUDA) and DistributedDataParallel averages their gradients.

    torchrun --nproc_per_node 2 -m model.train --corpus sort --steps 300 --out runs/sort

Every rank draws the same global batch from the same seeded generator and takes its own equal
share of its rows; DDP's all-reduce then leaves every rank with the gradient of the mean loss over
the whole global batch, the same as one process on that batch. Only rank 0 prints and writes files.
What torchrun does not set up, or a batch that cannot be split, stops with a sentence before any
training (`DistributedError`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
DEFAULT_TIMEOUT_S = 120.0  # a rank that stops answering ends the others' waits after this long


class DistributedError(RuntimeError):
    """A distributed run that cannot start or go on, said in a sentence."""


@dataclass(frozen=True)
class Ranks:
    """Where this process stands among the run's processes."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def share(self, batch_size: int) -> slice:
        """This rank's rows of a global batch (equal shares; `check_batch` first)."""
        n = batch_size // self.world
        return slice(self.rank * n, (self.rank + 1) * n)

    def check_batch(self, batch_size: int) -> None:
        if batch_size < self.world:
            raise DistributedError(f"the global batch of {batch_size} sequences cannot be shared by {self.world} "
                                   f"processes: use --batch-size of at least {self.world}, or fewer processes")
        if batch_size % self.world:
            raise DistributedError(f"the global batch of {batch_size} sequences does not split evenly over "
                                   f"{self.world} processes: use a multiple of {self.world}")

    def largest(self, code: int) -> int:
        """The largest of a small whole number over the ranks (e.g. a reason to stop)."""
        if not self.active:
            return code
        t = torch.tensor([code], dtype=torch.int64, device=_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a scalar over the ranks (each rank's share is the same size)."""
        if not self.active:
            return value
        total = value.detach().float().clone().to(_device())
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total / self.world


def _device() -> torch.device:
    """Where a collective's tensor must live: the rank's GPU under nccl, the CPU under gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def from_env(environ=None) -> Ranks:
    """This process's place from torchrun's environment; one process when WORLD_SIZE is not set."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env:
        return Ranks()
    missing = [k for k in ENV if not env.get(k)]
    if missing:
        raise DistributedError(f"WORLD_SIZE is set but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                               "not: start distributed runs with torchrun (it sets all of them)")
    try:
        ranks = Ranks(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"]))
    except ValueError:
        raise DistributedError("RANK, WORLD_SIZE and LOCAL_RANK must be whole numbers") from None
    if ranks.world < 1 or not 0 <= ranks.rank < ranks.world:
        raise DistributedError(f"rank {ranks.rank} does not fit a world of {ranks.world} processes")
    return ranks


def start(ranks: Ranks, device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Join the run's process group (nccl on CUDA, gloo on CPU); a no-op for one process."""
    if not ranks.active or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    except Exception as exc:  # noqa: BLE001 - whatever the backend raises, the person gets one sentence
        raise DistributedError(f"could not join the other processes ({backend}): {str(exc)[:200]}") from None


def stop() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, ranks: Ranks, device: torch.device) -> torch.nn.Module:
    """The model as the training forward sees it: DDP across ranks, itself for one process."""
    if not ranks.active:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)
