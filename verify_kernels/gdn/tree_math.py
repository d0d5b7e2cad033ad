"""The per-row tree math of the GDN KVBuffer verify (verify.py's steps a.-e.), shared by its tree pass and its fused
kernel: products over K among the nodes and against the buffer, the nodes' decays and the triangular solve per value
head, the buffer's share of the reads, and u and o from the state's products. Tiles are [BV, BT], V columns first
(verify.py says why); products run on the tensor cores (tl.dot, tf32x3).
"""

import triton
import triton.language as tl

from verify_kernels.precision import add_product_exact, dot_tf32x3


@triton.jit
def products(a, b, PRECISION: tl.constexpr):
    """a [M, C] . b [N, C] over C -> [M, N] fp32 on the tensor cores (tl.dot: M, N, C >= 16). PRECISION
    "tf32x3-split" (verify.TREE_SPLIT_TF32): tf32x3 from operands split by a mask (verify_kernels/precision.py; b
    split after its transpose: 168 registers a thread for sm_90 where splitting it before took 218)."""
    if PRECISION == "tf32x3-split":
        return dot_tf32x3(a, tl.trans(b), tl.zeros([a.shape[0], b.shape[0]], dtype=tl.float32))
    else:
        return tl.dot(a, tl.trans(b), input_precision=PRECISION)


@triton.jit
def exact_products(a, b, PRECISION: tl.constexpr, A_EXACT: tl.constexpr, B_EXACT: tl.constexpr):
    """products where A_EXACT / B_EXACT say an operand holds values exact in TF32 (the nodes' q and k in a bf16 /
    fp16 model's dtype: verify_kernels/precision.py add_product_exact skips their remainders' products)."""
    if PRECISION == "tf32x3-split" and (A_EXACT or B_EXACT):
        return add_product_exact(tl.zeros([a.shape[0], b.shape[0]], dtype=tl.float32), a, tl.trans(b), PRECISION,
                                 A_EXACT, B_EXACT)
    else:
        return products(a, b, PRECISION)


@triton.jit
def node_products(q, k, buf_k, i_b, i_r, i_hk, n, nn, T, H: tl.constexpr, K: tl.constexpr, L: tl.constexpr,
                  BT: tl.constexpr, BL: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
                  PRODUCTS_STAGES: tl.constexpr, EXACT: tl.constexpr = False):
    """a. k_t . k_i and q_t . k_i among row i_b's nodes ([BT, BT]) and against its n buffer keys ([BT, BL]), key head
    i_hk; zero at padding nodes and stale entries."""
    o_t = tl.arange(0, BT)
    o_l = tl.arange(0, BL)
    m_t = o_t < nn
    m_l = o_l < n
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    b_qk = tl.zeros([BT, BT], dtype=tl.float32)
    b_kB = tl.zeros([BT, BL], dtype=tl.float32)
    b_qB = tl.zeros([BT, BL], dtype=tl.float32)
    for i_k in tl.range(0, K, BK, num_stages=PRODUCTS_STAGES):
        o_k = i_k + tl.arange(0, BK)
        p_x = ((i_b * T + o_t[:, None]) * H + i_hk) * K + o_k[None, :]
        b_kc = tl.load(k + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
        b_qc = tl.load(q + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
        p_bk = buf_k + ((i_r * L + o_l[:, None]) * H + i_hk) * K + o_k[None, :]
        b_bkc = tl.load(p_bk, mask=m_l[:, None], other=0.)
        b_kk += exact_products(b_kc, b_kc, PRECISION, EXACT, EXACT)
        b_qk += exact_products(b_qc, b_kc, PRECISION, EXACT, EXACT)
        b_kB += exact_products(b_kc, b_bkc, PRECISION, EXACT, False)
        b_qB += exact_products(b_qc, b_bkc, PRECISION, EXACT, False)
    return b_kk, b_qk, b_kB, b_qB


@triton.jit
def row_halves(x, N: tl.constexpr, M: tl.constexpr):
    """x [2N, M] -> its rows 0..N-1 and N..2N-1, [N, M] each."""
    return tl.split(tl.permute(tl.reshape(x, [2, N, M]), [1, 2, 0]))


@triton.jit
def stacked_node_products(q, k, buf_k, i_b, i_r, i_hk, n, nn, T, H: tl.constexpr, K: tl.constexpr,
                          L: tl.constexpr, BT: tl.constexpr, BL: tl.constexpr, BK: tl.constexpr,
                          PRECISION: tl.constexpr, PRODUCTS_STAGES: tl.constexpr, EXACT: tl.constexpr = False):
    """node_products with the keys and queries stacked, [k; q] [2 BT, BK]: two products a step of BK columns (against
    the nodes' keys and against the buffer's) instead of four, each twice as tall (STACKED_PRODUCTS). Returns
    k.k, q.k [BT, BT] and the buffer's products still stacked, [k.kB; q.kB] [2 BT, BL] (rows_halves splits them)."""
    o_s = tl.arange(0, 2 * BT)
    node = o_s % BT
    o_t = tl.arange(0, BT)
    o_l = tl.arange(0, BL)
    m_s = node < nn
    m_t = o_t < nn
    m_l = o_l < n
    b_xk = tl.zeros([2 * BT, BT], dtype=tl.float32)
    b_xB = tl.zeros([2 * BT, BL], dtype=tl.float32)
    for i_k in tl.range(0, K, BK, num_stages=PRODUCTS_STAGES):
        o_k = i_k + tl.arange(0, BK)
        p_s = ((i_b * T + node[:, None]) * H + i_hk) * K + o_k[None, :]
        b_xc = tl.load(tl.where((o_s < BT)[:, None], k + p_s, q + p_s), mask=m_s[:, None], other=0.).to(tl.float32)
        p_x = ((i_b * T + o_t[:, None]) * H + i_hk) * K + o_k[None, :]
        b_kc = tl.load(k + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
        p_bk = buf_k + ((i_r * L + o_l[:, None]) * H + i_hk) * K + o_k[None, :]
        b_bkc = tl.load(p_bk, mask=m_l[:, None], other=0.)
        b_xk += exact_products(b_xc, b_kc, PRECISION, EXACT, EXACT)
        b_xB += exact_products(b_xc, b_bkc, PRECISION, EXACT, False)
    b_kk, b_qk = row_halves(b_xk, BT, BT)
    return b_kk, b_qk, b_xB


@triton.jit
def head_weights(b_g, b_beta, b_anc, b_bg, b_kk, b_qk, n, nn, BT: tl.constexpr, BL: tl.constexpr,
                 SOLVE: tl.constexpr = True):
    """b. and c. for one value head from its nodes' g, beta [BT] and ancestors [BT, BT] (zero / False at padding) and
    its buffer entries' G [BL]: the nodes' G [BT], the buffer decays e^{G_t - G_i} [BT, BL], M and P [BT, BT].
    SOLVE=False: diag(beta) A in M's place (strictly lower triangular), for a caller that substitutes forward
    itself, u_t = x_t - sum_i (beta A)[t, i] u_i, node by node."""
    o_t = tl.arange(0, BT)
    o_l = tl.arange(0, BL)
    m_l = o_l < n
    # from the last buffered entry's G (0 for an empty buffer)
    b_G = tl.sum(tl.where(o_l == n - 1, b_bg, 0.), 0) + tl.sum(tl.where(b_anc, b_g[None, :], 0.), 1)   # [BT]
    b_dT = tl.exp(tl.where(b_anc, b_G[:, None] - b_G[None, :], float("-inf")))            # [BT, BT]
    b_dB = tl.exp(tl.where(m_l[None, :], b_G[:, None] - b_bg[None, :], float("-inf")))   # [BT, BL]
    # M = (I + diag(beta) A)^-1: once row t of M is final, subtract its share from the later rows
    b_A = tl.where(o_t[:, None] != o_t[None, :], b_beta[:, None] * b_kk * b_dT, 0.)
    if SOLVE:
        b_M = tl.where(o_t[:, None] == o_t[None, :], 1., 0.)
        for t in range(0, nn - 1):
            b_mt = tl.sum(tl.where(o_t[:, None] == t, b_M, 0.), 0)                        # [BT], row t, final
            b_at = tl.sum(tl.where(o_t[None, :] == t, b_A, 0.), 1)                        # [BT], rows > t
            b_M -= b_at[:, None] * b_mt[None, :]
    else:
        b_M = b_A
    return b_G, b_dB, b_M, b_qk * b_dT


@triton.jit
def node_inputs(g, beta, ancestors, buf_gcum, i_b, i_r, i_h, n, nn, T, HV: tl.constexpr, L: tl.constexpr,
                BT: tl.constexpr, BL: tl.constexpr, G: tl.constexpr, NG: tl.constexpr):
    """g and beta of the G value heads from i_h ([BT, NG], NG >= G a power of two), the ancestors ([BT, BT] bool)
    and the buffer entries' G ([BL, NG]), zero at padding nodes, stale entries and columns past G."""
    o_t = tl.arange(0, BT)
    o_l = tl.arange(0, BL)
    o_g = tl.arange(0, NG)
    m_t = o_t < nn
    m_g = o_g < G
    p_g = (i_b * T + o_t[:, None]) * HV + i_h + o_g[None, :]
    b_g = tl.load(g + p_g, mask=m_t[:, None] & m_g[None, :], other=0.).to(tl.float32)
    b_beta = tl.load(beta + p_g, mask=m_t[:, None] & m_g[None, :], other=0.).to(tl.float32)
    m_tt = m_t[:, None] & m_t[None, :]
    b_anc = (tl.load(ancestors + (i_b * T + o_t[:, None]) * T + o_t[None, :], mask=m_tt, other=0) != 0) & m_tt
    p_bg = buf_gcum + (i_r * L + o_l[:, None]) * HV + i_h + o_g[None, :]
    b_bg = tl.load(p_bg, mask=(o_l < n)[:, None] & m_g[None, :], other=0.)
    return b_g, b_beta, b_anc, b_bg


@triton.jit
def value_inputs(v, buf_u, i_b, i_r, i_h, n, nn, o_v, T, HV: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                 BT: tl.constexpr, BL: tl.constexpr):
    """Value head i_h's columns o_v [BV] of the nodes' v ([BV, BT], zero at padding nodes) and of the buffer's u
    ([BV, BL], zero past its n entries)."""
    o_t = tl.arange(0, BT)
    o_l = tl.arange(0, BL)
    p_n = ((i_b * T + o_t[None, :]) * HV + i_h) * V + o_v[:, None]
    b_v = tl.where((o_t < nn)[None, :], tl.load(v + p_n, mask=(o_t < T)[None, :], other=0.).to(tl.float32), 0.)
    p_bu = buf_u + ((i_r * L + o_l[None, :]) * HV + i_h) * V + o_v[:, None]
    return b_v, tl.load(p_bu, mask=(o_l < n)[None, :], other=0.)


@triton.jit
def buffer_reads(v, buf_u, b_kB, b_qB, b_dB, b_beta, i_b, i_r, i_h, n, nn, o_v, T, HV: tl.constexpr,
                 V: tl.constexpr, L: tl.constexpr, BT: tl.constexpr, BL: tl.constexpr, PRECISION: tl.constexpr):
    """d. over columns o_v [BV]: w = beta (v - kr) and qr, [BV, BT] each."""
    b_v, b_bu = value_inputs(v, buf_u, i_b, i_r, i_h, n, nn, o_v, T, HV, V, L, BT, BL)
    return value_reads(b_v, b_bu, b_kB, b_qB, b_dB, b_beta, PRECISION)


@triton.jit
def value_reads(b_v, b_bu, b_kB, b_qB, b_dB, b_beta, PRECISION: tl.constexpr):
    """d. from the nodes' v [BV, BT] and the buffer's u [BV, BL] (value_inputs): w = beta (v - kr), qr."""
    b_kr = products(b_bu, b_kB * b_dB, PRECISION)                                    # [BV, BT]
    b_qr = products(b_bu, b_qB * b_dB, PRECISION)
    return b_beta[None, :] * (b_v - b_kr), b_qr


@triton.jit
def stacked_buffer_reads(v, buf_u, b_xBd, b_beta, i_b, i_r, i_h, n, nn, o_v, T, HV: tl.constexpr, V: tl.constexpr,
                         L: tl.constexpr, BT: tl.constexpr, BL: tl.constexpr, BV: tl.constexpr,
                         PRECISION: tl.constexpr):
    """buffer_reads from the stacked, decayed buffer products [k.kB e^dG; q.kB e^dG] [2 BT, BL] (STACKED_READS):
    kr and qr as one product [BV, 2 BT], split by columns."""
    b_v, b_bu = value_inputs(v, buf_u, i_b, i_r, i_h, n, nn, o_v, T, HV, V, L, BT, BL)
    b_kr, b_qr = tl.split(tl.permute(tl.reshape(products(b_bu, b_xBd, PRECISION), [BV, 2, BT]),
                                     [0, 2, 1]))                                          # [BV, BT] each
    return b_beta[None, :] * (b_v - b_kr), b_qr


@triton.jit
def stacked_rows(x, N: tl.constexpr, M: tl.constexpr):
    """x [N, M] -> [x; x] [2N, M]."""
    return tl.reshape(tl.permute(tl.join(x, x), [2, 0, 1]), [2 * N, M])


@triton.jit
def finish(b_w, b_qr, b_kS, b_qS, b_G, b_beta, b_M, b_P, PRECISION: tl.constexpr):
    """e.: u = M (w - beta e^G S0^T k), o = qr + e^G S0^T q + P u, as [BV, BT] tiles (u^T = (...)^T M^T)."""
    b_eG = tl.exp(b_G)
    b_u = products(b_w - (b_beta * b_eG)[None, :] * b_kS, b_M, PRECISION)
    b_o = b_qr + b_eG[None, :] * b_qS + products(b_u, b_P, PRECISION)
    return b_u, b_o
