"""Does holding more CUDA graphs slow the replay of one of them, outside specdec? (docs/design.md: an engine whose
captures cover more widths or batch buckets replays its hot graph 5-10% slower, ~0.4 us more between kernels, with the
same kernels; dropping the other graphs after their capture did not restore it; the mechanism was not found.)

A stand-in for a batch-1 decode step: `layers` blocks of a bf16 GEMV ([rows, 2048] x [2048, 2048], 16 weights
reused) and five small element-wise kernels, ~6 kernels a block, captured as one graph (the hot graph, rows 1) and
replayed; each variant is one process, run in alternation with the others, since a GPU's speed drifts over a
process's life (benchmarks/graph_steps.py):

    python -m benchmarks.graph_replay_probe --rounds 3            (the driver: every variant, in turn)
    python -m benchmarks.graph_replay_probe --variant others16     (one variant, one process)
    python -m benchmarks.graph_replay_probe --rounds 3 --triton --layers 340   (the norm a Triton kernel, as specdec's)

Variants: alone (the hot graph only); othersN (N more graphs of the same blocks at rows 2..N+1, captured after the
hot one in its memory pool, never replayed); others16_first (the 16 captured before the hot one); others16_pools
(each in a pool of its own); others16_dropped (captured, then deleted and the cache emptied); memory (no other graph,
as much device memory held in plain tensors as others16 reserved). Prints the hot graph's ms a replay (median of
--repeats timed runs of --replays) and per kernel, the SM clock before and after, then a table over the rounds.
On an H100 (2026-12-07, 3 rounds, benchmarks/results/profile_h100/graph_replay_probe_2026-12-07.txt) every variant
read 3.747-3.752 ms a replay against 3.742-3.754 alone: holding more graphs does not slow these. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys

import torch

WIDTH = 2048
WEIGHTS = 16  # distinct weights the blocks cycle through (128 MB in bf16, beyond the L2)
VARIANTS = ("alone", "others4", "others16", "others16_first", "others16_pools", "others16_dropped", "memory")


def block_step(x: torch.Tensor, weights: list[torch.Tensor], layers: int,
               norm_weight: torch.Tensor | None = None) -> torch.Tensor:
    """x: [rows, WIDTH] bf16 -> the same after `layers` blocks: a GEMV, then a norm and the residual add, as a
    chain of five small PyTorch kernels, or with norm_weight [WIDTH] fp32 as the engine's one Triton kernel
    (verify_kernels/glue/norm.py add_rms_norm: the new residual, and the normalised sum the next block reads)."""
    residual = x
    for layer in range(layers):
        y = x @ weights[layer % len(weights)]
        if norm_weight is None:
            scale = torch.rsqrt(y.float().pow(2).mean(-1, keepdim=True) + 1e-6)
            x = (y.float() * scale).to(x.dtype) + x
        else:
            from verify_kernels.glue.norm import add_rms_norm
            x, residual = add_rms_norm(y, residual, norm_weight, 1e-6, False)
    return x


def capture(rows: int, weights: list[torch.Tensor], layers: int, pool,
            norm_weight: torch.Tensor | None = None) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    x = torch.randn(rows, WIDTH, device="cuda", dtype=torch.bfloat16) * 0.01
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # (a warm-up off the capture, as torch.cuda.graphs.make_graphed_callables does)
        block_step(x, weights, layers, norm_weight)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        block_step(x, weights, layers, norm_weight)
    return graph, x


def sm_clock() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,temperature.gpu", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def time_replays(graph: torch.cuda.CUDAGraph, replays: int, repeats: int) -> list[float]:
    for _ in range(100):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / replays)
    return times


def run_variant(variant: str, layers: int, replays: int, repeats: int, triton: bool = False) -> dict:
    torch.manual_seed(0)
    weights = [torch.randn(WIDTH, WIDTH, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(WEIGHTS)]
    norm_weight = torch.ones(WIDTH, device="cuda") if triton else None
    others_count = int(variant[len("others"):].split("_")[0]) if variant.startswith("others") else 0
    pool = torch.cuda.graph_pool_handle()
    others = []

    def capture_others() -> None:
        for index in range(others_count):
            own = torch.cuda.graph_pool_handle() if variant.endswith("_pools") else pool
            others.append(capture(index + 2, weights, layers, own, norm_weight))

    reserved_before = torch.cuda.memory_reserved()
    if variant.endswith("_first"):
        capture_others()
    hot, _ = capture(1, weights, layers, pool, norm_weight)
    if not variant.endswith("_first"):
        capture_others()
    held = None
    if variant == "memory":  # (others16's reserve on an H100: measured by that variant, passed in by the driver)
        held = torch.empty(int(os.environ.get("PROBE_HELD_BYTES", "0")), dtype=torch.uint8, device="cuda")
    reserved = torch.cuda.memory_reserved() - reserved_before
    if variant.endswith("_dropped"):
        others.clear()
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    kernels = count_kernels(weights, layers, norm_weight)
    clock_before = sm_clock()
    times = time_replays(hot, replays, repeats)
    del held
    return {"variant": variant, "triton": triton, "ms": statistics.median(times), "ms_all": times, "kernels": kernels,
            "us_per_kernel": 1e3 * statistics.median(times) / kernels, "reserved_bytes": reserved,
            "clock_before": clock_before, "clock_after": sm_clock()}


def count_kernels(weights: list[torch.Tensor], layers: int, norm_weight: torch.Tensor | None) -> int:
    """Kernels one hot step launches, counted by the profiler on an eager run."""
    from torch.profiler import ProfilerActivity, profile
    x = torch.randn(1, WIDTH, device="cuda", dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        block_step(x, weights, layers, norm_weight)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) or 1


def drive(args: argparse.Namespace) -> None:
    results: dict[str, list[dict]] = {v: [] for v in args.variants}
    held = "0"
    for round_index in range(args.rounds):
        order = args.variants if round_index % 2 == 0 else tuple(reversed(args.variants))
        for variant in order:
            env = dict(os.environ, PROBE_HELD_BYTES=held)
            done = subprocess.run([sys.executable, "-m", "benchmarks.graph_replay_probe", "--variant", variant,
                                   "--layers", str(args.layers), "--replays", str(args.replays),
                                   "--repeats", str(args.repeats), *(["--triton"] if args.triton else [])],
                                  capture_output=True, text=True, env=env)
            if done.returncode != 0:
                print(f"[{variant}] failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            if variant == "others16":
                held = str(result["reserved_bytes"])
            results[variant].append(result)
            print(f"round {round_index} {variant:17s} {result['ms']:.4f} ms  {result['us_per_kernel']:.3f} us/kernel"
                  f"  reserved {result['reserved_bytes'] / 2**20:.0f} MiB  clock {result['clock_before']} -> "
                  f"{result['clock_after']}", flush=True)
    print("\n| variant | ms a replay (each round) | median | us a kernel | vs alone |")
    print("|---|---|---|---|---|")
    base = statistics.median(r["ms"] for r in results.get("alone", [])) if results.get("alone") else None
    for variant, runs in results.items():
        if not runs:
            continue
        median = statistics.median(r["ms"] for r in runs)
        ratio = f"{median / base:.3f}" if base else "-"
        each = ", ".join(f"{r['ms']:.4f}" for r in runs)
        print(f"| {variant} | {each} | {median:.4f} | "
              f"{1e3 * median / runs[0]['kernels']:.3f} | {ratio} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=VARIANTS, help="run this variant alone, in this process")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=VARIANTS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=170, help="blocks a step (~6 kernels each)")
    parser.add_argument("--replays", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--triton", action="store_true", help="each block's norm the engine's Triton kernel "
                        "(add_rms_norm) instead of five PyTorch kernels")
    parser.add_argument("--out", help="write every run as JSON here")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.layers, args.replays, args.repeats, args.triton)))
    else:
        drive(args)


if __name__ == "__main__":
    main()
