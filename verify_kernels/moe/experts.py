"""Triton kernels for a MoE layer's routed experts, the contract of moe_experts_ref: out[t] = sum_j w[t, j]
expert_{e[t, j]}(x[t]), with static shapes and no host synchronisation, so that MoE steps are captured in CUDA graphs.

Five launches (four for decode-sized steps), on the block layout of routing.py (blocks of BM assignments of one
expert each):
1. layout (routing.py): two small launches, one when a single chunk holds every assignment.
2. up, grid (block, I tile): h[slot] = act(x[token] @ first[e]^T) (gated: act(gate) * up, the gate and up tiles
   of the same columns in one program), x's rows gathered by index in the GEMM's loads (no [N k, D] copy), the
   activation in fp32 on the accumulator, h stored once in x's dtype in slot order [NB BM, I].
3. down, grid (block, D tile): y[a] = w[a] (h[slot] @ second[e]^T) for the block's assignments a, the routing
   weight applied to the fp32 accumulator, y stored at the assignment's row a = token k + j of [N k, D].
4. sum: out[t] = y[t k] + y[t k + 1] + ... in fp32, in that order, cast to top_weight's dtype.
Bf16 / fp16 tiles multiply on the tensor cores in their own dtype with fp32 accumulation; fp32 tiles in full fp32.

Why a sorted reduction (3 + 4) and not atomic adds into out: a float sum's value depends on its order, and atomics
add the k terms of a token in whatever order the programs finish, so a step could differ from itself run to run
(and an engine's greedy verify from its plain decode for no reason but scheduling). Here every output is a fixed
sum: each y row is one program's dot, and the k rows of a token are added in the order j = 0 .. k - 1. It costs
writing and reading y (N k D elements: 2 x 41 MB for Nemotron-3-Nano at 1280 tokens, about 3% of the experts'
2.55 GB of weights) and one launch. A row's value does depend on the launch parameters (the tile shapes set the
order of its dot's partial sums), which experts_config picks from the number of assignments, as cuBLAS picks its
kernel for the dense layers: verify steps and decode steps of different sizes may round a row differently.

Launch parameters by assignments per expert (experts_config; benchmarks/sweep_moe.py times the candidates):
decode-sized steps route about one row to each touched expert, so blocks of BM = 16 (the smallest tl.dot) waste
only tensor-core work, which is idle there anyway: the step is bound by reading the touched experts' weights, and
narrow column tiles (BN 16 - 64) make enough programs (I / BN per touched expert) to keep those reads in flight
(the job swap-AB or split-K do for tiny M in a GEMM of one weight: here the touched experts add programs too).
With more rows (verify, prefill) BM grows to 64 so that an expert's weight tile is read by as few programs as
possible (the blocks of one expert are adjacent in the grid, so a second block finds the tile in the L2).
"""

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from verify_kernels.moe.naive import ACTIVATIONS
from verify_kernels.moe.routing import expert_layout

FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16)
PRECISION = {torch.float32: "ieee", torch.bfloat16: "tf32", torch.float16: "tf32"}  # (16-bit: ignored, native)
SMEM_BUDGET = 160 * 2**10   # bytes of pipelined tiles (num_stages copies) a program may hold (227 KiB an SM)
SUM_TOKENS, SUM_COLUMNS = 4, 256


class GemmConfig(NamedTuple):
    block_n: int        # output columns per program
    block_k: int        # reduction step
    num_warps: int
    num_stages: int     # tiles in flight (fewer where SMEM_BUDGET says so)


class ExpertsConfig(NamedTuple):
    """Launch parameters of one moe_experts call: block_m slots a block (the layout's BM) and the two GEMMs'."""

    block_m: int
    up: GemmConfig
    down: GemmConfig


# Per family (gated or not): (largest assignments per expert, config), the first whose bound R / E reaches.
# From benchmarks/sweep_moe.py on the H200 where it has run (its choice copied here): past 64 assignments per expert
# (Nemotron-3-Nano's 2048 tokens, 96 each) 128-slot blocks and 256 columns on 8 warps, 1.48x the bound against 1.80x
# (2026-12-04, sweeps_h200/sweep_moe_2026-12-04a.txt); the other rows were within 2% of these. A gated program reads
# the gate and the up rows of its BN columns, so gated up GEMMs take half the columns of plain ones.
CONFIGS = {
    False: (
        (1.0, ExpertsConfig(16, GemmConfig(32, 128, 4, 4), GemmConfig(64, 128, 4, 4))),
        (8.0, ExpertsConfig(16, GemmConfig(64, 128, 4, 4), GemmConfig(64, 128, 4, 4))),
        (24.0, ExpertsConfig(32, GemmConfig(128, 64, 4, 4), GemmConfig(128, 64, 4, 4))),
        (64.0, ExpertsConfig(64, GemmConfig(128, 64, 4, 4), GemmConfig(128, 64, 4, 4))),
        (float("inf"), ExpertsConfig(128, GemmConfig(256, 64, 8, 3), GemmConfig(256, 64, 8, 3))),
    ),
    True: (
        (1.0, ExpertsConfig(16, GemmConfig(16, 128, 4, 4), GemmConfig(64, 128, 4, 4))),
        (8.0, ExpertsConfig(16, GemmConfig(32, 128, 4, 4), GemmConfig(64, 128, 4, 4))),
        (24.0, ExpertsConfig(32, GemmConfig(64, 64, 4, 4), GemmConfig(128, 64, 4, 4))),
        (float("inf"), ExpertsConfig(64, GemmConfig(64, 64, 4, 4), GemmConfig(128, 64, 4, 4))),
    ),
}


def experts_config(num_rows: int, num_experts: int, gated: bool) -> ExpertsConfig:
    """The tuned launch parameters for num_rows = N k assignments to num_experts experts."""
    return next(config for bound, config in CONFIGS[gated] if num_rows <= bound * num_experts)


@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BK"] == 0})
@triton.jit
def expert_up_kernel(
    x,              # [N, K]
    w,              # [E, F, K], F = 2 H (gated) or H
    h,              # [NB * BM, H]: slot order
    sorted_rows,    # [NB * BM] int32 assignments
    block_expert,   # [NB] int32, -1 = unused block
    block_rows,     # [NB] int32
    K: tl.constexpr,
    H: tl.constexpr,
    TOPK: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,      # 16-bit tiles multiplied in fp32 (Triton's interpreter: its bf16 tl.dot is wrong)
    EVEN_K: tl.constexpr,
):
    i_b, i_n = tl.program_id(0), tl.program_id(1)
    i_e = tl.load(block_expert + i_b)
    if i_e >= 0:
        o_m = tl.arange(0, BM)
        m_m = o_m < tl.load(block_rows + i_b)
        o_t = tl.load(sorted_rows + i_b * BM + o_m, mask=m_m, other=0) // TOPK     # [BM] tokens
        o_n = i_n * BN + tl.arange(0, BN)
        m_n = o_n < H
        o_k = tl.arange(0, BK)
        p_x = x + o_t[:, None] * K + o_k[None, :]                                  # [BM, BK] gathered rows
        w_e = w + i_e.to(tl.int64) * (2 * H if GATED else H) * K                 # the expert's weight (int64)
        p_w = w_e + (o_n[:, None] * K + o_k[None, :])                              # [BN, BK]
        b_acc = tl.zeros([BM, BN], dtype=tl.float32)
        b_up = tl.zeros([BM, BN], dtype=tl.float32)
        for i_k in range(0, K, BK):
            m_x, m_w = m_m[:, None], m_n[:, None]
            if not EVEN_K:
                m_k = i_k + o_k < K
                m_x, m_w = m_x & m_k[None, :], m_w & m_k[None, :]
            b_x = tl.load(p_x, mask=m_x, other=0.)
            b_w = tl.load(p_w, mask=m_w, other=0.)
            if DOT_F32:
                b_x, b_w = b_x.to(tl.float32), b_w.to(tl.float32)
            b_acc = tl.dot(b_x, tl.trans(b_w), b_acc, input_precision=PRECISION)
            if GATED:  # the up rows of the same columns, H rows further down
                b_u = tl.load(p_w + H * K, mask=m_w, other=0.)
                if DOT_F32:
                    b_u = b_u.to(tl.float32)
                b_up = tl.dot(b_x, tl.trans(b_u), b_up, input_precision=PRECISION)
            p_x += BK
            p_w += BK
        if ACT == "silu":
            b_acc = b_acc / (1. + tl.exp(-b_acc))
        elif ACT == "relu2":
            b_acc = tl.maximum(b_acc, 0.)
            b_acc = b_acc * b_acc
        else:  # "gelu" (erf form, as F.gelu)
            b_acc = 0.5 * b_acc * (1. + tl.math.erf(b_acc * 0.7071067811865476))
        if GATED:
            b_acc = b_acc * b_up
        p_h = h + (i_b * BM + o_m)[:, None] * H + o_n[None, :]
        tl.store(p_h, b_acc.to(h.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


@triton.heuristics({"EVEN_K": lambda args: args["H"] % args["BK"] == 0})
@triton.jit
def expert_down_kernel(
    h,              # [NB * BM, H]: slot order
    w,              # [E, D, H]
    y,              # [N * TOPK, D]: assignment order
    top_weight,     # [N * TOPK]
    sorted_rows,    # [NB * BM] int32 assignments
    block_expert,   # [NB] int32, -1 = unused block
    block_rows,     # [NB] int32
    H: tl.constexpr,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,      # 16-bit tiles multiplied in fp32 (Triton's interpreter: its bf16 tl.dot is wrong)
    EVEN_K: tl.constexpr,
):
    i_b, i_n = tl.program_id(0), tl.program_id(1)
    i_e = tl.load(block_expert + i_b)
    if i_e >= 0:
        o_m = tl.arange(0, BM)
        m_m = o_m < tl.load(block_rows + i_b)
        o_n = i_n * BN + tl.arange(0, BN)
        m_n = o_n < D
        o_k = tl.arange(0, BK)
        p_h = h + (i_b * BM + o_m)[:, None] * H + o_k[None, :]                    # [BM, BK]
        w_e = w + i_e.to(tl.int64) * D * H                                         # the expert's weight (int64)
        p_w = w_e + (o_n[:, None] * H + o_k[None, :])                              # [BN, BK]
        b_acc = tl.zeros([BM, BN], dtype=tl.float32)
        for i_k in range(0, H, BK):
            m_h, m_w = m_m[:, None], m_n[:, None]
            if not EVEN_K:
                m_k = i_k + o_k < H
                m_h, m_w = m_h & m_k[None, :], m_w & m_k[None, :]
            b_h = tl.load(p_h, mask=m_h, other=0.)
            b_w = tl.load(p_w, mask=m_w, other=0.)
            if DOT_F32:
                b_h, b_w = b_h.to(tl.float32), b_w.to(tl.float32)
            b_acc = tl.dot(b_h, tl.trans(b_w), b_acc, input_precision=PRECISION)
            p_h += BK
            p_w += BK
        o_a = tl.load(sorted_rows + i_b * BM + o_m, mask=m_m, other=0)           # [BM] assignments
        b_acc *= tl.load(top_weight + o_a, mask=m_m, other=0.).to(tl.float32)[:, None]
        p_y = y + o_a[:, None] * D + o_n[None, :]
        tl.store(p_y, b_acc.to(y.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


@triton.jit(do_not_specialize=["N"])
def expert_sum_kernel(
    y,              # [N * TOPK, D]
    out,            # [N, D]
    N,
    D: tl.constexpr,
    TOPK: tl.constexpr,
    BT: tl.constexpr,
    BD: tl.constexpr,
):
    i_t, i_d = tl.program_id(0), tl.program_id(1)
    o_t = i_t * BT + tl.arange(0, BT)
    o_d = i_d * BD + tl.arange(0, BD)
    m = (o_t < N)[:, None] & (o_d < D)[None, :]
    b_out = tl.zeros([BT, BD], dtype=tl.float32)
    for j in tl.static_range(TOPK):  # j = 0 .. k - 1, always in this order
        b_out += tl.load(y + (o_t[:, None] * TOPK + j) * D + o_d[None, :], mask=m, other=0.).to(tl.float32)
    tl.store(out + o_t[:, None] * D + o_d[None, :], b_out.to(out.dtype.element_ty), mask=m)


def _tile(block: int, dim: int) -> int:
    """A block size no larger than the dim needs (tl.dot takes 16 at least)."""
    return min(block, max(16, triton.next_power_of_2(dim)))


def _stages(config: GemmConfig, bm: int, bn: int, bk: int, weights: int, itemsize: int) -> int:
    """num_stages within SMEM_BUDGET: a stage holds a [BM, BK] input tile and `weights` [BN, BK] weight tiles."""
    per_stage = (bm + weights * bn) * bk * itemsize
    return max(1, min(config.num_stages, SMEM_BUDGET // per_stage))


def check_experts(x, first, second, top_index, top_weight, activation, gated) -> tuple[int, int, int]:
    """The checks of moe_experts; returns (E, D, I)."""
    if x.dim() != 2 or first.dim() != 3 or second.dim() != 3:
        raise ValueError(f"x must be [N, D], first [E, F, D], second [E, D, I]; got {tuple(x.shape)}, "
                         f"{tuple(first.shape)}, {tuple(second.shape)}")
    num_experts, fan_out, dim = first.shape
    inner = second.shape[2]
    if dim != x.shape[1] or second.shape[:2] != (num_experts, dim) or fan_out != (2 * inner if gated else inner):
        raise ValueError(f"expert weights do not fit x [N, {x.shape[1]}] (gated={gated}): first "
                         f"{tuple(first.shape)}, second {tuple(second.shape)}")
    if x.dtype not in FLOAT_INPUTS or first.dtype != x.dtype or second.dtype != x.dtype:
        raise ValueError(f"x and the weights must share one of {FLOAT_INPUTS}; got {x.dtype}, {first.dtype}, "
                         f"{second.dtype}")
    if top_index.dim() != 2 or top_index.shape[0] != x.shape[0] or top_weight.shape != top_index.shape:
        raise ValueError(f"top_index and top_weight must be [N, k] with N = {x.shape[0]}; got "
                         f"{tuple(top_index.shape)} and {tuple(top_weight.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {activation!r}; supported: {sorted(ACTIVATIONS)}")
    return num_experts, dim, inner


def moe_experts(
    x: torch.Tensor,
    first: torch.Tensor,
    second: torch.Tensor,
    top_index: torch.Tensor,
    top_weight: torch.Tensor,
    activation: str,
    gated: bool,
    config: ExpertsConfig | None = None,
) -> torch.Tensor:
    """out [N, D] in top_weight's dtype = sum_j top_weight[t, j] expert_{top_index[t, j]}(x[t]) (moe_experts_ref).

    x: [N, D] fp32 / bf16 / fp16; first: [E, F, D] of x's dtype, F = 2 I (gated: gate rows, then up rows) or I;
    second: [E, D, I] of x's dtype; top_index: [N, k] int32 / int64 in [0, E) (not validated), k distinct experts a
    token; top_weight: [N, k] float; activation: "silu", "relu2" or "gelu". config: experts_config's unless given.
    """
    num_experts, dim, inner = check_experts(x, first, second, top_index, top_weight, activation, gated)
    num_tokens, top_k = top_index.shape
    out = torch.empty(num_tokens, dim, dtype=top_weight.dtype, device=x.device)
    if num_tokens == 0:
        return out
    x, first, second = x.contiguous(), first.contiguous(), second.contiguous()
    num_rows = num_tokens * top_k
    cfg = config or experts_config(num_rows, num_experts, gated)
    layout = expert_layout(top_index, num_experts, cfg.block_m)
    nb, bm = layout.block_expert.shape[0], cfg.block_m
    # Triton's interpreter (3.9) returns garbage for bf16 tl.dot (numpy has no bf16): there the tiles go to fp32
    dot_f32 = os.environ.get("TRITON_INTERPRET") == "1"
    precision, itemsize = "ieee" if dot_f32 else PRECISION[x.dtype], x.element_size()

    h = torch.empty(nb * bm, inner, dtype=x.dtype, device=x.device)
    bn, bk = _tile(cfg.up.block_n, inner), _tile(cfg.up.block_k, dim)
    expert_up_kernel[(nb, triton.cdiv(inner, bn))](
        x, first, h, *layout[:3],
        K=dim, H=inner, TOPK=top_k, GATED=gated, ACT=activation, BM=bm, BN=bn, BK=bk, PRECISION=precision,
        DOT_F32=dot_f32,
        num_warps=cfg.up.num_warps, num_stages=_stages(cfg.up, bm, bn, bk, 2 if gated else 1, itemsize),
    )
    y = torch.empty(num_rows, dim, dtype=x.dtype, device=x.device)
    bn, bk = _tile(cfg.down.block_n, dim), _tile(cfg.down.block_k, inner)
    expert_down_kernel[(nb, triton.cdiv(dim, bn))](
        h, second, y, top_weight.contiguous().view(-1), *layout[:3],
        H=inner, D=dim, BM=bm, BN=bn, BK=bk, PRECISION=precision, DOT_F32=dot_f32,
        num_warps=cfg.down.num_warps, num_stages=_stages(cfg.down, bm, bn, bk, 1, itemsize),
    )
    bd = _tile(SUM_COLUMNS, dim)
    expert_sum_kernel[(triton.cdiv(num_tokens, SUM_TOKENS), triton.cdiv(dim, bd))](
        y, out, num_tokens, D=dim, TOPK=top_k, BT=SUM_TOKENS, BD=bd, num_warps=4,
    )
    return out
