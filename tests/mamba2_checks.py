"""Shared set-up of the Mamba2 kernel tests (tests/test_mamba2_*.py): head sizes, launch configs that force every path
of the kernels, pools of rows at shuffled slots, tokens, trees, and the runs of a kernel and its torch reference
(verify_kernels/mamba2/naive.py) on copies of the same pools. Unowned pool slots, stale buffer positions, padding
nodes' inputs and the state slot right before the pool (where a read of slot -1 would land) hold NaN."""

from typing import NamedTuple

import pytest
import torch

from tests.reference_checks import NAN, PADDING_PARENT, Pools
from verify_kernels.mamba2 import (
    mamba2_commit,
    mamba2_commit_ref,
    mamba2_decode_commit,
    mamba2_decode_ref,
    mamba2_verify_ref,
)
from verify_kernels.mamba2.decode import DecodeConfig, mamba2_decode_fwd
from verify_kernels.mamba2.verify import VerifyConfig

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
} | {  # h0's stream beside the products pass, the rest in a second launch
    "split-roles-dots": VerifyConfig(block_p=16, num_warps=4, state_dot=True, inline_scores=False, block_n=16,
                                     split_roles=True),
    # the second launch on its own P rows and warps (VerifyConfig.finish_*): 32 rows on one warp, where the state
    # programs take 16 on 4
    "split-roles-finish-bp32-w1": VerifyConfig(block_p=16, num_warps=4, state_dot=True, inline_scores=False,
                                               block_n=16, split_roles=True, finish_block_p=32, finish_warps=1),
    # both launches with their registers capped (VerifyConfig.*_max_registers: Triton's maxnreg, which the
    # interpreter takes and ignores; on a GPU a build that may spill)
    "split-roles-registers-capped": VerifyConfig(block_p=16, num_warps=4, state_dot=True, inline_scores=False,
                                                 block_n=16, split_roles=True, roles_max_registers=72,
                                                 finish_max_registers=64)}
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

