"""The GDN chains' verify with its two passes side by side (verify.VERIFY_SPLIT_ROLES): one launch whose programs
are of two kinds, state programs that stream S0 (S0^T k_t and S0^T q_t, as the state pass) and tree programs that do
steps a.-d. (verify.py's docstring has the math), which need no S0; then a small launch finishes e., u and o, from
both. The two passes in turn spend the state pass's time streaming S0 and the tree pass's waiting on its dependent
small products (latency-bound, 1.55 ms of an 18 ms speculative step at batch 128 on the H200, beside 1.82 ms of
state pass); side by side on the SMs the one hides under the other, as the GDN decode's split did (decode.py).

Scratch between the launches, all fp32: kS, qS [B, T, HV, V] (as the two passes have), the tree programs' w and qr
written into u and o (e. overwrites them), and M, P [B, HV, 2, BT, BT] (8 MiB each way at batch 256, 4-chains).
One number of warps serves both kinds: up to verify.FMA_MAX_NODES nodes the state programs' products run node by node
on the FMA units, as the state pass's; past them (verify.SPLIT_ROLES_DOT_BLOCK_V, the larger trees, whose state pass
alone runs its dots at 4 warps and the tree pass at 2) as tensor-core dots.
"""

import triton
import triton.language as tl

from verify_kernels.gdn.tree_math import finish, tree_heads
from verify_kernels.gdn.verify_state import state_products


@triton.jit
def gdn_verify_roles_kernel(
    q, k, v, g, beta,   # [B, T, H, K], [B, T, H, K], [B, T, HV, V], [B, T, HV], [B, T, HV]
    ancestors,          # [B, T, T] uint8
    num_nodes,          # [B]
    state_pool,         # [S, HV, K, V] fp32
    state_slots,        # [B]
    buf_k, buf_u, buf_gcum,   # [R, L, H, K], [R, L, HV, V], [R, L, HV] fp32
    buf_len,            # [R]
    req_slots,          # [B]
    kS, qS,             # [B, T, HV, V] fp32 out: the state programs' (rows with a state, nodes < num_nodes)
    o, u,               # [B, T, HV, V] fp32 out: the tree programs' qr and w (gdn_verify_finish_kernel's inputs)
    gcum,               # [B, T, HV] fp32 out, final
    MP,                 # [B, HV, 2, BT, BT] fp32 out: M and P per value head
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BT: tl.constexpr,
    BL: tl.constexpr,
    BK: tl.constexpr,
    BVS: tl.constexpr,  # a state program's V columns
    BV: tl.constexpr,   # a tree program's V columns per step
    NG: tl.constexpr,
    GP: tl.constexpr,   # value heads per tree program, of one key head
    USE_DOT: tl.constexpr,  # the state programs' products as tensor-core dots over BKS rows of S0 (larger trees)
    BKS: tl.constexpr,
    STATE_PRECISION: tl.constexpr,
    PRECISION: tl.constexpr,
    PRODUCTS_STAGES: tl.constexpr,
    STACKED: tl.constexpr,
    STACKED_READS: tl.constexpr,
):
    """A grid of (HV V / BVS state programs + HV / GP tree programs, B): a row's programs of both kinds adjacent in
    the launch order, so that they share the SMs."""
    i_p, i_b = tl.program_id(0), tl.program_id(1)
    NS: tl.constexpr = HV * (V // BVS)
    nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
    if i_p < NS:
        # a state program: value head i_h's [K, BVS] tile of S0, read once, against every node's k and q
        state_products(q, k, num_nodes, state_pool, state_slots, kS, qS, i_b, i_p // (V // BVS), i_p % (V // BVS), T,
                       H, HV, K, V, BT, BVS, BKS, 1, 1, USE_DOT, STATE_PRECISION)
    else:
        i_r = tl.load(req_slots + i_b).to(tl.int64)
        n = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
        tree_heads(q, k, v, g, beta, ancestors, state_slots, kS, qS, buf_k, buf_u, buf_gcum, o, u, gcum, MP, i_b,
                   i_r, (i_p - NS) * GP, n, nn, T, H, HV, K, V, L, BT, BL, BK, BV, NG, GP, PRECISION,
                   PRODUCTS_STAGES, STACKED, STACKED_READS, False)


@triton.jit
def gdn_verify_finish_kernel(
    beta,               # [B, T, HV]
    num_nodes,          # [B]
    state_slots,        # [B]
    kS, qS,             # [B, T, HV, V] fp32: the state programs'
    MP,                 # [B, HV, 2, BT, BT] fp32: M and P
    o, u,               # [B, T, HV, V] fp32: qr and w in, o and u out (in place)
    gcum,               # [B, T, HV] fp32: the nodes' G (zero past num_nodes)
    T,
    HV: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """e. per (V block, value head, row): u = M (w - beta e^G S0^T k), o = qr + e^G S0^T q + P u."""
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_T = o_t < T
    m_n = (o_t < nn)[None, :]
    p_n = ((i_b * T + o_t[None, :]) * HV + i_h) * V + o_v[:, None]
    b_kS = tl.zeros([BV, BT], dtype=tl.float32)
    b_qS = tl.zeros([BV, BT], dtype=tl.float32)
    if i_s >= 0:
        b_kS = tl.load(kS + p_n, mask=m_n, other=0.)
        b_qS = tl.load(qS + p_n, mask=m_n, other=0.)
    b_w = tl.load(u + p_n, mask=m_T[None, :], other=0.)
    b_qr = tl.load(o + p_n, mask=m_T[None, :], other=0.)
    b_G = tl.load(gcum + (i_b * T + o_t) * HV + i_h, mask=m_T, other=0.)
    b_beta = tl.load(beta + (i_b * T + o_t) * HV + i_h, mask=o_t < nn, other=0.).to(tl.float32)
    p_mp = MP + ((i_b * HV + i_h) * 2 * BT + o_t[:, None]) * BT + o_t[None, :]
    b_u, b_o = finish(b_w, b_qr, b_kS, b_qS, b_G, b_beta, tl.load(p_mp), tl.load(p_mp + BT * BT), PRECISION)
    tl.store(u + p_n, b_u, mask=m_T[None, :])
    tl.store(o + p_n, b_o, mask=m_T[None, :])


def gdn_verify_roles_fwd(q, k, v, g, beta, anc, num_nodes, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len,
                         req_slots, o, u, gcum, kS, qS, *, T, H, HV, K, V, L, BT, BL, BK, BVS, BV, GP, warps,
                         precision, products_stages, stacked, stacked_reads, finish_block_v, finish_warps,
                         use_dot=False, BKS=32, state_precision=None) -> None:
    """Launch the two kernels over B = q.shape[0] rows into o, u, gcum (kS, qS: the launcher's scratch)."""
    B = q.shape[0]
    MP = q.new_empty(B, HV, 2, BT, BT, dtype=gcum.dtype)
    gdn_verify_roles_kernel[(HV * (V // BVS) + HV // GP, B)](
        q, k, v, g, beta, anc, num_nodes, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots,
        kS, qS, o, u, gcum, MP, T, H=H, HV=HV, K=K, V=V, L=L, BT=BT, BL=BL, BK=BK, BVS=BVS, BV=BV,
        NG=triton.next_power_of_2(GP), GP=GP, USE_DOT=use_dot, BKS=BKS, STATE_PRECISION=state_precision or precision,
        PRECISION=precision, PRODUCTS_STAGES=products_stages,
        STACKED=stacked, STACKED_READS=stacked_reads, num_warps=warps, num_stages=1,
    )
    BVF = min(V, max(16, finish_block_v))  # (tl.dot's tiles: 16 rows at least)
    gdn_verify_finish_kernel[(V // BVF, HV, B)](
        beta, num_nodes, state_slots, kS, qS, MP, o, u, gcum, T, HV=HV, V=V, BT=BT, BV=BVF, PRECISION=precision,
        num_warps=finish_warps, num_stages=1,
    )
