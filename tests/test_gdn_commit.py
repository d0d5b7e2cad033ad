"""The Gated DeltaNet commit (verify_kernels/gdn/commit.py), appending in its own kernel or in the fold kernel, against
the torch references (verify_kernels/gdn/naive.py) through tests/gdn_checks.py. Without a GPU the kernels run in
Triton's interpreter (tests/conftest.py) on small heads."""

import pytest

from tests.gdn_checks import COMMITS, DIMS, ROWS, check_commit, make_batch
from tests.reference_checks import TREE
from verify_kernels.gdn import commit as commit_module

# every output a kernel allocates starts as NaN: an element it forgets to write fails (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nan_empty")


@pytest.fixture(params=["two-kernels", "one-launch"])
def commit_path(request, monkeypatch):
    """The commit appends in its own kernel, or for batches up to ONE_LAUNCH_MAX_BATCH in the fold kernel."""
    monkeypatch.setattr(commit_module, "ONE_LAUNCH_MAX_BATCH", 0 if request.param == "two-kernels" else len(ROWS))
    return request.param



@pytest.mark.parametrize("case", COMMITS.values(), ids=COMMITS.keys())
@pytest.mark.parametrize("d", DIMS.values(), ids=DIMS.keys())
def test_commit(d, case, commit_path):
    flush_length, lengths = case
    check_commit(make_batch(d, ROWS, seed=4, T=len(TREE), shape="tree"), lengths, flush_length)
