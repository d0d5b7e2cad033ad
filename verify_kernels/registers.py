"""A launch's cap on a kernel's registers a thread (Triton's `maxnreg` launch option), for latency-bound kernels
whose programs the GPU runs in waves: an SM holds as many programs as its 65536 registers allow (allocated per warp
in steps of 256), so a cap just under a step (e.g. 134 -> 128 registers on one warp: 15 -> 16 programs an SM) can
remove a wave. Triton's interpreter takes the option and ignores it (the CPU tests run both ways). The caps are
sweep candidates until the GPU times them (benchmarks/sweep_gdn_candidates.py, benchmarks/sweep_mamba2.py)."""


def register_cap(registers: int | None) -> dict:
    """Launch keyword arguments: {"maxnreg": registers}, or none where no cap is set."""
    return {} if registers is None else {"maxnreg": registers}


def programs_per_sm(registers: int, warps: int) -> int:
    """How many programs of `warps` warps at `registers` registers a thread an SM's 65536 registers hold (NVIDIA's
    allocation: a warp's registers rounded up to a multiple of 256; other limits, shared memory and the SM's 32
    blocks and 64 warps, apart)."""
    per_warp = -(-registers * 32 // 256) * 256
    return (65536 // per_warp) // warps
