"""The Gated DeltaNet's short conv with its q / k / v split fused in (the conv, then verify_kernels.glue's gdn_qkv):
the tree conv's and the decode conv's programs write the delta rule's inputs, l2-normalised q (times q_scale) and k
[..., H, K] and fp32 v [..., HV, V], instead of the conv output that the split would read back. One launch and the
conv output's write and read less per layer and step (Qwen3.5-9B's 5-node chains at batch 128: 10.5 MB each way;
the split's 7 us a layer on the H200 timeline of 2026-12-04c). The values are the two ops' exactly: the conv output
is rounded to x's dtype first, as the conv stores it.

A program's channel block must hold whole key heads and lie within q, k or v: BLOCK_D (the conv's, at most H K) a
multiple of K that divides H K. Other shapes, and FUSED off, run the two ops. Written on the CPU on 2026-12-05
(nineteenth session, no device). On since the H200 sweep of 2026-12-05
(benchmarks/results/sweeps_h200/sweep_gdn_commit_convqkv_2026-12-05a.txt): plain decoding's conv and split 5.6 /
15.3 us at batch 64 / 256 against 7.4 / 17.3 for the two ops, 5-node chains 11.7 / 41.4 against 13.9 / 48.9.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from verify_kernels.conv import tree_conv
from verify_kernels.conv.decode_conv import BLOCK_D as DECODE_BLOCK_D
from verify_kernels.conv.decode_conv import NUM_WARPS as DECODE_WARPS
from verify_kernels.conv.decode_conv import check_decode_inputs, conv_decode, decode_conv_row, shift_window
from verify_kernels.conv.naive import GateInputs, QKVHeads
from verify_kernels.conv.tree_conv import _check_tree_inputs, causal_conv1d_tree, tree_conv_rows
from verify_kernels.glue.gdn_inputs import TRITON_DTYPES, gate_outputs, gdn_gates, gdn_qkv, store_gate_rows
from verify_kernels.glue.rows import as_rows

FUSED = True


@triton.jit
def store_qkv(b_y, rows, m_r, i_d, q, k, v, q_scale, eps, H: tl.constexpr, K: tl.constexpr, HV: tl.constexpr,
              V: tl.constexpr, BLOCK_D: tl.constexpr, ROUND: tl.constexpr, QK_VALUES: tl.constexpr):
    """b_y [BR, BLOCK_D] (fp32 conv outputs of channel block i_d for flat rows `rows` [BR], those with m_r) -> q or
    k (l2-normalised per head, q scaled, rounded to QK_VALUES) or v (fp32), as gdn_qkv stores them."""
    b_y = b_y.to(ROUND).to(tl.float32)  # the conv output as stored in x's dtype
    d0 = i_d * BLOCK_D
    o_c = tl.arange(0, BLOCK_D)
    if d0 < 2 * H * K:  # whole key heads of q or of k
        b_h = tl.reshape(b_y, [b_y.shape[0], BLOCK_D // K, K])
        b_h = b_h * (1.0 / tl.sqrt(tl.sum(b_h * b_h, 2) + eps))[:, :, None]
        b_n = tl.reshape(b_h, [b_y.shape[0], BLOCK_D])
        p_n = rows[:, None] * (H * K) + (d0 % (H * K) + o_c)[None, :]
        if d0 < H * K:
            tl.store(q + p_n, (b_n * q_scale).to(QK_VALUES).to(q.dtype.element_ty), mask=m_r[:, None])
        else:
            tl.store(k + p_n, b_n.to(QK_VALUES).to(k.dtype.element_ty), mask=m_r[:, None])
    else:
        o_v = d0 - 2 * H * K + o_c
        tl.store(v + rows[:, None] * (HV * V) + o_v[None, :], b_y, mask=m_r[:, None] & (o_v < HV * V)[None, :])


@triton.jit(do_not_specialize=["T"])
def conv_tree_qkv_kernel(
    x, parents, sources, num_nodes, conv_pool, req_slots, weight, bias, q, k, v, stride_xb, stride_xt, q_scale, eps,
    a, b, A_log, dt_bias, g, beta, stride_a, stride_b, T,
    D: tl.constexpr, W: tl.constexpr, BT: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_SOURCES: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
    HV: tl.constexpr, V: tl.constexpr, ROUND: tl.constexpr, QK_VALUES: tl.constexpr, GATES: tl.constexpr,
    NHV: tl.constexpr,
):
    """tree_conv's rows kernel (node block program_id(2)), its output stored as q / k / v (store_qkv); with GATES
    the programs of channel block 0 also store their nodes' g and beta from a and b (rows of stride_a / stride_b:
    store_gate_rows)."""
    i_b, i_d, i_t = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    b_y, o_t, _ = tree_conv_rows(x, parents, sources, num_nodes, conv_pool, req_slots, weight, bias, i_b, i_d,
                                 i_t * BT, stride_xb, stride_xt, T, D, W, BT, BLOCK_D, HAS_SOURCES, HAS_BIAS, SILU)
    store_qkv(b_y, i_b * T + o_t, o_t < T, i_d, q, k, v, q_scale, eps, H, K, HV, V, BLOCK_D, ROUND, QK_VALUES)
    if GATES:
        if i_d == 0:  # every node of the row, padding ones too (as gdn_gates: what reads them masks them)
            store_gate_rows(a, b, A_log, dt_bias, g, beta, i_b * T + o_t, o_t < T, stride_a, stride_b, HV, NHV)


@triton.jit
def conv_decode_qkv_kernel(
    x, num_nodes, conv_pool, req_slots, weight, bias, q, k, v, stride_xb, q_scale, eps,
    a, b, A_log, dt_bias, g, beta, stride_a, stride_b,
    D: tl.constexpr, W: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
    H: tl.constexpr, K: tl.constexpr, HV: tl.constexpr, V: tl.constexpr, ROUND: tl.constexpr,
    QK_VALUES: tl.constexpr, GATES: tl.constexpr, NHV: tl.constexpr,
):
    """decode_conv's kernel, its output stored as q / k / v (store_qkv), then the window shifted; with GATES channel
    block 0 also stores the token's g and beta (store_gate_rows)."""
    i_b, i_d = tl.program_id(0).to(tl.int64), tl.program_id(1)
    b_y, _, b_x, b_c1, b_c2, p_pool, m_n = decode_conv_row(x, num_nodes, conv_pool, req_slots, weight, bias, i_b,
                                                           i_d, stride_xb, D, W, BLOCK_D, HAS_BIAS, SILU)
    one = tl.zeros([1], dtype=tl.int64)
    store_qkv(b_y[None, :], i_b + one, one == 0, i_d, q, k, v, q_scale, eps, H, K, HV, V, BLOCK_D, ROUND, QK_VALUES)
    if GATES:
        if i_d == 0:
            store_gate_rows(a, b, A_log, dt_bias, g, beta, i_b + one, one == 0, stride_a, stride_b, HV, NHV)
    shift_window(p_pool, b_x, b_c1, b_c2, m_n, D, W)


def fused_block(heads: QKVHeads, block_d: int) -> int | None:
    """The channel block a fused program takes (the conv's, at most H K), or None where the heads do not fit one
    (or FUSED is off)."""
    block = min(block_d, heads.H * heads.K)
    if not FUSED or block % heads.K or (heads.H * heads.K) % block or block & (block - 1):
        return None
    return block


def _outputs(lead: tuple[int, ...], heads: QKVHeads, qk_dtype, qk_storage, device):
    qk_dtype = qk_dtype or torch.float32
    q = torch.empty(*lead, heads.H, heads.K, dtype=qk_storage or qk_dtype, device=device)
    return q, torch.empty_like(q), torch.empty(*lead, heads.HV, heads.V, dtype=torch.float32, device=device), qk_dtype


def _check_heads(heads: QKVHeads, D: int) -> None:
    if heads.channels != D:
        raise ValueError(f"the conv has {D} channels, the heads {heads} take {heads.channels}")


def _gate_arguments(gates: GateInputs | None, fallback: torch.Tensor):
    """(the kernels' gate arguments, their flags, the (g, beta) outputs or ()) for gates (None: placeholders)."""
    if gates is None:
        return (fallback,) * 6 + (0, 0), dict(GATES=False, NHV=1), ()
    g, beta = gate_outputs(gates.a, gates.b, gates.A_log, gates.dt_bias)
    a_rows, b_rows = as_rows("a", gates.a), as_rows("b", gates.b)
    arguments = (a_rows, b_rows, gates.A_log, gates.dt_bias, g, beta, a_rows.stride(0), b_rows.stride(0))
    return arguments, dict(GATES=True, NHV=triton.next_power_of_2(gates.a.shape[-1])), (g, beta)


def _check_gates(gates: GateInputs | None, lead: tuple[int, ...]) -> None:
    if gates is not None and tuple(gates.a.shape[:-1]) != lead:
        raise ValueError(f"the gates' a {tuple(gates.a.shape)} must be [{', '.join(map(str, lead))}, HV]")


def _unfused_gates(gates: GateInputs | None) -> tuple:
    return () if gates is None else gdn_gates(gates.a, gates.b, gates.A_log, gates.dt_bias)


def causal_conv1d_tree_qkv(x, parents, num_nodes, conv_pool, req_slots, weight, bias, activation, sources,
                           heads: QKVHeads, q_scale: float, eps: float = 1e-6, qk_dtype: torch.dtype | None = None,
                           qk_storage: torch.dtype | None = None, gates: GateInputs | None = None):
    """causal_conv1d_tree then gdn_qkv of its output (their arguments; rows of a step's nodes) -> (q [B, T, H, K],
    k, v [B, T, HV, V]), in one kernel where FUSED and the heads fit a channel block; with gates, gdn_gates' (g,
    beta) [B, T, HV] after them, from the same kernel (else from their own)."""
    B, T, D, W = _check_tree_inputs(x, parents, num_nodes, conv_pool, req_slots, weight, bias, activation, sources)
    _check_heads(heads, D)
    _check_gates(gates, (B, T))
    block = fused_block(heads, tree_conv.ROWS_BLOCK_D) if tree_conv.ROWS else None
    if block is None:
        y = causal_conv1d_tree(x, parents, num_nodes, conv_pool, req_slots, weight, bias, activation, sources)
        return (*gdn_qkv(y, heads.H, heads.K, heads.HV, heads.V, q_scale, eps, qk_dtype, qk_storage),
                *_unfused_gates(gates))
    q, k, v, qk_dtype = _outputs((B, T), heads, qk_dtype, qk_storage, x.device)
    gate_args, gate_flags, gate_outs = _gate_arguments(gates, x)
    if q.numel():
        node_block = tree_conv.rows_node_block(T)
        conv_tree_qkv_kernel[(B, triton.cdiv(D, block), triton.cdiv(T, node_block))](
            x, parents, parents if sources is None else sources, num_nodes, conv_pool, req_slots, weight,
            weight if bias is None else bias, q, k, v, x.stride(0), x.stride(1), q_scale, eps, *gate_args, T,
            D=D, W=W, BT=node_block, BLOCK_D=block, HAS_SOURCES=sources is not None,
            HAS_BIAS=bias is not None, SILU=activation == "silu", H=heads.H, K=heads.K, HV=heads.HV, V=heads.V,
            ROUND=TRITON_DTYPES[x.dtype], QK_VALUES=TRITON_DTYPES[qk_dtype], **gate_flags,
            num_warps=tree_conv.ROWS_WARPS,
        )
    return q, k, v, *gate_outs


def conv_decode_qkv(x, num_nodes, conv_pool, req_slots, weight, bias, activation, heads: QKVHeads, q_scale: float,
                    eps: float = 1e-6, qk_dtype: torch.dtype | None = None, qk_storage: torch.dtype | None = None,
                    gates: GateInputs | None = None):
    """conv_decode (the window updated in place) then gdn_qkv of its output -> (q [B, 1, H, K], k, v [B, 1, HV, V]),
    in one kernel where FUSED and the heads fit a channel block; with gates, (g, beta) [B, 1, HV] after them."""
    B, D, W = check_decode_inputs(x, num_nodes, conv_pool, req_slots, weight, bias, activation)
    _check_heads(heads, D)
    _check_gates(gates, (B, 1))
    block = fused_block(heads, DECODE_BLOCK_D)
    if block is None:
        y = conv_decode(x, num_nodes, conv_pool, req_slots, weight, bias, activation)
        return (*gdn_qkv(y, heads.H, heads.K, heads.HV, heads.V, q_scale, eps, qk_dtype, qk_storage),
                *_unfused_gates(gates))
    q, k, v, qk_dtype = _outputs((B, 1), heads, qk_dtype, qk_storage, x.device)
    gate_args, gate_flags, gate_outs = _gate_arguments(gates, x)
    if q.numel():
        conv_decode_qkv_kernel[(B, triton.cdiv(D, block))](
            x, num_nodes, conv_pool, req_slots, weight, weight if bias is None else bias, q, k, v, x.stride(0),
            q_scale, eps, *gate_args, D=D, W=W, BLOCK_D=block, HAS_BIAS=bias is not None, SILU=activation == "silu",
            H=heads.H, K=heads.K, HV=heads.HV, V=heads.V, ROUND=TRITON_DTYPES[x.dtype],
            QK_VALUES=TRITON_DTYPES[qk_dtype], **gate_flags, num_warps=DECODE_WARPS,
        )
    return q, k, v, *gate_outs
