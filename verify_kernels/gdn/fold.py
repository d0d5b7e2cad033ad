"""Triton kernel that folds entries into the Gated DeltaNet committed states, for the commit, the flush and the fused
decode + commit (verify_kernels.gdn.commit, verify_kernels.gdn.decode). The math: docs/design.md section 2.

A row folds when buf_len + its new entries >= flush_length (and it has a state slot; the caller allocates a zeroed
one first, a row without one writes nothing):
    S <- e^{G_last} S0 + sum_i e^{G_last - G_i} k_i u_i^T    (the buffer's entries, then the new ones)
with G_last the G of the last folded entry; the sum in blocks of BLOCK_L entries as tensor-core products in three
TF32 passes (tf32x3: fp32-level error). The new entries are one of
    ENTRIES_NONE      nothing new (the flush),
    ENTRIES_TOKEN     one token per row, node 0 of k [B, 1, H, K], u [B, 1, HV, V], gcum [B, 1, HV] (decode),
    ENTRIES_ACCEPTED  the accepted nodes of k [B, T, H, K], u [B, T, HV, V], gcum [B, T, HV] (the commit),
    ENTRIES_DECODE    the decode's token itself, in a step in which every row folds (plain decoding's rows in
                      lockstep): q, k [B, H, K], v [B, HV, V], g, beta [B, HV] in place of k, u, gcum, accepted. Each
                      tile is first brought to the token's decay (e^G S0 + the buffer's fold), the token's reads of
                      it (S^T k, S^T q over the tile's K rows: local to the tile), its entry u = beta (v - S^T k) and
                      its output o = S^T q + (q . k) u (stored), and u folded in as a rank-one update: S0 read once
                      and the decode kernel not run at all (gdn_decode_commit(every_row_folds=True)).

Most commit steps fold few rows or none, and a program per (row, value head, V block) made those steps cost as much
as a fold (0.2-0.3 ms per layer at batch 512 on the H200: 65k programs sized for a state tile). So the grid does not
grow with the batch: (V blocks, value heads, lanes), and each program reads every row's flags (a few bytes per row,
in blocks of SCAN_BLOCK rows), ranks the folding rows and folds the [K, BV] tile of every lane-th one. A step that
folds nothing costs lanes x HV x V / BV programs that read the flags and stop.

With APPEND (small batches, lanes = rows: one launch for the whole commit) the programs of V block 0 also append the
accepted entries of the rows that do not fold, each to its own value head (and its key head's key, by the first
value head of the group); large batches append in the commit's own light kernel instead.

A folding row's own work (its tile, its entries' products, the appends) is in fold_rows.py.
"""

import torch
import triton
import triton.language as tl

from verify_kernels.gdn.fold_rows import (
    append_head,
    decode_fold_row,
    fold_row,
    fold_row_blocks,
    fold_row_loads_first,
    fold_tile,
    folding_row,
    store_fold,
)
from verify_kernels.tma import tile_descriptor, tma_usable

ENTRIES_NONE = 0
ENTRIES_TOKEN = 1
ENTRIES_ACCEPTED = 2
ENTRIES_DECODE = 3

# Launch parameters (benchmarks/sweep_gdn.py times the candidates on the GPU): the state tile [K, FOLD_BLOCK_V] of
# one program; FOLD_LANES programs per (V block, value head), each folding every FOLD_LANES-th folding row. The fold
# is register-bound (ncu 2026-12-03: 3-4 programs per SM, its warps waiting on the S0 load, 2.6 TB/s), so the row
# loop's body holds no inner loop (the buffer and the new entries one block each), and with FOLD_STAGES > 1 Triton's
# pipeliner copies the next rows' tiles and entries into shared memory asynchronously (cp.async) while this row
# folds: bytes in flight that do not sit in registers. The H200 sweep of 2026-12-03 (benchmarks/results/sweeps_h200/
# sweep_gdn_rowloops_2026-12-03.txt, Qwen3.5-9B's 32 value heads): [128, 32] tiles on 4 warps in 3 stages 396 us at
# batch 256 (69% of copy bandwidth) and 107 us at 64, against 449 / 114 us (61%) for the looped row of before (2
# warps, 1 stage); 2 stages on 2 warps 408 / 114; [128, 64] tiles 498-551. Loading the next row's tile into
# registers instead (two tiles in registers) was slower (2026-12-02: 47-49% of copy bandwidth), and so were register
# caps and L2 prefetches. FOLD_LANES: 4 and 8 within 2%. But the pipelined loop wins only where every row folds:
# where few do, its 4 warps of 255 registers (2 programs per SM) pay the flags' scan in two waves, and the H200
# sweep of 2026-12-03 (sweep_gdn_commit_decode_2026-12-03.txt) read a commit folding one row in 8 at 127.7 against
# 100.5 us for the looped row at batch 256 (42.1 / 32.8 at 64), one folding none 35.1 / 25.9, the decode amortised
# over 16 steps 257.6 / 242.8. And it holds a buffer of up to FOLD_PIPELINE_MAX_ENTRIES entries in one block: at 32
# its [32, 128] blocks took 666 against 449 us for a flush. So only a flush of buffers that fit (gdn_flush: every row
# folds) runs it; commits, the decode's fold and the small batches' one-launch commit (APPEND) fold in the looped row
# on LOOPED_FOLD_WARPS (2 warps over 4 at [128, 32] tiles: 578 against 682 us over the sweep's workloads of
# 2026-12-02). Commits and the decode's fold in the pipelined loop with TMA tiles lost too (docs/design.md section 6).
FOLD_BLOCK_V = 32
FOLD_WARPS = 4
FOLD_LANES = 4
FOLD_STAGES = 3
FOLD_PIPELINE_MAX_ENTRIES = 16
LOOPED_FOLD_WARPS = 2
# the looped row's V columns: at [128, 32] tiles on 2 warps it holds 255 registers and spills 32-40 bytes (sm_90,
# Triton 3.9: benchmarks.gdn_registers), at [128, 16] 213 and none, yet 32 columns stay: the H200 sweep of 2026-12-03
# (sweeps_h200/sweep_gdn_verify_commit_decode_2026-12-03f.txt) timed the commit at batch 64 / 256 at 33.3 / 102.1 us
# with 32, 38.9 / 126.1 with 16 (2 warps), 39.9 / 128.0 (4 warps); the decode's fold likewise (239 against 250 us)
LOOPED_FOLD_BLOCK_V = 32
# FOLD_TMA: S0's tiles read and written through tensor descriptors (the pool seen as [S HV K, V], a [K, BV] box a
# tile): Hopper's tensor memory accelerator copies a tile between global and shared memory from one instruction,
# with no per-element addresses in registers and, in the pipelined row loop, the next rows' tiles in flight without
# cp.async's registers. sm_90 (benchmarks.gdn_registers, Triton 3.9): the flush's pipelined loop 150 registers a
# thread against 218 (3 programs an SM instead of 2), the commit's looped row 246 against 255 and 40 bytes spilled
# at 2 warps, 144 at 4 warps. On where the device has TMA (verify_kernels/tma.py; elsewhere the pointer loads): the
# H200 sweep of 2026-12-03, eighth sitting (sweeps_h200/sweep_gdn_fold_commit_decode_2026-12-03h.txt), timed the flush
# with TMA tiles at [128, 64] on 8 warps in 3 stages at 93.6 / 348.1 us at batch 64 / 256 (79% of copy bandwidth)
# against 106.3 / 395.6 (70%) for the pointer loads' best ([128, 32] on 4 warps); [128, 32] on 4 warps 94.6 / 353.4.
# The pipelined loop's tile and warps with TMA: TMA_FOLD_BLOCK_V, TMA_FOLD_WARPS.
FOLD_TMA = True
TMA_FOLD_BLOCK_V = 64
TMA_FOLD_WARPS = 8
# FOLD_SPLIT_TF32: the fold's tf32x3 products from operands split by a mask (verify_kernels/precision.py) instead of
# Triton's emulated roundings, accumulated into the tile (fold_product): fewer instructions and registers for a
# kernel that is register-bound. sm_90 (benchmarks.gdn_registers, Triton 3.9): flush 154 registers against 218, the
# commit's looped row 222 against 255 (+40 bytes spilled) at 2 warps, 112 at 4 warps with FOLD_TMA (4 programs an
# SM). Written and checked in the interpreter on 2026-12-03 (seventh sitting, no device time left): off until
# `benchmarks.sweep_gdn --ops fold,commit,decode` checks and times it.
FOLD_SPLIT_TF32 = False
# LOOPED_LOADS_FIRST: the looped row (commits, the decode's fold where few rows fold) issues every load of a row
# before its first wait (fold_row_loads_first): the buffer as one block, every node of the step with the accepted
# ones picked on chip instead of loaded through the accepted indices, then S0's tile. The looped row as it is waits
# on five memory round trips a row, one after another (S0's tile, then G_last through the accepted indices, the
# buffer's block, the accepted indices, the new entries through them); with 4 lanes a program folds its rows one
# after another and 4 programs fit an SM (registers), so a commit's fold is latency-bound: ~10 us a row a program,
# 61 us a layer for the ~22 rows of 128 that fold in a speculative step of Qwen3.5-9B (the H200 timeline of
# 2026-12-04c; 21 us of bytes), and more lanes or fewer registers changed nothing (sweep_gdn_fold_commit_decode_
# 2026-12-03h*.txt: 4-32 lanes, 111-255 registers, 99-105 us at batch 256). Written on the CPU on 2026-12-05
# (nineteenth session, no device): off until `benchmarks.sweep_gdn --ops commit` times it. sm_90 with Triton 3.6
# (benchmarks.gdn_registers): the commit's row ~2.0 k instructions a warp with no inner loop, against ~1.8 k plus
# two inner loops of ~0.7 k; 255 registers and 8 bytes spilled on 2 warps, 165 and none on 4. Buffers of up to
# LOADS_FIRST_MAX_ENTRIES entries and steps of up to LOADS_FIRST_MAX_NODES nodes; longer ones keep the looped row,
# and so does the small batches' one-launch commit (APPEND: 255 registers and 88 bytes spilled on its 2 warps, and
# the sweep times it at batch 1-16 apart: its op "small"). On: the H200 sweep of 2026-12-05
# (sweeps_h200/sweep_gdn_commit_convqkv_2026-12-05a.txt) timed the commit (a row in 8 folding) at 26.6 / 81.2 us at
# batch 64 / 256 on 2 warps against 27.7 / 96.6 for the looped row (52% of its bound at 256 against 44%); on 4 warps
# 32.8 / 108.9. Checked there at 6.4e-8 relative error and by the GPU tests at the engine's shapes.
LOOPED_LOADS_FIRST = True
LOADS_FIRST_MAX_ENTRIES = 16
LOADS_FIRST_MAX_NODES = 16
SCAN_BLOCK = 128
BLOCK_L = 16


@triton.jit
def gdn_fold_kernel(
    k,             # [B, T, H, K] new entries' keys (ENTRIES != 0; ENTRIES_DECODE: the token's, [B, H, K])
    u,             # [B, T, HV, V] fp32 (ENTRIES != 0; ENTRIES_DECODE: the token's v [B, HV, V])
    gcum,          # [B, T, HV] fp32 (ENTRIES != 0; ENTRIES_DECODE: the token's log decay g [B, HV])
    accepted,      # [B, A] node indices, root first (ENTRIES == 2; ENTRIES_DECODE: the token's beta [B, HV])
    num_accepted,  # [B] (ENTRIES == 2)
    q,             # ENTRIES_DECODE: the token's query [B, H, K]
    out,           # ENTRIES_DECODE: the token's output o [B, HV, V] fp32
    state_pool,    # [S, HV, K, V] fp32
    state_desc,    # TMA: state_pool as a [S HV K, V] tensor descriptor, [K, BV] boxes
    state_slots,   # [B]
    buf_k,         # [R, L, H, K] fp32
    buf_u,         # [R, L, HV, V] fp32
    buf_gcum,      # [R, L, HV] fp32
    buf_len,       # [R]
    req_slots,     # [B]
    flush_length,
    B,             # B, T and A not constexpr: they change from step to step
    T,
    A,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BV: tl.constexpr,
    BC: tl.constexpr,
    BL: tl.constexpr,      # L padded to a power of two >= 16: the buffer's entries in one block
    BB: tl.constexpr,
    BT: tl.constexpr,      # LOADS_FIRST: a step's nodes in one block (T <= BT)
    ENTRIES: tl.constexpr,
    APPEND: tl.constexpr,
    STAGES: tl.constexpr,  # the row loop's pipeline depth (FOLD_STAGES)
    TMA: tl.constexpr,     # S0's tiles through state_desc (FOLD_TMA)
    SPLIT: tl.constexpr,   # tf32x3 from operands split by a mask (FOLD_SPLIT_TF32)
    LOADS_FIRST: tl.constexpr,  # the looped row's loads all issued first (LOOPED_LOADS_FIRST, fold_row_loads_first)
):
    i_v, i_h, i_p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    P = tl.num_programs(2)
    i_hk = i_h // (HV // H)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    for i_0 in range(0, B, BB):
        # every row's flags (32-bit: they stay in registers while the rows fold); rank the rows that fold (any
        # order works as long as every program of a (V block, value head) agrees on it)
        o_b = i_0 + tl.arange(0, BB)
        m_b = o_b < B
        b_r = tl.load(req_slots + o_b, mask=m_b, other=0).to(tl.int32)
        b_slot = tl.load(state_slots + o_b, mask=m_b, other=-1).to(tl.int32)
        b_n = tl.minimum(tl.load(buf_len + b_r, mask=m_b, other=0).to(tl.int32), L)
        if ENTRIES == 2:
            b_na = tl.minimum(tl.load(num_accepted + o_b, mask=m_b, other=0).to(tl.int32), A)
        elif ENTRIES == 0:
            b_na = tl.zeros([BB], tl.int32)
        else:  # the token
            b_na = tl.full([BB], 1, tl.int32)
        b_due = m_b & (b_n + b_na >= flush_length)
        b_fold = b_due & (b_slot >= 0)
        b_rank = tl.where(b_fold, tl.cumsum(b_fold.to(tl.int32), 0) - 1, -1)
        count = tl.sum(b_fold.to(tl.int32), 0)
        if STAGES == 1:
            for j in range(i_p, count, P):
                i_b, i_r, i_s, n, na = folding_row(b_rank, j, o_b, b_r, b_slot, b_n, b_na)
                if LOADS_FIRST:
                    tl.static_assert(ENTRIES < 3, "the token's decode folds in the pipelined row loop")
                    b_s = fold_row_loads_first(state_pool, state_desc, k, u, gcum, accepted, buf_k, buf_u, buf_gcum,
                                               i_b, i_r, i_s, i_h, i_hk, n, na, o_k, o_v, i_v * BV, T, A, H, HV, K,
                                               V, L, BL, BT, ENTRIES, TMA, SPLIT)
                elif ENTRIES == 3:
                    b_s = fold_tile(state_pool, state_desc, i_s, i_h, o_k, o_v, i_v * BV, HV, K, V, TMA)
                    b_s = decode_fold_row(b_s, q, k, u, gcum, accepted, out, buf_k, buf_u, buf_gcum, i_b, i_r, i_h,
                                          i_hk, n, o_k, o_v, H, HV, K, V, L, BC, BL, False, SPLIT)
                else:
                    b_s = fold_tile(state_pool, state_desc, i_s, i_h, o_k, o_v, i_v * BV, HV, K, V, TMA)
                    b_s = fold_row(b_s, k, u, gcum, accepted, buf_k, buf_u, buf_gcum, i_b, i_r, i_h, i_hk, n, na,
                                   o_k, o_v, T, A, H, HV, K, V, L, BC, ENTRIES, SPLIT)
                store_fold(state_pool, state_desc, b_s, i_s, i_h, o_k, o_v, i_v * BV, HV, K, V, TMA)
        else:  # software-pipelined: the next rows' loads in flight (cp.async) while this one folds
            for j in tl.range(i_p, count, P, num_stages=STAGES):
                i_b, i_r, i_s, n, na = folding_row(b_rank, j, o_b, b_r, b_slot, b_n, b_na)
                b_s = fold_tile(state_pool, state_desc, i_s, i_h, o_k, o_v, i_v * BV, HV, K, V, TMA)
                if ENTRIES == 3:
                    b_s = decode_fold_row(b_s, q, k, u, gcum, accepted, out, buf_k, buf_u, buf_gcum, i_b, i_r, i_h,
                                          i_hk, n, o_k, o_v, H, HV, K, V, L, BC, BL, True, SPLIT)
                else:
                    b_s = fold_row_blocks(b_s, k, u, gcum, accepted, buf_k, buf_u, buf_gcum, i_b, i_r, i_h, i_hk, n,
                                          na, o_k, o_v, T, A, H, HV, K, V, L, BL, ENTRIES, SPLIT)
                store_fold(state_pool, state_desc, b_s, i_s, i_h, o_k, o_v, i_v * BV, HV, K, V, TMA)
        if APPEND:
            # the rows that keep buffering, over the lanes too; V block 0 writes each value head's entries
            b_keep = m_b & ~b_due
            b_rank = tl.cumsum(b_keep.to(tl.int32), 0) - 1
            if i_v == 0:
                for j in range(i_p, tl.sum(b_keep.to(tl.int32), 0), P):
                    b_sel = b_keep & (b_rank == j)
                    i_b = tl.sum(tl.where(b_sel, o_b, 0), 0).to(tl.int64)
                    i_r = tl.sum(tl.where(b_sel, b_r, 0), 0).to(tl.int64)
                    n = tl.sum(tl.where(b_sel, b_n, 0), 0)
                    na = tl.sum(tl.where(b_sel, b_na, 0), 0)
                    append_head(k, u, gcum, accepted, buf_k, buf_u, buf_gcum, i_b, i_r, i_h, i_hk, n, na, T, A, H,
                                HV, K, V, L, BC)


def gdn_fold_fwd(k, u, gcum, accepted, num_accepted, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len,
                 req_slots, flush_length: int, *, entries: int, append: bool, T: int, A: int, H: int, HV: int,
                 K: int, V: int, L: int, q: torch.Tensor | None = None, out: torch.Tensor | None = None,
                 every_row_folds: bool = False) -> None:
    """Launch the fold on checked inputs (the callers check them). With append, one lane per row. ENTRIES_DECODE:
    the token's q and its output o (out), the other inputs in k, u, gcum and accepted's places (gdn_fold_kernel).
    every_row_folds: the caller knows that every row folds
    (fold_launch); any rows fold correctly either way."""
    B = req_slots.shape[0]
    if B == 0:
        return
    tma = FOLD_TMA and tma_usable(state_pool)
    stages, warps, block_v = fold_launch(L, append, entries, tma, every_row_folds)
    BV = min(V, block_v)
    loads_first = (LOOPED_LOADS_FIRST and stages == 1 and entries != ENTRIES_DECODE and not append
                   and entry_block(L) <= LOADS_FIRST_MAX_ENTRIES and max(T, A) <= LOADS_FIRST_MAX_NODES)
    lanes = B if append else min(B, FOLD_LANES)
    state_desc = state_descriptor(state_pool, BV) if tma else None
    gdn_fold_kernel[(V // BV, HV, lanes)](
        k, u, gcum, accepted, num_accepted, k if q is None else q, u if out is None else out,  # (unread unless
        state_pool, state_desc, state_slots, buf_k, buf_u, buf_gcum, buf_len,                   # ENTRIES_DECODE)
        req_slots, flush_length, B, T, A,
        H=H, HV=HV, K=K, V=V, L=L, BV=BV, BC=BLOCK_L, BL=entry_block(L),
        BB=SCAN_BLOCK, BT=entry_block(max(T, A)) if loads_first else BLOCK_L, ENTRIES=entries, APPEND=append,
        STAGES=stages, TMA=tma, SPLIT=FOLD_SPLIT_TF32, LOADS_FIRST=loads_first, num_warps=warps, num_stages=1,
    )


def state_descriptor(state_pool: torch.Tensor, block_v: int):
    """The state pool [S, HV, K, V] as a [S HV K, V] tensor descriptor of [K, block_v] boxes (FOLD_TMA;
    verify_kernels/tma.py)."""
    K, V = state_pool.shape[-2:]
    return tile_descriptor(state_pool.view(-1, V), [K, block_v])


def fold_launch(L: int, append: bool, entries: int, tma: bool = False,
                every_row_folds: bool = False) -> tuple[int, int, int]:
    """(row loop stages, warps, V columns per program) of a fold over buffers of L entries: the pipelined row loop
    for a flush, or a decode step in which every row folds (ENTRIES_DECODE; ENTRIES_TOKEN where the caller knows
    that every row folds), whose blocks fit (FOLD_PIPELINE_MAX_ENTRIES), its tile set by whether S0 goes through
    TMA; else the looped row (commits, and the decode's token where a few rows fold: the pipelined loop's lanes
    would sit idle)."""
    pipelined = entries in (ENTRIES_NONE, ENTRIES_DECODE) or (entries == ENTRIES_TOKEN and every_row_folds)
    if FOLD_STAGES > 1 and pipelined and not append and entry_block(L) <= FOLD_PIPELINE_MAX_ENTRIES:
        return (FOLD_STAGES, TMA_FOLD_WARPS, TMA_FOLD_BLOCK_V) if tma else (FOLD_STAGES, FOLD_WARPS, FOLD_BLOCK_V)
    return 1, LOOPED_FOLD_WARPS, LOOPED_FOLD_BLOCK_V


def entry_block(count: int) -> int:
    """A block that holds `count` entries at once: a power of two >= 16 (tl.dot's smallest)."""
    return max(16, triton.next_power_of_2(count))
