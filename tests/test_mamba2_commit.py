"""The Mamba2 commit and flush (verify_kernels/mamba2/commit.py), against the torch references
(verify_kernels/mamba2/naive.py) through tests/mamba2_checks.py. Without a GPU the kernels run in Triton's
interpreter (tests/conftest.py) on small heads; the `gpu` cases use Nemotron-3-Nano's sizes. Outputs are NaN-poisoned
(torch.empty returns NaN here)."""

import pytest
import torch

from tests.mamba2_checks import HEADS, L, allocate_fold_slots, assert_pools_match, clone, commit_after_verify, kv_pools
from verify_kernels.mamba2 import commit as commit_module
from verify_kernels.mamba2 import mamba2_flush, mamba2_flush_ref

# every output a kernel allocates starts as NaN: an element it forgets to write fails (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nan_empty")


# per row: buffered entries, has a state, accepted root path; T = 8 nodes
COMMITS = {
    "fold-and-append": (6, [(3, True, [0, 1, 3]), (0, False, [6]), (2, True, [0, 1, 3, 4, 7]), (5, True, []),
                            (L - 1, False, [0, 2])]),
    "nothing-accepted": (4, [(4, True, []), (3, True, []), (0, False, [])]),
    "append-only": (L, [(0, False, [0, 1, 3, 4, 7]), (L - 6, True, [6, 7]), (7, True, [0])]),
}


@pytest.mark.parametrize("case", COMMITS.values(), ids=COMMITS.keys())
@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
@pytest.mark.parametrize("registers", [None, 96], ids=["uncapped", "capped"])
def test_commit_matches_reference(heads, case, registers, monkeypatch):
    """Every case with the kernel's register cap (commit.MAX_REGISTERS: Triton's maxnreg, which the interpreter takes
    and ignores) off and on."""
    monkeypatch.setattr(commit_module, "MAX_REGISTERS", registers)
    flush_length, rows = case
    gen = torch.Generator().manual_seed(4)
    pools = kv_pools(gen, heads, [(n, has_state) for n, has_state, _ in rows])
    (flushed, ours), (flushed_ref, ref) = commit_after_verify(gen, heads, pools, 8, [p for *_, p in rows],
                                                              flush_length)
    assert flushed.tolist() == flushed_ref.tolist()
    assert_pools_match(ours, ref)


def test_commit_of_long_paths_matches_reference():
    """Accepted paths and buffers longer than one BLOCK_E step: a 20-node append and a fold of 30 + 20 entries."""
    heads = HEADS["hpg1-P16-N32"]
    gen = torch.Generator().manual_seed(5)
    pools = kv_pools(gen, heads, [(0, False), (30, True), (3, True)], capacity=40)
    path = list(range(20))
    (flushed, ours), (flushed_ref, ref) = commit_after_verify(gen, heads, pools, 33, [path, path, path[:17]], 40)
    assert flushed.tolist() == flushed_ref.tolist() == [False, True, False]
    assert_pools_match(ours, ref)


@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
def test_flush_matches_reference(heads):
    """Rows with buffered entries fold (one of them into a freshly zeroed slot); empty ones, even without a state
    slot, are left alone."""
    gen = torch.Generator().manual_seed(6)
    pools = kv_pools(gen, heads, [(0, False), (L - 1, True), (1, True), (17, False), (0, True)])
    allocate_fold_slots(pools, torch.zeros_like(pools.state_slots), 1)
    ours, ref = clone(pools), clone(pools)
    assert mamba2_flush(*ours.args()) is None
    mamba2_flush_ref(*ref.args())
    assert_pools_match(ours, ref)
