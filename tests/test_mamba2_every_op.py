"""The Mamba2 kernels, every op on the same rows: strong decay, rows without a state, bad arguments, and all ops at full
size, against the torch references (verify_kernels/mamba2/naive.py) through tests/mamba2_checks.py. Without a GPU the
kernels run in Triton's interpreter (tests/conftest.py) on small heads; the `gpu` cases use Nemotron-3-Nano's sizes.
Outputs are NaN-poisoned (torch.empty returns NaN here)."""

import pytest
import torch

from tests.mamba2_checks import (
    DEVICE,
    HEADS,
    NEMOTRON_NANO,
    VERIFY_CONFIGS,
    Heads,
    L,
    allocate_fold_slots,
    assert_close,
    assert_pools_match,
    clone,
    commit_after_verify,
    decode_commit_both,
    first_node,
    kv_pools,
    layer,
    needs_cuda,
    tokens,
    trees,
)
from tests.reference_checks import NAN, pad_nodes
from verify_kernels.mamba2 import commit as commit_module
from verify_kernels.mamba2 import (
    mamba2_decode,
    mamba2_decode_commit,
    mamba2_decode_ref,
    mamba2_flush,
    mamba2_flush_ref,
    mamba2_verify,
    mamba2_verify_ref,
)
from verify_kernels.mamba2.verify import mamba2_verify_fwd
from verify_kernels.tree import chain_parents

# every output a kernel allocates starts as NaN: an element it forgets to write fails (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nan_empty")


def test_strong_decay_stays_finite():
    """Per-token log decays down to -50: a buffer of 63 entries (G near -1600) under a 64-node chain, then its
    fold. Entries keep G relative to the state, so fp32 resolves G differences only to about |G| 2^-24: the
    tolerance of the reference test."""
    heads = HEADS["hpg2-P32-N16"]
    gen = torch.Generator().manual_seed(7)
    A, D = layer(gen, heads, max_decay=50.0)
    A[0] = -50.0
    pools = kv_pools(gen, heads, [(63, True), (63, False)], capacity=64, max_decay=50.0)
    T = 64
    x, dt, Bm, C = tokens(gen, heads, 2, T)
    dt[:, ::7] = 1.0
    parents, num_nodes = chain_parents(2, T, DEVICE), torch.full((2,), T, device=DEVICE)
    ref = mamba2_verify_ref(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    tol = max(1e-4, 4 * ref[2].abs().max().item() * 2**-24)
    for config in (None, VERIFY_CONFIGS["products-dots"]):   # scores inline (2 rows), then from the products pass
        out = mamba2_verify_fwd(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args(), None, config)
        for o, r in zip(out, ref, strict=True):
            assert_close(o, r, tol)

    # the next token folds 63 + 1 entries into the states (a zeroed one for the row without)
    (y, flushed, ours), (y_ref, flushed_ref, ref) = decode_commit_both(pools, *first_node(x, dt), A,
                                                                       *first_node(Bm, C), D, 64)
    assert flushed.tolist() == flushed_ref.tolist() == [True, True]
    assert_close(y, y_ref, tol)
    assert_pools_match(ours, ref, tol)
    assert torch.isfinite(ours.states()).all()


def test_short_context_rows_never_read_the_state_pool():
    """No row has a state and the whole pool is NaN: decode, verify and a decode-commit that appends stay finite."""
    heads = HEADS["hpg2-P32-N16"]
    gen = torch.Generator().manual_seed(8)
    A, D = layer(gen, heads)
    pools = kv_pools(gen, heads, [(0, False), (4, False), (L - 2, False)])
    pools.state_pool.fill_(NAN)
    parents, num_nodes = trees(gen, 3, 5)
    x, dt, Bm, C = (pad_nodes(t, num_nodes) for t in tokens(gen, heads, 3, 5))
    out = mamba2_verify(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    out += mamba2_decode(*first_node(x, dt), A, *first_node(Bm, C), D, *pools.args())
    ref = mamba2_verify_ref(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    ref += mamba2_decode_ref(*first_node(x, dt), A, *first_node(Bm, C), D, *pools.args())
    for o, r in zip(out, ref, strict=True):
        assert_close(o, r)
    y, flushed = mamba2_decode_commit(*first_node(x, dt), A, *first_node(Bm, C), D, *pools.args(), L)
    assert_close(y, ref[3])
    assert not flushed.any()






def test_bad_arguments_raise():
    gen = torch.Generator().manual_seed(9)
    heads = HEADS["hpg1-P16-N32"]
    A, D = layer(gen, heads)
    pools = kv_pools(gen, heads, [(1, True)])
    x, dt, Bm, C = tokens(gen, heads, 1)
    with pytest.raises(ValueError, match="P and state size N"):
        odd = kv_pools(gen, Heads(2, 2, 24, 32), [(1, True)])
        mamba2_decode(torch.zeros(1, 2, 24, device=DEVICE), dt, A, Bm, C, D, *odd.args())
    with pytest.raises(ValueError, match="contiguous"):
        mamba2_decode(x.transpose(1, 2).contiguous().transpose(1, 2), dt, A, Bm, C, D, *pools.args())
    with pytest.raises(ValueError, match="float32"):
        mamba2_flush(pools.state_pool.double(), *pools.args()[1:])
    with pytest.raises(ValueError, match="flush_length"):
        mamba2_decode_commit(x, dt, A, Bm, C, D, *pools.args(), L + 1)
    T = 65
    xs = tokens(gen, heads, 1, T)
    with pytest.raises(ValueError, match="64 nodes"):
        mamba2_verify(*xs[:2], A, *xs[2:], D, chain_parents(1, T, DEVICE), torch.tensor([T], device=DEVICE),
                      *pools.args())






@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("op", ["decode", "decode_commit", "verify", "commit", "flush"])
def test_nemotron_nano_sizes_match_reference(op):
    """64 heads of P = 64 in 8 groups, N = 128, buffers up to L - 1 = 63 entries, 64-node trees."""
    heads, capacity, T = NEMOTRON_NANO, 64, 64
    gen = torch.Generator().manual_seed(10)
    A, D = layer(gen, heads)
    rows = [(0, False), (63, True), (17, True), (40, False), (0, True), (31, True), (5, False), (62, True)]
    pools = kv_pools(gen, heads, rows, capacity=capacity)
    B = len(rows)
    tol = 2e-4
    if op == "decode_commit":
        x, dt, Bm, C = tokens(gen, heads, B)
        (y, flushed, ours), (y_ref, flushed_ref, ref) = decode_commit_both(pools, x, dt, A, Bm, C, D, 32)
        assert_close(y, y_ref, tol)
        assert flushed.tolist() == flushed_ref.tolist()
        assert_pools_match(ours, ref, tol)
    elif op in ("decode", "verify"):
        lead = (B,) if op == "decode" else (B, T)
        x, dt, Bm, C = tokens(gen, heads, *lead)
        if op == "decode":
            out = mamba2_decode(x, dt, A, Bm, C, D, *pools.args())
            ref = mamba2_decode_ref(x, dt, A, Bm, C, D, *pools.args())
        else:
            parents, num_nodes = trees(gen, B, T)
            x, dt, Bm, C = (pad_nodes(t, num_nodes) for t in (x, dt, Bm, C))
            out = mamba2_verify(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
            ref = mamba2_verify_ref(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
        for o, r in zip(out, ref, strict=True):
            assert_close(o, r, tol)
    elif op == "commit":
        paths = [list(range(n)) for n in (5, 1, 20, 24, 0, 40, 64, 1)]
        (flushed, ours), (flushed_ref, ref) = commit_after_verify(gen, heads, pools, T, paths, 48)
        assert flushed.tolist() == flushed_ref.tolist()
        assert_pools_match(ours, ref, tol)
    else:
        allocate_fold_slots(pools, torch.zeros_like(pools.state_slots), 1)
        ours, ref = clone(pools), clone(pools)
        mamba2_flush(*ours.args())
        mamba2_flush_ref(*ref.args())
        assert_pools_match(ours, ref, tol)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("registers", [None, 96], ids=["uncapped", "capped"])
def test_nemotron_nano_engine_commit(registers, monkeypatch):
    """The engine's commit at Nemotron-3-Nano's heads: a 16-entry buffer, 5-node chains, 40 rows with 0-5 accepted
    nodes, some folding; then the flush; the kernel's registers capped (commit.MAX_REGISTERS) and not."""
    monkeypatch.setattr(commit_module, "MAX_REGISTERS", registers)
    heads, T = NEMOTRON_NANO, 5
    gen = torch.Generator().manual_seed(12)
    pools = kv_pools(gen, heads, [(n % 16, n % 5 != 0) for n in range(40)], capacity=16)
    paths = [list(range(n % 6)) for n in range(40)]
    (flushed, ours), (flushed_ref, ref) = commit_after_verify(gen, heads, pools, T, paths, 16)
    assert flushed.tolist() == flushed_ref.tolist() and any(flushed.tolist())
    assert_pools_match(ours, ref, 2e-4)
    allocate_fold_slots(ours, torch.zeros_like(ours.state_slots), 1)
    ref = clone(ours)
    mamba2_flush(*ours.args())
    mamba2_flush_ref(*ref.args())
    assert_pools_match(ours, ref, 2e-4)
