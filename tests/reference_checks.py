"""Helpers shared by the reference tests (verify_kernels/*/naive.py): random token trees, root paths,
slot-indexed pools poisoned with NaN, and the caller's bookkeeping around commit and flush."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

NAN = float("nan")
# a parent entry for padding nodes: out of range on purpose, the kernels must ignore it
PADDING_PARENT = 1000


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-5) -> None:
    """assert_close in fp32 with one absolute and relative tolerance, NaN / inf never equal."""
    assert torch.isfinite(actual).all(), "non-finite values in the output"
    torch.testing.assert_close(actual, expected.to(actual.dtype), atol=tol, rtol=tol)


def root_path(parents: list[int], j: int) -> list[int]:
    """Nodes from the root down to node j (inclusive) of one tree."""
    path = []
    while j >= 0:
        path.append(j)
        j = parents[j]
    return path[::-1]


@dataclass
class TreeRow:
    """One batch row of a verify test: its tree and its committed start."""

    parents: list[int]   # T entries, PADDING_PARENT past num_nodes
    num_nodes: int
    buffered: int        # buffer entries before the tree (buf_len)
    has_state: bool      # False: never flushed, S0 = 0 and no state slot


@dataclass
class TreeBatch:
    rows: list[TreeRow]
    capacity: int        # buffer capacity L
    seed: int

    @property
    def num_tokens(self) -> int:
        return len(self.rows[0].parents)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """parents [B, T] int64 and num_nodes [B] int64."""
        return (torch.tensor([r.parents for r in self.rows]),
                torch.tensor([r.num_nodes for r in self.rows]))


@st.composite
def tree_batches(draw, max_rows: int = 3, max_nodes: int = 12, max_capacity: int = 8) -> TreeBatch:
    """Batches of random trees (a different number of nodes per row, 0 included) on random committed starts
    (buffer fills from empty to capacity - 1, with and without a committed state)."""
    T = draw(st.integers(1, max_nodes))
    capacity = draw(st.integers(1, max_capacity))
    rows = []
    for _ in range(draw(st.integers(1, max_rows))):
        n = draw(st.integers(0, T))
        parents = [draw(st.integers(-1, j - 1)) for j in range(n)] + [PADDING_PARENT] * (T - n)
        rows.append(TreeRow(parents, n, draw(st.integers(0, capacity - 1)), draw(st.booleans())))
    return TreeBatch(rows, capacity, draw(st.integers(0, 2**31 - 1)))


def pad_nodes(x: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """x [B, T, ...] with NaN at padding nodes, to prove that they never reach valid ones."""
    node = torch.arange(x.shape[1]) < num_nodes[:, None]
    return torch.where(node.view(*node.shape, *(1,) * (x.dim() - 2)), x, NAN)


@dataclass
class Pools:
    """A slot-indexed KVBuffer pool for B rows, in the argument order of the *_ref functions."""

    state_pool: torch.Tensor   # [S, ...]
    state_slots: torch.Tensor  # [B], -1 = never flushed
    buffers: list[torch.Tensor]  # key-like [R, L, ...], value-like [R, L, ...], gcum [R, L, heads]
    buf_len: torch.Tensor      # [R]
    req_slots: torch.Tensor    # [B]

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.state_pool, self.state_slots, *self.buffers, self.buf_len, self.req_slots)

    def before_commit(self, num_accepted: torch.Tensor, flush_length: int) -> None:
        """The caller's part before a commit: rows about to flush without a state get a zeroed slot."""
        will_flush = self.buf_len[self.req_slots] + num_accepted >= flush_length
        rows = (will_flush & (self.state_slots < 0)).nonzero()[:, 0]
        S = self.state_pool.shape[0]
        fresh = self.state_pool.new_zeros(len(rows), *self.state_pool.shape[1:])
        self.state_pool = torch.cat([self.state_pool, fresh])
        self.state_slots[rows] = S + torch.arange(len(rows))

    def after_commit(self, num_accepted: torch.Tensor, flushed: torch.Tensor) -> None:
        """The caller's part after a commit (once for all layers): buf_len = 0 if flushed else + a."""
        length = self.buf_len[self.req_slots]
        self.buf_len[self.req_slots] = torch.where(flushed, 0, length + num_accepted)

    def before_flush(self) -> None:
        """A flush folds every row with buffered entries: those need a state slot too."""
        self.before_commit(torch.zeros_like(self.state_slots), 1)

    def states(self) -> torch.Tensor:
        """The committed state of every row, zeros where there is none: [B, ...]."""
        has = (self.state_slots >= 0).view(-1, *(1,) * (self.state_pool.dim() - 1))
        return torch.where(has, self.state_pool[self.state_slots.clamp(min=0)], 0.0)


def make_pools(
    gen: torch.Generator,
    states: list[torch.Tensor | None],
    entries: list[tuple[torch.Tensor, ...]],
    capacity: int,
    state_shape: tuple[int, ...],
    entry_shapes: tuple[tuple[int, ...], ...],
) -> Pools:
    """Pools holding each row's committed state and buffer entries at shuffled slots, with spare slots.

    Every slot and buffer position that no row owns holds NaN, so a stray read shows up in the outputs.
    states: per row [*state_shape] or None (never flushed); entries: per row a tuple of [n_b, *shape] tensors.
    """
    B = len(states)
    R = S = B + 2
    req_slots = torch.randperm(R, generator=gen)[:B]
    free = torch.randperm(S, generator=gen)[:B]
    state_slots = torch.tensor([int(s) if x is not None else -1 for s, x in zip(free, states, strict=True)])
    state_pool = torch.full((S, *state_shape), NAN)
    buffers = [torch.full((R, capacity, *shape), NAN) for shape in entry_shapes]
    buf_len = torch.randint(0, capacity, (R,), generator=gen)             # other requests' lengths
    for b in range(B):
        if states[b] is not None:
            state_pool[state_slots[b]] = states[b]
        n = entries[b][0].shape[0]
        buf_len[req_slots[b]] = n
        for buf, x in zip(buffers, entries[b], strict=True):
            buf[req_slots[b], :n] = x
    return Pools(state_pool, state_slots, buffers, buf_len, req_slots)
