"""Triton kernel for Mamba2 KVBuffer decoding: one new token per row on top of its committed state h0 + buffer, with
the same signatures and semantics as mamba2_decode_ref, and plain decoding fused with the commit of that token
(mamba2_decode_ref then mamba2_commit_ref of the one-node path, in one launch). The math: docs/design.md section 2.

    y = e^{G} h0 C + sum_{i < buf_len} e^{G - G_i} (B_i . C) xdt_i + (B . C) xdt + D x,   G = G_last + dt A

One program per (row, head, P block of BP rows), two paths chosen per row at the top:
- step (plain decode, and the decode-commit rows whose buffer does not fill): the [BP, N] tile of h0 is the first
  load issued and the last value used (none for rows without a state: h0 = 0), the buffer's entries load meanwhile
  (BLOCK_L at a time, never the stale positions past buf_len) and their scores B_i . C are summed on the FMA units;
  a decode-commit appends the token's entry at buf_len (B once per group). One read of h0, no state written;
- fold (decode-commit rows with buf_len + 1 >= flush_length): h <- e^G h0 + sum_i e^{G - G_i} xdt_i B_i^T + xdt B^T,
  y = h C + D x, h written back: the buffer as one block of BL entries masked at buf_len, the state in N slices of
  BN columns (one tf32x3 tl.dot each), each slice read again right after the load above (whose tile is dead on
  this path; the second read finds the lines in the L2, in flight or arrived). One write of h0 per flush_length
  tokens.
Unlike the GDN decode (verify_kernels/gdn/decode.py) there is no separate buffer pass: a Mamba2 output adds the
buffer's share to the state's, with nothing in between that needs both (GDN's u does), so that share costs this
program a few loads issued next to h0's instead of a launch and a scratch round trip. The fold runs in the same
launch rather than a third kernel (which would cost every step a launch and a grid of programs that return at
once) because the two paths are disjoint branches: the kernel's registers are the larger of the two, not their
sum. The fold is written to need no more than the step (128 registers at BP 64 with either, ptxas for sm_90): the
old kernel carried a whole-tile fold accumulator through the buffer loop of every row and ran at half of copy
bandwidth on the H200 (254 us per step at batch 256 for a 138 us bound); a fold of the whole [BP, N] tile at once
took 229 registers, and so 2 programs per SM instead of 4 on every step.
Buffer decays e^{G - G_i} = e^{(G_last - G_i) + dt A} are <= 1 and computed from the small differences; masked
entries get -inf before the exp.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from verify_kernels.mamba2.commit import check_flush_length, check_pools, check_tokens
from verify_kernels.precision import add_product

# Tunables, none timed yet at these settings: benchmarks/sweep_mamba2.py times the candidates on the GPU (a step
# at the mean buffer fill and a fold step, batch 64 and 256) and prints the best; copy its choice here.
# BLOCK_P, NUM_WARPS: P rows of h0 per program and its warps (BP x N x 4 bytes: 32 KiB at 64 x 128; the GDN state
# pass read S0 fastest in 32 KiB tiles on 4 warps; 128 registers, 4 programs per SM). BLOCK_L: buffer entries per
# step of the step path (the engine's buffers hold fewer than 16). Small batches use SMALL_BATCH_BLOCK_P so that
# one row still spreads over the SMs (P / 16 x NH = 256 programs at Nemotron-3-Nano's sizes).
BLOCK_P = 64
BLOCK_L = 16
NUM_WARPS = 4
SMALL_BATCH = 4
SMALL_BATCH_BLOCK_P = 16
# the fold: N columns per slice (the whole N at once held too many registers), its tl.dots in three TF32 passes
# (fp32-level error): Triton's tf32x3, or "tf32x3-split" (verify_kernels/precision.py: operands split by a mask, no
# emulated roundings, DecodeConfig.fold_precision): the H200 sweep of 2026-12-03, eighth sitting
# (sweeps_h200/sweep_mamba2_2026-12-03h.txt), decode amortised over 16 steps 49.6 / 177.7 us at batch 64 / 256 with
# the split against 49.5 / 176.8 without: the same, so Triton's stays
FOLD_BLOCK_N = 32
FOLD_PRECISION = "tf32x3"


class DecodeConfig(NamedTuple):
    """Launch parameters of one decode (decode_config gives the tuned ones; benchmarks/sweep_mamba2.py tries others)."""

    block_p: int                    # P rows of h0 per program
    block_l: int                    # buffer entries per step of the step path
    num_warps: int
    block_n: int = FOLD_BLOCK_N     # N columns per fold slice
    fold_precision: str | None = None  # the fold's products (FOLD_PRECISION when None)


def decode_config(B: int, P: int) -> DecodeConfig:
    """The tuned launch parameters for B rows and head dim P."""
    return DecodeConfig(min(P, SMALL_BATCH_BLOCK_P if B <= SMALL_BATCH else BLOCK_P), BLOCK_L, NUM_WARPS)


@triton.jit
def token_inputs(x, dt, A, Bm, C, D, i_b, i_h, i_g, o_p, o_n, NH: tl.constexpr, NG: tl.constexpr, P: tl.constexpr,
                 N: tl.constexpr):
    """Row i_b's token, head i_h, P rows o_p: x [BP], dt, its log decay dt A, B and C [N] of group i_g, D x [BP]
    (fp32)."""
    b_x = tl.load(x + (i_b * NH + i_h) * P + o_p).to(tl.float32)
    b_dt = tl.load(dt + i_b * NH + i_h).to(tl.float32)
    b_a = b_dt * tl.load(A + i_h).to(tl.float32)                         # the token's log decay
    b_k = tl.load(Bm + (i_b * NG + i_g) * N + o_n).to(tl.float32)
    b_c = tl.load(C + (i_b * NG + i_g) * N + o_n).to(tl.float32)
    b_dx = tl.load(D + i_h).to(tl.float32) * b_x
    return b_x, b_dt, b_a, b_k, b_c, b_dx


@triton.jit
def token_entry(buf_b, buf_xdt, buf_gcum, xdt_out, gcum_out, b_k, b_xdt, b_G, i_b, i_r, i_h, i_g, i_p, n_buf, o_p,
                o_n, NH: tl.constexpr, NG: tl.constexpr, P: tl.constexpr, N: tl.constexpr, L: tl.constexpr,
                COMMIT: tl.constexpr):
    """The token's buffer entry: COMMIT, appended at buffer position buf_len (xdt per P block, G per head, B once
    per group); else handed back in xdt_out and gcum_out."""
    if COMMIT:
        pos = i_r * L + n_buf
        tl.store(buf_xdt + (pos * NH + i_h) * P + o_p, b_xdt)
        if i_p == 0:
            tl.store(buf_gcum + pos * NH + i_h, b_G)
            if i_h % (NH // NG) == 0:
                tl.store(buf_b + (pos * NG + i_g) * N + o_n, b_k)
    else:
        tl.store(xdt_out + (i_b * NH + i_h) * P + o_p, b_xdt)
        if i_p == 0:
            tl.store(gcum_out + i_b * NH + i_h, b_G)


@triton.jit
def mamba2_decode_kernel(
    x,             # [B, NH, P]
    dt,            # [B, NH]
    A,             # [NH]
    Bm,            # [B, NG, N]
    C,             # [B, NG, N]
    D,             # [NH]
    state_pool,    # [S, NH, P, N] fp32 (COMMIT: folded rows written)
    state_slots,   # [B]
    buf_b,         # [R, L, NG, N] fp32 (COMMIT: the entry appended)
    buf_xdt,       # [R, L, NH, P] fp32
    buf_gcum,      # [R, L, NH] fp32
    buf_len,       # [R]
    req_slots,     # [B]
    y,             # [B, NH, P] fp32 out
    xdt_out,       # [B, NH, P] fp32 out (not COMMIT)
    gcum_out,      # [B, NH] fp32 out (not COMMIT)
    flushed,       # [B] bool out (COMMIT)
    flush_length,
    NH: tl.constexpr,
    NG: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    L: tl.constexpr,
    BP: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BL: tl.constexpr,          # L padded to a power of two >= 16: the fold's block of entries
    BN: tl.constexpr,
    COMMIT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_p, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_g = i_h // (NH // NG)
    o_p = i_p * BP + tl.arange(0, BP)
    o_n = tl.arange(0, N)

    # the state tile first: the load that moves the bytes is in flight during everything below (no row of it for
    # state slot -1: h0 = 0, never read); streamed once, so evicted first to keep the buffers in the L2
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    p_h = state_pool + ((i_s * NH + i_h) * P + o_p[:, None]) * N + o_n[None, :]
    m_h = o_p[:, None] < tl.where(i_s >= 0, P, 0)            # [BP, 1]: all rows, or none without a state
    b_h = tl.load(p_h, mask=m_h, other=0., eviction_policy="evict_first")                   # [BP, N]

    i_r = tl.load(req_slots + i_b).to(tl.int64)
    n_buf = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
    b_x, b_dt, b_a, b_k, b_c, b_dx = token_inputs(x, dt, A, Bm, C, D, i_b, i_h, i_g, o_p, o_n, NH, NG, P, N)
    g_last = tl.load(buf_gcum + (i_r * L + n_buf - 1) * NH + i_h, mask=n_buf > 0, other=0.)
    b_G = g_last + b_a
    b_xdt = b_dt * b_x

    fold = False
    if COMMIT:
        fold = n_buf + 1 >= flush_length
        if (i_h == 0) & (i_p == 0):
            tl.store(flushed + i_b, fold)
    if fold:
        # h0 + buffer + the token into the state, y from the folded state; the buffer as one block of BL entries
        # masked at buf_len, the state N slices of BN columns at a time, each re-read (the tile above is dead here)
        o_l = tl.arange(0, BL)
        m_l = o_l < n_buf
        b_vt = tl.load(buf_xdt + ((i_r * L + o_l[None, :]) * NH + i_h) * P + o_p[:, None], mask=m_l[None, :],
                       other=0.)                                                            # [BP, BL]
        b_gi = tl.load(buf_gcum + (i_r * L + o_l) * NH + i_h, mask=m_l, other=0.)
        b_vt *= tl.exp(tl.where(m_l, (g_last - b_gi) + b_a, float("-inf")))[None, :]     # e^{G - G_i} <= 1
        b_y = b_dx
        for n0 in range(0, N, BN):
            o_m = n0 + tl.arange(0, BN)
            p_hm = state_pool + ((i_s * NH + i_h) * P + o_p[:, None]) * N + o_m[None, :]
            b_hm = tl.load(p_hm, mask=m_h, other=0.)
            b_km = tl.load(Bm + (i_b * NG + i_g) * N + o_m).to(tl.float32)
            b_ki = tl.load(buf_b + ((i_r * L + o_l[:, None]) * NG + i_g) * N + o_m[None, :], mask=m_l[:, None],
                           other=0.)                                                        # [BL, BN]
            b_hm = tl.exp(b_G) * b_hm + b_xdt[:, None] * b_km[None, :]
            b_hm = add_product(b_hm, b_vt, b_ki, PRECISION)
            b_cm = tl.load(C + (i_b * NG + i_g) * N + o_m).to(tl.float32)
            b_y += tl.sum(b_hm * b_cm[None, :], 1)
            if i_s >= 0:                      # the caller's contract; never write outside the pool
                # every thread's read of the slice happens before any write to it
                tl.debug_barrier()
                tl.store(p_hm, b_hm)
        tl.store(y + (i_b * NH + i_h) * P + o_p, b_y)
    else:
        # the buffer's share: sum_i e^{G - G_i} (B_i . C) xdt_i, then the state's once its tile has arrived
        b_y = tl.sum(b_k * b_c) * b_xdt + b_dx
        for l0 in range(0, n_buf, BLOCK_L):
            o_l = l0 + tl.arange(0, BLOCK_L)
            m_l = o_l < n_buf
            b_ki = tl.load(buf_b + ((i_r * L + o_l[:, None]) * NG + i_g) * N + o_n[None, :], mask=m_l[:, None],
                           other=0.)
            b_v = tl.load(buf_xdt + ((i_r * L + o_l[:, None]) * NH + i_h) * P + o_p[None, :], mask=m_l[:, None],
                          other=0.)                                                         # [BLOCK_L, BP]
            b_gi = tl.load(buf_gcum + (i_r * L + o_l) * NH + i_h, mask=m_l, other=0.)
            b_w = tl.exp(tl.where(m_l, (g_last - b_gi) + b_a, float("-inf"))) * tl.sum(b_ki * b_c[None, :], 1)
            b_y += tl.sum(b_w[:, None] * b_v, 0)
        b_y += tl.exp(b_G) * tl.sum(b_h * b_c[None, :], 1)
        tl.store(y + (i_b * NH + i_h) * P + o_p, b_y)
        token_entry(buf_b, buf_xdt, buf_gcum, xdt_out, gcum_out, b_k, b_xdt, b_G, i_b, i_r, i_h, i_g, i_p, n_buf, o_p,
                    o_n, NH, NG, P, N, L, COMMIT)


def mamba2_decode_fwd(x, dt, A, Bm, C, D, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots,
                      flush_length: int | None, config: DecodeConfig | None = None):
    """Launcher of decode (flush_length None) and decode-commit: checks, allocation, grid. config: decode_config's
    unless given (the sweep's)."""
    NH, NG, P, N, L = check_pools(state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots)
    B = req_slots.shape[0]
    check_tokens((B,), NH, NG, P, N, x=x, dt=dt, A=A, Bm=Bm, C=C, D=D)
    commit = flush_length is not None
    device = x.device
    y = torch.empty(B, NH, P, dtype=torch.float32, device=device)
    if commit:
        check_flush_length(flush_length, L)
        flushed = torch.empty(B, dtype=torch.bool, device=device)
        xdt = gcum = y                                                      # stand-ins, not written
    else:
        xdt = torch.empty(B, NH, P, dtype=torch.float32, device=device)
        gcum = torch.empty(B, NH, dtype=torch.float32, device=device)
        flushed, flush_length = y, 1                                        # stand-ins
    if B > 0:
        cfg = config or decode_config(B, P)
        BP = min(P, cfg.block_p)
        BL = max(16, triton.next_power_of_2(L))
        mamba2_decode_kernel[(P // BP, NH, B)](
            x, dt, A, Bm, C, D, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots,
            y, xdt, gcum, flushed, flush_length,
            NH=NH, NG=NG, P=P, N=N, L=L, BP=BP, BLOCK_L=max(16, cfg.block_l), BL=BL,
            BN=min(N, cfg.block_n), COMMIT=commit, PRECISION=cfg.fold_precision or FOLD_PRECISION,
            num_warps=cfg.num_warps,
        )
    return (y, flushed) if commit else (y, xdt, gcum)


def mamba2_decode(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    Bm: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_b: torch.Tensor,
    buf_xdt: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One new token per row on top of its committed h0 + buffer; writes nothing (as mamba2_decode_ref).

    x: [B, NH, P]; dt: [B, NH] (softplus'ed); A: [NH]; Bm, C: [B, NG, N]; D: [NH] (fp32 / bf16 / fp16);
    state_pool: [S, NH, P, N]; state_slots: [B] (-1: no state, not read); buf_b: [R, L, NG, N];
    buf_xdt: [R, L, NH, P]; buf_gcum: [R, L, NH]; buf_len: [R]; req_slots: [B]; pools fp32, all contiguous.
    Returns y [B, NH, P], the token's buffer entry xdt [B, NH, P] and gcum [B, NH], float32.
    """
    return mamba2_decode_fwd(x, dt, A, Bm, C, D, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len,
                             req_slots, None)


def mamba2_decode_commit(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    Bm: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_b: torch.Tensor,
    buf_xdt: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
    flush_length: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain decoding: mamba2_decode then mamba2_commit of that one token, fused, in place.

    Shapes as in mamba2_decode; flush_length: 1 <= flush_length <= L. A row with buf_len + 1 >= flush_length folds
    h0 + buffer + the new entry into state_pool[state_slots[b]] (which must be >= 0: the caller allocates a zeroed
    slot first); the others append the entry at buf_len and write no state. buf_len is not modified (the caller sets
    it to 0 if flushed else buf_len + 1). Returns y [B, NH, P] float32 and flushed [B] bool.
    """
    return mamba2_decode_fwd(x, dt, A, Bm, C, D, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len,
                             req_slots, flush_length)
