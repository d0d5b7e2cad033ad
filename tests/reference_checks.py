"""Helpers shared by the reference tests (verify_kernels/*/naive.py): random token trees, root paths,
slot-indexed pools poisoned with NaN, the caller's bookkeeping around commit and flush, and MixerChecks, the
tests that every KVBuffer mixer (gdn, mamba2) passes against its own recurrence."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verify_kernels.tree import chain_parents

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
    node = torch.arange(x.shape[1], device=x.device) < num_nodes[:, None]
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


class RefOps(NamedTuple):
    """A mixer's reference functions (verify_kernels.<mixer>)."""

    recurrent: Callable
    chunk_prefill: Callable
    decode: Callable
    verify: Callable
    commit: Callable
    flush: Callable


class Mixer(ABC):
    """A mixer as MixerChecks drive it. tokens: the per-token inputs [B, T, ...] of its *_ref functions (gdn: q,
    k, v, g, beta; mamba2: x, dt, Bm, C); per-layer weights (mamba2: A, D) live on the mixer. A token's buffer
    entry is (key, value, gcum) as in verify_kernels.kvbuffer."""

    ops: RefOps
    max_decay: float                          # per-token log decays reach down to about -max_decay
    state_shape: tuple[int, ...]              # gdn [HV, K, V], mamba2 [NH, P, N]
    entry_shapes: tuple[tuple[int, ...], ...]  # key [H, K], value [HV, V], gcum [HV]

    @abstractmethod
    def tokens(self, gen: torch.Generator, B: int, T: int) -> list[torch.Tensor]:
        """Model-like random tokens [B, T, ...]."""

    def args(self, tokens) -> tuple[torch.Tensor, ...]:
        """The leading arguments of the *_ref functions for these tokens."""
        return tuple(tokens)

    @abstractmethod
    def key(self, tokens) -> torch.Tensor:
        """The key-like buffer entries of tokens [B, T, ...]: [B, T, H, K]."""

    @abstractmethod
    def log_decay(self, tokens) -> torch.Tensor:
        """The log decay of tokens [B, T, ...]: [B, T, HV]."""

    @abstractmethod
    def value(self, state: torch.Tensor, token) -> torch.Tensor:
        """The value-like entry that one token [B, ...] writes on top of state [B, *state_shape]: [B, HV, V]."""

    @abstractmethod
    def pad_right(self, tokens, T: int) -> None:
        """Turn the tokens from T on into ragged-batch right padding (no decay, no write), in place."""

    @abstractmethod
    def hit_max_decay(self, tokens, step: int) -> None:
        """Let every step-th token decay by exactly -max_decay (on one head at least), in place."""

    def random_state(self, gen: torch.Generator, B: int) -> torch.Tensor:
        return torch.randn(B, *self.state_shape, generator=gen)

    def recurrent(self, tokens, state=None):
        return self.ops.recurrent(*self.args(tokens), state)

    def chunk_prefill(self, tokens, state, chunk_size: int):
        return self.ops.chunk_prefill(*self.args(tokens), state, chunk_size=chunk_size)

    def decode(self, tokens, pools: Pools):
        return self.ops.decode(*self.args(tokens), *pools.args())

    def verify(self, tokens, parents, num_nodes, pools: Pools):
        return self.ops.verify(*self.args(tokens), parents, num_nodes, *pools.args())

    def commit(self, tokens, value, gcum, accepted, num_accepted, pools: Pools, flush_length: int):
        """Commit with the key-like entries taken from tokens (the verify inputs)."""
        return self.ops.commit(self.key(tokens), value, gcum, accepted, num_accepted, *pools.args(), flush_length)

    def flush(self, pools: Pools) -> torch.Tensor:
        """Flush every row with the caller's bookkeeping; returns the committed states [B, *state_shape]."""
        pools.before_flush()
        self.ops.flush(*pools.args())
        pools.buf_len[pools.req_slots] = 0
        return pools.states()

    def run_path(self, state: torch.Tensor, tokens, path: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The recurrence from state [*state_shape] along tokens[path] of one row (tokens [T, ...]): the last
        token's output and the value-like entry it writes."""
        steps = [x[path][None] for x in tokens]
        _, before = self.recurrent([x[:, :-1] for x in steps], state[None])
        o, _ = self.recurrent([x[:, -1:] for x in steps], before)
        return o[0, -1], self.value(before, [x[:, -1] for x in steps])[0]

    def committed_start(self, gen: torch.Generator, buffered: list[int], has_state: list[bool], capacity: int):
        """Pools where row b has a committed state (or none) and buffered[b] entries written by the recurrence.

        Returns the pools and, per row, the state after the buffered tokens (what the recurrence would hold)
        and the gcum of the last buffered token."""
        states, entries, after, g_end = [], [], [], []
        for n, has in zip(buffered, has_state, strict=True):
            s0 = self.random_state(gen, 1) if has else None
            history = self.tokens(gen, 1, n)
            state, values = torch.zeros(1, *self.state_shape) if s0 is None else s0, []
            for t in range(n):
                values.append(self.value(state, [x[:, t] for x in history]))
                _, state = self.recurrent([x[:, t : t + 1] for x in history], state)
            g = self.log_decay(history)[0]
            value = torch.cat(values) if values else torch.zeros(0, *self.entry_shapes[1])
            states.append(None if s0 is None else s0[0])
            entries.append((self.key(history)[0], value, g.cumsum(0)))
            after.append(state[0])
            g_end.append(g.sum(0))
        pools = make_pools(gen, states, entries, capacity, self.state_shape, self.entry_shapes)
        return pools, after, g_end

    def decode_chain(self, pools: Pools, tokens, flush_length: int) -> torch.Tensor:
        """Decode tokens [B, n, ...] one at a time, each committed as a one-node path with the caller's
        bookkeeping. Returns the outputs [B, n, ...]."""
        B, n = tokens[0].shape[:2]
        one, node0 = torch.ones(B, dtype=torch.long), torch.zeros(B, 1, dtype=torch.long)
        outputs = []
        for t in range(n):
            o, value, gcum = self.decode([x[:, t] for x in tokens], pools)
            pools.before_commit(one, flush_length)
            token = [x[:, t, None] for x in tokens]
            flushed = self.commit(token, value[:, None], gcum[:, None], node0, one, pools, flush_length)
            pools.after_commit(one, flushed)
            outputs.append(o)
        return torch.stack(outputs, 1)


# value heads per key head (gdn) / heads per group (mamba2)
RATIOS = (1, 2, 3)
# node j's parent; the accepted paths below are root paths of this tree
TREE = [-1, 0, 0, 1, 3, 2, -1, 4]
COMMITS = {
    # flush_length, accepted path per row: row 0 starts with 3 buffered entries and a state, row 1 fresh
    "no-fold": (16, [[0, 1, 3, 4], [6]]),
    "fold-one-row": (6, [[0, 1, 3], [0, 2, 5]]),
    "fold-long-path": (4, [[0, 1, 3, 4, 7], [0, 1, 3, 4, 7]]),
    "nothing-accepted": (5, [[], [0, 2]]),
}


class MixerChecks:
    """The chunked prefill and every KVBuffer path (decode, tree verify, commit, flush) must equal the mixer's
    recurrence run along the same tokens from the same committed state. A Test* subclass in a mixer's test file
    runs them by saying which mixer: `mixer`."""

    def mixer(self, gen: torch.Generator, ratio: int, max_decay: float = 2.0) -> Mixer:
        """The mixer under test with `ratio` (RATIOS) value heads per key head; may draw weights from gen."""
        raise NotImplementedError

    @pytest.mark.parametrize("initial", [False, True], ids=["zero-state", "initial-state"])
    @pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"ratio{r}")
    @pytest.mark.parametrize("chunk_size", [16, 64], ids=lambda c: f"chunk{c}")
    @pytest.mark.parametrize("T", [1, 5, 63, 64, 65, 130], ids=lambda t: f"T{t}")
    def test_chunk_prefill_matches_recurrent(self, T, chunk_size, ratio, initial):
        gen = torch.Generator().manual_seed(T)
        mixer = self.mixer(gen, ratio)
        tokens = mixer.tokens(gen, 2, T)
        s0 = mixer.random_state(gen, 2) if initial else None
        o_ref, s_ref = mixer.recurrent(tokens, s0)
        o, s = mixer.chunk_prefill(tokens, s0, chunk_size)
        assert_close(o, o_ref, tol=2e-5)
        assert_close(s, s_ref, tol=2e-5)

    @pytest.mark.parametrize("chunk_size", [16, 64], ids=lambda c: f"chunk{c}")
    def test_chunk_prefill_right_padding_leaves_state_unchanged(self, chunk_size):
        gen = torch.Generator().manual_seed(1)
        mixer = self.mixer(gen, 2)
        T, pad = 21, 30
        tokens = mixer.tokens(gen, 1, T + pad)
        mixer.pad_right(tokens, T)
        s0 = mixer.random_state(gen, 1)
        o, s = mixer.chunk_prefill(tokens, s0, chunk_size)
        o_ref, s_ref = mixer.recurrent([x[:, :T] for x in tokens], s0)
        assert_close(o[:, :T], o_ref)
        assert_close(s, s_ref)

    @pytest.mark.parametrize("flush_length", [1, 3, 16], ids=lambda f: f"flush{f}")
    def test_decode_chain_across_flushes_matches_recurrence(self, flush_length):
        gen = torch.Generator().manual_seed(flush_length)
        mixer = self.mixer(gen, 2)
        # a fresh row, a row with a state, and a row with a state and buffered tokens (staggered flushes)
        buffered = [0, 0, min(2, flush_length - 1)]
        pools, after, _ = mixer.committed_start(gen, buffered, [False, True, True], 16)
        tokens = mixer.tokens(gen, 3, 40)
        outputs = mixer.decode_chain(pools, tokens, flush_length)
        o_ref, s_ref = mixer.recurrent(tokens, torch.stack(after))
        assert_close(outputs, o_ref)
        assert_close(mixer.flush(pools), s_ref)

    # every Test* subclass runs this test on its own mixer: the executors differ on purpose
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.differing_executors])
    @given(batch=tree_batches(), ratio=st.sampled_from(RATIOS))
    def test_verify_tree_matches_recurrence_along_root_paths(self, batch: TreeBatch, ratio):
        gen = torch.Generator().manual_seed(batch.seed)
        mixer = self.mixer(gen, ratio)
        rows = batch.rows
        pools, after, g_end = mixer.committed_start(gen, [r.buffered for r in rows], [r.has_state for r in rows],
                                                    batch.capacity)
        parents, num_nodes = batch.tensors()
        tokens = [pad_nodes(x, num_nodes) for x in mixer.tokens(gen, len(rows), batch.num_tokens)]
        o, value, gcum = mixer.verify(tokens, parents, num_nodes, pools)

        log_decay = mixer.log_decay(tokens)
        for b, row in enumerate(rows):
            for j in range(row.num_nodes):
                path = root_path(row.parents, j)
                o_ref, value_ref = mixer.run_path(after[b], [x[b] for x in tokens], path)
                assert_close(o[b, j], o_ref)
                assert_close(value[b, j], value_ref)
                assert_close(gcum[b, j], g_end[b] + log_decay[b, path].sum(0))
            padding = slice(row.num_nodes, None)
            assert not o[b, padding].any() and not value[b, padding].any() and not gcum[b, padding].any()

    def test_verify_single_node_equals_decode(self):
        gen = torch.Generator().manual_seed(2)
        mixer = self.mixer(gen, 3)
        pools, _, _ = mixer.committed_start(gen, [3, 0, 5], [True, False, False], 8)
        tokens = mixer.tokens(gen, 3, 1)
        verified = mixer.verify(tokens, chain_parents(3, 1), torch.ones(3, dtype=torch.long), pools)
        decoded = mixer.decode([x[:, 0] for x in tokens], pools)
        for v, d in zip(verified, decoded, strict=True):
            assert_close(v[:, 0], d)

    @pytest.mark.parametrize("case", COMMITS.values(), ids=COMMITS.keys())
    def test_commit_then_decode_matches_recurrence(self, case):
        flush_length, paths = case
        gen = torch.Generator().manual_seed(3)
        mixer = self.mixer(gen, 2)
        pools, after, _ = mixer.committed_start(gen, [3, 0], [True, False], 16)
        T = len(TREE)
        parents, num_nodes = torch.tensor([TREE, TREE]), torch.tensor([T, T])
        tree_tokens = mixer.tokens(gen, 2, T)
        _, value, gcum = mixer.verify(tree_tokens, parents, num_nodes, pools)

        accepted = torch.full((2, T), -1)
        for b, path in enumerate(paths):
            accepted[b, : len(path)] = torch.tensor(path, dtype=torch.long)
        num_accepted = torch.tensor([len(p) for p in paths])
        pools.before_commit(num_accepted, flush_length)
        flushed = mixer.commit(tree_tokens, value, gcum, accepted, num_accepted, pools, flush_length)
        assert flushed.tolist() == [3 + len(paths[0]) >= flush_length, len(paths[1]) >= flush_length]
        pools.after_commit(num_accepted, flushed)

        new_tokens = mixer.tokens(gen, 2, 7)
        outputs = mixer.decode_chain(pools, new_tokens, flush_length)
        states = mixer.flush(pools)
        for b, path in enumerate(paths):
            # the recurrence over the committed tokens, then the accepted path, then the new tokens
            tokens = [torch.cat([x[b, path], y[b]])[None] for x, y in zip(tree_tokens, new_tokens, strict=True)]
            o_ref, s_ref = mixer.recurrent(tokens, after[b][None])
            assert_close(outputs[b], o_ref[0, len(path):])
            assert_close(states[b], s_ref[0])

    def test_strong_decay_stays_finite(self):
        """Per-token log decays down to -50 over 70+ tokens: no NaN / inf in outputs, entries or states."""
        gen = torch.Generator().manual_seed(4)
        mixer = self.mixer(gen, 2, max_decay=50.0)
        T = 70
        tokens = mixer.tokens(gen, 2, T)
        mixer.hit_max_decay(tokens, 7)
        s0 = mixer.random_state(gen, 2)
        o_ref, s_ref = mixer.recurrent(tokens, s0)
        o_chunk, s_chunk = mixer.chunk_prefill(tokens, s0, 64)
        assert_close(o_chunk, o_ref, tol=1e-4)
        assert_close(s_chunk, s_ref, tol=1e-4)

        # a buffer of 63 strongly decayed entries (gcum far below -1000), then a chain verify on top of it
        pools, after, _ = mixer.committed_start(gen, [63, 63], [True, False], 64)
        o, value, gcum = mixer.verify(tokens, chain_parents(2, T), torch.tensor([T, T]), pools)
        for x in (o, value, gcum):
            assert torch.isfinite(x).all()
        # Entries keep G relative to S0, so at |G| in the thousands fp32 resolves a decay exponent G_t - G_i only
        # to about |G| * 2^-24: that bounds the KVBuffer form's error here (the recurrence has no such term).
        tol = max(1e-4, 4 * gcum.abs().max().item() * 2**-24)
        assert_close(o, mixer.recurrent(tokens, torch.stack(after))[0], tol=tol)
        outputs = mixer.decode_chain(pools, tokens, 64)
        assert_close(outputs, o, tol=tol)
        assert torch.isfinite(mixer.flush(pools)).all()

    def test_short_context_never_reads_the_state_pool(self):
        gen = torch.Generator().manual_seed(5)
        mixer = self.mixer(gen, 1)
        pools, after, _ = mixer.committed_start(gen, [0, 4], [False, False], 16)
        pools.state_pool.fill_(NAN)
        tokens = mixer.tokens(gen, 2, 6)
        o, _, _ = mixer.verify(tokens, chain_parents(2, 6), torch.tensor([6, 6]), pools)
        decoded = mixer.decode_chain(pools, tokens, 16)                     # 4 + 6 < 16: never flushes
        assert (pools.state_slots == -1).all()
        o_ref, _ = mixer.recurrent(tokens, torch.stack(after))             # from zero, then the buffer
        assert_close(o, o_ref)
        assert_close(decoded, o_ref)

    def test_padding_nodes_do_not_leak(self):
        gen = torch.Generator().manual_seed(6)
        mixer = self.mixer(gen, 2)
        pools, _, _ = mixer.committed_start(gen, [2, 2], [True, True], 8)
        tokens = mixer.tokens(gen, 2, 6)
        parents = torch.tensor([[-1, 0, 1, 1, 0, 2], [-1, 0, 1, 1, 0, 2]])
        full = mixer.verify(tokens, parents, torch.tensor([6, 6]), pools)
        # row 1 keeps 3 nodes; its padding holds NaN inputs and out-of-range parents
        num_nodes = torch.tensor([6, 3])
        padded_parents = torch.where(torch.arange(6) < num_nodes[:, None], parents, 99)
        padded = [pad_nodes(x, num_nodes) for x in tokens]
        out = mixer.verify(padded, padded_parents, num_nodes, pools)
        for x, ref in zip(out, full, strict=True):
            assert_close(x[0], ref[0])
            assert_close(x[1, :3], ref[1, :3])
            assert not x[1, 3:].any()

    def test_padding_beside_a_deeply_decayed_buffer_stays_finite(self):
        """Buffer entries whose G lies below -88 (e^88 overflows fp32) next to padded rows: padding must not turn
        into 0 * inf = NaN that leaks into valid nodes (the engine hit this with ragged trees)."""
        gen = torch.Generator().manual_seed(7)
        mixer = self.mixer(gen, 2)
        pools, _, _ = mixer.committed_start(gen, [5, 5], [True, False], 8)
        pools.buffers[2][pools.req_slots] -= 200.0  # every buffered entry 200 nats further from S0
        tokens = mixer.tokens(gen, 2, 4)
        verified = mixer.verify(tokens, chain_parents(2, 4), torch.tensor([1, 4]), pools)
        decoded = mixer.decode([x[:, 0] for x in tokens], pools)
        for v, d in zip(verified, decoded, strict=True):
            assert torch.isfinite(v).all()
            assert_close(v[:, 0], d)
            assert not v[0, 1:].any()

    def test_commit_and_flush_need_a_state_slot_to_fold(self):
        gen = torch.Generator().manual_seed(7)
        mixer = self.mixer(gen, 1)
        pools, _, _ = mixer.committed_start(gen, [2], [False], 4)
        tokens = mixer.tokens(gen, 1, 2)
        value = torch.randn(1, 2, *mixer.entry_shapes[1], generator=gen)
        args = (tokens, value, mixer.log_decay(tokens), torch.tensor([[0, 1]]), torch.tensor([2]), pools)
        with pytest.raises(ValueError, match="state slot"):
            mixer.commit(*args, 4)
        with pytest.raises(ValueError, match="flush_length"):
            mixer.commit(*args, 5)
        with pytest.raises(ValueError, match="state slot"):
            mixer.ops.flush(*pools.args())                                  # no slot allocated for the fold
