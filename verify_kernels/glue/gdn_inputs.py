"""Triton kernels for the Gated DeltaNet's inputs, as gdn_qkv_ref and gdn_gates_ref (naive.py gives the contract).

gdn_qkv: the conv output row holds 2 H key-sized heads (q, then k) and HV value heads. A program takes consecutive
(row, head) pairs (rows.tile_rows), first of the q / k heads, then of the value heads: q / k heads are
l2-normalised (q also scaled) in fp32, value heads cast; all written fp32 and contiguous, which is what the
delta-rule kernels read. Torch needs about ten kernels for this (two splits made contiguous, cast, square, sum,
rsqrt, products, the scale, the value cast).
gdn_gates, one program per block of (token, head) pairs: g and beta from the two small projections in one kernel
instead of eight (casts, exp, neg, add, softplus, product, sigmoid).

Why not fla.modules.l2norm: it takes one contiguous tensor per call (three launches and two copies here) and
autotunes on first call; the fused split is what saves the launches. benchmarks/glue.py times fla's l2norm (q and k)
plus the value cast beside this kernel where fla is installed.
"""

import torch
import triton
import triton.language as tl

from verify_kernels.glue.rows import as_rows, check_vector, tile_rows

TRITON_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
GATE_BLOCK = 1024  # (token, head) pairs of a gdn_gates program
NUM_WARPS = 4


@triton.jit(do_not_specialize=["N", "NQK"])
def gdn_qkv_kernel(
    qkv, q, k, v, stride_r, N, q_scale, eps, NQK,  # NQK: q / k programs (runtime: it follows the rows)
    H: tl.constexpr, K: tl.constexpr, HV: tl.constexpr, V: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_HV: tl.constexpr, BLOCK_V: tl.constexpr,
    QK_VALUES: tl.constexpr,  # the dtype whose values q and k are rounded to (then stored in q's and k's dtype)
):
    i_p = tl.program_id(0)
    if i_p < NQK:  # programs over (row, q / k head) pairs; value programs follow
        o_q = i_p.to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
        o_r, o_h = o_q // (2 * H), o_q % (2 * H)  # heads 0..H-1 are q, H..2H-1 are k
        o_c = tl.arange(0, BLOCK_K)
        m = (o_q < N * 2 * H)[:, None] & (o_c < K)[None, :]
        b_x = tl.load(qkv + o_r[:, None] * stride_r + o_h[:, None] * K + o_c[None, :], mask=m, other=0.0)
        b_x = b_x.to(tl.float32)
        b_y = b_x * (1.0 / tl.sqrt(tl.sum(b_x * b_x, 1) + eps))[:, None]
        is_q = (o_h < H)[:, None]
        b_y = tl.where(is_q, b_y * q_scale, b_y)
        o_out = (o_r[:, None] * H + o_h[:, None] % H) * K + o_c[None, :]
        b_y = b_y.to(QK_VALUES)
        tl.store(q + o_out, b_y.to(q.dtype.element_ty), mask=m & is_q)
        tl.store(k + o_out, b_y.to(k.dtype.element_ty), mask=m & ~is_q)
    else:  # names of their own: Triton gives a name one type across the branches, and the blocks' shapes differ
        o_vq = (i_p - NQK).to(tl.int64) * BLOCK_HV + tl.arange(0, BLOCK_HV)
        o_vr, o_vh = o_vq // HV, o_vq % HV
        o_vc = tl.arange(0, BLOCK_V)
        m_v = (o_vq < N * HV)[:, None] & (o_vc < V)[None, :]
        b_v = tl.load(qkv + o_vr[:, None] * stride_r + 2 * H * K + o_vh[:, None] * V + o_vc[None, :], mask=m_v,
                      other=0.0)
        tl.store(v + o_vq[:, None] * V + o_vc[None, :], b_v.to(tl.float32), mask=m_v)


@triton.jit
def gate_values(b_a, b_b, b_A_log, b_dt_bias):
    """g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), both fp32, from loaded blocks (a and b in the
    projection's dtype, A_log and dt_bias broadcast to them); shared by gdn_gates_kernel and the conv kernels that
    store the gates beside q / k / v (verify_kernels/conv/conv_qkv.py)."""
    b_x = b_a.to(tl.float32) + b_dt_bias.to(tl.float32)
    # softplus as torch's (threshold 20); log(1 + e^x) loses only digits that exp(g) cannot see
    b_sp = tl.where(b_x > 20.0, b_x, tl.log(1.0 + tl.exp(tl.minimum(b_x, 20.0))))
    b_g = -tl.exp(b_A_log.to(tl.float32)) * b_sp
    # sigmoid in the projection's dtype, as torch computes b.sigmoid(), then fp32
    return b_g, tl.sigmoid(b_b.to(tl.float32)).to(b_b.dtype).to(tl.float32)


@triton.jit
def gdn_gates_kernel(a, b, A_log, dt_bias, g, beta, stride_a, stride_b, N, HV: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # flat (token, head) index
    m = o < N
    o_t, o_h = o // HV, o % HV
    b_g, b_beta = gate_values(tl.load(a + o_t * stride_a + o_h, mask=m, other=0.0),
                              tl.load(b + o_t * stride_b + o_h, mask=m, other=0.0),
                              tl.load(A_log + o_h, mask=m, other=0.0), tl.load(dt_bias + o_h, mask=m, other=0.0))
    tl.store(g + o, b_g, mask=m)
    tl.store(beta + o, b_beta, mask=m)


@triton.jit
def store_gate_rows(a, b, A_log, dt_bias, g, beta, rows, m_r, stride_a, stride_b, HV: tl.constexpr,
                    NHV: tl.constexpr):
    """g and beta of flat rows `rows` [BR] (those with m_r), every value head (NHV >= HV), as gdn_gates_kernel."""
    o_h = tl.arange(0, NHV)
    m_h = o_h < HV
    m = m_r[:, None] & m_h[None, :]
    b_g, b_beta = gate_values(tl.load(a + rows[:, None] * stride_a + o_h[None, :], mask=m, other=0.0),
                              tl.load(b + rows[:, None] * stride_b + o_h[None, :], mask=m, other=0.0),
                              tl.load(A_log + o_h, mask=m_h, other=0.0)[None, :],
                              tl.load(dt_bias + o_h, mask=m_h, other=0.0)[None, :])
    p = rows[:, None] * HV + o_h[None, :]
    tl.store(g + p, b_g, mask=m)
    tl.store(beta + p, b_beta, mask=m)


def gdn_qkv(qkv: torch.Tensor, num_k_heads: int, head_k_dim: int, num_v_heads: int, head_v_dim: int,
            q_scale: float, eps: float = 1e-6, qk_dtype: torch.dtype | None = None,
            qk_storage: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [..., 2 H K + HV V] (rows may be strided, unit channel stride) -> contiguous q [..., H, K] (l2-normalised,
    times q_scale) and k [..., H, K] (l2-normalised), computed in fp32, rounded to qk_dtype and stored in qk_storage
    (defaults: fp32, qk_dtype; gdn_qkv_ref says when not), v [..., HV, V] fp32."""
    rows = as_rows("qkv", qkv)
    H, K, HV, V = num_k_heads, head_k_dim, num_v_heads, head_v_dim
    if rows.shape[1] != 2 * H * K + HV * V:
        raise ValueError(f"qkv has {rows.shape[1]} channels, expected 2 * {H} * {K} + {HV} * {V}")
    lead, device = qkv.shape[:-1], qkv.device
    qk_dtype = qk_dtype or torch.float32
    q = torch.empty(*lead, H, K, dtype=qk_storage or qk_dtype, device=device)
    k = torch.empty_like(q)
    v = torch.empty(*lead, HV, V, dtype=torch.float32, device=device)
    N = rows.shape[0]
    if rows.numel():
        block_k, block_v = triton.next_power_of_2(K), triton.next_power_of_2(V)
        block_h, block_hv = tile_rows(N * 2 * H, block_k), tile_rows(N * HV, block_v)
        nqk = triton.cdiv(N * 2 * H, block_h)
        gdn_qkv_kernel[(nqk + triton.cdiv(N * HV, block_hv),)](
            rows, q, k, v, rows.stride(0), N, q_scale, eps, nqk,
            H=H, K=K, HV=HV, V=V, BLOCK_H=block_h, BLOCK_K=block_k, BLOCK_HV=block_hv, BLOCK_V=block_v,
            QK_VALUES=TRITON_DTYPES[qk_dtype], num_warps=NUM_WARPS,
        )
    return q, k, v


def gate_outputs(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                 dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Checks gdn_gates' inputs -> its outputs, allocated: fp32 (g, beta) of a's shape."""
    if a.shape != b.shape:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)} must have one shape")
    check_vector("A_log", A_log, a.shape[-1])
    check_vector("dt_bias", dt_bias, a.shape[-1])
    g = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    return g, torch.empty_like(g)


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
              dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b [..., HV] (rows may be strided); A_log, dt_bias [HV] -> fp32 contiguous (g, beta) [..., HV]:
    g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)."""
    a_rows, b_rows = as_rows("a", a), as_rows("b", b)
    g, beta = gate_outputs(a, b, A_log, dt_bias)
    HV = a_rows.shape[1]
    n = a_rows.numel()
    if n:
        gdn_gates_kernel[(triton.cdiv(n, GATE_BLOCK),)](
            a_rows, b_rows, A_log, dt_bias, g, beta, a_rows.stride(0), b_rows.stride(0), n,
            HV=HV, BLOCK=GATE_BLOCK, num_warps=NUM_WARPS,
        )
    return g, beta
