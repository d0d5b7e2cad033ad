"""Triton kernel for the Gated DeltaNet KVBuffer tree verify: a token tree per row (up to 64 nodes, ragged) on top
of its committed state S0 and buffer, one launch for the batch, no per-node state. Semantics, shapes and pool
layout: verify_kernels.gdn.naive.gdn_verify_ref (the oracle); the math: docs/design.md section 2.

One program per (row, value head, V block) holds all T nodes (padded to BT, a power of two >= 16 for tl.dot). It
issues the load of its [K, BV] tile of S0 first (none for rows without a state) and does everything that does not
need S0 while that load is in flight:
  a. node G = G of the last buffered entry + (ancestors incl. self) @ g;
  b. the products over K among the nodes and against the buffer keys (k.k, q.k; tensor-core dots), and the
     buffer's share of the committed state's reads, (x_t . k_i) e^{G_t - G_i} @ u_i for x = k, q, in blocks of
     BLOCK_L entries (the first block loaded before buf_len is known);
  c. M = (I + diag(beta) A)^-1 with A[t, i] = e^{G_t - G_i} (k_t . k_i) for i a strict ancestor of t: A is strictly
     lower triangular (parents come first), so forward substitution on the identity, num_nodes - 1 column steps
     over a [BT, BT] matrix;
then, once S0 is there:
  d. S0^T k_t and S0^T q_t: one node at a time on the FMA units up to FMA_MAX_NODES nodes, else as tensor-core dots
     (the tile's conversion for the tensor cores costs more than a few products);
  e. u = M beta (v - e^G S0^T k - buffer's k reads), o = e^G S0^T q + buffer's q reads + ((q . k) e^{G_t - G_i} on
     ancestors incl. self) @ u.
Three passes before (S0 products, products over K, tree math; two scratch round trips, three launches) left the
tree math latency-bound behind S0: 1.6-1.8x SGLang's intermediate-state verify at batch >= 64 against a ~4x bound,
21 us at batch 1. The products are recomputed by each value head and V block of a key head: tensor-core work that
hides under the S0 load, where sharing them cost a pass.
Decays are exponentiated only as G differences <= 0 (or a single G), masked pairs set to -inf first. Padding nodes
and stale buffer entries are selected away after loading (whatever they hold), so they add nothing and padding
nodes come out as zeros.
"""

from functools import partial

import torch
import triton
import triton.language as tl

from verify_kernels.gdn.decode import INDEX_DTYPES, INPUT_DTYPES, check_heads, check_pools, check_shape, check_tensors
from verify_kernels.gdn.fold import BLOCK_L
from verify_kernels.tree import ancestor_mask

# Launch parameters by BT (benchmarks/sweep_gdn.py times the candidates on the GPU): V columns per program and warps.
# Never 8 warps for 64-node blocks: with tf32x3 products Triton 3.6 built a kernel that made illegal memory accesses
# on the H200 (the earlier tree pass).
CONFIGS = {16: (32, 4), 32: (32, 4), 64: (16, 4)}
FMA_MAX_NODES = 8
# fp32 products: "ieee" runs them on the FMA units; "tf32x3" on the tensor cores in three TF32 passes, which keeps
# fp32-level error (~1e-7 relative here) at a fraction of the time.
DOT_PRECISION = "tf32x3"

MAX_NODES = 64


@triton.jit
def gdn_verify_kernel(
    q,             # [B, T, H, K]
    k,             # [B, T, H, K]
    v,             # [B, T, HV, V]
    g,             # [B, T, HV]
    beta,          # [B, T, HV]
    ancestors,     # [B, T, T] uint8: [b, t, i] = 1 iff i is t or an ancestor of t
    num_nodes,     # [B]
    state_pool,    # [S, HV, K, V] fp32
    state_slots,   # [B]
    buf_k,         # [R, L, H, K] fp32
    buf_u,         # [R, L, HV, V] fp32
    buf_gcum,      # [R, L, HV] fp32
    buf_len,       # [R]
    req_slots,     # [B]
    o,             # [B, T, HV, V] fp32 out
    u,             # [B, T, HV, V] fp32 out
    gcum,          # [B, T, HV] fp32 out
    T,             # not constexpr: tree sizes change every step; only BT picks a compiled kernel
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    BC: tl.constexpr,
    USE_DOT: tl.constexpr,     # S0 products as tensor-core dots, else one node at a time
    PRECISION: tl.constexpr,
):
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hk = i_h // (HV // H)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    o_c = tl.arange(0, BC)

    # the loads: nodes in the bounds of T and the buffer's first block in the bounds of its row, not waiting for
    # num_nodes and buf_len; S0 first, the one that matters
    b_s = tl.zeros([K, BV], dtype=tl.float32)
    if i_s >= 0:
        # S0 is streamed once and not reused: evict it first so the nodes and buffers keep the L2
        b_s = tl.load(state_pool + ((i_s * HV + i_h) * K + o_k[:, None]) * V + o_v[None, :],
                      eviction_policy="evict_first")
    m_T = o_t < T
    p_x = ((i_b * T + o_t[:, None]) * H + i_hk) * K + o_k[None, :]
    b_k = tl.load(k + p_x, mask=m_T[:, None], other=0.).to(tl.float32)                 # [BT, K]
    b_q = tl.load(q + p_x, mask=m_T[:, None], other=0.).to(tl.float32)
    p_n = ((i_b * T + o_t[:, None]) * HV + i_h) * V + o_v[None, :]
    b_v = tl.load(v + p_n, mask=m_T[:, None], other=0.).to(tl.float32)                 # [BT, BV]
    b_g = tl.load(g + (i_b * T + o_t) * HV + i_h, mask=m_T, other=0.).to(tl.float32)   # [BT]
    b_beta = tl.load(beta + (i_b * T + o_t) * HV + i_h, mask=m_T, other=0.).to(tl.float32)
    m_TT = m_T[:, None] & m_T[None, :]
    b_anc = tl.load(ancestors + (i_b * T + o_t[:, None]) * T + o_t[None, :], mask=m_TT, other=0) != 0
    m_in = o_c < L
    b_bk = tl.load(buf_k + ((i_r * L + o_c[:, None]) * H + i_hk) * K + o_k[None, :], mask=m_in[:, None], other=0.)
    b_bu = tl.load(buf_u + ((i_r * L + o_c[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_in[:, None], other=0.)
    b_bg = tl.load(buf_gcum + (i_r * L + o_c) * HV + i_h, mask=m_in, other=0.)
    n = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)

    # padding nodes (>= num_nodes) and stale entries (>= buf_len) may hold anything, NaN included: select them away
    m_t = o_t < nn
    b_k = tl.where(m_t[:, None], b_k, 0.)
    b_q = tl.where(m_t[:, None], b_q, 0.)
    b_v = tl.where(m_t[:, None], b_v, 0.)
    b_g = tl.where(m_t, b_g, 0.)
    b_beta = tl.where(m_t, b_beta, 0.)
    b_anc = b_anc & m_t[:, None] & m_t[None, :]
    m_c = o_c < n
    b_bk = tl.where(m_c[:, None], b_bk, 0.)
    b_bu = tl.where(m_c[:, None], b_bu, 0.)

    # a. node G along root paths, from the last buffered entry's G (0 for an empty buffer)
    b_Gn = tl.sum(tl.where(o_c == n - 1, b_bg, 0.), 0)
    if n > BC:
        b_Gn = tl.load(buf_gcum + (i_r * L + n - 1) * HV + i_h)
    b_G = b_Gn + tl.sum(tl.where(b_anc, b_g[None, :], 0.), 1)                            # [BT]

    # b. products among the nodes, and the buffer's share of the reads
    b_kk = tl.dot(b_k, tl.trans(b_k), input_precision=PRECISION)                          # [BT, BT]
    b_qk = tl.dot(b_q, tl.trans(b_k), input_precision=PRECISION)
    b_dT = tl.exp(tl.where(b_anc, b_G[:, None] - b_G[None, :], float("-inf")))            # [BT, BT]
    b_dB = tl.exp(tl.where(m_c[None, :], b_G[:, None] - b_bg[None, :], float("-inf")))   # [BT, BC]
    b_kB = tl.dot(b_k, tl.trans(b_bk), input_precision=PRECISION) * b_dB
    b_qB = tl.dot(b_q, tl.trans(b_bk), input_precision=PRECISION) * b_dB
    b_kr = tl.dot(b_kB, b_bu, input_precision=PRECISION)                                  # [BT, BV]
    b_qr = tl.dot(b_qB, b_bu, input_precision=PRECISION)
    for i_c in range(BC, n, BC):
        o_l = i_c + tl.arange(0, BC)
        m_l = o_l < n
        b_bk = tl.load(buf_k + ((i_r * L + o_l[:, None]) * H + i_hk) * K + o_k[None, :], mask=m_l[:, None], other=0.)
        b_bu = tl.load(buf_u + ((i_r * L + o_l[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_l[:, None],
                       other=0.)
        b_bg = tl.load(buf_gcum + (i_r * L + o_l) * HV + i_h, mask=m_l, other=0.)
        b_dB = tl.exp(tl.where(m_l[None, :], b_G[:, None] - b_bg[None, :], float("-inf")))
        b_kB = tl.dot(b_k, tl.trans(b_bk), input_precision=PRECISION) * b_dB
        b_qB = tl.dot(b_q, tl.trans(b_bk), input_precision=PRECISION) * b_dB
        b_kr += tl.dot(b_kB, b_bu, input_precision=PRECISION)
        b_qr += tl.dot(b_qB, b_bu, input_precision=PRECISION)

    # c. M = (I + diag(beta) A)^-1 by forward substitution on the identity: once row t of M is final, subtract its
    # share from the later rows
    b_A = tl.where(o_t[:, None] != o_t[None, :], b_beta[:, None] * b_kk * b_dT, 0.)      # diag(beta) A
    b_M = tl.where(o_t[:, None] == o_t[None, :], 1., 0.)
    for t in range(0, nn - 1):
        b_mt = tl.sum(tl.where(o_t[:, None] == t, b_M, 0.), 0)                            # [BT], row t, final
        b_at = tl.sum(tl.where(o_t[None, :] == t, b_A, 0.), 1)                            # [BT], rows > t
        b_M -= b_at[:, None] * b_mt[None, :]

    # d. S0's share of the reads
    if USE_DOT:
        b_kS = tl.dot(b_k, b_s, input_precision=PRECISION)                                # [BT, BV]
        b_qS = tl.dot(b_q, b_s, input_precision=PRECISION)
    else:
        b_kS = tl.zeros([BT, BV], dtype=tl.float32)
        b_qS = tl.zeros([BT, BV], dtype=tl.float32)
        if i_s >= 0:
            for t in range(0, nn):
                p_xt = ((i_b * T + t) * H + i_hk) * K + o_k
                b_kt = tl.sum(b_s * tl.load(k + p_xt).to(tl.float32)[:, None], 0)         # [BV]
                b_qt = tl.sum(b_s * tl.load(q + p_xt).to(tl.float32)[:, None], 0)
                b_kS = tl.where(o_t[:, None] == t, b_kt[None, :], b_kS)
                b_qS = tl.where(o_t[:, None] == t, b_qt[None, :], b_qS)

    # e. the nodes' entries and outputs
    b_eG = tl.exp(b_G)[:, None]
    b_u = tl.dot(b_M, b_beta[:, None] * (b_v - b_eG * b_kS - b_kr), input_precision=PRECISION)
    b_o = b_eG * b_qS + b_qr + tl.dot(b_qk * b_dT, b_u, input_precision=PRECISION)
    m_o = m_T[:, None]
    tl.store(o + p_n, b_o, mask=m_o)
    tl.store(u + p_n, b_u, mask=m_o)
    if i_v == 0:
        tl.store(gcum + (i_b * T + o_t) * HV + i_h, tl.where(m_t, b_G, 0.), mask=m_T)


def verify_blocks(T: int) -> int:
    """BT: the node count padded to a power of two >= 16 (tl.dot's smallest)."""
    return max(16, triton.next_power_of_2(T))


def verify_scratch_bytes(T: int, HV: int, V: int) -> int:
    """Bytes one request's verify of T nodes writes in one layer besides o: the nodes' buffer entries u and G. None
    of it is a state: a state is [HV, K, V]."""
    return 4 * (T * HV * V + T * HV)


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

    BT = verify_blocks(T)
    block_v, warps = CONFIGS[BT]
    BV = min(V, block_v)
    new = partial(torch.empty, dtype=torch.float32, device=q.device)
    o, u, gcum = new(B, T, HV, V), new(B, T, HV, V), new(B, T, HV)
    if B == 0:
        return o, u, gcum
    gdn_verify_kernel[(V // BV, HV, B)](
        q, k, v, g, beta, ancestors.view(torch.uint8), num_nodes, state_pool, state_slots, buf_k, buf_u, buf_gcum,
        buf_len, req_slots, o, u, gcum,
        T=T, H=H, HV=HV, K=K, V=V, L=L, BT=BT, BV=BV, BC=BLOCK_L, USE_DOT=T > FMA_MAX_NODES, PRECISION=DOT_PRECISION,
        num_warps=warps,
    )
    return o, u, gcum
