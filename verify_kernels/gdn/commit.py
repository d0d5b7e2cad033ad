"""Triton kernel for the Gated DeltaNet KVBuffer commit and flush: each row appends its accepted path's entries to
its buffer, or folds the buffer then the accepted entries into its state. Semantics, shapes and pool layout:
verify_kernels.gdn.naive (gdn_commit_ref, gdn_flush_ref, the oracle); the math: docs/design.md section 2.

Two kernels, each of which skips the other's rows. The append kernel, one program per (row, value head): a row with
buf_len + num_accepted < flush_length gathers the accepted nodes' entries (u [V], G; the key [K] once per key head)
into buffer positions buf_len .. buf_len + a - 1 and touches no state. The fold kernel, one program per (row, value
head, V block): a row that flushes reads its [K, BV] tile of S0 once and writes it once:
    S <- e^{G_last} S0 + sum_i e^{G_last - G_i} k_i u_i^T    (buffer entries, then the accepted ones)
with G_last the G of the last folded entry, the sums as tl.dot over blocks of BLOCK_L entries. A flush is the commit of
nothing with flush_length 1: rows with entries fold, empty rows do nothing.
"""

import torch
import triton
import triton.language as tl

from verify_kernels.gdn.decode import (
    INDEX_DTYPES,
    INPUT_DTYPES,
    check_heads,
    check_pools,
    check_shape,
    check_tensors,
    fold_buffer,
)

# Launch parameters (tune on the GPU), as in decode: BLOCK_V V columns per program, entries BLOCK_L (>= 16, the
# minimum tl.dot size) at a time; the fold holds the [K, BV] state tile plus one [BLOCK_L, K] key tile.
BLOCK_V = 32
BLOCK_L = 16
NUM_WARPS = 4
APPEND_WARPS = 2  # the append kernel moves a [BLOCK_L, V] tile of entries per program


@triton.jit
def gdn_commit_kernel(
    k,             # [B, T, H, K] (HAS_ACCEPTED)
    u,             # [B, T, HV, V] (HAS_ACCEPTED)
    gcum,          # [B, T, HV] (HAS_ACCEPTED)
    accepted,      # [B, A] node indices, root first (HAS_ACCEPTED)
    num_accepted,  # [B] (HAS_ACCEPTED)
    state_pool,    # [S, HV, K, V] fp32
    state_slots,   # [B]
    buf_k,         # [R, L, H, K] fp32
    buf_u,         # [R, L, HV, V] fp32
    buf_gcum,      # [R, L, HV] fp32
    buf_len,       # [R]
    req_slots,     # [B]
    flush_length,
    T,             # T and A not constexpr: they change every step
    A,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BC: tl.constexpr,
    BV: tl.constexpr,
    HAS_ACCEPTED: tl.constexpr,
):
    i_b, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hk = i_h // (HV // H)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    n = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    na = 0
    if HAS_ACCEPTED:
        na = tl.minimum(tl.load(num_accepted + i_b).to(tl.int32), A)

    if n + na >= flush_length:
        # fold; a row that flushes must have a state slot (the caller allocates a zeroed one), else no write
        if i_s >= 0:
            # G_last: of the last accepted entry, else of the last buffered one
            b_G = tl.load(buf_gcum + (i_r * L + tl.maximum(n - 1, 0)) * HV + i_h)
            b_G = tl.where(n > 0, b_G, 0.)
            if HAS_ACCEPTED:
                i_last = tl.maximum(tl.load(accepted + i_b * A + tl.maximum(na - 1, 0)), 0).to(tl.int64)
                b_G = tl.where(na > 0, tl.load(gcum + (i_b * T + i_last) * HV + i_h).to(tl.float32), b_G)
            p_s = state_pool + ((i_s * HV + i_h) * K + o_k[:, None]) * V + o_v[None, :]
            b_s = tl.exp(b_G) * tl.load(p_s)
            b_s = fold_buffer(b_s, buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, o_k, o_v, H, HV, K, V, L, BC)
            if HAS_ACCEPTED:
                for i_c in range(0, na, BC):
                    o_c = i_c + tl.arange(0, BC)
                    m_c = o_c < na
                    b_node = tl.load(accepted + i_b * A + o_c, mask=m_c, other=0).to(tl.int64)
                    b_ag = tl.load(gcum + (i_b * T + b_node) * HV + i_h, mask=m_c, other=0.).to(tl.float32)
                    p_ak = k + ((i_b * T + b_node[:, None]) * H + i_hk) * K + o_k[None, :]
                    b_ak = tl.load(p_ak, mask=m_c[:, None], other=0.).to(tl.float32)        # [BC, K]
                    p_au = u + ((i_b * T + b_node[:, None]) * HV + i_h) * V + o_v[None, :]
                    b_au = tl.load(p_au, mask=m_c[:, None], other=0.).to(tl.float32)        # [BC, BV]
                    b_decay = tl.exp(tl.where(m_c, b_G - b_ag, float("-inf")))
                    b_s += tl.dot(tl.trans(b_ak), b_decay[:, None] * b_au, input_precision="ieee")
            tl.store(p_s, b_s)


@triton.jit
def gdn_append_kernel(
    k,             # [B, T, H, K]
    u,             # [B, T, HV, V]
    gcum,          # [B, T, HV]
    accepted,      # [B, A] node indices, root first
    num_accepted,  # [B]
    buf_k,         # [R, L, H, K] fp32
    buf_u,         # [R, L, HV, V] fp32
    buf_gcum,      # [R, L, HV] fp32
    buf_len,       # [R]
    req_slots,     # [B]
    flush_length,
    T,
    A,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BC: tl.constexpr,
):
    """The rows that do not fold: their accepted entries go to buffer positions buf_len .. buf_len + a - 1 (the
    key once per key head, by its first value head). A light program per (row, value head), apart from the fold
    kernel's: sized for a [K, BV] state tile, that one made a commit step with no fold cost as much as a fold."""
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    i_hk = i_h // (HV // H)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    n = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
    na = tl.minimum(tl.load(num_accepted + i_b).to(tl.int32), A)
    if n + na < flush_length:
        o_k = tl.arange(0, K)
        o_v = tl.arange(0, V)
        for i_c in range(0, na, BC):
            o_c = i_c + tl.arange(0, BC)
            m_c = o_c < na
            b_node = tl.load(accepted + i_b * A + o_c, mask=m_c, other=0).to(tl.int64)
            o_pos = i_r * L + n + o_c
            p_au = u + ((i_b * T + b_node[:, None]) * HV + i_h) * V + o_v[None, :]
            b_au = tl.load(p_au, mask=m_c[:, None], other=0.).to(tl.float32)
            tl.store(buf_u + (o_pos[:, None] * HV + i_h) * V + o_v[None, :], b_au, mask=m_c[:, None])
            b_ag = tl.load(gcum + (i_b * T + b_node) * HV + i_h, mask=m_c, other=0.).to(tl.float32)
            tl.store(buf_gcum + o_pos * HV + i_h, b_ag, mask=m_c)
            if i_h % (HV // H) == 0:
                p_ak = k + ((i_b * T + b_node[:, None]) * H + i_hk) * K + o_k[None, :]
                b_ak = tl.load(p_ak, mask=m_c[:, None], other=0.).to(tl.float32)
                tl.store(buf_k + (o_pos[:, None] * H + i_hk) * K + o_k[None, :], b_ak, mask=m_c[:, None])


def gdn_commit_fwd(k, u, gcum, accepted, num_accepted, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len,
                   req_slots, flush_length: int, *, T: int, A: int, H: int, HV: int, K: int, V: int, L: int,
                   has_accepted: bool = True) -> None:
    """Launch the commit (or with has_accepted False the flush) on checked inputs."""
    B = req_slots.shape[0]
    BV = min(V, BLOCK_V)
    gdn_commit_kernel[(B, HV, V // BV)](
        k, u, gcum, accepted, num_accepted, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots,
        flush_length,
        T=T, A=A, H=H, HV=HV, K=K, V=V, L=L, BC=BLOCK_L, BV=BV, HAS_ACCEPTED=has_accepted, num_warps=NUM_WARPS,
    )
    if has_accepted:
        gdn_append_kernel[(B, HV)](
            k, u, gcum, accepted, num_accepted, buf_k, buf_u, buf_gcum, buf_len, req_slots, flush_length,
            T=T, A=A, H=H, HV=HV, K=K, V=V, L=L, BC=BLOCK_L, num_warps=APPEND_WARPS,
        )


def gdn_commit(
    k: torch.Tensor,
    u: torch.Tensor,
    gcum: torch.Tensor,
    accepted: torch.Tensor,
    num_accepted: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_k: torch.Tensor,
    buf_u: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
    flush_length: int,
) -> torch.Tensor:
    """Commit the accepted root path of each row: append its entries to the buffer, or fold into the state
    (gdn_commit_ref), in place.

    k: [B, T, H, K] (verify input, fp32, bf16 or fp16); u: [B, T, HV, V] and gcum: [B, T, HV] (verify outputs);
    accepted: [B, A] node indices, root first, -1 padded, and num_accepted: [B] (may be 0), int32 / int64; pools
    as in gdn_decode; 1 <= flush_length <= L. With n = buf_len[r] + num_accepted[b]: if n < flush_length the
    entries go to buffer positions buf_len[r] .. n - 1, otherwise the buffer's entries then the accepted ones are
    folded into state_pool[state_slots[b]], whose slot must be >= 0 (the caller allocates a zeroed one first;
    unlike the reference this is not checked, which would synchronise with the device; a row without one writes
    nothing). buf_len is not modified. Returns flushed [B] bool.
    """
    B, T = k.shape[:2]
    H, HV, K, V = check_heads(k, k, u)
    if accepted.dim() != 2 or accepted.shape[0] != B:
        raise ValueError(f"accepted must have shape [{B}, A], got {tuple(accepted.shape)}")
    A = accepted.shape[1]
    check_shape("u", u, (B, T, HV, V))
    check_shape("gcum", gcum, (B, T, HV))
    check_shape("num_accepted", num_accepted, (B,))
    check_tensors(INPUT_DTYPES, k=k, u=u, gcum=gcum)
    check_tensors(INDEX_DTYPES, accepted=accepted, num_accepted=num_accepted)
    L = check_pools(B, H, HV, K, V, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots)
    if not 1 <= flush_length <= L:
        raise ValueError(f"flush_length must be in [1, {L}] (the buffer capacity), got {flush_length}")
    gdn_commit_fwd(k, u, gcum, accepted, num_accepted, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len,
                   req_slots, flush_length, T=T, A=A, H=H, HV=HV, K=K, V=V, L=L)
    return buf_len[req_slots] + num_accepted >= flush_length


def gdn_flush(
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_k: torch.Tensor,
    buf_u: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
) -> None:
    """Fold each row's buffer into its state, in place (gdn_flush_ref): rows with buf_len > 0, whose state slot
    must be >= 0 (not checked, see gdn_commit). Pools as in gdn_decode. buf_len is not modified."""
    B = req_slots.shape[0]
    _, HV, K, V = state_pool.shape
    H = buf_k.shape[2]
    check_heads(buf_k, buf_k, buf_u)
    L = check_pools(B, H, HV, K, V, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots)
    # the accepted-entry pointers are unused (HAS_ACCEPTED False): the pools stand in for them
    gdn_commit_fwd(buf_k, buf_u, buf_gcum, buf_len, buf_len, state_pool, state_slots, buf_k, buf_u, buf_gcum,
                   buf_len, req_slots, 1, T=1, A=1, H=H, HV=HV, K=K, V=V, L=L, has_accepted=False)
