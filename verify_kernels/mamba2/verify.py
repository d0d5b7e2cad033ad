"""Triton kernels for the Mamba2 KVBuffer tree verify, with the same signature and semantics as mamba2_verify_ref: a
token tree of up to 64 nodes per row (ragged: num_nodes per row) scored on top of the row's committed h0 + buffer,
with no per-node state and no triangular solve (Mamba2 entries are independent of each other). The math:
docs/design.md section 2.

With G_t = G_last + Gl_t, Gl_t the sum of dt A over t's root path (its ancestor row) and G_last the G of the last
buffered entry:

    y_t = e^{G_t} h0 C_t                                                 (state term)
        + sum_{i < buf_len} e^{(G_last - G_i) + Gl_t} (C_t . B_i) xdt_i  (buffer term)
        + sum_{i in anc(t) + {t}} e^{Gl_t - Gl_i} (C_t . B_i) xdt_i      (tree term)
        + D x_t

The state term is the one that moves bytes (h0 is 2 MiB per request and layer at Nemotron-3-Nano's sizes, the nodes'
inputs and outputs ~56 KiB per node); the others are small products. The kernel that did everything in one program
per (row, head, P block), reading h0 last after a chain of score dots, took 0.70 ms per layer at batch 256 on the
H200 for 5-node chains, ~5x the time of reading h0 once: each program's loads came one after another and too few
bytes were in flight. Two passes here:

1. products pass, one program per (row, group): the scores C_t . B_i of the nodes against the nodes [BT, BT] and
   against the buffer [BT, BL], shared by the group's NH / NG heads (which recomputed them 16 times before), into a
   small fp32 scratch (verify_scratch_bytes; padding and stale entries score 0);
2. state pass, one program per (row, head, P block of BP): the rest. The state term h0 C_t is a loop of tl.dots over
   N slices of BN columns, which Triton software-pipelines: the [BP, BN] slices of h0 stream into shared memory with
   cp.async (evict-first, masked off for rows without a state), all in flight at once. The small loads of the other
   terms (the nodes' inputs, ancestor rows and scores, the buffer's entries as one block masked at buf_len) are
   issued before that loop and used after it, so that they too arrive while h0 streams in; then G, the tree and
   buffer terms (tl.dots) and the stores. The program works on y transposed, [BP, BT], so that h0 is the dots' left
   operand with BP rows. Optionally (FMA_MAX_NODES) the state term runs one node at a time on the FMA units
   instead: the whole tile loaded first and used last, a product and a sum over N per node.
Small batches are bound by latency and launches, not bytes: up to FUSED_MAX_BATCH rows every state-pass program
computes its scores from the same slices of C in its N loop and the verify is one launch.
Above FUSED_MAX_BATCH (SPLIT_ROLES, VerifyConfig.split_roles) h0's stream runs beside the products pass: one launch of
state programs that compute h0 C^T alone (85 registers for sm_90, where the state pass holds 128: six programs an SM,
not four) and of the products pass's programs, then the state pass without its N loop adds the other terms to h0 C^T
read back ([B, T, NH, P] fp32 scratch), as the GDN decode's split did (docs/design.md 5.2).

Every decay exponent is a difference of G along a path (<= 0), taken from the small tree-local sums Gl rather than
from G itself, and masked pairs are -inf before the exp. Padding nodes load as zeros (their inputs and parents are
never read), so they come out as zeros and add nothing. The dots run in "tf32x3": each fp32 operand split into a
TF32 part and its TF32 residual, three tensor-core products, fp32-level accuracy (plain TF32 would not be: 10
mantissa bits); in IEEE fp32 ("ieee") they ran on the FMA units and were slower still (2.2 ms at batch 256). B and
C in bf16 / fp16 (a bf16 model's, as the glue leaves them) are exact in TF32: the products with them (h0 C^T, the
scores) skip their remainders' products (verify_kernels/precision.py add_product_exact: B_EXACT, C_EXACT).
"""

from functools import partial
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from verify_kernels.mamba2.commit import check_indices, check_pools, check_tokens
from verify_kernels.precision import add_product, add_product_exact, exact_in_tf32
from verify_kernels.registers import register_cap
from verify_kernels.tree import ancestor_mask

# Tunables, none timed yet at these settings: benchmarks/sweep_mamba2.py times the candidates on the GPU (5-node
# chains and 16-node trees, batch 64 and 256) and prints the best; copy its choice here. Register counts below are
# ptxas's for sm_90 at Nemotron-3-Nano's sizes and buffers of 16 entries (triton 3.9 compiling ahead of time; the
# H200 runs 3.6).
# BLOCK_P, NUM_WARPS by BT (the node count padded to a power of two >= 16): P rows of h0 per state-pass program
# (BP x N x 4 bytes: 32 KiB at 64 x 128; larger tiles keep more bytes in flight per program, smaller ones leave
# more programs) and its warps. BT 16: 126 registers (4 programs per SM); BT 32: 167; BT 64 holds [64, 64] score,
# decay and mask tiles and their tf32x3 operands: 217 registers with 16 rows on 8 warps, 64 rows spilled.
# STATE_BLOCK_N: N columns per tl.dot step. The steps are a loop that Triton pipelines (the h0 slices stream into
# shared memory with cp.async, all in flight at once); unrolled, each slice's load waited for the previous slice's
# dot, and tf32x3 over the whole N = 128 at once (each operand split in two, in registers) took 213 registers.
# STATE_STAGES: the pipeline's depth (Triton's num_stages). Swept on the H200 (triton 3.6, benchmarks/sweep_mamba2.py,
# Nemotron-3-Nano shapes, batch 256): 3 stages 265 us for a 5-chain (1.73x its bound) and 282 us for a 16-node tree
# (1.48x), against 309 / 322 us with 4 and 306 / 326 us with 5; BP 64 on 4 warps beat BP 32 (2 or 4 warps), 8 warps,
# 64-column N steps (371 us), the FMA state term (383 us at best) and the one-launch inline scores (720 us).
# FMA_MAX_NODES: up to this many nodes (the tree's T) the state term runs one node at a time on the FMA units
# instead (the whole tile loaded first; 168 registers at 5 nodes). Each node's sum over N costs 5 warp shuffles per
# row, ~110 us of shuffles per layer at batch 256 against ~50 us of tensor-core time for the dots, so 0 (never)
# until the sweep says otherwise.
BLOCK_P = {16: 64, 32: 64, 64: 16}
NUM_WARPS = {16: 4, 32: 4, 64: 8}
STATE_BLOCK_N = 32
STATE_STAGES = 3
FMA_MAX_NODES = 0
# Up to FUSED_MAX_BATCH rows: one launch (scores computed in every program), with SMALL_BATCH_BLOCK_P rows of h0
# per program so that a single row still spreads over the SMs (P / 16 x NH = 256 programs at Nemotron-3-Nano).
FUSED_MAX_BATCH = 4
SMALL_BATCH_BLOCK_P = 16
# SPLIT_ROLES: h0's stream beside the products pass, the rest in a second launch (the module's docstring). H200,
# 2026-12-04 (benchmarks/results/sweeps_h200/sweep_mamba2_2026-12-04c.txt, Nemotron-3-Nano shapes, BP 64 on 4 warps):
# 5-chains at batch 64 / 256 65.3 / 234.8 us (1.71x / 1.54x their bound) against 69.5 / 250.4 for the products and
# state passes in turn; 16-node trees 73.9 / 264.9 against 74.4 / 268.3. With B and C in bf16 (the glue's since
# 2026-12-04e: products with them skip their remainders, add_product_exact): 61.1 / 216.2 against 65.8 / 234.9 with
# the same values in fp32 (sweeps_h200/sweep_mamba2_2026-12-04e.txt); tree16 at 256 248.5 us.
SPLIT_ROLES = True
# SPLIT_FINISH_BLOCK_P, SPLIT_FINISH_WARPS: the split's second launch (mamba2_verify_kernel with HC_IN: the tree and
# buffer terms and G, from h0 C^T read back), P rows a program and warps; None: the state programs' BLOCK_P and
# NUM_WARPS, as until now. That launch moves ~7 KiB a (row, head) at 5 nodes and holds no loop: it is latency-bound
# (Nemotron-3-Nano, batch 128 of 5-chains, H200 2026-12-04e: 30 us a layer against ~14 us of its bytes, a third of
# the verify), and at 68 registers on 4 warps an SM holds 7 of its programs (~9 waves at batch 128). sm_90 with the
# H200's Triton 3.6 (compiled on the CPU): 64 rows on 2 warps 128 registers, 32 rows on 1 warp 138, 16 rows on 1
# warp 109 (up to 18 programs an SM). Not timed yet: `python -m benchmarks.sweep_mamba2 --ops verify --match finish`.
SPLIT_FINISH_BLOCK_P = None
SPLIT_FINISH_WARPS = None
# SPLIT_ROLES_MAX_REGISTERS, SPLIT_FINISH_MAX_REGISTERS: caps on the split's two launches' registers a thread
# (verify_kernels/registers.py), or None. sm_90 with the H200's Triton 3.6 (python -m benchmarks.mamba2_registers on
# the CPU: Nemotron-3-Nano shapes, bf16 B and C, 5-node chains): the state programs of the first launch 80 registers
# on 4 warps, six programs an SM (at batch 128, 9216 programs: 12 waves), capped at 72 seven (10 waves) with 8 bytes
# spilled; the second launch 72 registers, seven an SM (8192 programs: 9 waves), capped at 64 eight (8 waves) with 8
# bytes spilled. Sweep candidates (benchmarks/sweep_mamba2.py) until the H200 times them. By BT, as BLOCK_P: larger
# trees' tiles hold other counts (BT 32: 167, BT 64: 217 in the state pass), so a cap is a block's own.
SPLIT_ROLES_MAX_REGISTERS = {16: None, 32: None, 64: None}
SPLIT_FINISH_MAX_REGISTERS = {16: None, 32: None, 64: None}
# products pass: N columns per step (91 registers at 32, 148 at 64) and warps
PRODUCTS_BLOCK_N = 32
PRODUCTS_WARPS = 4

# DOT_PRECISION: "tf32x3" (Triton's: each operand split and rounded to nearest with an emulated cvt.rna, an add, a
# mask, an infinity test and a select twice an element on sm_90) or "tf32x3-split" (verify_kernels/precision.py: split
# by a mask, two instructions an element, the same fp32-level error). The split: the H200 sweep of 2026-12-03, eighth
# sitting (benchmarks/results/sweeps_h200/sweep_mamba2_2026-12-03h.txt, Nemotron-3-Nano shapes, dots at 64 P rows
# on 4 warps), 5-chains at batch 64 / 256 at 69.8 / 253.5 us against 73.5 / 268.1, 16-node trees 75.4 / 270.9
# against 79.2 / 282.6.
DOT_PRECISION = "tf32x3-split"
MAX_NODES = 64


class VerifyConfig(NamedTuple):
    """Launch parameters of one verify (verify_config gives the tuned ones; benchmarks/sweep_mamba2.py tries others)."""

    block_p: int            # P rows of h0 per state-pass program
    num_warps: int          # warps of a state-pass program
    state_dot: bool         # the state term as tl.dots over N slices (else node by node on the FMA units)
    inline_scores: bool     # scores computed in every state-pass program (one launch) instead of a products pass
    block_n: int = STATE_BLOCK_N  # N columns per tl.dot step
    num_stages: int = STATE_STAGES  # software-pipeline depth of the N loop
    precision: str | None = None  # the products' (DOT_PRECISION when None)
    split_roles: bool = False  # h0's stream beside the products pass in one launch, the rest after (state_dot only)
    finish_block_p: int | None = None  # the split's second launch: P rows a program (None: block_p; >= 16)
    finish_warps: int | None = None    # and its warps (None: num_warps)
    roles_max_registers: int | None = None   # the split's launches' register caps a thread (None: none)
    finish_max_registers: int | None = None


def verify_config(B: int, T: int, P: int) -> VerifyConfig:
    """The tuned launch parameters for B rows of T-node trees and head dim P."""
    BT = verify_blocks(T, 1)[0]
    small = B <= FUSED_MAX_BATCH
    return VerifyConfig(block_p=min(P, SMALL_BATCH_BLOCK_P if small else BLOCK_P[BT]), num_warps=NUM_WARPS[BT],
                        state_dot=T > FMA_MAX_NODES, inline_scores=small, split_roles=SPLIT_ROLES,
                        finish_block_p=SPLIT_FINISH_BLOCK_P, finish_warps=SPLIT_FINISH_WARPS,
                        roles_max_registers=SPLIT_ROLES_MAX_REGISTERS[BT],
                        finish_max_registers=SPLIT_FINISH_MAX_REGISTERS[BT])


@triton.jit
def group_scores(Bm, C, num_nodes, buf_b, buf_len, req_slots, s_tree, s_buf, i_g, i_b, T, NG: tl.constexpr,
                 N: tl.constexpr, L: tl.constexpr, BT: tl.constexpr, BL: tl.constexpr, BN: tl.constexpr,
                 PRECISION: tl.constexpr, B_EXACT: tl.constexpr, C_EXACT: tl.constexpr):
    """Row i_b's scores of group i_g: C_t . B_i against the nodes and the buffer, into s_tree and s_buf (B_EXACT,
    C_EXACT: the nodes' B and C are exact in TF32, add_product_exact)."""
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    n_buf = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
    nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
    o_t = tl.arange(0, BT)
    o_l = tl.arange(0, BL)
    m_t = o_t < nn            # valid nodes; padding loads as 0 (inputs there may be NaN)
    m_l = o_l < n_buf         # valid buffer entries; past buf_len they are stale
    b_st = tl.zeros([BT, BT], dtype=tl.float32)
    b_sb = tl.zeros([BT, BL], dtype=tl.float32)
    for n0 in range(0, N, BN):
        o_n = n0 + tl.arange(0, BN)
        p_x = ((i_b * T + o_t[:, None]) * NG + i_g) * N + o_n[None, :]
        b_c = tl.load(C + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
        b_k = tl.load(Bm + p_x, mask=m_t[:, None], other=0.).to(tl.float32)
        b_kb = tl.load(buf_b + ((i_r * L + o_l[:, None]) * NG + i_g) * N + o_n[None, :], mask=m_l[:, None], other=0.)
        b_st = add_product_exact(b_st, b_c, tl.trans(b_k), PRECISION, C_EXACT, B_EXACT)
        b_sb = add_product_exact(b_sb, b_c, tl.trans(b_kb), PRECISION, C_EXACT, False)
    p_s = (i_b * NG + i_g) * BT + o_t[:, None]
    tl.store(s_tree + p_s * BT + o_t[None, :], b_st)
    tl.store(s_buf + p_s * BL + o_l[None, :], b_sb)


@triton.jit
def mamba2_verify_products_kernel(
    Bm,            # [B, T, NG, N]
    C,             # [B, T, NG, N]
    num_nodes,     # [B]
    buf_b,         # [R, L, NG, N] fp32
    buf_len,       # [R]
    req_slots,     # [B]
    s_tree,        # [B, NG, BT, BT] fp32 out: [t, i] = C_t . B_i over nodes (0 at padding)
    s_buf,         # [B, NG, BT, BL] fp32 out: [t, i] = C_t . B_i over buffer entries (0 past buf_len)
    T,             # not constexpr: tree sizes change every step; only BT picks a compiled kernel
    NG: tl.constexpr,
    N: tl.constexpr,
    L: tl.constexpr,
    BT: tl.constexpr,
    BL: tl.constexpr,
    BN: tl.constexpr,
    PRECISION: tl.constexpr,
    B_EXACT: tl.constexpr,     # the nodes' B / C exact in TF32 (bf16 / fp16 values): products skip their remainders
    C_EXACT: tl.constexpr,
):
    i_g, i_b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    group_scores(Bm, C, num_nodes, buf_b, buf_len, req_slots, s_tree, s_buf, i_g, i_b, T, NG, N, L, BT, BL, BN,
                 PRECISION, B_EXACT, C_EXACT)


@triton.jit
def mamba2_verify_kernel(
    x,             # [B, T, NH, P]
    dt,            # [B, T, NH]
    A,             # [NH]
    Bm,            # [B, T, NG, N] (read with INLINE_SCORES only)
    C,             # [B, T, NG, N]
    D,             # [NH]
    ancestors,     # [B, T, T] uint8: [b, t, i] = 1 iff i is t or an ancestor of t
    num_nodes,     # [B]
    state_pool,    # [S, NH, P, N] fp32
    state_slots,   # [B]
    buf_b,         # [R, L, NG, N] fp32 (read with INLINE_SCORES only)
    buf_xdt,       # [R, L, NH, P] fp32
    buf_gcum,      # [R, L, NH] fp32
    buf_len,       # [R]
    req_slots,     # [B]
    s_tree,        # [B, NG, BT, BT] fp32 from the products pass (unless INLINE_SCORES)
    s_buf,         # [B, NG, BT, BL] fp32
    hc_in,         # [B, T, NH, P] fp32: h0 C_t from mamba2_verify_roles_kernel (HC_IN)
    y,             # [B, T, NH, P] fp32 out
    xdt_out,       # [B, T, NH, P] fp32 out
    gcum_out,      # [B, T, NH] fp32 out
    T,
    NH: tl.constexpr,
    NG: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    L: tl.constexpr,
    BT: tl.constexpr,
    BL: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,          # N columns per tl.dot step: whole-N tf32x3 operands spilled registers
    FMA_NODES: tl.constexpr,   # > 0: the state term one node at a time over this many nodes (T); 0: tl.dots
    INLINE_SCORES: tl.constexpr,
    N_LOOP: tl.constexpr,      # FMA_NODES == 0 or INLINE_SCORES: the loop over N slices has work
    HC_IN: tl.constexpr,       # the state term's h0 C^T read from hc_in (VerifyConfig.split_roles), no N loop
    PRECISION: tl.constexpr,
    B_EXACT: tl.constexpr,     # the nodes' B / C exact in TF32 (bf16 / fp16 values): products skip their remainders
    C_EXACT: tl.constexpr,
):
    i_p, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_g = i_h // (NH // NG)
    o_p = i_p * BP + tl.arange(0, BP)
    o_t = tl.arange(0, BT)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
    m_t = o_t < nn            # valid nodes; padding loads as 0 (inputs there may be NaN)
    m_out = o_t < T
    # h0 rows o_p of the state (no row for state slot -1: h0 = 0, never read); streamed once and not reused, so
    # evicted first to keep the small inputs in the L2
    p_h = state_pool + ((i_s * NH + i_h) * P + o_p[:, None]) * N
    m_h = o_p[:, None] < tl.where(i_s >= 0, P, 0)            # [BP, 1]: all rows, or none without a state
    p_c = C + ((i_b * T + o_t[None, :]) * NG + i_g) * N      # + n: C_t^T [N, BT]
    if FMA_NODES > 0:
        # the whole [BP, N] tile in one load, the first one issued, used last (below)
        b_h = tl.load(p_h + tl.arange(0, N)[None, :], mask=m_h, other=0., eviction_policy="evict_first")

    # the small loads of the tree and buffer terms, issued before the state's loop below and used after it
    n_buf = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
    b_dt = tl.load(dt + (i_b * T + o_t) * NH + i_h, mask=m_t, other=0.).to(tl.float32)
    b_A = tl.load(A + i_h).to(tl.float32)
    b_D = tl.load(D + i_h).to(tl.float32)
    m_it = m_t[:, None] & m_t[None, :]
    b_anc = tl.load(ancestors + (i_b * T + o_t[None, :]) * T + o_t[:, None], mask=m_it, other=0) != 0  # [i, t]
    g_last = tl.load(buf_gcum + (i_r * L + n_buf - 1) * NH + i_h, mask=n_buf > 0, other=0.)
    p_xt = ((i_b * T + o_t[None, :]) * NH + i_h) * P + o_p[:, None]
    b_x = tl.load(x + p_xt, mask=m_t[None, :], other=0.).to(tl.float32)                   # x^T [BP, BT]
    # the whole buffer as one block masked at buf_len (stale entries past it load as 0)
    o_l = tl.arange(0, BL)
    m_l = o_l < n_buf
    b_gi = tl.load(buf_gcum + (i_r * L + o_l) * NH + i_h, mask=m_l, other=0.)
    b_v = tl.load(buf_xdt + ((i_r * L + o_l[None, :]) * NH + i_h) * P + o_p[:, None], mask=m_l[None, :],
                  other=0.)                                                                 # [BP, BL]
    if INLINE_SCORES:
        b_st = tl.zeros([BT, BT], dtype=tl.float32)
        b_sb = tl.zeros([BL, BT], dtype=tl.float32)
    else:
        # scores^T [i, t] = C_t . B_i from the products pass, against the nodes and the buffer
        p_s = (i_b * NG + i_g) * BT + o_t[None, :]
        b_st = tl.load(s_tree + p_s * BT + o_t[:, None])                                   # [BT, BT]
        b_sb = tl.load(s_buf + p_s * BL + o_l[:, None], mask=m_l[:, None], other=0.)       # [BL, BT]

    # h0 C^T as tl.dots over N slices, a loop (not unrolled) that Triton pipelines: the slices of h0 stream in all
    # at once; inline, the scores C_t . B_i from the same slices of C
    b_hc = tl.zeros([BP, BT], dtype=tl.float32)
    if N_LOOP:
        for n0 in range(0, N, BN):
            o_n = n0 + tl.arange(0, BN)
            b_cn = tl.load(p_c + o_n[:, None], mask=m_t[None, :], other=0.).to(tl.float32)      # [BN, BT]
            if FMA_NODES == 0:
                b_hn = tl.load(p_h + o_n[None, :], mask=m_h, other=0., eviction_policy="evict_first")
                b_hc = add_product_exact(b_hc, b_hn, b_cn, PRECISION, False, C_EXACT)
            if INLINE_SCORES:
                b_kn = tl.load(Bm + ((i_b * T + o_t[:, None]) * NG + i_g) * N + o_n[None, :], mask=m_t[:, None],
                               other=0.).to(tl.float32)
                b_st = add_product_exact(b_st, b_kn, b_cn, PRECISION, B_EXACT, C_EXACT)
                b_kb = tl.load(buf_b + ((i_r * L + o_l[:, None]) * NG + i_g) * N + o_n[None, :], mask=m_l[:, None],
                               other=0.)
                b_sb = add_product_exact(b_sb, b_kb, b_cn, PRECISION, False, C_EXACT)

    if HC_IN:
        b_hc = tl.load(hc_in + p_xt, mask=m_t[None, :], other=0.)

    # Gl along root paths (rows i of the transposed ancestor mask are the sources, columns t the nodes), G, entries
    b_a = b_dt * b_A
    b_gl = tl.sum(tl.where(b_anc, b_a[:, None], 0.), 0)                                   # [BT], by t
    b_G = g_last + b_gl
    b_xdt = b_x * b_dt[None, :]
    b_y = b_D * b_x
    tl.store(xdt_out + p_xt, b_xdt, mask=m_out[None, :])

    # tree term: the scores kept for i in anc(t) + {t}
    b_decay = tl.exp(tl.where(b_anc, b_gl[None, :] - b_gl[:, None], float("-inf")))
    b_y = add_product(b_y, b_xdt, b_st * b_decay, PRECISION)

    # buffer term: e^{(G_last - G_i) + Gl_t} (C_t . B_i) xdt_i over the valid entries
    b_decay_buf = tl.exp(tl.where(m_l[:, None], (g_last - b_gi)[:, None] + b_gl[None, :], float("-inf")))
    b_y = add_product(b_y, b_v, b_sb * b_decay_buf, PRECISION)

    # state term on the FMA units, now that the tile has had the whole program to arrive
    if FMA_NODES > 0:
        o_n = tl.arange(0, N)
        for t in tl.static_range(FMA_NODES):       # unrolled: the C rows load together
            b_c = tl.load(C + ((i_b * T + t) * NG + i_g) * N + o_n, mask=o_n < tl.where(t < nn, N, 0), other=0.)
            b_hct = tl.sum(b_h * b_c.to(tl.float32)[None, :], 1)                            # [BP]
            b_hc += tl.where(o_t[None, :] == t, b_hct[:, None], 0.)
    b_y += tl.exp(b_G)[None, :] * b_hc

    tl.store(y + p_xt, b_y, mask=m_out[None, :])
    if i_p == 0:
        tl.store(gcum_out + (i_b * T + o_t) * NH + i_h, tl.where(m_t, b_G, 0.), mask=m_out)


@triton.jit
def mamba2_verify_roles_kernel(
    Bm, C,         # [B, T, NG, N]
    num_nodes,     # [B]
    buf_b,         # [R, L, NG, N] fp32
    buf_len,       # [R]
    req_slots,     # [B]
    state_pool,    # [S, NH, P, N] fp32
    state_slots,   # [B]
    s_tree,        # [B, NG, BT, BT] fp32 out (the products pass's)
    s_buf,         # [B, NG, BT, BL] fp32 out
    hc,            # [B, T, NH, P] fp32 out: h0 C_t (0 for rows without a state and at padding nodes)
    T,
    NH: tl.constexpr,
    NG: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    L: tl.constexpr,
    BT: tl.constexpr,
    BL: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,          # N columns per h0 step
    BNS: tl.constexpr,         # N columns per scores step
    PRECISION: tl.constexpr,
    B_EXACT: tl.constexpr,     # the nodes' B / C exact in TF32 (bf16 / fp16 values): products skip their remainders
    C_EXACT: tl.constexpr,
):
    """VerifyConfig.split_roles' first launch, a grid of (NH P / BP state programs + NG score programs, B): state
    programs stream h0 and compute its product with the nodes' C, nothing else (the state pass's N loop); score
    programs are the products pass's, side by side with them. Then mamba2_verify_kernel (HC_IN) adds the rest."""
    i_q, i_b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    NS: tl.constexpr = NH * (P // BP)
    if i_q < NS:
        i_h = i_q // (P // BP)
        i_g = i_h // (NH // NG)
        o_p = (i_q % (P // BP)) * BP + tl.arange(0, BP)
        o_t = tl.arange(0, BT)
        i_s = tl.load(state_slots + i_b).to(tl.int64)
        nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
        m_t = o_t < nn
        p_h = state_pool + ((i_s * NH + i_h) * P + o_p[:, None]) * N
        m_h = o_p[:, None] < tl.where(i_s >= 0, P, 0)            # [BP, 1]: all rows, or none without a state
        p_c = C + ((i_b * T + o_t[None, :]) * NG + i_g) * N      # + n: C_t^T [N, BT]
        b_hc = tl.zeros([BP, BT], dtype=tl.float32)
        for n0 in range(0, N, BN):
            o_n = n0 + tl.arange(0, BN)
            b_cn = tl.load(p_c + o_n[:, None], mask=m_t[None, :], other=0.).to(tl.float32)      # [BN, BT]
            b_hn = tl.load(p_h + o_n[None, :], mask=m_h, other=0., eviction_policy="evict_first")
            b_hc = add_product_exact(b_hc, b_hn, b_cn, PRECISION, False, C_EXACT)
        tl.store(hc + ((i_b * T + o_t[None, :]) * NH + i_h) * P + o_p[:, None], b_hc, mask=(o_t < T)[None, :])
    else:
        group_scores(Bm, C, num_nodes, buf_b, buf_len, req_slots, s_tree, s_buf, i_q - NS, i_b, T, NG, N, L, BT, BL,
                     BNS, PRECISION, B_EXACT, C_EXACT)


def verify_blocks(T: int, L: int) -> tuple[int, int]:
    """BT, BL: the node and buffer counts padded to powers of two >= 16 (tl.dot's smallest)."""
    return max(16, triton.next_power_of_2(T)), max(16, triton.next_power_of_2(L))


def verify_scratch_bytes(T: int, L: int, NG: int) -> int:
    """Bytes of products-pass scratch one request's verify of T nodes takes in one layer (none for the one-launch
    small batches): the group's scores against the nodes and the buffer. Not a state: a state is [NH, P, N]."""
    BT, BL = verify_blocks(T, L)
    return 4 * NG * BT * (BT + BL)


def mamba2_verify_fwd(x, dt, A, Bm, C, D, parents, num_nodes, state_pool, state_slots, buf_b, buf_xdt, buf_gcum,
                      buf_len, req_slots, ancestors, config: VerifyConfig | None = None):
    """Launcher: checks, ancestor mask, allocation, grids. config: verify_config's unless given (the sweep's)."""
    NH, NG, P, N, L = check_pools(state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots)
    B = req_slots.shape[0]
    if parents.dim() != 2 or parents.shape[0] != B or num_nodes.shape != (B,):
        raise ValueError(f"expected parents [B, T] and num_nodes [B] with B = {B}, got {tuple(parents.shape)} and "
                         f"{tuple(num_nodes.shape)}")
    T = parents.shape[1]
    if not 1 <= T <= MAX_NODES:
        raise ValueError(f"trees of 1 to {MAX_NODES} nodes, got T = {T}")
    check_tokens((B, T), NH, NG, P, N, x=x, dt=dt, A=A, Bm=Bm, C=C, D=D)
    check_indices(parents=parents, num_nodes=num_nodes)
    if ancestors is None:
        ancestors = ancestor_mask(parents, num_nodes, check=False)  # no host sync (CUDA graphs)
    elif ancestors.shape != (B, T, T) or ancestors.dtype != torch.bool or not ancestors.is_contiguous():
        raise ValueError(f"ancestors must be a contiguous [B, T, T] = {(B, T, T)} bool mask, got "
                         f"{tuple(ancestors.shape)} {ancestors.dtype}")
    new = partial(torch.empty, dtype=torch.float32, device=x.device)
    y, xdt, gcum = new(B, T, NH, P), new(B, T, NH, P), new(B, T, NH)
    if B == 0:
        return y, xdt, gcum
    cfg = config or verify_config(B, T, P)
    precision = cfg.precision or DOT_PRECISION
    exact = dict(B_EXACT=exact_in_tf32(Bm), C_EXACT=exact_in_tf32(C))  # (bf16 / fp16 B and C: the model's, uncast)
    BT, BL = verify_blocks(T, L)
    BP = min(P, cfg.block_p)
    split = cfg.split_roles and cfg.state_dot and not cfg.inline_scores
    hc = y                                                                  # a stand-in, not read (unless split)
    if cfg.inline_scores:
        s_tree = s_buf = y                                                  # stand-ins, not read
    elif split:  # h0's stream and the scores side by side (VerifyConfig.split_roles), the rest below
        s_tree, s_buf, hc = new(B, NG, BT, BT), new(B, NG, BT, BL), new(B, T, NH, P)
        mamba2_verify_roles_kernel[(NH * (P // BP) + NG, B)](
            Bm, C, num_nodes, buf_b, buf_len, req_slots, state_pool, state_slots, s_tree, s_buf, hc, T,
            NH=NH, NG=NG, P=P, N=N, L=L, BT=BT, BL=BL, BP=BP, BN=min(N, cfg.block_n),
            BNS=min(N, PRODUCTS_BLOCK_N), PRECISION=precision, **exact, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, **register_cap(cfg.roles_max_registers),
        )
    else:
        s_tree, s_buf = new(B, NG, BT, BT), new(B, NG, BT, BL)
        mamba2_verify_products_kernel[(NG, B)](
            Bm, C, num_nodes, buf_b, buf_len, req_slots, s_tree, s_buf, T,
            NG=NG, N=N, L=L, BT=BT, BL=BL, BN=min(N, PRODUCTS_BLOCK_N), PRECISION=precision, **exact,
            num_warps=PRODUCTS_WARPS,
        )
    # (the split's second launch holds no N loop: its own P rows a program and warps, VerifyConfig.finish_*)
    BPF, warps = (min(P, cfg.finish_block_p or BP), cfg.finish_warps or cfg.num_warps) if split else (BP, cfg.num_warps)
    if split and (P % BPF or BPF < min(P, 16)):
        raise ValueError(f"the split verify's second launch's P rows a program ({BPF}) must divide P ({P}) and be at "
                         f"least 16 (tl.dot's smallest side)")
    mamba2_verify_kernel[(P // BPF, NH, B)](
        x, dt, A, Bm, C, D, ancestors.view(torch.uint8), num_nodes, state_pool, state_slots, buf_b, buf_xdt,
        buf_gcum, buf_len, req_slots, s_tree, s_buf, hc, y, xdt, gcum, T,
        NH=NH, NG=NG, P=P, N=N, L=L, BT=BT, BL=BL, BP=BPF, BN=min(N, cfg.block_n),
        FMA_NODES=0 if cfg.state_dot else T, INLINE_SCORES=cfg.inline_scores,
        N_LOOP=(cfg.state_dot or cfg.inline_scores) and not split, HC_IN=split, PRECISION=precision, **exact,
        num_warps=warps, num_stages=cfg.num_stages, **register_cap(cfg.finish_max_registers if split else None),
    )
    return y, xdt, gcum


def mamba2_verify(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    Bm: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_b: torch.Tensor,
    buf_xdt: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
    ancestors: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A token tree per row on top of its committed h0 + buffer; writes nothing, forms no per-node state (as
    mamba2_verify_ref).

    x: [B, T, NH, P]; dt: [B, T, NH] (softplus'ed); A: [NH]; Bm, C: [B, T, NG, N]; D: [NH] (fp32 / bf16 / fp16);
    parents: [B, T] and num_nodes: [B] (verify_kernels.tree; T <= 64); pools as in mamba2_decode; ancestors:
    [B, T, T] bool, verify_kernels.tree.ancestor_mask(parents, num_nodes) shared by the layers of a step, or None
    (computed here, without validating the trees). Returns y [B, T, NH, P] and the nodes' buffer entries
    xdt [B, T, NH, P] and gcum [B, T, NH], float32, zeros at padding nodes.
    """
    return mamba2_verify_fwd(x, dt, A, Bm, C, D, parents, num_nodes, state_pool, state_slots, buf_b, buf_xdt,
                             buf_gcum, buf_len, req_slots, ancestors)
