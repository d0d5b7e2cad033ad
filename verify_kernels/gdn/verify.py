"""Triton kernels for the Gated DeltaNet KVBuffer tree verify: a token tree per row (up to 64 nodes, ragged) on top
of its committed state S0 and buffer, one call for the batch, no per-node state. Semantics, shapes and pool
layout: verify_kernels.gdn.naive.gdn_verify_ref (the oracle); the math: docs/design.md section 2.

Three passes. Reading S0 is bound by memory, the tree math by latency, and one kernel doing both kept too few loads
in flight (0.9 TB/s of S0 on the H200); the products over K, inside the tree pass, took two thirds of its time
(registers at the limit left no room to overlap their loads).
1. state pass, one program per (row, value head, V block of STATE_BLOCK_V): the [K, BV] tile of S0 read once, in
   one load (not at all for rows without a state), multiplied with all the nodes' k and q: S0^T k_t and S0^T q_t
   into a small fp32 scratch [B, T, HV, V] each. Up to FMA_MAX_NODES nodes one node at a time on the FMA units,
   beyond that as one tl.dot (faster for many nodes, slower for few: the tile's conversion for the tensor cores
   costs more than a few products);
2. products pass, one program per (row, key head), shared by the key head's value heads: k.k and q.k of the
   nodes against the buffer keys and against each other, [BT, BL] and [BT, BT] into a scratch, padding zeroed;
3. tree pass, one program per (row, value head, V block), holding all T nodes (padded to BT, a power of two >= 16
   for tl.dot):
   a. node G = G of the last buffered entry + ancestors-incl-self @ g;
   b. reads of the committed state: e^{G_t} S0^T x_t (from the state pass) + (x_t . k_i) e^{G_t - G_i} @ u_i over
      the buffer (x = k, q);
   c. the nodes' u solve (I + diag(beta) A) u = beta (v - k reads), A[t, i] = e^{G_t - G_i} (k_t . k_i) for i a
      strict ancestor of t: A is strictly lower triangular since parents come first, so forward substitution in
      node order (column by column: once u_t is final, subtract its share from the later rows) needs
      num_nodes - 1 steps;
   d. o = q reads + ((q . k) e^{G_t - G_i} on ancestors-incl-self) @ u.
Decays are exponentiated only as G differences <= 0 (or a single G), masked pairs set to -inf first. Padding nodes
load as zeros (whatever the input holds), so they come out as zeros and add nothing.
"""

from functools import partial

import torch
import triton
import triton.language as tl

from verify_kernels.gdn.decode import INDEX_DTYPES, INPUT_DTYPES, check_heads, check_pools, check_shape, check_tensors
from verify_kernels.tree import ancestor_mask

# State pass: V columns per program and warps, swept on the H200 at Qwen3.5-9B shapes, batch 128 (4-chain: one node
# at a time, 64 columns, 2 warps: 87 us, 3.1 TB/s of S0; tl.dot with tf32x3: 156 us; 16-node tree: tl.dot,
# 64 columns, 4 warps: 180 us, one node at a time: 250 us; whole verify of an 8-node tree: 280 us one node at a
# time, 311 us with tl.dot).
STATE_BLOCK_V = 64
FMA_MAX_NODES = 8
STATE_WARPS_FMA = 2
STATE_WARPS_DOT = 4
# Products pass: K columns per step.
PRODUCTS_BLOCK_K = 64

# Tree and products passes. BV: V columns per program of the tree pass (each program repeats the solve for its
# V block, so larger blocks do less repeated work but hold more registers). Swept on the H200 at Qwen3.5-9B shapes,
# batch 128, 4-chain / 8-node / 16-node tree: BV = 128 with tf32x3 was fastest (ieee took 1.8-2x as long, BV = 64
# 1.6x); 2 warps gave 212 / 281 / 351 us for the whole verify against 257 / 327 / 401 us with 4; the products pass
# spilled registers with 128 K columns per step (5x slower than 64). Never 8 warps: with 64-node blocks and tf32x3
# products, Triton 3.6 built a kernel that made illegal memory accesses on the H200.
BLOCK_V = 128
NUM_WARPS = 2
# fp32 products: "ieee" runs them on the FMA units; "tf32x3" on the tensor cores in three TF32 passes, which keeps
# fp32-level error (~1e-7 relative here) at a fraction of the time.
DOT_PRECISION = "tf32x3"

MAX_NODES = 64


@triton.jit
def gdn_verify_state_kernel(
    q,             # [B, T, H, K]
    k,             # [B, T, H, K]
    num_nodes,     # [B]
    state_pool,    # [S, HV, K, V] fp32
    state_slots,   # [B]
    kS,            # [B, T, HV, V] fp32 out: S0^T k_t (rows with a state only)
    qS,            # [B, T, HV, V] fp32 out: S0^T q_t
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    USE_DOT: tl.constexpr,     # all nodes as one tl.dot, else one node at a time
    PRECISION: tl.constexpr,
):
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    if i_s >= 0:
        i_hk = i_h // (HV // H)
        nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
        o_k = tl.arange(0, K)
        o_v = i_v * BV + tl.arange(0, BV)
        # S0 is streamed once and not reused: evict it first so the nodes and buffers keep the L2
        b_s = tl.load(state_pool + ((i_s * HV + i_h) * K + o_k[:, None]) * V + o_v[None, :],
                      eviction_policy="evict_first")
        if USE_DOT:
            o_t = tl.arange(0, BT)
            m_t = o_t < nn
            p_x = ((i_b * T + o_t[:, None]) * H + i_hk) * K + o_k[None, :]
            b_k = tl.load(k + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
            b_q = tl.load(q + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
            p_o = ((i_b * T + o_t[:, None]) * HV + i_h) * V + o_v[None, :]
            m_o = m_t[:, None]
            tl.store(kS + p_o, tl.dot(b_k, b_s, input_precision=PRECISION), mask=m_o)
            tl.store(qS + p_o, tl.dot(b_q, b_s, input_precision=PRECISION), mask=m_o)
        else:
            for t in range(0, nn):
                p_x = ((i_b * T + t) * H + i_hk) * K + o_k
                b_k = tl.load(k + p_x).to(tl.float32)
                b_q = tl.load(q + p_x).to(tl.float32)
                p_o = ((i_b * T + t) * HV + i_h) * V + o_v
                tl.store(kS + p_o, tl.sum(b_s * b_k[:, None], 0))
                tl.store(qS + p_o, tl.sum(b_s * b_q[:, None], 0))


@triton.jit
def gdn_verify_products_kernel(
    q,             # [B, T, H, K]
    k,             # [B, T, H, K]
    num_nodes,     # [B]
    buf_k,         # [R, L, H, K] fp32
    buf_len,       # [R]
    req_slots,     # [B]
    kB,            # [B, H, BT, BL] fp32 out: k_t . k_i over buffer entries i (0 at padding)
    qB,            # [B, H, BT, BL] fp32 out: q_t . k_i
    kk,            # [B, H, BT, BT] fp32 out: k_t . k_i over nodes i
    qk,            # [B, H, BT, BT] fp32 out: q_t . k_i
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    L: tl.constexpr,
    BT: tl.constexpr,
    BL: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_h, i_b = tl.program_id(0), tl.program_id(1)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    n = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
    nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
    o_t = tl.arange(0, BT)
    o_l = tl.arange(0, BL)
    m_t = o_t < nn            # valid nodes; padding loads as 0 (inputs there may be NaN)
    m_l = o_l < n             # valid buffer entries; past buf_len they are stale
    b_kB = tl.zeros([BT, BL], dtype=tl.float32)
    b_qB = tl.zeros([BT, BL], dtype=tl.float32)
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    b_qk = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(0, K, BK):
        o_k = i_k + tl.arange(0, BK)
        p_x = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        b_q = tl.load(q + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
        b_k = tl.load(k + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
        p_bk = buf_k + ((i_r * L + o_l[:, None]) * H + i_h) * K + o_k[None, :]
        b_bk = tl.trans(tl.load(p_bk, mask=m_l[:, None], other=0.))          # [BK, BL]
        b_kB += tl.dot(b_k, b_bk, input_precision=PRECISION)
        b_qB += tl.dot(b_q, b_bk, input_precision=PRECISION)
        b_kk += tl.dot(b_k, tl.trans(b_k), input_precision=PRECISION)
        b_qk += tl.dot(b_q, tl.trans(b_k), input_precision=PRECISION)
    p_B = ((i_b * H + i_h) * BT + o_t[:, None]) * BL + o_l[None, :]
    tl.store(kB + p_B, b_kB)
    tl.store(qB + p_B, b_qB)
    p_T = ((i_b * H + i_h) * BT + o_t[:, None]) * BT + o_t[None, :]
    tl.store(kk + p_T, b_kk)
    tl.store(qk + p_T, b_qk)


@triton.jit
def gdn_verify_kernel(
    q,             # [B, T, H, K]
    k,             # [B, T, H, K]
    v,             # [B, T, HV, V]
    g,             # [B, T, HV]
    beta,          # [B, T, HV]
    ancestors,     # [B, T, T] uint8: [b, t, i] = 1 iff i is t or an ancestor of t
    num_nodes,     # [B]
    kB,            # [B, H, BT, BL] fp32: k_t . k_i over buffer entries, from the products pass
    qB,            # [B, H, BT, BL] fp32
    kk,            # [B, H, BT, BT] fp32: k_t . k_i over nodes
    qk,            # [B, H, BT, BT] fp32
    kS,            # [B, T, HV, V] fp32: S0^T k_t from the state pass (rows with a state only)
    qS,            # [B, T, HV, V] fp32: S0^T q_t
    state_slots,   # [B]
    buf_k,         # [R, L, H, K] fp32
    buf_u,         # [R, L, HV, V] fp32
    buf_gcum,      # [R, L, HV] fp32
    buf_len,       # [R]
    req_slots,     # [B]
    o,             # [B, T, HV, V] fp32
    u,             # [B, T, HV, V] fp32
    gcum,          # [B, T, HV] fp32
    T,             # not constexpr: tree sizes change every step; only BT picks a compiled kernel
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BT: tl.constexpr,
    BL: tl.constexpr,
    BV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_b, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hk = i_h // (HV // H)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    n = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
    nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)

    o_t = tl.arange(0, BT)
    o_l = tl.arange(0, BL)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t = o_t < nn            # valid nodes; padding loads as 0 (inputs there may be NaN)
    m_l = o_l < n             # valid buffer entries; past buf_len they are stale

    # products over K, from the products pass (S0^T k_t and S0^T q_t from the state pass)
    p_B = ((i_b * H + i_hk) * BT + o_t[:, None]) * BL + o_l[None, :]
    b_kB = tl.load(kB + p_B)                       # [BT, BL]
    b_qB = tl.load(qB + p_B)
    p_T = ((i_b * H + i_hk) * BT + o_t[:, None]) * BT + o_t[None, :]
    b_kk = tl.load(kk + p_T)                       # [BT, BT]
    b_qk = tl.load(qk + p_T)
    b_kS = tl.zeros([BT, BV], dtype=tl.float32)
    b_qS = tl.zeros([BT, BV], dtype=tl.float32)
    if i_s >= 0:
        p_S = ((i_b * T + o_t[:, None]) * HV + i_h) * V + o_v[None, :]
        b_kS = tl.load(kS + p_S, mask=m_t[:, None], other=0.)
        b_qS = tl.load(qS + p_S, mask=m_t[:, None], other=0.)

    # a. node G along root paths, from the last buffered entry's G (0 for an empty buffer)
    m_tt = m_t[:, None] & m_t[None, :]
    p_anc = ancestors + (i_b * T + o_t[:, None]) * T + o_t[None, :]
    b_anc = (tl.load(p_anc, mask=m_tt, other=0) != 0) & m_tt
    b_g = tl.load(g + (i_b * T + o_t) * HV + i_h, mask=m_t, other=0.).to(tl.float32)
    b_beta = tl.load(beta + (i_b * T + o_t) * HV + i_h, mask=m_t, other=0.).to(tl.float32)
    b_bg = tl.load(buf_gcum + (i_r * L + o_l) * HV + i_h, mask=m_l, other=0.)
    b_G = tl.sum(tl.where(o_l == n - 1, b_bg, 0.), 0) + tl.sum(tl.where(b_anc, b_g[None, :], 0.), 1)   # [BT]

    # b. reads of the committed state S0 + buffer
    b_bu = tl.load(buf_u + ((i_r * L + o_l[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_l[:, None], other=0.)
    b_dB = tl.exp(tl.where(m_l[None, :], b_G[:, None] - b_bg[None, :], float("-inf")))       # [BT, BL]
    b_eG = tl.exp(b_G)[:, None]
    b_kr = b_eG * b_kS + tl.dot(b_kB * b_dB, b_bu, input_precision=PRECISION)                    # [BT, BV]
    b_qr = b_eG * b_qS + tl.dot(b_qB * b_dB, b_bu, input_precision=PRECISION)

    # c. forward substitution: b_u holds beta (v - reads) minus the shares of the nodes solved so far
    b_dT = tl.exp(tl.where(b_anc, b_G[:, None] - b_G[None, :], float("-inf")))              # [BT, BT]
    b_A = tl.where(o_t[:, None] != o_t[None, :], b_beta[:, None] * b_kk * b_dT, 0.)          # diag(beta) A
    b_v = tl.load(v + ((i_b * T + o_t[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_t[:, None], other=0.)
    b_u = b_beta[:, None] * (b_v.to(tl.float32) - b_kr)
    for t in range(0, nn - 1):
        b_ut = tl.sum(tl.where(o_t[:, None] == t, b_u, 0.), 0)                                # [BV], final
        b_at = tl.sum(tl.where(o_t[None, :] == t, b_A, 0.), 1)                                # [BT], rows > t
        b_u -= b_at[:, None] * b_ut[None, :]

    # d. outputs
    b_o = b_qr + tl.dot(b_qk * b_dT, b_u, input_precision=PRECISION)
    p_o = ((i_b * T + o_t[:, None]) * HV + i_h) * V + o_v[None, :]
    m_o = o_t[:, None] < T
    tl.store(o + p_o, b_o, mask=m_o)
    tl.store(u + p_o, b_u, mask=m_o)
    if i_v == 0:
        tl.store(gcum + (i_b * T + o_t) * HV + i_h, tl.where(m_t, b_G, 0.), mask=o_t < T)


def verify_blocks(T: int, L: int) -> tuple[int, int]:
    """BT, BL: the node and buffer counts padded to powers of two >= 16 (tl.dot's smallest)."""
    return max(16, triton.next_power_of_2(T)), max(16, triton.next_power_of_2(L))


def verify_scratch_bytes(T: int, L: int, H: int, HV: int, V: int) -> int:
    """Bytes of scratch one request's verify of T nodes takes in one layer: the outputs' companions u and G (the
    nodes' buffer entries), S0^T k and S0^T q, and the products over K. None of it is a state: a state is
    [HV, K, V]."""
    BT, BL = verify_blocks(T, L)
    return 4 * (T * HV * V + T * HV + 2 * T * HV * V + 2 * H * BT * (BL + BT))


def gdn_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_k: torch.Tensor,
    buf_u: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
    ancestors: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A token tree per row on top of its committed S0 + buffer; writes nothing, forms no per-node state
    (gdn_verify_ref).

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g, beta: [B, T, HV] (fp32, bf16 or fp16); parents: [B, T] and
    num_nodes: [B] int32 / int64 (verify_kernels.tree; T <= 64); pools as in gdn_decode. ancestors: [B, T, T]
    bool, verify_kernels.tree.ancestor_mask(parents, num_nodes), shared by the layers of a step; computed here
    when None, which validates the trees and so synchronises with the device: pass it under CUDA graphs.
    Returns o [B, T, HV, V] and the nodes' buffer entries u [B, T, HV, V] and gcum [B, T, HV], float32, zeros at
    padding nodes.
    """
    B, T = q.shape[:2]
    H, HV, K, V = check_heads(q, k, v)
    if not 1 <= T <= MAX_NODES:
        raise ValueError(f"T must be in [1, {MAX_NODES}], got {T}")
    check_shape("q", q, (B, T, H, K))
    check_shape("v", v, (B, T, HV, V))
    check_shape("g", g, (B, T, HV))
    check_shape("beta", beta, (B, T, HV))
    check_shape("parents", parents, (B, T))
    check_shape("num_nodes", num_nodes, (B,))
    check_tensors(INPUT_DTYPES, q=q, k=k, v=v, g=g, beta=beta)
    check_tensors(INDEX_DTYPES, parents=parents, num_nodes=num_nodes)
    L = check_pools(B, H, HV, K, V, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots)
    if ancestors is None:
        ancestors = ancestor_mask(parents.long(), num_nodes.long())
    check_shape("ancestors", ancestors, (B, T, T))
    check_tensors((torch.bool,), ancestors=ancestors)

    BV = min(V, BLOCK_V)
    BT, BL = verify_blocks(T, L)
    new = partial(torch.empty, dtype=torch.float32, device=q.device)
    o, u, gcum = new(B, T, HV, V), new(B, T, HV, V), new(B, T, HV)
    # scratch between the passes (verify_scratch_bytes): S0^T k and S0^T q, written for rows with a state and read
    # for those rows only; the products over K, written in full
    kS, qS = new(B, T, HV, V), new(B, T, HV, V)
    kB, qB, kk, qk = new(B, H, BT, BL), new(B, H, BT, BL), new(B, H, BT, BT), new(B, H, BT, BT)
    BVS = min(V, STATE_BLOCK_V)
    use_dot = T > FMA_MAX_NODES
    gdn_verify_state_kernel[(V // BVS, HV, B)](
        q, k, num_nodes, state_pool, state_slots, kS, qS,
        T=T, H=H, HV=HV, K=K, V=V, BT=BT, BV=BVS, USE_DOT=use_dot, PRECISION=DOT_PRECISION,
        num_warps=STATE_WARPS_DOT if use_dot else STATE_WARPS_FMA,
    )
    gdn_verify_products_kernel[(H, B)](
        q, k, num_nodes, buf_k, buf_len, req_slots, kB, qB, kk, qk,
        T=T, H=H, K=K, L=L, BT=BT, BL=BL, BK=min(K, PRODUCTS_BLOCK_K), PRECISION=DOT_PRECISION, num_warps=NUM_WARPS,
    )
    gdn_verify_kernel[(B, HV, V // BV)](
        q, k, v, g, beta, ancestors.view(torch.uint8), num_nodes, kB, qB, kk, qk, kS, qS, state_slots, buf_k,
        buf_u, buf_gcum, buf_len, req_slots, o, u, gcum,
        T=T, H=H, HV=HV, K=K, V=V, L=L, BT=BT, BL=BL, BV=BV, PRECISION=DOT_PRECISION, num_warps=NUM_WARPS,
    )
    return o, u, gcum
