"""Registers and spilled bytes of the GDN kernels for sm_90 (the H200), from Triton's compiler alone: no GPU needed.

    python -m benchmarks.gdn_registers

Compiles each kernel at the launch settings in verify_kernels/gdn, and candidates of benchmarks/sweep_gdn.py (the
flush's row loop at 2 stages, the switches that are off; Qwen3.5-9B shapes, the engine's 16-entry buffer, fp32
inputs), with the installed Triton, specialised as a launch would be (16-byte aligned pointers), and reads the
cubin's resource use with the cuobjdump shipped in Triton's wheel (and the PTX's cp.async count, shared memory from
the compiler, the SASS's instructions and loop bodies: an issue-bound kernel's time is what its warps issue).
Registers bound how many programs an SM holds, so the bytes in flight of a memory-bound kernel; spilled bytes
(STACK) are local-memory traffic. Figures in the kernels' comments come from here (Triton 3.6 or 3.9, as each says).
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from benchmarks.gdn import HV, H, K, V
from verify_kernels.gdn import commit, decode, fold, verify
from verify_kernels.registers import programs_per_sm, register_cap

TARGET = GPUTarget("cuda", 90, 32)
SHARED_MEMORY = 228 * 1024  # an sm_90 SM's
CAPACITY = 16
INDEX = ("state_slots", "buf_len", "req_slots", "num_nodes", "accepted", "num_accepted")
SCALARS = ("T", "A", "B", "flush_length")


def sass_shape(sass: str) -> tuple[int, list[int]]:
    """(instructions, each loop body's instructions) of a kernel's SASS listing (cuobjdump -sass): a loop body is the
    span from a backward branch's target to the branch. What a warp issues is the straight code plus each body
    times its trip count, which the listing does not know (the kernels' comments work it out where they quote it)."""
    address = {}
    instructions = []
    for line in sass.splitlines():
        found = re.match(r"\s+/\*([0-9a-f]{4,6})\*/\s+(.*?);", line)
        if found:
            address[int(found.group(1), 16)] = len(instructions)
            instructions.append(found.group(2))
    bodies = []
    for i, text in enumerate(instructions):
        branch = re.search(r"\bBRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", text)
        if branch and branch.group(1) and address.get(int(branch.group(1), 16), i) < i:
            bodies.append(i - address[int(branch.group(1), 16)] + 1)
    return len(instructions), bodies


def resources(kernel, constexprs: dict, num_warps: int, max_registers: int | None = None,
              types: dict[str, str] | None = None, num_stages: int = 1) -> tuple[int, int, int, int, int, list[int]]:
    """(registers, spilled bytes) per thread of `kernel` compiled with these constexprs for sm_90, its shared memory
    bytes per program, its asynchronous copies into shared memory (cp.async in the PTX: loads that a pipelined
    loop issues ahead), and its SASS instructions and loop bodies (sass_shape); max_registers: the launch's cap
    (Triton's maxnreg: verify_kernels/registers.py), where it sets one; types: arguments' types where not the GDN
    kernels' (e.g. "*bf16"); num_stages: the launch's (software pipelining of its loops)."""
    params = list(inspect.signature(kernel.fn).parameters)
    signature = {}
    for name in params:
        if name in constexprs:
            signature[name] = "constexpr"
        elif types and name in types:
            signature[name] = types[name]
        elif name in SCALARS:
            signature[name] = "i32"
        elif name in INDEX and not (name == "accepted" and constexprs.get("ENTRIES") == fold.ENTRIES_DECODE):
            signature[name] = "*i64"  # (a decode step's fold reads the token's beta in accepted's place)
        elif name == "state_desc" and constexprs.get("TMA", True):  # S0's boxes (fold.FOLD_TMA, or no TMA switch)
            signature[name] = f"tensordesc<fp32[{constexprs['K']}, {constexprs['BV']}]>"
        else:
            signature[name] = "*u8" if name == "ancestors" else "*fp32"
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(params) if signature[name].startswith("*")}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, aligned), target=TARGET,
                              options={"num_warps": num_warps, "num_stages": num_stages,
                                       **register_cap(max_registers)})
    cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.TemporaryDirectory() as folder:
        cubin = os.path.join(folder, "kernel.cubin")
        Path(cubin).write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", cubin], capture_output=True, text=True).stdout
        sass = subprocess.run([str(cuobjdump), "-sass", cubin], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    copies = len(re.findall(r"cp\.async\.c[ag]", compiled.asm["ptx"]))
    return (int(found.group(1)), int(found.group(2)), compiled.metadata.shared, copies, *sass_shape(sass))


def fold_args(shapes: dict, block_v: int, entries: int, append: bool, stages: int, tma: bool, split: bool,
              loads_first: bool = False) -> dict:
    """The fold kernel's constexprs (as fold.gdn_fold_fwd passes them; a 5-node step's node block)."""
    return dict(shapes, L=CAPACITY, BV=block_v, BC=fold.BLOCK_L, BL=fold.entry_block(CAPACITY), BB=fold.SCAN_BLOCK,
                BT=fold.BLOCK_L, ENTRIES=entries, APPEND=append, STAGES=stages, TMA=tma, SPLIT=split,
                LOADS_FIRST=loads_first)


def variants() -> list[tuple]:
    """(label, kernel, constexprs, warps[, register cap[, argument types]]) of every kernel the launchers pick at the
    current settings, and of candidates (resources' arguments)."""
    shapes = dict(H=H, HV=HV, K=K, V=V)
    out = []
    G = HV // H if verify.STATE_SHARE_KEY_HEAD else 1
    for BT, use_dot, what in ((16, False, "4-chain"), (16, True, "16-node tree")):
        block_v, warps = verify.STATE_DOT_CONFIGS[BT] if use_dot else verify.STATE_FMA_CONFIG
        heads = 1 if use_dot else G
        out.append((f"verify state pass, {what}", verify.gdn_verify_state_kernel,
                    dict(shapes, BT=BT, BV=block_v, BK=verify.STATE_BLOCK_K, G=heads,
                         NG=triton.next_power_of_2(heads), USE_DOT=use_dot,
                         PRECISION=verify.products_precision(verify.STATE_SPLIT_TF32 and use_dot), EXACT=False,
                         STAGES=verify.STATE_DOT_STAGES[BT] if use_dot else 0),
                    warps, verify.STATE_DOT_MAX_REGISTERS[BT] if use_dot else None))
        if use_dot:  # the engine's build (bf16 q and k) unrolled and pipelined (verify.STATE_DOT_STAGES candidates)
            for stages, bv in ((0, block_v), (3, block_v), (3, 64)):
                candidate = "candidate: " if stages != verify.STATE_DOT_STAGES[BT] else ""
                out.append((f"{candidate}verify state pass, {what}, bf16 q and k, "
                            f"{f'pipelined in {stages} stages' if stages else 'unrolled'}, {bv} columns",
                            verify.gdn_verify_state_kernel,
                            dict(shapes, BT=BT, BV=bv, BK=verify.STATE_BLOCK_K, G=1, NG=1, USE_DOT=True,
                                 PRECISION=verify.products_precision(verify.STATE_SPLIT_TF32), EXACT=True,
                                 STAGES=stages),
                            warps, verify.STATE_DOT_MAX_REGISTERS[BT], {"q": "*bf16", "k": "*bf16"}))
        if use_dot and not verify.STATE_SPLIT_TF32:  # its dots from operands split by a mask (a candidate)
            out.append(("candidate: verify state pass (16-node tree), dots split by mask",
                        verify.gdn_verify_state_kernel,
                        dict(shapes, BT=BT, BV=block_v, BK=verify.STATE_BLOCK_K, G=1, NG=1, USE_DOT=True,
                             PRECISION="tf32x3-split", EXACT=False, STAGES=verify.STATE_DOT_STAGES[BT]), warps))
        block_v, warps = verify.FUSED_CONFIGS[BT]
        for loads_first in sorted({verify.FUSED_LOADS_FIRST, True}):  # (and every load first, where it is off)
            candidate = "candidate: " if loads_first and not verify.FUSED_LOADS_FIRST else ""
            out.append((f"{candidate}verify fused (small batches){', loads first' if loads_first else ''}, {what}",
                        verify.gdn_verify_fused_kernel,
                        dict(shapes, L=CAPACITY, BT=BT, BL=16, BK=verify.FUSED_PRODUCTS_BLOCK_K,
                             BKS=verify.STATE_BLOCK_K, BV=block_v, USE_DOT=use_dot,
                             PRECISION=verify.products_precision(verify.FUSED_SPLIT_TF32),
                             PRODUCTS_STAGES=verify.PRODUCTS_STAGES, EXACT=False, LOADS_FIRST=loads_first), warps))
    for per_program, what in ((verify.TREE_HEADS_PER_PROGRAM, "4-chain"), (verify.TREE_DOT_HEADS_PER_PROGRAM,
                                                                          "16-node tree")):
        heads = per_program or HV // H
        tree_config = verify.TREE_SMALL_CONFIG if what == "4-chain" else verify.TREE_CONFIG
        out.append((f"verify tree pass, {what}", verify.gdn_verify_tree_kernel,
                    dict(shapes, L=CAPACITY, BT=16, BL=16, BK=verify.PRODUCTS_BLOCK_K, BV=tree_config[0],
                         NG=triton.next_power_of_2(heads), PRECISION=verify.products_precision(verify.TREE_SPLIT_TF32),
                         PRODUCTS_STAGES=verify.PRODUCTS_STAGES, GP=heads,
                         STACKED=verify.STACKED_PRODUCTS or verify.STACKED_READS, STACKED_READS=verify.STACKED_READS,
                         EXACT=False),
                    tree_config[1], verify.TREE_DOT_MAX_REGISTERS[16] if what == "16-node tree" else None))
    # the 16-node tree pass as the engine runs it (bf16 q and k, exact in TF32), uncapped and at the cap candidates
    # (verify.TREE_DOT_MAX_REGISTERS)
    for cap in (None, 96, 88):
        out.append((f"{'candidate: ' if cap else ''}verify tree pass, 16-node tree, bf16 q and k"
                    f"{f', capped at {cap}' if cap else ''}", verify.gdn_verify_tree_kernel,
                    dict(shapes, L=CAPACITY, BT=16, BL=16, BK=verify.PRODUCTS_BLOCK_K, BV=verify.TREE_CONFIG[0],
                         NG=1, PRECISION=verify.products_precision(verify.TREE_SPLIT_TF32),
                         PRODUCTS_STAGES=verify.PRODUCTS_STAGES, GP=verify.TREE_DOT_HEADS_PER_PROGRAM or HV // H,
                         STACKED=verify.STACKED_PRODUCTS or verify.STACKED_READS, STACKED_READS=verify.STACKED_READS,
                         EXACT=True),
                    verify.TREE_CONFIG[1], cap, {"q": "*bf16", "k": "*bf16"}))
    # the decode above SMALL_BATCH: state and buffer programs in one launch, then the finish (decode.DECODE_SPLIT_ROLES)
    out.append(("decode: state / buffer programs", decode.gdn_decode_roles_kernel,
                dict(shapes, L=CAPACITY, BV=decode.BLOCK_V, BVB=min(V, decode.SPLIT_BUFFER_BLOCK_V or decode.BLOCK_V),
                     BC=fold.BLOCK_L, BEFORE_LEN=decode.SPLIT_BUFFER_BEFORE_LEN), decode.NUM_WARPS,
                decode.SPLIT_ROLES_MAX_REGISTERS))
    out.append(("decode + commit: finish", decode.gdn_decode_finish_kernel,
                dict(shapes, L=CAPACITY, BV=decode.SPLIT_FINISH_BLOCK_V, COMMIT=True), decode.SPLIT_FINISH_WARPS))
    for commit_, here, what in ((False, False, "decode, per row"), (True, True, "decode + commit, per row, folding "
                                                                               "in place (small batches)")):
        block_v = decode.SMALL_BLOCK_V if here else decode.BLOCK_V
        out.append((what, decode.gdn_decode_kernel,
                    dict(shapes, L=CAPACITY, BV=block_v, BC=fold.BLOCK_L, BEFORE_LEN=decode.BUFFER_BEFORE_LEN,
                         COMMIT=commit_, FOLD_HERE=here),
                    decode.SMALL_WARPS if here else decode.NUM_WARPS))
    for entries, append, what in ((fold.ENTRIES_NONE, False, "flush"), (fold.ENTRIES_TOKEN, False, "decode's fold"),
                                  (fold.ENTRIES_DECODE, False, "decode step in which every row folds"),
                                  (fold.ENTRIES_ACCEPTED, False, "commit's fold"),
                                  (fold.ENTRIES_ACCEPTED, True, "commit in one launch (small batches)")):
        stages, warps, block_v = fold.fold_launch(CAPACITY, append, entries, fold.FOLD_TMA)
        out.append((f"fold: {what}", fold.gdn_fold_kernel,
                    fold_args(shapes, block_v, entries, append, stages, fold.FOLD_TMA, fold.FOLD_SPLIT_TF32),
                    warps))
    # plain decoding's step in which every row folds, at its default launch (decode.FOLDING_DECODE
    # "decode-then-fold"): the decode's fold in the pipelined row loop
    stages, warps, block_v = fold.fold_launch(CAPACITY, False, fold.ENTRIES_TOKEN, fold.FOLD_TMA,
                                              every_row_folds=True)
    out.append(("fold: decode's fold where every row folds", fold.gdn_fold_kernel,
                fold_args(shapes, block_v, fold.ENTRIES_TOKEN, False, stages, fold.FOLD_TMA, fold.FOLD_SPLIT_TF32),
                warps))
    out.append(("commit's append", commit.gdn_append_kernel, dict(shapes, L=CAPACITY, BC=fold.BLOCK_L),
                commit.APPEND_WARPS))
    # the flush's software-pipelined row loop at 2 stages on FOLD_BLOCK_V columns and FOLD_WARPS (a sweep candidate)
    out.append(("candidate: fold's flush, row loop in 2 stages", fold.gdn_fold_kernel,
                fold_args(shapes, fold.FOLD_BLOCK_V, fold.ENTRIES_NONE, False, 2, fold.FOLD_TMA, fold.FOLD_SPLIT_TF32),
                fold.FOLD_WARPS))
    # S0's tiles through a tensor descriptor (fold.FOLD_TMA) where it is off: the flush, the commit's looped row
    if not fold.FOLD_TMA:
        for entries, what, warps in ((fold.ENTRIES_NONE, "flush", fold.FOLD_WARPS),
                                     (fold.ENTRIES_ACCEPTED, "commit's fold", fold.LOOPED_FOLD_WARPS),
                                     (fold.ENTRIES_ACCEPTED, "commit's fold", 4)):
            stages, _, block_v = fold.fold_launch(CAPACITY, False, entries)
            out.append((f"candidate: fold: {what}, TMA tiles", fold.gdn_fold_kernel,
                        fold_args(shapes, block_v, entries, False, stages, True, fold.FOLD_SPLIT_TF32), warps))
    # the fold's tf32x3 operands split by a mask (fold.FOLD_SPLIT_TF32) where it is off, with and without TMA tiles
    if not fold.FOLD_SPLIT_TF32:
        for entries, what, warps, tma in ((fold.ENTRIES_NONE, "flush", fold.FOLD_WARPS, False),
                                          (fold.ENTRIES_ACCEPTED, "commit's fold", fold.LOOPED_FOLD_WARPS, False),
                                          (fold.ENTRIES_ACCEPTED, "commit's fold", 4, True)):
            stages, _, block_v = fold.fold_launch(CAPACITY, False, entries)
            out.append((f"candidate: fold: {what}, operands split by mask{', TMA tiles' if tma else ''}",
                        fold.gdn_fold_kernel,
                        fold_args(shapes, block_v, entries, False, stages, tma, True),
                        warps))
    # the looped row's loads all issued first (fold.LOOPED_LOADS_FIRST) where it is off: the commit's fold (its
    # default launch, and on 4 warps), the decode's fold where few rows fold
    if not fold.LOOPED_LOADS_FIRST:
        for entries, append, what, warps in ((fold.ENTRIES_ACCEPTED, False, "commit's fold", None),
                                             (fold.ENTRIES_ACCEPTED, False, "commit's fold", 4),
                                             (fold.ENTRIES_TOKEN, False, "decode's fold", None)):
            stages, default_warps, block_v = fold.fold_launch(CAPACITY, append, entries, fold.FOLD_TMA)
            out.append((f"candidate: fold: {what}, loads first{f', {warps} warps' if warps else ''}",
                        fold.gdn_fold_kernel,
                        fold_args(shapes, block_v, entries, append, stages, fold.FOLD_TMA, fold.FOLD_SPLIT_TF32,
                                  loads_first=True), warps or default_warps))
    # the small trees' tree pass (verify.SMALL_TREE_PASS), node by node, a 5-node chain (the engine's 4-token
    # chain), on or as the candidate it is while off
    heads = verify.SMALL_TREE_HEADS_PER_PROGRAM or HV // H
    for config, rows in ((verify.SMALL_TREE_CONFIG, ""), (verify.SMALL_TREE_FEW_ROWS_CONFIG, ", few rows")):
        if config is None:  # (few rows through the tensor-core pass)
            continue
        block_v, warps, v_programs = config
        out.append((f"{'' if verify.SMALL_TREE_PASS else 'candidate: '}verify small trees' tree pass (5-chain{rows})",
                    verify.gdn_verify_small_tree_kernel,
                    dict(shapes, L=CAPACITY, BN=8, BL=16, BK=verify.SMALL_TREE_BLOCK_K,
                         BV=min(V // v_programs, block_v), GP=heads, NG=triton.next_power_of_2(heads), VP=v_programs,
                         PRECISION=verify.products_precision(verify.TREE_SPLIT_TF32), EXACT=False), warps,
                    verify.SMALL_TREE_MAX_REGISTERS))
    # the tree pass's stacked products (verify.STACKED_PRODUCTS) and reads (verify.STACKED_READS) where they are off
    if not (verify.STACKED_PRODUCTS or verify.STACKED_READS):
        heads = verify.TREE_HEADS_PER_PROGRAM or HV // H
        for reads in (False, True):
            out.append((f"candidate: verify tree pass (4-chain), stacked products{' and reads' if reads else ''}",
                        verify.gdn_verify_tree_kernel,
                        dict(shapes, L=CAPACITY, BT=16, BL=16, BK=verify.PRODUCTS_BLOCK_K,
                             BV=verify.TREE_SMALL_CONFIG[0],
                             NG=triton.next_power_of_2(heads), PRECISION=verify.DOT_PRECISION,
                             PRODUCTS_STAGES=verify.PRODUCTS_STAGES, GP=heads, STACKED=True,
                             STACKED_READS=reads), verify.TREE_SMALL_CONFIG[1]))
    # the tree pass's tf32x3 operands split by a mask (verify.TREE_SPLIT_TF32) where it is off
    if not verify.TREE_SPLIT_TF32:
        heads = verify.TREE_HEADS_PER_PROGRAM or HV // H
        for block_v, warps in (verify.TREE_SMALL_CONFIG, (64, 4)):
            out.append((f"candidate: verify tree pass (4-chain), operands split by mask, {block_v} columns",
                        verify.gdn_verify_tree_kernel,
                        dict(shapes, L=CAPACITY, BT=16, BL=16, BK=verify.PRODUCTS_BLOCK_K, BV=block_v,
                             NG=triton.next_power_of_2(heads), PRECISION="tf32x3-split",
                             PRODUCTS_STAGES=verify.PRODUCTS_STAGES, GP=heads,
                             STACKED=verify.STACKED_PRODUCTS or verify.STACKED_READS,
                             STACKED_READS=verify.STACKED_READS), warps))
    return out


def main() -> None:
    print(f"triton {triton.__version__}, sm_90, H={H} HV={HV} K={K} V={V}, buffer {CAPACITY}")
    print("| kernel | warps | registers | spilled bytes | shared memory bytes | programs an SM | cp.async in PTX | "
          "SASS instructions | loop bodies |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, kernel, constexprs, warps, *cap in variants():
        registers, spilled, shared, copies, instructions, bodies = resources(kernel, constexprs, warps, *cap)
        print(f"| {label} | {warps} | {registers} | {spilled} | {shared} | {programs_an_sm(registers, warps, shared)} "
              f"| {copies} | {instructions} | {', '.join(map(str, bodies)) or '-'} |", flush=True)


def programs_an_sm(registers: int, warps: int, shared: int) -> int:
    """Programs an sm_90 SM holds at once: by its registers (verify_kernels/registers.py), its 228 KiB of shared
    memory (1 KiB of it reserved a program), 32 programs and 64 warps."""
    by_shared = SHARED_MEMORY // (shared + 1024)
    return min(programs_per_sm(registers, warps), by_shared, 32, 64 // warps)


if __name__ == "__main__":
    main()
