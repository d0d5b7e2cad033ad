"""Sweep of the GDN kernels' launch parameters on the GPU, at Qwen3.5-9B shapes and the engine's buffer (flush_length
16 = capacity): checks every kernel against its torch reference at full size first, then for each candidate setting
checks the op it changes again and times it (CUDA graphs, inputs rotated over >= 2 GiB of states, as
benchmarks/kernels.py), and prints one table and the best setting per op, as lines to paste into verify_kernels/gdn.

    python -m benchmarks.sweep_gdn                     # fold, append, decode, verify, small at batch 64 and 256
    python -m benchmarks.sweep_gdn --ops verify1,conv  # batch-1 verify; the conv kernels at batch 64 and 256
    python -m benchmarks.sweep_gdn --ops verify --batches 256
    python -m benchmarks.sweep_gdn --ops smalltree --batches 64 128 256

Ops: fold (a flush of 16 entries per row), append (a commit of 3 accepted nodes that folds no row), commit (the same
with one row in 8 folding: a speculative step's commit at large batches), decode (decode +
commit amortised over 16 steps, the flush included), foldstep (plain decoding's step in which every row folds, as
its own launch: decode.FOLDING_DECODE, the decode's launches then the pipelined fold, or the fold kernel decoding
the token; its bound a flush's bytes), verify (a 4-chain and a 16-node tree, buffers at every fill from 0 to 15 over
the rows), verify1 (the same at batch 1: the one-launch kernel), chains (the 4-chain alone: its state pass's
settings), smalltree (4- and 5-node chains and the 8-node tree: the tensor-core tree pass against the small trees'
tree pass, verify.SMALL_TREE_PASS), conv (the tree conv and the conv commit at Qwen3.5-9B's 8192 channels, bf16:
plain decoding and 4-chains), convqkv (the conv and the q / k / v split of plain decoding and 5-node chains, fused or
not: verify_kernels/conv/conv_qkv.py), small (batch 1-16: the one-launch kernels against the large-batch ones, for the
thresholds). Each row: the time, its
share of the bound (the bytes the op must move at the device copy bandwidth of the run), the registers and spills
of the kernels it compiled, the check's relative error (a failed check disqualifies the setting).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from benchmarks import checks, gdn, kernel_settings
from benchmarks.inputs import Pools, log_decay, rotation_slots, tree_parents
from benchmarks.sweep_gdn_candidates import Candidate, applied, candidates
from benchmarks.timing import copy_bandwidth, rotations_for, time_calls
from verify_kernels.conv import (
    GateInputs,
    QKVHeads,
    causal_conv1d_tree,
    causal_conv1d_tree_qkv,
    causal_conv1d_tree_qkv_ref,
    causal_conv1d_tree_ref,
    conv_commit,
    conv_commit_ref,
    conv_decode,
    conv_decode_qkv,
    conv_decode_qkv_ref,
    conv_window_sources,
)
from verify_kernels.gdn import commit, decode, fold, gdn_commit, gdn_decode_commit, gdn_flush, gdn_verify, verify
from verify_kernels.tree import ancestor_mask, chain_parents

CAPACITY = 16  # the engine's buffer: flush_length entries
SMALL_TREES = ("chain4", "chain5", "tree8")  # the smalltree op's trees: up to verify.SMALL_TREE_MAX_NODES nodes
COMMIT_FOLD_EVERY = 8  # the commit op: every 8th row folds
CONV_D, CONV_W = 2 * gdn.H * gdn.K + gdn.HV * gdn.V, 4  # Qwen3.5-9B's conv channels (q, k, v) and width


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
        self.x = {nodes: gdn.TokenInputs(self.rotations, batch, nodes) for nodes in (1, 4, 5, 8, 16)}
        self.u = torch.randn(self.rotations, batch, 4, HV, V, device="cuda") * 0.1
        self.gcum = log_decay(self.rotations, batch, 4, HV).cumsum(2) - CAPACITY
        self.accepted = torch.arange(3, device="cuda").expand(batch, 3).contiguous()
        self.num_accepted = torch.full((batch,), 3, device="cuda")

    def conv_inputs(self, nodes: int):
        """A conv layer's chains of `nodes` per row, bf16, over >= 2 GiB of windows: (window bytes a row, rotations,
        pool, x, weight, parents, num_nodes, slots a rotation, the window sources computed once as the engine does
        for all of a step's conv layers)."""
        D, W, B = CONV_D, CONV_W, self.batch
        window = D * (W - 1) * 2
        rotations = rotations_for(B * window)
        pool = torch.randn(rotations * B, W - 1, D, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(rotations, B, nodes, D, device="cuda", dtype=torch.bfloat16)
        weight = torch.randn(D, W, device="cuda", dtype=torch.bfloat16)
        parents = chain_parents(B, nodes, "cuda")
        num_nodes = torch.full((B,), nodes, device="cuda")
        slots = [rotation_slots(r, B) for r in range(rotations)]
        return (window, rotations, pool, x, weight, parents, num_nodes, slots,
                conv_window_sources(parents, num_nodes, W))

    def conv(self, nodes: int) -> tuple[float, float]:
        """The conv of a chain of `nodes` per row, then the commit of all of them (nodes 1: plain decoding's one
        kernel, conv_decode, as the engine runs it), bf16 inputs and windows, the window sources computed once as
        the engine does for all of a step's conv layers; bytes: the windows read and written, the nodes' inputs
        read and outputs written."""
        D, B = CONV_D, self.batch
        window, rotations, pool, x, weight, parents, num_nodes, slots, sources = self.conv_inputs(nodes)
        accepted = torch.arange(nodes, device="cuda").expand(B, nodes).contiguous()

        def step(r: int) -> None:
            if nodes == 1:
                conv_decode(x[r], num_nodes, pool, slots[r], weight, None, "silu")
                return
            causal_conv1d_tree(x[r], parents, num_nodes, pool, slots[r], weight, None, "silu", sources=sources)
            conv_commit(x[r], accepted, num_nodes, pool, slots[r])

        calls = [partial(step, r) for r in range(rotations)]
        return self.time_us(calls, 0), B * (2 * window + 2 * nodes * D * 2 + (nodes > 1) * nodes * D * 2)

    def conv_qkv(self, nodes: int) -> tuple[float, float]:
        """The conv and the q / k / v split of a chain of `nodes` per row, with the layer's gates, as the engine runs
        them (one op: fused where conv_qkv.FUSED, else the conv, the split and the gates), bf16 inputs and windows,
        keys in bf16 (fp32 storage for one node, as the decode takes them); the chain's commit left out (it is the
        same either way); bytes: the windows read (and written for one node), the inputs read, q / k / v and the
        gates written."""
        D, B = CONV_D, self.batch
        window, rotations, pool, x, weight, parents, num_nodes, slots, sources = self.conv_inputs(nodes)
        split = dict(heads=QKVHeads(gdn.H, gdn.K, gdn.HV, gdn.V), q_scale=gdn.K**-0.5, qk_dtype=torch.bfloat16,
                     gates=gate_inputs(B, nodes))  # (the layer's gates, as the engine asks for them since 2026-12-05)

        def step(r: int) -> None:
            if nodes == 1:
                conv_decode_qkv(x[r], num_nodes, pool, slots[r], weight, None, "silu", **split,
                                qk_storage=torch.float32)
            else:
                causal_conv1d_tree_qkv(x[r], parents, num_nodes, pool, slots[r], weight, None, "silu", sources,
                                       **split)

        calls = [partial(step, r) for r in range(rotations)]
        # (q, k, v written; a and b read in bf16, g and beta written in fp32)
        qkv_bytes = nodes * (2 * gdn.H * gdn.K * (4 if nodes == 1 else 2) + gdn.HV * gdn.V * 4 + gdn.HV * 12)
        return self.time_us(calls, 0), B * ((1 + (nodes == 1)) * window + nodes * D * 2 + qkv_bytes)

    def _pools(self, r: int):
        return (self.pools.state, self.slots[r], *self.pools.args()[1:], self.slots[r])

    def time_us(self, calls: list[Callable], fill: int | None) -> float:
        """Median us of the calls with every buffer at `fill` entries, or at gdn.spread_fills where None."""
        if fill is None:
            self.pools.buf_len.copy_(gdn.spread_fills(len(self.pools.buf_len)))
        else:
            self.pools.buf_len.fill_(fill)
        return time_calls(calls) * 1e6

    def fold(self) -> tuple[float, float]:
        calls = [partial(gdn_flush, *self._pools(r)) for r in range(self.rotations)]
        return self.time_us(calls, CAPACITY), self.batch * gdn.fold_bytes(CAPACITY)

    def append(self) -> tuple[float, float]:
        calls = [partial(gdn_commit, self.x[4].k[r], self.u[r], self.gcum[r], self.accepted, self.num_accepted,
                         *self._pools(r), CAPACITY, flushed=False) for r in range(self.rotations)]
        return self.time_us(calls, 4), self.batch * gdn.append_bytes(3)

    def commit(self) -> tuple[float, float]:
        """A speculative step's commit as it mostly runs at large batches: 3 accepted nodes per row, and one row in 8
        full enough to fold (at an accepted length of ~2.7 a row folds every ~6 steps)."""
        calls = [partial(gdn_commit, self.x[4].k[r], self.u[r], self.gcum[r], self.accepted, self.num_accepted,
                         *self._pools(r), CAPACITY, flushed=False) for r in range(self.rotations)]
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
                         *self._pools(r), CAPACITY, flushed=False) for r in range(self.rotations)]
        step = self.time_us(calls, (CAPACITY - 2) // 2)
        flush = self.time_us(calls, CAPACITY - 1)
        return ((CAPACITY - 1) * step + flush) / CAPACITY, self.batch * gdn.decode_bytes(CAPACITY)

    def foldstep(self) -> tuple[float, float]:
        """Plain decoding's step in which every row folds (rows in lockstep): gdn_decode_commit(every_row_folds=True)
        on buffers one entry short of a flush; bound: a flush's bytes (S0 read and written once, the entries read)."""
        x = self.x[1]
        calls = [partial(gdn_decode_commit, x.q[r, :, 0], x.k[r, :, 0], x.v[r, :, 0], x.g[r, :, 0], x.beta[r, :, 0],
                         *self._pools(r), CAPACITY, flushed=False, every_row_folds=True)
                 for r in range(self.rotations)]
        return self.time_us(calls, CAPACITY - 1), self.batch * gdn.fold_bytes(CAPACITY)

    def verify(self, tree: str) -> tuple[float, float]:
        nodes = len(tree_parents(tree))
        parents = torch.tensor(tree_parents(tree), device="cuda").expand(self.batch, nodes).contiguous()
        num_nodes = torch.full((self.batch,), nodes, device="cuda")
        ancestors = ancestor_mask(parents, num_nodes)
        x = self.x[nodes]
        calls = [partial(gdn_verify, x.q[r], x.k[r], x.v[r], x.g[r], x.beta[r], parents, num_nodes, *self._pools(r),
                         ancestors=ancestors) for r in range(self.rotations)]
        return self.time_us(calls, None), self.batch * gdn.verify_bytes(nodes, gdn.SPREAD_MEAN_FILL)


def gate_inputs(batch: int, nodes: int) -> GateInputs:
    """The GDN gates' inputs at Qwen3.5-9B's value heads, as the layer gives them: a and b strided splits of the merged
    z / b / a projection's bf16 output [batch, nodes, HV V + 2 HV]."""
    HV = gdn.HV
    merged = torch.randn(batch, nodes, HV * gdn.V + 2 * HV, device="cuda", dtype=torch.bfloat16)
    return GateInputs(merged[..., -HV:], merged[..., -2 * HV:-HV], torch.randn(HV, device="cuda"),
                      torch.randn(HV, device="cuda"))


def conv_check_inputs(batch: int, nodes: int):
    """The conv checks' inputs at full width, bf16: (pool, slots, x, weight, parents, num_nodes) of random trees
    (rows of 0 to `nodes` nodes)."""
    D, W = CONV_D, CONV_W
    pool = torch.randn(batch + 3, W - 1, D, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(batch + 3, device="cuda")[:batch]
    x = torch.randn(batch, nodes, D, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(D, W, device="cuda", dtype=torch.bfloat16)
    parents = torch.tensor(tree_parents("tree8")[:nodes], device="cuda").expand(batch, nodes).contiguous()
    return pool, slots, x, weight, parents, torch.arange(batch, device="cuda") % (nodes + 1)


def check_conv(batch: int = 24, nodes: int = 4) -> float:
    """The conv of random trees and the commit of a root path against their references at full width, bf16."""
    pool, slots, x, weight, parents, num_nodes = conv_check_inputs(batch, nodes)
    W = CONV_W
    reference = causal_conv1d_tree_ref(x, parents, num_nodes, pool, slots, weight, None, "silu")
    error = max(checks.relative_error(causal_conv1d_tree(x, parents, num_nodes, pool, slots, weight, None, "silu",
                                                         sources=sources), reference)
                for sources in (None, conv_window_sources(parents, num_nodes, W)))
    accepted = torch.arange(nodes, device="cuda").expand(batch, nodes).contiguous()
    ours, ref = pool.clone(), pool.clone()
    conv_commit(x, accepted, num_nodes, ours, slots)
    conv_commit_ref(x, accepted, num_nodes, ref, slots)
    return max(error, checks.relative_error(ours, ref))


def check_conv_qkv(batch: int = 24, nodes: int = 4) -> float:
    """The conv and split of random trees, and of one node a row (its window updated), against the references at
    Qwen3.5-9B's heads, bf16 inputs, keys in bf16."""
    pool, slots, x, weight, parents, num_nodes = conv_check_inputs(batch, nodes)
    W = CONV_W
    split = dict(heads=QKVHeads(gdn.H, gdn.K, gdn.HV, gdn.V), q_scale=gdn.K**-0.5, qk_dtype=torch.bfloat16)
    tree = (x, parents, num_nodes, pool, slots, weight, None, "silu")
    gates = gate_inputs(batch, nodes)
    errors = [checks.relative_error(a, e) for a, e in zip(
        causal_conv1d_tree_qkv(*tree, conv_window_sources(parents, num_nodes, W), **split, gates=gates),
        causal_conv1d_tree_qkv_ref(*tree, None, **split, gates=gates), strict=True)]
    ours, ref = pool.clone(), pool.clone()
    one = (num_nodes > 0).long()
    split["gates"] = gate_inputs(batch, 1)
    decoded = conv_decode_qkv(x[:, :1], one, ours, slots, weight, None, "silu", **split, qk_storage=torch.float32)
    expected = conv_decode_qkv_ref(x[:, :1], one, ref, slots, weight, None, "silu", **split, qk_storage=torch.float32)
    errors += [checks.relative_error(a, e) for a, e in zip(decoded, expected, strict=True)]
    return max(errors + [checks.relative_error(ours, ref)])


def check(op: str) -> float:
    """The op's full-size check (both batch paths where it has two)."""
    if op == "conv":
        return check_conv()
    if op == "convqkv":
        return check_conv_qkv()
    if op == "verify1":
        return max(checks.check_gdn_verify(1, "chain4"), checks.check_gdn_verify(1, "tree16"))
    if op == "fold":
        return max(checks.check_gdn_commit(24), checks.check_gdn_decode_commit(24))
    if op in ("append", "commit"):
        return checks.check_gdn_commit(24)
    if op == "decode":
        return checks.check_gdn_decode_commit(24)
    if op == "foldstep":
        return checks.check_gdn_decode_commit(24, every_row_folds=True)
    if op == "verify":
        return max(checks.check_gdn_verify(24, "chain4"), checks.check_gdn_verify(24, "tree16"))
    if op == "chains":
        return checks.check_gdn_verify(24, "chain4")
    if op == "smalltree":
        return max(checks.check_gdn_verify(24, tree) for tree in SMALL_TREES)
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
    if op == "chains":
        return [("verify chain4", b, *work[b].verify("chain4")) for b in batches]
    if op == "smalltree":
        return [(f"verify {tree}", b, *work[b].verify(tree)) for tree in SMALL_TREES for b in batches]
    if op == "verify1":
        return [(f"verify {tree}", 1, *work[1].verify(tree)) for tree in ("chain4", "tree16")]
    if op == "conv":
        return [(f"conv + commit, {nodes} nodes" if nodes > 1 else "conv decode (one kernel)", b, *work[b].conv(nodes))
                for nodes in (1, 4) for b in batches]
    if op == "convqkv":
        return [(f"conv + q / k / v split, {nodes} node{'s' * (nodes > 1)}", b, *work[b].conv_qkv(nodes))
                for nodes in (1, 5) for b in batches]
    return [(op, b, *getattr(work[b], op)()) for b in batches]


def ok(error: float) -> bool:
    return error <= checks.TOLERANCE


def best_settings(rows: list[tuple]) -> list[tuple[str, str, float, float, Candidate]]:
    """Per op (but the thresholds' "small"): (op, label, total us, the defaults' total us, candidate) of the setting
    whose time summed over the op's workloads is least, among those that timed every workload the defaults did
    and passed their check. rows: (candidate, workload, batch, us, share of bound, registers, error)."""
    out = []
    for op in sorted({c.op for c, *_ in rows} - {"small"}):
        totals: dict[str, tuple[float, int, Candidate]] = {}
        for candidate, _, _, us, _, _, error in rows:
            if candidate.op == op and ok(error) and us == us:  # (NaN: a candidate with no timings)
                total, count, _ = totals.get(candidate.label, (0.0, 0, candidate))
                totals[candidate.label] = (total + us, count + 1, candidate)
        default, workloads, _ = totals.get("defaults", (float("nan"), 0, None))
        complete = {label: entry for label, entry in totals.items() if entry[1] >= workloads}
        if complete:
            label, (total, _, best) = min(complete.items(), key=lambda item: item[1][0])
            out.append((op, label, total, default, best))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="fold,append,decode,verify,small",
                        help="comma-separated, of fold, append, commit, decode, foldstep, verify, verify1, chains, "
                             "smalltree, conv, convqkv, small")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--small-batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--winners", type=Path,
                        help="merge each op's best setting into this JSON file where it beats the defaults by "
                             f"{kernel_settings.WIN_MARGIN:.0%}% (SPECDEC_KERNEL_SETTINGS=FILE then applies them to "
                             "the benchmarks run after: benchmarks/kernel_settings.py)")
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
    winners = []  # each op's winning settings, written whole or not at all
    for op, label, total, default, best in best_settings(rows):
        print(f"  {op}: {label} ({total:.1f} us against {default:.1f} us at the defaults): {best.code()}")
        if kernel_settings.beats(total, default):
            winners.append(best.settings())
    if args.winners:
        written = kernel_settings.merge_winners(args.winners, winners)
        print(f"  winners by {kernel_settings.WIN_MARGIN:.0%} or more: {winners or 'none'}; {args.winners} holds "
              f"{written or 'nothing'}")
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
