"""Triton kernels that lay a MoE step's token-expert assignments out in blocks of BLOCK_M rows of one expert each,
on the device: no host synchronisation and shapes that depend on the sizes only, so a step is captured in a CUDA
graph. The expert GEMMs (experts.py) run one program per (block, column tile) on this layout.

Assignment a = token * k + j (top_index flattened) goes to expert e = top_index[token, j]. Expert e's assignments
fill cdiv(count_e, BM) consecutive blocks in assignment order; the blocks of expert 0 come first. Outputs:
- sorted_rows [NB * BM] int32: the assignment at each slot (slots past an expert's count are not written);
- block_expert [NB] int32: each block's expert, -1 for the unused blocks at the end;
- block_rows [NB] int32: how many of a block's BM slots hold assignments (0 for unused blocks).
NB = (R + min(E, R) (BM - 1)) // BM bounds the blocks for any routing of R = N k assignments to E experts (each
touched expert wastes at most BM - 1 slots), so the grids do not depend on the routing.

Two launches, both over chunks of CHUNK assignments: counts (one histogram per chunk) and slots (a chunk's rows go
to their expert's first slot + that expert's rows in earlier chunks + its earlier rows in this chunk; the block
table is shared out among the programs). When one chunk holds every assignment (decode steps) the slots launch
counts for itself and the counts launch is skipped. Histograms and ranks are one-hot [CHUNK, EP] reductions
(EP = E rounded up to a power of two), which cost no atomics and keep the layout deterministic.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

ONE_HOT = 16384   # elements of a chunk's one-hot [CHUNK, EP] tile: 64 int32 registers a thread on 8 warps
MAX_CHUNK = 256
COUNT_ROWS = 16   # chunk histograms summed per step by each slots program
TABLE_BLOCKS = 32  # block-table entries per step


class ExpertLayout(NamedTuple):
    """The block layout of one MoE step (module docstring); block_m is its BM."""

    sorted_rows: torch.Tensor
    block_expert: torch.Tensor
    block_rows: torch.Tensor
    block_m: int


def num_blocks(num_rows: int, num_experts: int, block_m: int) -> int:
    """Blocks of block_m slots that hold num_rows assignments to num_experts experts under any routing."""
    return (num_rows + min(num_experts, num_rows) * (block_m - 1)) // block_m


# The counts below (R assignments, NB blocks, P chunks) follow the step's tokens: Triton would compile a kernel apart
# for each that is a multiple of 16 or not (a 2100-token prompt on the H100 compiled expert_slots_kernel again, 1.1 s,
# after serve's warm-up had run 3000 and 3008: benchmarks/results/first_use_h200_2026-12-06.md), and they only bound
# loops and masks, so they are not specialised (tests/test_prefill_compiles.py).
@triton.jit(do_not_specialize=["R"])
def expert_counts_kernel(
    expert,         # [R] int32 / int64
    counts,         # [P, EP] int32: assignments of chunk p per expert
    R,
    EP: tl.constexpr,
    CHUNK: tl.constexpr,
):
    i_p = tl.program_id(0)
    o_r = i_p * CHUNK + tl.arange(0, CHUNK)
    o_e = tl.arange(0, EP)
    b_e = tl.load(expert + o_r, mask=o_r < R, other=EP).to(tl.int32)      # EP: no expert's column
    b_hot = (b_e[:, None] == o_e[None, :]).to(tl.int32)                  # [CHUNK, EP]
    tl.store(counts + i_p * EP + o_e, tl.sum(b_hot, 0))


@triton.jit(do_not_specialize=["R", "NB", "P"])
def expert_slots_kernel(
    expert,         # [R] int32 / int64
    counts,         # [P, EP] int32 (read when COUNTED)
    sorted_rows,    # [NB * BM] int32
    block_expert,   # [NB] int32
    block_rows,     # [NB] int32
    R,
    NB,
    P,
    E: tl.constexpr,
    EP: tl.constexpr,
    CHUNK: tl.constexpr,
    BM: tl.constexpr,
    COUNTED: tl.constexpr,      # P > 1: the chunks' histograms come from expert_counts_kernel
    QB: tl.constexpr,
    TB: tl.constexpr,
):
    i_p = tl.program_id(0)
    o_e = tl.arange(0, EP)
    o_r = i_p * CHUNK + tl.arange(0, CHUNK)
    m_r = o_r < R
    b_e = tl.load(expert + o_r, mask=m_r, other=EP).to(tl.int32)
    b_hot = (b_e[:, None] == o_e[None, :]).to(tl.int32)                  # [CHUNK, EP]
    if COUNTED:
        b_total = tl.zeros([EP], dtype=tl.int32)                           # assignments per expert
        b_before = tl.zeros([EP], dtype=tl.int32)                          # ... in the chunks before this one
        for i_q in range(0, P, QB):
            o_q = i_q + tl.arange(0, QB)
            b_c = tl.load(counts + o_q[:, None] * EP + o_e[None, :], mask=(o_q < P)[:, None], other=0)
            b_total += tl.sum(b_c, 0)
            b_before += tl.sum(tl.where((o_q < i_p)[:, None], b_c, 0), 0)
    else:
        b_total = tl.sum(b_hot, 0)
        b_before = tl.zeros([EP], dtype=tl.int32)
    b_blocks = (b_total + BM - 1) // BM
    b_end = tl.cumsum(b_blocks, 0)                                         # [EP] one past each expert's blocks
    b_start = b_end - b_blocks
    # a row's slot: its expert's first slot + the expert's rows in earlier chunks + its earlier rows in this chunk
    b_rank = tl.sum(b_hot * tl.cumsum(b_hot, 0), 1) - 1                    # [CHUNK]
    b_base = tl.sum(b_hot * (b_start * BM + b_before)[None, :], 1)
    tl.store(sorted_rows + b_base + b_rank, o_r.to(tl.int32), mask=m_r)
    # block table: program p writes entries p TB .. p TB + TB - 1, then P TB further on, ...
    for i_t in range(i_p * TB, NB, P * TB):
        o_b = i_t + tl.arange(0, TB)
        b_owner = tl.sum((b_end[None, :] <= o_b[:, None]).to(tl.int32), 1)   # [TB] expert whose blocks hold o_b
        b_sel = (b_owner[:, None] == o_e[None, :]).to(tl.int32)            # [TB, EP]; no column past the last block
        b_first = tl.sum(b_sel * b_start[None, :], 1)
        b_count = tl.sum(b_sel * b_total[None, :], 1)
        b_n = tl.minimum(b_count - (o_b - b_first) * BM, BM)
        b_used = b_owner < E
        m_b = o_b < NB
        tl.store(block_expert + o_b, tl.where(b_used, b_owner, -1), mask=m_b)
        tl.store(block_rows + o_b, tl.where(b_used, b_n, 0), mask=m_b)


def expert_layout(top_index: torch.Tensor, num_experts: int, block_m: int) -> ExpertLayout:
    """top_index [N, k] int32 / int64 in [0, E) (not validated) -> the block layout (module docstring) on its
    device, for blocks of block_m (a power of two >= 16) slots."""
    expert = top_index.reshape(-1)
    num_rows = expert.shape[0]
    device = expert.device
    nb = num_blocks(num_rows, num_experts, block_m)
    sorted_rows = torch.empty(nb * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(nb, dtype=torch.int32, device=device)
    block_rows = torch.empty(nb, dtype=torch.int32, device=device)
    layout = ExpertLayout(sorted_rows, block_expert, block_rows, block_m)
    if num_rows == 0:
        return layout
    ep = max(16, triton.next_power_of_2(num_experts))
    chunk = max(16, min(MAX_CHUNK, ONE_HOT // ep, triton.next_power_of_2(num_rows)))
    p = triton.cdiv(num_rows, chunk)
    counts = torch.empty(p, ep, dtype=torch.int32, device=device) if p > 1 else block_rows  # (stand-in: not read)
    if p > 1:
        expert_counts_kernel[(p,)](expert, counts, num_rows, EP=ep, CHUNK=chunk, num_warps=8)
    expert_slots_kernel[(p,)](
        expert, counts, sorted_rows, block_expert, block_rows, num_rows, nb, p,
        E=num_experts, EP=ep, CHUNK=chunk, BM=block_m, COUNTED=p > 1, QB=COUNT_ROWS, TB=TABLE_BLOCKS, num_warps=8,
    )
    return layout
