"""The Gated DeltaNet decode and decode + commit (verify_kernels/gdn/decode.py), the fold in the fold kernel or in the
decode's own programs, against the torch references (verify_kernels/gdn/naive.py) through tests/gdn_checks.py.
Without a GPU the kernels run in Triton's interpreter (tests/conftest.py) on small heads."""

import pytest

from tests.gdn_checks import DIMS, ROWS, L, check_decode, check_decode_commit, make_batch
from verify_kernels.gdn import decode as decode_module

# every output a kernel allocates starts as NaN: an element it forgets to write fails (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nan_empty")


@pytest.fixture(params=["fold-kernel", "fold-in-place", "split-roles", "split-roles-buffer-per-head",
                        "split-roles-capped"])
def decode_path(request, monkeypatch):
    """Decode + commit folds in the fold kernel, or for batches up to SMALL_BATCH in the decode kernel's own programs;
    or state and buffer programs side by side and a finishing launch (DECODE_SPLIT_ROLES, at 16 columns a program and 8
    in the finish: several blocks per head; its buffer programs over 16 columns as the state programs, or over 32, a
    whole head at V = 32, the grid's other buffer slots idle: SPLIT_BUFFER_BLOCK_V; and with the register cap where
    the default has none, or none where it has one). All are tested on the same rows
    (the fold's S0 tiles through tensor descriptors or pointers: tests/test_gdn_fold.py)."""
    monkeypatch.setattr(decode_module, "SMALL_BATCH", len(ROWS) if request.param == "fold-in-place" else 0)
    monkeypatch.setattr(decode_module, "DECODE_SPLIT_ROLES", request.param.startswith("split-roles"))
    if request.param.startswith("split-roles"):
        monkeypatch.setattr(decode_module, "BLOCK_V", 16)
        monkeypatch.setattr(decode_module, "SPLIT_FINISH_BLOCK_V", 8)
        monkeypatch.setattr(decode_module, "SPLIT_BUFFER_BLOCK_V", 32 if request.param.endswith("per-head") else None)
        # the state and buffer programs' register cap (SPLIT_ROLES_MAX_REGISTERS: Triton's maxnreg, which the
        # interpreter takes and ignores) on where it is off and off where on
        capped = request.param.endswith("capped") == (decode_module.SPLIT_ROLES_MAX_REGISTERS is None)
        monkeypatch.setattr(decode_module, "SPLIT_ROLES_MAX_REGISTERS", 144 if capped else None)
    return request.param


@pytest.mark.parametrize("d", DIMS.values(), ids=DIMS.keys())
def test_decode(d, decode_path):
    check_decode(make_batch(d, ROWS, seed=1))


DECODE_COMMITS = {
    # flush_length: which rows of ROWS (buffered 0, 7, 3, 0, 5) fold, buf_len + 1 >= flush_length
    "fold-rows-1-4": 6,
    "fold-all": 1,
    "fold-full-buffer": L,
}


@pytest.mark.parametrize("flush_length", DECODE_COMMITS.values(), ids=DECODE_COMMITS.keys())
@pytest.mark.parametrize("d", DIMS.values(), ids=DIMS.keys())
def test_decode_commit(d, flush_length, decode_path):
    check_decode_commit(make_batch(d, ROWS, seed=2), flush_length)
