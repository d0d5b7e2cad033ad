"""The host side of a step, on its fast paths: step batches built through arrays (host_longs) against torch.tensor of
the padded lists (and their node counts kept as Python ints), chains told from trees, a request's emission with and
without its per-token walk, and the host values mirrored on the device (DeviceMirror)."""

from __future__ import annotations

import pytest
import torch

from specdec.cache.host_buffer import DeviceMirror
from specdec.cache.step import StepBatch, host_longs
from specdec.engine.request import Request
from specdec.speculation import DraftTree, SamplingParams


def test_host_longs_shapes():
    assert host_longs([3, -1, 7]).tolist() == [3, -1, 7]
    assert host_longs([1, 2, 3, 4, 5, 6], 2, 3).tolist() == [[1, 2, 3], [4, 5, 6]]
    assert host_longs([], 4, 0).shape == (4, 0) and host_longs([]).shape == (0,)
    assert host_longs([2**40]).dtype == torch.long and host_longs([2**40]).item() == 2**40


@pytest.mark.parametrize("rows", [
    [([5, 6, 7], [-1, 0, 1]), ([1, 2, 3], [-1, 0, 1])],  # chains of one length: the parents expanded from one row
    [([5, 6, 7], [-1, 0, 1]), ([1], [-1]), ([4, 2], [-1, 0])],  # ragged chains
    [([5, 6, 7, 8], [-1, 0, 0, 1]), ([1, 2, 3, 9], [-1, 0, 1, 2])],  # a tree beside a chain of its length
    [([5, 6, 7], [-1, 0, 0]), ([1, 2], [-1, 0])],  # ragged trees
], ids=["chains", "ragged-chains", "tree-and-chain", "ragged-trees"])
def test_tree_batches_equal_the_padded_lists(rows):
    tokens, parents = [list(t) for t, _ in rows], [list(p) for _, p in rows]
    batch = StepBatch.trees(list(range(len(rows))), tokens, parents)
    width = max(len(t) for t in tokens)
    assert batch.tokens.tolist() == [t + [0] * (width - len(t)) for t in tokens]
    assert batch.parents.tolist() == [p + [-1] * (width - len(p)) for p in parents]
    assert batch.num_nodes.tolist() == [len(t) for t in tokens]
    assert batch.tokens.dtype == batch.parents.dtype == batch.num_nodes.dtype == torch.long
    assert batch.node_counts == batch.num_nodes.tolist()  # (the host's copy the step's bookkeeping reads)
    assert batch.padded_to(width + 2).node_counts == batch.node_counts
    batch.parents[0, 0] = 5  # each row its own memory (not a view of one expanded row)
    assert batch.parents[1, 0] == -1


def test_chain_and_decode_batches():
    batch = StepBatch.chains([3, 1], [[4, 5, 6], [7]], prefill=True)
    assert batch.tokens.tolist() == [[4, 5, 6], [7, 0, 0]] and batch.num_nodes.tolist() == [3, 1]
    decode = StepBatch.decode([2, 0], [9, 8])
    assert decode.tokens.tolist() == [[9], [8]] and decode.parents.tolist() == [[-1], [-1]]
    assert batch.node_counts == [3, 1] and decode.node_counts == [1, 1]


def test_batches_built_from_tensors_read_and_check_their_counts():
    tokens, parents = torch.zeros(2, 3, dtype=torch.long), torch.tensor([[-1, 0, 1], [-1, 0, 1]])
    assert StepBatch([0, 1], tokens, parents, torch.tensor([3, 1])).node_counts == [3, 1]
    for counts in ([0, 1], [4, 1]):  # a row without nodes; more nodes than columns
        with pytest.raises(ValueError, match=r"num_nodes must lie in \[1, 3\]"):
            StepBatch([0, 1], tokens, parents, torch.tensor(counts))
    with pytest.raises(ValueError, match="appears twice"):
        StepBatch([1, 1], tokens, parents, torch.tensor([1, 1]))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the pinned staging path needs a CUDA device"))])
def test_device_mirror_follows_the_host_values(device):
    mirror = DeviceMirror(5, 0, torch.device(device))
    assert mirror.device_values.tolist() == [0] * 5
    for step in range(4):  # syncs back to back: each staging tensor refilled only after its copy ran
        mirror.values[step] = 10 + step
        mirror.values[4] = step
        mirror.sync()
    assert mirror.device_values.tolist() == [10, 11, 12, 13, 3]


def test_chains_are_told_from_trees():
    assert DraftTree.chain(1, [2, 3]).is_chain and DraftTree([1], [-1]).is_chain
    assert not DraftTree([1, 2, 3], [-1, 0, 0]).is_chain
    with pytest.raises(ValueError, match="parents must be -1"):
        DraftTree([1, 2], [0, 0])


@pytest.mark.parametrize("tokens, eos, limit, kept, reason", [
    ([4, 5, 6], (), 10, [4, 5, 6], None),  # the fast path: all kept, the request goes on
    ([4, 5, 6], (5,), 10, [4, 5], "eos"),  # stops at its end-of-sequence token
    ([4, 5, 6], (), 5, [4, 5, 6], "length"),  # exactly reaches max_new_tokens
    ([4, 5, 6], (), 4, [4, 5], "length"),  # cut at max_new_tokens
], ids=["kept", "eos", "reaches-limit", "cut-at-limit"])
def test_request_emission(tokens, eos, limit, kept, reason):
    request = Request(0, [1, 2], SamplingParams(), limit, frozenset(eos))
    request.emit([9, 9])
    assert request.emit(list(tokens)) == kept
    assert request.output == [9, 9, *kept] and request.tokens == [1, 2, 9, 9, *kept]
    assert request.finish_reason == reason
