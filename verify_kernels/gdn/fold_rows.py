"""One folding row's work for the Gated DeltaNet fold kernel (verify_kernels/gdn/fold.py, which has the math, the
grid and the launch settings): a row's S0 tile loaded and stored, its buffer's and new entries' products folded in,
the row picked from the flags' ranks, and the appends of the rows that do not fold. Triton device functions only.
"""

import triton
import triton.language as tl

from verify_kernels.precision import dot_tf32x3


@triton.jit
def fold_product(b_s, a_t, b, SPLIT: tl.constexpr):
    """b_s [K, BV] + a_t [K, BC] . b [BC, BV] in tf32x3: Triton's, or from operands split by a mask (SPLIT:
    FOLD_SPLIT_TF32, verify_kernels/precision.py) accumulating into the tile itself (sm_90: the flush's loop 154
    registers a thread against 218, the commit's looped row 222 and no spill against 255 and 40 bytes; Triton's
    tf32x3 into the tile as accumulator saves none)."""
    if SPLIT:
        out = dot_tf32x3(a_t, b, b_s)
    else:
        out = b_s + tl.dot(a_t, b, input_precision="tf32x3")
    return out


@triton.jit
def fold_buffer(b_s, buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, o_k, o_v, H: tl.constexpr, HV: tl.constexpr,
                K: tl.constexpr, V: tl.constexpr, L: tl.constexpr, BC: tl.constexpr, SPLIT: tl.constexpr):
    """b_s [K, BV] plus the fold of the first n entries of buffer row i_r: sum_i e^{G - G_i} k_i u_i^T."""
    for i_c in range(0, n, BC):
        o_c = i_c + tl.arange(0, BC)
        m_c = o_c < n
        b_bg = tl.load(buf_gcum + (i_r * L + o_c) * HV + i_h, mask=m_c, other=0.)
        b_bk = tl.load(buf_k + ((i_r * L + o_c[:, None]) * H + i_hk) * K + o_k[None, :], mask=m_c[:, None], other=0.)
        b_bu = tl.load(buf_u + ((i_r * L + o_c[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_c[:, None], other=0.)
        b_decay = tl.exp(tl.where(m_c, b_G - b_bg, float("-inf")))
        b_s = fold_product(b_s, tl.trans(b_bk), b_decay[:, None] * b_bu, SPLIT)
    return b_s


@triton.jit
def fold_buffer_block(b_s, buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, o_k, o_v, H: tl.constexpr,
                      HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr, BL: tl.constexpr,
                      SPLIT: tl.constexpr):
    """fold_buffer as one block of BL >= L entries, no loop (the pipelined row loop's body holds none)."""
    o_l = tl.arange(0, BL)
    m_l = o_l < n
    b_bg = tl.load(buf_gcum + (i_r * L + o_l) * HV + i_h, mask=m_l, other=0.)
    b_bk = tl.load(buf_k + ((i_r * L + o_l[:, None]) * H + i_hk) * K + o_k[None, :], mask=m_l[:, None], other=0.)
    b_bu = tl.load(buf_u + ((i_r * L + o_l[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_l[:, None], other=0.)
    b_decay = tl.exp(tl.where(m_l, b_G - b_bg, float("-inf")))
    return fold_product(b_s, tl.trans(b_bk), b_decay[:, None] * b_bu, SPLIT)


@triton.jit
def fold_new(b_s, k, u, gcum, accepted, i_b, i_h, i_hk, na, b_G, o_k, o_v, T, A, H: tl.constexpr, HV: tl.constexpr,
             K: tl.constexpr, V: tl.constexpr, BC: tl.constexpr, ENTRIES: tl.constexpr, SPLIT: tl.constexpr):
    """b_s [K, BV] plus the fold of row i_b's na new entries (ENTRIES: the token, or the accepted nodes), BC at a
    time: S += sum_c e^{G - G_c} k_c u_c^T."""
    for i_c in range(0, na, BC):
        o_c = i_c + tl.arange(0, BC)
        m_c = o_c < na
        if ENTRIES == 2:
            b_node = tl.load(accepted + i_b * A + o_c, mask=m_c, other=0).to(tl.int64)
        else:
            b_node = tl.zeros([BC], dtype=tl.int64)
        b_ag = tl.load(gcum + (i_b * T + b_node) * HV + i_h, mask=m_c, other=0.).to(tl.float32)
        b_ak = tl.load(k + ((i_b * T + b_node[:, None]) * H + i_hk) * K + o_k[None, :], mask=m_c[:, None],
                       other=0.).to(tl.float32)                                              # [BC, K]
        b_au = tl.load(u + ((i_b * T + b_node[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_c[:, None],
                       other=0.).to(tl.float32)                                              # [BC, BV]
        b_decay = tl.exp(tl.where(m_c, b_G - b_ag, float("-inf")))
        b_s = fold_product(b_s, tl.trans(b_ak), b_decay[:, None] * b_au, SPLIT)
    return b_s


@triton.jit
def append_head(k, u, gcum, accepted, buf_k, buf_u, buf_gcum, i_b, i_r, i_h, i_hk, n, na, T, A, H: tl.constexpr,
                HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr, BC: tl.constexpr):
    """Row i_b's na accepted entries of value head i_h (u [V], G) to buffer positions n .. n + na - 1 of row i_r,
    and their keys if i_h is the first value head of its key head (once per key head)."""
    o_k = tl.arange(0, K)
    o_v = tl.arange(0, V)
    for i_c in range(0, na, BC):
        o_c = i_c + tl.arange(0, BC)
        m_c = o_c < na
        b_node = tl.load(accepted + i_b * A + o_c, mask=m_c, other=0).to(tl.int64)
        o_pos = i_r * L + n + o_c
        b_au = tl.load(u + ((i_b * T + b_node[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_c[:, None], other=0.)
        tl.store(buf_u + (o_pos[:, None] * HV + i_h) * V + o_v[None, :], b_au.to(tl.float32), mask=m_c[:, None])
        b_ag = tl.load(gcum + (i_b * T + b_node) * HV + i_h, mask=m_c, other=0.)
        tl.store(buf_gcum + o_pos * HV + i_h, b_ag.to(tl.float32), mask=m_c)
        if i_h % (HV // H) == 0:
            b_ak = tl.load(k + ((i_b * T + b_node[:, None]) * H + i_hk) * K + o_k[None, :], mask=m_c[:, None],
                           other=0.)
            tl.store(buf_k + (o_pos[:, None] * H + i_hk) * K + o_k[None, :], b_ak.to(tl.float32), mask=m_c[:, None])


@triton.jit
def folding_row(b_rank, j, o_b, b_r, b_slot, b_n, b_na):
    """The j-th folding row of a block of rows (all zeros past the last): its row, request slot, state slot, buffered
    and new entries."""
    b_sel = b_rank == j
    i_b = tl.sum(tl.where(b_sel, o_b, 0), 0).to(tl.int64)
    i_r = tl.sum(tl.where(b_sel, b_r, 0), 0).to(tl.int64)
    i_s = tl.sum(tl.where(b_sel, b_slot, 0), 0).to(tl.int64)
    return i_b, i_r, i_s, tl.sum(tl.where(b_sel, b_n, 0), 0), tl.sum(tl.where(b_sel, b_na, 0), 0)


@triton.jit
def state_tile(state_pool, i_s, i_h, o_k, o_v, valid, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """The [K, BV] tile of S0 of slot i_s, value head i_h (nothing read unless valid). S0 is streamed once and not
    reused: evict it first so the entries keep the L2."""
    p_s = state_pool + (i_s * HV + i_h) * (K * V) + (o_k[:, None] * V + o_v[None, :])
    return tl.load(p_s, mask=o_k[:, None] < tl.where(valid, K, 0), other=0., eviction_policy="evict_first")


@triton.jit
def fold_tile(state_pool, state_desc, i_s, i_h, o_k, o_v, v0, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
              TMA: tl.constexpr):
    """A folding row's [K, BV] tile of S0 (slot i_s >= 0, value head i_h, columns o_v = v0, v0 + 1, ...): through
    the descriptor (FOLD_TMA) or the pointers."""
    if TMA:
        return state_desc.load([((i_s * HV + i_h) * K).to(tl.int32), v0])
    return state_tile(state_pool, i_s, i_h, o_k, o_v, True, HV, K, V)


@triton.jit
def store_fold(state_pool, state_desc, b_s, i_s, i_h, o_k, o_v, v0, HV: tl.constexpr, K: tl.constexpr,
               V: tl.constexpr, TMA: tl.constexpr):
    """The folded tile b_s [K, BV] back into S0 at fold_tile's place."""
    if TMA:
        state_desc.store([((i_s * HV + i_h) * K).to(tl.int32), v0], b_s)
    else:
        tl.store(state_pool + (i_s * HV + i_h) * (K * V) + (o_k[:, None] * V + o_v[None, :]), b_s)


@triton.jit
def last_G(gcum, accepted, buf_gcum, i_b, i_r, i_h, n, na, T, A, HV: tl.constexpr, L: tl.constexpr,
           ENTRIES: tl.constexpr):
    """G_last of row i_b's fold: of its last new entry, else of its last buffered one."""
    if ENTRIES == 1:
        b_G = tl.load(gcum + i_b * T * HV + i_h).to(tl.float32)
    else:
        b_G = tl.load(buf_gcum + (i_r * L + tl.maximum(n - 1, 0)) * HV + i_h)
        if ENTRIES == 2:
            i_last = tl.maximum(tl.load(accepted + i_b * A + tl.maximum(na - 1, 0)), 0).to(tl.int64)
            b_G = tl.where(na > 0, tl.load(gcum + (i_b * T + i_last) * HV + i_h).to(tl.float32), b_G)
    return b_G


@triton.jit
def fold_row(b_s, k, u, gcum, accepted, buf_k, buf_u, buf_gcum, i_b, i_r, i_h, i_hk, n, na, o_k, o_v, T, A,
             H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr, BC: tl.constexpr,
             ENTRIES: tl.constexpr, SPLIT: tl.constexpr):
    """Row i_b's n buffered and na new entries folded into its tile b_s of S0 -> the folded tile."""
    b_G = last_G(gcum, accepted, buf_gcum, i_b, i_r, i_h, n, na, T, A, HV, L, ENTRIES)
    # the products accumulate into the decayed tile itself: no second [K, BV] accumulator
    b_s = tl.exp(b_G) * b_s
    b_s = fold_buffer(b_s, buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, o_k, o_v, H, HV, K, V, L, BC, SPLIT)
    if ENTRIES != 0:
        b_s = fold_new(b_s, k, u, gcum, accepted, i_b, i_h, i_hk, na, b_G, o_k, o_v, T, A, H, HV, K, V, BC, ENTRIES,
                       SPLIT)
    return b_s


@triton.jit
def fold_row_loads_first(state_pool, state_desc, k, u, gcum, accepted, buf_k, buf_u, buf_gcum, i_b, i_r, i_s, i_h,
                         i_hk, n, na, o_k, o_v, v0, T, A, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                         V: tl.constexpr, L: tl.constexpr, BL: tl.constexpr, BT: tl.constexpr, ENTRIES: tl.constexpr,
                         TMA: tl.constexpr, SPLIT: tl.constexpr):
    """fold_tile then fold_row for buffers of up to BL entries and steps of up to BT nodes (LOOPED_LOADS_FIRST), every
    load of the row issued before the first wait: the buffer in one block and every node's entry, the accepted ones
    picked on chip (no load through the accepted indices), then S0's tile. -> the folded tile [K, BV]."""
    o_l = tl.arange(0, BL)
    m_l = o_l < n
    b_bg = tl.load(buf_gcum + (i_r * L + o_l) * HV + i_h, mask=m_l, other=0.)
    b_bk = tl.load(buf_k + ((i_r * L + o_l[:, None]) * H + i_hk) * K + o_k[None, :], mask=m_l[:, None], other=0.)
    b_bu = tl.load(buf_u + ((i_r * L + o_l[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_l[:, None], other=0.)
    if ENTRIES != 0:
        # node t's entry at row t of [BT] / [BT, K] / [BT, BV] blocks: the token is node 0 (ENTRIES_TOKEN); of a
        # step's nodes, the accepted ones (accepted[b, :na], positions a of the same [BT] range since na <= T)
        o_t = tl.arange(0, BT)
        m_t = o_t < (T if ENTRIES == 2 else 1)
        if ENTRIES == 2:
            b_acc = tl.load(accepted + i_b * A + o_t, mask=o_t < na, other=-1).to(tl.int32)
        b_ng = tl.load(gcum + (i_b * T + o_t) * HV + i_h, mask=m_t, other=0.).to(tl.float32)
        b_nk = tl.load(k + ((i_b * T + o_t[:, None]) * H + i_hk) * K + o_k[None, :], mask=m_t[:, None], other=0.)
        b_nu = tl.load(u + ((i_b * T + o_t[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_t[:, None], other=0.)
    b_s = fold_tile(state_pool, state_desc, i_s, i_h, o_k, o_v, v0, HV, K, V, TMA)
    # G_last: of the last new entry, else of the last buffered one (a folding row has one or the other)
    b_G = tl.sum(tl.where(o_l == n - 1, b_bg, 0.), 0)
    if ENTRIES == 1:
        b_new = m_t
        b_G = tl.sum(tl.where(m_t, b_ng, 0.), 0)
    elif ENTRIES == 2:
        last = tl.sum(tl.where(o_t == na - 1, b_acc, 0), 0)
        b_new = tl.sum((o_t[:, None] == b_acc[None, :]).to(tl.int32), 1) > 0  # [BT]: node t was accepted
        b_G = tl.where(na > 0, tl.sum(tl.where(o_t == last, b_ng, 0.), 0), b_G)
    # the products accumulate into the decayed tile itself: no second [K, BV] accumulator
    b_s = tl.exp(b_G) * b_s
    b_decay = tl.exp(tl.where(m_l, b_G - b_bg, float("-inf")))
    b_s = fold_product(b_s, tl.trans(b_bk), b_decay[:, None] * b_bu, SPLIT)
    if ENTRIES != 0:
        # the nodes not accepted (and past the step's) selected away, not multiplied by zero: their u may be NaN
        b_nk = tl.where(b_new[:, None], b_nk.to(tl.float32), 0.)
        b_nu = tl.where(b_new[:, None], b_nu.to(tl.float32), 0.)
        b_ndecay = tl.exp(tl.where(b_new, b_G - b_ng, float("-inf")))
        b_s = fold_product(b_s, tl.trans(b_nk), b_ndecay[:, None] * b_nu, SPLIT)
    return b_s


@triton.jit
def fold_row_blocks(b_s, k, u, gcum, accepted, buf_k, buf_u, buf_gcum, i_b, i_r, i_h, i_hk, n, na, o_k, o_v, T, A,
                    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                    BL: tl.constexpr, ENTRIES: tl.constexpr, SPLIT: tl.constexpr):
    """fold_row with the buffer in one block, no loop (the pipelined row loop's body: FOLD_STAGES > 1), for a flush
    or the decode's token where every row folds (fold_launch)."""
    tl.static_assert(ENTRIES < 2, "the pipelined row loop folds a flush or the decode's token")
    b_G = last_G(gcum, accepted, buf_gcum, i_b, i_r, i_h, n, na, T, A, HV, L, ENTRIES)
    # the products accumulate into the decayed tile itself: no second [K, BV] accumulator
    b_s = tl.exp(b_G) * b_s
    b_s = fold_buffer_block(b_s, buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, o_k, o_v, H, HV, K, V, L, BL,
                            SPLIT)
    if ENTRIES == 1:  # the token, node 0 of k [B, 1, H, K] and u [B, 1, HV, V]: the last entry (decay e^0), rank one
        b_ak = tl.load(k + (i_b * T * H + i_hk) * K + o_k).to(tl.float32)
        b_au = tl.load(u + (i_b * T * HV + i_h) * V + o_v).to(tl.float32)
        b_s += b_ak[:, None] * b_au[None, :]
    return b_s


@triton.jit
def decode_fold_row(b_s, q, k, v, g, beta, out, buf_k, buf_u, buf_gcum, i_b, i_r, i_h, i_hk, n, o_k, o_v,
                    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                    BC: tl.constexpr, BL: tl.constexpr, ONE_BLOCK: tl.constexpr, SPLIT: tl.constexpr):
    """ENTRIES_DECODE: row i_b's token decoded from its tile b_s [K, BV] of S0 and its n buffered entries, its output
    o [BV] stored, and the buffer and the token folded -> the folded tile. The buffer in one block (ONE_BLOCK: the
    pipelined row loop) or BC entries at a time. (The token's reads from the tile as loaded plus the buffer's share,
    before the products, instead of from the folded tile: 1.5x slower on the H200, 869 against 612 us at batch 256.)"""
    # the token's G: the last buffered entry's (0 for an empty buffer) plus its log decay g
    b_G = tl.load(g + i_b * HV + i_h).to(tl.float32)
    b_G += tl.where(n > 0, tl.load(buf_gcum + (i_r * L + tl.maximum(n - 1, 0)) * HV + i_h), 0.)
    b_s = tl.exp(b_G) * b_s
    if ONE_BLOCK:
        b_s = fold_buffer_block(b_s, buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, o_k, o_v, H, HV, K, V, L, BL,
                                SPLIT)
    else:
        b_s = fold_buffer(b_s, buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, o_k, o_v, H, HV, K, V, L, BC, SPLIT)
    # b_s is now the committed state read at the token's decay: its reads by k and q over this tile's columns
    b_q = tl.load(q + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    b_k = tl.load(k + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    b_v = tl.load(v + (i_b * HV + i_h) * V + o_v).to(tl.float32)
    b_beta = tl.load(beta + i_b * HV + i_h).to(tl.float32)
    b_u = b_beta * (b_v - tl.sum(b_s * b_k[:, None], 0))                                  # [BV]
    tl.store(out + (i_b * HV + i_h) * V + o_v, tl.sum(b_s * b_q[:, None], 0) + tl.sum(b_q * b_k, 0) * b_u)
    return b_s + b_k[:, None] * b_u[None, :]                                               # the token: decay e^0
