"""Sweep the fused MoE experts' launch parameters on the GPU and print the best per regime (the CONFIGS of
verify_kernels/moe/experts.py), in about four minutes on the H200 for both models (one model: --models; not yet
run there):

    python -m benchmarks.sweep_moe [--models nemotron-3-nano] [--out benchmarks/results/sweep_moe_h200.json]

One token count per row of CONFIGS (1, 64, 256 tokens: assignments per expert below 1, 8, 24), and two above 24 (640
and 2048 tokens: speculative steps of 128 and ~410 rows of 5 nodes, where issue 14 asks for 1.3x the bound),
at the shapes, weights, routings and timing of benchmarks/moe.py. For each block size BM the regime allows, the up
GEMM's candidates are timed with the down GEMM at its default, then the down GEMM's with the best up; "x bound" is
the whole call over max(bytes / copy bandwidth, FLOPs / GEMM peak). Each candidate's output is first checked
against moe_experts_ref; one that disagrees (or does not compile) is reported and not timed.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

from benchmarks.moe import DTYPE, MODELS, bound_us, case_for, model_weights, relative_error
from benchmarks.timing import time_calls
from specdec.eval.peaks import measure_peaks
from verify_kernels.moe import ExpertsConfig, GemmConfig, experts_config, moe_experts, moe_experts_ref

TOKENS = (1, 64, 256, 640, 2048)
TOLERANCE = 2e-2
# (block_n, block_k, num_warps, num_stages) per block size BM
GEMMS = {
    16: [(16, 128, 4, 4), (32, 128, 4, 4), (64, 128, 4, 4), (32, 256, 4, 3), (64, 64, 4, 5)],
    32: [(32, 128, 4, 4), (64, 128, 4, 4), (128, 64, 4, 4), (128, 64, 8, 3)],
    64: [(64, 64, 4, 4), (128, 64, 4, 4), (128, 64, 8, 4), (256, 64, 8, 3), (64, 128, 4, 3)],
    128: [(64, 64, 8, 4), (128, 64, 8, 4), (256, 64, 8, 3)],
}


def block_sizes(rows_per_expert: float) -> tuple[int, ...]:
    if rows_per_expert <= 1:
        return (16,)
    if rows_per_expert <= 8:
        return (16, 32)
    if rows_per_expert <= 24:
        return (16, 32, 64)
    return (32, 64, 128)


def name(config: ExpertsConfig) -> str:
    return f"bm {config.block_m}, up {tuple(config.up)}, down {tuple(config.down)}"


def timed(case, config: ExpertsConfig, ref: torch.Tensor, bound: float) -> tuple[float | None, str]:
    """(x bound or None, note) of one candidate."""
    try:
        error = relative_error(moe_experts(*case.args[0], config), ref)
    except (OutOfResources, RuntimeError) as failure:
        return None, f"failed: {str(failure).splitlines()[0][:80]}"
    if not error <= TOLERANCE:
        return None, f"wrong: error {error:.1e}"
    return time_calls([partial(moe_experts, *a, config) for a in case.args]) * 1e6 / bound, ""


def sweep_case(model: str, tokens: int, weights, peaks, gen) -> dict:
    experts, k, _, _, gated, _, _ = MODELS[model]
    case = case_for(model, tokens, weights, gen)
    ref = moe_experts_ref(*case.args[0])
    bound = bound_us(case, peaks)
    default = experts_config(tokens * k, experts, gated)
    results = {"default": timed(case, default, ref, bound)[0]}
    print(f"{model} {tokens} tokens: bound {bound:.1f} us; default {name(default)}: x bound "
          f"{results['default'] or float('nan'):.2f}", flush=True)
    best = (results["default"] or float("inf"), default)
    for bm in block_sizes(tokens * k / experts):
        down = default.down
        up_best = (float("inf"), default.up)
        for side in ("up", "down"):
            for gemm in map(GemmConfig._make, GEMMS[bm]):
                config = ExpertsConfig(bm, gemm, down) if side == "up" else ExpertsConfig(bm, up_best[1], gemm)
                ratio, note = timed(case, config, ref, bound)
                results[name(config)] = ratio
                print(f"  bm {bm} {side} {tuple(gemm)}: " + (f"x bound {ratio:.2f}" if ratio else note), flush=True)
                if ratio is not None and side == "up" and ratio < up_best[0]:
                    up_best = (ratio, gemm)
                if ratio is not None and ratio < best[0]:
                    best = (ratio, config)
    print(f"  best: {name(best[1])}: x bound {best[0]:.2f}", flush=True)
    return {"model": model, "tokens": tokens, "bound_us": bound, "best": list(best[1]), "best_x_bound": best[0],
            "default": list(default), "default_x_bound": results["default"], "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the MoE sweep needs a CUDA GPU")
    start = time.perf_counter()
    gen = torch.Generator(device="cuda").manual_seed(0)
    peaks = measure_peaks("cuda", DTYPE)
    print(f"device: {torch.cuda.get_device_name()}; peaks: {peaks}", flush=True)
    rows = []
    for model in args.models:
        weights = model_weights(model, gen)
        rows += [sweep_case(model, tokens, weights, peaks, gen) for tokens in args.tokens]
        del weights
        torch.cuda.empty_cache()
    print("\nbest per row (model, tokens, x bound, block_m, up and down (block_n, block_k, num_warps, num_stages)):")
    for row in rows:
        print(f"  {row['model']:16} {row['tokens']:>5} {row['best_x_bound']:.2f} (default "
              f"{row['default_x_bound'] or float('nan'):.2f})  {row['best']}")
    print(f"sweep took {time.perf_counter() - start:.0f} s")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": "python -m benchmarks.sweep_moe " + " ".join(
            ["--models", *args.models, "--tokens", *map(str, args.tokens)]), "device": torch.cuda.get_device_name(),
            "copy_tbps": peaks.copy_bytes_per_second / 1e12, "gemm_tflops": peaks.gemm_flops_per_second / 1e12,
            "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
