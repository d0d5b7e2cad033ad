"""Mamba2 at Nemotron-3-Nano shapes (64 heads, head dim 64, state 128, 8 groups, fp32 state): decode against SGLang's
selective_state_update, tree verify against the intermediate-state kernel (one state written per node) and, when the
wheel has it, SGLang's selective_state_update in its intermediate-state mode, and the commit of a speculative step
against the intermediate-state baseline's (the last accepted node's state copied into the pool).

Every row carries "bytes_moved": what our kernel must move at the least (each state it reads once, the token inputs,
the outputs, the buffer entries it reads or writes; fp32 throughout, scratch not counted), and "baseline_bytes_moved"
the same for the baseline, so that bytes / copy bandwidth gives each kernel's bound.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from benchmarks.commit_cases import add_baseline_commit, chain_prefix, time_commit_cases
from benchmarks.inputs import Pools, rotation_slots, tree_parents
from benchmarks.timing import rotations_for, time_calls
from verify_kernels.intermediate import mamba2_intermediate
from verify_kernels.mamba2 import mamba2_commit, mamba2_decode_commit, mamba2_verify
from verify_kernels.mamba2.verify import verify_scratch_bytes
from verify_kernels.tree import ancestor_mask

NH, P, N, NG = 64, 64, 128, 8
STATE_BYTES = NH * P * N * 4                         # one request, one layer: 2 MiB
TOKEN_BYTES = (NH * P + NH) * 4 + 2 * NG * N * 2    # one token's inputs: x, dt (fp32), B, C (bf16, as the glue's)
OUTPUT_BYTES = NH * P * 4                            # y
ENTRY_BYTES = (NH * P + NG * N + NH) * 4             # a buffer entry: xdt, B, G
ENGINE_FLUSH_LENGTH = 16                             # the buffer's capacity, as the engine's (a decode row: its L)
VERIFY_FILL = 8                                      # buffered entries under the verified trees (as GDN's rows)
VERIFY_TREES = {"chain5": [-1, 0, 1, 2, 3], "tree16": tree_parents("tree16")}


def decode_bytes(batch: int, flush_length: int) -> float:
    """Bytes per decode step amortised over flush_length steps: flush_length - 1 steps that read the state and the
    buffer at its mean fill and append an entry, and one that folds the full buffer: state read and written."""
    fill = (flush_length - 2) // 2
    step = STATE_BYTES + TOKEN_BYTES + OUTPUT_BYTES + (fill + 1) * ENTRY_BYTES
    fold = 2 * STATE_BYTES + TOKEN_BYTES + OUTPUT_BYTES + (flush_length - 1) * ENTRY_BYTES
    return batch * ((flush_length - 1) * step + fold) / flush_length


def recurrent_decode_bytes(batch: int) -> int:
    """Bytes per step of a recurrent decode (selective_state_update): the state read and written."""
    return batch * (2 * STATE_BYTES + TOKEN_BYTES + OUTPUT_BYTES)


def verify_bytes(batch: int, nodes: int, fill: int) -> int:
    """Bytes of our verify: the state once, the nodes' inputs, outputs and entries (xdt, G), the buffer's entries,
    the ancestor mask."""
    per_node = TOKEN_BYTES + OUTPUT_BYTES + (NH * P + NH) * 4
    return batch * (STATE_BYTES + nodes * per_node + fill * ENTRY_BYTES + nodes * nodes)


def intermediate_verify_bytes(batch: int, nodes: int) -> int:
    """Bytes of an intermediate-state verify: the state once, the nodes' inputs and outputs, a state per node."""
    return batch * (STATE_BYTES + nodes * (TOKEN_BYTES + OUTPUT_BYTES + STATE_BYTES) + nodes * 8)


class TokenInputs:
    """R rotation sets of B rows x T tokens: x, the raw dt (SGLang's kernel applies softplus itself) and the
    softplus'ed one (ours), B and C at the scale of a conv + SiLU output, in bf16 as a bf16 model's glue leaves them
    (verify_kernels/glue/mamba2_inputs.py) for ours, and the same values in fp32 (bm32, cm32) for the intermediate-state
    kernel (as the engine gives them to it: specdec/cache/linear_state.py) and SGLang's (its inputs as these
    benchmarks gave them before 2026-12-04, so that its rows stay comparable)."""

    def __init__(self, rotations: int, batch: int, tokens: int):
        shape = (rotations, batch, tokens)
        self.x = torch.randn(*shape, NH, P, device="cuda")
        self.dt_raw = torch.randn(*shape, NH, device="cuda") - 2.0
        self.dt = F.softplus(self.dt_raw)
        self.bm = (torch.randn(*shape, NG, N, device="cuda") * 0.1).bfloat16()
        self.cm = (torch.randn(*shape, NG, N, device="cuda") * 0.1).bfloat16()
        self.bm32, self.cm32 = self.bm.float(), self.cm.float()


def layer_weights() -> tuple[torch.Tensor, torch.Tensor]:
    """A [NH] (< 0) and D [NH]."""
    return -torch.rand(NH, device="cuda") * 4, torch.randn(NH, device="cuda")


# ---------------------------------------------------------------------------------------------------- decode


def decode_rows(batches, flush_lengths, sglang_ssu) -> list[dict]:
    rows = []
    for batch in batches:
        rows += _decode_batch(batch, flush_lengths, sglang_ssu)
        torch.cuda.empty_cache()
    return rows


def _decode_batch(batch: int, flush_lengths, sglang_ssu) -> list[dict]:
    rotations = rotations_for(batch * STATE_BYTES)
    slots = [rotation_slots(r, batch) for r in range(rotations)]
    x = TokenInputs(rotations, batch, 1)
    a_neg, d_skip = layer_weights()

    base = {"section": "mamba2_decode", "batch": batch, "rotations": rotations}
    if sglang_ssu is not None:
        seconds = _sglang_decode_seconds(sglang_ssu, x, a_neg, d_skip, slots, rotations, batch)
        base.update(baseline_us=seconds * 1e6, baseline_bytes_moved=recurrent_decode_bytes(batch))
    rows = []
    for flush_length in flush_lengths:
        calls = pools = None  # the previous flush length's pools freed first
        pools = Pools.make(rotations * batch, flush_length, (NH, P, N), (NG, N), (NH, P), NH)
        calls = [(x.x[r, :, 0], x.dt[r, :, 0], a_neg, x.bm[r, :, 0], x.cm[r, :, 0], d_skip, pools.state, slots[r],
                  *pools.args()[1:], slots[r]) for r in range(rotations)]
        pools.buf_len.fill_((flush_length - 2) // 2)  # the mean fill of the steps that do not fold
        step_s = time_calls([partial(mamba2_decode_commit, *args, flush_length) for args in calls])
        pools.buf_len.fill_(flush_length - 1)  # every row folds its buffer into the state
        flush_s = time_calls([partial(mamba2_decode_commit, *args, flush_length) for args in calls])
        amortised = ((flush_length - 1) * step_s + flush_s) / flush_length
        row = dict(base, flush_length=flush_length, ours_step_us=step_s * 1e6, ours_flush_us=flush_s * 1e6,
                   ours_us=amortised * 1e6, bytes_moved=decode_bytes(batch, flush_length))
        if "baseline_us" in base:
            row["speedup_vs_baseline"] = base["baseline_us"] / row["ours_us"]
        rows.append(row)
    return rows


def _sglang_decode_seconds(ssu, x: TokenInputs, a_neg, d_skip, slots, rotations, batch) -> float:
    """SGLang's (mamba_ssm-derived) selective_state_update: reads and writes each state in place. dt, A, D and
    dt_bias are per head, broadcast over the head dim with stride 0, as the serving engines pass them."""
    states = torch.randn(rotations * batch, NH, P, N, device="cuda") * 0.1
    out = torch.empty(batch, NH, P, device="cuda")
    a_full, d_full, dt_bias = _sglang_head_params(a_neg, d_skip)
    return time_calls([
        partial(ssu, states, x.x[r, :, 0], x.dt_raw[r, :, 0][..., None].expand(batch, NH, P), a_full,
                x.bm32[r, :, 0], x.cm32[r, :, 0], d_full, dt_bias=dt_bias, dt_softplus=True,
                state_batch_indices=slots[r], out=out)
        for r in range(rotations)
    ])


def _sglang_head_params(a_neg, d_skip):
    """A [NH, P, N], D [NH, P] and a zero dt_bias [NH, P], per head with stride 0 (SGLang's tied head dim)."""
    return (a_neg[:, None, None].expand(NH, P, N), d_skip[:, None].expand(NH, P),
            torch.zeros(NH, device="cuda")[:, None].expand(NH, P))


# ---------------------------------------------------------------------------------------------------- verify


def verify_rows(batches, sglang_ssu, trees=tuple(VERIFY_TREES), fill: int = VERIFY_FILL) -> list[dict]:
    rows = []
    for tree in trees:
        for batch in batches:
            rows.append(_verify_batch(tree, batch, sglang_ssu, fill))
            torch.cuda.empty_cache()
    return rows


def _verify_batch(tree: str, batch: int, sglang_ssu, fill: int) -> dict:
    parents_list = VERIFY_TREES[tree]
    nodes = len(parents_list)
    rotations = rotations_for(batch * STATE_BYTES)
    pools = Pools.make(rotations * batch, ENGINE_FLUSH_LENGTH, (NH, P, N), (NG, N), (NH, P), NH)
    pools.buf_len.fill_(fill)
    slots = [rotation_slots(r, batch) for r in range(rotations)]
    x = TokenInputs(rotations, batch, nodes)
    a_neg, d_skip = layer_weights()
    parents = torch.tensor(parents_list, device="cuda").expand(batch, nodes).contiguous()
    num_nodes = torch.full((batch,), nodes, device="cuda")
    ancestors = ancestor_mask(parents, num_nodes)  # once per step, shared by all layers
    ours_s = time_calls([
        partial(mamba2_verify, x.x[r], x.dt[r], a_neg, x.bm[r], x.cm[r], d_skip, parents, num_nodes, pools.state,
                slots[r], *pools.args()[1:], slots[r], ancestors=ancestors)
        for r in range(rotations)
    ])
    del pools  # room for the baselines' node states
    base_s = _intermediate_verify_seconds(x, a_neg, d_skip, parents, num_nodes, slots, rotations, batch, nodes)
    row = {"section": "mamba2_verify", "tree": tree, "nodes": nodes, "batch": batch, "buffer_fill": fill,
           "rotations": rotations, "ours_us": ours_s * 1e6, "bytes_moved": verify_bytes(batch, nodes, fill),
           "ours_state_bytes_per_request": 0,
           "ours_scratch_bytes_per_request": verify_scratch_bytes(nodes, ENGINE_FLUSH_LENGTH, NG),
           "baseline_us": base_s * 1e6, "baseline_bytes_moved": intermediate_verify_bytes(batch, nodes),
           "speedup_vs_baseline": base_s / ours_s, "baseline_state_bytes_per_request": nodes * STATE_BYTES}
    if sglang_ssu is not None:
        sglang_s, note = _sglang_verify_seconds(sglang_ssu, x, a_neg, d_skip, parents, tree, slots, rotations, batch,
                                                nodes)
        if sglang_s is None:
            row["sglang_note"] = note
        else:
            row.update(sglang_us=sglang_s * 1e6, sglang_bytes_moved=intermediate_verify_bytes(batch, nodes),
                       speedup_vs_sglang=sglang_s / ours_s)
    return row


def _intermediate_verify_seconds(x: TokenInputs, a_neg, d_skip, parents, num_nodes, slots, rotations, batch,
                                 nodes) -> float:
    """The intermediate-state baseline's verify kernel (verify_kernels/intermediate/kernels.py, the engine's
    `--linear-backend recurrent`): the tree walked node by node, each node's state written to one preallocated
    buffer (as the engine reserves it); B and C in fp32, as the engine gives them to it (IntermediateStates)."""
    states = torch.randn(rotations * batch, NH, P, N, device="cuda") * 0.1
    node_states = torch.empty(batch, nodes, NH, P, N, device="cuda")
    return time_calls([
        partial(mamba2_intermediate, x.x[r], x.dt[r], a_neg, x.bm32[r], x.cm32[r], d_skip, parents, num_nodes, states,
                slots[r], states_out=node_states)
        for r in range(rotations)
    ])


def _sglang_verify_seconds(ssu, x: TokenInputs, a_neg, d_skip, parents, tree, slots, rotations, batch, nodes):
    """SGLang's target verify: selective_state_update over the T draft tokens, each token's state written to an
    intermediate buffer, the committed state left alone (trees reload each node's parent state from the buffer).
    Returns (seconds, None), or (None, the reason) for a wheel whose kernel has no such mode."""
    states = torch.randn(rotations * batch, NH, P, N, device="cuda") * 0.1
    intermediate = torch.empty(batch, nodes, NH, P, N, device="cuda")
    out = torch.empty(batch, nodes, NH, P, device="cuda")
    buffer_rows = torch.arange(batch, device="cuda")
    a_full, d_full, dt_bias = _sglang_head_params(a_neg, d_skip)
    retrieve = None if tree.startswith("chain") else parents
    calls = [
        partial(ssu, states, x.x[r], x.dt_raw[r][..., None].expand(batch, nodes, NH, P), a_full, x.bm32[r],
                x.cm32[r], d_full, dt_bias=dt_bias, dt_softplus=True, state_batch_indices=slots[r], out=out,
                disable_state_update=True, intermediate_states_buffer=intermediate, cache_steps=nodes,
                retrieve_parent_token=retrieve, intermediate_state_indices=buffer_rows)
        for r in range(rotations)
    ]
    try:
        return time_calls(calls), None
    except (TypeError, AssertionError, RuntimeError) as error:  # an older wheel: no multi-token mode
        return None, f"selective_state_update has no intermediate-state verify here: {type(error).__name__}: {error}"


ACCEPTED, CHAIN_NODES = 3, 5


def commit_rows(batches) -> list[dict]:
    """The commit of 3 accepted nodes of a 5-chain per row with no, some and every row folding, beside the
    intermediate-state baseline's commit (which does not depend on folds)."""
    rows = []
    for batch in batches:
        rows += _commit_batch(batch)
        torch.cuda.empty_cache()
    return rows


def _commit_batch(batch: int) -> list[dict]:
    rotations = rotations_for(2 * batch * STATE_BYTES)
    pools = Pools.make(rotations * batch, ENGINE_FLUSH_LENGTH, (NH, P, N), (NG, N), (NH, P), NH)
    slots = [rotation_slots(r, batch) for r in range(rotations)]
    tail = [(*pools.args()[1:], slots[r]) for r in range(rotations)]
    # the verify's inputs and outputs of a 5-chain per row: B [B, T, NG, N], xdt [B, T, NH, P], gcum [B, T, NH]
    x = TokenInputs(rotations, batch, CHAIN_NODES)
    xdt = torch.randn(rotations, batch, CHAIN_NODES, NH, P, device="cuda") * 0.1
    gcum = -F.softplus(torch.randn(rotations, batch, CHAIN_NODES, NH, device="cuda")).cumsum(2)
    accepted, num_accepted = chain_prefix(batch, ACCEPTED)
    rows = time_commit_cases(batch, rotations, pools.buf_len, ACCEPTED, ENGINE_FLUSH_LENGTH, lambda r: partial(
        mamba2_commit, x.bm[r], xdt[r], gcum[r], accepted, num_accepted, pools.state, slots[r], *tail[r],
        ENGINE_FLUSH_LENGTH))
    for row in rows:
        folded, entries_read = row["folded_rows"], row.pop("entries_read")
        row.update(section="mamba2_commit", bytes_moved=folded * 2 * STATE_BYTES + entries_read * ENTRY_BYTES
                   + (batch - folded) * 2 * ACCEPTED * ENTRY_BYTES)
    add_baseline_commit(rows, pools.state, slots, CHAIN_NODES, accepted, num_accepted)
    return rows
