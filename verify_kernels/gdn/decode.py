"""Triton kernels for the Gated DeltaNet KVBuffer decode: one new token per row on top of its committed state S0
and buffer (gdn_decode), and plain decoding with the commit of that token fused in (gdn_decode_commit). Semantics,
shapes and pool layout: verify_kernels.gdn.naive (the oracle); the math: docs/design.md section 2.

One program per (row, value head, V block) reads the [K, BV] tile of S0 once (not at all for rows whose state slot is
-1: S0 = 0) and, while that load is in flight, the buffer's share of the committed state's reads,
sum_i e^{G - G_i} (k_i . x) u_i for x = k, q. Its first BLOCK_L entries are loaded before buf_len is known (then
those past buf_len zeroed), so the buffer costs the program no round trip more than S0 does. A separate buffer pass
(one program per row and head, then the state pass) was latency-bound on the H200: ~54 us per layer at batch 256
for a few MiB, a quarter of the step. Then o and u; with the commit, the token's entry appended at buf_len by the
rows that do not flush. The rows that flush fold S0, the buffer and the token into the state in
verify_kernels.gdn.fold's kernel (one read and one write of S0 per flush_length tokens), whose grid does not grow
with the batch; up to SMALL_BATCH rows the decode's own programs fold their tile in place, one launch in all.
"""

import torch
import triton
import triton.language as tl

from verify_kernels.gdn.fold import BLOCK_L, ENTRIES_DECODE, ENTRIES_TOKEN, gdn_fold_fwd
from verify_kernels.gdn.fold_rows import fold_buffer
from verify_kernels.registers import register_cap

# Launch parameters (benchmarks/sweep_gdn.py times the candidates on the GPU). The earlier state pass, S0 alone,
# read it at 3.9-4.0 TB/s on the H200 with [K, 64] tiles at 4 warps (32 columns: 3.4, 128 columns at 8 warps: 2.1),
# at 110 registers per thread (Triton 3.6, sm_90); with the buffer's reads in it, 128-161 (fp32 / bf16 inputs).
# Up to SMALL_BATCH rows one launch (the decode's programs fold in place): faster up to batch 16 in the H200 sweep
# of 2026-12-02.
BLOCK_V = 64
NUM_WARPS = 2  # (the split roles' winner; the per-row kernel's was 4: DECODE_SPLIT_ROLES)
SMALL_BATCH = 16
# The buffer's first block loaded before buf_len arrives (16 entries fetched whatever the fill: at the engine's mean
# fill of 7 of 16, about 200 KiB per row and layer more than the entries, ~8% of the S0 read), or after it (only the
# entries; the S0 load is in flight meanwhile). Not yet measured against each other: benchmarks/sweep_gdn.py.
BUFFER_BEFORE_LEN = True
SMALL_BLOCK_V = 32
SMALL_WARPS = 4
# DECODE_SPLIT_ROLES: above SMALL_BATCH, the decode's two kinds of work in different programs of one launch, so that
# neither waits on the other: state programs stream S0 and do nothing else (S0^T k and S0^T q of their tile, as the
# S0-only state pass that read at 3.9-4.0 TB/s), buffer programs do the buffer's latency-bound share (its own pass
# before: ~54 us at batch 256, run after the state pass), side by side on the SMs; then a small launch finishes o and
# u from both (4 [B, HV, V] fp32 scratch arrays, ~8 MiB each way at batch 256) and appends the token. On the H200
# (2026-12-04, benchmarks/results/sweeps_h200/sweep_gdn_commit_decode_verify_2026-12-04a.txt; decode + commit
# amortised over a 16-token flush): [K, 64] tiles on 2 warps (BLOCK_V, NUM_WARPS; 160 registers, 6 programs an SM)
# 63.1 / 220.7 us at batch 64 / 256 against 72.2 / 239.6 for the per-row kernel in the same run; 4 warps 67.4 /
# 237.4, 32 columns 67.4-75.4 / 234.4-269.8. The per-row kernel keeps the small batches (SMALL_BLOCK_V, SMALL_WARPS).
# The buffer programs fetch only the entries before buf_len (SPLIT_BUFFER_BEFORE_LEN False: no S0 load of their own
# to hide the round trip under, and no bytes past the fill): 60.4 / 211.9 us against 63.2 / 220.9 (H200, 2026-12-04,
# sweeps_h200/sweep_gdn_decode_2026-12-04b.txt); the finish's tile and warps there made no difference.
DECODE_SPLIT_ROLES = True
SPLIT_BUFFER_BEFORE_LEN = False
# SPLIT_BUFFER_BLOCK_V: a buffer program's V columns (None: BLOCK_V, as the state programs'). At all of V a value head's
# buffer share is one program, which loads its key head's keys half as often; the other buffer slots of the grid
# exit at once. On at all of V (128 at Qwen3.5's sizes): H200 2026-12-04 (sweeps_h200/sweep_gdn_2026-12-04c.txt),
# 58.3 / 204.3 us at batch 64 / 256 against 61.2 / 214.2 at BLOCK_V, the same registers (160).
SPLIT_BUFFER_BLOCK_V = 128
SPLIT_FINISH_BLOCK_V = 128
SPLIT_FINISH_WARPS = 4
# SPLIT_ROLES_MAX_REGISTERS: a cap on the state and buffer programs' registers a thread (verify_kernels/registers.py),
# or None. sm_90 with the H200's Triton 3.6 (compiled on the CPU, Qwen3.5-9B heads): 160 registers on 2 warps, 6
# programs an SM, for a launch of 2 x 32 x 2B programs (32768 at batch 256) that streams S0 at 86% of its bytes
# (Qwen3.5-9B plain batch 256 on the H200, 2026-12-05: 3.56 ms a step against 3.08); capped at 144, 8 bytes spilled,
# 7 programs an SM (more of S0 in flight); at 128, 120 bytes. A sweep candidate (benchmarks/sweep_gdn.py --ops decode)
# until the H200 times it.
SPLIT_ROLES_MAX_REGISTERS = None
# FOLDING_DECODE: the launch of plain decoding's step in which every row folds (gdn_decode_commit(every_row_folds=
# True): rows in lockstep), above SMALL_BATCH rows. "decode-then-fold": the decode's launches, then the token folded
# in the flush's pipelined row loop (fold.ENTRIES_TOKEN); "in-fold": the fold kernel decodes the token itself
# (fold.ENTRIES_DECODE: S0 read once, no decode launch), its reads S^T k, S^T q summed over the folded tile. The H200
# (2026-12-04, seventeenth session, benchmarks.probe_gdn_decode_fold in one process, Qwen3.5-9B's heads, batch
# 128 / 256 / 512): "decode-then-fold" 279 / 545 / 1073 us, "in-fold" 307 / 612 / 1214, the looped row 372 / 738 /
# 1478 and a flush of the same buffers 181 / 356 / 703: the one launch that also sums the token's reads over its
# tiles loses to two (its reads from the tile as loaded plus the buffer's share instead: 428 / 869 / 1748). Its
# reads as one tensor-core product instead of the sums ([k; q; 0] [16, K] . S, tf32x3) compiled for sm_90 at 255
# registers with 32 bytes spilled and 192 KB of shared memory, against 207, none and 136 KB for the sums
# (benchmarks.gdn_registers, Triton 3.9, 2026-12-04): not pursued.
FOLDING_DECODE = "decode-then-fold"
FOLDING_DECODES = ("decode-then-fold", "in-fold")

MAX_BUFFER = 64
HEAD_DIMS = (16, 32, 64, 128)
INDEX_DTYPES = (torch.int32, torch.int64)
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def buffer_reads(buf_k, buf_u, buf_gcum, buf_len, i_r, i_h, i_hk, b_g, b_k, b_q, o_k, o_v, H: tl.constexpr,
                 HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr, BC: tl.constexpr,
                 BEFORE_LEN: tl.constexpr):
    """Buffer row i_r's share of reading the committed state at a new token with key b_k, query b_q [K] and log
    decay b_g: returns the row's n = buf_len, the token's G (the last entry's G, 0 for an empty buffer, plus g) and
    sum_i e^{G - G_i} (k_i . x) u_i over columns o_v for x = k, q ([BV] each), never reading past n."""
    o_c = tl.arange(0, BC)
    n = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
    # BEFORE_LEN: the first block is loaded in the bounds of the row without waiting for n (the entries past n are
    # dropped below); else only the entries before n are fetched, a round trip later (under the S0 load in flight)
    m_in = o_c < tl.where(BEFORE_LEN, L, n)
    b_bk = tl.load(buf_k + ((i_r * L + o_c[:, None]) * H + i_hk) * K + o_k[None, :], mask=m_in[:, None], other=0.)
    b_bu = tl.load(buf_u + ((i_r * L + o_c[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_in[:, None], other=0.)
    b_bg = tl.load(buf_gcum + (i_r * L + o_c) * HV + i_h, mask=m_in, other=0.)
    b_G = b_g + tl.sum(tl.where(o_c == n - 1, b_bg, 0.), 0)
    if n > BC:
        b_G = b_g + tl.load(buf_gcum + (i_r * L + n - 1) * HV + i_h)
    m_c = o_c < n
    # stale entries may hold anything, NaN included: select them away, never multiply them by 0
    b_decay = tl.exp(tl.where(m_c, b_G - b_bg, float("-inf")))                            # [BC], e^{G - G_i} <= 1
    b_bu = tl.where(m_c[:, None], b_bu, 0.)
    b_wk = tl.where(m_c, tl.sum(b_bk * b_k[None, :], 1) * b_decay, 0.)
    b_wq = tl.where(m_c, tl.sum(b_bk * b_q[None, :], 1) * b_decay, 0.)
    b_kr = tl.sum(b_wk[:, None] * b_bu, 0)
    b_qr = tl.sum(b_wq[:, None] * b_bu, 0)
    for i_c in range(BC, n, BC):
        o_c = i_c + tl.arange(0, BC)
        m_c = o_c < n
        b_bk = tl.load(buf_k + ((i_r * L + o_c[:, None]) * H + i_hk) * K + o_k[None, :], mask=m_c[:, None], other=0.)
        b_bu = tl.load(buf_u + ((i_r * L + o_c[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_c[:, None], other=0.)
        b_bg = tl.load(buf_gcum + (i_r * L + o_c) * HV + i_h, mask=m_c, other=0.)
        b_decay = tl.exp(tl.where(m_c, b_G - b_bg, float("-inf")))
        b_kr += tl.sum((tl.sum(b_bk * b_k[None, :], 1) * b_decay)[:, None] * b_bu, 0)
        b_qr += tl.sum((tl.sum(b_bk * b_q[None, :], 1) * b_decay)[:, None] * b_bu, 0)
    return n, b_G, b_kr, b_qr


@triton.jit
def token_inputs(q, k, v, g, beta, i_b, i_h, i_hk, o_k, o_v, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                 V: tl.constexpr):
    """Row i_b's token, value head i_h, columns o_v: its offset in [B, HV, V] and q, k [K], v [BV], g, beta (fp32)."""
    p_x = (i_b * HV + i_h) * V + o_v
    b_q = tl.load(q + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    b_k = tl.load(k + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    b_v = tl.load(v + p_x).to(tl.float32)
    b_g = tl.load(g + i_b * HV + i_h).to(tl.float32)
    b_beta = tl.load(beta + i_b * HV + i_h).to(tl.float32)
    return p_x, b_q, b_k, b_v, b_g, b_beta


@triton.jit
def token_outputs(o, u, gcum, b_s, b_q, b_k, b_v, b_beta, b_G, b_kr, b_qr, p_x, i_b, i_h, i_v, HV: tl.constexpr):
    """S0's share of the token's reads (its tile b_s [K, BV]) added to the buffer's, then o, u and G stored;
    -> e^G and u [BV]."""
    b_eG = tl.exp(b_G)
    b_kr += b_eG * tl.sum(b_s * b_k[:, None], 0)
    b_qr += b_eG * tl.sum(b_s * b_q[:, None], 0)
    b_u = b_beta * (b_v - b_kr)
    tl.store(o + p_x, b_qr + tl.sum(b_q * b_k, 0) * b_u)
    tl.store(u + p_x, b_u)
    tl.store(gcum + i_b * HV + i_h, b_G, mask=i_v == 0)
    return b_eG, b_u


@triton.jit
def append_token(buf_k, buf_u, buf_gcum, b_k, b_u, b_G, i_r, i_h, i_hk, i_v, n, o_k, o_v, H: tl.constexpr,
                 HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr):
    """The token's entry at buffer position n: u of this V block, G and the key head's key once."""
    tl.store(buf_u + ((i_r * L + n) * HV + i_h) * V + o_v, b_u)
    if i_v == 0:
        tl.store(buf_gcum + (i_r * L + n) * HV + i_h, b_G)
        if i_h % (HV // H) == 0:
            tl.store(buf_k + ((i_r * L + n) * H + i_hk) * K + o_k, b_k)


@triton.jit
def gdn_decode_kernel(
    q, k, v, g, beta,        # [B, H, K], [B, H, K], [B, HV, V], [B, HV], [B, HV]
    state_pool,              # [S, HV, K, V] fp32
    state_slots,             # [B]
    buf_k, buf_u, buf_gcum,  # [R, L, H, K], [R, L, HV, V], [R, L, HV] fp32
    buf_len,                 # [R]
    req_slots,               # [B]
    o, u, gcum,              # [B, HV, V], [B, HV, V], [B, HV] fp32 out
    flush_length,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BV: tl.constexpr,
    BC: tl.constexpr,
    BEFORE_LEN: tl.constexpr,
    COMMIT: tl.constexpr,
    FOLD_HERE: tl.constexpr,   # COMMIT: the rows that flush fold here, else in the fold kernel launched next
):
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hk = i_h // (HV // H)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    p_x, b_q, b_k, b_v, b_g, b_beta = token_inputs(q, k, v, g, beta, i_b, i_h, i_hk, o_k, o_v, H, HV, K, V)
    b_s = tl.zeros([K, BV], dtype=tl.float32)
    if i_s >= 0:
        # S0 is streamed once and not reused: evict it first so the buffers and inputs keep the L2
        b_s = tl.load(state_pool + ((i_s * HV + i_h) * K + o_k[:, None]) * V + o_v[None, :],
                      eviction_policy="evict_first")
    n, b_G, b_kr, b_qr = buffer_reads(buf_k, buf_u, buf_gcum, buf_len, i_r, i_h, i_hk, b_g, b_k, b_q, o_k, o_v, H,
                                      HV, K, V, L, BC, BEFORE_LEN)
    b_eG, b_u = token_outputs(o, u, gcum, b_s, b_q, b_k, b_v, b_beta, b_G, b_kr, b_qr, p_x, i_b, i_h, i_v, HV)
    if COMMIT:
        if n + 1 < flush_length:
            append_token(buf_k, buf_u, buf_gcum, b_k, b_u, b_G, i_r, i_h, i_hk, i_v, n, o_k, o_v, H, HV, K, V, L)
        elif FOLD_HERE:
            # S <- e^G S0 + sum_i e^{G - G_i} k_i u_i^T + k u^T: the token is the last entry, decay 1
            if i_s >= 0:
                b_s = b_eG * b_s + b_k[:, None] * b_u[None, :]
                b_s = fold_buffer(b_s, buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, o_k, o_v, H, HV, K, V, L, BC,
                                  False)
                tl.store(state_pool + ((i_s * HV + i_h) * K + o_k[:, None]) * V + o_v[None, :], b_s)


@triton.jit
def gdn_decode_roles_kernel(
    q, k, g,                 # [B, H, K], [B, H, K], [B, HV]
    state_pool,              # [S, HV, K, V] fp32
    state_slots,             # [B]
    buf_k, buf_u, buf_gcum,  # [R, L, H, K], [R, L, HV, V], [R, L, HV] fp32
    buf_len,                 # [R]
    req_slots,               # [B]
    kS, qS, kr, qr, G,       # [B, HV, V] x 4, [B, HV] fp32 out: S0's and the buffer's shares of the reads, the G
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BV: tl.constexpr,
    BVB: tl.constexpr,       # a buffer program's V columns (a multiple of BV; past V / BVB blocks they do nothing)
    BC: tl.constexpr,
    BEFORE_LEN: tl.constexpr,
):
    """DECODE_SPLIT_ROLES' first launch: a grid of (V / BV blocks, value heads, 2 B); program_id(2) = 2 row + role,
    role 0 S0^T k and S0^T q of the row's [K, BV] tile (nothing for a row without a state: gdn_decode_finish drops
    it), role 1 the buffer's sum_i e^{G - G_i} (k_i . x) u_i for x = k, q over BVB columns and the token's G."""
    i_v, i_h, i_z = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, role = i_z // 2, i_z % 2
    i_hk = i_h // (HV // H)
    o_k = tl.arange(0, K)
    b_q = tl.load(q + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    b_k = tl.load(k + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    if role == 0:
        i_s = tl.load(state_slots + i_b).to(tl.int64)
        if i_s >= 0:
            o_v = i_v * BV + tl.arange(0, BV)
            p_x = (i_b * HV + i_h) * V + o_v
            b_s = tl.load(state_pool + ((i_s * HV + i_h) * K + o_k[:, None]) * V + o_v[None, :],
                          eviction_policy="evict_first")
            tl.store(kS + p_x, tl.sum(b_s * b_k[:, None], 0))
            tl.store(qS + p_x, tl.sum(b_s * b_q[:, None], 0))
    elif i_v < V // BVB:
        o_v = i_v * BVB + tl.arange(0, BVB)
        p_x = (i_b * HV + i_h) * V + o_v
        i_r = tl.load(req_slots + i_b).to(tl.int64)
        b_g = tl.load(g + i_b * HV + i_h).to(tl.float32)
        _, b_G, b_kr, b_qr = buffer_reads(buf_k, buf_u, buf_gcum, buf_len, i_r, i_h, i_hk, b_g, b_k, b_q, o_k, o_v,
                                          H, HV, K, V, L, BC, BEFORE_LEN)
        tl.store(kr + p_x, b_kr)
        tl.store(qr + p_x, b_qr)
        tl.store(G + i_b * HV + i_h, b_G, mask=i_v == 0)


@triton.jit
def gdn_decode_finish_kernel(
    q, k, v, beta,           # [B, H, K], [B, H, K], [B, HV, V], [B, HV]
    state_slots,             # [B]
    buf_k, buf_u, buf_gcum,  # the buffer pools (COMMIT: the token's entry appended)
    buf_len,                 # [R]
    req_slots,               # [B]
    kS, qS, kr, qr, G,       # gdn_decode_roles_kernel's outputs
    o, u, gcum,              # [B, HV, V], [B, HV, V], [B, HV] fp32 out
    flush_length,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BV: tl.constexpr,
    COMMIT: tl.constexpr,
):
    """DECODE_SPLIT_ROLES' second launch, per (V block, value head, row): token_outputs from the two shares, then
    (COMMIT) the token's entry appended by a row that does not flush (the rows that flush: the fold kernel, next)."""
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hk = i_h // (HV // H)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    p_x = (i_b * HV + i_h) * V + o_v
    b_q = tl.load(q + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    b_k = tl.load(k + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    b_v = tl.load(v + p_x).to(tl.float32)
    b_beta = tl.load(beta + i_b * HV + i_h).to(tl.float32)
    b_G = tl.load(G + i_b * HV + i_h)
    # a row without a state has no S0 share (its scratch was never written: selected away, never multiplied by 0)
    has_state = tl.load(state_slots + i_b) >= 0
    b_eG = tl.exp(b_G)
    b_kr = tl.load(kr + p_x) + tl.where(has_state, b_eG * tl.load(kS + p_x), 0.)
    b_qr = tl.load(qr + p_x) + tl.where(has_state, b_eG * tl.load(qS + p_x), 0.)
    b_u = b_beta * (b_v - b_kr)
    tl.store(o + p_x, b_qr + tl.sum(b_q * b_k, 0) * b_u)
    tl.store(u + p_x, b_u)
    tl.store(gcum + i_b * HV + i_h, b_G, mask=i_v == 0)
    if COMMIT:
        i_r = tl.load(req_slots + i_b).to(tl.int64)
        n = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
        if n + 1 < flush_length:
            append_token(buf_k, buf_u, buf_gcum, b_k, b_u, b_G, i_r, i_h, i_hk, i_v, n, o_k, o_v, H, HV, K, V, L)


def check_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int]:
    """H, HV, K, V of q, k [..., H, K] and v [..., HV, V], checked: K, V in HEAD_DIMS, HV % H == 0."""
    H, K = k.shape[-2:]
    HV, V = v.shape[-2:]
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    if K not in HEAD_DIMS or V not in HEAD_DIMS:
        raise ValueError(f"K and V must be in {HEAD_DIMS}, got K = {K}, V = {V}")
    if HV % H:
        raise ValueError(f"the value heads ({HV}) must be a multiple of the key heads ({H})")
    return H, HV, K, V


def check_tensors(dtypes: tuple[torch.dtype, ...], **tensors: torch.Tensor) -> None:
    for name, x in tensors.items():
        if x.dtype not in dtypes:
            raise ValueError(f"{name} must be one of {dtypes}, got {x.dtype}")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous")


def check_shape(name: str, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")


def check_pools(B, H, HV, K, V, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots) -> int:
    """Check the pools (verify_kernels.gdn.naive's module docstring) for B rows; returns the buffer capacity L."""
    R, L = buf_k.shape[:2]
    if L > MAX_BUFFER:
        raise ValueError(f"buffer capacity L must be at most {MAX_BUFFER}, got {L}")
    check_shape("state_pool", state_pool, (state_pool.shape[0], HV, K, V))
    check_shape("buf_k", buf_k, (R, L, H, K))
    check_shape("buf_u", buf_u, (R, L, HV, V))
    check_shape("buf_gcum", buf_gcum, (R, L, HV))
    check_shape("buf_len", buf_len, (R,))
    check_shape("state_slots", state_slots, (B,))
    check_shape("req_slots", req_slots, (B,))
    check_tensors((torch.float32,), state_pool=state_pool, buf_k=buf_k, buf_u=buf_u, buf_gcum=buf_gcum)
    check_tensors(INDEX_DTYPES, state_slots=state_slots, buf_len=buf_len, req_slots=req_slots)
    return L


def check_decode(q, k, v, g, beta, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots,
                 flush_length: int | None) -> tuple[int, int, int, int, int, int]:
    """Check a decode's inputs (flush_length: a decode + commit's) -> B, H, HV, K, V and the buffer capacity L."""
    B = q.shape[0]
    H, HV, K, V = check_heads(q, k, v)
    check_shape("q", q, (B, H, K))
    check_shape("v", v, (B, HV, V))
    check_shape("g", g, (B, HV))
    check_shape("beta", beta, (B, HV))
    check_tensors(INPUT_DTYPES, q=q, k=k, v=v, g=g, beta=beta)
    L = check_pools(B, H, HV, K, V, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots)
    if flush_length is not None and not 1 <= flush_length <= L:
        raise ValueError(f"flush_length must be in [1, {L}] (the buffer capacity), got {flush_length}")
    return B, H, HV, K, V, L


def gdn_decode_fwd(q, k, v, g, beta, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots,
                   flush_length: int | None,
                   every_row_folds: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the decode (flush_length None) or the fused decode + commit (every_row_folds: its fold in the
    pipelined row loop, FOLDING_DECODE "decode-then-fold"). Returns o, u, gcum."""
    B, H, HV, K, V, L = check_decode(q, k, v, g, beta, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len,
                                     req_slots, flush_length)
    commit = flush_length is not None

    f32 = dict(dtype=torch.float32, device=q.device)
    o, u, gcum = torch.empty(B, HV, V, **f32), torch.empty(B, HV, V, **f32), torch.empty(B, HV, **f32)
    if B == 0:
        return o, u, gcum
    shapes = dict(H=H, HV=HV, K=K, V=V, L=L)
    small = B <= SMALL_BATCH
    BV = min(V, SMALL_BLOCK_V if small else BLOCK_V)
    if not small and DECODE_SPLIT_ROLES:  # state and buffer programs side by side, then the finish (its comment)
        kS, qS, kr, qr = (torch.empty(B, HV, V, **f32) for _ in range(4))
        G = torch.empty(B, HV, **f32)
        gdn_decode_roles_kernel[(V // BV, HV, 2 * B)](
            q, k, g, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots, kS, qS, kr, qr, G,
            **shapes, BV=BV, BVB=min(V, max(BV, SPLIT_BUFFER_BLOCK_V or BV)), BC=BLOCK_L,
            BEFORE_LEN=SPLIT_BUFFER_BEFORE_LEN, num_warps=NUM_WARPS, num_stages=1,
            **register_cap(SPLIT_ROLES_MAX_REGISTERS),
        )
        BVF = min(V, SPLIT_FINISH_BLOCK_V)
        gdn_decode_finish_kernel[(V // BVF, HV, B)](
            q, k, v, beta, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots, kS, qS, kr, qr, G, o, u, gcum,
            flush_length if commit else 0, **shapes, BV=BVF, COMMIT=commit, num_warps=SPLIT_FINISH_WARPS,
            num_stages=1,
        )
    else:
        gdn_decode_kernel[(V // BV, HV, B)](
            q, k, v, g, beta, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots, o, u,
            gcum, flush_length if commit else 0,
            **shapes, BV=BV, BC=BLOCK_L, BEFORE_LEN=BUFFER_BEFORE_LEN, COMMIT=commit, FOLD_HERE=small,
            num_warps=SMALL_WARPS if small else NUM_WARPS,
            num_stages=1,
        )
    if commit and not small:
        # the token is each row's one new entry: k [B, 1, H, K], u [B, 1, HV, V], gcum [B, 1, HV] (the accepted
        # pointers are unused, buf_len stands in for them)
        gdn_fold_fwd(k, u, gcum, buf_len, buf_len, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len,
                     req_slots, flush_length, entries=ENTRIES_TOKEN, append=False, T=1, A=1,
                     every_row_folds=every_row_folds, **shapes)
    return o, u, gcum


def gdn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_k: torch.Tensor,
    buf_u: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One new token per row on top of its committed S0 + buffer; writes nothing (gdn_decode_ref).

    q, k: [B, H, K]; v: [B, HV, V]; g, beta: [B, HV] (fp32, bf16 or fp16); state_pool [S, HV, K, V],
    buf_k [R, L, H, K], buf_u [R, L, HV, V], buf_gcum [R, L, HV] fp32; state_slots [B] (-1: no state),
    buf_len [R], req_slots [B] int32 / int64. K, V in {16, 32, 64, 128}, HV % H == 0, L <= 64.
    Returns o [B, HV, V], the token's buffer entry u [B, HV, V] and gcum [B, HV], float32.
    """
    o, u, gcum = gdn_decode_fwd(q, k, v, g, beta, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len,
                                req_slots, None)
    return o, u, gcum


def gdn_decode_commit(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_k: torch.Tensor,
    buf_u: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
    flush_length: int,
    *,
    flushed: bool = True,
    every_row_folds: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Plain decoding: gdn_decode_ref then gdn_commit_ref of the token (accepted [[0]], num_accepted 1), fused.

    Shapes as in gdn_decode; 1 <= flush_length <= L. In place: a row with buf_len + 1 < flush_length writes the
    token's entry at buffer position buf_len; the other rows fold S0, the buffer and the token into
    state_pool[state_slots], whose slot must be >= 0 (the caller allocates a zeroed one first; unlike the
    reference this is not checked, which would synchronise with the device; a row without one writes nothing).
    buf_len is not modified (the caller sets it to 0 if flushed else buf_len + 1).
    Returns o [B, HV, V] float32 and flushed [B] bool (None with flushed=False: the engine's cache knows which rows
    fold on the host, and the three torch ops it takes ran per layer and step).
    every_row_folds: every row with a state slot folds in this step (plain decoding's rows in lockstep: the engine's
    cache knows it on the host, and a row that would append instead is the caller's error, not checked); the rows
    without one (a graph's padding rows) write nothing, and their output is unspecified (zeros where the fold
    kernel decodes). Above SMALL_BATCH rows the fold runs the flush's pipelined row loop (FOLDING_DECODE: after the
    decode's launches, or decoding the token itself).
    """
    if every_row_folds and q.shape[0] > SMALL_BATCH and FOLDING_DECODE != "decode-then-fold":
        if FOLDING_DECODE not in FOLDING_DECODES:
            raise ValueError(f"FOLDING_DECODE must be one of {FOLDING_DECODES}, got {FOLDING_DECODE!r}")
        B, H, HV, K, V, L = check_decode(q, k, v, g, beta, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len,
                                         req_slots, flush_length)
        o = torch.zeros(B, HV, V, dtype=torch.float32, device=q.device)
        # (the token's inputs in the fold's entry arguments: k; v as u, g as gcum, beta as accepted)
        gdn_fold_fwd(k, v, g, beta, buf_len, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots,
                     flush_length, entries=ENTRIES_DECODE, append=False, T=1, A=1, H=H, HV=HV, K=K, V=V, L=L, q=q,
                     out=o)
    else:
        o, _, _ = gdn_decode_fwd(q, k, v, g, beta, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len,
                                 req_slots, flush_length, every_row_folds)
    return o, (buf_len[req_slots] + 1 >= flush_length) if flushed else None
