"""Triton activations, as act_mul_ref and relu2_ref (naive.py gives the contract): SwiGLU's silu(gate) * up,
Qwen3.5's attention output gate (out * sigmoid(gate)) and Nemotron-H's relu(x)^2.

Grid (row block, channel block): blocks of up to 1024 channels, several rows of narrow tensors (rows.tile_rows);
rows of any stride (gate and up are often two halves of one projection's output). The activation is rounded to the
model dtype before the product, as two torch ops round, so the result is the reference's to the bit; one kernel and
no intermediate instead of two kernels and a full-width temporary.

Why not fla.modules.activations.swiglu_fwd: it reads the halves in place too, but multiplies silu(gate) by up in
fp32 where two torch ops (and transformers) round silu(gate) to the model dtype first, and it autotunes over 30
configurations on its first call for each width (to be kept out of CUDA-graph capture). benchmarks/glue.py times it
beside this kernel where fla is installed.
"""

import torch
import triton
import triton.language as tl

from verify_kernels.glue.rows import as_rows, tile_rows

BLOCK_D = 1024  # channels a program takes at most
NUM_WARPS = 4
ACTS = {"silu": 0, "sigmoid": 1, "relu2": 2}


@triton.jit(do_not_specialize=["N"])
def activation_kernel(gate, up, y, stride_g, stride_u, N, D: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_D: tl.constexpr, ACT: tl.constexpr):
    i_r, i_d = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o_r = i_r * BLOCK_R + tl.arange(0, BLOCK_R)
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    m = (o_r < N)[:, None] & (o_d < D)[None, :]
    dtype = y.dtype.element_ty
    b_g = tl.load(gate + o_r[:, None] * stride_g + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    if ACT == 0:
        b_y = (b_g * tl.sigmoid(b_g)).to(dtype).to(tl.float32)
    elif ACT == 1:
        b_y = tl.sigmoid(b_g).to(dtype).to(tl.float32)
    else:
        b_y = tl.maximum(b_g, 0.0)
        b_y = b_y * b_y
    if ACT < 2:
        b_y = b_y * tl.load(up + o_r[:, None] * stride_u + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(y + o_r[:, None] * D + o_d[None, :], b_y.to(dtype), mask=m)


def activation_fwd(gate: torch.Tensor, up: torch.Tensor | None, act: str) -> torch.Tensor:
    """Launcher: checks, allocation, grid."""
    g_rows = as_rows("gate", gate)
    u_rows = g_rows
    if up is not None:
        if up.shape != gate.shape or up.dtype != gate.dtype:
            raise ValueError(f"up must match gate {tuple(gate.shape)} {gate.dtype}, got {tuple(up.shape)} {up.dtype}")
        u_rows = as_rows("up", up)
    y = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if g_rows.numel():
        N, D = g_rows.shape
        block_d = min(BLOCK_D, triton.next_power_of_2(D))
        block_r = tile_rows(N, block_d)
        activation_kernel[(triton.cdiv(N, block_r), triton.cdiv(D, block_d))](
            g_rows, u_rows, y, g_rows.stride(0), u_rows.stride(0), N, D=D, BLOCK_R=block_r, BLOCK_D=block_d,
            ACT=ACTS[act], num_warps=NUM_WARPS,
        )
    return y


def act_mul(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up: gate, up [..., D] of one dtype (rows may be strided) -> [..., D] contiguous; act "silu" or
    "sigmoid"."""
    if act not in ("silu", "sigmoid"):
        raise ValueError(f"act must be 'silu' or 'sigmoid', got {act!r}")
    return activation_fwd(gate, up, act)


def relu2(x: torch.Tensor) -> torch.Tensor:
    """relu(x)^2: x [..., D] (rows may be strided) -> [..., D] contiguous in x.dtype."""
    return activation_fwd(x, None, "relu2")
