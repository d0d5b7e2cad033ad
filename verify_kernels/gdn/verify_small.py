"""The tree pass of the Gated DeltaNet verify for small trees (up to verify.SMALL_TREE_MAX_NODES nodes: the 4-chains
speculative decoding runs most), on the FMA units in fp32, nodes padded to BN, the next power of two, instead of
tl.dot's 16. The math and the passes: verify.py's docstring; this kernel takes the tree pass's place
(gdn_verify_tree_kernel) after the same state pass and writes the same u, o and G.

Why a second tree pass: the tensor-core one pads a 4-chain to 16 nodes (tl.dot's smallest side), so three quarters
of its products are padding, and each fp32 product is three TF32 ones plus the operands' splits and layout
conversions. The pass is issue-bound (ncu on the H200, 2026-12-03): instructions are its time. Here every product is
a broadcast and a sum over its first axis, which a thread holds whole (Triton spreads a tensor's last axes over the
lanes and warps: V columns here), so the sums are a thread's own FMAs with no shuffles: [BL, BN, BV] at most, the
buffer's decayed products [BL, BN] in every thread's registers (why BN stops at 4: verify.SMALL_TREE_PASS has the
instruction and register counts). Tiles are [BN, BV], nodes first, V contiguous.
"""

import triton
import triton.language as tl

from verify_kernels.gdn.tree_math import head_weights, node_inputs


@triton.jit
def small_node_products(q, k, buf_k, i_b, i_r, i_hk, n, nn, T, H: tl.constexpr, K: tl.constexpr,
                        L: tl.constexpr, BN: tl.constexpr, BL: tl.constexpr, BK: tl.constexpr):
    """a. in fp32 on the FMA units: k_t . k_i, q_t . k_i among row i_b's nodes ([BN, BN]) and k_t . kB_i, q_t . kB_i
    against its n buffer keys ([BN, BL]), key head i_hk; zero at padding nodes and stale entries. Operands [BK, ...]:
    the summed axis first, so that a thread holds it whole (Triton spreads a tensor's last axes over the lanes)."""
    o_t = tl.arange(0, BN)
    o_l = tl.arange(0, BL)
    m_t = o_t < nn
    m_l = o_l < n
    b_kk = tl.zeros([BN, BN], dtype=tl.float32)
    b_qk = tl.zeros([BN, BN], dtype=tl.float32)
    b_kB = tl.zeros([BN, BL], dtype=tl.float32)
    b_qB = tl.zeros([BN, BL], dtype=tl.float32)
    for i_k in range(0, K, BK):
        o_k = i_k + tl.arange(0, BK)
        p_x = ((i_b * T + o_t[None, :]) * H + i_hk) * K + o_k[:, None]
        b_kc = tl.load(k + p_x, mask=m_t[None, :], other=0.).to(tl.float32)                  # [BK, BN]
        b_qc = tl.load(q + p_x, mask=m_t[None, :], other=0.).to(tl.float32)
        b_bkc = tl.load(buf_k + ((i_r * L + o_l[None, :]) * H + i_hk) * K + o_k[:, None], mask=m_l[None, :],
                        other=0.)                                                              # [BK, BL]
        b_kk += tl.sum(b_kc[:, :, None] * b_kc[:, None, :], 0)
        b_qk += tl.sum(b_qc[:, :, None] * b_kc[:, None, :], 0)
        b_kB += tl.sum(b_kc[:, :, None] * b_bkc[:, None, :], 0)
        b_qB += tl.sum(b_qc[:, :, None] * b_bkc[:, None, :], 0)
    return b_kk, b_qk, b_kB, b_qB


@triton.jit
def gdn_verify_small_tree_kernel(
    q, k, v, g, beta,   # [B, T, H, K], [B, T, H, K], [B, T, HV, V], [B, T, HV], [B, T, HV]
    ancestors,          # [B, T, T] uint8: [b, t, i] = 1 iff i is t or an ancestor of t
    num_nodes,          # [B]
    state_slots,        # [B]
    kS, qS,             # [B, T, HV, V] fp32: S0^T k_t, S0^T q_t from the state pass (rows with a state)
    buf_k,              # [R, L, H, K] fp32
    buf_u,              # [R, L, HV, V] fp32
    buf_gcum,           # [R, L, HV] fp32
    buf_len,            # [R]
    req_slots,          # [B]
    o, u,               # [B, T, HV, V] fp32 out
    gcum,               # [B, T, HV] fp32 out
    T,                  # not constexpr: tree sizes change every step; only BN picks a compiled kernel
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BN: tl.constexpr,   # T padded to a power of two (T <= verify.SMALL_TREE_MAX_NODES)
    BL: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GP: tl.constexpr,   # value heads per program, of one key head
    NG: tl.constexpr,   # GP padded to a power of two
):
    i_hp, i_b = tl.program_id(0), tl.program_id(1)
    i_h0 = i_hp * GP
    i_hk = i_h0 // (HV // H)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
    n = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
    o_t = tl.arange(0, BN)
    o_l = tl.arange(0, BL)
    m_T = o_t < T
    m_n = (o_t < nn)[:, None]
    b_g2, b_beta2, b_anc, b_bg2 = node_inputs(g, beta, ancestors, buf_gcum, i_b, i_r, i_h0, n, nn, T, HV, L, BN, BL,
                                              GP, NG)
    b_kk, b_qk, b_kB, b_qB = small_node_products(q, k, buf_k, i_b, i_r, i_hk, n, nn, T, H, K, L, BN, BL, BK)
    o_g = tl.arange(0, NG)
    for i_g in tl.static_range(GP):
        i_h = i_h0 + i_g
        b_beta = tl.sum(tl.where(o_g[None, :] == i_g, b_beta2, 0.), 1)
        b_G, b_dB, b_M, b_P = head_weights(tl.sum(tl.where(o_g[None, :] == i_g, b_g2, 0.), 1), b_beta, b_anc,
                                           tl.sum(tl.where(o_g[None, :] == i_g, b_bg2, 0.), 1), b_kk, b_qk, n, nn, BN,
                                           BL)
        tl.store(gcum + (i_b * T + o_t) * HV + i_h, tl.where(o_t < nn, b_G, 0.), mask=m_T)
        b_kBd = b_kB * b_dB                                                                    # [BN, BL]
        b_qBd = b_qB * b_dB
        b_eG = tl.exp(b_G)
        for i_v in range(0, V, BV):
            o_v = i_v + tl.arange(0, BV)
            p_n = ((i_b * T + o_t[:, None]) * HV + i_h) * V + o_v[None, :]                    # [BN, BV]
            b_kS = tl.zeros([BN, BV], dtype=tl.float32)
            b_qS = tl.zeros([BN, BV], dtype=tl.float32)
            if i_s >= 0:
                b_kS = tl.load(kS + p_n, mask=m_n, other=0.)
                b_qS = tl.load(qS + p_n, mask=m_n, other=0.)
            b_v = tl.load(v + p_n, mask=m_n, other=0.).to(tl.float32)
            b_bu = tl.load(buf_u + ((i_r * L + o_l[:, None]) * HV + i_h) * V + o_v[None, :],
                           mask=(o_l < n)[:, None], other=0.)                                 # [BL, BV]
            # d. the buffer's share of the reads: kr, qr [BN, BV] (sums over the first axis: a thread's own)
            b_kr = tl.sum(tl.trans(b_kBd)[:, :, None] * b_bu[:, None, :], 0)
            b_qr = tl.sum(tl.trans(b_qBd)[:, :, None] * b_bu[:, None, :], 0)
            # e. u = M (w - beta e^G S0^T k), o = qr + e^G S0^T q + P u
            b_x = b_beta[:, None] * (b_v - b_kr - b_eG[:, None] * b_kS)
            b_u = tl.sum(tl.trans(b_M)[:, :, None] * b_x[:, None, :], 0)
            b_o = b_qr + b_eG[:, None] * b_qS + tl.sum(tl.trans(b_P)[:, :, None] * b_u[:, None, :], 0)
            tl.store(u + p_n, b_u, mask=m_T[:, None])
            tl.store(o + p_n, b_o, mask=m_T[:, None])
