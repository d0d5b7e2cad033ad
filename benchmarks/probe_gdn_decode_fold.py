"""Probe: the GDN decode's fold step, in which every row's buffer fills, launched as the engine runs a step in which
few rows fold (the decode kernel, then the rows that fold in the commits' looped row: fold.fold_launch) and with
every_row_folds (the fold kernel decodes the token itself from each tile it folds, fold.ENTRIES_DECODE, in the
flush's pipelined row loop: S0 read once, no decode launch), as the engine launches plain decoding's steps in
which its rows fold in lockstep (StepGraphs: a decode graph of its own for them). Issue 15's GDN decode target
(amortised over a 16-token flush, >= 1.9x fla's fused_recurrent at batch >= 128) is missed by this step: at batch
256 it took 739 us against 171 for a step at the mean fill and 371 for a flush of the same buffers (the kernel
table of 2026-12-04). In one process, at Qwen3.5-9B shapes (CUDA graphs, states rotated over >= 2 GiB, fp32 keys
as the engine's decode): the decode + commit at the mean fill, its fold step both ways, the flush alone, and the
amortised decode both ways; and a check that the two fold steps agree (S0 and the output from the same pools).
The H200, 2026-12-04, sixteenth session, an earlier form of every_row_folds (the decode kernel, then the token
folded in the pipelined loop): the fold step 729 -> 538 us at batch 256, amortised 209 -> 197; this form
not run there yet.

    python -m benchmarks.probe_gdn_decode_fold --batches 64 128 256 512
"""

from __future__ import annotations

import argparse
from functools import partial

import torch

from verify_kernels.gdn import gdn_decode_commit, gdn_flush


def fold_step_error(pools, token, slots: torch.Tensor, L: int) -> float:
    """Max relative difference of S0 and the output between the two fold steps, each run from the same pools."""
    saved = [t.clone() for t in pools.args()]
    results = []
    for every_row_folds in (False, True):
        for tensor, copy in zip(pools.args(), saved, strict=True):
            tensor.copy_(copy)
        pools.buf_len[slots] = L - 1
        out, _ = gdn_decode_commit(*token, pools.state, slots, *pools.args()[1:], slots, L, flushed=False,
                                   every_row_folds=every_row_folds)
        results.append((out.clone(), pools.state[slots].clone()))
    for tensor, copy in zip(pools.args(), saved, strict=True):
        tensor.copy_(copy)
    (o1, s1), (o2, s2) = results
    return max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in ((o1, o2), (s1, s2)))


def main() -> None:
    from benchmarks import gdn
    from benchmarks.timing import time_calls

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256, 512])
    args = parser.parse_args()
    L = gdn.ENGINE_FLUSH_LENGTH
    print("| batch | step us (mean fill) | fold step us, looped | fold step us, pipelined | flush us | "
          "amortised us, looped | amortised us, pipelined fold step | fold steps' max rel. difference |")
    print("|---|---|---|---|---|---|---|---|")
    for batch in args.batches:
        rotations, pools, x, slots = gdn.decode_workload(batch, L)
        token = [(x.q32[r, :, 0], x.k32[r, :, 0], x.v[r, :, 0], x.g[r, :, 0], x.beta[r, :, 0])
                 for r in range(rotations)]
        error = fold_step_error(pools, token[0], slots[0], L)
        decode, folding = ([partial(gdn_decode_commit, *token[r], pools.state, slots[r], *pools.args()[1:], slots[r], L,
                                    flushed=False, every_row_folds=every) for r in range(rotations)]
                            for every in (False, True))
        pools.buf_len.fill_((L - 2) // 2)
        step = time_calls(decode) * 1e6
        pools.buf_len.fill_(L - 1)
        looped = time_calls(decode) * 1e6
        pipelined = time_calls(folding) * 1e6
        pools.buf_len.fill_(L)
        flush = time_calls([partial(gdn_flush, pools.state, slots[r], *pools.args()[1:], slots[r])
                            for r in range(rotations)]) * 1e6
        print(f"| {batch} | {step:.1f} | {looped:.1f} | {pipelined:.1f} | {flush:.1f} | "
              f"{((L - 1) * step + looped) / L:.1f} | {((L - 1) * step + pipelined) / L:.1f} | {error:.1e} |",
              flush=True)
        del pools, x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
