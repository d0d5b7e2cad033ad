"""Triton kernels for the tree-aware short causal depthwise conv1d and its commit, with the same signatures and
semantics as causal_conv1d_tree_ref / conv_commit_ref (verify_kernels.conv.naive gives the contract).

A node's window is its W - 1 predecessors along its own path, then itself. Where those predecessors come from is the
same for every layer of a step, so a small torch helper (conv_window_sources, window_sources.py) turns the parent
pointers into window sources once a step for all its conv layers (the engine's StepContext.window_sources, about ten
small launches): a node index (>= 0), or a committed column counted from the newest (-1 = conv_pool[r, -1]).
Without them the conv kernel walks the W - 1 parent pointers itself (W - 1 dependent loads before its gathers).
The default grid, (row, channel block), takes all the row's nodes at once (ROWS); the other, (row, node, channel
block), reads a node's W window columns one at a time (its sources are scalars: each column is a draft input from
x or a committed one from conv_pool). Both write zeros at padding nodes and read nothing for them. The commit
kernel, grid (row, channel block), rewrites the row's W - 1 committed columns from (old columns ++ accepted inputs)
in place.
Launchers check static shapes only and never synchronise with the device (CUDA-graph safe); trees are not
validated (out-of-range parents are clamped, padding parents ignored).
"""

import torch
import triton
import triton.language as tl

# Launch parameters: channels per program and warps, from `python -m benchmarks.sweep_gdn --ops conv --batches 256`
# on the H200 (2026-12-02, Qwen3.5-9B's 8192 conv channels, bf16, conv + its commit per layer): 256 channels on 2
# warps 27.8 us at one node per row and 61.0 us at 4-node chains, against 38.4 / 95.2 us for 1024 channels on 4 warps
# and 28.0 / 61.0 for 512 on 4; 2048 channels were slower still. Still some 3x off the bytes (32% of the bound).
BLOCK_D = 256
COMMIT_BLOCK_D = 256
NUM_WARPS = 2
# ROWS: a program per (row, channel block) for all the row's nodes at once (ROWS_BLOCK_D channels, ROWS_WARPS warps)
# instead of one per (row, node, channel block): the parent walk done once per row, vectorised over its nodes, and
# 5x fewer programs at 5-node chains. The per-node grid is latency-bound: 3 dependent scalar loads (the walk) before
# its loads of 512 bytes per column, ~6x its bytes at batch 128 (0.97 ms per step over Qwen3.5-9B's 24 layers, H200
# 2026-12-02). The H200 sweep of 2026-12-03 (`python -m benchmarks.sweep_gdn --ops conv`): 256 channels on 4 warps
# per row 57.1 us at batch 256 and 18.0 at 64 for 4-node chains with their commit, against 60.9 / 18.9 per node; one
# node per row the same (19.6 / 7.1 us); 512 channels on 8 warps 70.1 / 20.8. With the window sources computed once a
# step (2026-12-03, sixth sitting: sweeps_h200/sweep_gdn_conv_sources_2026-12-03f.txt, the [R, D, W - 1] pool of then):
# 4-node chains with their commit 27.4 / 50.2 us at batch 128 / 256 (35% of their bytes' bound), 128 channels on 2
# warps 27.0 / 49.5, one program per node 32.6 / 60.5. With the pool stored columns first ([R, W - 1, D], 2026-12-03,
# seventh sitting: sweeps_h200/sweep_gdn_conv_layout_2026-12-03g.txt): 18.0 / 33.5 us at 256 channels on 4 warps, 17.6
# / 32.0 at 128 on 2 warps, 18.3 / 33.7 at 512 on 4, one program per node 26.3 / 48.9. 2026-12-04 (sitting 11:40 UTC,
# sweeps_h200/sweep_gdn_verify_chains_conv_2026-12-04f.txt): 256 on 2 warps 10.5 / 16.8 / 30.9 us at batch 64 / 128 /
# 256 against 10.9 / 17.5 / 32.2 at 128 on 2 (the default since); several channel blocks looped in one program,
# pipelined, no faster (30.8-39.2 us at 256, slower at 64: written and swept, not merged).
ROWS = True
ROWS_BLOCK_D = 256
ROWS_WARPS = 2

# ROWS_MAX_NODES: the most nodes of a row one rows program holds (a [BT, BLOCK_D] fp32 tile); a longer row (a
# prefill's prompt) is cut into blocks of that many, a program each. T (the nodes per row) is a runtime argument of
# every kernel here, not a constexpr: as one, each new prompt length compiled the kernels anew (3-7 s of a request's
# prefill on an H100 in the GPU eval of 2026-12-06, prompts of 41-76 tokens), and a prompt of thousands of tokens made
# a tile of thousands of rows.
ROWS_MAX_NODES = 32

WIDTHS = (2, 3, 4)
FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def causal_conv1d_tree_kernel(
    x, parents, sources, num_nodes, conv_pool, req_slots, weight, bias, y, stride_xb, stride_xt, T,
    D: tl.constexpr, W: tl.constexpr, BLOCK_D: tl.constexpr, HAS_SOURCES: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):
    i_b, i_t, i_d = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    is_node = i_t < tl.load(num_nodes + i_b)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    m_d = o_d < D
    # masks as bounds on o_d (a vector & a scalar mask fails in Triton's interpreter); padding nodes read nothing
    m_n = o_d < tl.where(is_node, D, 0)
    p_x = x + i_b * stride_xb + o_d
    # the node itself is the window's last column
    b_y = (tl.load(p_x + i_t * stride_xt, mask=m_n, other=0.0).to(tl.float32)
           * tl.load(weight + o_d * W + W - 1, mask=m_d, other=0.0).to(tl.float32))
    cur = i_t.to(tl.int64)
    for j in tl.static_range(W - 1):
        # column w, newest first: node src (>= 0) or committed column W - 1 + src (< 0), from the sources or by
        # walking up the parents as conv_window_sources does (a root's parent -1 is the newest committed column)
        w = W - 2 - j
        if HAS_SOURCES:
            src = tl.load(sources + (i_b * T + i_t) * (W - 1) + w).to(tl.int64)
        else:
            up = tl.load(parents + i_b * T + tl.maximum(cur, 0), mask=cur >= 0, other=-1).to(tl.int64)
            src = tl.where(cur >= 0, tl.minimum(tl.maximum(up, -1), T - 1), cur - 1)
            cur = src
        # one of the two loads reads nothing
        m_x = o_d < tl.where(is_node & (src >= 0), D, 0)
        m_p = o_d < tl.where(is_node & (src < 0), D, 0)
        b_win = tl.load(p_x + tl.maximum(src, 0) * stride_xt, mask=m_x, other=0.0).to(tl.float32)
        b_win += tl.load(conv_pool + (i_r * (W - 1) + tl.maximum(W - 1 + src, 0)) * D + o_d, mask=m_p,
                         other=0.0).to(tl.float32)
        b_y += b_win * tl.load(weight + o_d * W + w, mask=m_d, other=0.0).to(tl.float32)
    if HAS_BIAS:
        b_y += tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)
    if SILU:
        b_y = b_y * tl.sigmoid(b_y)
    b_y = tl.where(is_node, b_y, 0.0)
    tl.store(y + (i_b * T + i_t) * D + o_d, b_y.to(y.dtype.element_ty), mask=m_d)


@triton.jit(do_not_specialize=["T"])
def causal_conv1d_tree_rows_kernel(
    x, parents, sources, num_nodes, conv_pool, req_slots, weight, bias, y, stride_xb, stride_xt, T,
    D: tl.constexpr, W: tl.constexpr, BT: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_SOURCES: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):
    """causal_conv1d_tree_kernel's work for BT of a row's nodes at once ([BT, BLOCK_D] tiles; node block
    program_id(2)): each window column a gather of node inputs or committed columns, from the sources (one load
    each, all independent) or from the window walk vectorised over the nodes (W - 1 dependent loads before the
    gathers)."""
    i_b, i_d, i_t = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    b_y, o_t, o_d = tree_conv_rows(x, parents, sources, num_nodes, conv_pool, req_slots, weight, bias, i_b, i_d,
                                   i_t * BT, stride_xb, stride_xt, T, D, W, BT, BLOCK_D, HAS_SOURCES, HAS_BIAS,
                                   SILU)
    tl.store(y + (i_b * T + o_t[:, None]) * D + o_d[None, :], b_y.to(y.dtype.element_ty),
             mask=(o_t < T)[:, None] & (o_d < D)[None, :])


@triton.jit
def tree_conv_rows(x, parents, sources, num_nodes, conv_pool, req_slots, weight, bias, i_b, i_d, t0, stride_xb,
                   stride_xt, T, D: tl.constexpr, W: tl.constexpr, BT: tl.constexpr, BLOCK_D: tl.constexpr,
                   HAS_SOURCES: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr):
    """Row i_b's nodes t0 .. t0 + BT - 1 through channel block i_d: -> (y [BT, BLOCK_D] fp32, zeros at padding
    nodes; its nodes o_t [BT] and channels o_d [BLOCK_D])."""
    nn = tl.minimum(tl.load(num_nodes + i_b), T)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    o_t = t0 + tl.arange(0, BT)
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    m_t = o_t < nn
    m_d = o_d < D
    m = m_t[:, None] & m_d[None, :]                    # padding nodes read nothing
    p_x = x + i_b * stride_xb + o_d[None, :]
    b_y = (tl.load(p_x + o_t[:, None] * stride_xt, mask=m, other=0.0).to(tl.float32)
           * tl.load(weight + o_d * W + W - 1, mask=m_d, other=0.0).to(tl.float32)[None, :])
    cur = o_t.to(tl.int64)
    for j in tl.static_range(W - 1):
        # column w, newest first: node src (>= 0) or committed column W - 1 + src (< 0), as the per-node kernel
        w = W - 2 - j
        if HAS_SOURCES:
            src = tl.load(sources + (i_b * T + o_t) * (W - 1) + w, mask=m_t, other=0).to(tl.int64)
        else:
            up = tl.load(parents + i_b * T + tl.maximum(cur, 0), mask=(cur >= 0) & m_t, other=-1).to(tl.int64)
            src = tl.where(cur >= 0, tl.minimum(tl.maximum(up, -1), T - 1), cur - 1)
            cur = src
        m_x = m & (src >= 0)[:, None]
        m_p = m & (src < 0)[:, None]
        b_win = tl.load(p_x + tl.maximum(src, 0)[:, None] * stride_xt, mask=m_x, other=0.0).to(tl.float32)
        b_win += tl.load(conv_pool + (i_r * (W - 1) + tl.maximum(W - 1 + src, 0)[:, None]) * D + o_d[None, :],
                         mask=m_p, other=0.0).to(tl.float32)
        b_y += b_win * tl.load(weight + o_d * W + w, mask=m_d, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        b_y += tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)[None, :]
    if SILU:
        b_y = b_y * tl.sigmoid(b_y)
    return tl.where(m_t[:, None], b_y, 0.0), o_t, o_d


@triton.jit
def committed_column(x, accepted, p_pool, i_b, n_acc, c, o_d, D, stride_xb, stride_xt, A, W: tl.constexpr):
    """New committed column c [BLOCK_D]: element n_acc + c of (the W - 1 old columns ++ the n_acc accepted inputs);
    p_pool: the row's column 0 at the program's channels (column j at p_pool + j * D)."""
    k = n_acc + c
    is_old = k < W - 1
    node = tl.load(accepted + i_b * A + tl.maximum(k - (W - 1), 0), mask=~is_old, other=0).to(tl.int64)
    b_old = tl.load(p_pool + tl.minimum(k, W - 2) * D, mask=o_d < tl.where(is_old, D, 0), other=0.0)
    b_x = tl.load(x + i_b * stride_xb + node * stride_xt + o_d, mask=o_d < tl.where(is_old, 0, D), other=0.0)
    return tl.where(is_old, b_old, b_x.to(b_old.dtype))


@triton.jit(do_not_specialize=["A"])
def conv_commit_kernel(
    x, accepted, num_accepted, conv_pool, req_slots, stride_xb, stride_xt, A,
    D: tl.constexpr, W: tl.constexpr, BLOCK_D: tl.constexpr,
):
    i_b, i_d = tl.program_id(0).to(tl.int64), tl.program_id(1)
    n_acc = tl.load(num_accepted + i_b).to(tl.int32)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    m_d = o_d < tl.where(n_acc > 0, D, 0)             # nothing accepted: the history stays as it is
    p_pool = conv_pool + i_r * (W - 1) * D + o_d
    # W - 1 <= 3 columns, all read before any is written
    b_c0 = committed_column(x, accepted, p_pool, i_b, n_acc, 0, o_d, D, stride_xb, stride_xt, A, W)
    if W > 2:
        b_c1 = committed_column(x, accepted, p_pool, i_b, n_acc, 1, o_d, D, stride_xb, stride_xt, A, W)
    if W > 3:
        b_c2 = committed_column(x, accepted, p_pool, i_b, n_acc, 2, o_d, D, stride_xb, stride_xt, A, W)
    # every thread's reads of the old columns happen before any of them is overwritten
    tl.debug_barrier()
    tl.store(p_pool, b_c0, mask=m_d)
    if W > 2:
        tl.store(p_pool + D, b_c1, mask=m_d)
    if W > 3:
        tl.store(p_pool + 2 * D, b_c2, mask=m_d)


def _check_conv(x, conv_pool, req_slots) -> tuple[int, int, int, int]:
    """Shapes, dtypes and strides shared by both ops; returns B, T, D, W."""
    if x.dim() != 3 or conv_pool.dim() != 3:
        raise ValueError(f"expected x [B, T, D] and conv_pool [R, W - 1, D], got {tuple(x.shape)} and "
                         f"{tuple(conv_pool.shape)}")
    B, T, D = x.shape
    W = conv_pool.shape[1] + 1
    if conv_pool.shape[2] != D or W not in WIDTHS:
        raise ValueError(f"conv_pool must be [R, W - 1, {D}] with W in {WIDTHS}, got {tuple(conv_pool.shape)}")
    if req_slots.shape != (B,) or req_slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"req_slots must be [{B}] int32 / int64, got {tuple(req_slots.shape)} {req_slots.dtype}")
    for name, t in (("x", x), ("conv_pool", conv_pool)):
        if t.dtype not in FLOAT_INPUTS:
            raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    if x.stride(-1) != 1 or not conv_pool.is_contiguous() or not req_slots.is_contiguous():
        raise ValueError("x needs unit stride over channels (rows and nodes may be strided, e.g. a split of a "
                         "projection); conv_pool and req_slots must be contiguous")
    return B, T, D, W


def _check_int(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape or t.dtype not in (torch.int32, torch.int64) or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous int32 / int64 tensor of shape {shape}, got "
                         f"{tuple(t.shape)} {t.dtype}")


def _check_weights(weight, bias, activation, D: int, W: int) -> None:
    """The conv's weights and activation, shared by the launchers."""
    if activation not in ("silu", None):
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
    if tuple(weight.shape) != (D, W) or not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous [{D}, {W}], got {tuple(weight.shape)}")
    if bias is not None and (tuple(bias.shape) != (D,) or not bias.is_contiguous()):
        raise ValueError(f"bias must be contiguous [{D}] or None, got {tuple(bias.shape)}")


def _check_tree_inputs(x, parents, num_nodes, conv_pool, req_slots, weight, bias, activation, sources):
    """The tree conv's checks -> B, T, D, W."""
    B, T, D, W = _check_conv(x, conv_pool, req_slots)
    _check_weights(weight, bias, activation, D, W)
    _check_int("parents", parents, (B, T))
    _check_int("num_nodes", num_nodes, (B,))
    if sources is not None:
        _check_int("sources", sources, (B, T, W - 1))
    return B, T, D, W


def rows_node_block(nodes: int) -> int:
    """The nodes of a row one rows program holds: all of a step's (a power of two, up to ROWS_MAX_NODES), else
    blocks of ROWS_MAX_NODES."""
    return min(triton.next_power_of_2(nodes), ROWS_MAX_NODES)


def causal_conv1d_tree_fwd(x, parents, num_nodes, conv_pool, req_slots, weight, bias, activation, sources):
    """Launcher: checks, window sources, allocation, grid."""
    B, T, D, W = _check_tree_inputs(x, parents, num_nodes, conv_pool, req_slots, weight, bias, activation, sources)
    y = torch.empty(B, T, D, dtype=x.dtype, device=x.device)
    if y.numel() and ROWS:  # (ROWS' comment)
        node_block = rows_node_block(T)
        causal_conv1d_tree_rows_kernel[(B, triton.cdiv(D, ROWS_BLOCK_D), triton.cdiv(T, node_block))](
            x, parents, parents if sources is None else sources, num_nodes, conv_pool, req_slots, weight,
            weight if bias is None else bias, y, x.stride(0), x.stride(1), T, D=D, W=W,
            BT=node_block, BLOCK_D=ROWS_BLOCK_D, HAS_SOURCES=sources is not None,
            HAS_BIAS=bias is not None, SILU=activation == "silu", num_warps=ROWS_WARPS,
        )
    elif y.numel():
        causal_conv1d_tree_kernel[(B, T, triton.cdiv(D, BLOCK_D))](
            x, parents, parents if sources is None else sources, num_nodes, conv_pool, req_slots, weight,
            weight if bias is None else bias, y, x.stride(0), x.stride(1), T,
            D=D, W=W, BLOCK_D=BLOCK_D, HAS_SOURCES=sources is not None, HAS_BIAS=bias is not None,
            SILU=activation == "silu",
            num_warps=NUM_WARPS,
        )
    return y


def causal_conv1d_tree(
    x: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    conv_pool: torch.Tensor,
    req_slots: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    sources: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal depthwise conv1d of a token tree on top of each row's committed conv history; writes nothing (as
    causal_conv1d_tree_ref).

    x: [B, T, D] (unit channel stride); parents: [B, T]; num_nodes: [B]; conv_pool: [R, W - 1, D] (W in 2..4, the
    model dtype); req_slots: [B]; weight: [D, W]; bias: [D] or None; activation: "silu" or None; sources:
    conv_window_sources(parents, num_nodes, W) [B, T, W - 1], shared by the conv layers of a step, or None
    (the kernel walks the parents itself). Returns y [B, T, D] in x.dtype (computed in fp32), zeros at padding nodes.
    """
    return causal_conv1d_tree_fwd(x, parents, num_nodes, conv_pool, req_slots, weight, bias, activation, sources)


def conv_commit(
    x: torch.Tensor,
    accepted: torch.Tensor,
    num_accepted: torch.Tensor,
    conv_pool: torch.Tensor,
    req_slots: torch.Tensor,
) -> None:
    """Append the accepted path's inputs to each row's committed conv history, in place (as conv_commit_ref).

    x: [B, T, D] pre-conv inputs of the nodes (unit channel stride); accepted: [B, A] node indices, root first, -1
    padded; num_accepted: [B] (0 .. A, may exceed W - 1); conv_pool: [R, W - 1, D]; req_slots: [B].
    conv_pool[req_slots[b]] becomes the last W - 1 of (its old columns ++ x[b] at the accepted nodes).
    """
    B, _, D, W = _check_conv(x, conv_pool, req_slots)
    if accepted.dim() != 2 or accepted.shape[0] != B:
        raise ValueError(f"accepted must be [{B}, A], got {tuple(accepted.shape)}")
    _check_int("accepted", accepted, tuple(accepted.shape))
    _check_int("num_accepted", num_accepted, (B,))
    if B and D:
        conv_commit_kernel[(B, triton.cdiv(D, COMMIT_BLOCK_D))](
            x, accepted, num_accepted, conv_pool, req_slots, x.stride(0), x.stride(1), accepted.shape[1],
            D=D, W=W, BLOCK_D=COMMIT_BLOCK_D, num_warps=NUM_WARPS,
        )
