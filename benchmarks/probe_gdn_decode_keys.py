"""Probe: does the GDN decode run slower on bf16 q and k than on fp32? The kernel table of 2026-12-04 (sitting
11:40 UTC, branch gdn-exact-qk, which gives the KVBuffer bf16 keys) read the decode 8-12% slower than the table
before (fp32 keys), its S0-only read 3.52 against 3.82 TB/s, while sm_90 PTX of the two differs only in the keys'
loads and conversions. This times, in one process at Qwen3.5-9B shapes (CUDA graphs, states rotated over >= 2 GiB):
the S0-only decode and the decode + commit at the mean buffer fill, on bf16 and on fp32 keys, in both orders.

    python -m benchmarks.probe_gdn_decode_keys --batches 64 256
"""

from __future__ import annotations

import argparse
from functools import partial

import torch

from benchmarks import gdn
from benchmarks.timing import time_calls
from verify_kernels.gdn import gdn_decode, gdn_decode_commit


def calls(op, token, pools, slots, *tail) -> list:
    """op over each rotation's token (q, k, v, g, beta) and slots."""
    return [partial(op, *token[r], pools.state, slots[r], *pools.args()[1:], slots[r], *tail)
            for r in range(len(token))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    args = parser.parse_args()
    L = gdn.ENGINE_FLUSH_LENGTH
    print("| batch | keys | order | S0 read us | decode + commit us |\n|---|---|---|---|---|")
    for batch in args.batches:
        rotations, pools, x, slots = gdn.decode_workload(batch, L)
        keys = {"bf16": (x.q, x.k), "fp32": (x.q32, x.k32)}
        for order in (("bf16", "fp32"), ("fp32", "bf16")):
            for name in order:
                q, k = keys[name]
                token = [(q[r, :, 0], k[r, :, 0], x.v[r, :, 0], x.g[r, :, 0], x.beta[r, :, 0])
                         for r in range(rotations)]

                pools.buf_len.fill_(0)
                read_us = time_calls(calls(gdn_decode, token, pools, slots)) * 1e6
                pools.buf_len.fill_((L - 2) // 2)
                step_us = time_calls(calls(gdn_decode_commit, token, pools, slots, L)) * 1e6
                print(f"| {batch} | {name} | {' then '.join(order)} | {read_us:.1f} | {step_us:.1f} |", flush=True)
        del pools, x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
