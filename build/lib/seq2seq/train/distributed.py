"""Multi-process (DDP) training with `torchrun --nproc_per_node=N -m seq2seq.cli.train ...`.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK (and MASTER_ADDR/PORT) in each process's environment;
without them training runs in a single process and every helper here is a no-op.

- Backend: NCCL when the device is CUDA (each rank on cuda:LOCAL_RANK), gloo on the CPU.
- Data: every rank computes the same epoch batches (data.token_batches is a pure function of
  seed and epoch) and takes the disjoint shard `batches[rank::world]`, after cutting the list to
  a multiple of the world size so that every rank takes the same number of steps.
- Loss: each rank divides its summed loss by (global target tokens / world), where the global
  count is all-reduced before the backward pass; DDP averages the gradients over ranks, so the
  result is (sum of all ranks' summed losses) / (global tokens): the gradient of single-process
  training on the same batches with accum_steps multiplied by the world size.
- Rank 0 alone holds the run-dir lock, checks the directory, writes checkpoints, TensorBoard,
  train_log.jsonl and the console; it validates and broadcasts the metrics and the stop reason,
  so early stopping and max_minutes are decided once for all ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job: rank, number of processes, rank on this node."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        """More than one process: collectives are needed."""
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes files and logs."""
        return self.rank == 0


def env_info() -> DistInfo:
    """The rank and world size torchrun put in the environment (single process when absent)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    return DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))


def current() -> DistInfo:
    """The job's DistInfo once init_distributed ran (or from the environment)."""
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), env_info().local_rank)
    return env_info()


def init_distributed(device: torch.device) -> tuple[DistInfo, torch.device]:
    """Join the process group (NCCL on CUDA, gloo on CPU) when run under torchrun; returns
    this process's DistInfo and its device (cuda:LOCAL_RANK on CUDA)."""
    info = env_info()
    if not info.enabled:
        return info, device
    if device.type == "cuda":
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=info.rank, world_size=info.world)
    return info, device


def shard(batches: list[T], info: DistInfo) -> list[T]:
    """This rank's disjoint share of `batches`: batches[rank::world] after dropping the tail
    that would leave ranks with unequal counts (a rank waiting on a collective alone hangs)."""
    if not info.enabled:
        return batches
    usable = len(batches) - len(batches) % info.world
    return batches[info.rank : usable : info.world]


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sum of `values` over all ranks (the values themselves when single)."""
    if not current().enabled:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)  # (len(values),)
    dist.all_reduce(tensor)
    return tensor.tolist()


def broadcast(value: Any, src: int = 0) -> Any:
    """Rank src's picklable `value`, on every rank (`value` itself when single)."""
    if not current().enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def cleanup() -> None:
    """Leave the process group, if one was joined."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class NullWriter:
    """Stands in for SummaryWriter and StepLog on ranks other than 0: every call does nothing."""

    records = 0

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None
