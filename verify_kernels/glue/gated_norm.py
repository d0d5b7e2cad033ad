"""Triton gated RMS norm over groups of channels, as rms_norm_gated_ref (naive.py gives the contract): Qwen3.5's
GDN output norm (per value head, norm then * silu(z)) and Nemotron-H's Mamba2 output norm (x * silu(z), then a norm
per group of heads).

Grid (row, block of groups): a program loads a [BLOCK_G, GROUP] tile of x (the mixer's fp32 output, rounded to the
model dtype as the models cast it) and of the gate (a strided split of a projection is fine), reduces each group,
and writes the model-dtype output, rounding where transformers does (module docstring of naive.py). Torch runs this
as about twelve kernels (casts, pow, mean, rsqrt, silu, products) with fp32 intermediates of the full width; the
kernel reads x and the gate once and writes once.

Why not fla's gated norms: fla.modules.FusedRMSNormGated has no groups and autotunes on first call;
fla.modules.layernorm_gated.rmsnorm_fn (mamba_ssm's: groups, norm_before_gate, strided rows) keeps w * norm(x) in
fp32 where transformers rounds it, wants a weight of the full width, and writes in x's dtype, so the mixers' fp32
output would still need a cast kernel first. benchmarks/glue.py times rmsnorm_fn beside this kernel where fla is
installed.
"""

import torch
import triton
import triton.language as tl

from verify_kernels.glue.rows import as_rows, check_vector, row_warps

TILE = 2048  # elements a program holds: BLOCK_G groups of the group size (rounded up to a power of two)


@triton.jit
def rms_norm_gated_kernel(
    x, gate, weight, y, stride_x, stride_g, eps,
    NG: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr,
    SHARED_WEIGHT: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr,
):
    i_r, i_g = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o_g = i_g * BLOCK_G + tl.arange(0, BLOCK_G)
    o_c = tl.arange(0, BLOCK_C)
    m_c = o_c < GROUP
    m = (o_g < NG)[:, None] & m_c[None, :]
    o = o_g[:, None] * GROUP + o_c[None, :]
    dtype = y.dtype.element_ty
    b_x = tl.load(x + i_r * stride_x + o, mask=m, other=0.0).to(dtype).to(tl.float32)
    b_z = tl.load(gate + i_r * stride_g + o, mask=m, other=0.0).to(tl.float32)
    b_z = b_z * tl.sigmoid(b_z)
    if not NORM_BEFORE_GATE:
        b_x = b_x * b_z
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, 1) / GROUP + eps)
    b_n = (b_x * b_rstd[:, None]).to(dtype).to(tl.float32)
    if SHARED_WEIGHT:
        b_w = tl.load(weight + o_c, mask=m_c, other=0.0).to(tl.float32)[None, :]
    else:
        b_w = tl.load(weight + o, mask=m, other=0.0).to(tl.float32)
    b_y = b_w * b_n
    if NORM_BEFORE_GATE:
        b_y = b_y.to(dtype).to(tl.float32) * b_z
    tl.store(y + i_r * (NG * GROUP) + o, b_y.to(dtype), mask=m)


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
        block_c = triton.next_power_of_2(group_size)
        block_g = min(triton.next_power_of_2(num_groups), max(1, TILE // block_c))
        rms_norm_gated_kernel[(x_rows.shape[0], triton.cdiv(num_groups, block_g))](
            x_rows, g_rows, weight, y, x_rows.stride(0), g_rows.stride(0), eps,
            NG=num_groups, GROUP=group_size, BLOCK_G=block_g, BLOCK_C=block_c,
            SHARED_WEIGHT=weight.numel() == group_size and num_groups > 1, NORM_BEFORE_GATE=norm_before_gate,
            num_warps=row_warps(block_g * block_c),
        )
    return y
