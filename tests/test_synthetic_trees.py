"""Synthetic static trees (specdec/eval/synthetic.py, `--draft synthetic:MEAN[:SIBLING] --topk K`): the tree the
drafter proposes is the one the real drafters grow for the shape, a tree keeps at the same text position everything
the chain keeps and more, its mean kept length is the one the rank model gives, and the engine accepts what the
acceptance forces."""

from __future__ import annotations

import pytest
import torch

from drafters.base import DraftRequest
from drafters.draft_model import expand_level
from specdec.eval.synthetic import SyntheticAcceptance, SyntheticDrafter, ranked_child, synthetic_speculation
from specdec.speculation import DraftTree, SamplingParams, TreeShape
from specdec.speculation.tree import static_tree_parents

SHAPES = [TreeShape(steps=4, topk=2, max_tokens=16), TreeShape(steps=3, topk=4, max_tokens=16),
          TreeShape(steps=3, topk=2), TreeShape(steps=5, topk=3, max_tokens=7), TreeShape(steps=4)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_static_parents_are_the_drafters_tree(shape):
    """static_tree_parents(shape) is the tree drafters/draft_model.py's expand_level grows level by level for a
    greedy request (its children in rank order), and TreeShape.depth its longest path."""
    tree, frontier = DraftTree([0], [-1], [None]), [0]
    request = DraftRequest(0, [1, 2, 3], SamplingParams(), None)
    logits = torch.randn(shape.budget + 1, 50, generator=torch.Generator().manual_seed(0))
    top = logits.topk(shape.topk, dim=-1).indices.tolist()
    for _ in range(shape.steps):
        frontier = [child for _, child in expand_level(tree, frontier, logits, top, shape, request)]
    assert tree.parents == static_tree_parents(shape) and len(tree) == shape.budget + 1
    depth = [0] * len(tree)
    for node in range(1, len(tree)):
        depth[node] = depth[tree.parents[node]] + 1
    assert shape.depth == max(depth)


def test_ranked_child_gives_each_rank_its_probability():
    draws = [(i + 0.5) / 100000 for i in range(100000)]  # uniform
    ranks = [ranked_child(u, 0.6, 0.5, 3) for u in draws]
    share = {rank: ranks.count(rank) / len(ranks) for rank in (0, 1, 2, None)}
    assert share[0] == pytest.approx(0.6, abs=1e-4) and share[1] == pytest.approx(0.2, abs=1e-4)
    assert share[2] == pytest.approx(0.1, abs=1e-4) and share[None] == pytest.approx(0.1, abs=1e-4)
    assert ranked_child(0.7, 0.6, 0.5, 1) is None  # a lone child: kept as a chain's draft is, or not at all


def expected_kept(shape: TreeShape, alpha: float, sibling: float) -> float:
    """The exact mean tokens a step (the bonus included) of a static tree under the rank model."""
    parents = static_tree_parents(shape)
    kids = [[child for child in range(len(parents)) if parents[child] == node] for node in range(len(parents))]

    def below(node):
        total = 0.0
        for rank, child in enumerate(kids[node]):
            p = alpha if rank == 0 else (1 - alpha) * sibling * (1 - sibling) ** (rank - 1)
            total += p * (1 + below(child))
        return total

    return 1 + below(0)


@pytest.mark.parametrize("shape", SHAPES[:3], ids=str)
def test_a_tree_keeps_what_the_chain_keeps_and_more(shape):
    """Paired by text position: the tree's path follows the chain's kept drafts through its first-ranked children
    and may go on past them; over many texts its mean is the rank model's (the chain's stays the mean asked for)."""
    chain_shape = TreeShape(steps=shape.depth)
    trees, chains = [], []
    for text in range(3000):
        tokens = [text] * 20 + list(range(30))
        for chosen, out in ((shape, trees), (chain_shape, chains)):
            drafter, acceptance = synthetic_speculation("synthetic:2.9:0.4", depth=shape.depth)
            (tree,) = drafter.propose([DraftRequest(0, tokens, SamplingParams(), None)], chosen)
            path = acceptance.forced_path(tree)
            # a path from the root: each node the child of the one before
            assert all(tree.parents[b] == a for a, b in zip(path, path[1:], strict=False))
            out.append((tree, path))
    for (tree, path), (_, chain_path) in zip(trees, chains, strict=True):
        kept = len(chain_path) - 1
        first_ranked = [0]
        while len(first_ranked) <= kept:
            first_ranked.append(tree.child_lists()[first_ranked[-1]][0])
        assert path[:kept + 1] == first_ranked and len(path) >= len(chain_path)
    alpha = SyntheticAcceptance(2.9).alpha(shape.depth)
    assert sum(len(p) for _, p in chains) / len(chains) == pytest.approx(2.9, abs=0.07)
    assert sum(len(p) for _, p in trees) / len(trees) == pytest.approx(expected_kept(shape, alpha, 0.4), abs=0.07)


def test_no_sibling_acceptance_keeps_the_chain():
    shape = TreeShape(steps=4, topk=2, max_tokens=16)
    for text in range(200):
        tokens = [text] * 20
        got = []
        for chosen in (shape, TreeShape(steps=4)):
            drafter, acceptance = synthetic_speculation("synthetic:2.5:0", depth=4)
            (tree,) = drafter.propose([DraftRequest(0, tokens, SamplingParams(), None)], chosen)
            got.append(len(acceptance.forced_path(tree)))
        assert got[0] == got[1]


def test_bad_synthetic_trees_are_refused():
    with pytest.raises(ValueError, match=r"e.g. synthetic:2.9 or synthetic:2.9:0.5"):
        synthetic_speculation("synthetic:2.9:often")
    with pytest.raises(ValueError, match=r"a sibling's acceptance lies in \[0, 1\], got 1.5"):
        synthetic_speculation("synthetic:2.9:1.5")
    with pytest.raises(ValueError, match="drop --dynamic-tree"):
        SyntheticDrafter(2.9).check_shape(TreeShape(steps=4, topk=2, dynamic=True))


def test_the_engine_accepts_what_a_synthetic_tree_forces():
    from specdec.api import LLM
    from specdec.engine.engine import EngineConfig

    config = EngineConfig.from_flags(max_batch=4, max_seq_len=256, topk=2, num_draft_tokens=16, speculation="fixed")
    drafter, acceptance = synthetic_speculation("synthetic:3.0:0.5", config.shape.depth)
    llm = LLM("qwen3.5", drafter, device="cpu", config=config, acceptance=acceptance)
    outputs = llm.generate(["a", "b", "c", "d"], max_new_tokens=100)
    steps = [n for out in outputs for n in out.stats.emitted_per_step]
    alpha = SyntheticAcceptance(3.0).alpha(4)
    assert sum(steps) / len(steps) == pytest.approx(expected_kept(config.shape, alpha, 0.5), abs=0.35)
    assert max(steps) == 5  # a path of the tree's 4 levels and the bonus


def test_the_synthetic_acceptance_hands_the_commit_each_trees_own_path():
    """A kept path that leaves a tree's first nodes (a later sibling kept) reaches the engine as the tree's node
    indices, each the child of the one before, with the bonus read after its last node (it was committed as nodes
    0..kept, the first nodes whatever was kept, and a tree step's outcome could not be read from it)."""
    shape = TreeShape(steps=4, topk=2, max_tokens=16)
    parents = static_tree_parents(shape)
    trees = [DraftTree(list(range(len(parents))), parents) for _ in range(64)]
    logits = torch.randn(64, len(parents), 11)
    results = SyntheticAcceptance(2.5, seed=1, depth=4, sibling=0.9).accept(trees, logits, [SamplingParams()] * 64,
                                                                             [None] * 64)
    assert any(path != list(range(len(path))) for path, _ in results)  # (siblings kept at 0.9: some row did)
    for row, (path, bonus) in enumerate(results):
        assert path[0] == 0 and all(parents[b] == a for a, b in zip(path, path[1:], strict=False))
        assert bonus == int(logits[row, path[-1]].argmax())
