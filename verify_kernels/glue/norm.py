"""Triton RMS norm with the residual add fused in, as rms_norm_ref / add_rms_norm_ref (naive.py gives the contract).

A program takes one row (token) at the models' widths, several rows of narrow ones (rows.tile_rows): it loads the
row (and the residual row), adds in fp32 and rounds the sum to the model dtype (the residual stream is kept in that
dtype, and transformers normalises the rounded sum), stores it as the new residual, reduces the sum of squares,
scales by the fp32 weight (1 + weight with offset) and rounds once. The unfused torch code reads and writes the row
about eight times (cast, pow, mean, rsqrt, two products, cast, add); this reads x (and the residual) once and
writes the output (and the new residual) once.

Why not fla.modules (RMSNorm with residual, prenorm): it normalises the fp32 sum rather than the rounded residual
and has no zero-centred weight, so bf16 models would drift from transformers by a rounding; its autotuning runs on
the first call of every row-count bucket, which would have to be kept out of CUDA-graph capture. The kernel is
short, takes strided rows, and benchmarks/glue.py times it next to fla's where fla is installed.
"""

import torch
import triton
import triton.language as tl

from verify_kernels.glue.rows import as_rows, check_vector, row_warps, tile_rows


@triton.jit(do_not_specialize=["N"])
def rms_norm_kernel(
    x, residual, weight, y, residual_out, stride_x, stride_r, N, eps,
    D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, OFFSET: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):
    o_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    m = (o_r < N)[:, None] & m_d[None, :]
    b_x = tl.load(x + o_r[:, None] * stride_x + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    o_out = o_r[:, None] * D + o_d[None, :]
    if HAS_RESIDUAL:
        b_x += tl.load(residual + o_r[:, None] * stride_r + o_d[None, :], mask=m, other=0.0).to(tl.float32)
        b_s = b_x.to(residual_out.dtype.element_ty)
        tl.store(residual_out + o_out, b_s, mask=m)
        b_x = b_s.to(tl.float32)
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, 1) / D + eps)
    b_w = tl.load(weight + o_d, mask=m_d, other=0.0).to(tl.float32)
    if OFFSET:
        b_w += 1.0
    tl.store(y + o_out, (b_x * b_rstd[:, None] * b_w[None, :]).to(y.dtype.element_ty), mask=m)


def rms_norm_fwd(x, residual, weight, eps, offset):
    """Launcher: checks, allocation, grid. Returns y (and the new residual with a residual) shaped as x."""
    rows = as_rows("x", x)
    N, D = rows.shape
    check_vector("weight", weight, D)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    residual_out, res_rows = y, rows
    if residual is not None:
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"residual must match x {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} "
                             f"{residual.dtype}")
        res_rows = as_rows("residual", residual)
        residual_out = torch.empty_like(y)
    if rows.numel():
        block_d = triton.next_power_of_2(D)
        block_r = tile_rows(N, block_d)
        rms_norm_kernel[(triton.cdiv(N, block_r),)](
            rows, res_rows, weight, y, residual_out, rows.stride(0), res_rows.stride(0), N, eps,
            D=D, BLOCK_R=block_r, BLOCK_D=block_d, OFFSET=offset, HAS_RESIDUAL=residual is not None,
            num_warps=row_warps(block_r * block_d),
        )
    return y if residual is None else (y, residual_out)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool) -> torch.Tensor:
    """x [..., D] (rows may be strided, unit channel stride), weight [D] -> x / rms(x) * w [..., D] in x.dtype,
    contiguous; w = 1 + weight with offset (Qwen3.5), else weight (Nemotron-H)."""
    return rms_norm_fwd(x, None, weight, eps, offset)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 offset: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [..., D] (same dtype) -> (rms_norm(s), s) with s = x + residual rounded to their dtype; both
    contiguous [..., D]."""
    return rms_norm_fwd(x, residual, weight, eps, offset)
