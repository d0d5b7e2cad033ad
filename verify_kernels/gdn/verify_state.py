"""The state pass of the Gated DeltaNet tree verify (verify_kernels/gdn/verify.py, whose docstring has the math
and the passes): S0^T k_t and S0^T q_t of every node, the only part that streams the committed state, into a scratch
[B, T, HV, V] each that the tree pass reads; and state_reads / state_tile, which the one-launch small-batch kernel
shares. Launch parameters live with the launcher (verify.py)."""

import triton
import triton.language as tl

from verify_kernels.precision import add_product_exact


@triton.jit
def state_reads(q, k, p_s, b_s, i_b, i_hk, nn, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BT: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, USE_DOT: tl.constexpr, PRECISION: tl.constexpr,
                EVICT: tl.constexpr, EXACT: tl.constexpr = False, PREFETCH: tl.constexpr = False,
                STAGES: tl.constexpr = 0):
    """e.'s reads of S0, whose [K, BV] tile starts at p_s (rows of V): S0^T k_t and S0^T q_t, [BV, BT] each. Up to a
    few nodes one at a time in fp32 on the FMA units, from the whole tile b_s (loaded by the caller, as early as it
    can); else as tensor-core dots (tf32x3) over BK rows of the tile at a time, loaded here, V columns on the dot's
    long side (a whole-K operand, or one with the nodes on it, sits in every warp); EXACT: q and k hold values exact in
    TF32 (a bf16 / fp16 model's), whose remainders' products the dots skip. PREFETCH: one node at a time, the next
    node's k and q in flight during this node's sums (the one-launch kernel's loads first, verify_fused.py). STAGES:
    the dots' loop over K unrolled (0), or software-pipelined by Triton in that many stages (S0's slices streamed into
    shared memory ahead of their products: verify.STATE_DOT_STAGES)."""
    o_t = tl.arange(0, BT)
    b_kS = tl.zeros([BV, BT], dtype=tl.float32)
    b_qS = tl.zeros([BV, BT], dtype=tl.float32)
    if USE_DOT and STAGES:
        m_t = o_t < nn
        for i_k in tl.range(0, K, BK, num_stages=STAGES):
            b_kS, b_qS = state_dots(q, k, p_s, b_kS, b_qS, i_b, i_hk, i_k, m_t, T, H, K, V, BT, BV, BK, PRECISION,
                                    EVICT, EXACT)
    elif USE_DOT:
        m_t = o_t < nn
        for i_k in tl.static_range(0, K, BK):
            b_kS, b_qS = state_dots(q, k, p_s, b_kS, b_qS, i_b, i_hk, i_k, m_t, T, H, K, V, BT, BV, BK, PRECISION,
                                    EVICT, EXACT)
    else:
        o_k = tl.arange(0, K)
        p_x = (i_b * T * H + i_hk) * K + o_k
        if PREFETCH:
            b_k = tl.load(k + p_x).to(tl.float32)
            b_q = tl.load(q + p_x).to(tl.float32)
        for t in range(0, nn):
            if PREFETCH:  # (the last node reloads itself)
                p_xn = p_x + tl.minimum(t + 1, nn - 1) * (H * K)
                b_kn = tl.load(k + p_xn).to(tl.float32)
                b_qn = tl.load(q + p_xn).to(tl.float32)
            else:
                p_xt = ((i_b * T + t) * H + i_hk) * K + o_k
                b_k = tl.load(k + p_xt).to(tl.float32)
                b_q = tl.load(q + p_xt).to(tl.float32)
            b_kt = tl.sum(b_s * b_k[:, None], 0)                                               # [BV]
            b_qt = tl.sum(b_s * b_q[:, None], 0)
            b_kS = tl.where(o_t[None, :] == t, b_kt[:, None], b_kS)
            b_qS = tl.where(o_t[None, :] == t, b_qt[:, None], b_qS)
            if PREFETCH:
                b_k, b_q = b_kn, b_qn
    return b_kS, b_qS


@triton.jit
def state_dots(q, k, p_s, b_kS, b_qS, i_b, i_hk, i_k, m_t, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               BT: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr, EVICT: tl.constexpr,
               EXACT: tl.constexpr):
    """state_reads' dots for S0's rows i_k .. i_k + BK: (b_kS, b_qS) + their products with the nodes' k and q."""
    o_t = tl.arange(0, BT)
    o_k = i_k + tl.arange(0, BK)
    b_sc = tl.load(p_s + o_k[:, None] * V + tl.arange(0, BV)[None, :], eviction_policy=EVICT)    # [BK, BV]
    p_x = ((i_b * T + o_t[None, :]) * H + i_hk) * K + o_k[:, None]
    b_kx = tl.load(k + p_x, mask=m_t[None, :], other=0.).to(tl.float32)                          # [BK, BT]
    b_qx = tl.load(q + p_x, mask=m_t[None, :], other=0.).to(tl.float32)
    b_kS = add_product_exact(b_kS, tl.trans(b_sc), b_kx, PRECISION, False, EXACT)
    b_qS = add_product_exact(b_qS, tl.trans(b_sc), b_qx, PRECISION, False, EXACT)
    return b_kS, b_qS


@triton.jit
def state_tile(p_s, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, USE_DOT: tl.constexpr, EVICT: tl.constexpr):
    """The whole [K, BV] tile of S0 at p_s for the node-at-a-time reads (USE_DOT: a placeholder, the dots load their
    own blocks)."""
    if USE_DOT:
        b_s = tl.zeros([K, BV], dtype=tl.float32)
    else:
        b_s = tl.load(p_s + tl.arange(0, K)[:, None] * V + tl.arange(0, BV)[None, :], eviction_policy=EVICT)
    return b_s


@triton.jit
def gdn_verify_state_kernel(
    q, k,               # [B, T, H, K]
    num_nodes,          # [B]
    state_pool,         # [S, HV, K, V] fp32
    state_slots,        # [B]
    kS, qS,             # [B, T, HV, V] fp32 out: S0^T k_t, S0^T q_t (rows with a state, nodes < num_nodes only)
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    BK: tl.constexpr,
    G: tl.constexpr,    # value heads per program, all of one key head (1 with USE_DOT)
    NG: tl.constexpr,   # G padded to a power of two
    USE_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    EXACT: tl.constexpr,  # q and k exact in TF32 (bf16 / fp16): the dots skip their remainders' products
    STAGES: tl.constexpr,  # the dots' loop over K software-pipelined in that many stages, or unrolled (0)
):
    i_v, i_g, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    if i_s >= 0:
        i_h0 = i_g * G
        i_hk = i_h0 // (HV // H)
        nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
        o_v = i_v * BV + tl.arange(0, BV)
        if USE_DOT:
            o_t = tl.arange(0, BT)
            # S0 is streamed once and not reused: evict it first so the nodes keep the L2
            p_s = state_pool + (i_s * HV + i_h0) * (K * V) + i_v * BV
            b_kS, b_qS = state_reads(q, k, p_s, tl.zeros([K, BV], dtype=tl.float32), i_b, i_hk, nn, T, H, K, V, BT,
                                     BV, BK, True, PRECISION, "evict_first", EXACT, False, STAGES)
            p_n = ((i_b * T + o_t[None, :]) * HV + i_h0) * V + o_v[:, None]
            m_n = (o_t < nn)[None, :]
            tl.store(kS + p_n, b_kS, mask=m_n)
            tl.store(qS + p_n, b_qS, mask=m_n)
        else:
            o_g = tl.arange(0, NG)
            o_k = tl.arange(0, K)
            m_g = o_g < G
            p_s = state_pool + (((i_s * HV + i_h0 + o_g[:, None, None]) * K + o_k[None, :, None]) * V
                                + o_v[None, None, :])
            b_s = tl.load(p_s, mask=m_g[:, None, None], other=0., eviction_policy="evict_first")  # [NG, K, BV]
            p_x = (i_b * T * H + i_hk) * K + o_k
            b_k = tl.load(k + p_x).to(tl.float32)
            b_q = tl.load(q + p_x).to(tl.float32)
            p_n = ((i_b * T) * HV + i_h0 + o_g[:, None]) * V + o_v[None, :]                      # [NG, BV], node 0
            for t in range(0, nn):
                # the next node's k and q in flight during this node's products (the last node reloads itself)
                p_xn = p_x + tl.minimum(t + 1, nn - 1) * (H * K)
                b_kn = tl.load(k + p_xn).to(tl.float32)
                b_qn = tl.load(q + p_xn).to(tl.float32)
                tl.store(kS + p_n + t * (HV * V), tl.sum(b_s * b_k[None, :, None], 1), mask=m_g[:, None])
                tl.store(qS + p_n + t * (HV * V), tl.sum(b_s * b_q[None, :, None], 1), mask=m_g[:, None])
                b_k, b_q = b_kn, b_qn
