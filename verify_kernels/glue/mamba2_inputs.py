"""Triton kernel for the Mamba2 mixer's inputs, as mamba2_inputs_ref (naive.py gives the contract).

One launch instead of about ten (three splits made contiguous and cast, dt's cast, bias, softplus and clamp, A's
cast, exp and negation, D's cast). Programs first cover [BLOCK_R rows, BLOCK_D channels] tiles of the conv output,
storing each channel to x (fp32), B or C (the conv output's dtype) by its range, contiguous; then flat (token, head)
blocks of dt; the first dt program also writes A = -exp(A_log) and D in fp32. The tiles' count NC is a runtime
argument: it follows the step's rows, and as a constexpr each new prompt length (a prefill's rows) compiled the kernel
again on a GPU (tests/test_prefill_compiles.py).
"""

import torch
import triton
import triton.language as tl

from verify_kernels.glue.rows import as_rows, check_vector, tile_rows

BLOCK_D = 1024   # channels a program takes at most
DT_BLOCK = 1024  # (token, head) pairs of a dt program
NUM_WARPS = 4


@triton.jit(do_not_specialize=["N", "NC"])
def mamba2_inputs_kernel(
    xbc, dt, dt_bias, A_log, D, x, dt_out, bm, cm, A_out, D_out, stride_x, stride_dt, N, dt_min, dt_max, NC,
    NH: tl.constexpr, XD: tl.constexpr, GD: tl.constexpr, NCD: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, DT_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr,
):
    i_p = tl.program_id(0)
    if i_p < NC:  # conv-output tiles: NCD channel blocks per row block
        o_r = (i_p // NCD).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        o_d = (i_p % NCD) * BLOCK_D + tl.arange(0, BLOCK_D)
        m_r = (o_r < N)[:, None]
        b_v = tl.load(xbc + o_r[:, None] * stride_x + o_d[None, :], mask=m_r & (o_d < XD + 2 * GD)[None, :],
                      other=0.0).to(tl.float32)
        tl.store(x + o_r[:, None] * XD + o_d[None, :], b_v, mask=m_r & (o_d < XD)[None, :])
        o_b = o_d - XD
        b_kc = b_v.to(bm.dtype.element_ty)  # (B and C in bm's dtype: the conv output's, or fp32 as asked)
        tl.store(bm + o_r[:, None] * GD + o_b[None, :], b_kc, mask=m_r & ((o_b >= 0) & (o_b < GD))[None, :])
        o_c = o_d - XD - GD
        tl.store(cm + o_r[:, None] * GD + o_c[None, :], b_kc, mask=m_r & ((o_c >= 0) & (o_c < GD))[None, :])
    else:
        i_q = i_p - NC
        o = i_q.to(tl.int64) * DT_BLOCK + tl.arange(0, DT_BLOCK)  # flat (token, head) index
        m = o < N * NH
        o_t, o_h = o // NH, o % NH
        b_x = tl.load(dt + o_t * stride_dt + o_h, mask=m, other=0.0).to(tl.float32)
        b_x += tl.load(dt_bias + o_h, mask=m, other=0.0).to(tl.float32)
        # softplus as torch's (threshold 20), then the configured limits
        b_sp = tl.where(b_x > 20.0, b_x, tl.log(1.0 + tl.exp(tl.minimum(b_x, 20.0))))
        tl.store(dt_out + o, tl.minimum(tl.maximum(b_sp, dt_min), dt_max), mask=m)
        if i_q == 0:
            o_n = tl.arange(0, BLOCK_H)  # every head once (a new name: Triton keeps one type per name)
            m_n = o_n < NH
            tl.store(A_out + o_n, -tl.exp(tl.load(A_log + o_n, mask=m_n, other=0.0).to(tl.float32)), mask=m_n)
            tl.store(D_out + o_n, tl.load(D + o_n, mask=m_n, other=0.0).to(tl.float32), mask=m_n)


def mamba2_inputs(xbc: torch.Tensor, dt: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor, D: torch.Tensor,
                  num_heads: int, head_dim: int, n_groups: int, state_size: int,
                  dt_limit: tuple[float, float], bc_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
    """xbc [..., NH P + 2 NG N] (the conv output; rows may be strided), dt [..., NH] (rows may be strided, e.g. a
    split of in_proj's output), dt_bias, A_log, D [NH] -> contiguous fp32 x [..., NH, P], dt [..., NH] =
    clamp(softplus(dt + dt_bias), *dt_limit), B [..., NG, N] and C [..., NG, N] in bc_dtype (default: xbc's;
    mamba2_inputs_ref says why), fp32 A = -exp(A_log) [NH], D [NH]."""
    rows, dt_rows = as_rows("xbc", xbc), as_rows("dt", dt)
    NH, XD, GD = num_heads, num_heads * head_dim, n_groups * state_size
    if rows.shape[1] != XD + 2 * GD or dt_rows.shape != (rows.shape[0], NH) or dt.shape[:-1] != xbc.shape[:-1]:
        raise ValueError(f"xbc [..., {XD} + 2 * {GD}] and dt [..., {NH}] with the same leading dims expected, got "
                         f"{tuple(xbc.shape)} and {tuple(dt.shape)}")
    for name, t in (("dt_bias", dt_bias), ("A_log", A_log), ("D", D)):
        check_vector(name, t, NH)
    lead, device = xbc.shape[:-1], xbc.device
    x = torch.empty(*lead, NH, head_dim, dtype=torch.float32, device=device)
    bm = torch.empty(*lead, n_groups, state_size, dtype=bc_dtype or xbc.dtype, device=device)
    cm = torch.empty_like(bm)
    dt_out = torch.empty(*lead, NH, dtype=torch.float32, device=device)
    A_out = torch.empty(NH, dtype=torch.float32, device=device)
    D_out = torch.empty_like(A_out)
    N = rows.shape[0]
    block_d = min(BLOCK_D, triton.next_power_of_2(XD + 2 * GD))
    block_r = tile_rows(N, block_d)
    ncd = triton.cdiv(XD + 2 * GD, block_d)
    nc = triton.cdiv(N, block_r) * ncd
    mamba2_inputs_kernel[(nc + max(1, triton.cdiv(N * NH, DT_BLOCK)),)](
        rows, dt_rows, dt_bias, A_log, D, x, dt_out, bm, cm, A_out, D_out, rows.stride(0), dt_rows.stride(0), N,
        float(dt_limit[0]), float(dt_limit[1]), nc, NH=NH, XD=XD, GD=GD, NCD=ncd, BLOCK_R=block_r,
        BLOCK_D=block_d, DT_BLOCK=DT_BLOCK, BLOCK_H=triton.next_power_of_2(NH), num_warps=NUM_WARPS,
    )
    return x, dt_out, bm, cm, A_out, D_out
