"""Triton kernel for the per-row-expert linear map y[r] = weight[expert[r]] @ x[r] (grouped_linear_ref gives the
contract), with static shapes and no host synchronisation, so that MoE steps can be captured in CUDA graphs.

1. expert_blocks (torch ops, no .item()): rows sorted by expert and laid out in blocks of BLOCK_M rows that each
   belong to one expert (an expert's last block padded with the sentinel row R). The layout has room for the
   worst case, cdiv(R, BLOCK_M) + E blocks, so its size depends on R and E only; unused blocks get expert -1.
   One layout serves both GEMMs of an expert MLP.
2. grouped_linear_kernel, grid (block, N block): a program reads its block's expert and rows, multiplies the
   gathered [BLOCK_M, K] rows of x with the expert's [K, BLOCK_N] weight tile, and scatters the rows back;
   programs of unused blocks return at once.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

BLOCK_M = 16   # rows per block: decode steps route few rows to each expert
BLOCK_N = 64
BLOCK_K = 64
NUM_WARPS = 4
FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16)
# Tiles are multiplied in fp32 registers. bf16 / fp16 values are exact in TF32, so TF32 products (tensor cores)
# lose nothing for them; fp32 inputs multiply in full fp32.
PRECISION = {torch.float32: "ieee", torch.bfloat16: "tf32", torch.float16: "tf32"}


@dataclass(frozen=True)
class ExpertBlocks:
    """rows: [num_blocks * block_m] int64 row indices sorted by expert (R = padding); block_expert: [num_blocks]
    int64, the expert of each block (-1 = unused); num_rows: R."""

    rows: torch.Tensor
    block_expert: torch.Tensor
    num_rows: int
    block_m: int


def expert_blocks(expert: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> ExpertBlocks:
    """expert [R] int64 in [0, E) -> the block layout (module docstring), computed on expert's device."""
    num_rows = expert.shape[0]
    device = expert.device
    num_blocks = triton.cdiv(num_rows, block_m) + num_experts
    counts = torch.zeros(num_experts, dtype=torch.long, device=device).scatter_add_(
        0, expert, torch.ones_like(expert))                                   # [E] rows per expert
    blocks = (counts + block_m - 1) // block_m                                  # [E] blocks per expert
    block_end = blocks.cumsum(0)                                                # [E]
    order = expert.argsort(stable=True)                                         # [R] rows grouped by expert
    sorted_expert = expert[order]
    first_sorted = counts.cumsum(0) - counts                                    # [E] where each group starts
    rank = torch.arange(num_rows, device=device) - first_sorted[sorted_expert]  # place within the expert
    slot = (block_end - blocks)[sorted_expert] * block_m + rank
    rows = torch.full((num_blocks * block_m,), num_rows, dtype=torch.long, device=device)
    rows[slot] = order
    block_expert = torch.searchsorted(block_end, torch.arange(num_blocks, device=device), right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return ExpertBlocks(rows, block_expert, num_rows, block_m)


@triton.jit
def grouped_linear_kernel(
    x,              # [R, K]
    weight,         # [E, N, K]
    y,              # [R, N]
    rows,           # [num_blocks * BM] int64, R = padding
    block_expert,   # [num_blocks] int64, -1 = unused block
    R,
    N: tl.constexpr,
    K: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_m, i_n = tl.program_id(0), tl.program_id(1)
    i_e = tl.load(block_expert + i_m)
    if i_e >= 0:
        o_r = tl.load(rows + i_m * BM + tl.arange(0, BM))
        m_r = o_r < R
        o_n = i_n * BN + tl.arange(0, BN)
        m_n = o_n < N
        b_y = tl.zeros([BM, BN], dtype=tl.float32)
        for i_k in range(0, K, BK):
            o_k = i_k + tl.arange(0, BK)
            m_k = o_k < K
            b_x = tl.load(x + o_r[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :],
                          other=0.).to(tl.float32)
            b_w = tl.load(weight + (i_e * N + o_n[None, :]) * K + o_k[:, None], mask=m_k[:, None] & m_n[None, :],
                          other=0.).to(tl.float32)                                              # [BK, BN]
            b_y += tl.dot(b_x, b_w, input_precision=PRECISION)
        tl.store(y + o_r[:, None] * N + o_n[None, :], b_y.to(y.dtype.element_ty), mask=m_r[:, None] & m_n[None, :])


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor,
                   blocks: ExpertBlocks | None = None) -> torch.Tensor:
    """y [R, N] = weight[expert[r]] @ x[r] in x's dtype (fp32 accumulation; fp32 inputs multiply in full fp32).

    x: [R, K] fp32 / bf16 / fp16; weight: [E, N, K] of x's dtype; expert: [R] int64 in [0, E) (not validated);
    blocks: expert_blocks(expert, E), to share between the two GEMMs of an expert MLP (computed when None).
    """
    if x.dim() != 2 or weight.dim() != 3 or weight.shape[2] != x.shape[1]:
        raise ValueError(f"x must be [R, K] and weight [E, N, K]; got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.dtype not in FLOAT_INPUTS or weight.dtype != x.dtype:
        raise ValueError(f"x and weight must share one of {FLOAT_INPUTS}; got {x.dtype} and {weight.dtype}")
    if expert.shape != (x.shape[0],):
        raise ValueError(f"expert must be [R] = [{x.shape[0]}], got {tuple(expert.shape)}")
    x, weight = x.contiguous(), weight.contiguous()
    num_experts, n, k = weight.shape
    if blocks is None:
        blocks = expert_blocks(expert, num_experts)
    y = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    num_blocks = blocks.block_expert.shape[0]
    grouped_linear_kernel[(num_blocks, triton.cdiv(n, BLOCK_N))](
        x, weight, y, blocks.rows, blocks.block_expert, blocks.num_rows,
        N=n, K=k, BM=blocks.block_m, BN=BLOCK_N, BK=BLOCK_K,
        PRECISION=PRECISION[x.dtype], num_warps=NUM_WARPS,
    )
    return y
