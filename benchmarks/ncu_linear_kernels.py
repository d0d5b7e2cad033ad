"""Each linear-state kernel launched twice at batch 256 (the first launch compiles), for Nsight Compute: GDN flush,
decode + commit and 4-chain verify at Qwen3.5-9B shapes; Mamba2 decode + commit and 5-chain verify at
Nemotron-3-Nano's. Buffers hold 7-16 entries as in the engine. The H200 run of 2026-12-03
(benchmarks/results/profile_h200/ncu_linear_kernels_b256_2026-12-03.csv):

    ncu --clock-control none --set full -k "regex:gdn_|mamba2_" -o ops python -m benchmarks.ncu_linear_kernels
    ncu --import ops.ncu-rep --page raw --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,\\
        dram__bytes_write.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
"""

from __future__ import annotations

import torch

from benchmarks import gdn, mamba2
from benchmarks.inputs import Pools, rotation_slots
from verify_kernels.gdn import gdn_decode_commit, gdn_flush, gdn_verify
from verify_kernels.mamba2 import mamba2_decode_commit, mamba2_verify
from verify_kernels.tree import ancestor_mask

BATCH = 256
FLUSH_LENGTH = 16


def chain(nodes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """parents [B, nodes], num_nodes [B] and the ancestor mask of a chain per row."""
    parents = torch.arange(-1, nodes - 1, device="cuda").expand(BATCH, nodes).contiguous()
    num_nodes = torch.full((BATCH,), nodes, device="cuda")
    return parents, num_nodes, ancestor_mask(parents, num_nodes)


def gdn_ops(slots: torch.Tensor) -> None:
    pools = Pools.make(BATCH, 32, (gdn.HV, gdn.K, gdn.V), (gdn.H, gdn.K), (gdn.HV, gdn.V), gdn.HV)
    x = gdn.TokenInputs(1, BATCH, 4)
    token = [t[0, :, 0].contiguous() for t in (x.q, x.k, x.v, x.g, x.beta)]
    parents, num_nodes, ancestors = chain(4)
    for _ in range(2):
        pools.buf_len.fill_(FLUSH_LENGTH)
        gdn_flush(pools.state, slots, *pools.args()[1:], slots)
        pools.buf_len.fill_(7)
        gdn_decode_commit(*token, pools.state, slots, *pools.args()[1:], slots, FLUSH_LENGTH)
        pools.buf_len.fill_(8)
        gdn_verify(x.q[0], x.k[0], x.v[0], x.g[0], x.beta[0], parents, num_nodes, pools.state, slots,
                   *pools.args()[1:], slots, ancestors=ancestors)
    torch.cuda.synchronize()


def mamba2_ops(slots: torch.Tensor) -> None:
    pools = Pools.make(BATCH, 32, (mamba2.NH, mamba2.P, mamba2.N), (mamba2.NG, mamba2.N), (mamba2.NH, mamba2.P),
                       mamba2.NH)
    x = mamba2.TokenInputs(1, BATCH, 5)
    token = [t[0, :, 0].contiguous() for t in (x.x, x.dt, x.bm, x.cm)]
    a_neg, d_skip = mamba2.layer_weights()
    parents, num_nodes, ancestors = chain(5)
    for _ in range(2):
        pools.buf_len.fill_(7)
        mamba2_decode_commit(token[0], token[1], a_neg, token[2], token[3], d_skip, pools.state, slots,
                             *pools.args()[1:], slots, FLUSH_LENGTH)
        pools.buf_len.fill_(8)
        mamba2_verify(x.x[0], x.dt[0], a_neg, x.bm[0], x.cm[0], d_skip, parents, num_nodes, pools.state, slots,
                      *pools.args()[1:], slots, ancestors=ancestors)
    torch.cuda.synchronize()


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("ncu_linear_kernels launches the Triton kernels for Nsight Compute: it needs a CUDA GPU")
    slots = rotation_slots(0, BATCH)
    gdn_ops(slots)
    torch.cuda.empty_cache()
    mamba2_ops(slots)


if __name__ == "__main__":
    main()
