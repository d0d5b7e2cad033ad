"""Triton q / k norm and rotary of Qwen3.5's attention, as qk_norm_rotary_ref (naive.py gives the contract).

Grid (token, head block): programs first cover the query heads, then the key heads. A program loads BLOCK_H heads
of one token and, for the rotary channels, the same heads at the partner channels (c +- R / 2), so no shuffle of
registers is needed: both loads are normalised with the head's one rstd and weight (1 + w), rounded to the model
dtype as the norm's output is, then rotated as transformers does in the model dtype (each product and the sum
rounded). Channels past R pass through normalised. The query is read in place from q_proj's output (interleaved
with the gate). Torch runs this as about thirty kernels per layer (two norms of eight, slices, cats, products).

fla has no fused norm + rotary (its rotary is a separate kernel), hence our own.
"""

import torch
import triton
import triton.language as tl

from verify_kernels.glue.rows import FLOAT_INPUTS, check_vector

TILE = 2048  # elements a program holds: BLOCK_H heads of the head dim
NUM_WARPS = 4


@triton.jit
def _norm_rotary_heads(x, y, weight, cos, sin, i_t, i_h, stride_t, stride_h, eps,
                       NH: tl.constexpr, D: tl.constexpr, R: tl.constexpr, BLOCK_H: tl.constexpr,
                       BLOCK_D: tl.constexpr):
    """BLOCK_H heads (from i_h) of token i_t: x [N, NH, D] (strided) -> y [N, NH, D] (contiguous)."""
    HALF: tl.constexpr = R // 2
    o_h = i_h * BLOCK_H + tl.arange(0, BLOCK_H)
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    m = (o_h < NH)[:, None] & m_d[None, :]
    is_rot = o_d < R
    o_p = tl.where(o_d < HALF, o_d + HALF, o_d - HALF)  # the rotary partner channel
    p_x = x + i_t * stride_t + o_h[:, None] * stride_h
    b_x = tl.load(p_x + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    b_xp = tl.load(p_x + o_p[None, :], mask=m & is_rot[None, :], other=0.0).to(tl.float32)
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, 1) / D + eps)
    dtype = y.dtype.element_ty
    b_w = 1.0 + tl.load(weight + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_wp = 1.0 + tl.load(weight + o_p, mask=is_rot, other=0.0).to(tl.float32)
    b_n = (b_x * b_rstd[:, None] * b_w[None, :]).to(dtype).to(tl.float32)
    b_np = (b_xp * b_rstd[:, None] * b_wp[None, :]).to(dtype).to(tl.float32)
    b_cos = tl.load(cos + i_t * R + o_d, mask=is_rot, other=0.0).to(tl.float32)[None, :]
    b_sin = tl.load(sin + i_t * R + o_d, mask=is_rot, other=0.0).to(tl.float32)[None, :]
    b_rot = tl.where((o_d < HALF)[None, :], -b_np, b_np)
    b_y = (b_n * b_cos).to(dtype).to(tl.float32) + (b_rot * b_sin).to(dtype).to(tl.float32)
    b_y = tl.where(is_rot[None, :], b_y, b_n)
    tl.store(y + (i_t * NH + o_h[:, None]) * D + o_d[None, :], b_y.to(dtype), mask=m)


@triton.jit
def qk_norm_rotary_kernel(
    q, k, q_out, k_out, q_weight, k_weight, cos, sin, stride_qt, stride_qh, stride_kt, stride_kh, eps,
    H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, R: tl.constexpr, NQ: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    i_t, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if i_h < NQ:  # query head blocks, then key head blocks
        _norm_rotary_heads(q, q_out, q_weight, cos, sin, i_t, i_h, stride_qt, stride_qh, eps,
                           H, D, R, BLOCK_H, BLOCK_D)
    else:
        _norm_rotary_heads(k, k_out, k_weight, cos, sin, i_t, i_h - NQ, stride_kt, stride_kh, eps,
                           HKV, D, R, BLOCK_H, BLOCK_D)


def _as_token_heads(name: str, x: torch.Tensor) -> torch.Tensor:
    """[B, T, heads, D] with unit channel stride -> a [B T, heads, D] view."""
    if x.dim() != 4 or x.dtype not in FLOAT_INPUTS or x.stride(-1) != 1:
        raise ValueError(f"{name} must be [B, T, heads, D] float32 / bfloat16 / float16 with unit channel stride, "
                         f"got {tuple(x.shape)} {x.dtype} strides {x.stride()}")
    try:
        return x.view(-1, x.shape[2], x.shape[3])
    except RuntimeError as error:
        raise ValueError(f"{name}'s batch and token dims cannot be merged (strides {x.stride()})") from error


def qk_norm_rotary(query: torch.Tensor, key: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """query [B, T, H, D], key [B, T, HKV, D] (one dtype; unit channel stride, query may be a strided split of
    q_proj's output), q_weight, k_weight [D] (zero-centred: the scale is 1 + w), cos / sin [B, T, R] contiguous in
    the same dtype (R even, <= D) -> (query, key) normalised then rotated, contiguous, in their dtype."""
    q3, k3 = _as_token_heads("query", query), _as_token_heads("key", key)
    (N, H, D), HKV = q3.shape, k3.shape[1]
    R = cos.shape[-1]
    if key.shape[:2] != query.shape[:2] or k3.shape[2] != D or key.dtype != query.dtype:
        raise ValueError(f"key {tuple(key.shape)} {key.dtype} must match query {tuple(query.shape)} {query.dtype} "
                         "but for its heads")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape != (*query.shape[:2], R) or t.dtype != query.dtype or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous [{query.shape[0]}, {query.shape[1]}, R] {query.dtype}, got "
                             f"{tuple(t.shape)} {t.dtype}")
    if R % 2 or R > D:
        raise ValueError(f"the rotary dim {R} must be even and at most the head dim {D}")
    check_vector("q_weight", q_weight, D)
    check_vector("k_weight", k_weight, D)
    q_out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    k_out = torch.empty(key.shape, dtype=key.dtype, device=key.device)
    if N and D:
        block_d = triton.next_power_of_2(D)
        block_h = min(triton.next_power_of_2(max(H, HKV)), max(1, TILE // block_d))
        nq = triton.cdiv(H, block_h)
        qk_norm_rotary_kernel[(N, nq + triton.cdiv(HKV, block_h))](
            q3, k3, q_out, k_out, q_weight, k_weight, cos, sin, q3.stride(0), q3.stride(1), k3.stride(0),
            k3.stride(1), eps, H=H, HKV=HKV, D=D, R=R, NQ=nq, BLOCK_H=block_h, BLOCK_D=block_d, num_warps=NUM_WARPS,
        )
    return q_out, k_out
