"""The Mamba2 verify (verify_kernels/mamba2/verify.py): chains, random and ragged trees, every launch path (scores from
the products pass or inline, the state term as tl.dots or on the FMA units), batch one, against the torch references
(verify_kernels/mamba2/naive.py) through tests/mamba2_checks.py. Without a GPU the kernels run in Triton's
interpreter (tests/conftest.py) on small heads; the `gpu` cases use Nemotron-3-Nano's sizes. Outputs are NaN-poisoned
(torch.empty returns NaN here)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.mamba2_checks import (
    DEVICE,
    HEADS,
    NEMOTRON_NANO,
    ROWS,
    SLICED,
    VERIFY_CONFIGS,
    L,
    assert_close,
    assert_pools_match,
    decode_commit_both,
    first_node,
    kv_pools,
    layer,
    needs_cuda,
    tokens,
    trees,
)
from tests.reference_checks import TreeBatch, pad_nodes, tree_batches
from verify_kernels.mamba2 import mamba2_decode, mamba2_decode_ref, mamba2_verify, mamba2_verify_ref
from verify_kernels.mamba2 import verify as mamba2_verify_module
from verify_kernels.mamba2.verify import mamba2_verify_fwd
from verify_kernels.tree import ancestor_mask, chain_parents

# every output a kernel allocates starts as NaN: an element it forgets to write fails (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nan_empty")


NODES = [1, 3, 17, 33, 64]


def assert_verify_and_decode_match(pools, x, dt, A, Bm, C, D, parents, num_nodes):
    """The verify of the trees and the decode of their first nodes against the references, on the same pools."""
    out = mamba2_verify(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    ref = mamba2_verify_ref(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    out += mamba2_decode(*first_node(x, dt), A, *first_node(Bm, C), D, *pools.args())
    ref += mamba2_decode_ref(*first_node(x, dt), A, *first_node(Bm, C), D, *pools.args())
    for o, r in zip(out, ref, strict=True):
        assert_close(o, r)


@pytest.mark.parametrize("T", NODES, ids=lambda t: f"T{t}")
@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
def test_verify_matches_reference(heads, T):
    """A chain, full random trees and ragged ones (NaN inputs and out-of-range parents at padding nodes) on mixed
    buffer fills and states; the ancestor mask passed in or computed by the launcher. Five rows: the products pass
    (the small batches of the other tests take the one-launch path)."""
    gen = torch.Generator().manual_seed(T)
    A, D = layer(gen, heads)
    rows = ROWS
    pools = kv_pools(gen, heads, rows)
    parents, num_nodes = trees(gen, len(rows), T)
    x, dt, Bm, C = (pad_nodes(t, num_nodes) for t in tokens(gen, heads, len(rows), T))
    ref = mamba2_verify_ref(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    for ancestors in (ancestor_mask(parents, num_nodes), None):
        out = mamba2_verify(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args(), ancestors=ancestors)
        for o, r in zip(out, ref, strict=True):
            assert_close(o, r)


@pytest.mark.parametrize(("config", "T"), [(c, T) for c in VERIFY_CONFIGS.values() for T in (5, 17)
                                           if c.state_dot or T <= 8],   # the FMA path is for few nodes
                         ids=[f"{k}-T{T}" for k, c in VERIFY_CONFIGS.items() for T in (5, 17) if c.state_dot or T <= 8])
def test_verify_launch_configs_match_reference(config, T):
    """Every path of the verify kernels, on heads their blocks split into 2 P blocks and 2 N slices: a chain, full
    and ragged random trees (one empty) on empty and full buffers (19 entries), with and without a state."""
    gen = torch.Generator().manual_seed(20 + T)
    A, D = layer(gen, SLICED)
    pools = kv_pools(gen, SLICED, ROWS)
    parents, num_nodes = trees(gen, len(ROWS), T)
    x, dt, Bm, C = (pad_nodes(t, num_nodes) for t in tokens(gen, SLICED, len(ROWS), T))
    out = mamba2_verify_fwd(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args(), ancestor_mask(parents, num_nodes),
                            config)
    ref = mamba2_verify_ref(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    for o, r in zip(out, ref, strict=True):
        assert_close(o, r)


def test_batch_of_one_matches_reference():
    """Batch 1, one launch per op: a 5-chain verify and a decode on a buffer of 19 entries, then a decode-commit that
    folds it."""
    gen = torch.Generator().manual_seed(12)
    A, D = layer(gen, SLICED)
    pools = kv_pools(gen, SLICED, [(L - 1, True)])
    T = 5
    parents, num_nodes = chain_parents(1, T, DEVICE), torch.full((1,), T, device=DEVICE)
    x, dt, Bm, C = tokens(gen, SLICED, 1, T)
    assert_verify_and_decode_match(pools, x, dt, A, Bm, C, D, parents, num_nodes)
    (y, flushed, ours), (y_ref, _, ref) = decode_commit_both(pools, *first_node(x, dt), A, *first_node(Bm, C), D, L)
    assert_close(y, y_ref)
    assert flushed.tolist() == [True]
    assert_pools_match(ours, ref)


@settings(max_examples=10, deadline=None)
@given(batch=tree_batches(max_rows=3, max_nodes=12, max_capacity=8), heads=st.sampled_from(list(HEADS.values())))
def test_verify_random_trees_match_reference(batch: TreeBatch, heads):
    gen = torch.Generator().manual_seed(batch.seed)
    A, D = layer(gen, heads)
    pools = kv_pools(gen, heads, [(r.buffered, r.has_state) for r in batch.rows], capacity=batch.capacity)
    parents, num_nodes = (t.to(DEVICE) for t in batch.tensors())
    inputs = [pad_nodes(t, num_nodes) for t in tokens(gen, heads, len(batch.rows), batch.num_tokens)]
    out = mamba2_verify(*inputs[:2], A, *inputs[2:], D, parents, num_nodes, *pools.args())
    ref = mamba2_verify_ref(*inputs[:2], A, *inputs[2:], D, parents, num_nodes, *pools.args())
    for o, r in zip(out, ref, strict=True):
        assert_close(o, r)


def test_bf16_inputs_match_reference():
    """bf16 token inputs and layer weights, cast in the kernels; the references see the same bf16 values."""
    heads = HEADS["hpg2-P32-N16"]
    gen = torch.Generator().manual_seed(3)
    A, D = (t.bfloat16() for t in layer(gen, heads))
    pools = kv_pools(gen, heads, ROWS[:3])
    parents, num_nodes = trees(gen, 3, 9)
    x, dt, Bm, C = (t.bfloat16() for t in tokens(gen, heads, 3, 9))
    assert_verify_and_decode_match(pools, x, dt, A, Bm, C, D, parents, num_nodes)




@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("B", [1, 8], ids=lambda b: f"B{b}")
@pytest.mark.parametrize("T", [5, 16], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("config", [None, *VERIFY_CONFIGS.values()], ids=["launcher", *VERIFY_CONFIGS.keys()])
def test_nemotron_nano_verify_paths_match_reference(config, T, B):
    """Every path of the verify kernels at full size (the launcher's choice and the small blocks): 5-node and
    16-node trees (a chain, random and ragged ones) on buffers up to 63 entries, with and without a state."""
    heads = NEMOTRON_NANO
    gen = torch.Generator().manual_seed(13)
    A, D = layer(gen, heads)
    rows = [(63, True), (0, False), (17, True), (40, False), (0, True), (31, True), (5, False), (62, True)][:B]
    pools = kv_pools(gen, heads, rows, capacity=64)
    parents, num_nodes = trees(gen, B, T)
    x, dt, Bm, C = (pad_nodes(t, num_nodes) for t in tokens(gen, heads, B, T))
    out = mamba2_verify_fwd(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args(), ancestor_mask(parents, num_nodes),
                            config)
    ref = mamba2_verify_ref(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    for o, r in zip(out, ref, strict=True):
        assert_close(o, r, 2e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("config", VERIFY_CONFIGS.values(), ids=VERIFY_CONFIGS.keys())
def test_verify_products_with_exact_b_and_c(tf32_products, config, dtype):
    """B and C in a bf16 / fp16 model's dtype (the glue keeps them so): every path's products with them skip their
    remainders (add_product_exact), h0's and the buffer's split as before, x in fp32. TF32 products truncate their
    operands here as on the GPU (tf32_products): an fp32 operand taken for exact would lose its remainder (~2^-11
    relative) and fail."""
    gen = torch.Generator().manual_seed(37)
    A, D = layer(gen, SLICED)
    pools = kv_pools(gen, SLICED, ROWS)
    parents, num_nodes = trees(gen, len(ROWS), 17)
    x, dt, Bm, C = (pad_nodes(t, num_nodes) for t in tokens(gen, SLICED, len(ROWS), 17))
    Bm, C = Bm.to(dtype), C.to(dtype)
    out = mamba2_verify_fwd(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args(), ancestor_mask(parents, num_nodes),
                            config)
    ref = mamba2_verify_ref(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    for o, r in zip(out, ref, strict=True):
        assert_close(o, r)


@pytest.mark.parametrize("precision", ["tf32x3-split", "tf32x3"])
@pytest.mark.parametrize("inline", [False, True], ids=["products", "inline"])
def test_verify_products_precision(tf32_products, monkeypatch, inline, precision):
    """DOT_PRECISION "tf32x3-split" (the default): every product of the verify's kernels from operands split by a mask
    (verify_kernels/precision.py), and Triton's "tf32x3", on the sliced heads of the launch-config test (TF32 products
    truncating their operands as on the GPU: tests/conftest.py's tf32_products)."""
    monkeypatch.setattr(mamba2_verify_module, "DOT_PRECISION", precision)
    config = VERIFY_CONFIGS[f"{'inline' if inline else 'products'}-dots"]
    gen = torch.Generator().manual_seed(31)
    A, D = layer(gen, SLICED)
    pools = kv_pools(gen, SLICED, ROWS)
    parents, num_nodes = trees(gen, len(ROWS), 17)
    x, dt, Bm, C = (pad_nodes(t, num_nodes) for t in tokens(gen, SLICED, len(ROWS), 17))
    out = mamba2_verify_fwd(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args(), ancestor_mask(parents, num_nodes),
                            config)
    ref = mamba2_verify_ref(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    for o, r in zip(out, ref, strict=True):
        assert_close(o, r)
