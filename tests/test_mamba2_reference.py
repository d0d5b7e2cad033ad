"""verify_kernels.mamba2.naive against the plain Mamba2 scan: transformers' NemotronH scans are the outside
oracle for our recurrence; the chunked prefill and every KVBuffer path (decode, tree verify, commit, flush)
must equal our recurrence run along the same tokens from the same committed state."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.nemotron_h.modeling_nemotron_h import (
    mamba2_chunk_scan,
    mamba2_selective_state_update,
)

from tests.reference_checks import (
    NAN,
    Pools,
    TreeBatch,
    assert_close,
    make_pools,
    pad_nodes,
    root_path,
    tree_batches,
)
from verify_kernels.mamba2 import (
    mamba2_chunk_prefill_ref,
    mamba2_commit_ref,
    mamba2_decode_ref,
    mamba2_flush_ref,
    mamba2_recurrent_ref,
    mamba2_verify_ref,
)
from verify_kernels.tree import chain_parents

P, N = 6, 5
# (NH, NG): heads per group 1, 2, 3
HEADS = {"g1": (2, 2), "g2": (2, 1), "g3": (6, 2)}


def mamba2_layer(gen, NH, max_decay=2.0):
    """A [NH] with dt A >= -max_decay for dt <= 1, and D [NH]."""
    A = -max_decay * (0.1 + 0.9 * torch.rand(NH, generator=gen))
    return A, torch.randn(NH, generator=gen)


def mamba2_tokens(gen, B, T, NH, NG):
    """x [B, T, NH, P], dt [B, T, NH] in (0, 1] (already softplus'ed), Bm and C [B, T, NG, N]."""
    x = torch.randn(B, T, NH, P, generator=gen)
    dt = 1.0 - torch.rand(B, T, NH, generator=gen)
    return x, dt, torch.randn(B, T, NG, N, generator=gen), torch.randn(B, T, NG, N, generator=gen)


def inputs(tokens, layer):
    """The argument order of the *_ref functions: x, dt, A, Bm, C, D."""
    (x, dt, Bm, C), (A, D) = tokens, layer
    return x, dt, A, Bm, C, D


def run_path(state, tokens, path, layer):
    """Our recurrence from `state` [NH, P, N] along tokens[path] of one row: the last token's y."""
    y, _ = mamba2_recurrent_ref(*inputs([x[path][None] for x in tokens], layer), state[None])
    return y[0, -1]


def committed_start(gen, buffered, has_state, capacity, NH, NG, layer):
    """Pools where row b has a committed state (or none) and buffered[b] entries of random tokens.

    Returns the pools and, per row, the state after the buffered tokens (what the recurrence would hold) and
    the gcum of the last buffered token."""
    A = layer[0]
    states, entries, after, g_end = [], [], [], []
    for n, has in zip(buffered, has_state, strict=True):
        s0 = torch.randn(NH, P, N, generator=gen) if has else None
        history = mamba2_tokens(gen, 1, n, NH, NG)
        _, state = mamba2_recurrent_ref(*inputs(history, layer), None if s0 is None else s0[None])
        x, dt, Bm, _ = (z[0] for z in history)
        states.append(s0)
        entries.append((Bm, dt[..., None] * x, (dt * A).cumsum(0)))
        after.append(state[0])
        g_end.append((dt * A).sum(0))
    pools = make_pools(gen, states, entries, capacity, (NH, P, N), ((NG, N), (NH, P), (NH,)))
    return pools, after, g_end


def decode_chain(pools: Pools, tokens, layer, flush_length):
    """Decode tokens [B, n, ...] one at a time, each committed as a one-node path with the caller's
    bookkeeping. Returns the outputs [B, n, NH, P]."""
    x, dt, Bm, C = tokens
    B = x.shape[0]
    one, node0 = torch.ones(B, dtype=torch.long), torch.zeros(B, 1, dtype=torch.long)
    outputs = []
    for t in range(x.shape[1]):
        y, xdt, gcum = mamba2_decode_ref(*inputs([z[:, t] for z in tokens], layer), *pools.args())
        pools.before_commit(one, flush_length)
        entry = (Bm[:, t, None], xdt[:, None], gcum[:, None])
        flushed = mamba2_commit_ref(*entry, node0, one, *pools.args(), flush_length)
        pools.after_commit(one, flushed)
        outputs.append(y)
    return torch.stack(outputs, 1)


def flush(pools: Pools) -> torch.Tensor:
    """Flush every row and return the committed states [B, NH, P, N]."""
    pools.before_flush()
    mamba2_flush_ref(*pools.args())
    pools.buf_len[pools.req_slots] = 0
    return pools.states()


@pytest.mark.parametrize("initial", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
def test_recurrent_matches_transformers_chunk_scan(heads, initial):
    NH, NG = heads
    gen = torch.Generator().manual_seed(0)
    layer, tokens = mamba2_layer(gen, NH), mamba2_tokens(gen, 2, 37, NH, NG)
    x, dt, A, Bm, C, D = inputs(tokens, layer)
    s0 = torch.randn(2, NH, P, N, generator=gen) if initial else None
    # dt is already processed: no dt_bias, no softplus, and the default clamp (0, inf) keeps it as it is
    y_hf, s_hf = mamba2_chunk_scan(x, dt, A, Bm, C, chunk_size=16, D=D, initial_states=s0,
                                   return_final_states=True)
    y, s = mamba2_recurrent_ref(x, dt, A, Bm, C, D, s0)
    assert_close(y, y_hf)
    assert_close(s, s_hf)


@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
def test_recurrent_matches_transformers_state_update(heads):
    NH, NG = heads
    gen = torch.Generator().manual_seed(1)
    layer, tokens = mamba2_layer(gen, NH), mamba2_tokens(gen, 2, 9, NH, NG)
    x, dt, A, Bm, C, D = inputs(tokens, layer)
    s0 = torch.randn(2, NH, P, N, generator=gen)
    # the decode-time shapes of NemotronHMamba2Mixer: dt [B, NH, P], A [NH, P, N], D [NH, P]
    state, y_hf = s0.clone(), []
    for t in range(x.shape[1]):
        y_hf.append(mamba2_selective_state_update(state, x[:, t], dt[:, t, :, None].expand(-1, -1, P),
                                                  A[:, None, None].expand(NH, P, N), Bm[:, t], C[:, t],
                                                  D[:, None].expand(NH, P)))
    y, s = mamba2_recurrent_ref(x, dt, A, Bm, C, D, s0)
    assert_close(y, torch.stack(y_hf, 1))
    assert_close(s, state)


@pytest.mark.parametrize("initial", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
@pytest.mark.parametrize("chunk_size", [16, 64], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("T", [1, 5, 63, 64, 65, 130], ids=lambda t: f"T{t}")
def test_chunk_prefill_matches_recurrent(T, chunk_size, heads, initial):
    NH, NG = heads
    gen = torch.Generator().manual_seed(T)
    args = inputs(mamba2_tokens(gen, 2, T, NH, NG), mamba2_layer(gen, NH))
    s0 = torch.randn(2, NH, P, N, generator=gen) if initial else None
    y_ref, s_ref = mamba2_recurrent_ref(*args, s0)
    y, s = mamba2_chunk_prefill_ref(*args, s0, chunk_size=chunk_size)
    assert_close(y, y_ref, tol=2e-5)
    assert_close(s, s_ref, tol=2e-5)


@pytest.mark.parametrize("chunk_size", [16, 64], ids=lambda c: f"chunk{c}")
def test_chunk_prefill_right_padding_leaves_state_unchanged(chunk_size):
    gen = torch.Generator().manual_seed(2)
    NH, NG = HEADS["g2"]
    T, pad = 21, 30
    layer = mamba2_layer(gen, NH)
    x, dt, Bm, C = mamba2_tokens(gen, 1, T + pad, NH, NG)
    dt[:, T:] = 0.0                                                         # ragged-batch right padding
    s0 = torch.randn(1, NH, P, N, generator=gen)
    y, s = mamba2_chunk_prefill_ref(*inputs((x, dt, Bm, C), layer), s0, chunk_size=chunk_size)
    y_ref, s_ref = mamba2_recurrent_ref(*inputs([z[:, :T] for z in (x, dt, Bm, C)], layer), s0)
    assert_close(y[:, :T], y_ref)
    assert_close(s, s_ref)


@pytest.mark.parametrize("flush_length", [1, 3, 16], ids=lambda f: f"flush{f}")
def test_decode_chain_across_flushes_matches_recurrence(flush_length):
    gen = torch.Generator().manual_seed(flush_length)
    NH, NG = HEADS["g2"]
    layer = mamba2_layer(gen, NH)
    # a fresh row, a row with a state, and a row with a state and buffered tokens (staggered flushes)
    buffered = [0, 0, min(2, flush_length - 1)]
    pools, after, _ = committed_start(gen, buffered, [False, True, True], 16, NH, NG, layer)
    tokens = mamba2_tokens(gen, 3, 40, NH, NG)
    outputs = decode_chain(pools, tokens, layer, flush_length)
    y_ref, s_ref = mamba2_recurrent_ref(*inputs(tokens, layer), torch.stack(after))
    assert_close(outputs, y_ref)
    assert_close(flush(pools), s_ref)


@settings(max_examples=60, deadline=None)
@given(batch=tree_batches(), heads=st.sampled_from(list(HEADS.values())))
def test_verify_tree_matches_recurrence_along_root_paths(batch: TreeBatch, heads):
    NH, NG = heads
    gen = torch.Generator().manual_seed(batch.seed)
    rows = batch.rows
    layer = mamba2_layer(gen, NH)
    pools, after, g_end = committed_start(gen, [r.buffered for r in rows], [r.has_state for r in rows],
                                          batch.capacity, NH, NG, layer)
    parents, num_nodes = batch.tensors()
    tokens = [pad_nodes(z, num_nodes) for z in mamba2_tokens(gen, len(rows), batch.num_tokens, NH, NG)]
    y, xdt, gcum = mamba2_verify_ref(*inputs(tokens, layer), parents, num_nodes, *pools.args())

    x, dt = tokens[:2]
    for b, row in enumerate(rows):
        for j in range(row.num_nodes):
            path = root_path(row.parents, j)
            assert_close(y[b, j], run_path(after[b], [z[b] for z in tokens], path, layer))
            assert_close(xdt[b, j], dt[b, j, :, None] * x[b, j])
            assert_close(gcum[b, j], g_end[b] + (dt[b, path] * layer[0]).sum(0))
        padding = slice(row.num_nodes, None)
        assert not y[b, padding].any() and not xdt[b, padding].any() and not gcum[b, padding].any()


def test_verify_single_node_equals_decode():
    gen = torch.Generator().manual_seed(3)
    NH, NG = HEADS["g3"]
    layer = mamba2_layer(gen, NH)
    pools, _, _ = committed_start(gen, [3, 0, 5], [True, False, False], 8, NH, NG, layer)
    tokens = mamba2_tokens(gen, 3, 1, NH, NG)
    ones = torch.ones(3, dtype=torch.long)
    verified = mamba2_verify_ref(*inputs(tokens, layer), chain_parents(3, 1), ones, *pools.args())
    decoded = mamba2_decode_ref(*inputs([z[:, 0] for z in tokens], layer), *pools.args())
    for v, d in zip(verified, decoded, strict=True):
        assert_close(v[:, 0], d)


# node j's parent; the accepted paths below are root paths of this tree
TREE = [-1, 0, 0, 1, 3, 2, -1, 4]
COMMITS = {
    # flush_length, accepted path per row: row 0 starts with 3 buffered entries and a state, row 1 fresh
    "no-fold": (16, [[0, 1, 3, 4], [6]]),
    "fold-one-row": (6, [[0, 1, 3], [0, 2, 5]]),
    "fold-long-path": (4, [[0, 1, 3, 4, 7], [0, 1, 3, 4, 7]]),
    "nothing-accepted": (5, [[], [0, 2]]),
}


@pytest.mark.parametrize("case", COMMITS.values(), ids=COMMITS.keys())
def test_commit_then_decode_matches_recurrence(case):
    flush_length, paths = case
    gen = torch.Generator().manual_seed(4)
    NH, NG = HEADS["g2"]
    layer = mamba2_layer(gen, NH)
    pools, after, _ = committed_start(gen, [3, 0], [True, False], 16, NH, NG, layer)
    T = len(TREE)
    parents, num_nodes = torch.tensor([TREE, TREE]), torch.tensor([T, T])
    tree_tokens = mamba2_tokens(gen, 2, T, NH, NG)
    _, xdt, gcum = mamba2_verify_ref(*inputs(tree_tokens, layer), parents, num_nodes, *pools.args())

    accepted = torch.full((2, T), -1)
    for b, path in enumerate(paths):
        accepted[b, : len(path)] = torch.tensor(path, dtype=torch.long)
    num_accepted = torch.tensor([len(p) for p in paths])
    pools.before_commit(num_accepted, flush_length)
    entries = (tree_tokens[2], xdt, gcum)                                   # Bm is the key-like entry
    flushed = mamba2_commit_ref(*entries, accepted, num_accepted, *pools.args(), flush_length)
    assert flushed.tolist() == [3 + len(paths[0]) >= flush_length, len(paths[1]) >= flush_length]
    pools.after_commit(num_accepted, flushed)

    new_tokens = mamba2_tokens(gen, 2, 7, NH, NG)
    outputs = decode_chain(pools, new_tokens, layer, flush_length)
    states = flush(pools)
    for b, path in enumerate(paths):
        # the recurrence over the committed tokens, then the accepted path, then the new tokens
        tokens = [torch.cat([z[b, path], w[b]])[None] for z, w in zip(tree_tokens, new_tokens, strict=True)]
        y_ref, s_ref = mamba2_recurrent_ref(*inputs(tokens, layer), after[b][None])
        assert_close(outputs[b], y_ref[0, len(path):])
        assert_close(states[b], s_ref[0])


def test_strong_decay_stays_finite():
    """Per-token log decays dt A down to -50 over 70+ tokens: no NaN / inf in outputs, entries or states."""
    gen = torch.Generator().manual_seed(5)
    NH, NG = HEADS["g2"]
    T = 70
    layer = mamba2_layer(gen, NH, max_decay=50.0)
    layer[0][0] = -50.0                                                     # dt = 1 gives a = -50 exactly
    tokens = mamba2_tokens(gen, 2, T, NH, NG)
    tokens[1][:, ::7] = 1.0
    s0 = torch.randn(2, NH, P, N, generator=gen)
    y_ref, s_ref = mamba2_recurrent_ref(*inputs(tokens, layer), s0)
    y_chunk, s_chunk = mamba2_chunk_prefill_ref(*inputs(tokens, layer), s0, chunk_size=64)
    assert_close(y_chunk, y_ref, tol=1e-4)
    assert_close(s_chunk, s_ref, tol=1e-4)

    # a buffer of 63 strongly decayed entries (gcum far below -1000), then a chain verify on top of it
    pools, after, _ = committed_start(gen, [63, 63], [True, False], 64, NH, NG, layer)
    y, xdt, gcum = mamba2_verify_ref(*inputs(tokens, layer), chain_parents(2, T), torch.tensor([T, T]),
                                     *pools.args())
    for z in (y, xdt, gcum):
        assert torch.isfinite(z).all()
    assert_close(y, mamba2_recurrent_ref(*inputs(tokens, layer), torch.stack(after))[0], tol=1e-4)
    outputs = decode_chain(pools, tokens, layer, 64)
    assert_close(outputs, y, tol=1e-4)
    assert torch.isfinite(flush(pools)).all()


def test_short_context_never_reads_the_state_pool():
    gen = torch.Generator().manual_seed(6)
    NH, NG = HEADS["g1"]
    layer = mamba2_layer(gen, NH)
    pools, after, _ = committed_start(gen, [0, 4], [False, False], 16, NH, NG, layer)
    pools.state_pool.fill_(NAN)
    tokens = mamba2_tokens(gen, 2, 6, NH, NG)
    chain = chain_parents(2, 6), torch.tensor([6, 6])
    y, _, _ = mamba2_verify_ref(*inputs(tokens, layer), *chain, *pools.args())
    decoded = decode_chain(pools, tokens, layer, 16)                        # 4 + 6 < 16: never flushes
    assert (pools.state_slots == -1).all()
    y_ref, _ = mamba2_recurrent_ref(*inputs(tokens, layer), torch.stack(after))  # from zero, then the buffer
    assert_close(y, y_ref)
    assert_close(decoded, y_ref)


def test_padding_nodes_do_not_leak():
    gen = torch.Generator().manual_seed(7)
    NH, NG = HEADS["g2"]
    layer = mamba2_layer(gen, NH)
    pools, _, _ = committed_start(gen, [2, 2], [True, True], 8, NH, NG, layer)
    tokens = mamba2_tokens(gen, 2, 6, NH, NG)
    parents = torch.tensor([[-1, 0, 1, 1, 0, 2], [-1, 0, 1, 1, 0, 2]])
    full = mamba2_verify_ref(*inputs(tokens, layer), parents, torch.tensor([6, 6]), *pools.args())
    # row 1 keeps 3 nodes; its padding holds NaN inputs and out-of-range parents
    num_nodes = torch.tensor([6, 3])
    padded_parents = torch.where(torch.arange(6) < num_nodes[:, None], parents, 99)
    padded = [pad_nodes(z, num_nodes) for z in tokens]
    out = mamba2_verify_ref(*inputs(padded, layer), padded_parents, num_nodes, *pools.args())
    for z, ref in zip(out, full, strict=True):
        assert_close(z[0], ref[0])
        assert_close(z[1, :3], ref[1, :3])
        assert not z[1, 3:].any()


def test_commit_and_flush_need_a_state_slot_to_fold():
    gen = torch.Generator().manual_seed(8)
    NH, NG = HEADS["g1"]
    layer = mamba2_layer(gen, NH)
    pools, _, _ = committed_start(gen, [2], [False], 4, NH, NG, layer)
    _, dt, Bm, _ = mamba2_tokens(gen, 1, 2, NH, NG)
    xdt = torch.randn(1, 2, NH, P, generator=gen)
    args = (Bm, xdt, dt * layer[0], torch.tensor([[0, 1]]), torch.tensor([2]), *pools.args())
    with pytest.raises(ValueError, match="state slot"):
        mamba2_commit_ref(*args, 4)
    with pytest.raises(ValueError, match="flush_length"):
        mamba2_commit_ref(*args, 5)
    with pytest.raises(ValueError, match="state slot"):
        mamba2_flush_ref(*pools.args())
