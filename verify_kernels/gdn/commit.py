"""Triton kernels for the Gated DeltaNet KVBuffer commit and flush: each row appends its accepted path's entries to
its buffer, or folds the buffer then the accepted entries into its state. Semantics, shapes and pool layout:
verify_kernels.gdn.naive (gdn_commit_ref, gdn_flush_ref, the oracle); the math: docs/design.md section 2.

The fold is verify_kernels.gdn.fold's kernel, whose grid does not grow with the batch: the rows that do not fold cost
it a read of their flags only. Those rows append in a light kernel of their own, one program per (row, key head):
the accepted nodes' u and G of the key head's value heads and its key, into buffer positions buf_len .. buf_len + a
- 1. Up to ONE_LAUNCH_MAX_BATCH rows the fold kernel appends too (one lane per row), so a small commit is one launch.
A flush is the fold with no new entries and flush_length 1: rows with entries fold, empty rows do nothing.
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
)
from verify_kernels.gdn.fold import BLOCK_L, ENTRIES_ACCEPTED, ENTRIES_NONE, gdn_fold_fwd
from verify_kernels.gdn.fold_rows import append_head

# The append kernel moves [BLOCK_L, V] tiles of entries. The H200 sweep of 2026-12-02: 4 warps over 2; one launch
# faster than two at batches 1 and 4, not at 16.
APPEND_WARPS = 4
ONE_LAUNCH_MAX_BATCH = 4


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
    T,             # T and A not constexpr: they change every step
    A,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BC: tl.constexpr,
):
    """The rows that do not fold: their accepted entries go to buffer positions buf_len .. buf_len + a - 1."""
    i_hk, i_b = tl.program_id(0), tl.program_id(1)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    n = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
    na = tl.minimum(tl.load(num_accepted + i_b).to(tl.int32), A)
    if n + na < flush_length:
        for i_g in tl.static_range(HV // H):
            append_head(k, u, gcum, accepted, buf_k, buf_u, buf_gcum, i_b, i_r, i_hk * (HV // H) + i_g, i_hk, n, na,
                        T, A, H, HV, K, V, L, BC)


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
    *,
    flushed: bool = True,
) -> torch.Tensor | None:
    """Commit the accepted root path of each row: append its entries to the buffer, or fold into the state
    (gdn_commit_ref), in place.

    k: [B, T, H, K] (verify input, fp32, bf16 or fp16); u: [B, T, HV, V] and gcum: [B, T, HV] (verify outputs);
    accepted: [B, A] node indices, root first, -1 padded, and num_accepted: [B] (may be 0), int32 / int64; pools
    as in gdn_decode; 1 <= flush_length <= L. With n = buf_len[r] + num_accepted[b]: if n < flush_length the
    entries go to buffer positions buf_len[r] .. n - 1, otherwise the buffer's entries then the accepted ones are
    folded into state_pool[state_slots[b]], whose slot must be >= 0 (the caller allocates a zeroed one first;
    unlike the reference this is not checked, which would synchronise with the device; a row without one writes
    nothing). buf_len is not modified. Returns flushed [B] bool (None with flushed=False: the engine's cache knows
    which rows fold on the host, and the three torch ops it takes ran per layer in every commit graph).
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
    shapes = dict(T=T, A=A, H=H, HV=HV, K=K, V=V, L=L)
    one_launch = B <= ONE_LAUNCH_MAX_BATCH
    if not one_launch and B > 0:
        gdn_append_kernel[(H, B)](
            k, u, gcum, accepted, num_accepted, buf_k, buf_u, buf_gcum, buf_len, req_slots, flush_length,
            **shapes, BC=BLOCK_L, num_warps=APPEND_WARPS, num_stages=1,
        )
    gdn_fold_fwd(k, u, gcum, accepted, num_accepted, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len,
                 req_slots, flush_length, entries=ENTRIES_ACCEPTED, append=one_launch, **shapes)
    return (buf_len[req_slots] + num_accepted >= flush_length) if flushed else None


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
    # no new entries: their pointers are unused, the pools stand in for them
    gdn_fold_fwd(buf_k, buf_u, buf_gcum, buf_len, buf_len, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len,
                 req_slots, 1, entries=ENTRIES_NONE, append=False, T=1, A=1, H=H, HV=HV, K=K, V=V, L=L)
