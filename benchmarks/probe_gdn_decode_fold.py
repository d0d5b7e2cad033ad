"""Probe: the GDN decode's fold step with its fold in the flush's pipelined row loop. Issue 15's GDN decode target
(amortised over a 16-token flush, >= 1.9x fla's fused_recurrent at batch >= 128) is missed by its fold step: at batch
256 the step in which every row's buffer is full took 739 us against 171 for a step at the mean fill and 371 for a
flush of the same buffers (the kernel table of 2026-12-04), because the decode + commit folds in the commits' looped
row (fold.fold_launch: kept for commits because most fold few rows), where the flush runs the pipelined row loop.
Plain decoding's rows fold in lockstep, and the engine knows on the host which rows fold in a step
(StepGraphs.decode: cache.prepare_commit), so it could replay a decode graph whose fold runs the pipelined loop in the
steps where every row folds. Before that plumbing, this measures what it would buy: in one process, at Qwen3.5-9B
shapes (CUDA graphs, states rotated over >= 2 GiB, fp32 keys as the engine's decode), the decode + commit at the mean
fill, its fold step as the engine runs it and with the pipelined loop (fold.fold_launch patched for the token's
entry: fold.fold_row_blocks folds it as a rank-one update), the flush alone, and the amortised decode both ways; and
checks that the two fold steps agree (S0 and the output from the same pools).

    python -m benchmarks.probe_gdn_decode_fold --batches 64 128 256 512
"""

from __future__ import annotations

import argparse
import contextlib
from functools import partial

import torch

from verify_kernels.gdn import fold, gdn_decode_commit, gdn_flush


@contextlib.contextmanager
def pipelined_token_fold():
    """fold.fold_launch with the decode's token entries folded in the flush's pipelined row loop (its tile, warps and
    stages; S0 through TMA where the flush's is)."""
    launch = fold.fold_launch

    def patched(L: int, append: bool, entries: int, tma: bool = False) -> tuple[int, int, int]:
        return launch(L, append, fold.ENTRIES_NONE if entries == fold.ENTRIES_TOKEN else entries, tma)

    fold.fold_launch = patched
    try:
        yield
    finally:
        fold.fold_launch = launch


def fold_step_error(pools, token, slots: torch.Tensor, L: int) -> float:
    """Max relative difference of S0 and the output between the two fold steps, each run from the same pools."""
    saved = [t.clone() for t in pools.args()]
    results = []
    for context in (contextlib.nullcontext(), pipelined_token_fold()):
        for tensor, copy in zip(pools.args(), saved, strict=True):
            tensor.copy_(copy)
        pools.buf_len[slots] = L - 1
        with context:
            out, _ = gdn_decode_commit(*token, pools.state, slots, *pools.args()[1:], slots, L, flushed=False)
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
        decode = [partial(gdn_decode_commit, *token[r], pools.state, slots[r], *pools.args()[1:], slots[r], L,
                          flushed=False) for r in range(rotations)]
        pools.buf_len.fill_((L - 2) // 2)
        step = time_calls(decode) * 1e6
        pools.buf_len.fill_(L - 1)
        looped = time_calls(decode) * 1e6
        with pipelined_token_fold():
            pipelined = time_calls(decode) * 1e6
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
