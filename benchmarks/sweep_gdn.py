"""Sweep of the GDN kernels' launch parameters on the GPU, at Qwen3.5-9B shapes and the engine's buffer (flush_length
16 = capacity): checks every kernel against its torch reference at full size first, then for each candidate setting
checks the op it changes again and times it (CUDA graphs, inputs rotated over >= 2 GiB of states, as
benchmarks/kernels.py), and prints one table and the best setting per op, as lines to paste into verify_kernels/gdn.

    python -m benchmarks.sweep_gdn                     # fold, append, decode, verify, small at batch 64 and 256
    python -m benchmarks.sweep_gdn --ops verify1,conv  # batch-1 verify; the conv kernels at batch 64 and 256
    python -m benchmarks.sweep_gdn --ops verify --batches 256

Ops: fold (a flush of 16 entries per row), append (a commit of 3 accepted nodes that folds no row), commit (the same
with one row in 8 folding: a speculative step's commit at large batches), decode (decode +
commit amortised over 16 steps, the flush included), verify (a 4-chain and a 16-node tree, buffers holding 8
entries), verify1 (the same at batch 1: the one-launch kernel), conv (the tree conv and the conv commit at Qwen3.5-9B's
8192 channels, bf16: plain decoding and 4-chains), small (batch 1-16: the one-launch kernels against the large-batch
ones, for the thresholds). Each row: the
time, its share of the bound (the bytes the op must move at the device copy bandwidth of the run), the registers
and spills of the kernels it compiled, the check's relative error (a failed check disqualifies the setting).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from benchmarks import checks, gdn
from benchmarks.inputs import Pools, log_decay, rotation_slots, tree_parents
from benchmarks.timing import copy_bandwidth, rotations_for, time_calls
from verify_kernels.conv import (
    causal_conv1d_tree,
    causal_conv1d_tree_ref,
    conv_commit,
    conv_commit_ref,
    conv_decode,
    conv_window_sources,
    tree_conv,
)
from verify_kernels.gdn import commit, decode, fold, gdn_commit, gdn_decode_commit, gdn_flush, gdn_verify, verify
from verify_kernels.tree import ancestor_mask, chain_parents

CAPACITY = 16  # the engine's buffer: flush_length entries
COMMIT_FOLD_EVERY = 8  # the commit op: every 8th row folds
VERIFY_FILL = 8
MODULES = {"fold": fold, "decode": decode, "verify": verify, "commit": commit, "conv": tree_conv}
CONV_D, CONV_W = 2 * gdn.H * gdn.K + gdn.HV * gdn.V, 4  # Qwen3.5-9B's conv channels (q, k, v) and width


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


@contextlib.contextmanager
def compiled_kernels(found: dict[str, tuple[int, int]]):
    """Record registers and spilled bytes of every GDN kernel launched inside, by kernel name."""
    kernels = list({id(k): k for m in (fold, decode, verify, commit) for n, k in vars(m).items()
                    if n.endswith("_kernel")}.values())
    originals = {k: k.run for k in kernels}

    def recording(kernel, *args, **kwargs):
        compiled = originals[kernel](*args, **kwargs)
        with contextlib.suppress(AttributeError, RuntimeError):
            compiled._init_handles()
            found[kernel.__name__] = (compiled.n_regs, compiled.n_spills)
        return compiled

    for k in kernels:
        k.run = partial(recording, k)
    try:
        yield
    finally:
        for k in kernels:
            del k.run  # back to the class's method


class Workloads:
    """Inputs for one batch size, rotated over >= 2 GiB of states, and the calls each op times."""

    def __init__(self, batch: int):
        H, HV, K, V = gdn.H, gdn.HV, gdn.K, gdn.V
        self.batch = batch
        self.rotations = rotations_for(batch * gdn.STATE_BYTES)
        self.pools = Pools.make(self.rotations * batch, CAPACITY, (HV, K, V), (H, K), (HV, V), HV)
        self.slots = [rotation_slots(r, batch) for r in range(self.rotations)]
        # contiguous inputs per token count: one token (decode), a 4-chain, a 16-node tree
        self.x = {nodes: gdn.TokenInputs(self.rotations, batch, nodes) for nodes in (1, 4, 16)}
        self.u = torch.randn(self.rotations, batch, 4, HV, V, device="cuda") * 0.1
        self.gcum = log_decay(self.rotations, batch, 4, HV).cumsum(2) - CAPACITY
        self.accepted = torch.arange(3, device="cuda").expand(batch, 3).contiguous()
        self.num_accepted = torch.full((batch,), 3, device="cuda")

    def conv(self, nodes: int) -> tuple[float, float]:
        """The conv of a chain of `nodes` per row, then the commit of all of them (nodes 1: plain decoding's one
        kernel, conv_decode, as the engine runs it), bf16 inputs and windows, the window sources computed once as
        the engine does for all of a step's conv layers; bytes: the windows read and written, the nodes' inputs
        read and outputs written."""
        D, W, B = CONV_D, CONV_W, self.batch
        window = D * (W - 1) * 2
        rotations = rotations_for(B * window)
        pool = torch.randn(rotations * B, W - 1, D, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(rotations, B, nodes, D, device="cuda", dtype=torch.bfloat16)
        weight = torch.randn(D, W, device="cuda", dtype=torch.bfloat16)
        parents = chain_parents(B, nodes, "cuda")
        num_nodes = torch.full((B,), nodes, device="cuda")
        accepted = torch.arange(nodes, device="cuda").expand(B, nodes).contiguous()
        slots = [rotation_slots(r, B) for r in range(rotations)]
        sources = conv_window_sources(parents, num_nodes, W)  # as the engine: once a step, for all its conv layers

        def step(r: int) -> None:
            if nodes == 1:
                conv_decode(x[r], num_nodes, pool, slots[r], weight, None, "silu")
                return
            causal_conv1d_tree(x[r], parents, num_nodes, pool, slots[r], weight, None, "silu", sources=sources)
            conv_commit(x[r], accepted, num_nodes, pool, slots[r])

        calls = [partial(step, r) for r in range(rotations)]
        return self.time_us(calls, 0), B * (2 * window + 2 * nodes * D * 2 + (nodes > 1) * nodes * D * 2)

    def _pools(self, r: int):
        return (self.pools.state, self.slots[r], *self.pools.args()[1:], self.slots[r])

    def time_us(self, calls: list[Callable], fill: int) -> float:
        self.pools.buf_len.fill_(fill)
        return time_calls(calls) * 1e6

    def fold(self) -> tuple[float, float]:
        calls = [partial(gdn_flush, *self._pools(r)) for r in range(self.rotations)]
        return self.time_us(calls, CAPACITY), self.batch * gdn.fold_bytes(CAPACITY)

    def append(self) -> tuple[float, float]:
        calls = [partial(gdn_commit, self.x[4].k[r], self.u[r], self.gcum[r], self.accepted, self.num_accepted,
                         *self._pools(r), CAPACITY) for r in range(self.rotations)]
        return self.time_us(calls, 4), self.batch * gdn.append_bytes(3)

    def commit(self) -> tuple[float, float]:
        """A speculative step's commit as it mostly runs at large batches: 3 accepted nodes per row, and one row in 8
        full enough to fold (at an accepted length of ~2.7 a row folds every ~6 steps)."""
        calls = [partial(gdn_commit, self.x[4].k[r], self.u[r], self.gcum[r], self.accepted, self.num_accepted,
                         *self._pools(r), CAPACITY) for r in range(self.rotations)]
        fill = torch.full((self.batch,), 4, device="cuda")
        fill[::COMMIT_FOLD_EVERY] = CAPACITY - 3
        self.pools.buf_len.copy_(fill.repeat(self.rotations))
        folded = len(range(0, self.batch, COMMIT_FOLD_EVERY))
        moved = (folded * (2 * gdn.STATE_BYTES + CAPACITY * gdn.ENTRY_BYTES)
                 + (self.batch - folded) * gdn.append_bytes(3))
        return time_calls(calls) * 1e6, moved

    def decode(self) -> tuple[float, float]:
        x = self.x[1]
        calls = [partial(gdn_decode_commit, x.q[r, :, 0], x.k[r, :, 0], x.v[r, :, 0], x.g[r, :, 0], x.beta[r, :, 0],
                         *self._pools(r), CAPACITY) for r in range(self.rotations)]
        step = self.time_us(calls, (CAPACITY - 2) // 2)
        flush = self.time_us(calls, CAPACITY - 1)
        return ((CAPACITY - 1) * step + flush) / CAPACITY, self.batch * gdn.decode_bytes(CAPACITY)

    def verify(self, tree: str) -> tuple[float, float]:
        nodes = len(tree_parents(tree))
        parents = torch.tensor(tree_parents(tree), device="cuda").expand(self.batch, nodes).contiguous()
        num_nodes = torch.full((self.batch,), nodes, device="cuda")
        ancestors = ancestor_mask(parents, num_nodes)
        x = self.x[nodes]
        calls = [partial(gdn_verify, x.q[r], x.k[r], x.v[r], x.g[r], x.beta[r], parents, num_nodes, *self._pools(r),
                         ancestors=ancestors) for r in range(self.rotations)]
        return self.time_us(calls, VERIFY_FILL), self.batch * gdn.verify_bytes(nodes, VERIFY_FILL)


def check_conv(batch: int = 24, nodes: int = 4) -> float:
    """The conv of random trees and the commit of a root path against their references at full width, bf16."""
    D, W = CONV_D, CONV_W
    pool = torch.randn(batch + 3, W - 1, D, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(batch + 3, device="cuda")[:batch]
    x = torch.randn(batch, nodes, D, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(D, W, device="cuda", dtype=torch.bfloat16)
    parents = torch.tensor(tree_parents("tree8")[:nodes], device="cuda").expand(batch, nodes).contiguous()
    num_nodes = torch.arange(batch, device="cuda") % (nodes + 1)
    reference = causal_conv1d_tree_ref(x, parents, num_nodes, pool, slots, weight, None, "silu")
    error = max(checks.relative_error(causal_conv1d_tree(x, parents, num_nodes, pool, slots, weight, None, "silu",
                                                         sources=sources), reference)
                for sources in (None, conv_window_sources(parents, num_nodes, W)))
    accepted = torch.arange(nodes, device="cuda").expand(batch, nodes).contiguous()
    ours, ref = pool.clone(), pool.clone()
    conv_commit(x, accepted, num_nodes, ours, slots)
    conv_commit_ref(x, accepted, num_nodes, ref, slots)
    return max(error, checks.relative_error(ours, ref))


def check(op: str) -> float:
    """The op's full-size check (both batch paths where it has two)."""
    if op == "conv":
        return check_conv()
    if op == "verify1":
        return max(checks.check_gdn_verify(1, "chain4"), checks.check_gdn_verify(1, "tree16"))
    if op == "fold":
        return max(checks.check_gdn_commit(24), checks.check_gdn_decode_commit(24))
    if op in ("append", "commit"):
        return checks.check_gdn_commit(24)
    if op == "decode":
        return checks.check_gdn_decode_commit(24)
    if op == "verify":
        return max(checks.check_gdn_verify(24, "chain4"), checks.check_gdn_verify(24, "tree16"))
    return max(checks.check_gdn_decode_commit(4), checks.check_gdn_verify(1, "chain4"),
               checks.check_gdn_verify(1, "tree16"), checks.check_gdn_verify(4, "chain4"), checks.check_gdn_commit(4))


def measurements(op: str, work: dict[int, Workloads], batches, small_batches) -> list[tuple[str, int, float, float]]:
    """(workload, batch, us, bytes) of one op."""
    if op == "small":
        out = []
        for batch in small_batches:
            w = work[batch]
            out += [("decode", batch, *w.decode()), ("verify chain4", batch, *w.verify("chain4")),
                    ("verify tree16", batch, *w.verify("tree16")), ("append", batch, *w.append())]
        return out
    if op == "verify":
        return [(f"verify {tree}", b, *work[b].verify(tree)) for tree in ("chain4", "tree16") for b in batches]
    if op == "verify1":
        return [(f"verify {tree}", 1, *work[1].verify(tree)) for tree in ("chain4", "tree16")]
    if op == "conv":
        return [(f"conv + commit, {nodes} nodes" if nodes > 1 else "conv decode (one kernel)", b, *work[b].conv(nodes))
                for nodes in (1, 4) for b in batches]
    return [(op, b, *getattr(work[b], op)()) for b in batches]


def ok(error: float) -> bool:
    return error <= checks.TOLERANCE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="fold,append,decode,verify,small",
                        help="comma-separated, of fold, append, commit, decode, verify, verify1, conv, small")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--small-batches", type=int, nargs="+", default=[1, 4, 16])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the sweep needs a CUDA GPU")
    ops = set(args.ops.split(","))
    start = time.time()
    torch.manual_seed(0)
    errors = checks.run_all()
    print("checks at the defaults (max relative error): "
          + ", ".join(f"{name} {error:.1e}" for name, error in errors.items() if name.startswith("gdn")), flush=True)
    copy_bw = copy_bandwidth()
    print(f"device copy: {copy_bw / 1e12:.2f} TB/s", flush=True)
    needed = ((set(args.batches) if ops - {"small", "verify1"} else set())
              | (set(args.small_batches) if "small" in ops else set()) | ({1} if "verify1" in ops else set()))
    work = {b: Workloads(b) for b in sorted(needed)}

    rows = []  # (candidate, workload, batch, us, % of bound, registers, error)
    for candidate in candidates(ops):
        found: dict[str, tuple[int, int]] = {}
        try:
            with applied(candidate), compiled_kernels(found):
                error = check(candidate.op)
                results = measurements(candidate.op, work, args.batches, args.small_batches) if ok(error) else []
        except Exception as failure:  # (a candidate the installed Triton cannot compile or run loses its row only)
            print(f"[{time.time() - start:5.0f} s] {candidate.op}: {candidate.label} failed: "
                  f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}", flush=True)
            error, results = float("inf"), []
        regs = ", ".join(f"{name.removeprefix('gdn_').removesuffix('_kernel')} {r}/{s}"
                         for name, (r, s) in sorted(found.items()))
        for workload, batch, us, nbytes in results:
            rows.append((candidate, workload, batch, us, nbytes / copy_bw * 1e6 / us, regs, error))
        if not results:
            rows.append((candidate, candidate.op, 0, float("nan"), float("nan"), regs, error))
        timings = ", ".join(f"{workload} B{batch} {us:.1f} us" for workload, batch, us, _ in results)
        print(f"[{time.time() - start:5.0f} s] {candidate.op}: {candidate.label} done: {timings or 'no timings'} "
              f"(check {error:.1e})", flush=True)

    print("\n| op | setting | workload | batch | us | % of bound | registers/spilled bytes | check |")
    print("|---|---|---|---|---|---|---|---|")
    for candidate, workload, batch, us, share, regs, error in rows:
        print(f"| {candidate.op} | {candidate.label} | {workload} | {batch} | {us:.1f} | {100 * share:.0f}% | {regs} "
              f"| {error:.1e} |")
    print("\nbest settings (sum of the times over the workloads; a failed check never wins):")
    for op in sorted({c.op for c, *_ in rows} - {"small"}):
        totals: dict[str, tuple[float, Candidate]] = {}
        for candidate, _, _, us, _, _, error in rows:
            if candidate.op == op and ok(error):
                total, _ = totals.get(candidate.label, (0.0, candidate))
                totals[candidate.label] = (total + us, candidate)
        if totals:
            label, (total, best) = min(totals.items(), key=lambda item: item[1][0])
            default = totals.get("defaults", (float("nan"),))[0]
            print(f"  {op}: {label} ({total:.1f} us against {default:.1f} us at the defaults): {best.code()}")
    if "small" in ops:
        print("  small batches, where one launch beats the large-batch kernels (set the thresholds to the largest):")
        us = {(c.label, w, b): t for c, w, b, t, *_ in rows if c.op == "small"}
        for workload in dict.fromkeys(w for _, w, _ in us):
            wins = [b for (label, w, b), t in us.items() if label == "one launch" and w == workload
                    and t < us.get(("large-batch kernels", w, b), float("inf"))]
            print(f"    {workload}: batch {', '.join(map(str, wins)) or 'none'}")
    print(f"\nswept in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
