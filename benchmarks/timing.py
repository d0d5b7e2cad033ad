"""Timing on the GPU as docs/design.md section 5 asks: CUDA-graph replays timed with CUDA events (medians), inputs
rotated over enough distinct buffers that the 60 MB L2 cannot hold them, and a device copy as the bandwidth
ceiling measured in the same run."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from functools import partial

import torch
import triton

ROTATION_BYTES = 2 * 2**30  # touch at least this much distinct state per timed graph
MAX_ROTATIONS = 1024


def rotations_for(bytes_per_call: int) -> int:
    """How many distinct input sets one timed graph cycles through."""
    return max(2, min(MAX_ROTATIONS, -(-ROTATION_BYTES // max(bytes_per_call, 1))))


def time_calls(calls: Sequence[Callable[[], object]], replays: int = 10, warmup: int = 3) -> float:
    """Median seconds per call: all `calls` captured back to back in one CUDA graph, the graph replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile and warm every kernel outside the capture
        for call in calls[:2]:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(warmup):
        graph.replay()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    del graph
    return statistics.median(samples) / len(calls)


def copy_bandwidth(nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written.

    Timed outside a graph: captured into a CUDA graph the copy becomes a memcpy node, which ran at 2.77 TB/s on
    the H200 against 4.27 TB/s for the same copy as a kernel, and the kernel rate is the ceiling our kernels face."""
    source = torch.randn(nbytes // 4, device="cuda")
    target = torch.empty_like(source)
    seconds = triton.testing.do_bench(partial(target.copy_, source), warmup=50, rep=300, return_mode="median") / 1e3
    return 2 * nbytes / seconds
