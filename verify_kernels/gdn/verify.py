"""Triton kernels for the Gated DeltaNet KVBuffer tree verify: a token tree per row (up to 64 nodes, ragged) on top
of its committed state S0 and buffer, one call for the batch, no per-node state. Semantics, shapes and pool
layout: verify_kernels.gdn.naive.gdn_verify_ref (the oracle); the math: DESIGN.md section 2.

Two passes, as decode does (verify_kernels/gdn/decode.py): reading S0 is the part bound by memory, the tree math the
part bound by latency, and one kernel doing both kept too few loads in flight (0.9 TB/s of S0 on the H200).
1. state pass, one program per (row, value head, V block of STATE_BLOCK_V): the [K, BV] tile of S0 read once, in
   one load (not at all for rows without a state), multiplied with all the nodes' k and q: S0^T k_t and S0^T q_t
   into a small fp32 scratch [B, T, HV, V] each;
2. tree pass, one program per (row, value head, V block), holding all T nodes (padded to BT, a power of two >= 16
   for tl.dot):
   a. over K in blocks of BK: k.k and q.k against the buffer keys and the nodes;
   b. node G = G of the last buffered entry + ancestors-incl-self @ g;
   c. reads of the committed state: e^{G_t} S0^T x_t (from the state pass) + (x_t . k_i) e^{G_t - G_i} @ u_i over
      the buffer (x = k, q);
   d. the nodes' u solve (I + diag(beta) A) u = beta (v - k reads), A[t, i] = e^{G_t - G_i} (k_t . k_i) for i a
      strict ancestor of t: A is strictly lower triangular since parents come first, so forward substitution in
      node order (column by column: once u_t is final, subtract its share from the later rows) needs
      num_nodes - 1 steps;
   e. o = q reads + ((q . k) e^{G_t - G_i} on ancestors-incl-self) @ u.
Decays are exponentiated only as G differences <= 0 (or a single G), masked pairs set to -inf first. Padding nodes
load as zeros (whatever the input holds), so they come out as zeros and add nothing.
"""

import torch
import triton
import triton.language as tl

from verify_kernels.gdn.decode import INDEX_DTYPES, INPUT_DTYPES, check_heads, check_pools, check_shape, check_tensors
from verify_kernels.tree import ancestor_mask

# State pass: V columns per program (decode's state pass read S0 at 3.9-4.0 TB/s with [K, 64] tiles, 4 warps).
STATE_BLOCK_V = 64

# Tree pass launch parameters. BV: V columns per program (each program repeats the K products and the solve for
# its V block, so larger blocks do less repeated work but hold more registers); BK: K columns per step of the loop
# over K (bounds the live q, k and buffer-key tiles). Swept on the H200 at Qwen3.5-9B shapes, batch 128, when the
# tree pass still read S0 itself (BV 32/64/128, ieee/tf32x3, 4/8 warps, BK 32/64): BV = 128, BK = 32, tf32x3,
# 4 warps was fastest for the 4-chain (288 us vs 1328 us for BV = 32 ieee) and the 16-node tree (327 us); the
# split into two passes awaits its own sweep.
BLOCK_V = 128
BLOCK_K = 32
# 4 warps at every tree size: with 8 warps, 64-node blocks (BT = 64) and tf32x3 products, Triton 3.6 built a
# kernel that made illegal memory accesses on the H200 (tests/test_gdn_kernels.py caught it; 4 warps or ieee
# products ran clean).
NUM_WARPS = 4

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
    PRECISION: tl.constexpr,
):
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    if i_s >= 0:
        i_hk = i_h // (HV // H)
        nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
        o_t = tl.arange(0, BT)
        o_k = tl.arange(0, K)
        o_v = i_v * BV + tl.arange(0, BV)
        m_t = o_t < nn
        # S0 is streamed once and not reused: evict it first so the nodes and buffers keep the L2
        b_s = tl.load(state_pool + ((i_s * HV + i_h) * K + o_k[:, None]) * V + o_v[None, :],
                      eviction_policy="evict_first")
        p_x = ((i_b * T + o_t[:, None]) * H + i_hk) * K + o_k[None, :]
        b_k = tl.load(k + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
        b_q = tl.load(q + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
        p_o = ((i_b * T + o_t[:, None]) * HV + i_h) * V + o_v[None, :]
        m_o = (o_t < T)[:, None]
        tl.store(kS + p_o, tl.dot(b_k, b_s, input_precision=PRECISION), mask=m_o)
        tl.store(qS + p_o, tl.dot(b_q, b_s, input_precision=PRECISION), mask=m_o)


@triton.jit
def gdn_verify_kernel(
    q,             # [B, T, H, K]
    k,             # [B, T, H, K]
    v,             # [B, T, HV, V]
    g,             # [B, T, HV]
    beta,          # [B, T, HV]
    ancestors,     # [B, T, T] uint8: [b, t, i] = 1 iff i is t or an ancestor of t
    num_nodes,     # [B]
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
    BK: tl.constexpr,
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

    # a. products over K (S0^T k_t and S0^T q_t come from the state pass)
    b_kB = tl.zeros([BT, BL], dtype=tl.float32)    # k_t . k_i, buffer entries i
    b_qB = tl.zeros([BT, BL], dtype=tl.float32)
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)    # k_t . k_i, nodes i
    b_qk = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(0, K, BK):
        o_k = i_k + tl.arange(0, BK)
        p_x = ((i_b * T + o_t[:, None]) * H + i_hk) * K + o_k[None, :]
        b_q = tl.load(q + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
        b_k = tl.load(k + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
        p_bk = buf_k + ((i_r * L + o_l[:, None]) * H + i_hk) * K + o_k[None, :]
        b_bk = tl.trans(tl.load(p_bk, mask=m_l[:, None], other=0.))          # [BK, BL]
        b_kB += tl.dot(b_k, b_bk, input_precision=PRECISION)
        b_qB += tl.dot(b_q, b_bk, input_precision=PRECISION)
        b_kk += tl.dot(b_k, tl.trans(b_k), input_precision=PRECISION)
        b_qk += tl.dot(b_q, tl.trans(b_k), input_precision=PRECISION)
    b_kS = tl.zeros([BT, BV], dtype=tl.float32)
    b_qS = tl.zeros([BT, BV], dtype=tl.float32)
    if i_s >= 0:
        p_S = ((i_b * T + o_t[:, None]) * HV + i_h) * V + o_v[None, :]
        b_kS = tl.load(kS + p_S, mask=m_t[:, None], other=0.)
        b_qS = tl.load(qS + p_S, mask=m_t[:, None], other=0.)

    # b. node G along root paths, from the last buffered entry's G (0 for an empty buffer)
    m_tt = m_t[:, None] & m_t[None, :]
    p_anc = ancestors + (i_b * T + o_t[:, None]) * T + o_t[None, :]
    b_anc = (tl.load(p_anc, mask=m_tt, other=0) != 0) & m_tt
    b_g = tl.load(g + (i_b * T + o_t) * HV + i_h, mask=m_t, other=0.).to(tl.float32)
    b_beta = tl.load(beta + (i_b * T + o_t) * HV + i_h, mask=m_t, other=0.).to(tl.float32)
    b_bg = tl.load(buf_gcum + (i_r * L + o_l) * HV + i_h, mask=m_l, other=0.)
    b_G = tl.sum(tl.where(o_l == n - 1, b_bg, 0.), 0) + tl.sum(tl.where(b_anc, b_g[None, :], 0.), 1)   # [BT]

    # c. reads of the committed state S0 + buffer
    b_bu = tl.load(buf_u + ((i_r * L + o_l[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_l[:, None], other=0.)
    b_dB = tl.exp(tl.where(m_l[None, :], b_G[:, None] - b_bg[None, :], float("-inf")))       # [BT, BL]
    b_eG = tl.exp(b_G)[:, None]
    b_kr = b_eG * b_kS + tl.dot(b_kB * b_dB, b_bu, input_precision=PRECISION)                    # [BT, BV]
    b_qr = b_eG * b_qS + tl.dot(b_qB * b_dB, b_bu, input_precision=PRECISION)

    # d. forward substitution: b_u holds beta (v - reads) minus the shares of the nodes solved so far
    b_dT = tl.exp(tl.where(b_anc, b_G[:, None] - b_G[None, :], float("-inf")))              # [BT, BT]
    b_A = tl.where(o_t[:, None] != o_t[None, :], b_beta[:, None] * b_kk * b_dT, 0.)          # diag(beta) A
    b_v = tl.load(v + ((i_b * T + o_t[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_t[:, None], other=0.)
    b_u = b_beta[:, None] * (b_v.to(tl.float32) - b_kr)
    for t in range(0, nn - 1):
        b_ut = tl.sum(tl.where(o_t[:, None] == t, b_u, 0.), 0)                                # [BV], final
        b_at = tl.sum(tl.where(o_t[None, :] == t, b_A, 0.), 1)                                # [BT], rows > t
        b_u -= b_at[:, None] * b_ut[None, :]

    # e. outputs
    b_o = b_qr + tl.dot(b_qk * b_dT, b_u, input_precision=PRECISION)
    p_o = ((i_b * T + o_t[:, None]) * HV + i_h) * V + o_v[None, :]
    m_o = o_t[:, None] < T
    tl.store(o + p_o, b_o, mask=m_o)
    tl.store(u + p_o, b_u, mask=m_o)
    if i_v == 0:
        tl.store(gcum + (i_b * T + o_t) * HV + i_h, tl.where(m_t, b_G, 0.), mask=o_t < T)


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
    BT = max(16, triton.next_power_of_2(T))
    o = torch.empty(B, T, HV, V, dtype=torch.float32, device=q.device)
    u = torch.empty(B, T, HV, V, dtype=torch.float32, device=q.device)
    gcum = torch.empty(B, T, HV, dtype=torch.float32, device=q.device)
    # written by the state pass for rows with a state, read by the tree pass for those rows only
    kS = torch.empty(B, T, HV, V, dtype=torch.float32, device=q.device)
    qS = torch.empty(B, T, HV, V, dtype=torch.float32, device=q.device)
    BVS = min(V, STATE_BLOCK_V)
    gdn_verify_state_kernel[(V // BVS, HV, B)](
        q, k, num_nodes, state_pool, state_slots, kS, qS,
        T=T, H=H, HV=HV, K=K, V=V, BT=BT, BV=BVS, PRECISION=DOT_PRECISION, num_warps=NUM_WARPS,
    )
    gdn_verify_kernel[(B, HV, V // BV)](
        q, k, v, g, beta, ancestors.view(torch.uint8), num_nodes, kS, qS, state_slots, buf_k, buf_u, buf_gcum,
        buf_len, req_slots, o, u, gcum,
        T=T, H=H, HV=HV, K=K, V=V, L=L, BT=BT, BL=max(16, triton.next_power_of_2(L)), BK=min(K, BLOCK_K), BV=BV,
        PRECISION=DOT_PRECISION, num_warps=NUM_WARPS,
    )
    return o, u, gcum
