"""Asking the L2 for a state tile ahead of its load, without holding registers for it.

The state-streaming kernels (GDN decode, fold, verify state pass; Mamba2 decode and verify) are register-bound: ncu
on the H200 (2026-12-03, batch 256) counted 3-4 programs per SM at 119-249 registers per thread, 8-16 warps, their
warps stalled on the S0 load most of the time, at 2.6-3.4 TB/s of the 4.2 the device copies at. The bytes a
program has in flight are its tile, which sits in registers, so more bytes in flight per SM meant more registers,
and capping registers instead spilled (benchmarks/results/sweeps_h200/sweep_gdn_maxnreg_2026-12-03.txt).
`prefetch.global.L2` takes no register and does not stall: a program asks for the tile of a program that will run
later (a few waves of the grid ahead, or its own next row), so that tile's load finds it in the L2.

Triton has no prefetch instruction, hence the inline PTX; Triton's CPU interpreter runs no PTX, so the kernels take
PREFETCH as a constexpr and launch with it off there (enabled()).
"""

import os

import triton
import triton.language as tl


def enabled(ahead: int) -> bool:
    """Whether a kernel launched now may prefetch `ahead` (> 0: on) programs or rows ahead: never in the
    interpreter."""
    return ahead > 0 and os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def prefetch_tile(base, row_stride, valid, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Ask the L2 for the fp32 tile [ROWS, COLS] at base, rows row_stride elements apart (one request per 128-byte
    line: 32 fp32 columns; COLS a power of two), if valid (a scalar); returns at once."""
    LINES: tl.constexpr = (COLS + 31) // 32
    STEP: tl.constexpr = COLS // LINES
    p_t = base + tl.arange(0, ROWS)[:, None] * row_stride + tl.arange(0, LINES)[None, :] * STEP
    if valid:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [p_t], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def program_ahead(state_slots, ahead, i_x, i_h, i_b, NX: tl.constexpr, NH: tl.constexpr):
    """The program `ahead` launches after (i_x, i_h, i_b) in a grid (NX, NH, B) with x fastest (the order the GPU
    starts them in): its i_x, i_h and state slot, and whether it exists and has a state (slot >= 0)."""
    lin = (i_b.to(tl.int64) * NH + i_h) * NX + i_x + ahead
    i_b2 = lin // (NX * NH)
    exists = i_b2 < tl.num_programs(2)
    i_s2 = tl.load(state_slots + i_b2, mask=exists, other=-1).to(tl.int64)
    return lin % NX, (lin // NX) % NH, i_s2, exists & (i_s2 >= 0)
