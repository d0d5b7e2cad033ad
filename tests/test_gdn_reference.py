"""verify_kernels.gdn.naive against the plain gated delta rule: transformers' recurrence is the outside oracle
for ours; the chunked prefill and every KVBuffer path (decode, tree verify, commit, flush) must equal our
recurrence run along the same tokens from the same committed state."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.qwen3_5.modeling_qwen3_5 import l2norm, torch_recurrent_gated_delta_rule

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
from verify_kernels.gdn import (
    gdn_chunk_prefill_ref,
    gdn_commit_ref,
    gdn_decode_ref,
    gdn_flush_ref,
    gdn_recurrent_ref,
    gdn_verify_ref,
)
from verify_kernels.tree import chain_parents

K, V = 8, 6
# (H, HV): value heads per key head 1, 2, 3
HEADS = {"hv1": (2, 2), "hv2": (1, 2), "hv3": (2, 6)}


def gdn_tokens(gen, B, T, H, HV, max_decay=2.0):
    """Model-like inputs: q, k [B, T, H, K] l2-normalised (q scaled by K**-0.5), v [B, T, HV, V],
    g [B, T, HV] in [-max_decay, 0], beta [B, T, HV] in (0, 1)."""
    q = l2norm(torch.randn(B, T, H, K, generator=gen)) * K**-0.5
    k = l2norm(torch.randn(B, T, H, K, generator=gen))
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -max_decay * torch.rand(B, T, HV, generator=gen)
    beta = torch.rand(B, T, HV, generator=gen)
    return q, k, v, g, beta


def delta_u(state, k, v, g, beta):
    """The u one recurrence step writes: beta (v - e^g S^T k).

    state [HV, K, V], k [H, K], v [HV, V], g and beta [HV]."""
    k = k.repeat_interleave(v.shape[0] // k.shape[0], dim=0)
    return beta[:, None] * (v - g.exp()[:, None] * torch.einsum("hkv,hk->hv", state, k))


def run_path(state, tokens, path):
    """Our recurrence from `state` [HV, K, V] along tokens[path] of one row (q, k, v, g, beta [T, ...]).
    Returns the last token's o and u and the state before it."""
    q, k, v, g, beta = (x[path][None] for x in tokens)
    _, before = gdn_recurrent_ref(q[:, :-1], k[:, :-1], v[:, :-1], g[:, :-1], beta[:, :-1], state[None])
    o, _ = gdn_recurrent_ref(q[:, -1:], k[:, -1:], v[:, -1:], g[:, -1:], beta[:, -1:], before)
    return o[0, -1], delta_u(before[0], k[0, -1], v[0, -1], g[0, -1], beta[0, -1]), before[0]


def committed_start(gen, buffered, has_state, capacity, H, HV, max_decay=2.0):
    """Pools where row b has a committed state (or none) and buffered[b] entries written by the recurrence.

    Returns the pools and, per row, the state after the buffered tokens (what the recurrence would hold) and
    the gcum of the last buffered token."""
    states, entries, after, g_end = [], [], [], []
    for n, has in zip(buffered, has_state, strict=True):
        s0 = torch.randn(HV, K, V, generator=gen) if has else None
        history = gdn_tokens(gen, 1, n, H, HV, max_decay)
        _, k, v, g, beta = (x[0] for x in history)
        state = torch.zeros(1, HV, K, V) if s0 is None else s0[None]
        u = []
        for t in range(n):
            u.append(delta_u(state[0], k[t], v[t], g[t], beta[t]))
            _, state = gdn_recurrent_ref(*(x[:, t : t + 1] for x in history), state)
        states.append(s0)
        entries.append((k, torch.stack(u) if u else torch.zeros(0, HV, V), g.cumsum(0)))
        after.append(state[0])
        g_end.append(g.sum(0))
    pools = make_pools(gen, states, entries, capacity, (HV, K, V), ((H, K), (HV, V), (HV,)))
    return pools, after, g_end


def decode_chain(pools: Pools, tokens, flush_length):
    """Decode tokens [B, n, ...] one at a time, each committed as a one-node path with the caller's
    bookkeeping. Returns the outputs [B, n, HV, V]."""
    q, k, v, g, beta = tokens
    B = q.shape[0]
    one, node0 = torch.ones(B, dtype=torch.long), torch.zeros(B, 1, dtype=torch.long)
    outputs = []
    for t in range(q.shape[1]):
        o, u, gcum = gdn_decode_ref(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], *pools.args())
        pools.before_commit(one, flush_length)
        entry = (k[:, t, None], u[:, None], gcum[:, None])
        flushed = gdn_commit_ref(*entry, node0, one, *pools.args(), flush_length)
        pools.after_commit(one, flushed)
        outputs.append(o)
    return torch.stack(outputs, 1)


def flush(pools: Pools) -> torch.Tensor:
    """Flush every row and return the committed states [B, HV, K, V]."""
    pools.before_flush()
    gdn_flush_ref(*pools.args())
    pools.buf_len[pools.req_slots] = 0
    return pools.states()


@pytest.mark.parametrize("initial", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
def test_recurrent_matches_transformers(heads, initial):
    H, HV = heads
    gen = torch.Generator().manual_seed(0)
    B, T = 2, 20
    q_raw, k_raw = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    _, _, v, g, beta = gdn_tokens(gen, B, T, H, HV)
    s0 = torch.randn(B, HV, K, V, generator=gen) if initial else None
    # transformers l2-normalises q, k itself and always scales q by K**-0.5; we take both done. It gets the key
    # heads already repeated to the value heads: some releases (5.17) do not group heads in this function.
    q_hf, k_hf = (x.repeat_interleave(HV // H, dim=2) for x in (q_raw, k_raw))
    o_hf, s_hf = torch_recurrent_gated_delta_rule(q_hf, k_hf, v, g, beta, initial_state=s0,
                                                  output_final_state=True, use_qk_l2norm_in_kernel=True)
    o, s = gdn_recurrent_ref(l2norm(q_raw) * K**-0.5, l2norm(k_raw), v, g, beta, s0)
    assert_close(o, o_hf)
    assert_close(s, s_hf)


@pytest.mark.parametrize("initial", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
@pytest.mark.parametrize("chunk_size", [16, 64], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("T", [1, 5, 63, 64, 65, 130], ids=lambda t: f"T{t}")
def test_chunk_prefill_matches_recurrent(T, chunk_size, heads, initial):
    H, HV = heads
    gen = torch.Generator().manual_seed(T)
    tokens = gdn_tokens(gen, 2, T, H, HV)
    s0 = torch.randn(2, HV, K, V, generator=gen) if initial else None
    o_ref, s_ref = gdn_recurrent_ref(*tokens, s0)
    o, s = gdn_chunk_prefill_ref(*tokens, s0, chunk_size=chunk_size)
    assert_close(o, o_ref, tol=2e-5)
    assert_close(s, s_ref, tol=2e-5)


@pytest.mark.parametrize("chunk_size", [16, 64], ids=lambda c: f"chunk{c}")
def test_chunk_prefill_right_padding_leaves_state_unchanged(chunk_size):
    gen = torch.Generator().manual_seed(1)
    H, HV = HEADS["hv2"]
    T, pad = 21, 30
    q, k, v, g, beta = gdn_tokens(gen, 1, T + pad, H, HV)
    g[:, T:], beta[:, T:] = 0.0, 0.0                                        # ragged-batch right padding
    s0 = torch.randn(1, HV, K, V, generator=gen)
    o, s = gdn_chunk_prefill_ref(q, k, v, g, beta, s0, chunk_size=chunk_size)
    o_ref, s_ref = gdn_recurrent_ref(q[:, :T], k[:, :T], v[:, :T], g[:, :T], beta[:, :T], s0)
    assert_close(o[:, :T], o_ref)
    assert_close(s, s_ref)


@pytest.mark.parametrize("flush_length", [1, 3, 16], ids=lambda f: f"flush{f}")
def test_decode_chain_across_flushes_matches_recurrence(flush_length):
    gen = torch.Generator().manual_seed(flush_length)
    H, HV = HEADS["hv2"]
    # a fresh row, a row with a state, and a row with a state and buffered tokens (staggered flushes)
    buffered = [0, 0, min(2, flush_length - 1)]
    pools, after, _ = committed_start(gen, buffered, [False, True, True], 16, H, HV)
    tokens = gdn_tokens(gen, 3, 40, H, HV)
    outputs = decode_chain(pools, tokens, flush_length)
    o_ref, s_ref = gdn_recurrent_ref(*tokens, torch.stack(after))
    assert_close(outputs, o_ref)
    assert_close(flush(pools), s_ref)


@settings(max_examples=60, deadline=None)
@given(batch=tree_batches(), heads=st.sampled_from(list(HEADS.values())))
def test_verify_tree_matches_recurrence_along_root_paths(batch: TreeBatch, heads):
    H, HV = heads
    gen = torch.Generator().manual_seed(batch.seed)
    rows = batch.rows
    pools, after, g_end = committed_start(gen, [r.buffered for r in rows], [r.has_state for r in rows],
                                          batch.capacity, H, HV)
    parents, num_nodes = batch.tensors()
    tokens = [pad_nodes(x, num_nodes) for x in gdn_tokens(gen, len(rows), batch.num_tokens, H, HV)]
    o, u, gcum = gdn_verify_ref(*tokens, parents, num_nodes, *pools.args())

    for b, row in enumerate(rows):
        for j in range(row.num_nodes):
            path = root_path(row.parents, j)
            o_ref, u_ref, _ = run_path(after[b], [x[b] for x in tokens], path)
            assert_close(o[b, j], o_ref)
            assert_close(u[b, j], u_ref)
            assert_close(gcum[b, j], g_end[b] + tokens[3][b, path].sum(0))
        padding = slice(row.num_nodes, None)
        assert not o[b, padding].any() and not u[b, padding].any() and not gcum[b, padding].any()


def test_verify_single_node_equals_decode():
    gen = torch.Generator().manual_seed(2)
    H, HV = HEADS["hv3"]
    pools, _, _ = committed_start(gen, [3, 0, 5], [True, False, False], 8, H, HV)
    tokens = gdn_tokens(gen, 3, 1, H, HV)
    o, u, gcum = gdn_verify_ref(*tokens, chain_parents(3, 1), torch.ones(3, dtype=torch.long), *pools.args())
    o_dec, u_dec, gcum_dec = gdn_decode_ref(*(x[:, 0] for x in tokens), *pools.args())
    assert_close(o[:, 0], o_dec)
    assert_close(u[:, 0], u_dec)
    assert_close(gcum[:, 0], gcum_dec)


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
    gen = torch.Generator().manual_seed(3)
    H, HV = HEADS["hv2"]
    pools, after, _ = committed_start(gen, [3, 0], [True, False], 16, H, HV)
    T = len(TREE)
    parents, num_nodes = torch.tensor([TREE, TREE]), torch.tensor([T, T])
    tree_tokens = gdn_tokens(gen, 2, T, H, HV)
    _, u, gcum = gdn_verify_ref(*tree_tokens, parents, num_nodes, *pools.args())

    accepted = torch.full((2, T), -1)
    for b, path in enumerate(paths):
        accepted[b, : len(path)] = torch.tensor(path, dtype=torch.long)
    num_accepted = torch.tensor([len(p) for p in paths])
    pools.before_commit(num_accepted, flush_length)
    flushed = gdn_commit_ref(tree_tokens[1], u, gcum, accepted, num_accepted, *pools.args(), flush_length)
    assert flushed.tolist() == [3 + len(paths[0]) >= flush_length, len(paths[1]) >= flush_length]
    pools.after_commit(num_accepted, flushed)

    new_tokens = gdn_tokens(gen, 2, 7, H, HV)
    outputs = decode_chain(pools, new_tokens, flush_length)
    states = flush(pools)
    for b, path in enumerate(paths):
        # the recurrence over the committed tokens, then the accepted path, then the new tokens
        tokens = [torch.cat([x[b, path], y[b]])[None] for x, y in zip(tree_tokens, new_tokens, strict=True)]
        o_ref, s_ref = gdn_recurrent_ref(*tokens, after[b][None])
        assert_close(outputs[b], o_ref[0, len(path):])
        assert_close(states[b], s_ref[0])


def test_strong_decay_stays_finite():
    """Per-token log decays down to -50 over 70+ tokens: no NaN / inf in outputs, entries or states."""
    gen = torch.Generator().manual_seed(4)
    H, HV = HEADS["hv2"]
    T = 70
    tokens = gdn_tokens(gen, 2, T, H, HV, max_decay=50.0)
    tokens[3][:, ::7] = -50.0
    s0 = torch.randn(2, HV, K, V, generator=gen)
    o_ref, s_ref = gdn_recurrent_ref(*tokens, s0)
    o_chunk, s_chunk = gdn_chunk_prefill_ref(*tokens, s0, chunk_size=64)
    assert_close(o_chunk, o_ref, tol=1e-4)
    assert_close(s_chunk, s_ref, tol=1e-4)

    # a buffer of 63 strongly decayed entries (gcum down to about -1600), then a chain verify on top of it
    pools, after, _ = committed_start(gen, [63, 63], [True, False], 64, H, HV, max_decay=50.0)
    o, u, gcum = gdn_verify_ref(*tokens, chain_parents(2, T), torch.tensor([T, T]), *pools.args())
    for x in (o, u, gcum):
        assert torch.isfinite(x).all()
    assert_close(o, gdn_recurrent_ref(*tokens, torch.stack(after))[0], tol=1e-4)
    outputs = decode_chain(pools, tokens, 64)
    assert_close(outputs, o, tol=1e-4)
    assert torch.isfinite(flush(pools)).all()


def test_short_context_never_reads_the_state_pool():
    gen = torch.Generator().manual_seed(5)
    H, HV = HEADS["hv1"]
    pools, after, _ = committed_start(gen, [0, 4], [False, False], 16, H, HV)
    pools.state_pool.fill_(NAN)
    tokens = gdn_tokens(gen, 2, 6, H, HV)
    o, _, _ = gdn_verify_ref(*tokens, chain_parents(2, 6), torch.tensor([6, 6]), *pools.args())
    decoded = decode_chain(pools, tokens, 16)                               # 4 + 6 < 16: never flushes
    assert (pools.state_slots == -1).all()
    o_ref, _ = gdn_recurrent_ref(*tokens, torch.stack(after))             # from zero, then the buffer
    assert_close(o, o_ref)
    assert_close(decoded, o_ref)


def test_padding_nodes_do_not_leak():
    gen = torch.Generator().manual_seed(6)
    H, HV = HEADS["hv2"]
    pools, _, _ = committed_start(gen, [2, 2], [True, True], 8, H, HV)
    tokens = gdn_tokens(gen, 2, 6, H, HV)
    parents = torch.tensor([[-1, 0, 1, 1, 0, 2], [-1, 0, 1, 1, 0, 2]])
    o_full, u_full, g_full = gdn_verify_ref(*tokens, parents, torch.tensor([6, 6]), *pools.args())
    # row 1 keeps 3 nodes; its padding holds NaN inputs and out-of-range parents
    num_nodes = torch.tensor([6, 3])
    padded_parents = torch.where(torch.arange(6) < num_nodes[:, None], parents, 99)
    padded = [pad_nodes(x, num_nodes) for x in tokens]
    o, u, gcum = gdn_verify_ref(*padded, padded_parents, num_nodes, *pools.args())
    for x, ref in ((o, o_full), (u, u_full), (gcum, g_full)):
        assert_close(x[0], ref[0])
        assert_close(x[1, :3], ref[1, :3])
        assert not x[1, 3:].any()


def test_commit_and_flush_need_a_state_slot_to_fold():
    gen = torch.Generator().manual_seed(7)
    H, HV = HEADS["hv1"]
    pools, _, _ = committed_start(gen, [2], [False], 4, H, HV)
    _, k, _, g, _ = gdn_tokens(gen, 1, 2, H, HV)
    u = torch.randn(1, 2, HV, V, generator=gen)
    args = (k, u, g, torch.tensor([[0, 1]]), torch.tensor([2]), *pools.args())
    with pytest.raises(ValueError, match="state slot"):
        gdn_commit_ref(*args, 4)
    with pytest.raises(ValueError, match="flush_length"):
        gdn_commit_ref(*args, 5)
    with pytest.raises(ValueError, match="state slot"):
        gdn_flush_ref(*pools.args())
