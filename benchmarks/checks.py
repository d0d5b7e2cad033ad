"""Before timing: the kernels against the torch references at the benchmark's own full shapes, on fresh random
inputs, outputs and written pools alike (relative L2 error; NaN counts as a failure). The GDN ops at a small and a
larger batch, which take different kernels."""

from __future__ import annotations

import torch

from benchmarks import gdn, mamba2
from benchmarks.inputs import Pools, log_decay, tree_parents, unit
from verify_kernels.gdn import (
    gdn_commit,
    gdn_commit_ref,
    gdn_decode_commit,
    gdn_decode_ref,
    gdn_flush,
    gdn_flush_ref,
    gdn_verify,
    gdn_verify_ref,
)
from verify_kernels.mamba2 import (
    mamba2_commit,
    mamba2_commit_ref,
    mamba2_decode_ref,
    mamba2_flush,
    mamba2_flush_ref,
    mamba2_verify_ref,
)
from verify_kernels.mamba2.decode import DecodeConfig, mamba2_decode_fwd
from verify_kernels.mamba2.verify import VerifyConfig, mamba2_verify_fwd

BATCH = 4
TOLERANCE = 1e-4


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    if not torch.isfinite(actual).all():
        return float("inf")
    return ((actual.float() - expected.float()).norm() / expected.float().norm().clamp_min(1e-30)).item()


def _clone(pools: Pools) -> Pools:
    return Pools(*(t.clone() for t in pools.args()))


def _gdn_rows(batch: int, capacity: int, fills: list[int]) -> tuple[Pools, torch.Tensor, torch.Tensor]:
    """Pools for `batch` rows at GDN's full shapes whose buffer fills cycle through `fills`, every fourth row without
    a state (short context, never flushed); req_slots and state_slots."""
    H, HV, K, V = gdn.H, gdn.HV, gdn.K, gdn.V
    pools = Pools.make(batch, capacity, (HV, K, V), (H, K), (HV, V), HV)
    pools.buf_len.copy_(torch.tensor([fills[i % len(fills)] for i in range(batch)], device="cuda"))
    slots = torch.arange(batch, device="cuda")
    return pools, slots, torch.where(slots % 4 == 0, -1, slots)


def check_gdn_decode_commit(batch: int, flush_length: int = 16, every_row_folds: bool = False) -> float:
    """Decode + commit with rows that append and rows that fold (in the decode kernel at small batches, in the fold
    kernel at large ones): o, the folded states and the buffers. every_row_folds: a step in which every row folds
    (buffers of 0 to flush_length - 1 entries, flush length 1 for those with fewer), decoded in the fold kernel."""
    H, HV, K, V = gdn.H, gdn.HV, gdn.K, gdn.V
    pools, slots, state_slots = _gdn_rows(batch, flush_length, [0, 5, flush_length - 1, flush_length - 1])
    if every_row_folds:
        flush_length = 1
    state_slots = torch.where(pools.buf_len + 1 >= flush_length, slots, state_slots)  # folding rows need a slot
    q, k = (unit(batch, H, K) * K**-0.5).bfloat16(), unit(batch, H, K).bfloat16()  # (the KVBuffer's, a bf16 model's)
    v, g, beta = torch.randn(batch, HV, V, device="cuda"), log_decay(batch, HV), torch.rand(batch, HV, device="cuda")
    ref_pools = _clone(pools)
    o_ref, u_ref, gcum_ref = gdn_decode_ref(q, k, v, g, beta, ref_pools.state, state_slots, *ref_pools.args()[1:],
                                            slots)
    accepted = torch.zeros(batch, 1, dtype=torch.long, device="cuda")
    gdn_commit_ref(k[:, None], u_ref[:, None], gcum_ref[:, None], accepted, torch.ones_like(slots), ref_pools.state,
                   state_slots, *ref_pools.args()[1:], slots, flush_length)
    o, _ = gdn_decode_commit(q, k, v, g, beta, pools.state, state_slots, *pools.args()[1:], slots, flush_length,
                             every_row_folds=every_row_folds)
    return max(relative_error(o, o_ref), relative_error(pools.state, ref_pools.state),
               relative_error(pools.buf_value, ref_pools.buf_value))


def _gdn_tree_inputs(batch: int, tree: str):
    H, HV, K, V = gdn.H, gdn.HV, gdn.K, gdn.V
    parents = torch.tensor(tree_parents(tree), device="cuda").expand(batch, -1).contiguous()
    nodes = parents.shape[1]
    num_nodes = torch.tensor([[nodes, nodes, min(3, nodes), 1][i % 4] for i in range(batch)], device="cuda")
    q, k = (unit(batch, nodes, H, K) * K**-0.5).bfloat16(), unit(batch, nodes, H, K).bfloat16()  # (as the decode's)
    v, g = torch.randn(batch, nodes, HV, V, device="cuda"), log_decay(batch, nodes, HV)
    beta = torch.rand(batch, nodes, HV, device="cuda")
    return q, k, v, g, beta, parents, num_nodes


def check_gdn_verify(batch: int, tree: str) -> float:
    """Verify of ragged trees on buffers from empty to full (one kernel at small batches, two passes at large)."""
    q, k, v, g, beta, parents, num_nodes = _gdn_tree_inputs(batch, tree)
    pools, slots, state_slots = _gdn_rows(batch, 16, [0, 8, 15, 3])
    args = (q, k, v, g, beta, parents, num_nodes, pools.state, state_slots, *pools.args()[1:], slots)
    expected, actual = gdn_verify_ref(*args), gdn_verify(*args)
    return max(relative_error(a, e) for a, e in zip(actual, expected, strict=True))


def check_gdn_commit(batch: int, flush_length: int = 16) -> float:
    """Commit of 0-4 accepted nodes of a 4-chain per row, some rows folding (one launch at small batches, the append
    and fold kernels at large), then a flush of what is left: the states and buffers."""
    q, k, v, g, beta, parents, num_nodes = _gdn_tree_inputs(batch, "chain4")
    pools, slots, state_slots = _gdn_rows(batch, flush_length, [0, 13, 15, 2, 12])
    _, u, gcum = gdn_verify_ref(q, k, v, g, beta, parents, num_nodes, pools.state, state_slots, *pools.args()[1:],
                                slots)
    num_accepted = torch.minimum(torch.arange(batch, device="cuda") % 5, num_nodes)
    accepted = torch.where(torch.arange(4, device="cuda") < num_accepted[:, None], torch.arange(4, device="cuda"), -1)
    state_slots = torch.where(pools.buf_len + num_accepted >= flush_length, slots, state_slots)
    ref_pools = _clone(pools)
    commit = (k, u, gcum, accepted, num_accepted)
    flushed_ref = gdn_commit_ref(*commit, ref_pools.state, state_slots, *ref_pools.args()[1:], slots, flush_length)
    flushed = gdn_commit(*commit, pools.state, state_slots, *pools.args()[1:], slots, flush_length)
    if not torch.equal(flushed, flushed_ref):
        return float("inf")
    errors = [relative_error(pools.state, ref_pools.state), relative_error(pools.buf_value, ref_pools.buf_value)]
    # then flush every row that kept entries (the caller's bookkeeping: buf_len 0 where flushed, else + accepted)
    for p in (pools, ref_pools):
        p.buf_len.copy_(torch.where(flushed, 0, p.buf_len + num_accepted))
    state_slots = slots
    gdn_flush_ref(ref_pools.state, state_slots, *ref_pools.args()[1:], slots)
    gdn_flush(pools.state, state_slots, *pools.args()[1:], slots)
    return max(errors + [relative_error(pools.state, ref_pools.state)])


def check_mamba2_decode_commit(flush_length: int = 16, config: DecodeConfig | None = None) -> float:
    """Our decode-commit at full size, the launcher's blocks (or `config`'s), 8 rows: folds and appends, with and
    without a state; outputs, states and buffers."""
    NH, P, N, NG = mamba2.NH, mamba2.P, mamba2.N, mamba2.NG
    rows, full = 8, flush_length - 1
    pools = Pools.make(rows, flush_length, (NH, P, N), (NG, N), (NH, P), NH)
    pools.buf_len.copy_(torch.tensor([0, 5, full, full, 3, full, 0, 7], device="cuda"))
    slots = torch.arange(rows, device="cuda")
    state_slots = torch.tensor([-1, 1, 2, 3, -1, 5, 6, 7], device="cuda")  # rows that fold have a state
    x = mamba2.TokenInputs(1, rows, 1)
    x, dt, bm, cm = x.x[0, :, 0], x.dt[0, :, 0], x.bm[0, :, 0], x.cm[0, :, 0]
    a_neg, d_skip = mamba2.layer_weights()
    ref_pools = _clone(pools)
    y_ref, xdt_ref, gcum_ref = mamba2_decode_ref(x, dt, a_neg, bm, cm, d_skip, ref_pools.state, state_slots,
                                                 *ref_pools.args()[1:], slots)
    accepted = torch.zeros(rows, 1, dtype=torch.long, device="cuda")
    mamba2_commit_ref(bm[:, None], xdt_ref[:, None], gcum_ref[:, None], accepted, torch.ones_like(slots),
                      ref_pools.state, state_slots, *ref_pools.args()[1:], slots, flush_length)
    y, _ = mamba2_decode_fwd(x, dt, a_neg, bm, cm, d_skip, pools.state, state_slots, *pools.args()[1:], slots,
                             flush_length, config)
    return max(relative_error(y, y_ref), relative_error(pools.state, ref_pools.state),
               relative_error(pools.buf_value, ref_pools.buf_value), relative_error(pools.buf_key, ref_pools.buf_key))


def check_mamba2_commit(flush_length: int = 16) -> float:
    """Our commit at full size and the current settings, 8 rows of a 5-chain: 0-5 accepted nodes, rows folding and
    appending; then a flush of what is left: the states and buffers."""
    NH, P, N, NG = mamba2.NH, mamba2.P, mamba2.N, mamba2.NG
    rows, nodes = 8, 5
    pools = Pools.make(rows, flush_length, (NH, P, N), (NG, N), (NH, P), NH)
    pools.buf_len.copy_(torch.tensor([0, 13, 15, 2, 12, 14, 0, 13], device="cuda"))
    slots = torch.arange(rows, device="cuda")
    x = mamba2.TokenInputs(1, rows, nodes)
    xdt = torch.randn(rows, nodes, NH, P, device="cuda") * 0.1
    gcum = -torch.nn.functional.softplus(torch.randn(rows, nodes, NH, device="cuda")).cumsum(1)
    num_accepted = torch.tensor([1, 3, 1, 4, 0, 2, 5, 3], device="cuda")
    chain = torch.arange(nodes, device="cuda")
    accepted = torch.where(chain < num_accepted[:, None], chain, -1)
    commit = (x.bm[0], xdt, gcum, accepted, num_accepted, pools.state, slots)
    ref_pools = _clone(pools)
    flushed_ref = mamba2_commit_ref(*commit[:5], ref_pools.state, slots, *ref_pools.args()[1:], slots, flush_length)
    flushed = mamba2_commit(*commit, *pools.args()[1:], slots, flush_length)
    if not torch.equal(flushed, flushed_ref):
        return float("inf")
    errors = [relative_error(a, e) for a, e in zip(pools.args()[:4], ref_pools.args()[:4], strict=True)]
    # then flush every row that kept entries (the caller's bookkeeping: buf_len 0 where flushed, else + accepted)
    for p in (pools, ref_pools):
        p.buf_len.copy_(torch.where(flushed, 0, p.buf_len + num_accepted))
    mamba2_flush_ref(ref_pools.state, slots, *ref_pools.args()[1:], slots)
    mamba2_flush(pools.state, slots, *pools.args()[1:], slots)
    return max(errors + [relative_error(pools.state, ref_pools.state)])


def check_mamba2_verify(tree: str, config: VerifyConfig | None = None) -> float:
    """Our verify of the benchmark's trees at full size, the launcher's choice (or `config`) for 8 rows (the
    products pass) and 1 (the one-launch path): rows with and without a state, empty to full buffers, ragged (rows
    of 3, 2, 1 and 0 nodes)."""
    NH, P, N, NG = mamba2.NH, mamba2.P, mamba2.N, mamba2.NG
    nodes = len(mamba2.VERIFY_TREES[tree])
    rows = 8
    num_nodes = torch.tensor([nodes, nodes, 3, 1, nodes, 2, nodes, 0], device="cuda")
    pools = Pools.make(rows, 16, (NH, P, N), (NG, N), (NH, P), NH)
    pools.buf_len.copy_(torch.tensor([0, 8, 15, 3, 12, 1, 15, 5], device="cuda"))
    state_slots = torch.tensor([-1, 1, 2, 3, -1, 5, 6, 7], device="cuda")
    x = mamba2.TokenInputs(1, rows, nodes)
    a_neg, d_skip = mamba2.layer_weights()
    errors = []
    for batch in (rows, 1):
        parents = torch.tensor(mamba2.VERIFY_TREES[tree], device="cuda").expand(batch, -1).contiguous()
        slots = torch.arange(batch, device="cuda")
        args = (x.x[0, :batch], x.dt[0, :batch], a_neg, x.bm[0, :batch], x.cm[0, :batch], d_skip, parents,
                num_nodes[:batch], pools.state, state_slots[:batch], *pools.args()[1:], slots)
        expected, actual = mamba2_verify_ref(*args), mamba2_verify_fwd(*args, None, config)
        errors += [relative_error(a, e) for a, e in zip(actual, expected, strict=True)]
    return max(errors)


def run_all() -> dict[str, float]:
    errors = {
        # batch 4: the small-batch kernels (decode folding in place, verify fused, commit in one launch); 24: the rest
        "gdn_decode_commit_b4": check_gdn_decode_commit(4),
        "gdn_decode_commit_b24": check_gdn_decode_commit(24),
        "gdn_decode_commit_every_row_folds_b24": check_gdn_decode_commit(24, every_row_folds=True),
        "gdn_verify_chain4_b4": check_gdn_verify(4, "chain4"),
        "gdn_verify_chain4_b24": check_gdn_verify(24, "chain4"),
        "gdn_verify_chain5_b24": check_gdn_verify(24, "chain5"),  # (the engine's chain of 4 drafted tokens)
        "gdn_verify_tree16_b4": check_gdn_verify(4, "tree16"),
        "gdn_verify_tree16_b24": check_gdn_verify(24, "tree16"),
        "gdn_commit_flush_b4": check_gdn_commit(4),
        "gdn_commit_flush_b24": check_gdn_commit(24),
        "mamba2_decode_commit": check_mamba2_decode_commit(),
        "mamba2_commit_flush": check_mamba2_commit(),
        "mamba2_verify_chain5": check_mamba2_verify("chain5"),
        "mamba2_verify_tree16": check_mamba2_verify("tree16"),
    }
    failed = {name: error for name, error in errors.items() if not error <= TOLERANCE}
    if failed:
        raise SystemExit(f"kernels disagree with the references, not timing them: {failed}")
    return errors
