"""The Gated DeltaNet commit (verify_kernels/gdn/commit.py), appending in its own kernel or in the fold kernel, against
the torch references (verify_kernels/gdn/naive.py) through tests/gdn_checks.py. Without a GPU the kernels run in
Triton's interpreter (tests/conftest.py) on small heads."""

import pytest
import torch

from tests.gdn_checks import COMMITS, DIMS, ROWS, check_commit, make_batch
from tests.reference_checks import TREE
from verify_kernels.gdn import commit as commit_module
from verify_kernels.gdn import fold as fold_module

# every output a kernel allocates starts as NaN: an element it forgets to write fails (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nan_empty")


@pytest.fixture(params=["two-kernels", "one-launch", "two-kernels-fold-16-columns"])
def commit_path(request, monkeypatch):
    """The commit appends in its own kernel, or for batches up to ONE_LAUNCH_MAX_BATCH in the fold kernel; or, in two
    kernels, folds 16 V columns a program (a sweep candidate: fold.LOOPED_FOLD_BLOCK_V; k32-hv2 has two blocks)."""
    monkeypatch.setattr(commit_module, "ONE_LAUNCH_MAX_BATCH", 0 if request.param != "one-launch" else len(ROWS))
    if request.param == "two-kernels-fold-16-columns":
        monkeypatch.setattr(fold_module, "LOOPED_FOLD_BLOCK_V", 16)
    return request.param



@pytest.mark.parametrize("case", COMMITS.values(), ids=COMMITS.keys())
@pytest.mark.parametrize("d", DIMS.values(), ids=DIMS.keys())
def test_commit(d, case, commit_path):
    flush_length, lengths = case
    check_commit(make_batch(d, ROWS, seed=4, T=len(TREE), shape="tree"), lengths, flush_length)


def test_the_engines_ops_leave_flushed_rows_uncomputed():
    """The cache knows which rows fold on the host: the Triton backend's GDN commit and decode + commit compute no
    flushed tensor (three torch launches per layer and step less), and commit as the defaults do."""
    from specdec.backend import gdn_ops
    from tests.gdn_checks import accept, clone, for_kernel, to
    from verify_kernels.gdn import gdn_commit, gdn_verify_ref

    ops = gdn_ops("triton")
    b = make_batch(DIMS["k16-hv2-bf16"], ROWS, seed=4, T=len(TREE), shape="tree")
    flush_length, lengths = COMMITS["fold-and-append"]
    _, u, gcum = gdn_verify_ref(*b.x, b.parents, b.num_nodes, *b.pools.args())
    accepted, num_accepted = accept(b, lengths)
    ref_pools = clone(b.pools)
    ref_pools.before_commit(num_accepted, flush_length)
    ours, theirs = for_kernel(ref_pools, "cpu"), for_kernel(ref_pools, "cpu")
    inputs = to([b.x[1], u, gcum, accepted, num_accepted], "cpu")
    assert ops.commit(*inputs, *ours.args(), flush_length) is None
    assert gdn_commit(*inputs, *theirs.args(), flush_length) is not None
    for mine, default in zip(ours.args(), theirs.args(), strict=True):
        torch.testing.assert_close(mine, default, rtol=0, atol=0, equal_nan=True)  # (stale entries: NaN)
    step = make_batch(DIMS["k16-hv2-bf16"], ROWS, seed=5)
    pools = for_kernel(clone(step.pools), "cpu")
    q, k, v, g, beta = (x[:, 0] for x in step.x)
    o, flushed = ops.decode_commit(q, k, v, g, beta, *pools.args(), 2)
    assert flushed is None and o.shape == v.shape
