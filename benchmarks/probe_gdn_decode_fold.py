"""Probe: the GDN decode's fold step, in which every row's buffer fills, launched as the engine runs a step in which
few rows fold (the decode kernel, then the rows that fold in the commits' looped row: fold.fold_launch) and with
every_row_folds (plain decoding's rows in lockstep: StepGraphs captures a decode graph of its own for them) in each
of its launches (verify_kernels.gdn.decode.FOLDING_DECODE): the decode's launches then the token folded in the
flush's pipelined row loop; the fold kernel decoding the token itself from each tile it folds (S0 read once, no
decode launch), its reads summed over the folded tile. Issue 15's GDN decode target (amortised over a 16-token
flush, >= 1.9x fla's fused_recurrent at batch >= 128) turns on this step. In one process, at Qwen3.5-9B shapes
(CUDA graphs, states rotated over >= 2 GiB, fp32 keys as the engine's decode): the decode + commit at the mean
fill, its fold step each way, the flush alone, the amortised decode each way, and each launch's largest
difference from the looped one (S0 and the output, from the same pools). The H200, 2026-12-04, seventeenth
session: the fold step at batch 128 / 256 / 512 372 / 738 / 1478 us looped, 279 / 545 / 1073 decode-then-fold,
307 / 612 / 1214 in-fold, a flush 181 / 356 / 703 (verify_kernels/gdn/decode.py).

    python -m benchmarks.probe_gdn_decode_fold --batches 64 128 256 512
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from functools import partial

import torch

from verify_kernels.gdn import decode as decode_module
from verify_kernels.gdn import gdn_decode_commit, gdn_flush


def fold_step_error(pools, token, slots: torch.Tensor, L: int, form: str) -> float:
    """Max relative difference of S0 and the output between the looped fold step and the every_row_folds launch
    `form`, each run from the same pools."""
    saved = [t.clone() for t in pools.args()]
    results = []
    for every_row_folds in (False, True):
        for tensor, copy in zip(pools.args(), saved, strict=True):
            tensor.copy_(copy)
        pools.buf_len[slots] = L - 1
        with folding_decode(form):
            out, _ = gdn_decode_commit(*token, pools.state, slots, *pools.args()[1:], slots, L, flushed=False,
                                       every_row_folds=every_row_folds)
        results.append((out.clone(), pools.state[slots].clone()))
    for tensor, copy in zip(pools.args(), saved, strict=True):
        tensor.copy_(copy)
    (o1, s1), (o2, s2) = results
    return max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in ((o1, o2), (s1, s2)))


@contextmanager
def folding_decode(form: str):
    """decode.FOLDING_DECODE set to `form` inside the block (read at each launch, so graphs capture it)."""
    saved, decode_module.FOLDING_DECODE = decode_module.FOLDING_DECODE, form
    try:
        yield
    finally:
        decode_module.FOLDING_DECODE = saved


def timed(calls, form: str | None = None) -> float:
    from benchmarks.timing import time_calls

    if form is None:
        return time_calls(calls) * 1e6
    with folding_decode(form):
        return time_calls(calls) * 1e6


def main() -> None:
    from benchmarks import gdn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256, 512])
    args = parser.parse_args()
    L = gdn.ENGINE_FLUSH_LENGTH
    forms = decode_module.FOLDING_DECODES
    print(f"every_row_folds launches: {', '.join(forms)} (FOLDING_DECODE on main: {decode_module.FOLDING_DECODE})")
    print("| batch | step us (mean fill) | fold step us, looped | "
          + " | ".join(f"fold step us, {form}" for form in forms) + " | flush us | amortised us, looped | "
          + " | ".join(f"amortised us, {form}" for form in forms) + " | max rel. difference from looped |")
    print("|---" * (5 + 2 * len(forms)) + "|---|")
    for batch in args.batches:
        rotations, pools, x, slots = gdn.decode_workload(batch, L)
        token = [(x.q32[r, :, 0], x.k32[r, :, 0], x.v[r, :, 0], x.g[r, :, 0], x.beta[r, :, 0])
                 for r in range(rotations)]
        error = max(fold_step_error(pools, token[0], slots[0], L, form) for form in forms)
        decode, folding = ([partial(gdn_decode_commit, *token[r], pools.state, slots[r], *pools.args()[1:], slots[r], L,
                                    flushed=False, every_row_folds=every) for r in range(rotations)]
                            for every in (False, True))
        pools.buf_len.fill_((L - 2) // 2)
        step = timed(decode)
        pools.buf_len.fill_(L - 1)
        looped = timed(decode)
        folds = [timed(folding, form) for form in forms]
        pools.buf_len.fill_(L)
        flush = timed([partial(gdn_flush, pools.state, slots[r], *pools.args()[1:], slots[r])
                       for r in range(rotations)])
        amortised = [((L - 1) * step + fold) / L for fold in [looped, *folds]]
        print(f"| {batch} | {step:.1f} | {looped:.1f} | " + " | ".join(f"{fold:.1f}" for fold in folds)
              + f" | {flush:.1f} | " + " | ".join(f"{a:.1f}" for a in amortised) + f" | {error:.1e} |", flush=True)
        del pools, x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
