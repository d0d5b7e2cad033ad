"""The tensor-parallel group: which rank this process is, how many there are, and setting the group up."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .shard import Shard

# Collectives wait this long for the other ranks before failing; a dead rank thus ends the run, not hangs it.
DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in the tensor-parallel group. size 1 (SINGLE): one process, no collectives.
    group: the torch.distributed process group (None for size 1, and in tests that only build or load shards).
    host_group: a gloo group of the same ranks for values that live on the host (the adaptive policy's step times,
    comm.broadcast_seconds), which a collective on an nccl group would first copy to the GPU and read back, waiting
    for every kernel queued before it; None: `group` is gloo already and serves."""

    rank: int = 0
    size: int = 1
    group: dist.ProcessGroup | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    host_group: dist.ProcessGroup | None = None

    def __post_init__(self):
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is outside a group of {self.size}")

    def split(self, dim: int, *parts: int) -> Shard:
        """Each of `parts` (full sizes along dim) cut into `size` pieces; this rank holds piece `rank` of each."""
        return Shard(dim, parts, self.size, self.rank)

    def share(self, dim: int, *parts: int, pieces: int) -> Shard:
        """Each part cut into `pieces` <= size pieces, consecutive ranks sharing one: rank r holds piece
        r * pieces // size (the KV head that rank's query heads read, when KV heads are fewer than ranks)."""
        if self.size % pieces:
            raise ValueError(f"{pieces} pieces cannot be shared evenly by {self.size} ranks")
        return Shard(dim, parts, pieces, self.rank * pieces // self.size)

    def divide(self, count: int, what: str) -> int:
        """count / size, or an error naming `what` when the ranks cannot split it evenly."""
        if count % self.size:
            raise ValueError(f"{what} ({count}) must be a multiple of the tensor-parallel size ({self.size})")
        return count // self.size


SINGLE = TensorParallel()
_joined: TensorParallel | None = None  # the group this process joined (joined())


def init_tensor_parallel(rank: int, size: int, init_method: str = "env://", backend: str | None = None,
                         timeout_s: float = DEFAULT_TIMEOUT_S) -> TensorParallel:
    """Join the group of `size` processes as `rank`; backend defaults to nccl on CUDA (one GPU per rank, selected
    here), gloo on CPU. Every collective on the group fails after timeout_s (gloo: the collective raises; nccl: the
    watchdog aborts the communicator, TORCH_NCCL_ASYNC_ERROR_HANDLING's default), never waits for ever."""
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                            timeout=timedelta(seconds=timeout_s))
    global _joined
    _joined = None
    return joined(timeout_s)


def joined(timeout_s: float = DEFAULT_TIMEOUT_S) -> TensorParallel:
    """The group this process joined: init_tensor_parallel's, or (torch.distributed set up by the caller) the world
    group, given a gloo host group beside it where its backend is not gloo (made once: a collective of every rank)."""
    global _joined
    if _joined is None:
        timeout = timedelta(seconds=timeout_s)
        host_group = dist.new_group(backend="gloo", timeout=timeout) if dist.get_backend() != "gloo" else None
        _joined = TensorParallel(dist.get_rank(), dist.get_world_size(), dist.group.WORLD, timeout_s, host_group)
    return _joined


def init_from_env(timeout_s: float = DEFAULT_TIMEOUT_S) -> TensorParallel:
    """The group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR / MASTER_PORT); SINGLE outside torchrun."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return SINGLE
    return init_tensor_parallel(int(os.environ["RANK"]), size, timeout_s=timeout_s)


def rank_device(tp: TensorParallel) -> torch.device:
    """This rank's device: its own GPU (the one init_tensor_parallel selected) where there are GPUs, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", tp.rank % torch.cuda.device_count())


def shutdown(tp: TensorParallel) -> None:
    global _joined
    if tp.group is not None and dist.is_initialized():
        dist.destroy_process_group()
        _joined = None
