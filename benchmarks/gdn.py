"""Gated DeltaNet at Qwen3.5-9B shapes (H=16, HV=32, K=V=128, fp32 state): decode, tree verify, fold and commit.

Every timed row carries "bytes_moved": the least our op must move (each state read once, and written once where it
folds; the inputs it reads, the outputs and buffer entries it writes, the buffer entries it reads), and where there
is a baseline "baseline_bytes_moved", the same for the baseline's op (which reads and writes every state it
updates). benchmarks/report.py turns them into bounds at the run's copy bandwidth."""

from __future__ import annotations

from functools import partial

import torch

from benchmarks.commit_cases import add_baseline_commit, chain_prefix, time_commit_cases
from benchmarks.inputs import Pools, log_decay, rotation_slots, tree_parents, unit
from benchmarks.timing import rotations_for, time_calls
from verify_kernels.gdn import gdn_commit, gdn_decode, gdn_decode_commit, gdn_flush, gdn_verify
from verify_kernels.gdn.verify import verify_scratch_bytes
from verify_kernels.tree import ancestor_mask

H, HV, K, V = 16, 32, 128, 128
STATE_BYTES = HV * K * V * 4  # one request, one layer
# the buffer holds flush_length entries, as the engine's (specdec.cache: its capacity is the flush length, 16 by
# default); the kernels specialise on it, so each decode row times pools of its own flush length
ENGINE_FLUSH_LENGTH = 16
# one request, one layer, fp32: a token's buffer entry (its key once per key head, u and G per value head), its
# inputs (q, k, v, g, beta), its output o
ENTRY_BYTES = (H * K + HV * V + HV) * 4
TOKEN_BYTES = (2 * H * K + HV * V + 2 * HV) * 4
OUTPUT_BYTES = HV * V * 4
NODE_ENTRY_BYTES = (HV * V + HV) * 4  # what verify writes per node besides o: u and G (the key is its input)
FOLD_ENTRIES = 16  # a flush of L = 16 entries


class TokenInputs:
    """R rotation sets of B rows x T tokens: normalised q (pre-scaled) and k, v, log decay g, beta, and the raw
    gate inputs (a, b) that SGLang's fused-gating kernel takes instead of g and beta. q and k in bf16, as a bf16
    model's glue leaves them for the KVBuffer's verify (verify_kernels/glue/gdn_inputs.py), and the same values in
    fp32 (q32, k32) for its decode (specdec/models/gated_deltanet.py says why) and for fla's, SGLang's and the
    intermediate-state kernels (as they ran before 2026-12-04, and the engine gives the intermediate-state backend:
    specdec/cache/linear_state.py)."""

    def __init__(self, rotations: int, batch: int, tokens: int):
        shape = (rotations, batch, tokens)
        self.q = (unit(*shape, H, K) * K**-0.5).bfloat16()
        self.k = unit(*shape, H, K).bfloat16()
        self.q32, self.k32 = self.q.float(), self.k.float()
        self.v = torch.randn(*shape, HV, V, device="cuda")
        self.g = log_decay(*shape, HV)
        self.beta = torch.rand(*shape, HV, device="cuda")
        self.a = torch.randn(*shape, HV, device="cuda")
        self.b = torch.randn(*shape, HV, device="cuda")


def decode_rows(batches, flush_lengths, fla, sglang_gdn, copy_bw: float) -> list[dict]:
    rows = []
    for batch in batches:
        rows += _decode_batch(batch, flush_lengths, fla, sglang_gdn, copy_bw)
        torch.cuda.empty_cache()
    return rows


def decode_workload(batch: int, flush_length: int) -> tuple[int, Pools, TokenInputs, list[torch.Tensor]]:
    """A decode step's inputs over >= 2 GiB of states: (rotations, pools of `flush_length`-entry buffers, one token
    per row of each rotation, each rotation's slots)."""
    rotations = rotations_for(batch * STATE_BYTES)
    pools = Pools.make(rotations * batch, flush_length, (HV, K, V), (H, K), (HV, V), HV)
    return rotations, pools, TokenInputs(rotations, batch, 1), [rotation_slots(r, batch) for r in range(rotations)]


def _decode_batch(batch, flush_lengths, fla, sglang_gdn, copy_bw: float) -> list[dict]:
    rotations, pools, x, slots = decode_workload(batch, ENGINE_FLUSH_LENGTH)
    one_token = [(x.q32[r, :, 0], x.k32[r, :, 0], x.v[r, :, 0], x.g[r, :, 0], x.beta[r, :, 0])
                 for r in range(rotations)]

    def ours(op, *tail):
        return [partial(op, *one_token[r], pools.state, slots[r], *pools.args()[1:], slots[r], *tail)
                for r in range(rotations)]

    pools.buf_len.fill_(0)
    read_s = time_calls(ours(gdn_decode))  # S0 read alone: empty buffers, nothing written but o / u
    base = {"section": "gdn_decode", "batch": batch, "rotations": rotations, "state_read_us": read_s * 1e6,
            "state_read_tbps": batch * STATE_BYTES / read_s / 1e12,
            "state_read_of_copy": batch * STATE_BYTES / read_s / copy_bw}
    if fla is not None:
        fla_s = _fla_decode_seconds(fla, x, rotations, batch)
        base.update(fla_us=fla_s * 1e6, fla_tbps=2 * batch * STATE_BYTES / fla_s / 1e12)
    if sglang_gdn is not None:
        base["sglang_us"] = _sglang_decode_seconds(sglang_gdn, x, slots, rotations, batch) * 1e6
    rows = []
    for flush_length in flush_lengths:
        del pools
        pools = Pools.make(rotations * batch, flush_length, (HV, K, V), (H, K), (HV, V), HV)
        pools.buf_len.fill_((flush_length - 2) // 2)  # the mean fill of the non-flushing steps
        # flushed=False: the engine's decode + commit (its cache knows which rows fold), without the three torch ops
        # that compute the flushed rows for other callers (they ran in these rows' times until 2026-12-05)
        decode_commit = partial(gdn_decode_commit, flushed=False)
        step_s = time_calls(ours(decode_commit, flush_length))
        # every call folds its buffer into the state: the rows in lockstep, as plain decoding's engine launches
        # that step (every_row_folds: its fold in the flush's pipelined row loop, decode.FOLDING_DECODE)
        pools.buf_len.fill_(flush_length - 1)
        flush_s = time_calls([partial(call, every_row_folds=True) for call in ours(decode_commit, flush_length)])
        amortised = ((flush_length - 1) * step_s + flush_s) / flush_length
        row = dict(base, flush_length=flush_length, ours_step_us=step_s * 1e6, ours_flush_us=flush_s * 1e6,
                   ours_us=amortised * 1e6, bytes_moved=batch * decode_bytes(flush_length),
                   baseline_bytes_moved=batch * (2 * STATE_BYTES + TOKEN_BYTES + OUTPUT_BYTES))
        if "fla_us" in base:
            row["speedup_vs_fla"] = base["fla_us"] / row["ours_us"]
        rows.append(row)
    return rows


def decode_bytes(flush_length: int) -> float:
    """Bytes one request's decode + commit must move per step, amortised as the benchmark times it: L - 1 steps at
    the mean buffer fill that read S0 and the buffer and append an entry, then one that reads S0 and the L - 1
    entries and writes the folded state."""
    fill = (flush_length - 2) // 2
    step = STATE_BYTES + fill * ENTRY_BYTES + TOKEN_BYTES + OUTPUT_BYTES + ENTRY_BYTES
    flush = 2 * STATE_BYTES + (flush_length - 1) * ENTRY_BYTES + TOKEN_BYTES + OUTPUT_BYTES
    return ((flush_length - 1) * step + flush) / flush_length


def _fla_decode_seconds(fla, x: TokenInputs, rotations: int, batch: int) -> float:
    """fla's recurrent decode: reads each request's state and writes the new one (output_final_state)."""
    states = torch.randn(rotations, batch, HV, K, V, device="cuda") * 0.1
    return time_calls([
        partial(fla, x.q32[r], x.k32[r], x.v[r], g=x.g[r], beta=x.beta[r], scale=1.0, initial_state=states[r],
                output_final_state=True)
        for r in range(rotations)
    ])


def _sglang_decode_seconds(sglang_gdn, x: TokenInputs, slots, rotations: int, batch: int) -> float:
    """SGLang's recurrent decode: fused gating, reads and writes each state in place in its pool."""
    states = torch.randn(rotations * batch, HV, V, K, device="cuda") * 0.1
    a_log, dt_bias = torch.randn(HV, device="cuda"), torch.randn(HV, device="cuda")
    return time_calls([
        partial(sglang_gdn, a_log, x.a[r], dt_bias, 1.0, 20.0, x.q32[r], x.k32[r], x.v[r], x.b[r],
                initial_state_source=states, initial_state_indices=slots[r], scale=1.0)
        for r in range(rotations)
    ])


def spread_fills(rows: int, capacity: int = ENGINE_FLUSH_LENGTH) -> torch.Tensor:
    """Buffer fills 0 .. capacity - 1 in turn over the rows (mean (capacity - 1) / 2): the engine's rows sit at every
    point of their flush cycle, and a kernel whose work depends on the fill (the small trees' tree pass sums over half
    the buffer where it is at most half full) is timed over all of them. [rows] int64 on the GPU."""
    return torch.arange(rows, device="cuda") % capacity


SPREAD_MEAN_FILL = (ENGINE_FLUSH_LENGTH - 1) / 2


def verify_rows(batches, trees, sglang_gdn) -> list[dict]:
    """The verify's rows of the kernel table: each tree at each batch, buffers at spread_fills, beside SGLang's
    intermediate-state verify."""
    rows = []
    for tree in trees:
        for batch in batches:
            rows.append(_verify_batch(tree, batch, sglang_gdn))
            torch.cuda.empty_cache()
    return rows


def _verify_batch(tree: str, batch: int, sglang_gdn) -> dict:
    parents_list = tree_parents(tree)
    nodes = len(parents_list)
    rotations = rotations_for(batch * STATE_BYTES)
    pools = Pools.make(rotations * batch, ENGINE_FLUSH_LENGTH, (HV, K, V), (H, K), (HV, V), HV)
    pools.buf_len.copy_(spread_fills(rotations * batch))
    fill = SPREAD_MEAN_FILL
    x = TokenInputs(rotations, batch, nodes)
    slots = [rotation_slots(r, batch) for r in range(rotations)]
    parents = torch.tensor(parents_list, device="cuda").expand(batch, nodes).contiguous()
    num_nodes = torch.full((batch,), nodes, device="cuda")
    ancestors = ancestor_mask(parents, num_nodes)  # once per step, shared by all layers
    ours_s = time_calls([
        partial(gdn_verify, x.q[r], x.k[r], x.v[r], x.g[r], x.beta[r], parents, num_nodes, pools.state, slots[r],
                *pools.args()[1:], slots[r], ancestors=ancestors)
        for r in range(rotations)
    ])
    row = {"section": "gdn_verify", "tree": tree, "nodes": nodes, "batch": batch, "buffer_fill": fill,
           "ours_us": ours_s * 1e6, "ours_state_bytes_per_request": 0,
           "ours_scratch_bytes_per_request": verify_scratch_bytes(nodes, H, HV, V, ENGINE_FLUSH_LENGTH, batch),
           "baseline_state_bytes_per_request": nodes * STATE_BYTES,
           "bytes_moved": batch * verify_bytes(nodes, fill),
           "baseline_bytes_moved": batch * (nodes * STATE_BYTES + verify_bytes(nodes, 0) - nodes * NODE_ENTRY_BYTES)}
    if sglang_gdn is not None:
        del pools  # room for the baseline's own pool and intermediate states
        base_s = _sglang_verify_seconds(sglang_gdn, x, slots, parents, rotations, batch, nodes, tree)
        row.update(baseline_us=base_s * 1e6, speedup_vs_baseline=base_s / ours_s)
    return row


def verify_bytes(nodes: int, fill: int) -> int:
    """Bytes one request's verify must move: S0 once, the buffer's fill entries, the nodes' inputs and ancestor
    mask, o and the nodes' entries (u, G) out. The intermediate-state baseline moves S0 once, the inputs, o, and
    one state written per node instead of the entries."""
    inputs = nodes * TOKEN_BYTES + nodes * nodes
    return STATE_BYTES + fill * ENTRY_BYTES + inputs + nodes * (OUTPUT_BYTES + NODE_ENTRY_BYTES)


def _sglang_verify_seconds(sglang_gdn, x, slots, parents, rotations, batch, nodes, tree) -> float:
    """SGLang's target verify: one recurrent pass that writes every draft token's state to an intermediate
    buffer (trees reload each node's parent state from it)."""
    states = torch.randn(rotations * batch, HV, V, K, device="cuda") * 0.1
    intermediate = torch.empty(batch, nodes, HV, V, K, device="cuda")
    buffer_rows = torch.arange(batch, device="cuda")
    a_log, dt_bias = torch.randn(HV, device="cuda"), torch.randn(HV, device="cuda")
    retrieve = None if tree.startswith("chain") else parents
    return time_calls([
        partial(sglang_gdn, a_log, x.a[r], dt_bias, 1.0, 20.0, x.q32[r], x.k32[r], x.v[r], x.b[r],
                initial_state_source=states, initial_state_indices=slots[r], scale=1.0, disable_state_update=True,
                intermediate_states_buffer=intermediate, intermediate_state_indices=buffer_rows,
                cache_steps=nodes, retrieve_parent_token=retrieve)
        for r in range(rotations)
    ])


ACCEPTED = 3  # of a 4-chain


def fold_rows(batches) -> list[dict]:
    """The fold on its own (a flush of FOLD_ENTRIES entries per row) and the commit of 3 accepted nodes of a 4-chain
    per row with no, some and every row folding: an append-only commit must cost an append, not a fold. Beside each
    commit, the intermediate-state baseline's (the engine's, as SGLang's and vLLM's: the last accepted node's state
    copied from the verify's node states into the pool), which does not depend on folds."""
    rows = []
    for batch in batches:
        rows += _fold_batch(batch)
        torch.cuda.empty_cache()
    return rows


def _fold_batch(batch: int) -> list[dict]:
    rotations = rotations_for(2 * batch * STATE_BYTES)
    pools = Pools.make(rotations * batch, ENGINE_FLUSH_LENGTH, (HV, K, V), (H, K), (HV, V), HV)
    slots = [rotation_slots(r, batch) for r in range(rotations)]
    tail = [(*pools.args()[1:], slots[r]) for r in range(rotations)]
    pools.buf_len.fill_(FOLD_ENTRIES)
    flush_s = time_calls([partial(gdn_flush, pools.state, slots[r], *tail[r]) for r in range(rotations)])
    rows = [{"section": "gdn_fold", "case": f"flush of {FOLD_ENTRIES} entries", "batch": batch,
             "rotations": rotations, "folded_rows": batch, "ours_us": flush_s * 1e6,
             "bytes_moved": batch * fold_bytes(FOLD_ENTRIES)}]

    # the verify outputs of a 4-chain per row: k [B, T, H, K], u [B, T, HV, V], gcum [B, T, HV]
    x = TokenInputs(rotations, batch, ACCEPTED + 1)
    u = torch.randn(rotations, batch, ACCEPTED + 1, HV, V, device="cuda") * 0.1
    gcum = log_decay(rotations, batch, ACCEPTED + 1, HV).cumsum(2) - FOLD_ENTRIES
    accepted, num_accepted = chain_prefix(batch, ACCEPTED)
    # flushed=False: the engine's commit (its cache knows which rows fold), without the three torch ops that compute
    # the flushed rows for other callers (they ran in these rows' times until 2026-12-05)
    commits = time_commit_cases(batch, rotations, pools.buf_len, ACCEPTED, FOLD_ENTRIES, lambda r: partial(
        gdn_commit, x.k[r], u[r], gcum[r], accepted, num_accepted, pools.state, slots[r], *tail[r], FOLD_ENTRIES,
        flushed=False))
    for row in commits:
        folded, entries_read = row["folded_rows"], row.pop("entries_read")
        row.update(section="gdn_fold", bytes_moved=folded * 2 * STATE_BYTES + entries_read * ENTRY_BYTES
                   + (batch - folded) * append_bytes(ACCEPTED))
    add_baseline_commit(commits, pools.state, slots, ACCEPTED + 1, accepted, num_accepted)
    return rows + commits


def fold_bytes(entries: int) -> int:
    """Bytes one request's fold of `entries` buffer entries must move: its state read and written once, the entries
    read."""
    return 2 * STATE_BYTES + entries * ENTRY_BYTES


def append_bytes(entries: int) -> int:
    """Bytes one request's commit that folds nothing moves: its accepted entries read and written to the buffer."""
    return 2 * entries * ENTRY_BYTES
