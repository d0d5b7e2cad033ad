"""Shared set-up of the Gated DeltaNet kernel tests (tests/test_gdn_*.py): dimensions, batches of rows with their pools,
and one check per op that runs the Triton kernel (verify_kernels/gdn) and its torch reference
(verify_kernels/gdn/naive.py) on copies of the same pools and compares outputs, buffer entries, flushed flags and the
pools after the in-place ops. Every output is NaN-poisoned (torch.empty returns NaN in the test modules), unowned
pool slots and stale buffer positions hold NaN, and a NaN state slot sits right before the state pool, where a kernel
that read slot -1 would land."""

from dataclasses import dataclass, replace

import torch

from tests.reference_checks import NAN, PADDING_PARENT, TREE, Pools, make_pools, pad_nodes, root_path
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
from verify_kernels.tree import ancestor_mask

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


def check_decode_commit(b: Batch, flush_length: int, device: str = DEVICE, tol: float = TOL,
                        every_row_folds: bool = False) -> torch.Tensor:
    """gdn_decode_commit (every_row_folds: its launch for steps in which every row folds) against gdn_decode_ref
    then gdn_commit_ref of the token; returns flushed."""
    B = len(b.num_nodes)
    one, node0 = torch.ones(B, dtype=torch.long), torch.zeros(B, 1, dtype=torch.long)
    ref_pools = clone(b.pools)
    ref_pools.before_commit(one, flush_length)                     # rows about to fold get a zeroed state slot
    pools = for_kernel(ref_pools, device)
    o, flushed = gdn_decode_commit(*to(b.token, device), *pools.args(), flush_length, every_row_folds=every_row_folds)
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



COMMITS = {
    # flush_length, accepted nodes per row of ROWS (buffered 0, 7, 3, 0, 5) on TREE (root paths up to 5 nodes)
    "fold-and-append": (6, [2, 0, 1, 0, 3]),         # rows 1 (7 + 0) and 4 (5 + 3) fold
    "append-only": (L, [3, 0, 4, 5, 2]),
    "fold-all": (1, [1, 1, 1, 1, 1]),
    "fold-buffers-only": (1, [0, 0, 0, 0, 0]),       # rows with entries fold them, empty rows do nothing
}


# Qwen3.5-9B's GDN heads (H 16, HV 32), a 64-entry buffer, 64-node trees and rows of every kind
GPU_DIMS = {
    "k64": Dims(16, 32, 64, 64),
    "k128": Dims(16, 32, 128, 128),
    "k128-bf16": Dims(16, 32, 128, 128, torch.bfloat16),
}
GPU_ROWS = [(0, True), (63, True), (30, False), (0, False), (17, True), (62, True), (5, True), (40, False)]
GPU_TOL = 2e-4


def swapped_caps(caps: dict[int, int | None]) -> dict[int, int | None]:
    """A per-block register-cap setting (e.g. verify.STATE_DOT_MAX_REGISTERS) turned around: 128 where a block has
    none, none where it has one, so that a test runs the form the defaults do not."""
    return {block: 128 if cap is None else None for block, cap in caps.items()}
