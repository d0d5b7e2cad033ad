"""The candidates of benchmarks/sweep_gdn.py: the launch settings it tries per op (the defaults first, then one change
or one coupled set at a time), as names of the verify_kernels modules' constants, and their application around a
timed run. Comments say why each candidate is there; the settings' own comments hold what the sweeps measured."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from verify_kernels.conv import conv_qkv, tree_conv
from verify_kernels.gdn import commit, decode, fold, verify

MODULES = {"fold": fold, "decode": decode, "verify": verify, "commit": commit, "conv": tree_conv,
           "conv_qkv": conv_qkv}


@dataclass
class Candidate:
    op: str
    label: str
    changes: dict[str, object] = field(default_factory=dict)  # "module.NAME" -> value

    def code(self) -> str:
        return "; ".join(f"{name} = {value!r}" for name, value in self.changes.items()) or "(defaults)"

    def settings(self) -> dict[str, object]:
        """The changes by the constants' full dotted names (benchmarks/kernel_settings.py)."""
        out = {}
        for name, value in self.changes.items():
            module, attr = name.split(".")
            out[f"{MODULES[module].__name__}.{attr}"] = value
        return out


def candidates(ops: set[str]) -> list[Candidate]:
    """The settings tried per op: the default first, then one change (or one coupled pair) at a time."""
    out = []
    if "fold" in ops:
        out.append(Candidate("fold", "defaults"))
        # around the defaults (S0's tiles through TMA, [128, 64] tiles on 8 warps, 3 stages, 4 lanes: the H200 sweep
        # of 2026-12-03, eighth sitting): stages, tiles and warps, lanes, the operands split by a mask
        for stages in (2, 4):
            out.append(Candidate("fold", f"{stages} stages", {"fold.FOLD_STAGES": stages}))
        for bv, warps, stages in ((128, 8, 3), (128, 4, 2), (64, 4, 3), (32, 4, 3), (32, 2, 3)):
            out.append(Candidate("fold", f"BV {bv}, {warps} warps, {stages} stages",
                                 {"fold.TMA_FOLD_BLOCK_V": bv, "fold.TMA_FOLD_WARPS": warps,
                                  "fold.FOLD_STAGES": stages}))
        for lanes in (2, 8):
            out.append(Candidate("fold", f"{lanes} lanes", {"fold.FOLD_LANES": lanes}))
        out.append(Candidate("fold", "operands split by mask", {"fold.FOLD_SPLIT_TF32": True}))
        # the fallback where the device has no TMA: the pointer loads' [128, 32] tiles on 4 warps
        out.append(Candidate("fold", "pointer loads (no TMA)", {"fold.FOLD_TMA": False}))
    if "append" in ops:
        out.append(Candidate("append", "defaults"))
        out.append(Candidate("append", "2 warps", {"commit.APPEND_WARPS": 2}))
    if "commit" in ops:
        out.append(Candidate("commit", "defaults"))
        out.append(Candidate("commit", "pointer loads (no TMA)", {"fold.FOLD_TMA": False}))
        # the looped row's operands split by a mask (fold.FOLD_SPLIT_TF32: 112 registers at 4 warps with TMA)
        for bv, warps, lanes in ((32, 2, 4), (32, 4, 4), (32, 4, 16), (64, 4, 4)):
            out.append(Candidate("commit", f"operands split by mask, BV {bv}, {warps} warps, {lanes} lanes",
                                 {"fold.FOLD_SPLIT_TF32": True, "fold.LOOPED_FOLD_BLOCK_V": bv,
                                  "fold.LOOPED_FOLD_WARPS": warps, "fold.FOLD_LANES": lanes}))
        # the looped row's loads all issued first (fold.LOOPED_LOADS_FIRST, written on the CPU on 2026-12-05: one
        # memory round trip a row instead of five; sm_90 with Triton 3.6, benchmarks.gdn_registers: 255 registers and
        # 8 bytes spilled on 2 warps, 165 and none on 4), on 2 and 4 warps (lanes left alone: a winner's FOLD_LANES
        # would move the flush too, which this op does not time)
        for warps in (2, 4):
            out.append(Candidate("commit", f"loads first, {warps} warps",
                                 {"fold.LOOPED_LOADS_FIRST": True, "fold.LOOPED_FOLD_WARPS": warps}))
    if "decode" in ops:
        out.append(Candidate("decode", "defaults"))
        out.append(Candidate("decode", "pointer loads in the fold (no TMA)", {"fold.FOLD_TMA": False}))
        out.append(Candidate("decode", "fold operands split by mask, 4 warps",
                             {"fold.FOLD_SPLIT_TF32": True, "fold.LOOPED_FOLD_WARPS": 4}))
        # the split roles (decode.DECODE_SPLIT_ROLES, on since 2026-12-04: [K, 64] tiles on 2 warps) around their
        # winner, and the per-row kernel they replaced
        out.append(Candidate("decode", "per-row kernel, 4 warps (the defaults before 2026-12-04)",
                             {"decode.DECODE_SPLIT_ROLES": False, "decode.NUM_WARPS": 4}))
        for bv, warps in ((64, 1), (128, 2), (128, 4), (32, 1)):
            out.append(Candidate("decode", f"split roles, BV {bv}, {warps} warps",
                                 {"decode.BLOCK_V": bv, "decode.NUM_WARPS": warps}))
        for bv, warps in ((64, 2), (32, 1), (128, 8)):
            out.append(Candidate("decode", f"split roles' finish, BV {bv}, {warps} warps",
                                 {"decode.SPLIT_FINISH_BLOCK_V": bv, "decode.SPLIT_FINISH_WARPS": warps}))
        out.append(Candidate("decode", "split roles, buffer loaded before buf_len",
                             {"decode.SPLIT_BUFFER_BEFORE_LEN": True}))
        out.append(Candidate("decode", "split roles, buffer programs over BLOCK_V (the defaults before 2026-12-04c)",
                             {"decode.SPLIT_BUFFER_BLOCK_V": None}))
        # ... their registers capped: 7 programs an SM, not 6 (decode.SPLIT_ROLES_MAX_REGISTERS; 8 bytes spilled)
        out.append(Candidate("decode", "split roles capped at 144 registers",
                             {"decode.SPLIT_ROLES_MAX_REGISTERS": 144}))
    if "foldstep" in ops:
        out.append(Candidate("foldstep", "defaults"))
        # the fold kernel decoding the token itself (one launch, S0 read once; the H200 of 2026-12-04, seventeenth
        # session: 612 against 545 us at batch 256 at the flush's tile, [128, 64] on 8 warps in 3 stages), over the
        # tiles, warps and stages that its sums over a tile's K rows may prefer; the decode's launches then the
        # pipelined fold at other tiles too
        for form in ("in-fold", "decode-then-fold"):
            for bv, warps, stages in ((64, 8, 3), (32, 4, 3), (64, 4, 3), (32, 8, 3), (64, 8, 2), (128, 8, 2)):
                if form == decode.FOLDING_DECODE and (bv, warps, stages) == (fold.TMA_FOLD_BLOCK_V,
                                                                             fold.TMA_FOLD_WARPS, fold.FOLD_STAGES):
                    continue  # (the defaults)
                out.append(Candidate("foldstep", f"{form}, BV {bv}, {warps} warps, {stages} stages",
                                     {"decode.FOLDING_DECODE": form, "fold.TMA_FOLD_BLOCK_V": bv,
                                      "fold.TMA_FOLD_WARPS": warps, "fold.FOLD_STAGES": stages}))
        out.append(Candidate("foldstep", "in-fold, pointer loads (no TMA)",
                             {"decode.FOLDING_DECODE": "in-fold", "fold.FOLD_TMA": False}))
    if "verify" in ops:
        out.append(Candidate("verify", "defaults"))
        # around the defaults (the H200 sweep of 2026-12-03, eighth sitting: the tree pass's and the 16-node state
        # dots' operands split by a mask; chains' tree pass at 64 columns on 2 warps, trees' at 32): the chains'
        # tree pass tile, warps, value heads per program, K steps and stages
        for bv, warps, heads in ((32, 2, None), (128, 4, None), (64, 2, 1), (32, 2, 1), (64, 4, 2)):
            out.append(Candidate("verify", f"chains' tree pass BV {bv}, {warps} warps"
                                           f"{f', {heads} value heads a program' if heads else ''}",
                                 {"verify.TREE_SMALL_CONFIG": (bv, warps), "verify.TREE_HEADS_PER_PROGRAM": heads}))
        for bk, stages in ((16, 3), (16, 2), (32, 4)):  # (16, 3): the defaults before 2026-12-04c
            out.append(Candidate("verify", f"tree pass BK {bk}, {stages} stages",
                                 {"verify.PRODUCTS_BLOCK_K": bk, "verify.PRODUCTS_STAGES": stages}))
        # the trees' tree pass: tile, warps, a key head per program
        for bv, warps, heads in ((32, 4, 1), (16, 2, 1), (32, 2, None)):
            out.append(Candidate("verify", f"trees' tree pass BV {bv}, {warps} warps, "
                                           f"{'a key head' if heads is None else 'a value head'} a program",
                                 {"verify.TREE_CONFIG": (bv, warps), "verify.TREE_DOT_HEADS_PER_PROGRAM": heads}))
        # the trees' state dots: tile and warps
        for bv, warps in ((128, 8), (64, 4), (256, 8)):
            out.append(Candidate("verify", f"16-node state dots BV {bv}, {warps} warps",
                                 {"verify.STATE_DOT_CONFIGS": {**verify.STATE_DOT_CONFIGS, 16: (bv, warps)}}))
        # ... their loop over K software-pipelined (verify.STATE_DOT_STAGES, written on the CPU on 2026-12-05: S0's
        # slices by cp.async into shared memory, 2 of 16 KiB ahead a program at 3 stages against 1 unrolled; sm_90 with
        # Triton 3.6 on bf16 q and k: 124 registers and 4 programs an SM at 128 columns, 78 and 6 at 64); with the
        # register cap of the defaults since the H100 sweep of 2026-12-05 (2 stages uncapped: 130.5 / 483.1 us at
        # batch 64 / 256 there, capped alone 127.5 / 461.1)
        for stages, bv in ((2, 128), (3, 128), (4, 128), (3, 64), (4, 64)):
            out.append(Candidate("verify", f"16-node state dots pipelined in {stages} stages, BV {bv}",
                                 {"verify.STATE_DOT_STAGES": {**verify.STATE_DOT_STAGES, 16: stages},
                                  "verify.STATE_DOT_CONFIGS": {**verify.STATE_DOT_CONFIGS, 16: (bv, 4)}}))
        # ... their registers uncapped (verify.STATE_DOT_MAX_REGISTERS, 128 by default since the H100 sweep of
        # 2026-12-05: 4 programs an SM, not 3)
        out.append(Candidate("verify", "16-node state dots uncapped (the defaults before the twenty-third session)",
                             {"verify.STATE_DOT_MAX_REGISTERS": {**verify.STATE_DOT_MAX_REGISTERS, 16: None}}))
        # ... and the trees' tree pass capped (verify.TREE_DOT_MAX_REGISTERS, latency-bound: 9 programs an SM at its
        # 106 registers, 10 at 96, 11 at 88, 16 bytes spilled at either cap)
        for registers in (96, 88):
            out.append(Candidate("verify", f"trees' tree pass capped at {registers} registers",
                                 {"verify.TREE_DOT_MAX_REGISTERS": {**verify.TREE_DOT_MAX_REGISTERS, 16: registers}}))
        # the previous defaults (Triton's tf32x3, 32 columns for chains too), for the record
        out.append(Candidate("verify", "Triton's tf32x3 (the defaults before the eighth sitting)",
                             {"verify.TREE_SPLIT_TF32": False, "verify.STATE_SPLIT_TF32": False,
                              "verify.TREE_SMALL_CONFIG": (32, 2),
                              "verify.STATE_DOT_CONFIGS": {**verify.STATE_DOT_CONFIGS, 16: (64, 4)}}))
    if "chains" in ops:
        # the chains' state pass (node by node on the FMA units): its [K, BV] tile of S0 puts K across 2 threads and
        # 2 warps at 64 columns on 2 warps (Triton 3.9's layout), so each node's two sums over K end in a shuffle and
        # a reduction through shared memory with barriers; on one warp only shuffles remain (187 registers at 32
        # columns, 120 at 16); and the 4-chain through the state dots (BT 16) instead, the chains' tree pass kept
        out.append(Candidate("chains", "defaults"))
        for bv, warps in ((32, 1), (16, 1), (32, 2), (128, 4)):
            out.append(Candidate("chains", f"state pass BV {bv}, {warps} warps",
                                 {"verify.STATE_FMA_CONFIG": (bv, warps)}))
        for bv, warps in ((128, 4), (64, 4), (64, 2)):
            out.append(Candidate("chains", f"state dots BV {bv}, {warps} warps",
                                 {"verify.FMA_MAX_NODES": 0, "verify.TREE_CONFIG": verify.TREE_SMALL_CONFIG,
                                  "verify.TREE_DOT_HEADS_PER_PROGRAM": verify.TREE_HEADS_PER_PROGRAM,
                                  "verify.STATE_DOT_CONFIGS": {**verify.STATE_DOT_CONFIGS, 16: (bv, warps)}}))
    if "smalltree" in ops:
        # trees up to 8 nodes (4- and 5-node chains, the 8-node tree) through the tensor-core tree pass (the defaults)
        # or the small trees' tree pass, node by node (verify.SMALL_TREE_PASS, written on the CPU on 2026-12-04,
        # eighteenth session: ~40-50% fewer instructions a program than the tensor-core pass by its sm_90 code) over
        # tiles, warps, programs along V (SMALL_TREE_CONFIG from SMALL_TREE_FEW_ROWS rows up: the batches below keep
        # SMALL_TREE_FEW_ROWS_CONFIG, so that a winner written for later benchmarks, kernel_settings.py, changes
        # only what the sweep timed there) and value heads a program (its products over K recomputed per value head
        # where 1); below SMALL_TREE_FEW_ROWS rows (batch 16) every candidate of the pass runs the few rows' config
        # (None since the sweep of 2026-12-05: the tensor-core pass), and one candidate gives them the pass
        out.append(Candidate("smalltree", "defaults"))
        out.append(Candidate("smalltree", "few rows too: small trees' tree pass BV 32, 1 warps, 4 programs along V",
                             {"verify.SMALL_TREE_FEW_ROWS_CONFIG": (32, 1, 4)}))
        for config, heads in (((128, 1, 1), None), ((64, 1, 1), None), ((128, 2, 1), None), ((128, 4, 1), None),
                              ((128, 1, 1), 1), ((64, 1, 2), None), ((32, 1, 4), None), ((32, 1, 4), 1)):
            block_v, warps, v_programs = config
            out.append(Candidate("smalltree", f"small trees' tree pass BV {block_v}, {warps} warps, {v_programs} "
                                              f"programs along V{', a value head a program' if heads else ''}",
                                 {"verify.SMALL_TREE_PASS": True, "verify.SMALL_TREE_CONFIG": config,
                                  "verify.SMALL_TREE_HEADS_PER_PROGRAM": heads}))
        out.append(Candidate("smalltree", "small trees' tree pass, K in steps of 16",
                             {"verify.SMALL_TREE_PASS": True, "verify.SMALL_TREE_BLOCK_K": 16}))
        # registers capped so that an SM holds 16 of the one-warp programs, not 15 (verify.SMALL_TREE_MAX_REGISTERS:
        # fewer waves at batch 64 / 128 / 256), alone and with the few rows' programs along V (batch 16: 2048 of them)
        for registers in (128, 120):
            out.append(Candidate("smalltree", f"small trees' tree pass, registers capped at {registers}",
                                 {"verify.SMALL_TREE_PASS": True, "verify.SMALL_TREE_MAX_REGISTERS": registers}))
        out.append(Candidate("smalltree", "few rows too, registers capped at 128",
                             {"verify.SMALL_TREE_FEW_ROWS_CONFIG": (32, 1, 4), "verify.SMALL_TREE_MAX_REGISTERS": 128}))
    if "verify1" in ops:
        # batch 1, one launch (the fused kernel): its latency, V columns and warps, products over K in longer steps
        out.append(Candidate("verify1", "defaults"))
        for bv, warps in ((64, 4), (32, 4), (32, 2)):
            out.append(Candidate("verify1", f"fused BV {bv}, {warps} warps",
                                 {"verify.FUSED_CONFIGS": {**verify.FUSED_CONFIGS, 16: (bv, warps)}}))
        for bk, stages in ((32, 2), (16, 2)):
            out.append(Candidate("verify1", f"products {bk} columns, {stages} stages",
                                 {"verify.FUSED_PRODUCTS_BLOCK_K": bk, "verify.PRODUCTS_STAGES": stages}))
        # every load issued once the slots are in (verify.FUSED_LOADS_FIRST, written on the CPU on 2026-12-05, on by
        # default at 16 columns on 2 warps since the H100 sweep of that day: two round trips to memory before the
        # products where there were five), and the kernel before it at its tile then
        out.append(Candidate("verify1", "loads in turn, fused BV 32, 4 warps (the defaults before the twenty-third "
                             "session)", {"verify.FUSED_LOADS_FIRST": False,
                                          "verify.FUSED_CONFIGS": {**verify.FUSED_CONFIGS, 16: (32, 4)}}))
        # two launches instead of one: the state pass then the tree pass, the larger batches' path (for the record)
        out.append(Candidate("verify1", "two passes", {"verify.FUSED_MAX_BATCH": 0}))
        # ... with the small trees' tree pass (the 4-chain; a value head and 32 columns a one-warp program: 128 of
        # them at batch 1, each ~2 k instructions by its sm_90 code)
        out.append(Candidate("verify1", "two passes, small trees' tree pass, a value head a program",
                             {"verify.FUSED_MAX_BATCH": 0, "verify.SMALL_TREE_PASS": True,
                              "verify.SMALL_TREE_HEADS_PER_PROGRAM": 1}))
    if "conv" in ops:  # (one node: the decode kernel, decode_conv.py, keeps its own setting)
        out.append(Candidate("conv", "defaults"))
        for block_d, warps in ((256, 2), (512, 4), (2048, 4), (2048, 8)):
            out.append(Candidate("conv", f"per node, {block_d} channels, {warps} warps",
                                 {"conv.ROWS": False, "conv.BLOCK_D": block_d, "conv.COMMIT_BLOCK_D": block_d,
                                  "conv.NUM_WARPS": warps}))
        # a program per row for all its nodes (conv.ROWS, the default): channels, warps
        for block_d, warps in ((64, 2), (128, 2), (128, 4), (256, 2), (256, 8), (512, 4)):
            out.append(Candidate("conv", f"per row, {block_d} channels, {warps} warps",
                                 {"conv.ROWS": True, "conv.ROWS_BLOCK_D": block_d, "conv.ROWS_WARPS": warps}))
    if "convqkv" in ops:
        # the conv with its q / k / v split fused in (conv_qkv.FUSED, written on the CPU on 2026-12-05: one launch and
        # the conv output's write and read less; sm_90 with Triton 3.6: 155 registers against the conv's 151 at 5
        # nodes, 32 for one node, no spill) against the conv then the split
        out.append(Candidate("convqkv", "defaults"))
        out.append(Candidate("convqkv", "fused", {"conv_qkv.FUSED": True}))
    if "small" in ops:
        out += [Candidate("small", "one launch", {"decode.SMALL_BATCH": 16, "verify.FUSED_MAX_BATCH": 16,
                                                  "commit.ONE_LAUNCH_MAX_BATCH": 16}),
                Candidate("small", "large-batch kernels", {"decode.SMALL_BATCH": 0, "verify.FUSED_MAX_BATCH": 0,
                                                           "commit.ONE_LAUNCH_MAX_BATCH": 0})]
    return out


@contextlib.contextmanager
def applied(candidate: Candidate):
    """The candidate's module constants set, then restored."""
    saved = []
    try:
        for name, value in candidate.changes.items():
            module, attr = name.split(".")
            saved.append((MODULES[module], attr, getattr(MODULES[module], attr)))
            setattr(MODULES[module], attr, value)
        yield
    finally:
        for module, attr, value in reversed(saved):
            setattr(module, attr, value)
