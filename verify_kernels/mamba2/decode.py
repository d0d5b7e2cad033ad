"""Triton kernels for Mamba2 KVBuffer decoding: one new token per row on top of its committed state h0 + buffer,
with the same signatures and semantics as mamba2_decode_ref, and plain decoding fused with the commit of that token
(mamba2_decode_ref then mamba2_commit_ref of the one-node path, in one kernel).

Grid (row b, head h, P block). The program of (b, h, p) reads its state tile h0[p-block, :] exactly once, and not
at all for rows that have no state (state_slots == -1: short context, h0 = 0), then streams the row's buffer
BLOCK_L entries at a time (only the buf_len valid ones):

    y = e^{G} h0 C + sum_{i < buf_len} e^{G - G_i} (B_i . C) xdt_i + (B . C) xdt + D x,   G = G_last + dt A

Plain decode writes only y and the token's entry (xdt, G); it never writes a pool. The fused decode-commit writes
the entry into the buffer at buf_len (B once per group), or, when buf_len + 1 >= flush_length, folds h0 + buffer +
the new entry into the state from the tile it already holds: the state is written on the flush step only, once
per L tokens. Buffer decays e^{G - G_i} = e^{(G_last - G_i) + dt A} are <= 1 and computed from the small
differences; masked entries get -inf before the exp.
"""

import torch
import triton
import triton.language as tl

from verify_kernels.mamba2.commit import check_flush_length, check_pools, check_tokens

# tunables: the P block of a program, buffer entries per step (>= 16: the fold's tl.dot), warps
BLOCK_P_MAX = 32
BLOCK_L = 16
NUM_WARPS = 4


@triton.jit
def mamba2_decode_kernel(
    x, dt, A, Bm, C, D, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots,
    y, xdt_out, gcum_out, flushed, flush_length,
    NH: tl.constexpr, NG: tl.constexpr, P: tl.constexpr, N: tl.constexpr, L: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_L: tl.constexpr, COMMIT: tl.constexpr,
):
    i_b, i_h, i_p = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    i_g = i_h // (NH // NG)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    n_buf = tl.load(buf_len + i_r).to(tl.int32)
    o_p = i_p * BLOCK_P + tl.arange(0, BLOCK_P)
    o_n = tl.arange(0, N)

    b_x = tl.load(x + (i_b * NH + i_h) * P + o_p).to(tl.float32)
    b_dt = tl.load(dt + i_b * NH + i_h).to(tl.float32)
    b_a = b_dt * tl.load(A + i_h).to(tl.float32)                         # the token's log decay
    b_k = tl.load(Bm + (i_b * NG + i_g) * N + o_n).to(tl.float32)
    b_c = tl.load(C + (i_b * NG + i_g) * N + o_n).to(tl.float32)
    g_last = tl.load(buf_gcum + (i_r * L + n_buf - 1) * NH + i_h, mask=n_buf > 0, other=0.0)
    b_g = g_last + b_a
    b_xdt = b_dt * b_x
    # the token itself and the skip connection
    b_y = tl.sum(b_k * b_c) * b_xdt + tl.load(D + i_h).to(tl.float32) * b_x

    fold = False
    if COMMIT:
        fold = n_buf + 1 >= flush_length
    # the committed state, read once and only where the row has one
    p_h = state_pool + ((i_s * NH + i_h) * P + o_p[:, None]) * N + o_n[None, :]
    b_h = tl.zeros([BLOCK_P, N], dtype=tl.float32)
    if i_s >= 0:
        b_h = tl.load(p_h)
    b_y += tl.exp(b_g) * tl.sum(b_h * b_c[None, :], 1)
    if COMMIT:
        b_h = tl.exp(b_g) * b_h + b_xdt[:, None] * b_k[None, :]            # the fold's h0 and new-entry terms

    # the buffer: the same decay e^{G - G_i} weighs the output term and the fold term of entry i
    for l0 in range(0, n_buf, BLOCK_L):
        o_l = l0 + tl.arange(0, BLOCK_L)
        m_l = o_l < n_buf
        b_ki = tl.load(buf_b + ((i_r * L + o_l[:, None]) * NG + i_g) * N + o_n[None, :], mask=m_l[:, None], other=0.0)
        b_vi = tl.load(buf_xdt + ((i_r * L + o_l[:, None]) * NH + i_h) * P + o_p[None, :], mask=m_l[:, None],
                       other=0.0)
        b_gi = tl.load(buf_gcum + (i_r * L + o_l) * NH + i_h, mask=m_l, other=0.0)
        b_decay = tl.exp(tl.where(m_l, (g_last - b_gi) + b_a, float("-inf")))
        b_y += tl.sum((tl.sum(b_ki * b_c[None, :], 1) * b_decay)[:, None] * b_vi, 0)
        if COMMIT:
            if fold:
                b_h += tl.dot(tl.trans(b_vi * b_decay[:, None]), b_ki, input_precision="ieee")
    tl.store(y + (i_b * NH + i_h) * P + o_p, b_y)

    if COMMIT:
        if (i_h == 0) & (i_p == 0):
            tl.store(flushed + i_b, fold)
        if fold:
            if i_s >= 0:                          # the caller's contract; never write outside the pool
                # every thread's read of the tile happens before any write to it
                tl.debug_barrier()
                tl.store(p_h, b_h)
        else:
            pos = i_r * L + n_buf
            tl.store(buf_xdt + (pos * NH + i_h) * P + o_p, b_xdt)
            if i_p == 0:
                tl.store(buf_gcum + pos * NH + i_h, b_g)
                if i_h % (NH // NG) == 0:                  # B once per group
                    tl.store(buf_b + (pos * NG + i_g) * N + o_n, b_k)
    else:
        tl.store(xdt_out + (i_b * NH + i_h) * P + o_p, b_xdt)
        if i_p == 0:
            tl.store(gcum_out + i_b * NH + i_h, b_g)


def mamba2_decode_fwd(x, dt, A, Bm, C, D, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots,
                      flush_length: int | None):
    """Launcher of decode (flush_length None) and decode-commit: checks, allocation, grid."""
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
        BLOCK_P = min(P, BLOCK_P_MAX)
        mamba2_decode_kernel[(B, NH, P // BLOCK_P)](
            x, dt, A, Bm, C, D, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots,
            y, xdt, gcum, flushed, flush_length,
            NH=NH, NG=NG, P=P, N=N, L=L, BLOCK_P=BLOCK_P, BLOCK_L=BLOCK_L, COMMIT=commit, num_warps=NUM_WARPS,
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
    slot first); the others append the entry at buf_len. buf_len is not modified (the caller sets it to 0 if
    flushed else buf_len + 1). Returns y [B, NH, P] float32 and flushed [B] bool.
    """
    return mamba2_decode_fwd(x, dt, A, Bm, C, D, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len,
                             req_slots, flush_length)
