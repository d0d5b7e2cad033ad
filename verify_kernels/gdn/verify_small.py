"""The tree pass of the Gated DeltaNet verify for small trees (up to verify.SMALL_TREE_MAX_NODES nodes: the chains and
small trees speculative decoding runs), node by node on the FMA units. The math and the passes: verify.py's
docstring; this kernel takes the tree pass's place (gdn_verify_tree_kernel) after the same state pass and writes the
same u, o and G.

Why a second tree pass: the tensor-core one pads a 5-node chain to 16 nodes (tl.dot's smallest side), so two thirds
of its V loop's products are padding, and each fp32 product is three TF32 ones plus the operands' splits and layout
conversions. That pass is issue-bound (ncu on the H200, 2026-12-03): instructions are its time. Here:
  a. the products over K stay on the tensor cores, [k; q] of the nodes (16 rows: up to 8 nodes) against the nodes'
     and the buffer's keys, once per program;
  b.-c. per value head, the decays and beta A (no solve: u is substituted forward below), as in the other pass;
  the program writes those weights to its own scratch and reads them back a node's row at a time (a barrier between:
  the CUDA memory model makes a block's global writes visible to the block after it): Triton has no indexing of a
  register tile by a loop variable, and a row's load from the L1 costs less than selecting it out of a tile;
  d.-e. node by node, t = 0 .. num_nodes - 1 (parents first), over the value head's V columns [BV] (on one warp a
     thread holds 4 columns, so the buffer's [BL, BV] tile keeps its entries in the thread and the sums over them
     are the thread's own): kr_t, qr_t from the buffer, x_t = beta_t (v_t - kr_t - e^G_t S0^T k_t),
     u_t = x_t - sum_i (beta A)[t, i] u_i, o_t = qr_t + e^G_t S0^T q_t + sum_i P[t, i] u_i; u and o stored a node at
     a time, padding nodes zeros. The work scales with the nodes there are, not with 16.
Grid (value-head groups of a key head, rows, programs along V): a small batch splits V over programs (each computing
its own a.-c.) so that one-warp programs are not too few for the GPU (verify.SMALL_TREE_FEW_ROWS).
"""

import triton
import triton.language as tl

from verify_kernels.gdn.tree_math import exact_products, head_weights, node_inputs

ROWS = 16  # the products' [k; q] rows: 2 BN <= 16 (tl.dot's smallest side), so BN <= 8


def node_block(T: int) -> int:
    """The pass's BN for T nodes: their next power of two, at least 2 (no size-1 tiles)."""
    return max(2, triton.next_power_of_2(T))


def scratch_floats(BN: int, BL: int, GP: int) -> int:
    """fp32 scratch of one program: the products [ROWS, 16 + BL], then per value head beta A and P [BN, BN], the
    decayed buffer products of the keys and queries [BN, BL] each, e^G and beta [BN]."""
    return ROWS * (16 + BL) + GP * head_floats(BN, BL)


def head_floats(BN: int, BL: int) -> int:
    return 2 * BN * BL + 2 * BN * BN + 2 * BN


@triton.jit
def node_rows(v, buf_u, kS, qS, u, o, p_w, p_A, p_P, p_eG, m_state, i_b, i_r, i_h, i_v, n, nn, T, HV: tl.constexpr,
              V: tl.constexpr, L: tl.constexpr, BN: tl.constexpr, BL: tl.constexpr, BLR: tl.constexpr,
              BV: tl.constexpr):
    """d.-e. for value head i_h's columns i_v .. i_v + BV, node by node, from the head's weights in the scratch at
    p_w (rows of BL), p_A, p_P, p_eG, over the buffer's first BLR entries (n <= BLR: the rest are empty)."""
    o_t = tl.arange(0, BN)
    o_l = tl.arange(0, BLR)
    m_T = o_t < T
    o_v = i_v + tl.arange(0, BV)
    b_bu = tl.load(buf_u + ((i_r * L + o_l[:, None]) * HV + i_h) * V + o_v[None, :],
                   mask=(o_l < n)[:, None], other=0.)                                 # [BLR, BV]
    b_u = tl.zeros([BN, BV], dtype=tl.float32)
    for t in range(0, nn):
        p_t = ((i_b * T + t) * HV + i_h) * V + o_v
        b_vt = tl.load(v + p_t).to(tl.float32)
        b_kSt = tl.load(kS + p_t, mask=m_state, other=0.)
        b_qSt = tl.load(qS + p_t, mask=m_state, other=0.)
        b_krt = tl.sum(tl.load(p_w + t * BL + o_l)[:, None] * b_bu, 0)                        # [BV]
        b_qrt = tl.sum(tl.load(p_w + BN * BL + t * BL + o_l)[:, None] * b_bu, 0)
        b_eGt = tl.load(p_eG + t)
        b_ut = tl.load(p_eG + BN + t) * (b_vt - b_krt - b_eGt * b_kSt)
        b_ut -= tl.sum(tl.load(p_A + t * BN + o_t)[:, None] * b_u, 0)
        b_u = tl.where(o_t[:, None] == t, b_ut[None, :], b_u)
        b_ot = b_qrt + b_eGt * b_qSt + tl.sum(tl.load(p_P + t * BN + o_t)[:, None] * b_u, 0)
        tl.store(u + p_t, b_ut)
        tl.store(o + p_t, b_ot)
    # padding nodes come out as zeros
    p_n = ((i_b * T + o_t[:, None]) * HV + i_h) * V + o_v[None, :]
    m_pad = ((o_t >= nn) & m_T)[:, None]
    tl.store(u + p_n, tl.zeros([BN, BV], dtype=tl.float32), mask=m_pad)
    tl.store(o + p_n, tl.zeros([BN, BV], dtype=tl.float32), mask=m_pad)


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
    scratch,            # [B * HV / GP * VP, scratch_floats(BN, BL, GP)] fp32: the program's own, written then read
    T,                  # not constexpr: tree sizes change every step; only BN picks a compiled kernel
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BN: tl.constexpr,   # node_block(T) <= 8
    BL: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GP: tl.constexpr,   # value heads per program, of one key head
    VP: tl.constexpr,   # programs along V: each takes V // VP columns, BV at a time
    NG: tl.constexpr,   # GP padded to a power of two
    PRECISION: tl.constexpr,
    EXACT: tl.constexpr,  # q and k exact in TF32 (bf16 / fp16): their products skip the remainders' (precision.py)
):
    XR: tl.constexpr = 16                        # ROWS: [k_t; q_t], BN rows each
    YC: tl.constexpr = 16 + BL                   # the nodes' keys (padded to 16), then the buffer's
    HEAD: tl.constexpr = 2 * BN * BL + 2 * BN * BN + 2 * BN
    i_hp, i_b, i_vp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h0 = i_hp * GP
    i_hk = i_h0 // (HV // H)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
    n = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
    p_scr = scratch + ((i_b * (HV // GP) + i_hp) * VP + i_vp) * (XR * YC + GP * HEAD)
    o_t = tl.arange(0, BN)
    o_l = tl.arange(0, BL)
    m_T = o_t < T
    # a. products over K: [k_t; q_t] (rows 0..BN-1, BN..2BN-1) against [the nodes' keys; the buffer's keys]
    o_x = tl.arange(0, XR)
    node_x = o_x % BN
    m_x = (o_x < 2 * BN) & (node_x < nn)
    o_y = tl.arange(0, 16)
    b_xn = tl.zeros([XR, 16], dtype=tl.float32)
    b_xb = tl.zeros([XR, BL], dtype=tl.float32)
    for i_k in range(0, K, BK):
        o_k = i_k + tl.arange(0, BK)
        p_x = ((i_b * T + node_x[:, None]) * H + i_hk) * K + o_k[None, :]
        b_x = tl.load(tl.where((o_x < BN)[:, None], k + p_x, q + p_x), mask=m_x[:, None], other=0.).to(tl.float32)
        p_y = ((i_b * T + o_y[:, None]) * H + i_hk) * K + o_k[None, :]
        b_kn = tl.load(k + p_y, mask=(o_y < nn)[:, None], other=0.).to(tl.float32)
        b_bk = tl.load(buf_k + ((i_r * L + o_l[:, None]) * H + i_hk) * K + o_k[None, :], mask=(o_l < n)[:, None],
                       other=0.)
        b_xn += exact_products(b_x, b_kn, PRECISION, EXACT, EXACT)
        b_xb += exact_products(b_x, b_bk, PRECISION, EXACT, False)
    tl.store(p_scr + o_x[:, None] * YC + o_y[None, :], b_xn)
    tl.store(p_scr + o_x[:, None] * YC + 16 + o_l[None, :], b_xb)
    tl.debug_barrier()
    b_kk = tl.load(p_scr + o_t[:, None] * YC + o_t[None, :])                                  # [BN, BN]
    b_qk = tl.load(p_scr + (BN + o_t[:, None]) * YC + o_t[None, :])
    b_kB = tl.load(p_scr + o_t[:, None] * YC + 16 + o_l[None, :])                             # [BN, BL]
    b_qB = tl.load(p_scr + (BN + o_t[:, None]) * YC + 16 + o_l[None, :])
    b_g2, b_beta2, b_anc, b_bg2 = node_inputs(g, beta, ancestors, buf_gcum, i_b, i_r, i_h0, n, nn, T, HV, L, BN, BL,
                                              GP, NG)
    o_g = tl.arange(0, NG)
    m_state = (tl.zeros([BV], dtype=tl.int32) + i_s.to(tl.int32)) >= 0                      # the row has a state
    for i_g in tl.static_range(GP):
        i_h = i_h0 + i_g
        # b.-c. the head's weights into its scratch: beta A, P, the decayed buffer products, e^G, beta
        p_w = p_scr + XR * YC + i_g * HEAD
        p_A = p_w + 2 * BN * BL
        p_P = p_A + BN * BN
        p_eG = p_P + BN * BN
        b_beta = tl.sum(tl.where(o_g[None, :] == i_g, b_beta2, 0.), 1)
        b_G, b_dB, b_A, b_P = head_weights(tl.sum(tl.where(o_g[None, :] == i_g, b_g2, 0.), 1), b_beta, b_anc,
                                           tl.sum(tl.where(o_g[None, :] == i_g, b_bg2, 0.), 1), b_kk, b_qk, n, nn, BN,
                                           BL, False)
        if i_vp == 0:
            tl.store(gcum + (i_b * T + o_t) * HV + i_h, tl.where(o_t < nn, b_G, 0.), mask=m_T)
        tl.store(p_w + o_t[:, None] * BL + o_l[None, :], b_kB * b_dB)
        tl.store(p_w + BN * BL + o_t[:, None] * BL + o_l[None, :], b_qB * b_dB)
        tl.store(p_A + o_t[:, None] * BN + o_t[None, :], b_A)
        tl.store(p_P + o_t[:, None] * BN + o_t[None, :], b_P)
        tl.store(p_eG + o_t, tl.exp(b_G))
        tl.store(p_eG + BN + o_t, b_beta)
        tl.debug_barrier()
        # d.-e. node by node over V blocks; a buffer at most half full sums over half the entries (the sums over
        # the buffer are most of a node's instructions: 300 against 402 for 5 nodes, sm_90)
        for i_v in range(0, V // VP, BV):
            i_v += i_vp * (V // VP)
            if n <= BL // 2:
                node_rows(v, buf_u, kS, qS, u, o, p_w, p_A, p_P, p_eG, m_state, i_b, i_r, i_h, i_v, n, nn, T, HV, V,
                          L, BN, BL, BL // 2, BV)
            else:
                node_rows(v, buf_u, kS, qS, u, o, p_w, p_A, p_P, p_eG, m_state, i_b, i_r, i_h, i_v, n, nn, T, HV, V,
                          L, BN, BL, BL, BV)
