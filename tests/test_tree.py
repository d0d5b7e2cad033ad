"""verify_kernels.tree: ancestor masks, depths and root-path sums on hand-made and random trees."""

import pytest
import torch
from hypothesis import given, settings

from tests.reference_checks import NAN, PADDING_PARENT, TreeBatch, root_path, tree_batches
from verify_kernels.tree import ancestor_mask, chain_parents, check_tree, node_depths, tree_cumsum

#        0 ── 1 ── 3
#  end ─┤└─── 2
#        4 ── 5
TREE = [-1, 0, 0, 1, -1, 4]
TREE_MASK = [
    [1, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0],
    [1, 0, 1, 0, 0, 0],
    [1, 1, 0, 1, 0, 0],
    [0, 0, 0, 0, 1, 0],
    [0, 0, 0, 0, 1, 1],
]


def test_ancestor_mask_and_depths_of_a_hand_made_tree():
    parents, num_nodes = torch.tensor([TREE]), torch.tensor([6])
    assert ancestor_mask(parents, num_nodes).tolist() == [[[bool(m) for m in row] for row in TREE_MASK]]
    assert node_depths(parents, num_nodes).tolist() == [[0, 1, 1, 2, 0, 1]]


def test_padding_nodes_are_outside_every_tree():
    # row 1 keeps nodes 0..2 of the same tree; its padding parents are garbage
    parents = torch.tensor([TREE, TREE[:3] + [PADDING_PARENT, -7, 5]])
    num_nodes = torch.tensor([6, 3])
    mask = ancestor_mask(parents, num_nodes)
    assert mask[0].tolist() == [[bool(m) for m in row] for row in TREE_MASK]
    assert mask[1, :3, :3].tolist() == [[bool(m) for m in row[:3]] for row in TREE_MASK[:3]]
    assert not mask[1, 3:].any() and not mask[1, :, 3:].any()
    assert node_depths(parents, num_nodes).tolist() == [[0, 1, 1, 2, 0, 1], [0, 1, 1, 0, 0, 0]]


def test_empty_tree():
    parents, num_nodes = torch.tensor([[PADDING_PARENT] * 3]), torch.tensor([0])
    assert not ancestor_mask(parents, num_nodes).any()
    assert not node_depths(parents, num_nodes).any()


def test_chain_parents_give_a_lower_triangular_mask():
    parents = chain_parents(2, 5)
    assert parents.dtype == torch.int64
    assert parents.tolist() == [[-1, 0, 1, 2, 3]] * 2
    mask = ancestor_mask(parents, torch.tensor([5, 5]))
    assert torch.equal(mask, torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 5, 5))
    assert node_depths(parents, torch.tensor([5, 5])).tolist() == [[0, 1, 2, 3, 4]] * 2


def test_tree_cumsum_sums_along_root_paths_from_the_initial_value():
    parents, num_nodes = torch.tensor([TREE, TREE]), torch.tensor([6, 2])
    x = torch.tensor([[1.0, 2.0, 4.0, 8.0, 16.0, 32.0], [1.0, 2.0, NAN, NAN, NAN, NAN]])[..., None]
    initial = torch.tensor([[100.0], [-1.0]])
    out = tree_cumsum(x, parents, num_nodes, initial)
    assert out[..., 0].tolist() == [[101, 103, 105, 111, 116, 148], [0, 2, 0, 0, 0, 0]]


@settings(max_examples=60, deadline=None)
@given(batch=tree_batches(max_nodes=16))
def test_ancestor_mask_matches_root_paths(batch: TreeBatch):
    parents, num_nodes = batch.tensors()
    mask = ancestor_mask(parents, num_nodes)
    depths = node_depths(parents, num_nodes)
    for b, row in enumerate(batch.rows):
        for j in range(batch.num_tokens):
            path = root_path(row.parents, j) if j < row.num_nodes else []
            assert mask[b, j].nonzero()[:, 0].tolist() == path
            assert depths[b, j] == max(len(path) - 1, 0)


BAD_TREES = {
    "parent-is-itself": ([[-1, 1]], [2], r"parents\[0, 1\] = 1 is not in \[-1, 1\)"),
    "parent-in-the-future": ([[-1, 0, 3, 0]], [4], r"parents\[0, 2\] = 3"),
    "parent-below-minus-one": ([[-1, -2]], [2], r"parents\[0, 1\] = -2"),
    "root-with-a-parent": ([[0, 0]], [2], r"parents\[0, 0\] = 0"),
    "bad-row-in-batch": ([[-1, 0], [-1, 5]], [2, 2], r"parents\[1, 1\] = 5"),
    "too-many-nodes": ([[-1, 0]], [3], "num_nodes must be in"),
    "negative-num-nodes": ([[-1, 0]], [-1], "num_nodes must be in"),
    "parents-not-2d": ([-1, 0], [2], "expected parents"),
}


@pytest.mark.parametrize("parents, num_nodes, message", BAD_TREES.values(), ids=BAD_TREES.keys())
def test_bad_trees_raise(parents, num_nodes, message):
    parents, num_nodes = torch.tensor(parents), torch.tensor(num_nodes)
    with pytest.raises(ValueError, match=message):
        check_tree(parents, num_nodes)
    with pytest.raises(ValueError, match=message):
        ancestor_mask(parents, num_nodes)
