"""The Mamba2 Triton kernels (verify_kernels/mamba2/decode.py, verify.py, commit.py) against their torch references
(verify_kernels/mamba2/naive.py): outputs, buffer entries, flushed flags and the pools after the in-place ops.
Without a GPU the kernels run in Triton's interpreter (tests/conftest.py) on small heads; the `gpu` cases use
Nemotron-3-Nano's sizes. Besides the launchers' own choices (which depend on the batch size and the node count),
every launch path is forced once through the *_fwd launchers' config argument: verify's scores from the products
pass or inline, its state term as tl.dots or on the FMA units, and blocks that split the heads.

Outputs are NaN-poisoned (torch.empty returns NaN here); unowned pool slots, stale buffer positions, padding nodes'
inputs and the state slot right before the pool (where a read of slot -1 would land) hold NaN."""

from typing import NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference_checks import NAN, PADDING_PARENT, Pools, TreeBatch, pad_nodes, tree_batches
from verify_kernels.mamba2 import (
    mamba2_commit,
    mamba2_commit_ref,
    mamba2_decode,
    mamba2_decode_commit,
    mamba2_decode_ref,
    mamba2_flush,
    mamba2_flush_ref,
    mamba2_verify,
    mamba2_verify_ref,
)
from verify_kernels.mamba2.decode import DecodeConfig, mamba2_decode_fwd
from verify_kernels.mamba2.verify import VerifyConfig, mamba2_verify_fwd
from verify_kernels.tree import ancestor_mask, chain_parents

# every output a kernel allocates starts as NaN: an element it forgets to write fails (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nan_empty")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(DEVICE == "cpu", reason="needs a CUDA device")
# fp32 throughout; the kernels sum in another order than the references (and take G differences from tree-local
# sums), which moves 64-node outputs by a few 1e-5
TOL = 1e-4


class Heads(NamedTuple):
    NH: int
    NG: int
    P: int
    N: int


HEADS = {
    "hpg1-P16-N32": Heads(2, 2, 16, 32),
    "hpg2-P32-N16": Heads(4, 2, 32, 16),
    "hpg2-P64-N16": Heads(2, 1, 64, 16),   # two P blocks per head
}
# the launch-parameter cases: 2 P blocks and 2 N slices with the small configs below (and 2 decode buffer steps)
SLICED = Heads(4, 2, 32, 32)
NEMOTRON_NANO = Heads(64, 8, 64, 128)
L = 20                                      # buffer capacity: L - 1 = 19 entries span two BLOCK_L steps
# (buffered entries, has a state) per row: empty and full (L - 1) buffers, with and without a state
ROWS = [(0, False), (L - 1, True), (5, True), (3, False), (0, True)]
# every path of the verify kernels: scores from the products pass or inline, the state term as tl.dots or on the FMA
# units; block sizes that split the SLICED heads (the launcher picks by batch size and node count otherwise)
VERIFY_CONFIGS = {
    f"{'inline' if inline else 'products'}-{'dots' if dots else 'fma'}": VerifyConfig(
        block_p=16, num_warps=4, state_dot=dots, inline_scores=inline, block_n=16)
    for inline in (False, True) for dots in (True, False)
}
SMALL_DECODE = DecodeConfig(block_p=16, block_l=16, num_warps=4, block_n=16)




def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float = TOL) -> None:
    """Outputs: finite, and close to the reference."""
    assert torch.isfinite(actual).all(), "non-finite values in the output"
    torch.testing.assert_close(actual, expected.to(actual.dtype), atol=tol, rtol=tol)


def assert_pools_match(actual: Pools, expected: Pools, tol: float = TOL) -> None:
    """Pools after an in-place op: NaN exactly where the reference left NaN (unowned slots and stale positions)."""
    for name, a, e in zip(("state_pool", "buf_b", "buf_xdt", "buf_gcum"), (actual.state_pool, *actual.buffers),
                          (expected.state_pool, *expected.buffers), strict=True):
        torch.testing.assert_close(a, e, atol=tol, rtol=tol, equal_nan=True, msg=lambda m, name=name: f"{name}: {m}")
    assert torch.equal(actual.buf_len, expected.buf_len)


def clone(pools: Pools) -> Pools:
    return Pools(pools.state_pool.clone(), pools.state_slots.clone(), [b.clone() for b in pools.buffers],
                 pools.buf_len.clone(), pools.req_slots.clone())


def allocate_fold_slots(pools: Pools, num_accepted: torch.Tensor, flush_length: int) -> None:
    """The caller's part before a commit: rows about to fold without a state get a zeroed slot."""
    folds = pools.buf_len[pools.req_slots] + num_accepted >= flush_length
    rows = (folds & (pools.state_slots < 0)).nonzero()[:, 0]
    S = pools.state_pool.shape[0]
    pools.state_pool = torch.cat([pools.state_pool, pools.state_pool.new_zeros(len(rows), *pools.state_pool.shape[1:])])
    pools.state_slots[rows] = S + torch.arange(len(rows), device=DEVICE)


def decode_commit_both(pools: Pools, x, dt, A, Bm, C, D, flush_length: int, config: DecodeConfig | None = None):
    """mamba2_decode_commit (with launch parameters `config` if given), and mamba2_decode_ref then mamba2_commit_ref
    of the token, on copies of the pools (zeroed slots allocated first). Returns (y, flushed, pools) of the kernel
    and of the reference."""
    one = torch.ones(x.shape[0], dtype=torch.long, device=DEVICE)
    allocate_fold_slots(pools, one, flush_length)
    ours, ref = clone(pools), clone(pools)
    if config is None:
        y, flushed = mamba2_decode_commit(x, dt, A, Bm, C, D, *ours.args(), flush_length)
    else:
        y, flushed = mamba2_decode_fwd(x, dt, A, Bm, C, D, *ours.args(), flush_length, config)
    y_ref, xdt, gcum = mamba2_decode_ref(x, dt, A, Bm, C, D, *ref.args())
    flushed_ref = mamba2_commit_ref(Bm[:, None], xdt[:, None], gcum[:, None], torch.zeros_like(one[:, None]), one,
                                    *ref.args(), flush_length)
    return (y, flushed, ours), (y_ref, flushed_ref, ref)


def layer(gen: torch.Generator, heads: Heads, max_decay: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A [NH] with dt A >= -max_decay for dt <= 1, and D [NH]."""
    A = -max_decay * (0.1 + 0.9 * torch.rand(heads.NH, generator=gen))
    return A.to(DEVICE), torch.randn(heads.NH, generator=gen).to(DEVICE)


def tokens(gen: torch.Generator, heads: Heads, *lead: int) -> list[torch.Tensor]:
    """x [*lead, NH, P], dt [*lead, NH] in (0, 1] (softplus'ed), Bm and C [*lead, NG, N]."""
    NH, NG, P, N = heads
    x = torch.randn(*lead, NH, P, generator=gen)
    dt = 1.0 - torch.rand(*lead, NH, generator=gen)
    Bm, C = (torch.randn(*lead, NG, N, generator=gen) for _ in range(2))
    return [t.to(DEVICE) for t in (x, dt, Bm, C)]


def kv_pools(gen: torch.Generator, heads: Heads, rows: list[tuple[int, bool]], capacity: int = L,
             max_decay: float = 2.0) -> Pools:
    """Pools for rows of (buffered entries, has a state) at shuffled slots, NaN wherever no row owns the memory.

    state_pool is a view that starts one slot into its storage: that slot, where slot -1 would land, is NaN too.
    Buffered G are cumulative sums of per-token log decays in [-max_decay, 0)."""
    NH, NG, P, N = heads
    B = len(rows)
    R = S = B + 2
    req_slots = torch.randperm(R, generator=gen)[:B]
    state_slots = torch.randperm(S, generator=gen)[:B]
    storage = torch.full((S + 1, NH, P, N), NAN)
    buf_b, buf_xdt, buf_gcum = (torch.full((R, capacity, *shape), NAN) for shape in ((NG, N), (NH, P), (NH,)))
    buf_len = torch.randint(0, capacity, (R,), generator=gen)              # other requests' lengths
    for b, (n, has_state) in enumerate(rows):
        r = req_slots[b]
        if has_state:
            storage[1 + state_slots[b]] = torch.randn(NH, P, N, generator=gen)
        else:
            state_slots[b] = -1
        buf_len[r] = n
        buf_b[r, :n] = torch.randn(n, NG, N, generator=gen)
        buf_xdt[r, :n] = torch.randn(n, NH, P, generator=gen)
        buf_gcum[r, :n] = (-max_decay * torch.rand(n, NH, generator=gen)).cumsum(0)
    to = lambda t: t.to(DEVICE)  # noqa: E731
    return Pools(to(storage)[1:], to(state_slots), [to(buf_b), to(buf_xdt), to(buf_gcum)], to(buf_len),
                 to(req_slots))


def first_node(*xs: torch.Tensor) -> list[torch.Tensor]:
    """[B, T, ...] -> the decode inputs [B, ...] of node 0 (contiguous, as the kernels require)."""
    return [x[:, 0].contiguous() for x in xs]


def random_parents(gen: torch.Generator, n: int, T: int) -> list[int]:
    """A random topologically ordered tree of n nodes (several roots allowed), padded to T."""
    return [int(torch.randint(-1, j, (1,), generator=gen)) for j in range(n)] + [PADDING_PARENT] * (T - n)


def trees(gen: torch.Generator, B: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """parents [B, T], num_nodes [B] (B <= 8): a full chain, a full random tree, then ragged random trees (down to
    0 nodes)."""
    num_nodes = [T, T, T // 2, max(T - 3, 0), 0, 1, T // 3, T][:B]
    parents = [list(range(-1, T - 1))] + [random_parents(gen, n, T) for n in num_nodes[1:]]
    return torch.tensor(parents, device=DEVICE), torch.tensor(num_nodes, device=DEVICE)


def commit_after_verify(gen, heads, pools, T, paths, flush_length):
    """Verify a random tree per row (through the reference) and commit the given root paths with both the kernel
    and the reference on copies of the pools (zeroed slots allocated first for rows that fold without a state).
    Returns (flushed, pools) of the kernel and of the reference."""
    A, D = layer(gen, heads)
    B = len(paths)
    parents = torch.tensor([_tree_with_paths(gen, T, path) for path in paths], device=DEVICE)
    num_nodes = torch.full((B,), T, device=DEVICE)
    x, dt, Bm, C = tokens(gen, heads, B, T)
    _, xdt, gcum = mamba2_verify_ref(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    accepted = torch.full((B, T), -1, device=DEVICE)
    for b, path in enumerate(paths):
        accepted[b, : len(path)] = torch.tensor(path, dtype=torch.long)
    num_accepted = torch.tensor([len(p) for p in paths], device=DEVICE)
    allocate_fold_slots(pools, num_accepted, flush_length)
    ours, ref = clone(pools), clone(pools)
    flushed = mamba2_commit(Bm, xdt, gcum, accepted, num_accepted, *ours.args(), flush_length)
    flushed_ref = mamba2_commit_ref(Bm, xdt, gcum, accepted, num_accepted, *ref.args(), flush_length)
    return (flushed, ours), (flushed_ref, ref)


def _tree_with_paths(gen, T, path):
    """Random parents [T] in which `path` (increasing node indices) is a root path."""
    parents = random_parents(gen, T, T)
    for i, j in enumerate(path):
        parents[j] = path[i - 1] if i else -1
    return parents


# ---------------------------------------------------------------------------------------------------- decode


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


def test_decode_blocks_that_split_the_heads_match_reference():
    """Decode and decode-commit with 2 P blocks per head, buffers of 2 steps (19 entries) and folds of 2 N slices."""
    gen = torch.Generator().manual_seed(11)
    A, D = layer(gen, SLICED)
    pools = kv_pools(gen, SLICED, ROWS)
    x, dt, Bm, C = tokens(gen, SLICED, len(ROWS))
    out = mamba2_decode_fwd(x, dt, A, Bm, C, D, *pools.args(), None, SMALL_DECODE)
    ref = mamba2_decode_ref(x, dt, A, Bm, C, D, *pools.args())
    for o, r in zip(out, ref, strict=True):
        assert_close(o, r)
    (y, flushed, ours), (y_ref, flushed_ref, ref) = decode_commit_both(pools, x, dt, A, Bm, C, D, 6, SMALL_DECODE)
    assert_close(y, y_ref)
    assert flushed.tolist() == flushed_ref.tolist() == [False, True, True, False, False]
    assert_pools_match(ours, ref)


# ---------------------------------------------------------------------------------------------------- verify

NODES = [1, 3, 17, 33, 64]


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
    out = mamba2_verify(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    ref = mamba2_verify_ref(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    out += mamba2_decode(*first_node(x, dt), A, *first_node(Bm, C), D, *pools.args())
    ref += mamba2_decode_ref(*first_node(x, dt), A, *first_node(Bm, C), D, *pools.args())
    for o, r in zip(out, ref, strict=True):
        assert_close(o, r)
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
    out = mamba2_verify(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    ref = mamba2_verify_ref(x, dt, A, Bm, C, D, parents, num_nodes, *pools.args())
    out += mamba2_decode(*first_node(x, dt), A, *first_node(Bm, C), D, *pools.args())
    ref += mamba2_decode_ref(*first_node(x, dt), A, *first_node(Bm, C), D, *pools.args())
    for o, r in zip(out, ref, strict=True):
        assert_close(o, r)


# ---------------------------------------------------------------------------------------------------- commit

# per row: buffered entries, has a state, accepted root path; T = 8 nodes
COMMITS = {
    "fold-and-append": (6, [(3, True, [0, 1, 3]), (0, False, [6]), (2, True, [0, 1, 3, 4, 7]), (5, True, []),
                            (L - 1, False, [0, 2])]),
    "nothing-accepted": (4, [(4, True, []), (3, True, []), (0, False, [])]),
    "append-only": (L, [(0, False, [0, 1, 3, 4, 7]), (L - 6, True, [6, 7]), (7, True, [0])]),
}


@pytest.mark.parametrize("case", COMMITS.values(), ids=COMMITS.keys())
@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
def test_commit_matches_reference(heads, case):
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


# ---------------------------------------------------------------------------------------------------- numerics


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


# ---------------------------------------------------------------------------------------------------- arguments


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


# ---------------------------------------------------------------------------------------------------- GPU sizes


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
