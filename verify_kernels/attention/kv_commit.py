"""Triton commit of the accepted nodes' keys and values in the KV pool (commit_kv_ref in naive.py is the contract):
one launch per layer where the torch reference takes about nine (offsets, two gathers, two scatters), and nothing
moved for the nodes already in place (an accepted chain prefix: node i at seq_len + i).

Grid (row, KV head). A program walks its row's accepted columns in order: column i copies node accepted[i] >= i to
position i. Within a row a later column's source is never an earlier column's target (accepted[i'] >= i' > i), and
a column reads its source before any later column writes, so the walk in order needs no staging copy; columns past
the path (accepted -1) and those in place are skipped (positions past the new committed end hold nothing committed).
"""

import torch
import triton
import triton.language as tl

NUM_WARPS = 1  # a [head_dim] row of K and of V per column: a few hundred bytes


@triton.jit(do_not_specialize=["A"])
def commit_kv_kernel(key_pool, value_pool, req_slots, seq_lens, accepted, A,
                     S: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BD: tl.constexpr):
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    row = tl.load(req_slots + i_b).to(tl.int64) * S
    seq = tl.load(seq_lens + i_b).to(tl.int64)
    for i in range(0, A):
        node = tl.load(accepted + i_b * A + i).to(tl.int64)
        if node > i:
            source = ((row + seq + node) * HKV + i_h) * D + o_d
            target = ((row + seq + i) * HKV + i_h) * D + o_d
            tl.store(key_pool + target, tl.load(key_pool + source, mask=m_d), mask=m_d)
            tl.store(value_pool + target, tl.load(value_pool + source, mask=m_d), mask=m_d)


def commit_kv(key_pool: torch.Tensor, value_pool: torch.Tensor, req_slots: torch.Tensor, seq_lens: torch.Tensor,
              accepted: torch.Tensor) -> None:
    """commit_kv_ref in one launch: pools [R, S, Hkv, D] (contiguous), req_slots / seq_lens [B], accepted [B, A]."""
    if key_pool.shape != value_pool.shape or not (key_pool.is_contiguous() and value_pool.is_contiguous()):
        raise ValueError(f"the key and value pools must be contiguous and of one shape, got "
                         f"{tuple(key_pool.shape)} and {tuple(value_pool.shape)}")
    B, A = accepted.shape
    if req_slots.shape != (B,) or seq_lens.shape != (B,):
        raise ValueError(f"req_slots and seq_lens must have shape [{B}], got {tuple(req_slots.shape)} and "
                         f"{tuple(seq_lens.shape)}")
    if B == 0 or A == 0:
        return
    _, S, HKV, D = key_pool.shape
    commit_kv_kernel[(B, HKV)](key_pool, value_pool, req_slots, seq_lens, accepted.contiguous(), A,
                               S=S, HKV=HKV, D=D, BD=triton.next_power_of_2(D), num_warps=NUM_WARPS)
