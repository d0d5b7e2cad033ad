"""The largest batch an engine fits in GPU memory, estimated from one measured batch instead of tried batch by batch
(each try builds the model, its pools and its CUDA graphs again: minutes at full layers, and an out-of-memory error
can leave the process unusable).

    largest batch = (device memory - memory not ours - fixed) / (pools per request + activations per request)

- fixed: what the engine holds whatever its batch: the weights (target and drafter), measured as the memory
  allocated once the engine is built less its pools;
- pools per request: the engine's cache (linear states, buffers or node states, conv windows, attention KV) divided
  by its request slots: exactly what the allocator was asked for (tests/test_bench.py checks the per-request state
  figure against the allocated tensors);
- activations per request: the peak memory the timed batch reserved (warm-up, CUDA graphs and decoding) above what
  the built engine held, divided by the batch: taken as linear in the batch, which the step's tensors are (logits
  [B T, vocab], hidden [B T, D], the mixers' fp32 inputs); fixed workspaces then count per request too, which keeps
  the estimate on the safe side;
- memory not ours: the CUDA context and any other process, as the driver reports it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EngineMemory:
    """Bytes, measured once the engine is built (before any batch runs)."""

    device_total: int
    not_ours: int              # the CUDA context and other processes
    fixed: int                 # weights: allocated once built, less the pools
    pools_per_request: float   # the engine's cache over its request slots
    built: int                 # allocated once built (fixed + pools)


def engine_memory(llm) -> EngineMemory | None:
    """The memory of a just-built LLM on a CUDA device; None elsewhere (no allocator figures on the CPU)."""
    device = llm.model.device
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    cache = llm.engine.runner.cache
    built = torch.cuda.memory_allocated(device)
    return EngineMemory(device_total=total, not_ours=total - free - torch.cuda.memory_reserved(device),
                        fixed=built - cache.nbytes(), pools_per_request=cache.nbytes() / cache.config.max_requests,
                        built=built)


def start_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_reserved(device: torch.device) -> int:
    return torch.cuda.max_memory_reserved(device) if device.type == "cuda" else 0


def largest_batch(memory: EngineMemory, peak: int, batch: int) -> int:
    """The batch whose pools and activations fill the device, from a batch of `batch` that peaked at `peak`."""
    activations_per_request = max(peak - memory.built, 0) / batch
    room = memory.device_total - memory.not_ours - memory.fixed
    return int(room // (memory.pools_per_request + activations_per_request))


def phase_line(device: torch.device) -> str | None:
    """The device's memory now, for a log line between a batch's phases (what the allocator holds and has held
    since the batch began, what the driver has free); None off CUDA. Where a run of the study goes out of memory,
    these lines say in which phase and how close the phases before came (the H200 study of 2026-12-05 lost its
    batch-512 rows with no figure of where)."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    peak, gib = torch.cuda.max_memory_reserved(device), 2**30
    return (f"allocated {allocated / gib:.1f} GiB, reserved {reserved / gib:.1f}, peak reserved {peak / gib:.1f}, "
            f"free {free / gib:.1f} of {total / gib:.1f}")

