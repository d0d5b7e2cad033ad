"""The Mamba2 decode and decode-commit (verify_kernels/mamba2/decode.py), with the launcher's blocks and blocks that
split the heads, against the torch references (verify_kernels/mamba2/naive.py) through tests/mamba2_checks.py.
Without a GPU the kernels run in Triton's interpreter (tests/conftest.py) on small heads; the `gpu` cases use
Nemotron-3-Nano's sizes. Outputs are NaN-poisoned (torch.empty returns NaN here)."""

import pytest
import torch

from tests.mamba2_checks import (
    DEVICE,
    HEADS,
    NEMOTRON_NANO,
    ROWS,
    SLICED,
    SMALL_DECODE,
    L,
    allocate_fold_slots,
    assert_close,
    assert_pools_match,
    clone,
    decode_commit_both,
    kv_pools,
    layer,
    needs_cuda,
    tokens,
)
from verify_kernels.mamba2 import mamba2_commit_ref, mamba2_decode, mamba2_decode_commit, mamba2_decode_ref
from verify_kernels.mamba2.decode import mamba2_decode_fwd

# every output a kernel allocates starts as NaN: an element it forgets to write fails (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nan_empty")


@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
def test_decode_matches_reference_and_writes_nothing(heads):
    gen = torch.Generator().manual_seed(0)
    A, D = layer(gen, heads)
    pools = kv_pools(gen, heads, ROWS)
    before = clone(pools)
    x, dt, Bm, C = tokens(gen, heads, len(ROWS))
    out = mamba2_decode(x, dt, A, Bm, C, D, *pools.args())
    ref = mamba2_decode_ref(x, dt, A, Bm, C, D, *pools.args())
    for name, o, r in zip(("y", "xdt", "gcum"), out, ref, strict=True):
        assert o.dtype == torch.float32, name
        assert_close(o, r)
    assert_pools_match(pools, before, tol=0)


FLUSH_LENGTHS = {"fold-and-append": 6, "every-row-folds": 1, "only-the-full-buffer-folds": L}


@pytest.mark.parametrize("flush_length", FLUSH_LENGTHS.values(), ids=FLUSH_LENGTHS.keys())
@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
def test_decode_commit_matches_decode_then_commit(heads, flush_length):
    gen = torch.Generator().manual_seed(1)
    A, D = layer(gen, heads)
    pools = kv_pools(gen, heads, ROWS)
    x, dt, Bm, C = tokens(gen, heads, len(ROWS))
    (y, flushed, ours), (y_ref, flushed_ref, ref) = decode_commit_both(pools, x, dt, A, Bm, C, D, flush_length)
    assert_close(y, y_ref)
    assert flushed.tolist() == flushed_ref.tolist()
    assert_pools_match(ours, ref)


def test_decode_commit_steps_track_the_reference():
    """Ten plain decoding steps with the caller's bookkeeping, folding every third token (staggered by the rows'
    starting fills): later steps read the states and buffers that earlier ones wrote."""
    heads, flush_length = HEADS["hpg2-P32-N16"], 3
    gen = torch.Generator().manual_seed(2)
    A, D = layer(gen, heads)
    rows = [(0, False), (2, True), (1, True)]
    ours = kv_pools(gen, heads, rows, capacity=4)
    ref = clone(ours)
    one = torch.ones(len(rows), dtype=torch.long, device=DEVICE)
    node0 = torch.zeros(len(rows), 1, dtype=torch.long, device=DEVICE)
    for _ in range(10):
        x, dt, Bm, C = tokens(gen, heads, len(rows))
        for pools in (ours, ref):
            allocate_fold_slots(pools, one, flush_length)
        y, flushed = mamba2_decode_commit(x, dt, A, Bm, C, D, *ours.args(), flush_length)
        y_ref, xdt, gcum = mamba2_decode_ref(x, dt, A, Bm, C, D, *ref.args())
        flushed_ref = mamba2_commit_ref(Bm[:, None], xdt[:, None], gcum[:, None], node0, one, *ref.args(),
                                        flush_length)
        assert_close(y, y_ref)
        assert flushed.tolist() == flushed_ref.tolist()
        ours.after_commit(one, flushed)
        ref.after_commit(one, flushed_ref)
        assert_pools_match(ours, ref)


SPLIT_FOLD = SMALL_DECODE._replace(fold_precision="tf32x3-split")


@pytest.mark.parametrize("config", [SMALL_DECODE, SPLIT_FOLD], ids=["per-row", "split-fold"])
def test_decode_blocks_that_split_the_heads_match_reference(config):
    """Decode and decode-commit with 2 P blocks per head, buffers of 2 steps (19 entries) and folds of 2 N slices; the
    fold's products from operands split by a mask too (a sweep candidate: in the interpreter its TF32 products are
    exact, so this checks the algebra)."""
    gen = torch.Generator().manual_seed(11)
    A, D = layer(gen, SLICED)
    pools = kv_pools(gen, SLICED, ROWS)
    x, dt, Bm, C = tokens(gen, SLICED, len(ROWS))
    out = mamba2_decode_fwd(x, dt, A, Bm, C, D, *pools.args(), None, config)
    ref = mamba2_decode_ref(x, dt, A, Bm, C, D, *pools.args())
    for o, r in zip(out, ref, strict=True):
        assert_close(o, r)
    (y, flushed, ours), (y_ref, flushed_ref, ref) = decode_commit_both(pools, x, dt, A, Bm, C, D, 6, config)
    assert_close(y, y_ref)
    assert flushed.tolist() == flushed_ref.tolist() == [False, True, True, False, False]
    assert_pools_match(ours, ref)




@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("config", [None, SMALL_DECODE], ids=["launcher", "small-blocks"])
def test_nemotron_nano_decode_commit_paths_match_reference(config):
    """Decode-commit at full size, rows that fold (flush_length 16) and rows that append, with the launcher's blocks
    and with small ones."""
    heads = NEMOTRON_NANO
    gen = torch.Generator().manual_seed(14)
    A, D = layer(gen, heads)
    rows = [(15, True), (0, False), (7, True), (15, False), (3, True)]
    pools = kv_pools(gen, heads, rows, capacity=32)
    x, dt, Bm, C = tokens(gen, heads, len(rows))
    (y, flushed, ours), (y_ref, flushed_ref, ref) = decode_commit_both(pools, x, dt, A, Bm, C, D, 16, config)
    assert_close(y, y_ref, 2e-4)
    assert flushed.tolist() == flushed_ref.tolist() == [True, False, False, True, False]
    assert_pools_match(ours, ref, 2e-4)
