"""Triton kernels for the Mamba2 KVBuffer commit and flush, with the same signatures and semantics as
mamba2_commit_ref / mamba2_flush_ref (verify_kernels.mamba2.naive gives the math, the pool layout and the contract).

Grid (row b, head h, P block): the program of (b, h, p) owns the state tile h0[p-block, :] of row b and head h, so a
fold is exactly one read and one write of every state tile, with the buffer's and the accepted entries streamed
through registers BLOCK_E at a time (fp32, tl.dot in IEEE fp32). Rows that do not fold never touch their state:
a second, light kernel (one program per row and head) appends their accepted entries at buf_len (B once per group,
by the group's first head).
A flush is a commit with nothing accepted and flush_length = 1: every row with buffered entries folds.

The launchers check static shapes only and never synchronise with the device (CUDA-graph safe), so the caller's
part of the contract is not checked here: a row that folds must have a state slot >= 0 (the kernel skips the fold
of a row without one rather than write outside the pool) and flush_length <= L.
Also the pool checks shared by decode.py and verify.py live here.
"""

import torch
import triton
import triton.language as tl

from verify_kernels.registers import register_cap

# tunables: the P block of a program and the number of entries folded per tl.dot (>= 16)
BLOCK_P_MAX = 32
BLOCK_E = 16
NUM_WARPS = 4
APPEND_WARPS = 2  # the append kernel moves a [BLOCK_E, P] tile of entries per program
# MAX_REGISTERS: a cap on the commit kernel's registers a thread (verify_kernels/registers.py), or None. Its grid is a
# program per (row, head, P block), most of which exit (the rows that do not fold), and the folding programs'
# registers set how many an SM holds: sm_90 with Triton 3.6 (python -m benchmarks.mamba2_registers on the CPU,
# Nemotron-3-Nano heads) 122 on 4 warps, 4 an SM; given a cap of 96 (or 128) ptxas builds it in 95 with no spill, 5
# an SM. A sweep candidate (benchmarks/sweep_mamba2.py --ops commit) until the H200 times it.
MAX_REGISTERS = None
# a folding program's loads all issued first (as the GDN's fold.LOOPED_LOADS_FIRST) lost to these loops on the
# H200 (docs/design.md section 6)

HEAD_DIMS = (16, 32, 64, 128)           # P and N: powers of two (tl.dot needs >= 16; registers cap at 128)
FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def fold_entries(b_h, p_key, p_value, p_gcum, m_entry, g_end):
    """b_h [BLOCK_P, N] + sum_e e^{g_end - G_e} xdt_e B_e^T over the entries e where m_entry [BLOCK_E] holds.

    p_key [BLOCK_E, N] (B), p_value [BLOCK_P, BLOCK_E] (xdt, transposed for the dot), p_gcum [BLOCK_E] (G) pointers.
    Masked entries load as 0 and get decay 0 from -inf, so stale or NaN pool entries never reach the state."""
    b_k = tl.load(p_key, mask=m_entry[:, None], other=0.0).to(tl.float32)
    b_vt = tl.load(p_value, mask=m_entry[None, :], other=0.0).to(tl.float32)
    b_g = tl.load(p_gcum, mask=m_entry, other=0.0).to(tl.float32)
    b_decay = tl.exp(tl.where(m_entry, g_end - b_g, float("-inf")))     # e^{G_end - G_e} <= 1
    return b_h + tl.dot(b_vt * b_decay[None, :], b_k, input_precision="ieee")


@triton.jit
def mamba2_commit_kernel(
    bm, xdt, gcum, accepted, num_accepted, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots,
    flushed, flush_length, T, A,
    NH: tl.constexpr, NG: tl.constexpr, P: tl.constexpr, N: tl.constexpr, L: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr, HAS_ACCEPTED: tl.constexpr,
):
    i_b, i_h, i_p = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    i_g = i_h // (NH // NG)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    n_buf = tl.load(buf_len + i_r).to(tl.int32)
    n_acc = 0
    if HAS_ACCEPTED:
        n_acc = tl.load(num_accepted + i_b).to(tl.int32)
    fold = n_buf + n_acc >= flush_length
    if HAS_ACCEPTED:
        if (i_h == 0) & (i_p == 0):
            tl.store(flushed + i_b, fold)

    o_p = i_p * BLOCK_P + tl.arange(0, BLOCK_P)
    o_n = tl.arange(0, N)
    o_e = tl.arange(0, BLOCK_E)
    if fold:
        if i_s >= 0:
            p_h = state_pool + ((i_s * NH + i_h) * P + o_p[:, None]) * N + o_n[None, :]
            # G of the last folded entry: the last accepted one, else the buffer's last
            g_end = tl.load(buf_gcum + (i_r * L + n_buf - 1) * NH + i_h, mask=n_buf > 0, other=0.0)
            if HAS_ACCEPTED:
                if n_acc > 0:
                    last = tl.load(accepted + i_b * A + n_acc - 1)
                    g_end = tl.load(gcum + (i_b * T + last) * NH + i_h).to(tl.float32)
            b_h = tl.exp(g_end) * tl.load(p_h)
            for e0 in range(0, n_buf, BLOCK_E):
                o_l = e0 + o_e
                m_l = o_l < n_buf
                b_h = fold_entries(
                    b_h,
                    buf_b + ((i_r * L + o_l[:, None]) * NG + i_g) * N + o_n[None, :],
                    buf_xdt + ((i_r * L + o_l[None, :]) * NH + i_h) * P + o_p[:, None],
                    buf_gcum + (i_r * L + o_l) * NH + i_h,
                    m_l, g_end,
                )
            for e0 in range(0, n_acc, BLOCK_E):
                o_a = e0 + o_e
                m_a = o_a < n_acc
                node = tl.load(accepted + i_b * A + o_a, mask=m_a, other=0).to(tl.int64)
                b_h = fold_entries(
                    b_h,
                    bm + ((i_b * T + node[:, None]) * NG + i_g) * N + o_n[None, :],
                    xdt + ((i_b * T + node[None, :]) * NH + i_h) * P + o_p[:, None],
                    gcum + (i_b * T + node) * NH + i_h,
                    m_a, g_end,
                )
            # every thread's read of the tile happens before any write to it
            tl.debug_barrier()
            tl.store(p_h, b_h)


@triton.jit
def mamba2_append_kernel(
    bm, xdt, gcum, accepted, num_accepted, buf_b, buf_xdt, buf_gcum, buf_len, req_slots, flush_length, T, A,
    NH: tl.constexpr, NG: tl.constexpr, P: tl.constexpr, N: tl.constexpr, L: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """The rows that do not fold: the accepted entries go to buf_len .. buf_len + n_acc - 1 (B by the group's first
    head). One light program per (row, head), apart from the fold kernel's, whose programs are sized for a state
    tile: with the append inside them a commit step that folds nothing cost almost as much as one that folds."""
    i_b, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i_g = i_h // (NH // NG)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    n_buf = tl.load(buf_len + i_r).to(tl.int32)
    n_acc = tl.load(num_accepted + i_b).to(tl.int32)
    if n_buf + n_acc < flush_length:
        o_p = tl.arange(0, P)
        o_n = tl.arange(0, N)
        o_e = tl.arange(0, BLOCK_E)
        for e0 in range(0, n_acc, BLOCK_E):
            o_a = e0 + o_e
            m_a = o_a < n_acc
            node = tl.load(accepted + i_b * A + o_a, mask=m_a, other=0).to(tl.int64)
            pos = i_r * L + n_buf + o_a
            b_v = tl.load(xdt + ((i_b * T + node[:, None]) * NH + i_h) * P + o_p[None, :], mask=m_a[:, None])
            tl.store(buf_xdt + (pos[:, None] * NH + i_h) * P + o_p[None, :], b_v.to(tl.float32), mask=m_a[:, None])
            b_g = tl.load(gcum + (i_b * T + node) * NH + i_h, mask=m_a)
            tl.store(buf_gcum + pos * NH + i_h, b_g.to(tl.float32), mask=m_a)
            if i_h % (NH // NG) == 0:
                b_k = tl.load(bm + ((i_b * T + node[:, None]) * NG + i_g) * N + o_n[None, :], mask=m_a[:, None])
                tl.store(buf_b + (pos[:, None] * NG + i_g) * N + o_n[None, :], b_k.to(tl.float32),
                         mask=m_a[:, None])


def check_pools(state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots) -> tuple[int, ...]:
    """Shapes, dtypes and contiguity of the KVBuffer pools (verify_kernels.mamba2.naive); returns NH, NG, P, N, L."""
    if state_pool.dim() != 4 or buf_b.dim() != 4:
        raise ValueError(f"expected state_pool [S, NH, P, N] and buf_b [R, L, NG, N], got {tuple(state_pool.shape)} "
                         f"and {tuple(buf_b.shape)}")
    _, NH, P, N = state_pool.shape
    R, L, NG, _ = buf_b.shape
    B = req_slots.shape[0]
    expected = {"buf_b": (R, L, NG, N), "buf_xdt": (R, L, NH, P), "buf_gcum": (R, L, NH), "buf_len": (R,),
                "state_slots": (B,), "req_slots": (B,)}
    given = {"buf_b": buf_b, "buf_xdt": buf_xdt, "buf_gcum": buf_gcum, "buf_len": buf_len,
             "state_slots": state_slots, "req_slots": req_slots}
    for name, shape in expected.items():
        if tuple(given[name].shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(given[name].shape)}")
    check_head_dims(P, N)
    if NH % NG:
        raise ValueError(f"the heads ({NH}) must be a multiple of the groups ({NG})")
    for name, t in (("state_pool", state_pool), ("buf_b", buf_b), ("buf_xdt", buf_xdt), ("buf_gcum", buf_gcum)):
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {t.dtype}")
    check_indices(state_slots=state_slots, buf_len=buf_len, req_slots=req_slots)
    check_contiguous(state_pool=state_pool, buf_b=buf_b, buf_xdt=buf_xdt, buf_gcum=buf_gcum)
    return NH, NG, P, N, L


def check_tokens(lead: tuple[int, ...], NH: int, NG: int, P: int, N: int, **tensors) -> None:
    """Token inputs x [*lead, NH, P], dt [*lead, NH], A [NH], Bm and C [*lead, NG, N], D [NH]: shapes, float dtypes
    (cast to fp32 in the kernels) and contiguity."""
    expected = {"x": (*lead, NH, P), "dt": (*lead, NH), "A": (NH,), "Bm": (*lead, NG, N), "C": (*lead, NG, N),
                "D": (NH,), "bm": (*lead, NG, N), "xdt": (*lead, NH, P), "gcum": (*lead, NH)}
    for name, t in tensors.items():
        if tuple(t.shape) != expected[name]:
            raise ValueError(f"{name} must have shape {expected[name]}, got {tuple(t.shape)}")
        if t.dtype not in FLOAT_INPUTS:
            raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    check_contiguous(**tensors)


def check_head_dims(P: int, N: int) -> None:
    if P not in HEAD_DIMS or N not in HEAD_DIMS:
        raise ValueError(f"head dim P and state size N must be in {HEAD_DIMS}, got P={P}, N={N}")


def check_indices(**tensors) -> None:
    for name, t in tensors.items():
        if t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    check_contiguous(**tensors)


def check_contiguous(**tensors) -> None:
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (call .contiguous())")


def check_flush_length(flush_length: int, L: int) -> None:
    if not 1 <= flush_length <= L:
        raise ValueError(f"flush_length must be in [1, {L}] (the buffer capacity), got {flush_length}")


def mamba2_commit_fwd(bm, xdt, gcum, accepted, num_accepted, state_pool, state_slots, buf_b, buf_xdt, buf_gcum,
                      buf_len, req_slots, flush_length: int) -> torch.Tensor | None:
    """Launcher of commit (accepted given) and flush (accepted None): checks, allocation, grid."""
    NH, NG, P, N, L = check_pools(state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots)
    check_flush_length(flush_length, L)
    B = req_slots.shape[0]
    has_accepted = accepted is not None
    if has_accepted:
        if accepted.dim() != 2 or accepted.shape[0] != B or num_accepted.shape != (B,):
            raise ValueError(f"expected accepted [B, A] and num_accepted [B] with B = {B}, got "
                             f"{tuple(accepted.shape)} and {tuple(num_accepted.shape)}")
        T = xdt.shape[1] if xdt.dim() == 4 else -1
        check_tokens((B, T), NH, NG, P, N, bm=bm, xdt=xdt, gcum=gcum)
        check_indices(accepted=accepted, num_accepted=num_accepted)
        flushed = torch.empty(B, dtype=torch.bool, device=state_pool.device)
    else:
        # a flush: nothing accepted; the unused pointer arguments are stand-ins
        bm, xdt, gcum, accepted, num_accepted, flushed = buf_b, buf_xdt, buf_gcum, buf_len, buf_len, buf_len
        T, flush_length = 1, 1
    if B == 0:
        return flushed if has_accepted else None
    BLOCK_P = min(P, BLOCK_P_MAX)
    mamba2_commit_kernel[(B, NH, P // BLOCK_P)](
        bm, xdt, gcum, accepted, num_accepted, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots,
        flushed, flush_length, T, accepted.shape[-1],
        NH=NH, NG=NG, P=P, N=N, L=L, BLOCK_P=BLOCK_P, BLOCK_E=BLOCK_E, HAS_ACCEPTED=has_accepted,
        num_warps=NUM_WARPS, **register_cap(MAX_REGISTERS),
    )
    if has_accepted:
        mamba2_append_kernel[(B, NH)](
            bm, xdt, gcum, accepted, num_accepted, buf_b, buf_xdt, buf_gcum, buf_len, req_slots, flush_length, T,
            accepted.shape[-1], NH=NH, NG=NG, P=P, N=N, L=L, BLOCK_E=BLOCK_E, num_warps=APPEND_WARPS,
        )
    return flushed if has_accepted else None


def mamba2_commit(
    bm: torch.Tensor,
    xdt: torch.Tensor,
    gcum: torch.Tensor,
    accepted: torch.Tensor,
    num_accepted: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_b: torch.Tensor,
    buf_xdt: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
    flush_length: int,
) -> torch.Tensor:
    """Commit the accepted root path of each row, in place: append its entries to the buffer, or fold the buffer's
    then the accepted entries into the state (as mamba2_commit_ref).

    bm: [B, T, NG, N] (verify input); xdt: [B, T, NH, P] and gcum: [B, T, NH] (verify outputs); accepted: [B, A]
    node indices, root first, -1 padded; num_accepted: [B] (may be 0); state_pool: [S, NH, P, N]; state_slots: [B]
    (>= 0 for rows that fold); buf_b: [R, L, NG, N]; buf_xdt: [R, L, NH, P]; buf_gcum: [R, L, NH]; buf_len: [R];
    req_slots: [B]; flush_length: 1 <= flush_length <= L. A row folds when buf_len + num_accepted >= flush_length.
    buf_len is not modified. Returns flushed [B] bool.
    """
    return mamba2_commit_fwd(bm, xdt, gcum, accepted, num_accepted, state_pool, state_slots, buf_b, buf_xdt,
                             buf_gcum, buf_len, req_slots, flush_length)


def mamba2_flush(
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_b: torch.Tensor,
    buf_xdt: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
) -> None:
    """Fold each row's buffer into its state, in place (as mamba2_flush_ref): rows with buf_len > 0, whose state slot
    must be >= 0. Pools as in mamba2_commit. buf_len is not modified (the caller resets it)."""
    mamba2_commit_fwd(None, None, None, None, None, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len,
                      req_slots, 1)
