"""EAGLE-2 dynamic trees: reranking keeps the best nodes and their parents; only drafters that score their drafts
may draft them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drafters import NgramDrafter
from drafters.dynamic_tree import best_nodes, prune
from specdec.cache.spec import CacheConfig
from specdec.engine.engine import Engine, EngineConfig
from specdec.models import load_model
from specdec.speculation import DraftTree, TreeShape
from tests.tiny_models import qwen35_text_config, save_tiny


@st.composite
def scored_trees(draw):
    """A random tree whose scores are cumulative log-probabilities (each child <= its parent)."""
    size = draw(st.integers(2, 40))
    parents, scores = [-1], [0.0]
    for node in range(1, size):
        parent = draw(st.integers(0, node - 1))
        parents.append(parent)
        scores.append(scores[parent] + math.log(draw(st.floats(0.01, 1.0))))
    return DraftTree(list(range(100, 100 + size)), parents), scores, draw(st.integers(1, size + 3))


@settings(max_examples=200, deadline=None)
@given(scored_trees())
def test_reranking_keeps_the_best_nodes_with_their_parents(case):
    tree, scores, budget = case
    keep = best_nodes(scores, budget)
    assert keep[0] == 0 and keep == sorted(keep) and len(keep) == min(budget, len(tree) - 1) + 1
    dropped = set(range(1, len(tree))) - set(keep)
    assert all(scores[k] >= scores[d] for k in keep[1:] for d in dropped)
    pruned = prune(tree, keep)
    assert pruned.tokens == [tree.tokens[j] for j in keep]
    for i, node in enumerate(keep[1:], start=1):  # same parent token, parents before children
        assert pruned.parents[i] < i and pruned.tokens[pruned.parents[i]] == tree.tokens[tree.parents[node]]


def test_dynamic_trees_need_a_drafter_that_scores_its_drafts(tmp_path):
    save_tiny(qwen35_text_config(), tmp_path, seed=1)
    model = load_model(tmp_path, device="cpu")
    with pytest.raises(ValueError, match="dynamic trees need"):
        Engine(model, NgramDrafter(), EngineConfig(cache=CacheConfig(max_requests=1),
                                                  shape=TreeShape(steps=3, topk=2, dynamic=True), speculation="fixed"))


def test_a_dynamic_tree_too_large_for_the_drafter_is_refused_before_any_work(tmp_path):
    from drafters import MtpDrafter
    from tests.tiny_models import save_tiny_with_mtp

    save_tiny_with_mtp(qwen35_text_config(), tmp_path, seed=2)
    model = load_model(tmp_path, device="cpu")
    cache = CacheConfig(max_requests=1)
    with pytest.raises(ValueError, match="lower --num-steps or --topk"):
        Engine(model, MtpDrafter(model, cache), EngineConfig(cache=cache, shape=TreeShape(steps=8, topk=8,
                                                                                          dynamic=True),
                                                                                          speculation="fixed"))
    Engine(model, MtpDrafter(model, cache), EngineConfig(cache=cache, shape=TreeShape(steps=5, topk=8, max_tokens=63,
                                                                                      dynamic=True),
                                                                                      speculation="fixed"))
    with pytest.raises(ValueError, match="more than the 63 a step verifies"):  # the verify kernels' 64 nodes
        Engine(model, MtpDrafter(model, cache), EngineConfig(cache=cache, shape=TreeShape(steps=5, topk=8,
                                                                                          max_tokens=64, dynamic=True),
                                                                                          speculation="fixed"))


def test_dynamic_budget_defaults_to_steps_times_topk():
    assert TreeShape(steps=3, topk=4, dynamic=True).budget == 12
    assert TreeShape(steps=3, topk=4, max_tokens=7, dynamic=True).budget == 7
