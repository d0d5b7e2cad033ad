"""A MoE layer's routed experts on the GPU: the fused kernels (verify_kernels/moe/experts.py, the models' path)
against the unfused path they replace (two grouped_linear launches around a gathered [N k, D] copy, the activation,
the weighting and an index_add_ as torch ops) and against the bound, in about two minutes on the H200:

    python -m benchmarks.moe --out benchmarks/results/moe_h200.json

Nemotron-3-Nano (128 experts, 6 active, hidden 2688, expert intermediate 1856, relu2) and Qwen3.5-35B-A3B (256
experts, 8 active, hidden 2048, intermediate 512, gated SiLU), bf16, 1 to 2048 tokens, each token routed to k
distinct experts drawn uniformly. bytes_moved = the distinct experts the routing touches x an expert's weight bytes
+ x read + out written; bound = max(bytes_moved / copy bandwidth, FLOPs / GEMM peak), FLOPs = 2 N k (F D + D I),
both peaks measured in the same run (specdec/eval/peaks.py). Timed as docs/design.md section 5 asks: CUDA-graph
replays, CUDA events, medians; each graph cycles through 4 weight sets (one per layer, so the L2 never holds the
previous call's experts) and at least 4 routings and inputs. Before timing, each row's fused output is checked
against moe_experts_ref at its own size. The kernel columns split the fused path's GPU time (torch.profiler over
eager calls): layout (routing.py's one or two launches), up, down, sum.
"""

from __future__ import annotations

import argparse
import datetime
import json
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import NamedTuple

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.timing import rotations_for, time_calls
from specdec.eval.peaks import measure_peaks
from verify_kernels.moe import ACTIVATIONS, expert_blocks, grouped_linear, moe_experts, moe_experts_ref

# experts E, active k, hidden D, expert intermediate I, gated, activation, routing weights' dtype (the router's)
MODELS = {
    "nemotron-3-nano": (128, 6, 2688, 1856, False, "relu2", torch.float32),
    "qwen3.5-35b-a3b": (256, 8, 2048, 512, True, "silu", torch.bfloat16),
}
TOKENS = (1, 16, 64, 256, 512, 1280, 2048)
QUICK_TOKENS = (1, 256, 1280)
DTYPE = torch.bfloat16
WEIGHT_SETS = 4
MAX_CALLS = 64
LAYOUT_KERNELS = ("expert_counts_kernel", "expert_slots_kernel")
STAGES = {"layout": LAYOUT_KERNELS, "up": ("expert_up_kernel",), "down": ("expert_down_kernel",),
          "sum": ("expert_sum_kernel",)}


def unfused_experts(x, first, second, top_index, top_weight, activation, gated):
    """The path the fused kernels replace (specdec/models/moe.py before them), same contract as moe_experts."""
    num_tokens, k = top_index.shape
    expert = top_index.flatten()
    token = torch.arange(num_tokens * k, device=x.device) // k
    blocks = expert_blocks(expert, first.shape[0])
    h = grouped_linear(x[token], first, expert, blocks)  # [N k, F]
    act = ACTIVATIONS[activation]
    if gated:
        gate, up = h.chunk(2, dim=-1)
        h = act(gate) * up
    else:
        h = act(h)
    y = grouped_linear(h, second, expert, blocks)  # [N k, D]
    weighted = (y * top_weight.flatten()[:, None]).to(top_weight.dtype)
    out = torch.zeros(num_tokens, x.shape[1], dtype=top_weight.dtype, device=x.device)
    return out.index_add_(0, token, weighted)


def model_weights(model: str, gen: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    experts, _, dim, inner, gated, _, _ = MODELS[model]
    fan_out = 2 * inner if gated else inner
    sets = []
    for _ in range(WEIGHT_SETS):
        first = torch.randn(experts, fan_out, dim, device="cuda", dtype=DTYPE, generator=gen) / dim**0.5
        second = torch.randn(experts, dim, inner, device="cuda", dtype=DTYPE, generator=gen) / inner**0.5
        sets.append((first, second))
    return sets


def routings(model: str, tokens: int, calls: int, gen: torch.Generator):
    """x [calls, N, D], top_index [calls, N, k] (k distinct uniform experts a token), top_weight [calls, N, k]."""
    experts, k, dim, _, _, _, weight_dtype = MODELS[model]
    x = torch.randn(calls, tokens, dim, device="cuda", dtype=DTYPE, generator=gen)
    top_index = torch.rand(calls, tokens, experts, device="cuda", generator=gen).topk(k, dim=-1).indices
    top_weight = torch.rand(calls, tokens, k, device="cuda", generator=gen).softmax(-1).to(weight_dtype)
    return x, top_index, top_weight


def stage_us(calls) -> dict[str, float]:
    """GPU microseconds per call of each stage of the fused path, from torch.profiler over eager calls."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for call in calls:
            call()
        torch.cuda.synchronize()
    by_name: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_name[event.name] += event.device_time
    return {stage: sum(by_name[name] for name in names) / len(calls) for stage, names in STAGES.items()}


class Case(NamedTuple):
    """One benchmark row's timed calls: args of moe_experts per call, and what a call moves and computes."""

    args: list[tuple]
    touched: float      # distinct experts per call, mean over the calls
    bytes_moved: float
    flops: int


def case_for(model: str, tokens: int, weights, gen: torch.Generator) -> Case:
    experts, k, dim, inner, gated, activation, weight_dtype = MODELS[model]
    fan_out = 2 * inner if gated else inner
    expert_bytes = (fan_out * dim + dim * inner) * DTYPE.itemsize
    io_bytes = tokens * dim * (DTYPE.itemsize + weight_dtype.itemsize)
    calls = max(WEIGHT_SETS, min(MAX_CALLS, rotations_for(min(experts, tokens * k) * expert_bytes + io_bytes)))
    calls = -(-calls // WEIGHT_SETS) * WEIGHT_SETS
    x, top_index, top_weight = routings(model, tokens, calls, gen)
    touched = sum(top_index[i].unique().numel() for i in range(calls)) / calls
    args = [(x[i], *weights[i % WEIGHT_SETS], top_index[i], top_weight[i], activation, gated) for i in range(calls)]
    return Case(args, touched, touched * expert_bytes + io_bytes, 2 * tokens * k * (fan_out * dim + dim * inner))


def bound_us(case: Case, peaks) -> float:
    return max(case.bytes_moved / peaks.copy_bytes_per_second, case.flops / peaks.gemm_flops_per_second) * 1e6


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def row_for(model: str, tokens: int, weights, peaks, gen: torch.Generator) -> dict:
    case = case_for(model, tokens, weights, gen)
    fused = [partial(moe_experts, *a) for a in case.args]
    unfused = [partial(unfused_experts, *a) for a in case.args]
    memory_us = case.bytes_moved / peaks.copy_bytes_per_second * 1e6
    row = {"model": model, "tokens": tokens, "assignments": tokens * MODELS[model][1], "touched": case.touched,
           "calls": len(case.args), "bytes_moved": case.bytes_moved, "flops": case.flops,
           "bound_us": bound_us(case, peaks), "bound_by": "memory" if memory_us >= bound_us(case, peaks) else "flops",
           "check": relative_error(fused[0](), moe_experts_ref(*case.args[0]))}
    row["fused_us"] = time_calls(fused) * 1e6
    row["unfused_us"] = time_calls(unfused) * 1e6
    row["fused_x_bound"] = row["fused_us"] / row["bound_us"]
    row["unfused_x_bound"] = row["unfused_us"] / row["bound_us"]
    row["speedup"] = row["unfused_us"] / row["fused_us"]
    row["fused_tbps"] = case.bytes_moved / row["fused_us"] / 1e6
    row |= {f"{stage}_us": us for stage, us in stage_us(fused).items()}
    return row


HEADER = (f"{'model':16} {'N':>5} {'touched':>7} {'MB moved':>9} {'GFLOP':>6} {'bound us':>8} {'fused us':>8} "
          f"{'x bound':>7} {'TB/s':>5} {'unfused us':>10} {'x bound':>7} {'speedup':>7} | {'layout':>6} {'up':>6} "
          f"{'down':>6} {'sum':>6} | {'check':>7}")


def line(row: dict) -> str:
    return (f"{row['model']:16} {row['tokens']:>5} {row['touched']:>7.1f} {row['bytes_moved'] / 1e6:>9.1f} "
            f"{row['flops'] / 1e9:>6.1f} {row['bound_us']:>8.1f} {row['fused_us']:>8.1f} "
            f"{row['fused_x_bound']:>7.2f} {row['fused_tbps']:>5.2f} {row['unfused_us']:>10.1f} "
            f"{row['unfused_x_bound']:>7.2f} {row['speedup']:>7.2f} | {row['layout_us']:>6.1f} {row['up_us']:>6.1f} "
            f"{row['down_us']:>6.1f} {row['sum_us']:>6.1f} | {row['check']:>7.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--quick", action="store_true", help=f"tokens {QUICK_TOKENS} only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the MoE benchmark needs a CUDA GPU")
    gen = torch.Generator(device="cuda").manual_seed(0)
    peaks = measure_peaks("cuda", DTYPE)
    print(f"device: {torch.cuda.get_device_name()}; peaks: {peaks}\n{HEADER}", flush=True)
    rows = []
    for model in MODELS:
        weights = model_weights(model, gen)
        for tokens in QUICK_TOKENS if args.quick else TOKENS:
            rows.append(row_for(model, tokens, weights, peaks, gen))
            print(line(rows[-1]), flush=True)
        del weights
        torch.cuda.empty_cache()
    if args.out is not None:
        result = {"command": "python -m benchmarks.moe" + (" --quick" if args.quick else ""),
                  "date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
                  "software": {"torch": torch.__version__, "triton": __import__("triton").__version__},
                  "copy_tbps": peaks.copy_bytes_per_second / 1e12,
                  "gemm_tflops": peaks.gemm_flops_per_second / 1e12, "rows": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
