"""The collectives the sharded layers (and a server's rank 0) need, failing with a TensorParallelError that says
what happened."""

from __future__ import annotations

import pickle

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


def broadcast_seconds(value: float, tp: TensorParallel) -> float:
    """Rank 0's `value` (a time measured on the host) on every rank, sent host to host (tp.host_group, gloo): no
    rank's host waits for its GPU, whose queue a plain decoding step keeps a step ahead. Adaptive speculation's
    ranks measure each step apart and must still choose alike: every rank prices shapes by rank 0's times
    (specdec/engine/engine.py: Engine.plain_step, Engine.observe_pending)."""
    if tp.size == 1:
        return value
    group = tp.host_group or tp.group
    if dist.get_backend(group) != "gloo":
        raise ValueError(f"broadcast_seconds needs a gloo group to send host values; this group's backend is "
                         f"{dist.get_backend(group)}: join through init_tensor_parallel, which makes one")
    tensor = torch.tensor([value], dtype=torch.float64)
    try:
        dist.broadcast(tensor, src=0, group=group)
    except (RuntimeError, dist.DistError) as error:
        raise _failed("broadcast", tp, error) from error
    return float(tensor.item())


def broadcast_object(value, tp: TensorParallel):
    """Rank 0's `value` (any picklable object; the others pass None) on every rank: its pickled length, then its
    bytes. For inputs that arrive at rank 0 alone (a server's requests), once per engine step."""
    if tp.size == 1:
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(tp.group) == "nccl" else "cpu"
    payload = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8) if tp.rank == 0 else None
    size = torch.tensor([0 if payload is None else payload.numel()], dtype=torch.long, device=device)
    try:
        dist.broadcast(size, src=0, group=tp.group)
        data = payload.to(device) if payload is not None else torch.empty(int(size.item()), dtype=torch.uint8,
                                                                          device=device)
        dist.broadcast(data, src=0, group=tp.group)
    except (RuntimeError, dist.DistError) as error:
        raise _failed("broadcast", tp, error) from error
    return value if tp.rank == 0 else pickle.loads(data.cpu().numpy().tobytes())
