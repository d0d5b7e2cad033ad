"""Sweep the Mamba2 kernels' launch parameters on the GPU and print the best (the tunables of
verify_kernels/mamba2/verify.py, decode.py and commit.py), in about two minutes on the H200:

    python -m benchmarks.sweep_mamba2 [--out benchmarks/results/sweep_mamba2_h200.json]
    python -m benchmarks.sweep_mamba2 --ops verify --match finish   # a subset of the verify's candidates
    python -m benchmarks.sweep_mamba2 --ops commit --winners FILE    # the commit; winners for later benchmarks

Every candidate is first checked against the torch references at Nemotron-3-Nano's sizes (benchmarks/checks.py, on
ragged rows with and without a state); one that disagrees is reported and not timed. Then each is timed as
benchmarks/kernels.py times (CUDA graphs, medians, inputs rotated over >= 2 GiB) at batch 64 and 256: the verify of
a 5-chain and of a 16-node tree over 8 buffered entries, decode-commit amortised over L = 16 steps (15 at the
mean buffer fill, one that folds), and the commit of 3 accepted nodes with no row, one in 8 and every row folding.
"x bound" is the time over bytes_moved / the device copy bandwidth of the run.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch

from benchmarks import checks, kernel_settings, mamba2
from benchmarks.inputs import Pools, rotation_slots
from benchmarks.timing import copy_bandwidth, rotations_for, time_calls
from verify_kernels.mamba2 import commit as commit_module
from verify_kernels.mamba2 import verify as verify_module
from verify_kernels.mamba2.decode import DecodeConfig, mamba2_decode_fwd
from verify_kernels.mamba2.verify import VerifyConfig, mamba2_verify_fwd
from verify_kernels.tree import ancestor_mask

BATCHES = (64, 256)
FLUSH_LENGTH = 16
DEFAULTS = "split roles bp64 w4"  # the verify candidate at the module's defaults
FINISH_TILES = ((64, 2), (32, 1), (16, 1), (32, 2), (16, 2))


# the split's launches' register caps (state programs, second launch): a program more an SM for each
# (verify.SPLIT_ROLES_MAX_REGISTERS, SPLIT_FINISH_MAX_REGISTERS)
REGISTER_CAPS = ((72, None), (None, 64), (72, 64))


def finish_name(block_p: int, warps: int) -> str:
    return f"{DEFAULTS} finish bp{block_p} w{warps}"


def caps_name(roles: int | None, finish: int | None) -> str:
    caps = [f"{what} regs {cap}" for what, cap in (("roles", roles), ("finish", finish)) if cap is not None]
    return f"{DEFAULTS} {', '.join(caps)}"


def module_settings(name: str) -> dict[str, object] | None:
    """The verify candidate's settings as verify_kernels.mamba2.verify's constants (benchmarks/kernel_settings.py),
    where it differs from the defaults in those alone: the finishing launch's tile; None for the others (their
    VerifyConfig fields map onto per-size tables a person sets)."""
    for block_p, warps in FINISH_TILES:
        if name == finish_name(block_p, warps):
            return {"verify_kernels.mamba2.verify.SPLIT_FINISH_BLOCK_P": block_p,
                    "verify_kernels.mamba2.verify.SPLIT_FINISH_WARPS": warps}
    for roles, finish in REGISTER_CAPS:  # (the sweep's trees are all of BT 16: the caps of that block)
        if name == caps_name(roles, finish):
            module = verify_module.__name__
            return {f"{module}.SPLIT_ROLES_MAX_REGISTERS": {**verify_module.SPLIT_ROLES_MAX_REGISTERS, 16: roles},
                    f"{module}.SPLIT_FINISH_MAX_REGISTERS": {**verify_module.SPLIT_FINISH_MAX_REGISTERS, 16: finish}}
    return None


def verify_candidates(tree: str) -> dict[str, VerifyConfig]:
    """The state pass's P rows and warps, its N slice and pipeline depth, the state term on the FMA units (for few
    nodes), the scores inline (the small batches' one-launch path) rather than from the products pass."""
    candidates = {f"dots bp{bp} w{w}": VerifyConfig(bp, w, state_dot=True, inline_scores=False)
                  for bp, w in ((32, 4), (64, 4), (64, 8), (32, 2))}
    candidates["dots bp64 w4 bn64"] = VerifyConfig(64, 4, state_dot=True, inline_scores=False, block_n=64)
    candidates |= {f"dots bp64 w4 stages{s}": VerifyConfig(64, 4, state_dot=True, inline_scores=False, num_stages=s)
                   for s in (3, 5)}
    candidates["dots bp64 w4 inline"] = VerifyConfig(64, 4, state_dot=True, inline_scores=True)
    # h0's stream beside the products pass in one launch, the rest in a second (VerifyConfig.split_roles)
    candidates |= {f"split roles bp{bp} w{w}": VerifyConfig(bp, w, state_dot=True, inline_scores=False,
                                                            split_roles=True) for bp, w in ((64, 4), (32, 4), (64, 8))}
    # ... its state programs' N loop (h0 C^T alone, 85 registers: more programs an SM than the state pass had) deeper
    # or in wider steps (the split won at 3 stages of 32 columns, the state pass's settings: 2026-12-04c)
    candidates |= {f"split roles bp64 w4 stages{s}": VerifyConfig(64, 4, state_dot=True, inline_scores=False,
                                                                  split_roles=True, num_stages=s) for s in (2, 4, 5)}
    candidates["split roles bp64 w4 bn64"] = VerifyConfig(64, 4, state_dot=True, inline_scores=False,
                                                          split_roles=True, block_n=64)
    # batch 64 is the one that misses its bound target (5-chains at 62-63% of it, 2026-12-04): more, smaller programs
    # (B NH P / bp of them: 4096 at bp 64 fill ~5.2 waves of the H200's SMs at six a SM), in one launch with the
    # scores inline (the small batches' path, FUSED_MAX_BATCH) or split
    candidates |= {f"dots bp{bp} w{w} inline": VerifyConfig(bp, w, state_dot=True, inline_scores=True)
                   for bp, w in ((16, 2), (32, 2), (32, 4))}
    candidates |= {f"split roles bp{bp} w{w}": VerifyConfig(bp, w, state_dot=True, inline_scores=False,
                                                            split_roles=True) for bp, w in ((32, 2), (16, 2))}
    # the split's second launch on its own P rows and warps (VerifyConfig.finish_*, verify.SPLIT_FINISH_*: written on
    # the CPU on 2026-12-04, eighteenth session; latency-bound, a third of the verify at batch 128), the state
    # programs at the defaults' 64 rows on 4 warps
    candidates |= {finish_name(bp, w): VerifyConfig(64, 4, state_dot=True, inline_scores=False, split_roles=True,
                                                    finish_block_p=bp, finish_warps=w) for bp, w in FINISH_TILES}
    # the split's launches with their registers capped: one program more an SM each (written on the CPU on
    # 2026-12-05, twenty-first session, after the GDN small trees' pass gained 4-11% from such a cap)
    candidates |= {caps_name(roles, finish): VerifyConfig(64, 4, state_dot=True, inline_scores=False,
                                                          split_roles=True, roles_max_registers=roles,
                                                          finish_max_registers=finish)
                   for roles, finish in REGISTER_CAPS}
    # the products in Triton's tf32x3 (its emulated roundings) rather than the default's operands split by a mask
    # (verify.DOT_PRECISION, verify_kernels/precision.py), for the record
    candidates["dots bp64 w4 triton-tf32x3"] = VerifyConfig(64, 4, state_dot=True, inline_scores=False,
                                                            precision="tf32x3")
    if len(mamba2.VERIFY_TREES[tree]) <= 8:
        candidates |= {f"fma bp{bp} w{w}": VerifyConfig(bp, w, state_dot=False, inline_scores=False)
                       for bp, w in ((32, 4), (64, 4), (64, 8))}
    return candidates


def decode_candidates() -> dict[str, DecodeConfig]:
    """P rows and warps per program, and the fold's N slice and products."""
    candidates = {f"bp{bp} w{w}": DecodeConfig(bp, 16, w) for bp in (16, 32, 64) for w in (2, 4, 8)}
    candidates["bp64 w4 fold-bn64"] = DecodeConfig(64, 16, 4, block_n=64)
    candidates |= {f"bp64 w4 fold-bn{bn} split": DecodeConfig(64, 16, 4, block_n=bn, fold_precision="tf32x3-split")
                   for bn in (32, 64)}
    return candidates


def sweep_verify(tree: str, copy_bw: float, match: str | None = None) -> list[dict]:
    """The verify candidates of `tree` (those whose names hold `match`, and "split roles bp64 w4", the defaults',
    where given), checked then timed at BATCHES."""
    rows = []
    candidates = {}
    for name, config in verify_candidates(tree).items():
        if match is not None and match not in name and name != DEFAULTS:
            continue
        error = checks.check_mamba2_verify(tree, config)
        if error <= checks.TOLERANCE:
            candidates[name] = config
        else:
            rows.append({"op": f"verify {tree}", "config": name, "error": error})
    for batch in BATCHES:
        nodes = len(mamba2.VERIFY_TREES[tree])
        rotations = rotations_for(batch * mamba2.STATE_BYTES)
        pools = Pools.make(rotations * batch, mamba2.ENGINE_FLUSH_LENGTH, (mamba2.NH, mamba2.P, mamba2.N),
                           (mamba2.NG, mamba2.N), (mamba2.NH, mamba2.P), mamba2.NH)
        pools.buf_len.fill_(mamba2.VERIFY_FILL)
        slots = [rotation_slots(r, batch) for r in range(rotations)]
        x = mamba2.TokenInputs(rotations, batch, nodes)
        a_neg, d_skip = mamba2.layer_weights()
        parents = torch.tensor(mamba2.VERIFY_TREES[tree], device="cuda").expand(batch, nodes).contiguous()
        num_nodes = torch.full((batch,), nodes, device="cuda")
        ancestors = ancestor_mask(parents, num_nodes)
        bound_us = mamba2.verify_bytes(batch, nodes, mamba2.VERIFY_FILL) / copy_bw * 1e6
        for name, config in candidates.items():
            # B and C as the glue leaves them (bf16: the products skip their remainders), and for the split roles
            # (the defaults) also in fp32, every product split in full (the inputs before 2026-12-04)
            inputs = {name: (x.bm, x.cm)}
            if name.startswith("split roles"):
                inputs[f"{name}, fp32 B and C"] = (x.bm32, x.cm32)
            for label, (bm, cm) in inputs.items():
                seconds = time_calls([
                    partial(mamba2_verify_fwd, x.x[r], x.dt[r], a_neg, bm[r], cm[r], d_skip, parents, num_nodes,
                            pools.state, slots[r], *pools.args()[1:], slots[r], ancestors, config)
                    for r in range(rotations)
                ])
                rows.append({"op": f"verify {tree}", "batch": batch, "config": label, "us": seconds * 1e6,
                             "x_bound": seconds * 1e6 / bound_us})
        del pools, x
        torch.cuda.empty_cache()
    return rows


def sweep_decode(copy_bw: float) -> list[dict]:
    rows = []
    candidates = {}
    for name, config in decode_candidates().items():
        try:
            error = checks.check_mamba2_decode_commit(FLUSH_LENGTH, config)
        except Exception as failure:  # (a candidate the installed Triton cannot compile or run loses its row only)
            first = str(failure).splitlines()[0] if str(failure) else ""
            print(f"decode {name} failed: {type(failure).__name__}: {first}", flush=True)
            error = float("inf")
        if error <= checks.TOLERANCE:
            candidates[name] = config
        else:
            rows.append({"op": "decode", "config": name, "error": error})
    for batch in BATCHES:
        rotations = rotations_for(batch * mamba2.STATE_BYTES)
        pools = Pools.make(rotations * batch, mamba2.ENGINE_FLUSH_LENGTH, (mamba2.NH, mamba2.P, mamba2.N),
                           (mamba2.NG, mamba2.N), (mamba2.NH, mamba2.P), mamba2.NH)
        slots = [rotation_slots(r, batch) for r in range(rotations)]
        x = mamba2.TokenInputs(rotations, batch, 1)
        a_neg, d_skip = mamba2.layer_weights()
        bound_us = mamba2.decode_bytes(batch, FLUSH_LENGTH) / copy_bw * 1e6
        for name, config in candidates.items():
            calls = [partial(mamba2_decode_fwd, x.x[r, :, 0], x.dt[r, :, 0], a_neg, x.bm[r, :, 0], x.cm[r, :, 0],
                             d_skip, pools.state, slots[r], *pools.args()[1:], slots[r], FLUSH_LENGTH, config)
                     for r in range(rotations)]
            pools.buf_len.fill_((FLUSH_LENGTH - 2) // 2)
            step_s = time_calls(calls)
            pools.buf_len.fill_(FLUSH_LENGTH - 1)
            fold_s = time_calls(calls)
            us = ((FLUSH_LENGTH - 1) * step_s + fold_s) / FLUSH_LENGTH * 1e6
            rows.append({"op": "decode L16", "batch": batch, "config": name, "us": us, "x_bound": us / bound_us,
                         "step_us": step_s * 1e6, "fold_us": fold_s * 1e6})
            print(f"decode L16 batch {batch} {name}: {us:.1f} us ({us / bound_us:.2f}x bound)", flush=True)
        del pools, x
        torch.cuda.empty_cache()
    return rows


# the commit's settings (verify_kernels.mamba2.commit constants): the defaults first (120 registers on sm_90 with
# Triton 3.6: 32 P rows, 4 warps), then 16 P rows a program (a commit folding 1 row in 8: 36.8 / 122.0 us against
# 30.9 / 101.0 at batch 64 / 256 on the H200, sweeps_h200/sweep_mamba2_verify_commit_2026-12-05a.txt). A folding
# program's loads all issued first lost in the same sweep and were removed (docs/design.md section 6)
COMMIT_CANDIDATES = {
    "defaults": {},
    "16 P rows a program": {"BLOCK_P_MAX": 16},
    "registers capped at 96": {"MAX_REGISTERS": 96},  # 95 registers, 5 programs an SM, not 4 (commit.MAX_REGISTERS)
}
COMMIT_CASE = "commit, 1 row in 8 folds"  # what a speculative step's commit meets: the winner's measure


def commit_settings(name: str) -> dict[str, object]:
    return {f"{commit_module.__name__}.{constant}": value for constant, value in COMMIT_CANDIDATES[name].items()}


def sweep_commit(copy_bw: float) -> list[dict]:
    """The commit candidates, checked then timed at BATCHES over the kernel table's cases (no row, one in 8 and
    every row folding; benchmarks/commit_cases.py)."""
    rows = []
    for name, changes in COMMIT_CANDIDATES.items():
        saved = {constant: getattr(commit_module, constant) for constant in changes}
        try:
            for constant, value in changes.items():
                setattr(commit_module, constant, value)
            try:
                error = checks.check_mamba2_commit()
            except Exception as failure:  # (a candidate the installed Triton cannot compile or run loses its row)
                print(f"commit {name} failed: {type(failure).__name__}: {str(failure).splitlines()[:1]}", flush=True)
                error = float("inf")
            if not error <= checks.TOLERANCE:
                rows.append({"op": "commit", "config": name, "error": error})
                continue
            for batch in BATCHES:
                for case in mamba2.commit_rows([batch]):
                    us, bound_us = case["ours_us"], case["bytes_moved"] / copy_bw * 1e6
                    rows.append({"op": case["case"], "batch": batch, "config": name, "us": us,
                                 "x_bound": us / bound_us})
                    print(f"{case['case']} batch {batch} {name}: {us:.1f} us ({us / bound_us:.2f}x bound)", flush=True)
        finally:
            for constant, value in saved.items():
                setattr(commit_module, constant, value)
    return rows


def commit_winner(rows: list[dict]) -> tuple[str, dict[str, object]] | None:
    """The commit candidate whose COMMIT_CASE time summed over the batches beats the defaults' by WIN_MARGIN."""
    totals: dict[str, list[float]] = {}
    for row in rows:
        if row["op"] == COMMIT_CASE and "us" in row:
            totals.setdefault(row["config"], []).append(row["us"])
    if "defaults" not in totals:
        return None
    timed = [(sum(us), name) for name, us in totals.items() if len(us) == len(totals["defaults"])]
    total, name = min(timed)
    return (name, commit_settings(name)) if kernel_settings.beats(total, sum(totals["defaults"])) else None


def best(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """The fastest timed row per (op, batch)."""
    winners = {}
    for row in rows:
        key = (row["op"], row.get("batch"))
        if "us" in row and (key not in winners or row["us"] < winners[key]["us"]):
            winners[key] = row
    return winners


def verify_winner(rows: list[dict]) -> tuple[str, dict[str, object]] | None:
    """The verify candidate with module settings whose time summed over every tree and batch beats the defaults'
    by kernel_settings.WIN_MARGIN, and those settings; None where none does."""
    totals: dict[str, list[float]] = {}
    for row in rows:
        if row["op"].startswith("verify") and "us" in row:
            totals.setdefault(row["config"], []).append(row["us"])
    if DEFAULTS not in totals:
        return None
    timed = [(sum(us), name) for name, us in totals.items()
             if module_settings(name) is not None and len(us) == len(totals[DEFAULTS])]
    if not timed:
        return None
    total, name = min(timed)
    return (name, module_settings(name)) if kernel_settings.beats(total, sum(totals[DEFAULTS])) else None


def report(rows: list[dict], copy_bw: float) -> list[str]:
    lines = [f"copy bandwidth {copy_bw / 1e12:.2f} TB/s", "",
             "| op | batch | config | us | x bound | step us | fold us |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['op']} | — | {row['config']} | disagrees with the reference: {row['error']:.1e} |")
            continue
        step = f"{row['step_us']:.1f} | {row['fold_us']:.1f}" if "step_us" in row else "— | —"
        lines.append(f"| {row['op']} | {row['batch']} | {row['config']} | {row['us']:.1f} | {row['x_bound']:.2f} | "
                     f"{step} |")
    lines += ["", "best (copy the batch-256 choice into the module constants; batch 64 for comparison):"]
    for (op, batch), row in sorted(best(rows).items()):
        lines.append(f"  {op}, batch {batch}: {row['config']} ({row['us']:.1f} us, {row['x_bound']:.2f}x bound)")
    lines += [
        "  verify.py: BLOCK_P[16] / NUM_WARPS[16] from the dots winner; FMA_MAX_NODES = 8 if an fma config wins the",
        "  5-chain; STATE_BLOCK_N = 64 if 'bn64' wins, STATE_STAGES likewise; FUSED_MAX_BATCH >= 256 if 'inline'",
        "  wins (the products pass is then not worth its launch). decode.py: BLOCK_P / NUM_WARPS, FOLD_BLOCK_N.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sweep_mamba2_h200.json"))
    parser.add_argument("--ops", default="verify,decode", help="comma-separated, of verify, decode and commit")
    parser.add_argument("--winners", type=Path,
                        help="merge the verify's winning finish tile and the commit's winning settings into this JSON "
                             f"file where they beat the defaults by {kernel_settings.WIN_MARGIN:.0%}% "
                             "(SPECDEC_KERNEL_SETTINGS=FILE then applies them: benchmarks/kernel_settings.py)")
    parser.add_argument("--match", help="only the verify candidates whose names hold this text (and the defaults'), "
                                        "e.g. 'finish'")
    args = parser.parse_args()
    ops = set(args.ops.split(","))
    if not ops or not ops <= {"verify", "decode", "commit"}:
        raise SystemExit(f"--ops takes verify, decode and / or commit, got {args.ops!r}")
    if not torch.cuda.is_available():
        raise SystemExit("the sweep needs a CUDA GPU")
    torch.manual_seed(0)
    copy_bw = copy_bandwidth()
    rows = []
    for tree in mamba2.VERIFY_TREES if "verify" in ops else ():
        rows += sweep_verify(tree, copy_bw, args.match)
        print(f"verify {tree}: done", flush=True)
    if "decode" in ops:
        rows += sweep_decode(copy_bw)
    if "commit" in ops:
        rows += sweep_commit(copy_bw)
    lines = report(rows, copy_bw)
    print("\n".join(lines))
    if args.winners:
        winners = [winner for winner in (verify_winner(rows), commit_winner(rows)) if winner]
        written = kernel_settings.merge_winners(args.winners, [settings for _, settings in winners])
        print(f"winners by {kernel_settings.WIN_MARGIN:.0%} or more: "
              f"{', '.join(name for name, _ in winners) or 'none'}; {args.winners} holds {written or 'nothing'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_tbps": copy_bw / 1e12,
                                    "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
