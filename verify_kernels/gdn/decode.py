"""Triton kernels for the Gated DeltaNet KVBuffer decode: one new token per row on top of its committed state S0
and buffer (gdn_decode), and plain decoding with the commit of that token fused in (gdn_decode_commit). Semantics,
shapes and pool layout: verify_kernels.gdn.naive (the oracle); the math: docs/design.md section 2.

Three small kernels rather than one: on the H200 a single kernel holding the S0 tile, buffer tiles and the fold
accumulator ran out of registers (spills, 40% occupancy) and took 2x the time of reading S0.
1. buffer pass, one program per (row, value head): the buffer's share of S_c^T k and S_c^T q (entries in blocks of
   BLOCK_L, never the stale positions past buf_len) and the token's G;
2. state pass, one program per (row, value head, V block): the [K, BV] tile of S0 read once (not at all for rows
   whose state slot is -1: S0 = 0) gives S0^T k and S0^T q; o and u; with the commit, the token's entry appended
   at buf_len for rows that do not flush. This pass is the one bound by memory: S0 at ~4 TB/s on the H200;
3. fold (commit only), one program per (row, value head): rows whose buffer is full fold S0 + buffer + the token
   into the state, one read and one write of S0 per flush_length tokens; the other rows return at once.
Small batches are bound by launches, not bytes: up to FUSED_MAX_BATCH rows one kernel does all three (its S0 tile
and the first BLOCK_L buffer entries loaded together), which a prototype timed at ~5 us per layer at batch 1 on
the H200, against ~14 us for the three launches.
"""

import torch
import triton
import triton.language as tl

# Launch parameters, measured on the H200 at Qwen3.5-9B shapes (K = V = 128, HV = 32; .scratch notes in the PR):
# state pass BV = 64 at 4 warps read S0 at 3.9-4.0 TB/s (BV = 32: 3.4, BV = 128 at 8 warps: 2.1); the buffer
# pass is latency-bound and does best with the whole V row per program; the fold does best on [K, 32] tiles.
STATE_BLOCK_V = 64
FOLD_BLOCK_V = 32
BLOCK_L = 16
NUM_WARPS = 4
FUSED_MAX_BATCH = 4
FUSED_BLOCK_V = 32

MAX_BUFFER = 64
HEAD_DIMS = (16, 32, 64, 128)
INDEX_DTYPES = (torch.int32, torch.int64)
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def fold_buffer(b_s, buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, o_k, o_v, H: tl.constexpr, HV: tl.constexpr,
                K: tl.constexpr, V: tl.constexpr, L: tl.constexpr, BC: tl.constexpr):
    """b_s [K, BV] plus the fold of the first n entries of buffer row i_r: sum_i e^{G - G_i} k_i u_i^T."""
    for i_c in range(0, n, BC):
        o_c = i_c + tl.arange(0, BC)
        m_c = o_c < n
        b_bg = tl.load(buf_gcum + (i_r * L + o_c) * HV + i_h, mask=m_c, other=0.)
        b_bk = tl.load(buf_k + ((i_r * L + o_c[:, None]) * H + i_hk) * K + o_k[None, :], mask=m_c[:, None], other=0.)
        b_bu = tl.load(buf_u + ((i_r * L + o_c[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_c[:, None], other=0.)
        b_decay = tl.exp(tl.where(m_c, b_G - b_bg, float("-inf")))
        # three TF32 passes on the tensor cores: fp32-level error, and 1.3x faster than "ieee" FMA products here
        b_s += tl.dot(tl.trans(b_bk), b_decay[:, None] * b_bu, input_precision="tf32x3")
    return b_s


@triton.jit
def buffer_reads(buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, b_k, b_q, o_k, o_v, H: tl.constexpr,
                 HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr, BV: tl.constexpr,
                 BC: tl.constexpr):
    """The buffer's share of S_c^T k and S_c^T q over columns o_v [BV]: sum_i e^{G - G_i} (k_i . x) u_i for the
    first n entries of buffer row i_r, BC at a time (never the stale positions past n)."""
    b_kr = tl.zeros([BV], dtype=tl.float32)
    b_qr = tl.zeros([BV], dtype=tl.float32)
    for i_c in range(0, n, BC):
        o_c = i_c + tl.arange(0, BC)
        m_c = o_c < n
        b_bk = tl.load(buf_k + ((i_r * L + o_c[:, None]) * H + i_hk) * K + o_k[None, :], mask=m_c[:, None], other=0.)
        b_bu = tl.load(buf_u + ((i_r * L + o_c[:, None]) * HV + i_h) * V + o_v[None, :], mask=m_c[:, None], other=0.)
        b_bg = tl.load(buf_gcum + (i_r * L + o_c) * HV + i_h, mask=m_c, other=0.)
        b_decay = tl.exp(tl.where(m_c, b_G - b_bg, float("-inf")))                      # [BC], e^{G - G_i} <= 1
        b_kr += tl.sum((tl.sum(b_bk * b_k[None, :], 1) * b_decay)[:, None] * b_bu, 0)
        b_qr += tl.sum((tl.sum(b_bk * b_q[None, :], 1) * b_decay)[:, None] * b_bu, 0)
    return b_kr, b_qr


@triton.jit
def append_entry(buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, i_v, n, b_k, b_u, b_G, o_k, o_v, H: tl.constexpr,
                 HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr):
    """The token's entry at buffer position n: u for this V block, G once per head (V block 0), the key once per
    key head (the first value head of its group, V block 0)."""
    tl.store(buf_u + ((i_r * L + n) * HV + i_h) * V + o_v, b_u)
    if i_v == 0:
        tl.store(buf_gcum + (i_r * L + n) * HV + i_h, b_G)
        if i_h % (HV // H) == 0:
            tl.store(buf_k + ((i_r * L + n) * H + i_hk) * K + o_k, b_k)


@triton.jit
def gdn_decode_buffer_kernel(
    q,             # [B, H, K]
    k,             # [B, H, K]
    g,             # [B, HV]
    buf_k,         # [R, L, H, K] fp32
    buf_u,         # [R, L, HV, V] fp32
    buf_gcum,      # [R, L, HV] fp32
    buf_len,       # [R]
    req_slots,     # [B]
    kr,            # [B, HV, V] fp32: sum_i e^{G - G_i} (k_i . k) u_i
    qr,            # [B, HV, V] fp32: the same with q
    gcum,          # [B, HV] fp32: the token's G
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BC: tl.constexpr,
):
    i_h, i_b = tl.program_id(0), tl.program_id(1)
    i_hk = i_h // (HV // H)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    n = tl.load(buf_len + i_r).to(tl.int32)
    o_k = tl.arange(0, K)
    o_v = tl.arange(0, V)
    # the token's G: the last entry's G (0 for an empty buffer) plus its own g
    b_G = tl.load(g + i_b * HV + i_h).to(tl.float32)
    if n > 0:
        b_G += tl.load(buf_gcum + (i_r * L + n - 1) * HV + i_h)
    b_q = tl.load(q + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    b_k = tl.load(k + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    b_kr, b_qr = buffer_reads(buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, b_k, b_q, o_k, o_v, H, HV, K, V, L,
                              V, BC)
    tl.store(kr + (i_b * HV + i_h) * V + o_v, b_kr)
    tl.store(qr + (i_b * HV + i_h) * V + o_v, b_qr)
    tl.store(gcum + i_b * HV + i_h, b_G)


@triton.jit
def gdn_decode_state_kernel(
    q,             # [B, H, K]
    k,             # [B, H, K]
    v,             # [B, HV, V]
    beta,          # [B, HV]
    state_pool,    # [S, HV, K, V] fp32
    state_slots,   # [B]
    kr,            # [B, HV, V] fp32, from the buffer pass
    qr,            # [B, HV, V] fp32
    gcum,          # [B, HV] fp32
    buf_k,         # [R, L, H, K] fp32 (COMMIT: the entry is appended here)
    buf_u,         # [R, L, HV, V] fp32
    buf_gcum,      # [R, L, HV] fp32
    buf_len,       # [R]
    req_slots,     # [B]
    o,             # [B, HV, V] fp32
    u,             # [B, HV, V] fp32
    flush_length,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BV: tl.constexpr,
    COMMIT: tl.constexpr,
):
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hk = i_h // (HV // H)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    p_x = (i_b * HV + i_h) * V + o_v
    b_q = tl.load(q + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    b_k = tl.load(k + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    b_kr = tl.load(kr + p_x)
    b_qr = tl.load(qr + p_x)
    b_G = tl.load(gcum + i_b * HV + i_h)
    if i_s >= 0:
        # S0 is streamed once and not reused: evict it first so the buffers and inputs keep the L2
        b_s = tl.load(state_pool + ((i_s * HV + i_h) * K + o_k[:, None]) * V + o_v[None, :],
                      eviction_policy="evict_first")
        b_eG = tl.exp(b_G)
        b_kr += b_eG * tl.sum(b_s * b_k[:, None], 0)
        b_qr += b_eG * tl.sum(b_s * b_q[:, None], 0)
    b_u = tl.load(beta + i_b * HV + i_h).to(tl.float32) * (tl.load(v + p_x).to(tl.float32) - b_kr)
    tl.store(o + p_x, b_qr + tl.sum(b_q * b_k, 0) * b_u)
    tl.store(u + p_x, b_u)
    if COMMIT:
        i_r = tl.load(req_slots + i_b).to(tl.int64)
        n = tl.load(buf_len + i_r).to(tl.int32)
        if n + 1 < flush_length:
            append_entry(buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, i_v, n, b_k, b_u, b_G, o_k, o_v, H, HV, K, V, L)


@triton.jit
def gdn_decode_fold_kernel(
    k,             # [B, H, K]
    u,             # [B, HV, V] fp32, the token's entry
    gcum,          # [B, HV] fp32
    state_pool,    # [S, HV, K, V] fp32
    state_slots,   # [B]
    buf_k,         # [R, L, H, K] fp32
    buf_u,         # [R, L, HV, V] fp32
    buf_gcum,      # [R, L, HV] fp32
    buf_len,       # [R]
    req_slots,     # [B]
    flush_length,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BV: tl.constexpr,
    BC: tl.constexpr,
):
    """S <- e^G S0 + sum_i e^{G - G_i} k_i u_i^T + k u^T for rows whose buffer is full (the token is the last entry,
    decay 1). A row that flushes must have a state slot (the caller allocates a zeroed one); without one nothing is
    written."""
    i_h, i_b = tl.program_id(0), tl.program_id(1)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    n = tl.load(buf_len + i_r).to(tl.int32)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    if n + 1 >= flush_length:
        if i_s >= 0:
            i_hk = i_h // (HV // H)
            o_k = tl.arange(0, K)
            b_G = tl.load(gcum + i_b * HV + i_h)
            b_k = tl.load(k + (i_b * H + i_hk) * K + o_k).to(tl.float32)
            for i_v in range(0, V, BV):
                o_v = i_v + tl.arange(0, BV)
                p_s = state_pool + ((i_s * HV + i_h) * K + o_k[:, None]) * V + o_v[None, :]
                b_s = tl.exp(b_G) * tl.load(p_s) + b_k[:, None] * tl.load(u + (i_b * HV + i_h) * V + o_v)[None, :]
                b_s = fold_buffer(b_s, buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, o_k, o_v, H, HV, K, V, L, BC)
                tl.store(p_s, b_s)


@triton.jit
def gdn_decode_fused_kernel(
    q, k, v, g, beta,        # [B, H, K], [B, H, K], [B, HV, V], [B, HV], [B, HV]
    state_pool,              # [S, HV, K, V] fp32
    state_slots,             # [B]
    buf_k, buf_u, buf_gcum,  # [R, L, H, K], [R, L, HV, V], [R, L, HV] fp32
    buf_len,                 # [R]
    req_slots,               # [B]
    o, u, gcum,              # [B, HV, V], [B, HV, V], [B, HV] fp32 (COMMIT: u and gcum unused)
    flush_length,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BV: tl.constexpr,
    BC: tl.constexpr,
    COMMIT: tl.constexpr,
):
    """The three passes in one program per (row, value head, V block), for small batches."""
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_hk = i_h // (HV // H)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    n = tl.load(buf_len + i_r).to(tl.int32)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    b_q = tl.load(q + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    b_k = tl.load(k + (i_b * H + i_hk) * K + o_k).to(tl.float32)
    b_G = tl.load(g + i_b * HV + i_h).to(tl.float32)
    if n > 0:
        b_G += tl.load(buf_gcum + (i_r * L + n - 1) * HV + i_h)
    b_kr, b_qr = buffer_reads(buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, b_k, b_q, o_k, o_v, H, HV, K, V, L,
                              BV, BC)
    b_s = tl.zeros([K, BV], dtype=tl.float32)
    if i_s >= 0:
        b_s = tl.load(state_pool + ((i_s * HV + i_h) * K + o_k[:, None]) * V + o_v[None, :])
        b_kr += tl.exp(b_G) * tl.sum(b_s * b_k[:, None], 0)
        b_qr += tl.exp(b_G) * tl.sum(b_s * b_q[:, None], 0)
    b_u = tl.load(beta + i_b * HV + i_h).to(tl.float32) * (tl.load(v + (i_b * HV + i_h) * V + o_v).to(tl.float32)
                                                          - b_kr)
    tl.store(o + (i_b * HV + i_h) * V + o_v, b_qr + tl.sum(b_q * b_k, 0) * b_u)
    if not COMMIT:
        tl.store(u + (i_b * HV + i_h) * V + o_v, b_u)
        tl.store(gcum + i_b * HV + i_h, b_G, mask=i_v == 0)
    else:
        if n + 1 < flush_length:
            append_entry(buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, i_v, n, b_k, b_u, b_G, o_k, o_v, H, HV, K, V, L)
        else:
            if i_s >= 0:
                b_s = tl.exp(b_G) * b_s + b_k[:, None] * b_u[None, :]
                b_s = fold_buffer(b_s, buf_k, buf_u, buf_gcum, i_r, i_h, i_hk, n, b_G, o_k, o_v, H, HV, K, V, L, BC)
                tl.store(state_pool + ((i_s * HV + i_h) * K + o_k[:, None]) * V + o_v[None, :], b_s)


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


def gdn_decode_fwd(q, k, v, g, beta, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots,
                   flush_length: int | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Launch the decode (flush_length None) or the fused decode + commit. Returns o, u, gcum (None when fused)."""
    B = q.shape[0]
    H, HV, K, V = check_heads(q, k, v)
    check_shape("q", q, (B, H, K))
    check_shape("v", v, (B, HV, V))
    check_shape("g", g, (B, HV))
    check_shape("beta", beta, (B, HV))
    check_tensors(INPUT_DTYPES, q=q, k=k, v=v, g=g, beta=beta)
    L = check_pools(B, H, HV, K, V, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots)
    commit = flush_length is not None
    if commit and not 1 <= flush_length <= L:
        raise ValueError(f"flush_length must be in [1, {L}] (the buffer capacity), got {flush_length}")

    f32 = dict(dtype=torch.float32, device=q.device)
    o, u, gcum = torch.empty(B, HV, V, **f32), torch.empty(B, HV, V, **f32), torch.empty(B, HV, **f32)
    flush = flush_length if commit else 0
    shapes = dict(H=H, HV=HV, K=K, V=V, L=L)
    if B <= FUSED_MAX_BATCH:
        BV = min(V, FUSED_BLOCK_V)
        gdn_decode_fused_kernel[(V // BV, HV, B)](
            q, k, v, g, beta, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots, o, u, gcum, flush,
            **shapes, BV=BV, BC=BLOCK_L, COMMIT=commit, num_warps=NUM_WARPS,
        )
        return o, None if commit else u, None if commit else gcum
    kr, qr = torch.empty(B, HV, V, **f32), torch.empty(B, HV, V, **f32)
    gdn_decode_buffer_kernel[(HV, B)](q, k, g, buf_k, buf_u, buf_gcum, buf_len, req_slots, kr, qr, gcum, **shapes,
                                      BC=BLOCK_L, num_warps=NUM_WARPS)
    BV = min(V, STATE_BLOCK_V)
    gdn_decode_state_kernel[(V // BV, HV, B)](
        q, k, v, beta, state_pool, state_slots, kr, qr, gcum, buf_k, buf_u, buf_gcum, buf_len, req_slots, o, u, flush,
        **shapes, BV=BV, COMMIT=commit, num_warps=NUM_WARPS,
    )
    if commit:
        gdn_decode_fold_kernel[(HV, B)](k, u, gcum, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len,
                                        req_slots, flush, **shapes, BV=min(V, FOLD_BLOCK_V), BC=BLOCK_L,
                                        num_warps=NUM_WARPS)
    return o, None if commit else u, None if commit else gcum


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain decoding: gdn_decode_ref then gdn_commit_ref of the token (accepted [[0]], num_accepted 1), fused.

    Shapes as in gdn_decode; 1 <= flush_length <= L. In place: a row with buf_len + 1 < flush_length writes the
    token's entry at buffer position buf_len; the other rows fold S0, the buffer and the token into
    state_pool[state_slots], whose slot must be >= 0 (the caller allocates a zeroed one first; unlike the
    reference this is not checked, which would synchronise with the device; a row without one writes nothing).
    buf_len is not modified (the caller sets it to 0 if flushed else buf_len + 1).
    Returns o [B, HV, V] float32 and flushed [B] bool.
    """
    o, _, _ = gdn_decode_fwd(q, k, v, g, beta, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len,
                             req_slots, flush_length)
    return o, buf_len[req_slots] + 1 >= flush_length
