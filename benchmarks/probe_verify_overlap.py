"""Probe: would the GDN verify's two passes gain from running side by side? The state pass streams S0 (memory-bound)
and the tree pass is latency / issue-bound, and today the tree pass waits for the state pass. This times, at Qwen3.5-9B
shapes and the sweep's workloads (CUDA graphs, inputs rotated over >= 2 GiB of states, buffers at every fill 0-15
over the rows): each pass alone, both in order (today's verify), and both at once on two streams forked and joined
inside the graph (the tree pass reads a scratch the state pass is writing: a race that changes no timing, so the
outputs are not checked here); and for trees up to verify.SMALL_TREE_MAX_NODES nodes the small trees' tree pass
alone (verify_small.py), the pass it would replace.

    python -m benchmarks.probe_verify_overlap --batches 64 128 256 --trees chain4 chain5 tree16
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import triton

from benchmarks import gdn
from benchmarks.inputs import tree_parents
from benchmarks.sweep_gdn import Workloads
from benchmarks.timing import copy_bandwidth, time_calls
from verify_kernels.gdn import verify
from verify_kernels.gdn.verify_state import gdn_verify_state_kernel
from verify_kernels.precision import exact_in_tf32
from verify_kernels.tree import ancestor_mask


def passes(work: Workloads, r: int, tree: str):
    """The state pass and the tree pass of gdn_verify's large-batch path for rotation r, as two calls, and the small
    trees' tree pass (None past SMALL_TREE_MAX_NODES nodes)."""
    nodes = len(tree_parents(tree))
    B = work.batch
    parents = torch.tensor(tree_parents(tree), device="cuda").expand(B, nodes).contiguous()
    num_nodes = torch.full((B,), nodes, device="cuda")
    anc = ancestor_mask(parents, num_nodes).view(torch.uint8)
    x = work.x[nodes]
    q, k, v, g, beta = x.q[r], x.k[r], x.v[r], x.g[r], x.beta[r]
    state, slots, buf_k, buf_u, buf_gcum, buf_len, req_slots = work._pools(r)
    T, H, HV, K, V = nodes, gdn.H, gdn.HV, gdn.K, gdn.V
    L = buf_k.shape[1]
    BT, BL = verify.verify_blocks(T), verify.verify_blocks(L)
    new = partial(torch.empty, dtype=torch.float32, device="cuda")
    kS, qS, o, u, gcum = new(B, T, HV, V), new(B, T, HV, V), new(B, T, HV, V), new(B, T, HV, V), new(B, T, HV)
    use_dot = T > verify.FMA_MAX_NODES
    exact = exact_in_tf32(q, k)
    shapes = dict(T=T, H=H, HV=HV, K=K, V=V)
    block_v, warps = verify.STATE_DOT_CONFIGS[BT] if use_dot else verify.STATE_FMA_CONFIG
    BV = min(V, block_v)

    def state_pass():
        gdn_verify_state_kernel[(V // BV, HV, B)](
            q, k, num_nodes, state, slots, kS, qS, **shapes, BT=BT, BV=BV, BK=min(K, verify.STATE_BLOCK_K), G=1,
            NG=1, USE_DOT=use_dot, PRECISION=verify.products_precision(verify.STATE_SPLIT_TF32 and use_dot),
            EXACT=exact, STAGES=verify.STATE_DOT_STAGES[BT] if use_dot else 0, num_warps=warps, num_stages=1)

    per_program = (verify.TREE_DOT_HEADS_PER_PROGRAM if use_dot else verify.TREE_HEADS_PER_PROGRAM) or HV // H
    tree_v, tree_warps = verify.TREE_CONFIG if use_dot else verify.TREE_SMALL_CONFIG

    def tree_pass():
        verify.gdn_verify_tree_kernel[(HV // per_program, B)](
            q, k, v, g, beta, anc, num_nodes, slots, kS, qS, buf_k, buf_u, buf_gcum, buf_len, req_slots, o, u, gcum,
            **shapes, L=L, BT=BT, BL=BL, BK=min(K, verify.PRODUCTS_BLOCK_K), BV=min(V, tree_v),
            PRECISION=verify.products_precision(verify.TREE_SPLIT_TF32), NG=triton.next_power_of_2(per_program),
            PRODUCTS_STAGES=verify.PRODUCTS_STAGES, GP=per_program,
            STACKED=verify.STACKED_PRODUCTS or verify.STACKED_READS, STACKED_READS=verify.STACKED_READS,
            EXACT=exact, num_warps=tree_warps, num_stages=1)

    heads = verify.SMALL_TREE_HEADS_PER_PROGRAM or HV // H
    few = B < verify.SMALL_TREE_FEW_ROWS
    # (few rows without a config of their own run the tensor-core pass in the engine; here the rows' config)
    small_v, small_warps, v_programs = (verify.SMALL_TREE_FEW_ROWS_CONFIG if few else None) or verify.SMALL_TREE_CONFIG
    BN = verify.small_node_block(T)
    scratch = new(B * HV // heads * v_programs, verify.small_scratch_floats(BN, BL, heads))

    def small_tree_pass():
        verify.gdn_verify_small_tree_kernel[(HV // heads, B, v_programs)](
            q, k, v, g, beta, anc, num_nodes, slots, kS, qS, buf_k, buf_u, buf_gcum, buf_len, req_slots, o, u, gcum,
            scratch, **shapes, L=L, BN=BN, BL=BL, BK=min(K, verify.SMALL_TREE_BLOCK_K),
            BV=min(V // v_programs, small_v), GP=heads, NG=triton.next_power_of_2(heads), VP=v_programs,
            PRECISION=verify.products_precision(verify.TREE_SPLIT_TF32), EXACT=exact, num_warps=small_warps,
            num_stages=1)

    return state_pass, tree_pass, small_tree_pass if T <= verify.SMALL_TREE_MAX_NODES else None


def forked(first, second, side: torch.cuda.Stream):
    """first on a side stream, second on the current one, joined after both."""
    main = torch.cuda.current_stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        first()
    second()
    main.wait_stream(side)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--trees", nargs="+", default=["chain4", "tree16"])
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    high = torch.cuda.Stream(priority=-1)
    low = torch.cuda.Stream(priority=0)
    rows = []
    for batch in args.batches:
        work = Workloads(batch)
        work.pools.buf_len.copy_(gdn.spread_fills(len(work.pools.buf_len)))
        for tree in args.trees:
            triples = [passes(work, r, tree) for r in range(work.rotations)]
            variants = {
                "state pass": [s for s, _, _ in triples],
                "tree pass": [t for _, t, _ in triples],
                "in order (today)": [c for s, t, _ in triples for c in (s, t)],
                "side by side, tree on a high-priority stream": [partial(forked, t, s, high) for s, t, _ in triples],
                "side by side, state on a side stream": [partial(forked, s, t, low) for s, t, _ in triples],
            }
            if triples[0][2] is not None:
                variants["small trees' tree pass"] = [small for _, _, small in triples]
            s0_us = batch * gdn.STATE_BYTES / bandwidth * 1e6
            for name, calls in variants.items():
                per_verify = len(calls) / work.rotations  # (in order: two calls a verify)
                rows.append((batch, tree, name, time_calls(calls) * 1e6 * per_verify, s0_us))
                print(f"{batch} {tree} {name}: {rows[-1][3]:.1f} us", flush=True)
    print(f"\ncopy bandwidth {bandwidth / 1e12:.2f} TB/s\n")
    print("| batch | tree | variant | us a verify | S0 read bound us |\n|---|---|---|---|---|")
    for batch, tree, name, us, s0 in rows:
        print(f"| {batch} | {tree} | {name} | {us:.1f} | {s0:.1f} |")


if __name__ == "__main__":
    main()
