"""Triton kernel for plain decoding's conv: each row's one node through its committed window and the window's update
in one pass, with the semantics of conv_decode_ref (verify_kernels.conv.naive). It replaces the tree conv and the
conv commit of a decode step (two launches that read the window twice) by one that reads it once.

Grid (row, channel block): a program loads its channels' W - 1 committed columns and the node's input, writes the
output, then shifts the columns left with the input as the newest; a padding row (num_nodes 0) writes zeros and
leaves its window. Never synchronises with the device (CUDA-graph safe).
"""

import torch
import triton
import triton.language as tl

from verify_kernels.conv.tree_conv import _check_conv, _check_int, _check_weights

# channels per program and warps: as the tree conv's (tree_conv.py, swept on the H200 2026-12-02); not swept alone
BLOCK_D = 256
NUM_WARPS = 2


@triton.jit
def conv_decode_kernel(
    x, num_nodes, conv_pool, req_slots, weight, bias, y, stride_xb,
    D: tl.constexpr, W: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):
    i_b, i_d = tl.program_id(0).to(tl.int64), tl.program_id(1)
    b_y, o_d, b_x, b_c1, b_c2, p_pool, m_n = decode_conv_row(x, num_nodes, conv_pool, req_slots, weight, bias, i_b,
                                                             i_d, stride_xb, D, W, BLOCK_D, HAS_BIAS, SILU)
    tl.store(y + i_b * D + o_d, b_y.to(y.dtype.element_ty), mask=o_d < D)
    shift_window(p_pool, b_x, b_c1, b_c2, m_n, D, W)


@triton.jit
def decode_conv_row(x, num_nodes, conv_pool, req_slots, weight, bias, i_b, i_d, stride_xb, D: tl.constexpr,
                    W: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr):
    """Row i_b's node through channel block i_d: -> (y [BLOCK_D] fp32, zeros at a padding row; the channels o_d, and
    for shift_window the node's input, the window's columns 1 and 2 as read, the row's column 0 pointer and the
    mask of a real row's channels)."""
    is_node = tl.load(num_nodes + i_b) > 0
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    m_d = o_d < D
    m_n = o_d < tl.where(is_node, D, 0)  # (a vector & a scalar mask fails in Triton's interpreter)
    p_pool = conv_pool + i_r * (W - 1) * D + o_d  # column j at p_pool + j * D
    b_x = tl.load(x + i_b * stride_xb + o_d, mask=m_n, other=0.0)
    b_y = b_x.to(tl.float32) * tl.load(weight + o_d * W + W - 1, mask=m_d, other=0.0).to(tl.float32)
    # the W - 1 <= 3 committed columns, oldest first
    b_c0 = tl.load(p_pool, mask=m_n, other=0.0)
    b_y += b_c0.to(tl.float32) * tl.load(weight + o_d * W, mask=m_d, other=0.0).to(tl.float32)
    b_c1 = b_c0  # (columns past the window: never stored)
    b_c2 = b_c0
    if W > 2:
        b_c1 = tl.load(p_pool + D, mask=m_n, other=0.0)
        b_y += b_c1.to(tl.float32) * tl.load(weight + o_d * W + 1, mask=m_d, other=0.0).to(tl.float32)
    if W > 3:
        b_c2 = tl.load(p_pool + 2 * D, mask=m_n, other=0.0)
        b_y += b_c2.to(tl.float32) * tl.load(weight + o_d * W + 2, mask=m_d, other=0.0).to(tl.float32)
    if HAS_BIAS:
        b_y += tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)
    if SILU:
        b_y = b_y * tl.sigmoid(b_y)
    return tl.where(is_node, b_y, 0.0), o_d, b_x, b_c1, b_c2, p_pool, m_n


@triton.jit
def shift_window(p_pool, b_x, b_c1, b_c2, m_n, D: tl.constexpr, W: tl.constexpr):
    """The row's window shifted by one, its node the newest column (after every column was read)."""
    tl.debug_barrier()
    b_new = b_x.to(b_c1.dtype)
    if W == 2:
        tl.store(p_pool, b_new, mask=m_n)
    if W == 3:
        tl.store(p_pool, b_c1, mask=m_n)
        tl.store(p_pool + D, b_new, mask=m_n)
    if W == 4:
        tl.store(p_pool, b_c1, mask=m_n)
        tl.store(p_pool + D, b_c2, mask=m_n)
        tl.store(p_pool + 2 * D, b_new, mask=m_n)


def check_decode_inputs(x, num_nodes, conv_pool, req_slots, weight, bias, activation) -> tuple[int, int, int]:
    """The decode conv's checks -> B, D, W."""
    B, T, D, W = _check_conv(x, conv_pool, req_slots)
    if T != 1:
        raise ValueError(f"conv_decode takes one node per row (x [B, 1, D]), got {T}: use causal_conv1d_tree")
    _check_int("num_nodes", num_nodes, (B,))
    _check_weights(weight, bias, activation, D, W)
    return B, D, W


def conv_decode(
    x: torch.Tensor,
    num_nodes: torch.Tensor,
    conv_pool: torch.Tensor,
    req_slots: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Plain decoding's conv and window update in one kernel (as conv_decode_ref).

    x: [B, 1, D] (unit channel stride); num_nodes: [B] 1 or 0 (padding rows); conv_pool: [R, W - 1, D] (W in 2..4,
    the model dtype), updated in place; req_slots: [B]; weight: [D, W]; bias: [D] or None; activation: "silu" or
    None. Returns y [B, 1, D] in x.dtype (computed in fp32), zeros at padding rows.
    """
    B, D, W = check_decode_inputs(x, num_nodes, conv_pool, req_slots, weight, bias, activation)
    y = torch.empty(B, 1, D, dtype=x.dtype, device=x.device)
    if y.numel():
        conv_decode_kernel[(B, triton.cdiv(D, BLOCK_D))](
            x, num_nodes, conv_pool, req_slots, weight, weight if bias is None else bias, y, x.stride(0),
            D=D, W=W, BLOCK_D=BLOCK_D, HAS_BIAS=bias is not None, SILU=activation == "silu", num_warps=NUM_WARPS,
        )
    return y
