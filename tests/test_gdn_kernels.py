"""The Gated DeltaNet Triton kernels (verify_kernels/gdn/decode.py, verify.py, commit.py) against their torch
references (verify_kernels/gdn/naive.py): outputs, buffer entries, flushed flags and the pools after the in-place
ops. Without a GPU the kernels run in Triton's interpreter (tests/conftest.py), so the CPU cases are small; the
`gpu` cases run Qwen3.5's head sizes.

Every output is NaN-poisoned (torch.empty returns NaN here), unowned pool slots and stale buffer positions hold
NaN, and a NaN state slot sits right before the state pool, where a kernel that read slot -1 would land."""

from dataclasses import dataclass, replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference_checks import (
    NAN,
    PADDING_PARENT,
    TREE,
    Pools,
    TreeBatch,
    make_pools,
    pad_nodes,
    root_path,
    tree_batches,
)
from verify_kernels.gdn import commit as commit_module
from verify_kernels.gdn import decode as decode_module
from verify_kernels.gdn import fold as fold_module
from verify_kernels.gdn import (
    gdn_commit,
    gdn_commit_ref,
    gdn_decode,
    gdn_decode_commit,
    gdn_decode_ref,
    gdn_flush,
    gdn_flush_ref,
    gdn_verify,
    gdn_verify_ref,
)
from verify_kernels.gdn import verify as verify_module
from verify_kernels.tree import ancestor_mask, chain_parents

# every output a kernel allocates starts as NaN: an element it forgets to write fails (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nan_empty")

# fp32 throughout; the kernels sum in another order than the references
TOL = 2e-5
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"  # small cases run on the GPU when there is one, else in the interpreter





@dataclass(frozen=True)
class Dims:
    H: int
    HV: int
    K: int
    V: int
    dtype: torch.dtype = torch.float32   # of q, k, v, g, beta; the pools are fp32


DIMS = {
    "k16-hv1": Dims(2, 2, 16, 16),
    "k32-hv2": Dims(1, 2, 32, 32),
    "k16-hv2-bf16": Dims(2, 4, 16, 16, torch.bfloat16),
    "k16-hv3": Dims(1, 3, 16, 16),   # a key head's value heads not a power of two
}
# (buffered entries, has a state) per row: empty and full (L - 1) buffers, with and without a state
L = 8
ROWS = [(0, True), (7, True), (3, False), (0, False), (5, True)]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float = TOL) -> None:
    """Finite and close, in fp32 on the CPU."""
    actual = actual.cpu()
    assert torch.isfinite(actual).all(), "non-finite values"
    torch.testing.assert_close(actual, expected.cpu().to(actual.dtype), atol=tol, rtol=tol)


def assert_pools_close(actual: Pools, expected: Pools, tol: float = TOL) -> None:
    """Every pool close to the reference's, NaN (slots and positions nobody wrote) where the reference has NaN."""
    names = ("state_pool", "buf_k", "buf_u", "buf_gcum")
    for name, x, y in zip(names, (actual.state_pool, *actual.buffers), (expected.state_pool, *expected.buffers),
                          strict=True):
        torch.testing.assert_close(x.cpu(), y.cpu(), atol=tol, rtol=tol, equal_nan=True,
                                   msg=lambda m, name=name: f"{name}: {m}")


def clone(pools: Pools, device: str = "cpu") -> Pools:
    """A copy of the pools on device."""
    return replace(pools, state_pool=pools.state_pool.to(device, copy=True),
                   state_slots=pools.state_slots.to(device, copy=True),
                   buffers=[x.to(device, copy=True) for x in pools.buffers],
                   buf_len=pools.buf_len.to(device, copy=True), req_slots=pools.req_slots.to(device, copy=True))


def for_kernel(pools: Pools, device: str) -> Pools:
    """A copy of the pools on device for a kernel, with a NaN state slot right before the state pool: where a
    kernel that read the slot -1 of a row without a state would land."""
    guarded = torch.full((pools.state_pool.shape[0] + 1, *pools.state_pool.shape[1:]), NAN, device=device)
    guarded[1:] = pools.state_pool
    return replace(clone(pools, device), state_pool=guarded[1:])


def to(xs: list[torch.Tensor], device: str) -> list[torch.Tensor]:
    return [x.to(device) for x in xs]


def unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x, dim=-1)


@dataclass
class Batch:
    """Tokens (q, k, v, g, beta [B, T, ...] in d.dtype, NaN at padding nodes), their trees and the committed
    start of every row (pools on the CPU)."""

    d: Dims
    x: list[torch.Tensor]
    parents: torch.Tensor    # [B, T], PADDING_PARENT past num_nodes
    num_nodes: torch.Tensor  # [B]
    pools: Pools

    @property
    def token(self) -> list[torch.Tensor]:
        """The first node of every row as one decode token: [B, ...]."""
        return [x[:, 0].contiguous() for x in self.x]


def tree_parents(gen: torch.Generator, shape: str, n: int) -> list[int]:
    if shape == "chain":
        return list(range(-1, n - 1))
    if shape == "flat":                                            # every node a child of the committed end
        return [-1] * n
    if shape == "tree":
        return TREE[:n]
    return [int(torch.randint(-1, j, (), generator=gen)) if j else -1 for j in range(n)]


def make_batch(d: Dims, rows: list[tuple[int, bool]], seed: int, T: int = 1, num_nodes: list[int] | None = None,
               shape: str | list[list[int]] = "chain", capacity: int = L, max_decay: float = 1.0) -> Batch:
    """rows[b] = (buffered entries, has a state) at shuffled slots, NaN in every slot or position no row owns
    (reference_checks.make_pools); trees of num_nodes[b] nodes (default T): a chain, a flat tree (all children
    of the committed end), reference_checks.TREE, a random tree, or given parents [B, T]. Log decays in
    [-max_decay, 0], value head 0 exactly -max_decay."""
    gen = torch.Generator().manual_seed(seed)
    B = len(rows)
    num_nodes = [T] * B if num_nodes is None else num_nodes
    states, entries = [], []
    for n, has_state in rows:
        states.append(torch.randn(d.HV, d.K, d.V, generator=gen) if has_state else None)
        g = -max_decay * torch.rand(n, d.HV, generator=gen)
        entries.append((unit(torch.randn(n, d.H, d.K, generator=gen)), torch.randn(n, d.HV, d.V, generator=gen),
                        g.cumsum(0)))
    pools = make_pools(gen, states, entries, capacity, (d.HV, d.K, d.V), ((d.H, d.K), (d.HV, d.V), (d.HV,)))

    if not isinstance(shape, list):
        shape = [tree_parents(gen, shape, n) + [PADDING_PARENT] * (T - n) for n in num_nodes]
    parents, num_nodes = torch.tensor(shape), torch.tensor(num_nodes)

    q = unit(torch.randn(B, T, d.H, d.K, generator=gen)) * d.K**-0.5
    k = unit(torch.randn(B, T, d.H, d.K, generator=gen))
    v = torch.randn(B, T, d.HV, d.V, generator=gen)
    g = -max_decay * torch.rand(B, T, d.HV, generator=gen)
    g[..., 0] = -max_decay
    beta = torch.rand(B, T, d.HV, generator=gen)
    x = [pad_nodes(t, num_nodes).to(d.dtype) for t in (q, k, v, g, beta)]
    return Batch(d, x, parents, num_nodes, pools)


def accept(b: Batch, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """accepted [B, T] (-1 padded) and num_accepted [B]: the first lengths[b] nodes of the root path of row b's
    last node."""
    B, T = b.parents.shape
    accepted = torch.full((B, T), -1)
    for row, (parents, n, a) in enumerate(zip(b.parents.tolist(), b.num_nodes.tolist(), lengths, strict=True)):
        path = root_path(parents, n - 1)[:a] if n else []
        accepted[row, : len(path)] = torch.tensor(path, dtype=torch.long)
    return accepted, (accepted >= 0).sum(1)


def check_decode(b: Batch, device: str = DEVICE, tol: float = TOL) -> None:
    pools = for_kernel(b.pools, device)
    out = gdn_decode(*to(b.token, device), *pools.args())
    ref = gdn_decode_ref(*b.token, *b.pools.args())
    for x, y in zip(out, ref, strict=True):
        assert_close(x, y, tol)
    assert_pools_close(pools, b.pools, tol=0)                      # decode writes nothing


def check_decode_commit(b: Batch, flush_length: int, device: str = DEVICE, tol: float = TOL) -> torch.Tensor:
    """gdn_decode_commit against gdn_decode_ref then gdn_commit_ref of the token; returns flushed."""
    B = len(b.num_nodes)
    one, node0 = torch.ones(B, dtype=torch.long), torch.zeros(B, 1, dtype=torch.long)
    ref_pools = clone(b.pools)
    ref_pools.before_commit(one, flush_length)                     # rows about to fold get a zeroed state slot
    pools = for_kernel(ref_pools, device)
    o, flushed = gdn_decode_commit(*to(b.token, device), *pools.args(), flush_length)
    o_ref, u_ref, gcum_ref = gdn_decode_ref(*b.token, *ref_pools.args())
    k = b.token[1][:, None]
    flushed_ref = gdn_commit_ref(k, u_ref[:, None], gcum_ref[:, None], node0, one, *ref_pools.args(), flush_length)
    assert_close(o, o_ref, tol)
    assert flushed.tolist() == flushed_ref.tolist()
    assert_pools_close(pools, ref_pools, tol)
    return flushed


def check_verify(b: Batch, device: str = DEVICE, tol: float = TOL, pass_ancestors: bool = True):
    """gdn_verify against gdn_verify_ref; returns the reference's entries u, gcum."""
    pools = for_kernel(b.pools, device)
    parents, num_nodes = b.parents.to(device), b.num_nodes.to(device)
    ancestors = ancestor_mask(parents, num_nodes) if pass_ancestors else None
    out = gdn_verify(*to(b.x, device), parents, num_nodes, *pools.args(), ancestors=ancestors)
    ref = gdn_verify_ref(*b.x, b.parents, b.num_nodes, *b.pools.args())
    for x, y in zip(out, ref, strict=True):
        assert_close(x, y, tol)
    padding = torch.arange(b.parents.shape[1]) >= b.num_nodes[:, None]
    assert all(not x.cpu()[padding].any() for x in out), "padding nodes must come out as zeros"
    assert_pools_close(pools, b.pools, tol=0)                      # verify writes nothing
    return ref[1], ref[2]


def check_commit(b: Batch, lengths: list[int], flush_length: int, device: str = DEVICE, tol: float = TOL):
    """Commit the first lengths[b] nodes of a root path per row, with the reference verify's entries; returns
    flushed."""
    _, u, gcum = gdn_verify_ref(*b.x, b.parents, b.num_nodes, *b.pools.args())
    accepted, num_accepted = accept(b, lengths)
    ref_pools = clone(b.pools)
    ref_pools.before_commit(num_accepted, flush_length)
    pools = for_kernel(ref_pools, device)
    flushed = gdn_commit(*to([b.x[1], u, gcum, accepted, num_accepted], device), *pools.args(), flush_length)
    flushed_ref = gdn_commit_ref(b.x[1], u, gcum, accepted, num_accepted, *ref_pools.args(), flush_length)
    assert flushed.tolist() == flushed_ref.tolist()
    assert_pools_close(pools, ref_pools, tol)
    return flushed


def check_flush(b: Batch, device: str = DEVICE, tol: float = TOL) -> None:
    ref_pools = clone(b.pools)
    ref_pools.before_flush()                   # rows with entries get a state slot; empty rows may have none
    pools = for_kernel(ref_pools, device)
    gdn_flush(*pools.args())
    gdn_flush_ref(*ref_pools.args())
    assert_pools_close(pools, ref_pools, tol)


def test_outputs_are_nan_poisoned():
    assert torch.empty(3).isnan().all() and torch.empty_like(torch.zeros(2, 2)).isnan().all()


@pytest.fixture(params=["fold-kernel", "fold-in-place"])
def decode_path(request, monkeypatch):
    """Decode + commit folds in the fold kernel, or for batches up to SMALL_BATCH in the decode kernel's own programs:
    test both on the same rows."""
    monkeypatch.setattr(decode_module, "SMALL_BATCH", 0 if request.param == "fold-kernel" else len(ROWS))
    return request.param


@pytest.fixture(params=["two-passes", "fused"])
def verify_path(request, monkeypatch):
    """Verify runs as the state pass then the tree pass, or for batches up to FUSED_MAX_BATCH as one kernel."""
    monkeypatch.setattr(verify_module, "FUSED_MAX_BATCH", 0 if request.param == "two-passes" else len(ROWS))
    return request.param


@pytest.fixture(params=["two-kernels", "one-launch"])
def commit_path(request, monkeypatch):
    """The commit appends in its own kernel, or for batches up to ONE_LAUNCH_MAX_BATCH in the fold kernel."""
    monkeypatch.setattr(commit_module, "ONE_LAUNCH_MAX_BATCH", 0 if request.param == "two-kernels" else len(ROWS))
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


VERIFIES = {
    # dims, T, tree shape, nodes per row of ROWS (ragged, 0 included)
    "T1-chain": ("k16-hv1", 1, "chain", [1, 1, 0, 1, 1]),
    "T3-flat": ("k16-hv1", 3, "flat", [3, 2, 3, 0, 1]),
    "T17-random": ("k16-hv1", 17, "random", [17, 9, 16, 1, 0]),
    "T33-chain": ("k16-hv1", 33, "chain", [33, 32, 5, 0, 17]),
    "T64-random": ("k16-hv1", 64, "random", [64, 63, 0, 40, 1]),
    "T64-chain-k32-hv2": ("k32-hv2", 64, "chain", [64, 64, 64, 64, 64]),
}


@pytest.mark.parametrize("case", VERIFIES.values(), ids=VERIFIES.keys())
def test_verify_trees(case, verify_path):
    dims, T, shape, num_nodes = case
    check_verify(make_batch(DIMS[dims], ROWS, seed=T, T=T, num_nodes=num_nodes, shape=shape))


@pytest.mark.parametrize(("T", "pass_ancestors"), [(12, True), (6, False)],
                         ids=["T12-S0-dots-ancestors-given", "T6-S0-node-at-a-time-ancestors-computed"])
@pytest.mark.parametrize("d", DIMS.values(), ids=DIMS.keys())
def test_verify_dims(d, T, pass_ancestors):
    """Both ways of the state pass (a key head's value heads in one program when one node at a time) on every
    head layout."""
    b = make_batch(d, ROWS, seed=3, T=T, num_nodes=[T, 5, T - 3, 0, T], shape="random")
    check_verify(b, pass_ancestors=pass_ancestors)


@settings(max_examples=12, deadline=None)
@given(batch=tree_batches(max_rows=3, max_nodes=24, max_capacity=8), ratio=st.sampled_from([1, 2]))
def test_verify_random_trees(batch: TreeBatch, ratio: int):
    rows = [(r.buffered, r.has_state) for r in batch.rows]
    b = make_batch(Dims(1, ratio, 16, 16), rows, batch.seed, T=batch.num_tokens,
                   num_nodes=[r.num_nodes for r in batch.rows], shape=[r.parents for r in batch.rows],
                   capacity=batch.capacity)
    check_verify(b)


COMMITS = {
    # flush_length, accepted nodes per row of ROWS (buffered 0, 7, 3, 0, 5) on TREE (root paths up to 5 nodes)
    "fold-and-append": (6, [2, 0, 1, 0, 3]),         # rows 1 (7 + 0) and 4 (5 + 3) fold
    "append-only": (L, [3, 0, 4, 5, 2]),
    "fold-all": (1, [1, 1, 1, 1, 1]),
    "fold-buffers-only": (1, [0, 0, 0, 0, 0]),       # rows with entries fold them, empty rows do nothing
}


@pytest.mark.parametrize("case", COMMITS.values(), ids=COMMITS.keys())
@pytest.mark.parametrize("d", DIMS.values(), ids=DIMS.keys())
def test_commit(d, case, commit_path):
    flush_length, lengths = case
    check_commit(make_batch(d, ROWS, seed=4, T=len(TREE), shape="tree"), lengths, flush_length)


@pytest.mark.parametrize("d", DIMS.values(), ids=DIMS.keys())
def test_flush(d):
    check_flush(make_batch(d, ROWS, seed=5))


def test_small_blocks(monkeypatch):
    """V = K = 32 in blocks of 16: two V blocks per head (a key head's entries written once, gcum by one block; the
    decode's buffer loaded before and after buf_len), two K blocks in verify's products and S0 reads, verify's S0
    reads as dots and one node at a time (per value head), fused and in two passes."""
    monkeypatch.setattr(fold_module, "FOLD_BLOCK_V", 16)
    monkeypatch.setattr(decode_module, "BLOCK_V", 16)
    monkeypatch.setattr(decode_module, "SMALL_BLOCK_V", 16)
    for configs in ("STATE_DOT_CONFIGS", "FUSED_CONFIGS"):
        monkeypatch.setattr(verify_module, configs, {bt: (16, 4) for bt in getattr(verify_module, configs)})
    monkeypatch.setattr(verify_module, "STATE_FMA_CONFIG", (16, 4))
    monkeypatch.setattr(verify_module, "TREE_BLOCK_V", 16)
    monkeypatch.setattr(verify_module, "STATE_BLOCK_K", 16)
    d = DIMS["k32-hv2"]
    # decode + commit with the fold kernel, then folding in place with the buffer loaded only up to buf_len
    for small_batch, before_len in ((0, True), (len(ROWS), False)):
        monkeypatch.setattr(decode_module, "SMALL_BATCH", small_batch)
        monkeypatch.setattr(decode_module, "BUFFER_BEFORE_LEN", before_len)
        check_decode(make_batch(d, ROWS, seed=6))
        check_decode_commit(make_batch(d, ROWS, seed=6), 6)
    # verify's S0 reads as dots over two K blocks in two passes, one node at a time in the fused kernel, then one
    # node at a time in the state pass, per value head
    monkeypatch.setattr(verify_module, "STATE_SHARE_KEY_HEAD", False)
    for fma_max_nodes, fused_max_batch in ((0, 0), (64, len(ROWS)), (64, 0)):
        monkeypatch.setattr(verify_module, "FMA_MAX_NODES", fma_max_nodes)
        monkeypatch.setattr(verify_module, "FUSED_MAX_BATCH", fused_max_batch)
        check_verify(make_batch(d, ROWS, seed=6, T=12, num_nodes=[12, 5, 9, 0, 12], shape="random"))
    check_commit(make_batch(d, ROWS, seed=6, T=len(TREE), shape="tree"), *COMMITS["fold-and-append"][::-1])
    check_flush(make_batch(d, ROWS, seed=6))


@pytest.mark.parametrize(("lanes", "scan_block", "prefetch"), [(2, 2, False), (1, 4, True)],
                         ids=["2-lanes", "1-lane-prefetching"])
def test_fold_lanes_and_scan_blocks(monkeypatch, lanes, scan_block, prefetch):
    """Fewer fold lanes than folding rows (each lane folds several, in rank order, loading the next row's tile
    before folding the current one or not) and the rows' flags scanned a few at a time: the fold of the commit, the
    flush and the decode + commit."""
    monkeypatch.setattr(fold_module, "FOLD_LANES", lanes)
    monkeypatch.setattr(fold_module, "SCAN_BLOCK", scan_block)
    monkeypatch.setattr(fold_module, "FOLD_PREFETCH", prefetch)
    monkeypatch.setattr(commit_module, "ONE_LAUNCH_MAX_BATCH", 0)
    monkeypatch.setattr(decode_module, "SMALL_BATCH", 0)
    d = DIMS["k16-hv2-bf16"]
    for flush_length, lengths in (COMMITS["fold-all"], COMMITS["fold-and-append"]):
        check_commit(make_batch(d, ROWS, seed=11, T=len(TREE), shape="tree"), lengths, flush_length)
    check_flush(make_batch(d, ROWS, seed=11))
    assert check_decode_commit(make_batch(d, ROWS, seed=11), 1).all()


@pytest.mark.parametrize("commit_batch", [0, 1], ids=["two-kernels", "one-launch"])
def test_batch_one(monkeypatch, commit_batch):
    """A single row: a 4-chain verify, a decode, a decode + commit that folds and commits that append and fold."""
    monkeypatch.setattr(commit_module, "ONE_LAUNCH_MAX_BATCH", commit_batch)
    d = DIMS["k32-hv2"]
    b = make_batch(d, [(5, True)], seed=12, T=4)
    check_verify(b)
    check_decode(b)
    assert check_decode_commit(b, 6).tolist() == [True]
    assert check_commit(b, [2], L).tolist() == [False]
    assert check_commit(b, [4], 7).tolist() == [True]


@pytest.mark.parametrize("flush_length", [48, 64], ids=["flush48", "flush64"])
def test_long_buffers_and_paths(flush_length):
    """Buffers and accepted paths longer than the kernels' blocks of entries (16): 63-entry buffers, 40-node
    chains, up to 33 entries appended or folded."""
    rows = [(40, True), (0, False), (63, True), (20, False)]
    b = make_batch(DIMS["k16-hv1"], rows, seed=10, T=40, capacity=64)
    check_verify(b)
    check_decode(b)
    check_decode_commit(b, flush_length)
    check_commit(b, [20, 33, 0, 30], flush_length)
    check_flush(b)


def test_short_context_rows_never_read_the_state_pool():
    """No row has a state and the whole state pool is NaN: verify, decode and a decode + commit that folds
    nothing."""
    rows = [(0, False), (6, False), (3, False)]
    b = make_batch(DIMS["k16-hv1"], rows, seed=7, T=5)
    b.pools.state_pool.fill_(NAN)
    check_verify(b)
    check_decode(b)
    assert not check_decode_commit(b, L).any()


def test_strong_decay_stays_finite():
    """Log decays of -50 per token on a full 63-entry buffer and a 64-node chain: finite, and the references'
    results to the fp32 resolution of G (in the thousands: |G| 2^-24 absolute on each decay exponent)."""
    rows = [(63, True), (63, False), (0, True)]
    b = make_batch(Dims(1, 2, 16, 16), rows, seed=8, T=64, capacity=64, max_decay=50.0)
    tol = max(TOL, 4 * 50 * (63 + 64) * 2**-24)
    check_verify(b, tol=tol)
    check_decode(b, tol=tol)
    assert check_decode_commit(b, 64, tol=tol).tolist() == [True, True, False]
    assert check_commit(b, [1, 0, 64], 64, tol=tol).tolist() == [True, False, True]
    check_flush(b, tol=tol)


def test_bad_inputs_raise():
    b = make_batch(DIMS["k16-hv1"], ROWS, seed=9)
    q, k, v, g, beta = b.token
    pools = b.pools.args()
    with pytest.raises(ValueError, match="K and V"):
        gdn_decode(q[..., :12].contiguous(), k[..., :12].contiguous(), v, g, beta, *pools)
    with pytest.raises(ValueError, match="multiple"):
        gdn_decode(q, k, v[:, :1].repeat(1, 3, 1), g, beta, *pools)
    with pytest.raises(ValueError, match="contiguous"):
        gdn_decode(q, k, v.transpose(1, 2).contiguous().transpose(1, 2), g, beta, *pools)
    with pytest.raises(ValueError, match="float64"):
        gdn_decode(q.double(), k, v, g, beta, *pools)
    with pytest.raises(ValueError, match="flush_length"):
        gdn_decode_commit(q, k, v, g, beta, *pools, L + 1)
    long = [x[:, None].expand(-1, 65, *x.shape[1:]).contiguous() for x in b.token]
    with pytest.raises(ValueError, match="T must be"):
        gdn_verify(*long, chain_parents(len(ROWS), 65), torch.full((len(ROWS),), 65), *pools)


# Qwen3.5-9B's GDN heads (H 16, HV 32), a 64-entry buffer, 64-node trees and rows of every kind
GPU_DIMS = {
    "k64": Dims(16, 32, 64, 64),
    "k128": Dims(16, 32, 128, 128),
    "k128-bf16": Dims(16, 32, 128, 128, torch.bfloat16),
}
GPU_ROWS = [(0, True), (63, True), (30, False), (0, False), (17, True), (62, True), (5, True), (40, False)]
GPU_TOL = 2e-4


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("paths", ["small-batch-kernels", "large-batch-kernels"])
@pytest.mark.parametrize("shape", ["chain", "random"])
@pytest.mark.parametrize("d", GPU_DIMS.values(), ids=GPU_DIMS.keys())
def test_gpu_full_size(d, shape, paths, monkeypatch):
    """Every op on the rows of GPU_ROWS through the kernels of small batches (decode folding in place, verify in one
    kernel, commit in one launch) or of large ones (fold kernel with 3 lanes, each folding several rows; verify's
    two passes; append kernel)."""
    small = paths == "small-batch-kernels"
    monkeypatch.setattr(decode_module, "SMALL_BATCH", len(GPU_ROWS) if small else 0)
    monkeypatch.setattr(verify_module, "FUSED_MAX_BATCH", len(GPU_ROWS) if small else 0)
    monkeypatch.setattr(commit_module, "ONE_LAUNCH_MAX_BATCH", len(GPU_ROWS) if small else 0)
    monkeypatch.setattr(fold_module, "FOLD_LANES", 3)
    num_nodes = [64, 64, 1, 33, 0, 64, 17, 64]
    b = make_batch(d, GPU_ROWS, seed=10, T=64, num_nodes=num_nodes, shape=shape, capacity=64)
    check_verify(b, "cuda", GPU_TOL)
    # decode takes node 0 of every row as its token: no row may be empty (an empty row's inputs are NaN padding)
    tokens = make_batch(d, GPU_ROWS, seed=10, T=64, num_nodes=[max(1, n) for n in num_nodes], shape=shape,
                        capacity=64)
    check_decode(tokens, "cuda", GPU_TOL)
    for flush_length in (1, 48, 64):
        check_decode_commit(tokens, flush_length, "cuda", GPU_TOL)
    for flush_length in (1, 48, 64):
        check_commit(b, [3, 1, 1, 20, 0, 2, 17, 64], flush_length, "cuda", GPU_TOL)
    check_flush(b, "cuda", GPU_TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("T", [4, 16], ids=["chain4", "tree16"])
def test_gpu_engine_shapes(T):
    """Qwen3.5-9B's heads at the engine's buffer (capacity = flush_length = 16) and a batch of 40 rows: verify of
    4-chains / 16-node trees, decode + commit and commits that fold some rows, with the default launch settings."""
    d = GPU_DIMS["k128"]
    rows = [(n % 16, n % 5 != 0) for n in range(40)]
    num_nodes = [T - (n % 3) for n in range(40)]
    b = make_batch(d, rows, seed=11, T=T, num_nodes=num_nodes, shape="chain" if T == 4 else "random", capacity=16)
    check_verify(b, "cuda", GPU_TOL)
    assert check_decode_commit(b, 16, "cuda", GPU_TOL).any()
    check_commit(b, [min(3, n) for n in num_nodes], 16, "cuda", GPU_TOL)
