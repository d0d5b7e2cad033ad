"""verify_kernels.conv.naive against transformers' causal_conv1d_fn run over each node's whole sequence:
the committed history, then the node's root path."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.qwen3_5.modeling_qwen3_5 import causal_conv1d_fn

from tests.reference_checks import NAN, TreeBatch, assert_close, pad_nodes, root_path, tree_batches
from verify_kernels.conv import causal_conv1d_tree_ref, conv_commit_ref, tree_conv_windows_ref
from verify_kernels.tree import chain_parents

D = 5


def conv_layer(gen, W, with_bias=True):
    """weight [D, W] and bias [D] or None."""
    bias = torch.randn(D, generator=gen) if with_bias else None
    return torch.randn(D, W, generator=gen), bias


def committed_pool(gen, histories, W):
    """conv_pool [B + 2, W - 1, D] holding the last W - 1 inputs of each history [D, n_b] (zero left padding)
    at shuffled request slots; the spare slots hold NaN. Returns the pool and req_slots [B]."""
    B = len(histories)
    req_slots = torch.randperm(B + 2, generator=gen)[:B]
    pool = torch.full((B + 2, W - 1, D), NAN)
    for b, history in enumerate(histories):
        pool[req_slots[b]] = F.pad(history, (W - 1, 0))[:, history.shape[1]:].T
    return pool, req_slots


def sequential_conv(history, x, weight, bias, activation):
    """transformers' conv over history [D, n] ++ x [m, D]: the outputs of x, [m, D]."""
    sequence = torch.cat([history, x.T], dim=1)[None]
    return causal_conv1d_fn(sequence, weight, bias, activation)[0, :, history.shape[1]:].T


@settings(max_examples=60, deadline=None)
@given(batch=tree_batches(), W=st.sampled_from([2, 4]), with_bias=st.booleans(),
       activation=st.sampled_from(["silu", None]))
def test_tree_conv_matches_sequential_conv_along_root_paths(batch: TreeBatch, W, with_bias, activation):
    gen = torch.Generator().manual_seed(batch.seed)
    rows = batch.rows
    weight, bias = conv_layer(gen, W, with_bias)
    # the committed history of row b has row.buffered tokens (0 to 7: shorter and longer than W - 1)
    histories = [torch.randn(D, row.buffered, generator=gen) for row in rows]
    pool, req_slots = committed_pool(gen, histories, W)
    parents, num_nodes = batch.tensors()
    x = pad_nodes(torch.randn(len(rows), batch.num_tokens, D, generator=gen), num_nodes)
    y = causal_conv1d_tree_ref(x, parents, num_nodes, pool, req_slots, weight, bias, activation)
    for b, row in enumerate(rows):
        for j in range(row.num_nodes):
            path = root_path(row.parents, j)
            assert_close(y[b, j], sequential_conv(histories[b], x[b, path], weight, bias, activation)[-1])
        assert not y[b, row.num_nodes:].any()


def test_windows_of_a_hand_made_tree():
    #  history (1, 2, 3) ── 10 ── 11 ── 13
    #                        └─── 12
    pool = torch.tensor([[[1.0], [2.0], [3.0]]])                            # [R = 1, W - 1 = 3, D = 1]
    x = torch.tensor([[10.0, 11.0, 12.0, 13.0]])[..., None]
    windows = tree_conv_windows_ref(x, torch.tensor([[-1, 0, 0, 1]]), torch.tensor([4]), pool, torch.tensor([0]))
    assert windows[0, :, 0].tolist() == [[1, 2, 3, 10], [2, 3, 10, 11], [2, 3, 10, 12], [3, 10, 11, 13]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fresh_request_is_zero_left_padding(dtype):
    gen = torch.Generator().manual_seed(0)
    weight, bias = conv_layer(gen, 4)
    x = torch.randn(2, 9, D, generator=gen).to(dtype)
    pool = torch.zeros(2, 3, D)
    y = causal_conv1d_tree_ref(x, chain_parents(2, 9), torch.tensor([9, 9]), pool, torch.tensor([1, 0]),
                               weight, bias, "silu")
    assert y.dtype == dtype
    # transformers in fp32 over the prompt alone: zero left padding
    y_ref = causal_conv1d_fn(x.float().transpose(1, 2), weight, bias, "silu").transpose(1, 2)
    assert_close(y, y_ref.to(dtype), tol=1e-5 if dtype == torch.float32 else 1e-2)


# node j's parent; the accepted paths below are root paths of this tree
TREE = [-1, 0, 0, 1, 3, 2, -1, 4]
ACCEPTED = {
    "nothing": [],
    "two": [0, 2],
    "W-1": [0, 1, 3],
    "longer-than-W-1": [0, 1, 3, 4, 7],
}


@pytest.mark.parametrize("path", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_commit_then_next_chunk_matches_the_whole_sequence(path):
    gen = torch.Generator().manual_seed(1)
    W, T = 4, len(TREE)
    weight, bias = conv_layer(gen, W)
    # row 0 has 5 committed tokens, row 1 is fresh; both accept the same path
    histories = [torch.randn(D, 5, generator=gen), torch.zeros(D, 0)]
    pool, req_slots = committed_pool(gen, histories, W)
    spare = torch.ones(pool.shape[0], dtype=torch.bool)
    spare[req_slots] = False
    x = torch.randn(2, T, D, generator=gen)
    accepted = torch.full((2, T), -1)
    accepted[:, : len(path)] = torch.tensor(path, dtype=torch.long)
    conv_commit_ref(x, accepted, torch.tensor([len(path)] * 2), pool, req_slots)
    assert pool[spare].isnan().all()                                        # other requests untouched

    following = torch.randn(2, 6, D, generator=gen)
    y = causal_conv1d_tree_ref(following, chain_parents(2, 6), torch.tensor([6, 6]), pool, req_slots,
                               weight, bias, "silu")
    for b in range(2):
        history = torch.cat([histories[b], x[b, path].T], dim=1)
        assert_close(y[b], sequential_conv(history, following[b], weight, bias, "silu"))


def test_unknown_activation_raises():
    x, pool = torch.zeros(1, 1, D), torch.zeros(1, 3, D)
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d_tree_ref(x, chain_parents(1, 1), torch.tensor([1]), pool, torch.tensor([0]),
                               torch.zeros(D, 4), activation="gelu")
