"""Triton q / k norm and rotary of Qwen3.5's attention, as qk_norm_rotary_ref (naive.py gives the contract).

Programs first cover the (token, query head) pairs, then the (token, key head) pairs, several heads each
(rows.tile_rows; the query programs' count NQ a runtime argument, since it follows the tokens: as a constexpr each new
prompt length compiled the kernel again on a GPU, tests/test_prefill_compiles.py). A program loads its heads and, for
the rotary channels, the same heads at the partner channels (c +- R / 2), so no shuffle of registers is needed: both
loads are normalised with the head's one rstd and weight (1 + w), rounded to the model dtype as the norm's output is,
then rotated as transformers does in the model dtype (each product and the sum rounded). Channels past R pass through
normalised. The query is read in place from q_proj's output (interleaved with the gate). Torch runs this as about
thirty kernels per layer (two norms of eight, slices, cats, products).

fla has no fused norm + rotary (its rotary is a separate kernel), hence our own.
"""

import torch
import triton
import triton.language as tl

from verify_kernels.glue.rows import FLOAT_INPUTS, check_vector, tile_rows

NUM_WARPS = 4


@triton.jit
def _norm_rotary_heads(x, y, weight, cos, sin, i_p, stride_t, stride_h, NP, eps,
                       NH: tl.constexpr, D: tl.constexpr, R: tl.constexpr, BLOCK_P: tl.constexpr,
                       BLOCK_D: tl.constexpr):
    """BLOCK_P (token, head) pairs from i_p * BLOCK_P: x [N, NH, D] (strided) -> y [N, NH, D] (contiguous)."""
    HALF: tl.constexpr = R // 2
    o_p = i_p.to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    o_t, o_h = o_p // NH, o_p % NH
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    m = (o_p < NP)[:, None] & m_d[None, :]
    is_rot = o_d < R
    o_e = tl.where(o_d < HALF, o_d + HALF, o_d - HALF)  # the rotary partner channel
    p_x = x + o_t[:, None] * stride_t + o_h[:, None] * stride_h
    b_x = tl.load(p_x + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    b_xe = tl.load(p_x + o_e[None, :], mask=m & is_rot[None, :], other=0.0).to(tl.float32)
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, 1) / D + eps)
    dtype = y.dtype.element_ty
    b_w = 1.0 + tl.load(weight + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_we = 1.0 + tl.load(weight + o_e, mask=is_rot, other=0.0).to(tl.float32)
    b_n = (b_x * b_rstd[:, None] * b_w[None, :]).to(dtype).to(tl.float32)
    b_ne = (b_xe * b_rstd[:, None] * b_we[None, :]).to(dtype).to(tl.float32)
    m_rot = (o_p < NP)[:, None] & is_rot[None, :]
    b_cos = tl.load(cos + o_t[:, None] * R + o_d[None, :], mask=m_rot, other=0.0).to(tl.float32)
    b_sin = tl.load(sin + o_t[:, None] * R + o_d[None, :], mask=m_rot, other=0.0).to(tl.float32)
    b_rot = tl.where((o_d < HALF)[None, :], -b_ne, b_ne)
    b_y = (b_n * b_cos).to(dtype).to(tl.float32) + (b_rot * b_sin).to(dtype).to(tl.float32)
    b_y = tl.where(is_rot[None, :], b_y, b_n)
    tl.store(y + o_p[:, None] * D + o_d[None, :], b_y.to(dtype), mask=m)


@triton.jit(do_not_specialize=["N", "NQ"])
def qk_norm_rotary_kernel(
    q, k, q_out, k_out, q_weight, k_weight, cos, sin, stride_qt, stride_qh, stride_kt, stride_kh, N, eps, NQ,
    H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):
    i_p = tl.program_id(0)
    if i_p < NQ:  # programs over (token, query head) pairs, then over (token, key head) pairs
        _norm_rotary_heads(q, q_out, q_weight, cos, sin, i_p, stride_qt, stride_qh, N * H, eps,
                           H, D, R, BLOCK_P, BLOCK_D)
    else:
        _norm_rotary_heads(k, k_out, k_weight, cos, sin, i_p - NQ, stride_kt, stride_kh, N * HKV, eps,
                           HKV, D, R, BLOCK_P, BLOCK_D)


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
        block_p = tile_rows(N * H, block_d)
        nq = triton.cdiv(N * H, block_p)
        qk_norm_rotary_kernel[(nq + triton.cdiv(N * HKV, block_p),)](
            q3, k3, q_out, k_out, q_weight, k_weight, cos, sin, q3.stride(0), q3.stride(1), k3.stride(0),
            k3.stride(1), N, eps, nq, H=H, HKV=HKV, D=D, R=R, BLOCK_P=block_p, BLOCK_D=block_d,
            num_warps=NUM_WARPS,
        )
    return q_out, k_out
