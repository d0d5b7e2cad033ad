"""Triton kernels for the Gated DeltaNet KVBuffer tree verify: a token tree per row (up to 64 nodes, ragged) on top
of its committed state S0 and buffer, no per-node state. Semantics, shapes and pool layout:
verify_kernels.gdn.naive.gdn_verify_ref (the oracle); the math: docs/design.md section 2.

The math per row and value head, nodes padded to BT (a power of two >= 16 for tl.dot), buffer entries to BL:
  a. products over K among the nodes' keys and queries and against the buffer's keys (k.k, q.k), per key head;
  b. node G = G of the last buffered entry + (ancestors incl. self) @ g; decays e^{G_t - G_i} on root paths;
  c. M = (I + diag(beta) A)^-1 with A[t, i] = e^{G_t - G_i} (k_t . k_i) for i a strict ancestor of t: A is strictly
     lower triangular (parents come first), so forward substitution on the identity, num_nodes - 1 column steps;
     P = (q_t . k_i) e^{G_t - G_i} on ancestors incl. self;
  d. the buffer's share of the reads (x_t . k_i) e^{G_t - G_i} @ u_i (x = k, q): kr, qr; w = beta (v - kr);
  e. S0's share, S0^T k_t and S0^T q_t, then u = M (w - beta e^G S0^T k), o = qr + e^G S0^T q + P u.
Everything but e. is latency-bound and needs no S0; e. streams S0 (bound by memory); a.-e. as jitted helpers in
tree_math.py. Two kernels for large batches (the state pass's in verify_state.py):
  the state pass first, one program per (row, key head, V block): the [G, K, BV] tiles of S0 of the key head's G
    value heads, read once in one load (not at all for rows without a state), multiplied with every node's k and q
    (each loaded once for the G heads, the next node's in flight during this node's products): S0^T k_t and S0^T q_t
    into a scratch [B, T, HV, V] each; past FMA_MAX_NODES nodes as tensor-core dots, one value head per program;
  the tree pass, one program per (row, key head): a. once for the key head's value heads, then b.-d. per value head
    and e. from the state pass's products: it writes u, o and G, final.
Bytes per row at Qwen3.5-9B shapes, 4-chain: S0 2 MiB read once; the scratch 128 KiB, written once and read once
(12% of S0's bytes). The state pass holds no tree math, so it streams S0 like the fold; the tree pass holds no S0.
Before (2026-12-01, H200, batch 256, 4-chain: 546 us), the tree pass ran first and the state pass finished u and o
from a [T, T] M and P per value head, with tl.dot layouts and the nodes' tiles built by selects in the S0 stream
(3.7 ms per step in the engine at batch 128 against 1.0 ms for S0); the three-pass verify before it (410 us) read S0
like this state pass, per value head, and spent the rest in a products pass and a tree pass per value head.
Up to FUSED_MAX_BATCH rows, where launches cost more than bytes, one kernel does it all per (row, value head,
V block) in one launch (verify_fused.py).
Tiles are [BV, BT], V columns first: with the nodes first, tl.dot's layout for 16-row operands put a copy of every
tile in each warp. Products over K go BK columns at a time: a whole [BT, K] operand sits in every warp.
Decays are exponentiated only as G differences <= 0 (or a single G), masked pairs set to -inf first. Padding nodes
and stale buffer entries are selected away after loading (whatever they hold), so they add nothing and padding
nodes come out as zeros.
"""

from functools import partial

import torch
import triton
import triton.language as tl

from verify_kernels.gdn.decode import INDEX_DTYPES, INPUT_DTYPES, check_heads, check_pools, check_shape, check_tensors
from verify_kernels.gdn.tree_math import (
    buffer_reads,
    finish,
    head_weights,
    node_inputs,
    node_products,
    row_halves,
    stacked_buffer_reads,
    stacked_node_products,
    stacked_rows,
)
from verify_kernels.gdn.verify_fused import gdn_verify_fused_kernel
from verify_kernels.gdn.verify_small import gdn_verify_small_tree_kernel
from verify_kernels.gdn.verify_small import node_block as small_node_block
from verify_kernels.gdn.verify_small import scratch_floats as small_scratch_floats
from verify_kernels.gdn.verify_state import gdn_verify_state_kernel
from verify_kernels.precision import exact_in_tf32
from verify_kernels.registers import register_cap
from verify_kernels.tree import ancestor_mask

# Launch parameters (benchmarks/sweep_gdn.py times the candidates on the GPU). State pass up to FMA_MAX_NODES
# nodes (one node at a time on the FMA units): V columns per program and warps, STATE_SHARE_KEY_HEAD: a program
# per key head ([G, K, BV] tiles, each node's k and q loaded once for its G value heads) or per value head. Beyond
# FMA_MAX_NODES, dots over STATE_BLOCK_K rows of S0 at a time, per value head, by BT: V columns, warps. The tree
# pass, latency-bound, wants many programs per SM more than warps per program (an earlier one measured 2 warps
# faster than 4 on the H200). Registers per thread for sm_90 (python -m benchmarks.gdn_registers, Triton 3.9's
# compiler): state pass 114 (4-chain), 122 (16-node tree); tree pass 250 at 32 columns per step and 2 warps, 249
# at 64 and 4 warps, spilling at 64 and 2 warps (the last sweep's best before the finish of u and o moved in; 168
# registers then). Products over K in steps of PRODUCTS_BLOCK_K columns, PRODUCTS_STAGES of them in flight (3: 1 and 2
# stages 121.3 and 105.6 us against 100.1 for 4-chains at batch 64, H200 2026-12-03, seventh sitting). Never
# 8 warps for 64-node blocks: with tf32x3 products Triton 3.6 built a kernel that made illegal memory accesses on
# the H200 (an earlier tree pass). 64-node blocks spill registers (rare trees; correct, not tuned). The fused
# kernel: by BT, V columns and warps; one launch won only at batch 1 in the last sweep. The FMA state pass, H200
# sweep of 2026-12-02 (4-chain at batch 256): per value head at 64 columns and 2 warps 373 us, per key head at 32
# and 4 (the previous default) 471 us, per key head at 32 and 2 375 us: the warps, not the sharing, decide.
FUSED_MAX_BATCH = 1
# FUSED_SPLIT_TF32: the one-launch kernel's products from operands split by a mask (verify_kernels/precision.py):
# batch 1 is a chain of dependent steps, so fewer instructions in it are less latency. On: the H200 sweep of
# 2026-12-03, eighth sitting (sweeps_h200/sweep_gdn_verify1_2026-12-03h.txt), batch 1 at 12.5 / 16.1 us for a
# 4-chain / 16-node tree against 12.6 / 17.3 with Triton's tf32x3.
FUSED_SPLIT_TF32 = True
STATE_FMA_CONFIG = (64, 2)
# Tried around it on the H200 (2026-12-04, twelfth session: sweeps_h200/sweep_gdn_chains_2026-12-04e.txt, 4-chains at
# batch 64 / 128 / 256, the whole verify 81.1 / 154.5 / 296.4 us at these defaults): one warp at 32 columns (K no
# longer across warps, so no sums over K through shared memory) the same, 81.2 / 155.5 / 302.2; the 4-chain through
# the state dots at BT 16 94.3 / 179.4 / 349.3 at best; S0's tiles through TMA as the fold reads them, a program per
# V block or 2-4 V blocks a program in a pipelined loop, 90.4-93.5 / 159.6-170.7 / 300.8-327.7 (commit 172d860 holds
# that variant, reverted after the sweep). And the two passes side by side on two streams (benchmarks/
# probe_verify_overlap.py): 290.0 us at batch 256 against 300.2 in turn, both passes contend for the same issue slots.
# STATE_SPLIT_TF32: the state pass's dots (trees past FMA_MAX_NODES) in tf32x3 from operands split by a mask
# (verify_kernels/precision.py, as TREE_SPLIT_TF32), whose plain TF32 products Triton may run as warpgroup MMAs at 4
# warps. On, with the 16-node dots at 128 columns on 4 warps: the H200 sweep of 2026-12-03, eighth sitting
# (sweeps_h200/sweep_gdn_verify_2026-12-03h.txt), 16-node trees at batch 64 / 256 at 128.7 / 464.3 us against
# 137.0 / 514.0 with Triton's tf32x3 at 64 columns (its dots at 64 columns split: 127.7 / 468.1).
STATE_SPLIT_TF32 = True
STATE_SHARE_KEY_HEAD = False
STATE_DOT_CONFIGS = {16: (128, 4), 32: (64, 4), 64: (32, 4)}
# STATE_DOT_MAX_REGISTERS: by BT, a cap on the state pass's registers a thread where it runs tl.dots, or None
# (docs/design.md 5.6). At BT 16 (Triton 3.6, sm_90) 136 registers on 4 warps, 3 programs an SM; capped at 128 no
# spill and 4. The H100 sweep of 2026-12-05, twenty-third session (sweeps_h100/sweep_gdn_verify_verify1_decode_
# 2026-12-05.txt; no H200 was lent): 16-node trees at batch 64 / 256 127.5 / 461.1 us against 139.0 / 496.1
# uncapped (2 stages of STATE_DOT_STAGES: 130.5 / 483.1), 4-chains unchanged. Per block: other tiles, other counts.
STATE_DOT_MAX_REGISTERS = {16: 128, 32: None, 64: None}
# STATE_DOT_STAGES: by BT, the dots' loop over K of STATE_BLOCK_K rows unrolled (0) or software-pipelined by Triton
# in that many stages (S0's slices into shared memory by cp.async ahead of their products, as the Mamba2 verify
# streams h0). Unrolled, each slice's loads are issued during the slice before's products (sm_90, Triton 3.6): one
# slice of 16 KiB in flight a program, 3 programs an SM; the H200 probe of 2026-12-04
# (sweeps_h200/probe_verify_overlap_2026-12-04e.txt) timed the 16-node state pass at 141 us at batch 128: S0's 256
# MiB at 45% of copy bandwidth. Pipelined in 3 stages at 128 columns: two slices ahead, 124 registers, 4 programs an
# SM (at 64 columns 78 and 6). Sweep candidates at BT 16 (sweep_gdn --ops verify).
STATE_DOT_STAGES = {16: 0, 32: 0, 64: 0}
# TREE_DOT_MAX_REGISTERS: by BT, the same for the tree pass of trees past FMA_MAX_NODES (TREE_CONFIG). Latency-bound,
# at BT 16 on bf16 q and k (Triton 3.6, sm_90) 106 registers, 9 programs an SM; capped at 96 ten, at 88 eleven (its
# 18 KiB of shared memory allows 11), 16 bytes spilled either way: sweep candidates (sweep_gdn --ops verify).
TREE_DOT_MAX_REGISTERS = {16: None, 32: None, 64: None}
FUSED_CONFIGS = {16: (16, 2), 32: (32, 4), 64: (32, 4)}
# FUSED_LOADS_FIRST: the one-launch kernel (verify_fused.py) issues every load once the slots are in, two round trips
# to memory before its products where there were five (its docstring). Written on the CPU on 2026-12-05 (twenty-second
# session); the H100 sweep of 2026-12-05, twenty-third session (the file above): batch 1 at 9.6 / 10.7 us for a
# 4-chain / 16-node tree with 16 columns a program on 2 warps (FUSED_CONFIGS[16]), 9.8 / 11.2 at 32 on 4, against
# 11.3 / 14.4 for the kernel before at 32 on 4 (11.1 / 14.4 at 16 on 2).
FUSED_LOADS_FIRST = True
# The tree pass's V columns and warps: TREE_SMALL_CONFIG up to FMA_MAX_NODES nodes (the chains), TREE_CONFIG past
# them. With the operands split by a mask (TREE_SPLIT_TF32) the chains' pass holds 221 registers at 64 columns on 2
# warps and the H200 sweep of 2026-12-03, eighth sitting (sweeps_h200/sweep_gdn_verify_2026-12-03h.txt), timed
# 4-chains at batch 64 / 256 at 82.9 / 304.2 us against 88.1 / 327.4 at 32 columns (94.0 / 354.4 at 32 columns with
# Triton's tf32x3); 16-node trees at 64 columns 146.9 / 554.4 against 136.8 / 502.0 at 32, so they keep 32.
TREE_SMALL_CONFIG = (64, 2)
TREE_CONFIG = (32, 2)
# The tree pass's value heads per program: all of a key head's (None: they share the key head's products over K,
# computed once) or fewer (each program recomputes its key head's products, but its serial chain is shorter and
# there are more programs to hide one another's latency: the pass is latency-bound, ncu 2026-12-03). Up to
# FMA_MAX_NODES nodes TREE_HEADS_PER_PROGRAM, past them TREE_DOT_HEADS_PER_PROGRAM. The H200 sweep of 2026-12-03
# (benchmarks/results/sweeps_h200/sweep_gdn_rowloops_2026-12-03.txt, Qwen3.5-9B shapes): one value head per program
# 554.6 / 149.6 us for 16-node trees at batch 256 / 64 against 576.0 / 150.7 shared (168 registers against 255), but
# 410.7 / 111.1 for 4-chains against 373.4 / 100.4.
TREE_HEADS_PER_PROGRAM = None
TREE_DOT_HEADS_PER_PROGRAM = 1
FMA_MAX_NODES = 8
STATE_BLOCK_K = 32
# STACKED_PRODUCTS: the tree pass's products over K with the nodes' keys and queries stacked ([k; q], 2 BT rows), two
# products a step of PRODUCTS_BLOCK_K columns where there were four, split into halves once after the last step.
# The pass is issue-bound (ncu on the H200, 2026-12-03, batch 128, 4-chains: 42 M instructions, 1.5 a cycle an SM,
# 249 registers, 2 of 16 warps a scheduler active); each tl.dot of [16, 16] tiles in tf32x3 carries its operands'
# splits and layout conversions, which the stacking halves for the products over K. Written and checked in the
# interpreter on 2026-12-03. Compiled for sm_90 (benchmarks.gdn_registers, Triton 3.9, 4-chain, 32 columns, 2
# warps): 168 registers and 8 bytes spilled, against 250 and none unstacked (with STACKED_READS too: the same). On:
# the H200 sweep of 2026-12-03, seventh sitting (sweeps_h200/sweep_gdn_verify_stacked_2026-12-03g.txt), verify at
# batch 64 / 256 94.5 / 354.4 us for 4-chains and 137.6 / 518.0 for 16-node trees, against 100.1 / 375.9 and 150.1
# / 555.3 unstacked; K steps of 32 the same; 64 columns on 4 warps 100.2 / 365.9.
STACKED_PRODUCTS = True
# STACKED_READS: the buffer's reads of the tree pass's V loop, kr and qr, as one product of the value block's buffer
# entries with the stacked decayed products [k.kB; q.kB] e^dG ([BV, BL] . [BL, 2 BT]): three tl.dot a V block
# instead of four. Takes the stacked products with it (STACKED_PRODUCTS' products over K). Written and checked in the
# interpreter on 2026-12-03. Off: the same sweep timed it at 98.1 / 368.3 us (4-chains) and 138.6 / 521.0 (trees),
# behind the stacked products alone.
STACKED_READS = False
# TREE_SPLIT_TF32: the tree pass's tf32x3 products with their operands split by a mask instead of Triton's rounding
# (tree_math.products, "tf32x3-split"). sm_90 SASS of the 4-chain tree pass (Triton 3.9, compiled here, stacked
# products): the roundings' infinity tests, selects, adds and masks take much of its loops, where the pass is
# issue-bound (ncu, H200, 2026-12-03: 83 M instructions at batch 256); split by mask, the loop over K goes from 243
# to 140 instructions a step and the V loop from ~650 to ~475 a block (about 27% fewer instructions a program in
# all), at the same 168 registers (the operand split after its transpose; before it, 218).
# On: the H200 sweep of 2026-12-03, eighth sitting (sweeps_h200/sweep_gdn_verify_2026-12-03h.txt), checked at
# 8.8e-7 relative error (Triton's tf32x3 3.3e-7; the checks' tolerance 1e-4) and timed as TREE_SMALL_CONFIG says.
TREE_SPLIT_TF32 = True
# PRODUCTS_BLOCK_K: the two-pass tree pass's K step. 32 (110 registers, from 96 at 16, as the H200's Triton 3.6 built
# them for the sweep): H200 2026-12-04
# (sweeps_h200/sweep_gdn_2026-12-04c.txt), 4-chains at batch 64 / 256 81.5 / 297.2 us against 83.5 / 307.1 at 16,
# 16-node trees 125.0 / 452.3 against 129.0 / 451.9. The one-launch kernel (batch 1) keeps FUSED_PRODUCTS_BLOCK_K,
# the step it was timed at.
PRODUCTS_BLOCK_K = 32
FUSED_PRODUCTS_BLOCK_K = 16
PRODUCTS_STAGES = 3
# SMALL_TREE_PASS: trees up to SMALL_TREE_MAX_NODES nodes (the engine's chains: a 4-token chain verifies 5 nodes)
# take the tree pass node by node on the FMA units (verify_small.py), its products over K on the tensor cores, at
# SMALL_TREE_CONFIG (below) with SMALL_TREE_HEADS_PER_PROGRAM value heads a program (None: a key head's). By its sm_90
# code (benchmarks.gdn_registers, the H200's Triton 3.6 on the CPU, Qwen3.5-9B heads, 16 buffer entries, 128
# columns on one warp, 5 nodes) ~5.8 k instructions a program against ~12.3 k for the tensor-core pass (2 warps,
# issue-bound by ncu on the H200, 2026-12-03); its node body holds no shuffle (the sums run over a thread's own
# registers), unlike TREE_FMA (docs/design.md 5.3 and 6). On: the H200 sweep of 2026-12-05
# (sweeps_h200/sweep_gdn_smalltree_2026-12-05a.txt) timed 4-chains at batch 64 / 128 / 256 at 64.2 / 121.4 / 229.8
# us against 81.2 / 152.7 / 294.0 for the tensor-core pass, 5-chains 83.7 / 148.8 / 279.4 against 88.9 / 166.6 /
# 321.6, 8-node trees 116.1 / 200.9 / 370.0 against 113.0 / 209.2 / 395.2, a value head a program (134 registers;
# a key head's two: 218) at 128 columns on one warp. Below SMALL_TREE_FEW_ROWS rows the same sweep timed batch 16
# (programs split along V, SMALL_TREE_FEW_ROWS_CONFIG (32, 1, 4)) slower than the tensor-core pass (4-chains 32.2 us
# against 30.2, 8-node trees 47.4 against 39.6), so there the tensor-core pass runs (None). 16-node trees keep the
# tensor-core pass: node by node a 16-node tree issues ~1.4x its instructions (docs/design.md 5.3).
# SMALL_TREE_CONFIG: V columns a block, warps, programs along V (each takes V // programs columns, a block at a time,
# and computes its own products over K and weights); SMALL_TREE_FEW_ROWS_CONFIG the same below SMALL_TREE_FEW_ROWS
# rows, or None: the tensor-core pass there.
SMALL_TREE_PASS = True
SMALL_TREE_MAX_NODES = 8
SMALL_TREE_CONFIG = (128, 1, 1)
SMALL_TREE_FEW_ROWS = 64
SMALL_TREE_FEW_ROWS_CONFIG = None
SMALL_TREE_HEADS_PER_PROGRAM = 1
SMALL_TREE_BLOCK_K = 32
# SMALL_TREE_MAX_REGISTERS: a cap on the pass's registers a thread (Triton's maxnreg), or None: its one-warp
# programs are latency-bound and run in waves, 15 an SM at 134 registers, 16 at 128 (no spill; docs/design.md 5.3,
# 5.6). The H200 sweep of 2026-12-05 (sweeps_h200/sweep_gdn_smalltree_cap_2026-12-05d.txt): 5-node chains at batch
# 64 / 128 / 256 75.1 / 141.4 / 270.4 us capped against 84.5 / 149.4 / 281.9; 120 registers no better.
SMALL_TREE_MAX_REGISTERS = 128
# fp32 products: "ieee" runs them on the FMA units; "tf32x3" on the tensor cores in three TF32 passes, which keeps
# fp32-level error (~1e-7 relative here) at a fraction of the time.
DOT_PRECISION = "tf32x3"

MAX_NODES = 64


def products_precision(split: bool) -> str:
    """A pass's PRECISION constexpr: tf32x3 from operands split by a mask where its *_SPLIT_TF32 setting asks for
    it and the products are tf32x3 at all (DOT_PRECISION "ieee" stays ieee)."""
    return "tf32x3-split" if split and DOT_PRECISION == "tf32x3" else DOT_PRECISION


@triton.jit
def gdn_verify_tree_kernel(
    q, k, v, g, beta,   # [B, T, H, K], [B, T, H, K], [B, T, HV, V], [B, T, HV], [B, T, HV]
    ancestors,          # [B, T, T] uint8: [b, t, i] = 1 iff i is t or an ancestor of t
    num_nodes,          # [B]
    state_slots,        # [B]
    kS, qS,             # [B, T, HV, V] fp32: S0^T k_t, S0^T q_t from the state pass (rows with a state)
    buf_k,              # [R, L, H, K] fp32
    buf_u,              # [R, L, HV, V] fp32
    buf_gcum,           # [R, L, HV] fp32
    buf_len,            # [R]
    req_slots,          # [B]
    o, u,               # [B, T, HV, V] fp32 out
    gcum,               # [B, T, HV] fp32 out
    T,                  # not constexpr: tree sizes change every step; only BT picks a compiled kernel
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BT: tl.constexpr,
    BL: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    NG: tl.constexpr,   # GP padded to a power of two
    PRECISION: tl.constexpr,
    PRODUCTS_STAGES: tl.constexpr,
    GP: tl.constexpr,   # value heads per program, of one key head (TREE_HEADS_PER_PROGRAM)
    STACKED: tl.constexpr,  # the keys' and queries' products stacked (STACKED_PRODUCTS)
    STACKED_READS: tl.constexpr,  # ... and the buffer's reads kr and qr one product (STACKED_READS, needs STACKED)
    EXACT: tl.constexpr,  # q and k exact in TF32 (bf16 / fp16): their products skip the remainders' (precision.py)
):
    i_hp, i_b = tl.program_id(0), tl.program_id(1)
    i_h0 = i_hp * GP
    i_hk = i_h0 // (HV // H)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    nn = tl.minimum(tl.load(num_nodes + i_b).to(tl.int32), T)
    n = tl.minimum(tl.load(buf_len + i_r).to(tl.int32), L)
    o_t = tl.arange(0, BT)
    m_T = o_t < T
    m_n = (o_t < nn)[None, :]
    # the program's value heads' g, beta and buffer G (NG columns, the first GP of them real)
    b_g2, b_beta2, b_anc, b_bg2 = node_inputs(g, beta, ancestors, buf_gcum, i_b, i_r, i_h0, n, nn, T, HV, L, BT, BL,
                                              GP, NG)
    if STACKED:
        b_kk, b_qk, b_xB = stacked_node_products(q, k, buf_k, i_b, i_r, i_hk, n, nn, T, H, K, L, BT, BL, BK,
                                                 PRECISION, PRODUCTS_STAGES, EXACT)
        if not STACKED_READS:
            b_kB, b_qB = row_halves(b_xB, BT, BL)
    else:
        b_kk, b_qk, b_kB, b_qB = node_products(q, k, buf_k, i_b, i_r, i_hk, n, nn, T, H, K, L, BT, BL, BK, PRECISION,
                                               PRODUCTS_STAGES, EXACT)
    o_g = tl.arange(0, NG)
    for i_g in tl.static_range(GP):
        i_h = i_h0 + i_g
        b_beta = tl.sum(tl.where(o_g[None, :] == i_g, b_beta2, 0.), 1)
        b_G, b_dB, b_M, b_P = head_weights(tl.sum(tl.where(o_g[None, :] == i_g, b_g2, 0.), 1), b_beta, b_anc,
                                           tl.sum(tl.where(o_g[None, :] == i_g, b_bg2, 0.), 1), b_kk, b_qk, n, nn, BT,
                                           BL)
        tl.store(gcum + (i_b * T + o_t) * HV + i_h, tl.where(o_t < nn, b_G, 0.), mask=m_T)
        if STACKED_READS:
            b_xBd = b_xB * stacked_rows(b_dB, BT, BL)                                        # [2 BT, BL]
        for i_v in tl.range(0, V, BV, num_stages=PRODUCTS_STAGES):
            o_v = i_v + tl.arange(0, BV)
            p_n = ((i_b * T + o_t[None, :]) * HV + i_h) * V + o_v[:, None]
            # (loaded first: in flight during the buffer's reads)
            b_kS = tl.zeros([BV, BT], dtype=tl.float32)
            b_qS = tl.zeros([BV, BT], dtype=tl.float32)
            if i_s >= 0:
                b_kS = tl.load(kS + p_n, mask=m_n, other=0.)
                b_qS = tl.load(qS + p_n, mask=m_n, other=0.)
            if STACKED_READS:
                b_w, b_qr = stacked_buffer_reads(v, buf_u, b_xBd, b_beta, i_b, i_r, i_h, n, nn, o_v, T, HV, V, L,
                                                 BT, BL, BV, PRECISION)
            else:
                b_w, b_qr = buffer_reads(v, buf_u, b_kB, b_qB, b_dB, b_beta, i_b, i_r, i_h, n, nn, o_v, T, HV, V, L,
                                         BT, BL, PRECISION)
            b_u, b_o = finish(b_w, b_qr, b_kS, b_qS, b_G, b_beta, b_M, b_P, PRECISION)
            tl.store(u + p_n, b_u, mask=m_T[None, :])
            tl.store(o + p_n, b_o, mask=m_T[None, :])


def verify_blocks(T: int) -> int:
    """A node or buffer-entry count padded to a power of two >= 16 (tl.dot's smallest)."""
    return max(16, triton.next_power_of_2(T))


def small_tree_config(B: int, T: int) -> tuple[int, int, int] | None:
    """The small trees' tree pass's (columns a block, warps, programs along V) for B rows of T nodes, or None where
    the tensor-core tree pass runs (SMALL_TREE_PASS off, trees past SMALL_TREE_MAX_NODES, few rows without a config
    of their own)."""
    if not SMALL_TREE_PASS or T > SMALL_TREE_MAX_NODES:
        return None
    return SMALL_TREE_FEW_ROWS_CONFIG if B < SMALL_TREE_FEW_ROWS else SMALL_TREE_CONFIG


def verify_scratch_bytes(T: int, H: int, HV: int, V: int, L: int, B: int) -> int:
    """Bytes one request's verify of T nodes writes in one layer besides o, on an L-entry buffer, in a batch of B
    rows: the nodes' buffer entries u and G, and (batches over FUSED_MAX_BATCH, rows with a state) S0^T k and S0^T q
    between the passes, and the small trees' tree pass's own scratch where it runs (SMALL_TREE_PASS). None of it is a
    state: a state is [HV, K, V]."""
    small = 0
    config = small_tree_config(B, T)
    if B > FUSED_MAX_BATCH and config is not None:
        per_program = SMALL_TREE_HEADS_PER_PROGRAM or HV // H
        v_programs = config[2]
        small = (HV // per_program * v_programs
                 * small_scratch_floats(small_node_block(T), verify_blocks(L), per_program))
    return 4 * (T * HV * V + T * HV + 2 * T * HV * V + small)


def gdn_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_k: torch.Tensor,
    buf_u: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
    ancestors: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A token tree per row on top of its committed S0 + buffer; writes nothing, forms no per-node state
    (gdn_verify_ref).

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g, beta: [B, T, HV] (fp32, bf16 or fp16); parents: [B, T] and
    num_nodes: [B] int32 / int64 (verify_kernels.tree; T <= 64); pools as in gdn_decode. ancestors: [B, T, T]
    bool, verify_kernels.tree.ancestor_mask(parents, num_nodes), shared by the layers of a step; computed here
    when None, which validates the trees and so synchronises with the device: pass it under CUDA graphs.
    Returns o [B, T, HV, V] and the nodes' buffer entries u [B, T, HV, V] and gcum [B, T, HV], float32, zeros at
    padding nodes.
    """
    B, T = q.shape[:2]
    H, HV, K, V = check_heads(q, k, v)
    if not 1 <= T <= MAX_NODES:
        raise ValueError(f"T must be in [1, {MAX_NODES}], got {T}")
    check_shape("q", q, (B, T, H, K))
    check_shape("v", v, (B, T, HV, V))
    check_shape("g", g, (B, T, HV))
    check_shape("beta", beta, (B, T, HV))
    check_shape("parents", parents, (B, T))
    check_shape("num_nodes", num_nodes, (B,))
    check_tensors(INPUT_DTYPES, q=q, k=k, v=v, g=g, beta=beta)
    check_tensors(INDEX_DTYPES, parents=parents, num_nodes=num_nodes)
    L = check_pools(B, H, HV, K, V, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots)
    if ancestors is None:
        ancestors = ancestor_mask(parents.long(), num_nodes.long())
    check_shape("ancestors", ancestors, (B, T, T))
    check_tensors((torch.bool,), ancestors=ancestors)

    BT, BL = verify_blocks(T), verify_blocks(L)
    new = partial(torch.empty, dtype=torch.float32, device=q.device)
    o, u, gcum = new(B, T, HV, V), new(B, T, HV, V), new(B, T, HV)
    if B == 0:
        return o, u, gcum
    shapes = dict(T=T, H=H, HV=HV, K=K, V=V)
    exact = exact_in_tf32(q, k)  # (a bf16 / fp16 model's q and k, as its glue leaves them for the KVBuffer)
    use_dot = T > FMA_MAX_NODES
    anc = ancestors.view(torch.uint8)
    if B <= FUSED_MAX_BATCH:
        block_v, warps = FUSED_CONFIGS[BT]
        BV = min(V, block_v)
        gdn_verify_fused_kernel[(V // BV, HV, B)](
            q, k, v, g, beta, anc, num_nodes, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots,
            o, u, gcum, **shapes, L=L, BT=BT, BL=BL, BK=min(K, FUSED_PRODUCTS_BLOCK_K), BKS=min(K, STATE_BLOCK_K),
            BV=BV,
            USE_DOT=use_dot, PRODUCTS_STAGES=PRODUCTS_STAGES, num_warps=warps, num_stages=1,
            PRECISION=products_precision(FUSED_SPLIT_TF32), EXACT=exact, LOADS_FIRST=FUSED_LOADS_FIRST,
        )
        return o, u, gcum
    # the state pass, then the tree pass (verify_scratch_bytes: S0^T k and S0^T q between them)
    kS, qS = new(B, T, HV, V), new(B, T, HV, V)
    per_program = (TREE_DOT_HEADS_PER_PROGRAM if use_dot else TREE_HEADS_PER_PROGRAM) or HV // H
    if (HV // H) % per_program:
        raise ValueError(f"the tree pass's value heads per program ({per_program}) must divide the value heads per key "
                         f"head ({HV // H})")
    if use_dot:
        block_v, warps = STATE_DOT_CONFIGS[BT]
        G = 1
    else:
        block_v, warps = STATE_FMA_CONFIG
        G = HV // H if STATE_SHARE_KEY_HEAD else 1
    BV = min(V, block_v)
    gdn_verify_state_kernel[(V // BV, HV // G, B)](
        q, k, num_nodes, state_pool, state_slots, kS, qS,
        **shapes, BT=BT, BV=BV, BK=min(K, STATE_BLOCK_K), G=G, NG=triton.next_power_of_2(G), USE_DOT=use_dot,
        PRECISION=products_precision(STATE_SPLIT_TF32 and use_dot), EXACT=exact,
        STAGES=STATE_DOT_STAGES[BT] if use_dot else 0, num_warps=warps, num_stages=1,
        **register_cap(STATE_DOT_MAX_REGISTERS[BT] if use_dot else None),
    )
    config = small_tree_config(B, T)
    if config is not None:
        per_program = SMALL_TREE_HEADS_PER_PROGRAM or HV // H
        if (HV // H) % per_program:
            raise ValueError(f"the small trees' tree pass's value heads per program ({per_program}) must divide the "
                             f"value heads per key head ({HV // H})")
        block_v, warps, v_programs = config
        BV = min(V // v_programs, block_v)
        if V % (v_programs * BV):
            raise ValueError(f"the small trees' tree pass's {v_programs} programs along V of {BV} columns a block must "
                             f"divide V ({V})")
        BN = small_node_block(T)
        scratch = new(B * HV // per_program * v_programs, small_scratch_floats(BN, BL, per_program))
        gdn_verify_small_tree_kernel[(HV // per_program, B, v_programs)](
            q, k, v, g, beta, anc, num_nodes, state_slots, kS, qS, buf_k, buf_u, buf_gcum, buf_len, req_slots, o, u,
            gcum, scratch, **shapes, L=L, BN=BN, BL=BL, BK=min(K, SMALL_TREE_BLOCK_K), BV=BV, GP=per_program,
            NG=triton.next_power_of_2(per_program), VP=v_programs, PRECISION=products_precision(TREE_SPLIT_TF32),
            EXACT=exact, num_warps=warps, num_stages=1, **register_cap(SMALL_TREE_MAX_REGISTERS),
        )
        return o, u, gcum
    block_v, warps = TREE_CONFIG if use_dot else TREE_SMALL_CONFIG
    gdn_verify_tree_kernel[(HV // per_program, B)](
        q, k, v, g, beta, anc, num_nodes, state_slots, kS, qS, buf_k, buf_u, buf_gcum, buf_len, req_slots, o, u, gcum,
        **shapes, L=L, BT=BT, BL=BL, BK=min(K, PRODUCTS_BLOCK_K), BV=min(V, block_v),
        PRECISION=products_precision(TREE_SPLIT_TF32), NG=triton.next_power_of_2(per_program),
        PRODUCTS_STAGES=PRODUCTS_STAGES, GP=per_program, STACKED=STACKED_PRODUCTS or STACKED_READS,
        STACKED_READS=STACKED_READS, EXACT=exact, num_warps=warps, num_stages=1,
        **register_cap(TREE_DOT_MAX_REGISTERS[BT] if use_dot else None),
    )
    return o, u, gcum
