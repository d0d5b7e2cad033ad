"""The two collectives the sharded layers need, failing with a TensorParallelError that says what happened."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .group import TensorParallel


class TensorParallelError(RuntimeError):
    """A collective failed: another rank died or did not arrive within the group's timeout."""


def _failed(op: str, tp: TensorParallel, error: Exception) -> TensorParallelError:
    return TensorParallelError(
        f"tensor-parallel {op} failed on rank {tp.rank} of {tp.size}: another rank died or did not join within the "
        f"{tp.timeout_s:.0f} s collective timeout; look for the first rank that failed in the logs "
        f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no details'})"
    )


def all_reduce(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """The sum over ranks of x, in place; x as is for one rank."""
    if tp.size == 1:
        return x
    try:
        dist.all_reduce(x, group=tp.group)
    except (RuntimeError, dist.DistError) as error:
        raise _failed("all_reduce", tp, error) from error
    return x


def all_gather_last(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """x [..., N] per rank -> [..., size * N], rank 0's N first."""
    if tp.size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    try:
        dist.all_gather(parts, x.contiguous(), group=tp.group)
    except (RuntimeError, dist.DistError) as error:
        raise _failed("all_gather", tp, error) from error
    return torch.cat(parts, dim=-1)


def broadcast_int(value: int, tp: TensorParallel) -> int:
    """Rank 0's `value` on every rank."""
    if tp.size == 1:
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(tp.group) == "nccl" else "cpu"
    tensor = torch.tensor([value], dtype=torch.long, device=device)
    try:
        dist.broadcast(tensor, src=0, group=tp.group)
    except (RuntimeError, dist.DistError) as error:
        raise _failed("broadcast", tp, error) from error
    return int(tensor.item())
