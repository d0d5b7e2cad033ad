"""The two ceilings of the roofline (specdec/eval/roofline.py), measured on the device the benchmark runs on:

- copy bandwidth: a device-to-device copy of a large tensor, counting bytes read plus bytes written (the ceiling a
  memory-bound kernel faces; 4.27 TB/s on the H200 of 2026-11-29, against 4.8 TB/s on its data sheet);
- GEMM throughput: a large square matmul in the model's dtype (bf16 on the GPU), 2 M N K FLOPs per call (about
  790 TFLOP/s on the H200, against 989 dense on the data sheet).

Both as the median of timed calls after a warm-up: CUDA events on the GPU, the wall clock on the CPU. The copy is
timed as a kernel, not inside a CUDA graph (there it becomes a memcpy node, which ran at 2.77 TB/s on the H200).
On the CPU the same two measurements run at small sizes (a 64 MiB copy, a 1024^3 matmul in the model's dtype); they
say what this machine does, shared with whatever else runs on it, so `specdec bench` also takes the peaks as
options (--peak-copy-gbs, --peak-gemm-tflops) for a roofline against another machine's figures.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Peaks:
    copy_bytes_per_second: float   # bytes read + bytes written per second by a device-to-device copy
    gemm_flops_per_second: float   # a large GEMM in the model's dtype
    source: str                    # where the figures come from: "measured on NVIDIA H200 (bfloat16)", "given"

    def __post_init__(self):
        if self.copy_bytes_per_second <= 0 or self.gemm_flops_per_second <= 0:
            raise ValueError(f"peaks must be positive, got {self.copy_bytes_per_second:g} B/s and "
                             f"{self.gemm_flops_per_second:g} FLOP/s")

    def __str__(self) -> str:
        return (f"copy {self.copy_bytes_per_second / 1e12:.2f} TB/s, GEMM {self.gemm_flops_per_second / 1e12:.0f} "
                f"TFLOP/s ({self.source})")


# (copy bytes, GEMM side) per device type: large enough to reach the ceiling, small enough to take a second
SIZES = {"cuda": (2**30, 8192), "cpu": (64 * 2**20, 1024)}


def measure_peaks(device: str | torch.device, dtype: torch.dtype) -> Peaks:
    """Copy bandwidth and GEMM FLOP/s of `device`, the GEMM in `dtype`. Frees what it allocated."""
    device = torch.device(device)
    kind = "cuda" if device.type == "cuda" else "cpu"
    copy_bytes, side = SIZES[kind]
    copy_seconds, gemm_seconds = _copy_seconds(device, copy_bytes), _gemm_seconds(device, dtype, side)
    if kind == "cuda":
        torch.cuda.empty_cache()
    name = torch.cuda.get_device_name(device) if kind == "cuda" else "the CPU"
    return Peaks(copy_bytes_per_second=2 * copy_bytes / copy_seconds,
                 gemm_flops_per_second=2 * side**3 / gemm_seconds,
                 source=f"measured on {name} ({str(dtype).removeprefix('torch.')})")


def _copy_seconds(device: torch.device, nbytes: int) -> float:
    source = torch.empty(nbytes // 4, device=device).uniform_()
    target = torch.empty_like(source)
    return _median_seconds(lambda: target.copy_(source), device)


def _gemm_seconds(device: torch.device, dtype: torch.dtype, side: int) -> float:
    a, b = (torch.randn(side, side, device=device).to(dtype) for _ in range(2))
    return _median_seconds(lambda: torch.mm(a, b), device)


def _median_seconds(call: Callable[[], object], device: torch.device, warmup: int = 3, repeats: int = 10) -> float:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            start = time.perf_counter()
            call()
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)
