"""The candidates of benchmarks/sweep_gdn.py: the launch settings it tries per op (the defaults first, then one change
or one coupled set at a time), as names of the verify_kernels modules' constants, and their application around a
timed run. Comments say why each candidate is there; the settings' own comments hold what the sweeps measured."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from verify_kernels.conv import tree_conv
from verify_kernels.gdn import commit, decode, fold, verify

MODULES = {"fold": fold, "decode": decode, "verify": verify, "commit": commit, "conv": tree_conv}


@dataclass
class Candidate:
    op: str
    label: str
    changes: dict[str, object] = field(default_factory=dict)  # "module.NAME" -> value

    def code(self) -> str:
        return "; ".join(f"{name} = {value!r}" for name, value in self.changes.items()) or "(defaults)"


def candidates(ops: set[str]) -> list[Candidate]:
    """The settings tried per op: the default first, then one change (or one coupled pair) at a time."""
    out = []
    if "fold" in ops:
        out.append(Candidate("fold", "defaults"))
        # around the defaults (the pipelined row loop, [128, 32] tiles, 4 warps, 3 stages: the H200 sweep of
        # 2026-12-03): V columns and warps, lanes, stages; and the looped row of before it
        for bv, warps in ((16, 4), (16, 2), (32, 8), (64, 8)):
            out.append(Candidate("fold", f"BV {bv}, {warps} warps",
                                 {"fold.FOLD_BLOCK_V": bv, "fold.FOLD_WARPS": warps}))
        for lanes in (2, 8, 16):
            out.append(Candidate("fold", f"{lanes} lanes", {"fold.FOLD_LANES": lanes}))
        for stages in (2, 4):
            out.append(Candidate("fold", f"row loop in {stages} stages", {"fold.FOLD_STAGES": stages}))
        out.append(Candidate("fold", "the looped row (2 warps, 1 stage)", {"fold.FOLD_STAGES": 1}))
        # the tf32x3 operands split by a mask (fold.FOLD_SPLIT_TF32), alone and with TMA tiles
        for tma, stages in ((False, 3), (True, 3), (True, 4)):
            out.append(Candidate("fold", f"operands split by mask{', TMA tiles' if tma else ''}, {stages} stages",
                                 {"fold.FOLD_SPLIT_TF32": True, "fold.FOLD_TMA": tma, "fold.FOLD_STAGES": stages}))
        # S0's tiles through a tensor descriptor (fold.FOLD_TMA): the copy engine's boxes, no per-element addresses
        for stages, bv, warps in ((3, 32, 4), (4, 32, 4), (3, 64, 8), (2, 64, 4)):
            out.append(Candidate("fold", f"TMA tiles, {stages} stages, BV {bv}, {warps} warps",
                                 {"fold.FOLD_TMA": True, "fold.FOLD_STAGES": stages, "fold.FOLD_BLOCK_V": bv,
                                  "fold.FOLD_WARPS": warps}))
    if "append" in ops:
        out.append(Candidate("append", "defaults"))
        out.append(Candidate("append", "2 warps", {"commit.APPEND_WARPS": 2}))
        # the fold kernel launched beside the append folds nothing here: what its row loop costs then
        out.append(Candidate("append", "the looped-row fold", {"fold.FOLD_STAGES": 1}))
    if "commit" in ops:
        out.append(Candidate("commit", "defaults"))
        for lanes in (8, 16, 32):
            out.append(Candidate("commit", f"{lanes} fold lanes", {"fold.FOLD_LANES": lanes}))
        out.append(Candidate("commit", "the looped-row fold", {"fold.FOLD_STAGES": 1}))
        out.append(Candidate("commit", "the looped-row fold, 16 lanes", {"fold.FOLD_STAGES": 1, "fold.FOLD_LANES": 16}))
        # the looped row's tile and warps (fold.LOOPED_FOLD_BLOCK_V: [128, 32] on 2 warps spills, [128, 16] not)
        for bv, warps in ((16, 2), (16, 4), (32, 4)):
            out.append(Candidate("commit", f"looped-row fold BV {bv}, {warps} warps",
                                 {"fold.LOOPED_FOLD_BLOCK_V": bv, "fold.LOOPED_FOLD_WARPS": warps}))
        # the fold's tf32x3 operands split by a mask (fold.FOLD_SPLIT_TF32), alone and with TMA tiles on 4 warps
        out.append(Candidate("commit", "operands split by mask", {"fold.FOLD_SPLIT_TF32": True}))
        for bv, lanes in ((32, 4), (32, 16), (64, 4)):
            out.append(Candidate("commit", f"operands split by mask, TMA tiles, BV {bv}, 4 warps, {lanes} lanes",
                                 {"fold.FOLD_SPLIT_TF32": True, "fold.FOLD_TMA": True, "fold.LOOPED_FOLD_BLOCK_V": bv,
                                  "fold.LOOPED_FOLD_WARPS": 4, "fold.FOLD_LANES": lanes}))
        # the looped row with S0's tiles through a tensor descriptor (fold.FOLD_TMA: fewer registers, more programs)
        for bv, warps, lanes in ((32, 2, 4), (32, 4, 4), (64, 4, 4), (32, 2, 16)):
            out.append(Candidate("commit", f"TMA looped-row fold BV {bv}, {warps} warps, {lanes} lanes",
                                 {"fold.FOLD_TMA": True, "fold.LOOPED_FOLD_BLOCK_V": bv,
                                  "fold.LOOPED_FOLD_WARPS": warps, "fold.FOLD_LANES": lanes}))
    if "decode" in ops:
        out.append(Candidate("decode", "defaults"))
        for bv, warps in ((32, 4), (64, 8)):
            out.append(Candidate("decode", f"BV {bv}, {warps} warps",
                                 {"decode.BLOCK_V": bv, "decode.NUM_WARPS": warps}))
        out.append(Candidate("decode", "buffer loaded after buf_len", {"decode.BUFFER_BEFORE_LEN": False}))
        out.append(Candidate("decode", "the looped-row fold", {"fold.FOLD_STAGES": 1}))
        out.append(Candidate("decode", "TMA fold tiles", {"fold.FOLD_TMA": True}))
        out.append(Candidate("decode", "fold operands split by mask", {"fold.FOLD_SPLIT_TF32": True}))
        out.append(Candidate("decode", "fold operands split by mask, TMA tiles, 4 warps",
                             {"fold.FOLD_SPLIT_TF32": True, "fold.FOLD_TMA": True, "fold.LOOPED_FOLD_WARPS": 4}))
        # S0's tile of the per-row grid through a tensor descriptor (decode.DECODE_TMA), its fold's too
        for bv, warps in ((64, 4), (32, 4), (64, 8), (128, 8)):
            out.append(Candidate("decode", f"TMA tiles, BV {bv}, {warps} warps",
                                 {"decode.DECODE_TMA": True, "fold.FOLD_TMA": True, "decode.BLOCK_V": bv,
                                  "decode.NUM_WARPS": warps}))
        for bv, warps in ((16, 2), (16, 4)):
            out.append(Candidate("decode", f"looped-row fold BV {bv}, {warps} warps",
                                 {"fold.LOOPED_FOLD_BLOCK_V": bv, "fold.LOOPED_FOLD_WARPS": warps}))
        # fla's fused_recurrent shape: narrow tiles on one warp (its reductions over K stay in the warp)
        for bv, warps in ((8, 1), (16, 1), (16, 2)):
            out.append(Candidate("decode", f"BV {bv}, {warps} warp{'s' * (warps > 1)}",
                                 {"decode.BLOCK_V": bv, "decode.NUM_WARPS": warps}))
        # the software-pipelined row loop (decode.DECODE_STAGES > 1): stages, V columns, warps, lanes
        for stages, bv, warps, lanes in ((2, 64, 4, 8), (3, 64, 4, 8), (2, 32, 4, 4), (3, 32, 4, 8), (2, 64, 4, 16)):
            out.append(Candidate("decode", f"row loop in {stages} stages, BV {bv}, {warps} warps, {lanes} lanes",
                                 {"decode.DECODE_STAGES": stages, "decode.BLOCK_V": bv, "decode.NUM_WARPS": warps,
                                  "decode.DECODE_LANES": lanes}))
    if "verify" in ops:
        out.append(Candidate("verify", "defaults"))
        # the tree pass's products over K with keys and queries stacked (verify.STACKED_PRODUCTS): K columns a step,
        # the tree pass's V columns and warps
        # (and verify.STACKED_READS: the V loop's buffer reads kr and qr one product)
        for bk, bv, warps, reads in ((16, 32, 2, False), (32, 32, 2, False), (16, 64, 4, False), (16, 16, 2, False),
                                     (16, 32, 2, True), (16, 64, 4, True)):
            out.append(Candidate("verify", f"stacked products{' and reads' if reads else ''}, BK {bk}, tree pass BV "
                                           f"{bv}, {warps} warps",
                                 {"verify.STACKED_PRODUCTS": True, "verify.STACKED_READS": reads,
                                  "verify.PRODUCTS_BLOCK_K": bk, "verify.TREE_BLOCK_V": bv,
                                  "verify.TREE_WARPS": warps}))
        # the tree pass's tf32x3 operands split by a mask (verify.TREE_SPLIT_TF32: no emulated roundings), its V
        # columns and warps
        for bv, warps in ((32, 2), (64, 4), (64, 2)):
            out.append(Candidate("verify", f"tree pass operands split by mask, BV {bv}, {warps} warps",
                                 {"verify.TREE_SPLIT_TF32": True, "verify.TREE_BLOCK_V": bv,
                                  "verify.TREE_WARPS": warps}))
        # several rows' small trees packed into one tree-pass program (verify.PACKED_ROWS): rows, columns, warps,
        # Triton's tf32x3 or operands split by a mask
        for rows, bv, warps, split in ((3, 32, 4, True), (3, 32, 4, False), (2, 32, 4, True), (3, 16, 4, True),
                                       (3, 32, 8, True)):
            out.append(Candidate("verify", f"packed tree pass, {rows} rows, BV {bv}, {warps} warps"
                                           f"{', split by mask' if split else ''}",
                                 {"verify.PACKED_ROWS": True, "verify.PACKED_MAX_ROWS": rows,
                                  "verify.PACKED_BLOCK_V": bv, "verify.PACKED_WARPS": warps,
                                  "verify.TREE_SPLIT_TF32": split}))
        # the tree pass's loops over K and V: steps in flight (verify.PRODUCTS_STAGES, pipelined loads held in
        # registers and shared memory of a pass that is issue-bound at 249 registers) and K columns a step
        for stages, bk in ((1, 16), (2, 16), (1, 32), (3, 32)):
            out.append(Candidate("verify", f"tree pass loops in {stages} stages, BK {bk}",
                                 {"verify.PRODUCTS_STAGES": stages, "verify.PRODUCTS_BLOCK_K": bk}))
        # the tree pass of trees up to FMA_MAX_NODES on the FMA units (verify.TREE_FMA; the 4-chain): its best
        # candidate of the 2026-12-03 sweep (the others were slower still)
        for bv, warps, heads in ((16, 2, None),):
            out.append(Candidate("verify", f"tree pass on the FMA units, BV {bv}, {warps} warps, "
                                           f"{'a key head' if heads is None else 'a value head'} per program",
                                 {"verify.TREE_FMA": True, "verify.TREE_FMA_BLOCK_V": bv,
                                  "verify.TREE_FMA_WARPS": warps, "verify.TREE_HEADS_PER_PROGRAM": heads}))
        # the state pass one node at a time (the 4-chain): per key head or per value head, V columns, warps
        for share, bv, warps in ((True, 16, 4), (True, 32, 2), (False, 64, 4), (False, 64, 2)):
            out.append(Candidate("verify", f"state pass per {'key' if share else 'value'} head, BV {bv}, {warps} warps",
                                 {"verify.STATE_SHARE_KEY_HEAD": share, "verify.STATE_FMA_CONFIG": (bv, warps)}))
        # ... its tile through a tensor descriptor (verify.STATE_TMA, per value head)
        for bv, warps in ((64, 2), (64, 4), (128, 4)):
            out.append(Candidate("verify", f"state pass TMA tile, BV {bv}, {warps} warps",
                                 {"verify.STATE_TMA": True, "verify.STATE_FMA_CONFIG": (bv, warps)}))
        # the state pass as dots (the 16-node tree), and with their operands split by a mask (verify.STATE_SPLIT_TF32)
        for bv, warps in ((32, 4), (64, 8)):
            out.append(Candidate("verify", f"state pass dots BV {bv}, {warps} warps",
                                 {"verify.STATE_DOT_CONFIGS": {**verify.STATE_DOT_CONFIGS, 16: (bv, warps)}}))
        for bv, warps in ((64, 4), (128, 4)):
            out.append(Candidate("verify", f"state pass dots split by mask, BV {bv}, {warps} warps",
                                 {"verify.STATE_SPLIT_TF32": True,
                                  "verify.STATE_DOT_CONFIGS": {**verify.STATE_DOT_CONFIGS, 16: (bv, warps)}}))
        for bv, warps in ((64, 4), (16, 2), (32, 4)):
            out.append(Candidate("verify", f"tree pass BV {bv}, {warps} warps",
                                 {"verify.TREE_BLOCK_V": bv, "verify.TREE_WARPS": warps}))
        out.append(Candidate("verify", "S0 reads one node at a time up to 16", {"verify.FMA_MAX_NODES": 16}))
        # the state pass's dots at every tree size, split by a mask (the FMA reads' shuffles against padded dots),
        # the tree pass per key head as for chains; with the tree pass's operands split too
        for tree_split in (False, True):
            out.append(Candidate("verify", f"state dots split by mask at every size{', tree pass split' * tree_split}",
                                 {"verify.FMA_MAX_NODES": 0, "verify.STATE_SPLIT_TF32": True,
                                  "verify.TREE_DOT_HEADS_PER_PROGRAM": None, "verify.TREE_SPLIT_TF32": tree_split}))
        for bv, warps in ((32, 2), (64, 4)):
            out.append(Candidate("verify", f"tree pass per value head at every width, BV {bv}, {warps} warps",
                                 {"verify.TREE_HEADS_PER_PROGRAM": 1, "verify.TREE_DOT_HEADS_PER_PROGRAM": 1,
                                  "verify.TREE_BLOCK_V": bv, "verify.TREE_WARPS": warps}))
        out.append(Candidate("verify", "tree pass per key head at every width",
                             {"verify.TREE_HEADS_PER_PROGRAM": None, "verify.TREE_DOT_HEADS_PER_PROGRAM": None}))
        # the FMA state pass as a software-pipelined row loop (verify.STATE_STAGES > 1): stages, V columns, warps,
        # lanes
        for stages, bv, warps, lanes in ((2, 64, 2, 8), (3, 64, 2, 8), (2, 64, 4, 8), (2, 32, 2, 8), (2, 64, 2, 16)):
            out.append(Candidate("verify", f"state row loop in {stages} stages, BV {bv}, {warps} warps, {lanes} lanes",
                                 {"verify.STATE_STAGES": stages, "verify.STATE_FMA_CONFIG": (bv, warps),
                                  "verify.STATE_LANES": lanes}))
    if "verify1" in ops:
        # batch 1, one launch (the fused kernel): its latency, V columns and warps, products over K in longer steps
        out.append(Candidate("verify1", "defaults"))
        for bv, warps in ((64, 4), (16, 2)):
            out.append(Candidate("verify1", f"fused BV {bv}, {warps} warps",
                                 {"verify.FUSED_CONFIGS": {**verify.FUSED_CONFIGS, 16: (bv, warps)}}))
        for bk, stages in ((32, 2), (64, 1)):
            out.append(Candidate("verify1", f"products {bk} columns, {stages} stages",
                                 {"verify.PRODUCTS_BLOCK_K": bk, "verify.PRODUCTS_STAGES": stages}))
        # its products from operands split by a mask (verify.FUSED_SPLIT_TF32): fewer instructions on the chain
        for bv, warps in ((32, 4), (16, 2)):
            out.append(Candidate("verify1", f"fused split by mask, BV {bv}, {warps} warps",
                                 {"verify.FUSED_SPLIT_TF32": True,
                                  "verify.FUSED_CONFIGS": {**verify.FUSED_CONFIGS, 16: (bv, warps)}}))
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
