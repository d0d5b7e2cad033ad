"""The Gated DeltaNet verify in one launch, for batches up to verify.FUSED_MAX_BATCH rows (batch 1), where a second
launch costs more than the bytes: one program per (V block, value head, row) does the state pass's and the tree
pass's work (verify.py's docstring: steps a.-e.; the oracle: naive.gdn_verify_ref).

At batch 1 the op is a chain of dependent steps, not bytes (a 4-chain moves 2.4 MiB, 0.6 us at copy bandwidth,
against 11.7 us on the H200: benchmarks/results/kernels_h200.json), and part of that chain is waiting on memory:
where the inputs rotate over 2 GiB, as the benchmark's do and an engine step's states do, each wait on HBM is a
round trip with TLB and L2 misses. As first written the program waits in turn on the slots, then S0's tile and the
buffer's length, then q, k and the buffer's keys in its loop over K (their masks need that length), then g, beta,
the ancestors and the buffer's G after the loop, then v and the buffer's u after the triangular solve. LOADS_FIRST
(verify.FUSED_LOADS_FIRST) issues all of these once the slots are in: every buffer entry is loaded (the pool holds
L of them) and the stale ones selected away after the length arrives, as the padding nodes are (a select, not a
product: they may hold NaN); so two round trips before the products where there were five. And the state's reads
one node at a time load the next node's k and q during this node's sums.
"""

import triton
import triton.language as tl

from verify_kernels.gdn.tree_math import (
    buffer_reads,
    finish,
    head_weights,
    node_inputs,
    node_products,
    value_inputs,
    value_reads,
)
from verify_kernels.gdn.verify_state import state_reads, state_tile


@triton.jit
def gdn_verify_fused_kernel(
    q, k, v, g, beta,   # [B, T, H, K], [B, T, H, K], [B, T, HV, V], [B, T, HV], [B, T, HV]
    ancestors,          # [B, T, T] uint8
    num_nodes,          # [B]
    state_pool,         # [S, HV, K, V] fp32
    state_slots,        # [B]
    buf_k, buf_u, buf_gcum,   # [R, L, H, K], [R, L, HV, V], [R, L, HV] fp32
    buf_len,            # [R]
    req_slots,          # [B]
    o, u, gcum,         # [B, T, HV, V], [B, T, HV, V], [B, T, HV] fp32 out
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BT: tl.constexpr,
    BL: tl.constexpr,
    BK: tl.constexpr,
    BKS: tl.constexpr,
    BV: tl.constexpr,
    USE_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    PRODUCTS_STAGES: tl.constexpr,
    EXACT: tl.constexpr,  # q and k exact in TF32 (bf16 / fp16): their products skip the remainders' (precision.py)
    LOADS_FIRST: tl.constexpr,  # every load issued once the slots are in (the module's docstring)
):
    """The two passes in one program per (row, value head, V block), for small batches."""
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hk = i_h // (HV // H)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_T = o_t < T
    if LOADS_FIRST:  # (every buffer entry: L in place of the length)
        b_g, b_beta, b_anc, b_bg = node_inputs(g, beta, ancestors, buf_gcum, i_b, i_r, i_h, L, nn, T, HV, L, BT, BL,
                                               1, 1)
        b_v, b_bu = value_inputs(v, buf_u, i_b, i_r, i_h, L, nn, o_v, T, HV, V, L, BT, BL)
    # S0 first (its tile when read a node at a time), so that its load is in flight during the tree math
    p_s = state_pool + tl.maximum(i_s, 0) * HV * (K * V) + i_h * (K * V) + i_v * BV
    b_s = tl.zeros([K, BV], dtype=tl.float32)
    if i_s >= 0:
        b_s = state_tile(p_s, K, V, BV, USE_DOT, "")
    n = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
    if LOADS_FIRST:
        b_kk, b_qk, b_kB, b_qB = node_products(q, k, buf_k, i_b, i_r, i_hk, L, nn, T, H, K, L, BT, BL, BK,
                                                 PRECISION, PRODUCTS_STAGES, EXACT)
        # stale entries away (a product with one is NaN or junk in its column only; head_weights selects G by n)
        m_l = tl.arange(0, BL) < n
        b_kB = tl.where(m_l[None, :], b_kB, 0.)
        b_qB = tl.where(m_l[None, :], b_qB, 0.)
        b_bu = tl.where(m_l[None, :], b_bu, 0.)
    else:
        b_kk, b_qk, b_kB, b_qB = node_products(q, k, buf_k, i_b, i_r, i_hk, n, nn, T, H, K, L, BT, BL, BK,
                                                 PRECISION, PRODUCTS_STAGES, EXACT)
        b_g, b_beta, b_anc, b_bg = node_inputs(g, beta, ancestors, buf_gcum, i_b, i_r, i_h, n, nn, T, HV, L, BT, BL,
                                               1, 1)
    b_beta = tl.sum(b_beta, 1)
    b_G, b_dB, b_M, b_P = head_weights(tl.sum(b_g, 1), b_beta, b_anc, tl.sum(b_bg, 1), b_kk, b_qk, n, nn, BT, BL)
    if LOADS_FIRST:
        b_w, b_qr = value_reads(b_v, b_bu, b_kB, b_qB, b_dB, b_beta, PRECISION)
    else:
        b_w, b_qr = buffer_reads(v, buf_u, b_kB, b_qB, b_dB, b_beta, i_b, i_r, i_h, n, nn, o_v, T, HV, V, L, BT, BL,
                                 PRECISION)
    b_kS = tl.zeros([BV, BT], dtype=tl.float32)
    b_qS = tl.zeros([BV, BT], dtype=tl.float32)
    if i_s >= 0:
        b_kS, b_qS = state_reads(q, k, p_s, b_s, i_b, i_hk, nn, T, H, K, V, BT, BV, BKS, USE_DOT, PRECISION, "",
                                 EXACT, LOADS_FIRST)
    b_u, b_o = finish(b_w, b_qr, b_kS, b_qS, b_G, b_beta, b_M, b_P, PRECISION)
    p_n = ((i_b * T + o_t[None, :]) * HV + i_h) * V + o_v[:, None]
    tl.store(u + p_n, b_u, mask=m_T[None, :])
    tl.store(o + p_n, b_o, mask=m_T[None, :])
    if i_v == 0:
        tl.store(gcum + (i_b * T + o_t) * HV + i_h, tl.where(o_t < nn, b_G, 0.), mask=m_T)
