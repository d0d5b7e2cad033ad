"""Probe: the Mamba2 verify kernels with B and C in bf16 (as the glue leaves them since 2026-12-04) against the same
values in fp32, ours (mamba2_verify: products that skip the exact operands' remainders) and the intermediate-state
baseline's (mamba2_intermediate, which only loads them), in turn twice in one process, so that a difference is not
one run's noise. Nemotron-3-Nano shapes, 5-chains over 8 buffered entries, CUDA graphs, inputs rotated over >= 2 GiB.

    python -m benchmarks.probe_mamba2_inputs --batches 64 256
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import partial

import torch

from benchmarks import mamba2
from benchmarks.inputs import Pools, rotation_slots
from benchmarks.timing import rotations_for, time_calls
from verify_kernels.mamba2 import mamba2_verify
from verify_kernels.tree import ancestor_mask


@dataclass
class Inputs:
    x: torch.Tensor
    dt: torch.Tensor
    bm: torch.Tensor
    cm: torch.Tensor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    args = parser.parse_args()
    rows = []
    for batch in args.batches:
        nodes = len(mamba2.VERIFY_TREES["chain5"])
        rotations = rotations_for(batch * mamba2.STATE_BYTES)
        tokens = mamba2.TokenInputs(rotations, batch, nodes)
        variants = {"bf16": Inputs(tokens.x, tokens.dt, tokens.bm, tokens.cm),
                    "fp32": Inputs(tokens.x, tokens.dt, tokens.bm32, tokens.cm32)}
        a_neg, d_skip = mamba2.layer_weights()
        parents = torch.tensor(mamba2.VERIFY_TREES["chain5"], device="cuda").expand(batch, nodes).contiguous()
        num_nodes = torch.full((batch,), nodes, device="cuda")
        ancestors = ancestor_mask(parents, num_nodes)
        slots = [rotation_slots(r, batch) for r in range(rotations)]
        pools = Pools.make(rotations * batch, mamba2.ENGINE_FLUSH_LENGTH, (mamba2.NH, mamba2.P, mamba2.N),
                           (mamba2.NG, mamba2.N), (mamba2.NH, mamba2.P), mamba2.NH)
        pools.buf_len.fill_(mamba2.VERIFY_FILL)
        for attempt in (1, 2):
            for name, x in variants.items():
                ours = time_calls([
                    partial(mamba2_verify, x.x[r], x.dt[r], a_neg, x.bm[r], x.cm[r], d_skip, parents, num_nodes,
                            pools.state, slots[r], *pools.args()[1:], slots[r], ancestors=ancestors)
                    for r in range(rotations)])
                base = mamba2._intermediate_verify_seconds(x, a_neg, d_skip, parents, num_nodes, slots, rotations,
                                                           batch, nodes)
                rows.append((batch, attempt, name, ours * 1e6, base * 1e6))
                print(rows[-1], flush=True)
        del pools, tokens, variants
        torch.cuda.empty_cache()
    print("\n| batch | attempt | B and C | ours us | intermediate-state us |\n|---|---|---|---|---|")
    for batch, attempt, name, ours, base in rows:
        print(f"| {batch} | {attempt} | {name} | {ours:.1f} | {base:.1f} |")


if __name__ == "__main__":
    main()
