"""Sweep the tree attention's launch settings on the GPU (verify_kernels/attention/flash_tree.py's constants) at the
points the engine runs, and print the best:

    python -m benchmarks.sweep_attention [--winners FILE]

Why: on the H200 timeline of 2026-12-05e (Qwen3.5-9B, 4-chains at batch 128, ~160 committed tokens a row) the kernel
took 63 us a layer against ~12 of K / V bytes. Its build at the defaults (sm_90, Triton 3.9 on the CPU, with the
strides' 16-divisibility that a launch specialises): 8 warps at [32, 256] query tiles, 150 registers, 84 KiB of
shared memory in 2 stages, so one program an SM (its registers), and 512 programs of a serial loop over a few key
blocks each: ~4 waves. Key blocks of 32 on 4 warps: 214 registers, 50 KiB, two an SM, no spill (16: 202, 33 KiB);
the first sweep (2026-12-05f, results/sweeps_h200/sweep_attention_2026-12-05f.txt) made 32-key blocks on 4 warps
in 3 stages the defaults (0.51 -> 0.35 ms of a step on the timeline); the candidates below try around them.

Every candidate is first checked against the fp32 reference at both models' shapes (benchmarks.attention.check,
ragged rows, a tree, a 4000-key row); one whose error passes CHECK_TOLERANCE is reported and not timed. Then each is
timed (CUDA graphs, medians, inputs rotated over >= 2 GiB: benchmarks/timing.py) at WORKLOADS; "x bound" is the time
over K / V / q / out bytes at the run's copy bandwidth. --winners FILE merges the candidate whose total beats the
defaults' by kernel_settings.WIN_MARGIN (SPECDEC_KERNEL_SETTINGS=FILE applies it to later benchmarks).
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import torch

from benchmarks import attention, kernel_settings
from benchmarks.timing import copy_bandwidth, rotations_for, time_calls
from verify_kernels.attention import flash_tree, tree_attention
from verify_kernels.tree import ancestor_mask, chain_parents

MODULE = flash_tree.__name__
CHECK_TOLERANCE = 2e-2  # bf16 outputs against the fp32 reference, relative to the largest output (~4e-3 today)
# (model, batch, committed tokens a row, nodes a row): the speculative and plain steps of the study's target points
# at the study's contexts (128-token prompts, 64 new tokens), and a longer context
WORKLOADS = tuple((model, batch, context, width) for model in attention.MODELS
                  for batch, width in ((128, 5), (256, 1), (64, 5)) for context in (160, 1024))
CANDIDATES: dict[str, dict[str, object]] = {
    "defaults": {},
    # the defaults until the sweep of 2026-12-05f, which the defaults beat by 29% over these workloads
    "keys in blocks of 64, 8 warps, 2 stages": {"BLOCK_N": 64, "BIG_TILE": 32 * 256, "NUM_STAGES": 2},
    "keys in blocks of 16": {"BLOCK_N": 16},
    "keys in blocks of 64": {"BLOCK_N": 64},
    "2 stages": {"NUM_STAGES": 2},
    "4 stages": {"NUM_STAGES": 4},
    "split-K to 4 programs an SM": {"SPLIT_PROGRAMS_PER_SM": 4},
    "split-K to 1 program an SM": {"SPLIT_PROGRAMS_PER_SM": 1},
    # Nemotron-3-Nano's 16 query heads a KV head fold a 5-node chain into 80 rows: two query blocks of 64, each
    # reading the row's keys and values; one block of 128 reads them once (its [128, 128] accumulator on 8 warps)
    "one query block of up to 128 rows": {"BLOCK_M_MAX": 128},
}


def settings(name: str) -> dict[str, object]:
    """A candidate's settings by their full names (benchmarks/kernel_settings.py)."""
    return {f"{MODULE}.{constant}": value for constant, value in CANDIDATES[name].items()}


def workload_calls(model: str, batch: int, context: int, width: int) -> tuple[list, int]:
    """(a tree_attention call per rotation of the pools, the bytes one call moves) for a chain of `width` nodes a row
    over `context` committed keys, at the key-length hint the engine's graphs give (attention.kv_bucket)."""
    hq, hkv, dim = attention.MODELS[model]
    moved = attention.bytes_moved(batch, context, width, hq, hkv, dim)
    rotations = rotations_for(moved)
    shape = (rotations * batch, attention.kv_bucket(context + width), hkv, dim)
    key_pool, value_pool = (torch.randn(shape, device="cuda", dtype=attention.DTYPE) for _ in range(2))
    seq_lens = torch.full((batch,), context, device="cuda")
    query = torch.randn(batch, width, hq, dim, device="cuda", dtype=attention.DTYPE)
    key, value = (torch.randn(batch, width, hkv, dim, device="cuda", dtype=attention.DTYPE) for _ in range(2))
    ancestors = ancestor_mask(chain_parents(batch, width, "cuda"), torch.full((batch,), width, device="cuda"))
    slots = [torch.arange(r * batch, (r + 1) * batch, device="cuda") for r in range(rotations)]
    nodes = (query, key, value, key_pool, value_pool)
    return [partial(tree_attention, *nodes, s, seq_lens, ancestors, dim**-0.5, attention.kv_bucket(context + width))
            for s in slots], moved


def sweep(copy_bw: float) -> list[dict]:
    """Every candidate checked, then timed at every workload, in candidate order (the defaults first)."""
    rows = []
    for name in CANDIDATES:
        saved = {constant: getattr(flash_tree, constant) for constant in CANDIDATES[name]}
        try:
            for constant, value in CANDIDATES[name].items():
                setattr(flash_tree, constant, value)
            errors = {model: attention.check(model) for model in attention.MODELS}
            if max(errors.values()) > CHECK_TOLERANCE:
                rows.append({"config": name, "error": max(errors.values())})
                continue
            for model, batch, context, width in WORKLOADS:
                calls, moved = workload_calls(model, batch, context, width)
                us = time_calls(calls) * 1e6
                rows.append({"config": name, "model": model, "batch": batch, "context": context, "T": width,
                             "us": us, "x_bound": us / (moved / copy_bw * 1e6)})
                torch.cuda.empty_cache()
        finally:
            for constant, value in saved.items():
                setattr(flash_tree, constant, value)
        print(f"{name}: done", flush=True)
    return rows


def winner(rows: list[dict]) -> tuple[str, dict[str, object]] | None:
    """The candidate whose time summed over the workloads beats the defaults' by WIN_MARGIN, and its settings."""
    totals: dict[str, list[float]] = {}
    for row in rows:
        if "us" in row:
            totals.setdefault(row["config"], []).append(row["us"])
    if "defaults" not in totals:
        return None
    timed = [(sum(us), name) for name, us in totals.items() if len(us) == len(totals["defaults"])]
    total, name = min(timed)
    if name == "defaults" or not kernel_settings.beats(total, sum(totals["defaults"])):
        return None
    return name, settings(name)


def report(rows: list[dict], copy_bw: float) -> list[str]:
    lines = [f"copy bandwidth {copy_bw / 1e12:.2f} TB/s", "",
             "| config | model | batch | context | T | us | x bound |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['config']} | disagrees with the reference: {row['error']:.1e} | | | | | |")
        else:
            lines.append(f"| {row['config']} | {row['model']} | {row['batch']} | {row['context']} | {row['T']} | "
                         f"{row['us']:.1f} | {row['x_bound']:.2f} |")
    found = winner(rows)
    lines += ["", f"winner by {kernel_settings.WIN_MARGIN:.0%} or more over the workloads' total: "
              + (f"{found[0]} {found[1]}" if found else "none")]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--winners", type=Path, help="merge the winning settings into this JSON file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the sweep needs a CUDA GPU")
    torch.manual_seed(0)
    copy_bw = copy_bandwidth()
    rows = sweep(copy_bw)
    print("\n".join(report(rows, copy_bw)), flush=True)
    found = winner(rows)
    if args.winners is not None and found is not None:
        kernel_settings.merge_winners(args.winners, [found[1]])


if __name__ == "__main__":
    main()
