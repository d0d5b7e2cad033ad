"""The GDN verify's tree pass for small trees with several rows packed into one program's tiles (verify.PACKED_ROWS).

The tree pass (verify.py, gdn_verify_tree_kernel) pads each row's nodes to BT = 16, tl.dot's smallest tile: a
5-node chain leaves 11 of 16 rows of every node tile empty, and the pass is issue-bound (ncu, H200, 2026-12-03: 83 M
instructions at batch 256, 20 K a program). Here R = BT // T rows share a program (R x T <= BT): packed node p is
node p % T of row p // T of the program's group. The products among the nodes and the triangular solve then serve R
rows at once: their tiles are block-diagonal (pairs of nodes from different rows are masked out, as ancestors are
only ever of the same row), and the forward substitution runs over the packed order, in which each row's parents
still come before its children. The buffer's products take the R rows' buffers side by side (R x L entries, each
node against its own row's entries alone), so they cost per row what they cost before. The math per row is the tree
pass's (verify.py's docstring, a.-e.); the state pass's S0^T k and S0^T q come in as before.
"""

import triton
import triton.language as tl

from verify_kernels.gdn.tree_math import finish, products, row_halves


@triton.jit
def group_rows(o_p, per_row, i_grp, B, ROWS: tl.constexpr):
    """Packed positions o_p, per_row of them a row, of row group i_grp -> each one's row slot in the group, its row
    (int64, 0 where none) and whether that row exists."""
    j = o_p // per_row
    row = i_grp * ROWS + j
    m_row = (j < ROWS) & (row < B)
    return j, tl.where(m_row, row, 0).to(tl.int64), m_row


@triton.jit
def packed_nodes(o_p, i_grp, num_nodes, B, T, ROWS: tl.constexpr):
    """Packed node indices o_p of row group i_grp -> their index in [B, T] (0 where none) and whether each is a real
    node (its row exists and the node is below the row's count)."""
    _, row, m_row = group_rows(o_p, T, i_grp, B, ROWS)
    nn = tl.where(m_row, tl.minimum(tl.load(num_nodes + row).to(tl.int32), T), 0)
    return row * T + o_p % T, m_row & (o_p % T < nn)


@triton.jit
def gdn_verify_packed_kernel(
    q, k, v, g, beta,   # [B, T, H, K], [B, T, H, K], [B, T, HV, V], [B, T, HV], [B, T, HV]
    ancestors,          # [B, T, T] uint8: [b, t, i] = 1 iff i is t or an ancestor of t
    num_nodes,          # [B]
    state_slots,        # [B]
    kS, qS,             # [B, T, HV, V] fp32: S0^T k_t, S0^T q_t from the state pass (rows with a state)
    buf_k,              # [R, L, H, K] fp32 (the pools' R: request slots)
    buf_u,              # [R, L, HV, V] fp32
    buf_gcum,           # [R, L, HV] fp32
    buf_len,            # [R]
    req_slots,          # [B]
    o, u,               # [B, T, HV, V] fp32 out
    gcum,               # [B, T, HV] fp32 out
    B,
    T,                  # nodes per row (padded), R * T <= BT
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    ROWS: tl.constexpr,  # rows a program (R)
    BT: tl.constexpr,   # packed nodes, >= ROWS * T, a power of two >= 16
    BE: tl.constexpr,   # packed buffer entries, >= ROWS * L, a power of two >= 16
    BK: tl.constexpr,
    BV: tl.constexpr,
    GP: tl.constexpr,   # value heads per program, of one key head
    PRECISION: tl.constexpr,
    PRODUCTS_STAGES: tl.constexpr,
):
    i_hp, i_grp = tl.program_id(0), tl.program_id(1)
    i_h0 = i_hp * GP
    i_hk = i_h0 // (HV // H)
    # packed nodes: row slot and local node; packed entries: row slot and buffer position
    o_t = tl.arange(0, BT)
    t_loc = o_t % T
    j_t, b_t, m_row_t = group_rows(o_t, T, i_grp, B, ROWS)
    nn_t = tl.where(m_row_t, tl.minimum(tl.load(num_nodes + b_t).to(tl.int32), T), 0)
    r_t = tl.load(req_slots + b_t).to(tl.int64)
    s_t = tl.where(m_row_t, tl.load(state_slots + b_t).to(tl.int64), -1)
    n_t = tl.where(m_row_t, tl.minimum(tl.load(buf_len + r_t).to(tl.int32), L), 0)
    m_t = m_row_t & (t_loc < nn_t)                   # real nodes
    m_out = m_row_t & (t_loc < T)                    # every node slot of a real row is written
    node = b_t * T + t_loc                           # [BT] the node's index in [B, T]
    o_e = tl.arange(0, BE)
    l_e = o_e % L
    j_e, b_e, m_row_e = group_rows(o_e, L, i_grp, B, ROWS)
    r_e = tl.load(req_slots + b_e).to(tl.int64)
    n_e = tl.where(m_row_e, tl.minimum(tl.load(buf_len + r_e).to(tl.int32), L), 0)
    m_e = m_row_e & (l_e < n_e)                      # real entries
    entry = r_e * L + l_e                            # [BE] the entry's index in [R, L]
    same_te = (j_t[:, None] == j_e[None, :]) & m_t[:, None] & m_e[None, :]      # a node and its own row's entries

    # a. products over K: [k; q] of the packed nodes (2 BT rows, the nodes' indices recomputed for the stacked rows)
    # against their keys and against the buffers' keys
    o_s = tl.arange(0, 2 * BT)
    node_s, m_s = packed_nodes(o_s % BT, i_grp, num_nodes, B, T, ROWS)
    b_xk = tl.zeros([2 * BT, BT], dtype=tl.float32)
    b_xB = tl.zeros([2 * BT, BE], dtype=tl.float32)
    for i_k in tl.range(0, K, BK, num_stages=PRODUCTS_STAGES):
        o_k = i_k + tl.arange(0, BK)
        p_s = (node_s[:, None] * H + i_hk) * K + o_k[None, :]
        b_xc = tl.load(tl.where((o_s < BT)[:, None], k + p_s, q + p_s), mask=m_s[:, None], other=0.).to(tl.float32)
        p_x = (node[:, None] * H + i_hk) * K + o_k[None, :]
        b_kc = tl.load(k + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
        b_bkc = tl.load(buf_k + (entry[:, None] * H + i_hk) * K + o_k[None, :], mask=m_e[:, None], other=0.)
        b_xk += products(b_xc, b_kc, False, PRECISION)
        b_xB += products(b_xc, b_bkc, False, PRECISION)
    b_kk, b_qk = row_halves(b_xk, BT, BT)
    b_kB, b_qB = row_halves(b_xB, BT, BE)

    # ancestors, block-diagonal: [p, p'] for nodes of the same row only
    m_tt = m_t[:, None] & m_t[None, :] & (j_t[:, None] == j_t[None, :])
    b_anc = (tl.load(ancestors + node[:, None] * T + t_loc[None, :], mask=m_tt, other=0) != 0) & m_tt
    for i_g in tl.static_range(GP):
        i_h = i_h0 + i_g
        b_g = tl.load(g + node * HV + i_h, mask=m_t, other=0.).to(tl.float32)
        b_beta = tl.load(beta + node * HV + i_h, mask=m_t, other=0.).to(tl.float32)
        b_bg = tl.load(buf_gcum + entry * HV + i_h, mask=m_e, other=0.)
        g_last = tl.load(buf_gcum + (r_t * L + tl.maximum(n_t - 1, 0)) * HV + i_h, mask=n_t > 0, other=0.)
        # b. and c. (tree_math.head_weights per row, here for the packed rows at once)
        b_G = g_last + tl.sum(tl.where(b_anc, b_g[None, :], 0.), 1)
        b_dT = tl.exp(tl.where(b_anc, b_G[:, None] - b_G[None, :], float("-inf")))
        b_dB = tl.exp(tl.where(same_te, b_G[:, None] - b_bg[None, :], float("-inf")))
        b_A = tl.where(o_t[:, None] != o_t[None, :], b_beta[:, None] * b_kk * b_dT, 0.)
        b_M = tl.where(o_t[:, None] == o_t[None, :], 1., 0.)
        for t in range(0, ROWS * T - 1):  # the packed order: each row's parents before its children
            b_mt = tl.sum(tl.where(o_t[:, None] == t, b_M, 0.), 0)
            b_at = tl.sum(tl.where(o_t[None, :] == t, b_A, 0.), 1)
            b_M -= b_at[:, None] * b_mt[None, :]
        b_P = b_qk * b_dT
        tl.store(gcum + node * HV + i_h, tl.where(m_t, b_G, 0.), mask=m_out)
        b_kBd = b_kB * b_dB
        b_qBd = b_qB * b_dB
        for i_v in tl.range(0, V, BV, num_stages=PRODUCTS_STAGES):
            o_v = i_v + tl.arange(0, BV)
            p_n = (node[None, :] * HV + i_h) * V + o_v[:, None]                            # [BV, BT]
            m_s0 = (m_t & (s_t >= 0))[None, :]
            b_kS = tl.load(kS + p_n, mask=m_s0, other=0.)
            b_qS = tl.load(qS + p_n, mask=m_s0, other=0.)
            b_v = tl.load(v + p_n, mask=m_t[None, :], other=0.).to(tl.float32)
            b_bu = tl.load(buf_u + (entry[None, :] * HV + i_h) * V + o_v[:, None], mask=m_e[None, :], other=0.)
            # d. the buffer's share of the reads, each node from its own row's entries
            b_kr = products(b_bu, b_kBd, False, PRECISION)                                  # [BV, BT]
            b_qr = products(b_bu, b_qBd, False, PRECISION)
            b_w = b_beta[None, :] * (b_v - b_kr)
            b_u, b_o = finish(b_w, b_qr, b_kS, b_qS, b_G, b_beta, b_M, b_P, PRECISION, False)
            tl.store(u + p_n, b_u, mask=m_out[None, :])
            tl.store(o + p_n, b_o, mask=m_out[None, :])


def packed_rows(T: int, L: int, max_rows: int, block: int = 16, max_entries: int = 64) -> int:
    """Rows a program of the packed tree pass takes for T-node trees on L-entry buffers: as many as fit BT = block
    nodes and max_entries buffer entries, at most max_rows; under 2, packing buys nothing (0)."""
    rows = min(block // max(T, 1), max_entries // max(L, 1), max_rows)
    return rows if rows >= 2 else 0
