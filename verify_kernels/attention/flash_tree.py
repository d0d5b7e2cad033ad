"""Triton tree attention over the slot-indexed KV pool in place, with the same signature and semantics as
tree_attention_ref (naive.py): no gather of the pool into a [B, kv_len] copy, no mask tensor, no key-length bucket.

Grid (query block, row b x KV head, key split). Grouped-query attention without copies: the G = Hq / Hkv query heads
that share a KV head are folded into the query rows of one program, row m = node t * G + head g, so a block of rows
spans consecutive nodes. The program streams its row's keys with an fp32 online softmax (exp2, scale folded in):
- the committed prefix, positions 0 .. seq_len - 1 of pool row req_slots[b], BLOCK_N at a time, all visible;
- then the step's nodes 0 .. t_last, BLOCK_T at a time, where t_last is the last node of the block (an ancestor
  comes before its descendants), read from the key / value inputs, not from the pool: node i is visible to node t
  iff i == t or ancestors[b, t, i].
The program of query block 0 and split 0 writes the nodes' keys / values into the pool at seq_len + i (the write
that the next steps read); nothing in this launch reads those positions, so the write needs no ordering.

Split-K (flash-decoding): when rows x KV heads x query blocks leave the SMs idle (small batches, long contexts), each
row's committed prefix is cut into `splits` equal parts of whole BLOCK_N blocks, one program each (the last one also
takes the nodes), and a second kernel merges the partial (max, sum, accumulator) triples. The number of splits is
chosen on the host from the grid and the key-length hint kv_len, so a captured CUDA graph has a fixed grid; the loop
bounds stay per row and data-dependent.
"""

import functools
import os

import torch
import triton
import triton.language as tl

# tunables (H200 sizes: 132 SMs). Query rows per program: T * G folded rows, at least 16 (tl.dot's minimum).
BLOCK_M_MAX = 64
# keys per online-softmax step on 4 warps (8 from BIG_TILE accumulator elements [BLOCK_M, D]), NUM_STAGES deep.
# H200 sweep of 2026-12-05 (benchmarks/sweep_attention.py, results/sweeps_h200/sweep_attention_2026-12-05f.txt): at
# the study's points 32-key blocks on 4 warps in 3 stages took 38.0 / 153.3 us (Qwen3.5-9B, 4-chains at batch 128,
# 160 / 1024 keys) against 56.5 / 209.8 for 64-key blocks on 8 warps in 2 stages, and tied or won at every other
# point: two programs an SM (sm_90: 214 registers, no spill, against 150 on 8 warps and one program an SM)
BLOCK_N = 32
NUM_WARPS = 4
BIG_TILE = 64 * 256
NUM_STAGES = 3
MAX_HEAD_DIM = 256  # the accumulator [BLOCK_M, D] fp32 lives in registers
# split-K: split until the grid holds about SPLIT_PROGRAMS_PER_SM programs per SM, never below MIN_KEYS_PER_SPLIT
# keys per split (the partials cost a [rows, D] fp32 write + read per split)
SPLIT_PROGRAMS_PER_SM = 2
MIN_KEYS_PER_SPLIT = 128
MAX_SPLITS = 64
LOG2E = 1.4426950408889634


@triton.jit
def _softmax_step(b_q, b_k, b_v, b_visible, b_m, b_l, b_acc, qk_scale, PRECISION: tl.constexpr,
                  DOT_F32: tl.constexpr):
    """One BLOCK_N step of the online softmax; b_m, b_l [BLOCK_M] and b_acc [BLOCK_M, BLOCK_D] fp32. b_q, b_k, b_v
    in the query's dtype; b_visible [BLOCK_M, BLOCK_N] bool (or a row of it); DOT_F32: the products in fp32 from
    the same rounded operands (Triton's interpreter computes bf16 dots wrongly)."""
    b_p_dtype = b_v.dtype  # P is rounded to V's dtype before its product, as in flash attention
    if DOT_F32:
        b_q, b_k, b_v = b_q.to(tl.float32), b_k.to(tl.float32), b_v.to(tl.float32)
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
    b_s = tl.where(b_visible, b_s, float("-inf"))
    b_m_new = tl.maximum(b_m, tl.max(b_s, 1))  # b_m starts finite, so a row with nothing visible stays NaN-free
    b_alpha = tl.exp2(b_m - b_m_new)
    b_p = tl.exp2(b_s - b_m_new[:, None])
    b_l = b_l * b_alpha + tl.sum(b_p, 1)
    b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_p_dtype).to(b_v.dtype), b_v, input_precision=PRECISION)
    return b_m_new, b_l, b_acc


@triton.jit(do_not_specialize=["T", "splits", "s_ab", "s_at"])
def tree_attention_kernel(
    q, k, v, k_pool, v_pool, req_slots, seq_lens, ancestors, o, o_part, ml_part,
    qk_scale, T, splits,
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_pr, s_pp, s_ph, s_ab, s_at, s_ob, s_ot, s_oh,
    HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
):
    i_m, i_bh, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = (i_bh // HKV).to(tl.int64), i_bh % HKV  # int64: prompts make [B, T, ...] offsets large
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    n_prefix = tl.load(seq_lens + i_b).to(tl.int32)
    rows = T * G
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)  # folded rows: node t_m, query head i_h * G + g_m
    t_m, g_m = o_m // G, o_m % G
    m_m = o_m < rows
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    p_q = q + i_b * s_qb + t_m[:, None] * s_qt + (i_h * G + g_m)[:, None] * s_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_m[:, None] & m_d[None, :], other=0.0)

    b_m = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    b_l = tl.zeros([BLOCK_M], dtype=tl.float32)
    b_acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # this split's share of the committed keys, whole BLOCK_N blocks read from pool row req_slots[b] in place
    p_kr = k_pool + i_r * s_pr + i_h * s_ph
    p_vr = v_pool + i_r * s_pr + i_h * s_ph
    per_split = tl.cdiv(tl.cdiv(n_prefix, BLOCK_N), splits) * BLOCK_N
    lo = i_s * per_split
    hi = tl.minimum(lo + per_split, n_prefix)
    for start in range(lo, hi, BLOCK_N):
        o_n = start + tl.arange(0, BLOCK_N)
        m_n = o_n < hi
        m_nd = m_n[:, None] & m_d[None, :]
        b_k = tl.load(p_kr + o_n[:, None] * s_pp + o_d[None, :], mask=m_nd, other=0.0)
        b_v = tl.load(p_vr + o_n[:, None] * s_pp + o_d[None, :], mask=m_nd, other=0.0)
        b_m, b_l, b_acc = _softmax_step(b_q, b_k.to(b_q.dtype), b_v.to(b_q.dtype), m_n[None, :], b_m, b_l, b_acc,
                                        qk_scale, PRECISION=PRECISION, DOT_F32=DOT_F32)
    # the step's nodes 0 .. t_last (an ancestor comes before its descendants), in the last split, read from the
    # key / value inputs and rounded as the pool stores them: node i is visible to node t iff i == t or
    # ancestors[b, t, i]
    if i_s == splits - 1:
        t_last = (tl.minimum(i_m * BLOCK_M + BLOCK_M, rows) - 1) // G
        for t0 in range(0, t_last + 1, BLOCK_T):
            o_i = t0 + tl.arange(0, BLOCK_T)
            m_i = o_i <= t_last
            m_id = m_i[:, None] & m_d[None, :]
            b_k = tl.load(k + i_b * s_kb + o_i[:, None] * s_kt + i_h * s_kh + o_d[None, :], mask=m_id, other=0.0)
            b_v = tl.load(v + i_b * s_vb + o_i[:, None] * s_vt + i_h * s_vh + o_d[None, :], mask=m_id, other=0.0)
            b_a = tl.load(ancestors + i_b * s_ab + t_m[:, None] * s_at + o_i[None, :], mask=m_m[:, None] & m_i[None, :],
                          other=0)
            b_visible = m_i[None, :] & ((b_a != 0) | (t_m[:, None] == o_i[None, :]))
            b_k = b_k.to(k_pool.dtype.element_ty).to(b_q.dtype)
            b_v = b_v.to(v_pool.dtype.element_ty).to(b_q.dtype)
            b_m, b_l, b_acc = _softmax_step(b_q, b_k, b_v, b_visible, b_m, b_l, b_acc, qk_scale,
                                            PRECISION=PRECISION, DOT_F32=DOT_F32)

    if not SPLIT:
        b_o = b_acc / tl.where(b_l > 0, b_l, 1.0)[:, None]
        p_o = o + i_b * s_ob + t_m[:, None] * s_ot + (i_h * G + g_m)[:, None] * s_oh + o_d[None, :]
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_m[:, None] & m_d[None, :])
    else:
        # partials [B * HKV, splits, rows, D] and (max, sum) [B * HKV, splits, 2, rows], fp32; empty splits too
        base = (i_bh * splits + i_s).to(tl.int64) * rows
        tl.store(o_part + (base + o_m[:, None]) * D + o_d[None, :], b_acc, mask=m_m[:, None] & m_d[None, :])
        tl.store(ml_part + base * 2 + o_m, b_m, mask=m_m)
        tl.store(ml_part + base * 2 + rows + o_m, b_l, mask=m_m)

    # the nodes' keys / values into the pool, once per (row, KV head)
    if (i_m == 0) & (i_s == 0):
        for t0 in range(0, T, BLOCK_T):
            o_t = t0 + tl.arange(0, BLOCK_T)
            m_t = (o_t < T)[:, None] & m_d[None, :]
            b_kn = tl.load(k + i_b * s_kb + o_t[:, None] * s_kt + i_h * s_kh + o_d[None, :], mask=m_t)
            b_vn = tl.load(v + i_b * s_vb + o_t[:, None] * s_vt + i_h * s_vh + o_d[None, :], mask=m_t)
            tl.store(p_kr + (n_prefix + o_t)[:, None] * s_pp + o_d[None, :], b_kn.to(k_pool.dtype.element_ty), mask=m_t)
            tl.store(p_vr + (n_prefix + o_t)[:, None] * s_pp + o_d[None, :], b_vn.to(v_pool.dtype.element_ty), mask=m_t)


@triton.jit(do_not_specialize=["T", "splits"])
def tree_attention_merge_kernel(
    o_part, ml_part, o, T, splits, s_ob, s_ot, s_oh,
    HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Merges the splits' partial softmaxes of one block of folded rows: o = sum_s e^{m_s - m} acc_s / sum_s ..."""
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = (i_bh // HKV).to(tl.int64), i_bh % HKV
    rows = T * G
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_m = o_m < rows
    o_d = tl.arange(0, BLOCK_D)
    m_md = m_m[:, None] & (o_d < D)[None, :]
    b_m = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    b_l = tl.zeros([BLOCK_M], dtype=tl.float32)
    b_acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for i_s in range(splits):
        base = (i_bh * splits + i_s).to(tl.int64) * rows
        b_ms = tl.load(ml_part + base * 2 + o_m, mask=m_m, other=-1e30)
        b_ls = tl.load(ml_part + base * 2 + rows + o_m, mask=m_m, other=0.0)
        b_accs = tl.load(o_part + (base + o_m[:, None]) * D + o_d[None, :], mask=m_md, other=0.0)
        b_m_new = tl.maximum(b_m, b_ms)
        b_alpha, b_beta = tl.exp2(b_m - b_m_new), tl.exp2(b_ms - b_m_new)
        b_l = b_l * b_alpha + b_ls * b_beta
        b_acc = b_acc * b_alpha[:, None] + b_accs * b_beta[:, None]
        b_m = b_m_new
    b_o = b_acc / tl.where(b_l > 0, b_l, 1.0)[:, None]
    t_m, g_m = o_m // G, o_m % G
    p_o = o + i_b * s_ob + t_m[:, None] * s_ot + (i_h * G + g_m)[:, None] * s_oh + o_d[None, :]
    tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_md)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def choose_splits(programs: int, kv_len: int, device: torch.device) -> int:
    """Key splits per row: 1 once the grid holds SPLIT_PROGRAMS_PER_SM programs per SM; otherwise enough splits to
    get there, at most one per MIN_KEYS_PER_SPLIT keys of kv_len and at most MAX_SPLITS. Host ints only."""
    target = SPLIT_PROGRAMS_PER_SM * _sm_count(device)
    if programs >= target:
        return 1
    return max(1, min(triton.cdiv(target, programs), kv_len // MIN_KEYS_PER_SPLIT, MAX_SPLITS))


def _check(query, key, value, key_pool, value_pool, req_slots, seq_lens, ancestors) -> tuple[int, ...]:
    B, T, Hq, D = query.shape
    R, S, Hkv, Dp = key_pool.shape
    if key.shape != (B, T, Hkv, D) or value.shape != key.shape:
        raise ValueError(f"key / value must be [B, T, Hkv, D] = {(B, T, Hkv, D)}, got {tuple(key.shape)} and "
                         f"{tuple(value.shape)}")
    if value_pool.shape != key_pool.shape or Dp != D or Hq % Hkv:
        raise ValueError(f"pools {tuple(key_pool.shape)} / {tuple(value_pool.shape)} do not fit query "
                         f"{tuple(query.shape)} (head dim {D}, query heads a multiple of the KV heads)")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"head dim {D} > {MAX_HEAD_DIM}: use tree_attention_ref")
    if req_slots.shape != (B,) or seq_lens.shape != (B,) or ancestors.shape != (B, T, T):
        raise ValueError(f"req_slots / seq_lens must be [{B}] and ancestors [{B}, {T}, {T}], got "
                         f"{tuple(req_slots.shape)}, {tuple(seq_lens.shape)}, {tuple(ancestors.shape)}")
    if ancestors.dtype != torch.bool:
        raise ValueError(f"ancestors must be bool, got {ancestors.dtype}")
    for name, x in (("query", query), ("key", key), ("value", value), ("ancestors", ancestors)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim")
    if not (key_pool.is_contiguous() and value_pool.is_contiguous()):
        raise ValueError("the KV pools must be contiguous")
    return B, T, Hq, Hkv, D


def tree_attention_fwd(query, key, value, key_pool, value_pool, req_slots, seq_lens, ancestors, scale: float,
                       kv_len: int, num_splits: int | None = None) -> torch.Tensor:
    """Launcher: checks, the split choice, allocation, the grids."""
    B, T, Hq, Hkv, D = _check(query, key, value, key_pool, value_pool, req_slots, seq_lens, ancestors)
    G = Hq // Hkv
    out = torch.empty(B, T, Hq, D, dtype=query.dtype, device=query.device)
    if B == 0 or T == 0:
        return out
    BLOCK_M = max(16, min(BLOCK_M_MAX, triton.next_power_of_2(T * G)))
    BLOCK_D = max(16, triton.next_power_of_2(D))
    m_blocks = triton.cdiv(T * G, BLOCK_M)
    splits = num_splits or choose_splits(m_blocks * B * Hkv, kv_len, query.device)
    if splits > 1:
        o_part = torch.empty(B * Hkv, splits, T * G, D, dtype=torch.float32, device=query.device)
        ml_part = torch.empty(B * Hkv, splits, 2, T * G, dtype=torch.float32, device=query.device)
    else:
        o_part = ml_part = out  # stand-ins, not written
    anc = ancestors.view(torch.uint8)
    dot_f32 = os.environ.get("TRITON_INTERPRET") == "1"
    precision = "ieee" if query.dtype == torch.float32 or dot_f32 else "tf32"
    tree_attention_kernel[(m_blocks, B * Hkv, splits)](
        query, key, value, key_pool, value_pool, req_slots, seq_lens, anc, out, o_part, ml_part,
        scale * LOG2E, T, splits,
        *query.stride()[:3], *key.stride()[:3], *value.stride()[:3], *key_pool.stride()[:3], *anc.stride()[:2],
        *out.stride()[:3],
        HKV=Hkv, G=G, D=D, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        BLOCK_T=min(BLOCK_N, max(16, triton.next_power_of_2(T))), SPLIT=splits > 1, PRECISION=precision,
        DOT_F32=dot_f32, num_warps=2 * NUM_WARPS if BLOCK_M * BLOCK_D >= BIG_TILE else NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    if splits > 1:
        tree_attention_merge_kernel[(m_blocks, B * Hkv)](
            o_part, ml_part, out, T, splits, *out.stride()[:3],
            HKV=Hkv, G=G, D=D, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, num_warps=NUM_WARPS,
        )
    return out


def tree_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_pool: torch.Tensor,
    value_pool: torch.Tensor,
    req_slots: torch.Tensor,
    seq_lens: torch.Tensor,
    ancestors: torch.Tensor,
    scale: float,
    kv_len: int,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Write the step's nodes into the pool and attend every node to the committed prefix, its ancestors and
    itself, reading the pool in place (as tree_attention_ref).

    query: [B, T, Hq, D]; key, value: [B, T, Hkv, D] (bf16 / fp16 / fp32, last dim contiguous); key_pool,
    value_pool: [R, S, Hkv, D] contiguous, written at [req_slots[b], seq_lens[b] + j]; req_slots, seq_lens: [B]
    int64; ancestors: [B, T, T] bool (ancestors[b, j, i]: i is j or an ancestor of j); scale: the softmax scale;
    kv_len: a host-side bound on seq_len + T, used only to choose the key splits (reads stop at each row's own
    seq_len + T); num_splits: force the number of key splits (tests, tuning). D <= 256. Returns [B, T, Hq, D] in
    query's dtype; fp32 softmax and accumulation.
    """
    return tree_attention_fwd(query, key, value, key_pool, value_pool, req_slots, seq_lens, ancestors, scale,
                              kv_len, num_splits)
