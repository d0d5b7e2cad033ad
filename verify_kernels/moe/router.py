"""Triton kernels for MoE routers: a sigmoid router without group limits, as sigmoid_router_ref (naive.py gives the
contract) with topk_group = num_groups (every group eligible: Nemotron-3-Nano's one group of 128 experts); and a
softmax router's choice from its logits, as softmax_router_ref (Qwen3.5-MoE: the logits' GEMM stays cuBLAS's, bf16
on the tensor cores; torch then runs the softmax, three top-k kernels, a sum, a division and a cast, here one launch).

In torch the router is about ten launches a MoE layer: the hidden rows cast to fp32, an fp32 GEMM (cuBLAS runs it on
the CUDA cores: cutlass simt sgemm, 0.36 ms a step at batch 128 of 4-chains on the H200 against a bound of 0.02),
the sigmoid, the bias, three top-k (sbtopk, 0.41 ms a step in 69 launches), a gather and the renormalisation. Here
the scores [BLOCK_M rows, E] are tensor-core products over the hidden columns D in BLOCK_D steps at fp32-level error
(verify_kernels/precision.py: bf16 rows, and bf16 weights, are exact in TF32, so one or two TF32 products a step
instead of three), then sigmoid, bias and the top-k as k rounds of a row-wise argmax over the E choices (the first
of equal choices, where torch.topk leaves the order of ties unspecified), each round's expert taken out.

A program's D steps run one after another, each waiting on its loads (~0.8 us on the H200): with few rows (decode
at small batches) a handful of programs would walk all 42 steps of Nemotron-3-Nano's 2688 columns (29-33 us for
one token, H200 2026-12-04). So the logits are summed over chunks of CHUNK_D columns, each chunk's products from
zero and the chunks' sums added in column order: below ONE_LAUNCH_ROW_BLOCKS row blocks, each chunk is its own
program, which writes its sums, fp32 [chunks, N, E], and a second launch adds them and selects; with more rows, one
launch walks a row block's chunks in turn. Both add the same products in the same order, so a token's experts do
not depend on the batch it came in, nor on the launch that served it.
Launchers check static shapes only and never synchronise with the device (CUDA-graph safe).
"""

import torch
import triton
import triton.language as tl

from verify_kernels.precision import add_product_exact, exact_in_tf32

BLOCK_M = 16  # rows a program (tl.dot's smallest)
BLOCK_D = 64  # hidden columns a product step
NUM_WARPS = 4
# the softmax router: rows a program and warps (no tl.dot: any power of two). Compiled for sm_90 here: [16, 256]
# tiles on 4 warps 25.7k lines of PTX (eight argmax rounds over 32 elements a thread), [4, 256] 6.6k; not timed
# yet: benchmarks/moe_router.py --softmax-tiles times others
SOFTMAX_BLOCK_M = 4
SOFTMAX_WARPS = 4
CHUNK_D = 128  # columns whose products a chunk sums (a multiple of BLOCK_D)
assert CHUNK_D % BLOCK_D == 0, "a chunk is whole product steps"
# from this many row blocks up, one launch: H200 2026-12-04 (benchmarks/results/moe_router_h200_2026-12-04f.txt),
# chunks against one launch 9.2 / 28.8 us at 1 token, 16.1 / 29.6 at 128, 25.5 / 29.7 at 640, 51.3 / 30.2 at 2048
ONE_LAUNCH_ROW_BLOCKS = 64


@triton.jit
def block_rows(N, E, BM: tl.constexpr, BE: tl.constexpr):
    """This program's BM rows and the BE (padded) experts: their offsets and masks."""
    o_m = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    o_e = tl.arange(0, BE)
    return o_m, o_e, o_m < N, o_e < E


@triton.jit
def chunk_scores(x, weight, o_m, m_m, o_e, m_e, d_start, stride_x, D: tl.constexpr, BM: tl.constexpr,
                 BE: tl.constexpr, BD: tl.constexpr, CD: tl.constexpr, X_EXACT: tl.constexpr, W_EXACT: tl.constexpr):
    """x . weight^T over the chunk of columns [d_start, d_start + CD) of rows o_m, from zero: fp32 [BM, BE]."""
    b_s = tl.zeros([BM, BE], dtype=tl.float32)
    for d0 in tl.static_range(0, CD, BD):
        o_d = d_start + d0 + tl.arange(0, BD)
        m_d = o_d < D
        b_x = tl.load(x + o_m[:, None] * stride_x + o_d[None, :], mask=m_m[:, None] & m_d[None, :], other=0.)
        b_w = tl.load(weight + o_e[:, None] * D + o_d[None, :], mask=m_e[:, None] & m_d[None, :], other=0.)
        b_s = add_product_exact(b_s, b_x.to(tl.float32), tl.trans(b_w.to(tl.float32)), "tf32x3-split", X_EXACT,
                                W_EXACT)
    return b_s


@triton.jit
def select_top_k(b_logits, bias, top_index, top_weight, o_m, m_m, o_e, m_e, scaling, K: tl.constexpr,
                 BM: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr):
    """Sigmoid, bias and the top-k of the logits [BM, BE] of rows o_m, stored: index int64 and weight fp32 [N, K]."""
    b_s = tl.sigmoid(b_logits)                                                               # scores [BM, BE]
    b_c = tl.where(m_e[None, :], b_s + tl.load(bias + o_e, mask=m_e, other=0.).to(tl.float32)[None, :],
                   float("-inf"))                                                            # choices
    o_k = tl.arange(0, BK)
    b_i = tl.zeros([BM, BK], dtype=tl.int32)
    b_w = tl.zeros([BM, BK], dtype=tl.float32)
    for j in tl.static_range(K):
        best = tl.argmax(b_c, 1)                                                             # [BM]
        hit = o_e[None, :] == best[:, None]
        b_i = tl.where(o_k[None, :] == j, best[:, None], b_i)
        b_w = tl.where(o_k[None, :] == j, tl.sum(tl.where(hit, b_s, 0.), 1)[:, None], b_w)
        b_c = tl.where(hit, float("-inf"), b_c)
    if NORM:
        b_w = b_w / (tl.sum(b_w, 1)[:, None] + 1e-20)
    m_out = m_m[:, None] & (o_k < K)[None, :]
    p_out = o_m[:, None] * K + o_k[None, :]
    tl.store(top_index + p_out, b_i.to(tl.int64), mask=m_out)
    tl.store(top_weight + p_out, b_w * scaling, mask=m_out)


@triton.jit(do_not_specialize=["N"])
def sigmoid_router_kernel(
    x,              # [N, D] (rows strided by stride_x)
    weight,         # [E, D]
    bias,           # [E]
    top_index,      # [N, K] int64 out
    top_weight,     # [N, K] fp32 out
    N,
    stride_x,
    scaling,
    D: tl.constexpr,
    E: tl.constexpr,
    K: tl.constexpr,
    BE: tl.constexpr,   # E padded to a power of two
    BK: tl.constexpr,   # K padded to a power of two
    BM: tl.constexpr,
    BD: tl.constexpr,
    CD: tl.constexpr,   # columns a chunk (CHUNK_D)
    NORM: tl.constexpr,
    X_EXACT: tl.constexpr,
    W_EXACT: tl.constexpr,
):
    """One launch: a program's rows over every chunk of columns in turn, then their top-k."""
    o_m, o_e, m_m, m_e = block_rows(N, E, BM, BE)
    b_s = tl.zeros([BM, BE], dtype=tl.float32)
    for d_start in range(0, D, CD):
        b_s += chunk_scores(x, weight, o_m, m_m, o_e, m_e, d_start, stride_x, D, BM, BE, BD, CD, X_EXACT, W_EXACT)
    select_top_k(b_s, bias, top_index, top_weight, o_m, m_m, o_e, m_e, scaling, K, BM, BK, NORM)


@triton.jit(do_not_specialize=["N"])
def router_chunks_kernel(
    x, weight,      # [N, D] (rows strided by stride_x), [E, D]
    chunks,         # [C, N, E] fp32 out: chunk c's sums
    N,
    stride_x,
    D: tl.constexpr,
    E: tl.constexpr,
    BE: tl.constexpr,
    BM: tl.constexpr,
    BD: tl.constexpr,
    CD: tl.constexpr,
    X_EXACT: tl.constexpr,
    W_EXACT: tl.constexpr,
):
    """Two launches, the first: grid (row blocks, chunks); a program's rows over its chunk's columns."""
    i_c = tl.program_id(1)
    o_m, o_e, m_m, m_e = block_rows(N, E, BM, BE)
    b_s = chunk_scores(x, weight, o_m, m_m, o_e, m_e, i_c * CD, stride_x, D, BM, BE, BD, CD, X_EXACT, W_EXACT)
    tl.store(chunks + (i_c * N + o_m[:, None]) * E + o_e[None, :], b_s, mask=m_m[:, None] & m_e[None, :])


@triton.jit(do_not_specialize=["N", "C"])
def router_select_kernel(
    chunks,         # [C, N, E] fp32
    bias, top_index, top_weight,
    N,
    scaling,
    C,
    E: tl.constexpr,
    K: tl.constexpr,
    BE: tl.constexpr,
    BK: tl.constexpr,
    BM: tl.constexpr,
    NORM: tl.constexpr,
):
    """Two launches, the second: a program's rows, their chunks' sums added in column order, then their top-k."""
    o_m, o_e, m_m, m_e = block_rows(N, E, BM, BE)
    b_s = tl.zeros([BM, BE], dtype=tl.float32)
    for i_c in range(C):
        b_s += tl.load(chunks + (i_c * N + o_m[:, None]) * E + o_e[None, :], mask=m_m[:, None] & m_e[None, :],
                       other=0.)
    select_top_k(b_s, bias, top_index, top_weight, o_m, m_m, o_e, m_e, scaling, K, BM, BK, NORM)


@triton.jit(do_not_specialize=["N"])
def softmax_topk_kernel(
    logits,         # [N, E] (rows strided by stride_l)
    top_index,      # [N, K] int64 out
    top_weight,     # [N, K] out, in its dtype
    N,
    stride_l,
    E: tl.constexpr,
    K: tl.constexpr,
    BE: tl.constexpr,
    BK: tl.constexpr,
    BM: tl.constexpr,
):
    """A program's rows: the softmax in fp32 as torch computes it (e^(l - max) / sum), the top-k of the
    probabilities as k rounds of a row-wise argmax (the first of equal ones), renormalised over the k."""
    o_m, o_e, m_m, m_e = block_rows(N, E, BM, BE)
    b_l = tl.load(logits + o_m[:, None] * stride_l + o_e[None, :], mask=m_m[:, None] & m_e[None, :], other=0.)
    b_l = tl.where(m_e[None, :], b_l.to(tl.float32), float("-inf"))  # (rows past N: zeros, finite)
    b_p = tl.exp(b_l - tl.max(b_l, 1)[:, None])
    b_p = b_p / tl.sum(b_p, 1)[:, None]                                                      # [BM, BE]
    b_c = tl.where(m_e[None, :], b_p, -1.0)                                                  # choices
    o_k = tl.arange(0, BK)
    b_i = tl.zeros([BM, BK], dtype=tl.int32)
    b_w = tl.zeros([BM, BK], dtype=tl.float32)
    for j in tl.static_range(K):
        best = tl.argmax(b_c, 1)
        hit = o_e[None, :] == best[:, None]
        b_i = tl.where(o_k[None, :] == j, best[:, None], b_i)
        b_w = tl.where(o_k[None, :] == j, tl.sum(tl.where(hit, b_p, 0.), 1)[:, None], b_w)
        b_c = tl.where(hit, -1.0, b_c)
    b_w = b_w / tl.sum(b_w, 1)[:, None]
    m_out = m_m[:, None] & (o_k < K)[None, :]
    p_out = o_m[:, None] * K + o_k[None, :]
    tl.store(top_index + p_out, b_i.to(tl.int64), mask=m_out)
    tl.store(top_weight + p_out, b_w.to(top_weight.dtype.element_ty), mask=m_out)


def softmax_router(logits: torch.Tensor, top_k: int, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax_router_ref: logits [N, E] (unit column stride; fp32, bf16 or fp16) -> top_index [N, top_k] int64,
    top_weight [N, top_k] in out_dtype, one launch."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be [N, E] with unit column stride, got {tuple(logits.shape)} strides "
                         f"{logits.stride()}")
    N, E = logits.shape
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be in [1, {E}], got {top_k}")
    top_index = torch.empty(N, top_k, dtype=torch.int64, device=logits.device)
    top_weight = torch.empty(N, top_k, dtype=out_dtype, device=logits.device)
    if N:
        softmax_topk_kernel[(triton.cdiv(N, SOFTMAX_BLOCK_M),)](
            logits, top_index, top_weight, N, logits.stride(0), E=E, K=top_k, BE=triton.next_power_of_2(E),
            BK=triton.next_power_of_2(top_k), BM=SOFTMAX_BLOCK_M, num_warps=SOFTMAX_WARPS,
        )
    return top_index, top_weight


def sigmoid_router(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int, norm_topk_prob: bool,
                   scaling: float, one_launch: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sigmoid_router_ref with every group eligible: x [N, D] (unit column stride; fp32, bf16 or fp16), weight [E, D]
    contiguous, bias [E] -> top_index [N, top_k] int64, top_weight [N, top_k] fp32. one_launch: the one-launch form
    or the chunks' two (the same results; by default one launch from ONE_LAUNCH_ROW_BLOCKS row blocks up)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [N, D] with unit column stride, got {tuple(x.shape)} strides {x.stride()}")
    N, D = x.shape
    E = weight.shape[0]
    if tuple(weight.shape) != (E, D) or not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous [E, {D}], got {tuple(weight.shape)}")
    if tuple(bias.shape) != (E,) or not bias.is_contiguous():
        raise ValueError(f"bias must be contiguous [{E}], got {tuple(bias.shape)}")
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be in [1, {E}], got {top_k}")
    top_index = torch.empty(N, top_k, dtype=torch.int64, device=x.device)
    top_weight = torch.empty(N, top_k, dtype=torch.float32, device=x.device)
    if not N:
        return top_index, top_weight
    sizes = dict(E=E, BE=triton.next_power_of_2(E), BM=BLOCK_M)
    exact = dict(X_EXACT=exact_in_tf32(x), W_EXACT=exact_in_tf32(weight))
    select = dict(K=top_k, BK=triton.next_power_of_2(top_k), NORM=norm_topk_prob)
    row_blocks = triton.cdiv(N, BLOCK_M)
    if one_launch is None:
        one_launch = row_blocks >= ONE_LAUNCH_ROW_BLOCKS
    if one_launch:
        sigmoid_router_kernel[(row_blocks,)](
            x, weight, bias, top_index, top_weight, N, x.stride(0), float(scaling), D=D, BD=BLOCK_D, CD=CHUNK_D,
            **sizes, **select, **exact, num_warps=NUM_WARPS,
        )
        return top_index, top_weight
    num_chunks = triton.cdiv(D, CHUNK_D)
    chunks = torch.empty(num_chunks, N, E, dtype=torch.float32, device=x.device)
    router_chunks_kernel[(row_blocks, num_chunks)](
        x, weight, chunks, N, x.stride(0), D=D, BD=BLOCK_D, CD=CHUNK_D, **sizes, **exact, num_warps=NUM_WARPS,
    )
    router_select_kernel[(row_blocks,)](
        chunks, bias, top_index, top_weight, N, float(scaling), num_chunks, **sizes, **select, num_warps=NUM_WARPS,
    )
    return top_index, top_weight
