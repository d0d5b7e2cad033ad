"""Triton gated RMS norm over groups of channels, as rms_norm_gated_ref (naive.py gives the contract): Qwen3.5's
GDN output norm (per value head, norm then * silu(z)) and Nemotron-H's Mamba2 output norm (x * silu(z), then a norm
per group of heads).

A program takes BLOCK_Q consecutive (row, group) pairs (rows.tile_rows): it loads a [BLOCK_Q, GROUP] tile of x (the
mixer's fp32 output, rounded to the model dtype as the models cast it) and of the gate (a strided split of a
projection is fine), reduces each group, and writes the model-dtype output, rounding where transformers does
(module docstring of naive.py). Torch runs this as about twelve kernels (casts, pow, mean, rsqrt, silu, products)
with fp32 intermediates of the full width; the kernel reads x and the gate once and writes once.

Why not fla's gated norms: fla.modules.FusedRMSNormGated has no groups and autotunes on first call;
fla.modules.layernorm_gated.rmsnorm_fn (mamba_ssm's: groups, norm_before_gate) copies strided inputs to contiguous
ones (the Mamba2 gate is a split of in_proj's output), keeps w * norm(x) in fp32 where transformers rounds it, wants
a weight of the full width, and writes in x's dtype, so the mixers' fp32 output would still need a cast kernel
first. benchmarks/glue.py times rmsnorm_fn beside this kernel where fla is installed.
"""

import torch
import triton
import triton.language as tl

from verify_kernels.glue.rows import as_rows, check_vector, row_warps, tile_rows


@triton.jit(do_not_specialize=["NQ"])
def rms_norm_gated_kernel(
    x, gate, weight, y, stride_x, stride_g, NQ, eps,
    NG: tl.constexpr, GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr,
    SHARED_WEIGHT: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr,
):
    o_q = tl.program_id(0).to(tl.int64) * BLOCK_Q + tl.arange(0, BLOCK_Q)  # flat (row, group) pairs
    o_r, o_g = o_q // NG, o_q % NG
    o_c = tl.arange(0, BLOCK_C)
    m_c = o_c < GROUP
    m = (o_q < NQ)[:, None] & m_c[None, :]
    o_in = o_g[:, None] * GROUP + o_c[None, :]  # channel within the row
    dtype = y.dtype.element_ty
    b_x = tl.load(x + o_r[:, None] * stride_x + o_in, mask=m, other=0.0).to(dtype).to(tl.float32)
    b_z = tl.load(gate + o_r[:, None] * stride_g + o_in, mask=m, other=0.0).to(tl.float32)
    b_z = b_z * tl.sigmoid(b_z)
    if not NORM_BEFORE_GATE:
        b_x = b_x * b_z
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, 1) / GROUP + eps)
    b_n = (b_x * b_rstd[:, None]).to(dtype).to(tl.float32)
    if SHARED_WEIGHT:
        b_w = tl.load(weight + o_c, mask=m_c, other=0.0).to(tl.float32)[None, :]
    else:
        b_w = tl.load(weight + o_in, mask=m, other=0.0).to(tl.float32)
    b_y = b_w * b_n
    if NORM_BEFORE_GATE:
        b_y = b_y.to(dtype).to(tl.float32) * b_z
    tl.store(y + o_q[:, None] * GROUP + o_c[None, :], b_y.to(dtype), mask=m)


def rms_norm_gated(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int,
                   norm_before_gate: bool) -> torch.Tensor:
    """x [..., D] (fp32 or the model dtype), gate [..., D] (the model dtype; rows may be strided), weight
    [group_size] (shared by the groups) or [D] -> [..., D] contiguous in gate.dtype.

    norm_before_gate: (w * norm(x)) * silu(gate) per group (Qwen3.5 GDN); else w * norm(x * silu(gate))
    (Nemotron-H Mamba2). D must be a multiple of group_size."""
    x_rows, g_rows = as_rows("x", x), as_rows("gate", gate)
    if x.shape != gate.shape:
        raise ValueError(f"x {tuple(x.shape)} and gate {tuple(gate.shape)} must have one shape")
    D = x_rows.shape[1]
    if group_size <= 0 or D % group_size:
        raise ValueError(f"the width {D} must be a multiple of group_size {group_size}")
    check_vector("weight", weight, (group_size, D))
    y = torch.empty(x.shape, dtype=gate.dtype, device=x.device)
    if x_rows.numel():
        num_groups = D // group_size
        pairs = x_rows.shape[0] * num_groups
        block_c = triton.next_power_of_2(group_size)
        block_q = tile_rows(pairs, block_c)
        rms_norm_gated_kernel[(triton.cdiv(pairs, block_q),)](
            x_rows, g_rows, weight, y, x_rows.stride(0), g_rows.stride(0), pairs, eps,
            NG=num_groups, GROUP=group_size, BLOCK_Q=block_q, BLOCK_C=block_c,
            SHARED_WEIGHT=weight.numel() == group_size and num_groups > 1, NORM_BEFORE_GATE=norm_before_gate,
            num_warps=row_warps(block_q * block_c),
        )
    return y
