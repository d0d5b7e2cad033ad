"""`--tp N` for the commands: run the same command as N ranks under torchrun, join their group, and let rank 0
alone speak."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import torch
import torch.distributed as dist

from .comm import broadcast_int
from .group import DEFAULT_TIMEOUT_S, SINGLE, TensorParallel, init_from_env, joined


def under_launcher() -> bool:
    """Whether this process is a rank started by torchrun (or any launcher that sets WORLD_SIZE and RANK)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def relaunch(size: int, argv: list[str]) -> int:
    """`python -m specdec ARGV` as `size` ranks on this host (torch.distributed.run, one process per GPU) -> the
    launcher's exit status."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={size}",
               "-m", "specdec", *argv]
    launcher = subprocess.Popen(command)
    try:
        return launcher.wait()
    except KeyboardInterrupt:  # Ctrl-C in a terminal reaches the launcher and the ranks too: let them stop in order
        try:
            launcher.wait(timeout=10)
        except subprocess.TimeoutExpired:  # the interrupt reached this process alone: the launcher stops the ranks
            launcher.terminate()
            launcher.wait()
        raise


def join(size: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> TensorParallel:
    """This process's rank of a group of `size` (SINGLE for 1): joins the launcher's group once (later calls, e.g. a
    benchmark loading several engines, get the same group), and seeds torch's and Python's default generators
    with one seed drawn on rank 0, so unseeded sampling draws the same numbers on every rank (SPMD: every rank
    must decide the same tokens)."""
    if size == 1:
        return SINGLE
    if not under_launcher() or int(os.environ["WORLD_SIZE"]) != size:
        raise ValueError(
            f"tensor parallelism over {size} ranks needs {size} processes: use `specdec ... --tp {size}` (it starts "
            f"them), or launch under `torchrun --nproc-per-node {size}`; this process has WORLD_SIZE="
            f"{os.environ.get('WORLD_SIZE', 'unset')}"
        )
    if dist.is_initialized():  # (joined before: by an earlier call, or by the caller, as the tests' ranks do)
        return joined(timeout_s)
    tp = init_from_env(timeout_s)
    seed = broadcast_int(random.randrange(2**62) if tp.rank == 0 else 0, tp)
    torch.manual_seed(seed)
    random.seed(seed)
    return tp


def is_primary() -> bool:
    """Rank 0, or a process outside any group: the one that prints and writes results."""
    return not dist.is_initialized() or dist.get_rank() == 0

