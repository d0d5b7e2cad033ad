"""Registers, spilled bytes and programs an SM of the Mamba2 verify and commit kernels for sm_90 (the H200), from
Triton's compiler alone: no GPU needed (benchmarks/gdn_registers.py does the same for the GDN kernels and holds the
compile; this file only names the Mamba2 kernels' settings).

    python -m benchmarks.mamba2_registers

Nemotron-3-Nano's heads (benchmarks/mamba2.py), the engine's 16-entry buffer, 5-node chains (node block 16), B and C
in bf16 as the glue leaves them; each kernel at the launch settings of verify_kernels/mamba2 (its register cap
included) and, where a cap is a sweep candidate, capped as the candidate is. The counts in the kernels' comments
come from here with the H200's Triton (3.6)."""

from __future__ import annotations

import triton

from benchmarks.gdn_registers import TARGET, programs_an_sm, resources
from benchmarks.mamba2 import NG, NH, N, P
from benchmarks.sweep_mamba2 import REGISTER_CAPS
from verify_kernels.mamba2 import commit, verify

CAPACITY = 16
# the arguments' types where not the GDN kernels' (gdn_registers.resources): the nodes' B and C in bf16; the verify's A
# is the heads' decay parameter (a pointer), the commit's the accepted width (an int, as the GDN fold's)
VERIFY_TYPES = {"Bm": "*bf16", "C": "*bf16", "A": "*fp32"}
COMMIT_TYPES = {"bm": "*bf16", "flushed": "*i1"}


def variants() -> list[tuple[str, object, dict, int, int, dict, int | None]]:
    """(label, kernel, constexprs, warps, stages, argument types, register cap) of the split verify's two launches at
    node block 16
    and the commit: at the settings, then at each candidate cap."""
    BT, BL = 16, 16
    config = verify.verify_config(256, 5, P)
    exact = dict(PRECISION=config.precision or verify.DOT_PRECISION, B_EXACT=True, C_EXACT=True)
    shapes = dict(NH=NH, NG=NG, P=P, N=N, L=CAPACITY, BT=BT, BL=BL)
    roles = (verify.mamba2_verify_roles_kernel,
             dict(shapes, BP=config.block_p, BN=config.block_n, BNS=verify.PRODUCTS_BLOCK_N, **exact),
             config.num_warps, config.num_stages, VERIFY_TYPES)
    finish = (verify.mamba2_verify_kernel,
              dict(shapes, BP=min(P, config.finish_block_p or config.block_p), BN=config.block_n, FMA_NODES=0,
                   INLINE_SCORES=False, N_LOOP=False, HC_IN=True, **exact),
              config.finish_warps or config.num_warps, config.num_stages, VERIFY_TYPES)
    block_p = min(P, commit.BLOCK_P_MAX)
    committing = (commit.mamba2_commit_kernel,
                  dict(NH=NH, NG=NG, P=P, N=N, L=CAPACITY, BLOCK_P=block_p, BLOCK_E=commit.BLOCK_E,
                       HAS_ACCEPTED=True), commit.NUM_WARPS, 1, COMMIT_TYPES)
    out = [("verify, state programs and scores (first launch)", *roles, config.roles_max_registers),
           ("verify, the rest (second launch)", *finish, config.finish_max_registers),
           ("commit", *committing, commit.MAX_REGISTERS)]
    for cap in sorted({r for r, _ in REGISTER_CAPS if r is not None}):
        out.append((f"candidate: verify first launch capped at {cap}", *roles, cap))
    for cap in sorted({f for _, f in REGISTER_CAPS if f is not None}):
        out.append((f"candidate: verify second launch capped at {cap}", *finish, cap))
    out.append(("candidate: commit capped at 96", *committing, 96))
    return out


def main() -> None:
    print(f"triton {triton.__version__}, sm_{TARGET.arch}, NH={NH} NG={NG} P={P} N={N}, buffer {CAPACITY}, "
          "5-node chains")
    print("| kernel | warps | register cap | registers | spilled bytes | shared memory bytes | programs an SM |")
    print("|---|---|---|---|---|---|---|")
    for label, kernel, constexprs, warps, stages, types, cap in variants():
        registers, spilled, shared, *_ = resources(kernel, constexprs, warps, cap, types, stages)
        print(f"| {label} | {warps} | {cap or '-'} | {registers} | {spilled} | {shared} | "
              f"{programs_an_sm(registers, warps, shared)} |", flush=True)


if __name__ == "__main__":
    main()
