"""Adaptive speculation offering the configured tree beside the chains: the rank model's expected tokens against the
synthetic acceptance that draws trees by it (and against a chain's closed form), a dynamic tree's layout against every
tree it could be, what a verified tree teaches it, the policy choosing the tree where its width is cheap and chains
where it is dear, learning the sibling acceptance from tree steps, and the engine with a static or dynamic tree
configured: greedy outputs of the shipped Qwen3.5 pair unchanged, tree steps counted among the shapes."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import replace

import pytest

from specdec.api import LLM
from specdec.eval.synthetic import SyntheticAcceptance
from specdec.speculation import DraftTree
from specdec.speculation.adaptive import (
    AdaptiveConfig,
    AdaptivePolicy,
    PlannedStep,
    RunningAcceptance,
    StepPlan,
    TreeLayout,
    rank_outcome,
)
from specdec.speculation.adaptive.acceptance_stats import SURE_OF
from specdec.speculation.adaptive.tree_yield import SiblingAcceptance, likeliest_tree_parents
from specdec.speculation.adaptive.tuning import BORROWED_CONTENDER, CONTENDER
from specdec.speculation.tree import TreeShape, static_tree_parents
from tests.test_adaptive import NEW_TOKENS, shipped  # noqa: F401  (the module's fixture)

TREE = TreeShape(steps=4, topk=2, max_tokens=16)  # the study's tree rows (benchmarks/study.py TREE)


@pytest.mark.parametrize("shape, sibling", [(TREE, 0.5), (TREE, 0.15), (TreeShape(steps=3, topk=3), 0.3)])
def test_the_rank_model_prices_what_the_synthetic_acceptance_keeps(shape, sibling):
    """SyntheticAcceptance draws a tree's path by the rank model (one draw per level: the first-ranked child with the
    chain's alpha, a later one with `sibling` where those before it were not): its mean emitted tokens over many
    trees must meet TreeLayout's expectation."""
    acceptance = SyntheticAcceptance(2.7, seed=3, depth=shape.depth, sibling=sibling)
    parents = static_tree_parents(shape)
    tree = DraftTree(list(range(len(parents))), parents)
    draws = 40_000
    mean = sum(len(acceptance.forced_path(tree)) for _ in range(draws)) / draws
    alpha = acceptance.alpha(shape.depth)
    expected = TreeLayout.of(shape).expected_tokens([alpha] * shape.depth, sibling)
    assert mean == pytest.approx(expected, abs=0.03)  # (the mean's deviation: ~1.1 / sqrt(40000) = 0.006)
    assert expected > 1 + sum(alpha**k for k in range(1, shape.depth + 1))  # more than its first-ranked chain


def test_a_tree_without_siblings_kept_is_priced_as_its_chain():
    p = [0.9, 0.7, 0.5, 0.3]
    chain = 1 + 0.9 + 0.9 * 0.7 + 0.9 * 0.7 * 0.5 + 0.9 * 0.7 * 0.5 * 0.3
    assert TreeLayout.of(TREE).expected_tokens(p, 0.0) == pytest.approx(chain)
    assert TreeLayout.of(TreeShape(steps=4)).expected_tokens(p, 0.9) == pytest.approx(chain)  # (no siblings at all)
    # two levels of two children: by hand, the second child kept w.p. (1 - p0) q, each node's first child w.p. p1
    two = TreeLayout.of(TreeShape(steps=2, topk=2))
    assert two.expected_tokens([0.6, 0.5], 0.25) == pytest.approx(1 + (0.6 + 0.4 * 0.25) * (1 + 0.5 + 0.5 * 0.25))


def test_a_verified_tree_tells_the_rank_model_its_levels_and_siblings():
    parents = static_tree_parents(TreeShape(steps=2, topk=2))  # [-1, 0, 0, 1, 1, 2, 2]
    assert rank_outcome(parents, [0, 1, 3]) == ([True, True], 0, 0)  # first-ranked all the way: a leaf ends it
    assert rank_outcome(parents, [0, 2, 6]) == ([False, False], 2, 2)  # a second-ranked child kept at each level
    assert rank_outcome(parents, [0, 1]) == ([True, False], 1, 0)  # node 1's children both rejected
    assert rank_outcome(parents, [0]) == ([False], 1, 0)
    chain = static_tree_parents(TreeShape(steps=4))
    assert rank_outcome(chain, [0, 1, 2]) == ([True, True, False], 0, 0)  # as a chain's observe(4, 2) counts it
    assert rank_outcome(chain, [0, 1, 2, 3, 4]) == ([True] * 4, 0, 0)
    a, b = RunningAcceptance((0.5,) * 4, 2.0, 0.9), RunningAcceptance((0.5,) * 4, 2.0, 0.9)
    a.observe(4, 2)
    b.observe_levels([True, True, False])
    assert [a.conditional(k) for k in range(4)] == [b.conditional(k) for k in range(4)]


def tree_trace(policy: AdaptivePolicy, cost, steps: int, alpha: float, sibling: float, batch: int = 2,
               seed: int = 0) -> list:
    """Drive the policy: chains keep each draft with probability alpha until the first rejection, trees draw their
    path by the rank model (SyntheticAcceptance); a step of width w costs cost(batch, w). -> the plans."""
    rng = random.Random(seed)
    acceptance = SyntheticAcceptance(1 + sum(alpha**k for k in range(1, 5)), seed=seed, depth=4, sibling=sibling)
    tree_parents = static_tree_parents(TREE)
    ids, plans = list(range(batch)), []
    for _ in range(steps):
        plan = policy.plan(ids, [100] * batch)
        trees = None
        if plan.tree:
            paths = [acceptance.forced_path(DraftTree(list(range(len(tree_parents))), tree_parents))
                     for _ in ids]
            trees = [(tree_parents, path) for path in paths]
            drafted, kept = [TREE.budget] * batch, [len(path) - 1 for path in paths]
        else:
            drafted = [plan.steps] * batch
            kept = [next((k for k in range(n) if rng.random() >= alpha), n) for n in drafted]
        policy.observe(ids, drafted, kept, cost(batch, plan.steps + 1), trees=trees)
        plans.append(plan)
    return plans


def memory_bound(batch, width):  # a small batch on a GPU: 17 nodes a row cost little more than 5
    return 1e-3 * (1 + 0.005 * batch * (width - 1))


def compute_bound(batch, width):  # a large batch: cost grows with the nodes, 10% of a plain step's a node
    return 1e-3 * (1 + 0.1 * (width - 1))


@pytest.mark.parametrize("cost, label", [(memory_bound, "tree-16"), (compute_bound, "chain-4")])
def test_the_policy_drafts_the_tree_where_its_width_is_cheap_and_chains_where_it_is_dear(cost, label):
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, tree=TREE, prior_acceptance=(0.7,)))
    assert policy.config.shapes == (0, 1, 2, 4, 16) and policy.config.widths == (1, 2, 3, 5, 17)
    plans = tree_trace(policy, cost, 200, alpha=0.7, sibling=0.5)
    late = [plan.label for plan in plans[100:]]
    assert max(set(late), key=late.count) == label
    assert policy.counts["tree-16"] >= 2  # measured at least (a warm-up and a step), chosen or not


def test_a_tree_priced_well_below_the_best_is_not_explored():
    """The tree is measured only where it is priced within CONTENDER of the best shape, not BORROWED_CONTENDER as a
    chain is: its price holds when measured (the H100 runs of 2026-12-06: of 11 trees explored at 0.50-0.75 of the
    best, ten stayed below it, each a step of up to twice a 4-chain's time)."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, tree=TREE, prior_acceptance=(0.7,)),
                            prior=lambda batch, width, context: compute_bound(batch, width))
    policy.trace = []
    tree_trace(policy, compute_bound, 200, alpha=0.7, sibling=0.5, batch=64)
    first = policy.trace[0]["tokens_per_second"]
    assert BORROWED_CONTENDER < first[16] / max(first.values()) < CONTENDER  # (a chain there would be measured)
    assert policy.counts["tree-16"] == 0 and policy.counts["chain-4"] > 150


@pytest.mark.parametrize("sibling, label", [(0.5, "tree-16"), (0.0, "plain")])
def test_a_row_whose_chain_collapsed_drafts_the_tree_where_its_siblings_are_kept(sibling, label):
    """A chain's first draft kept 1 time in 10 (a collapsed row: it counts one token whatever a chain drafts), while
    the tree's second-ranked children are kept half the time (the synthetic drafts at 1.2 accepted: a tree step at
    batch 16 emitted 1.6x a plain step's tokens on the H100, 2026-12-06). Priced as one token a row the tree was
    drafted only while a request's first figures were hopeful; priced by the rank model, it is drafted where its
    width is cheap, and not where its siblings are never kept."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, tree=TREE, prior_acceptance=(0.1,), probe_every=1000))
    plans = tree_trace(policy, memory_bound, 300, alpha=0.1, sibling=sibling)
    late = [plan.label for plan in plans[150:]]
    assert max(set(late), key=late.count) == label, Counter(late)
    layout = TreeLayout.of(TREE)
    assert layout.keeps_a_first_draft(0.1, 0.5) == pytest.approx(1 - 0.9 * 0.5)  # (the root's two children)
    assert layout.keeps_a_first_draft(0.1, 0.0) == pytest.approx(0.1)


def cheap_chain_dear_tree(batch, width):  # a 1-chain 1.1x a plain step, the tree's 17 nodes 2.6x
    return 1e-3 * (1 + 0.1 * (width - 1))


@pytest.mark.parametrize("batch, tree_max_batch", [(8, 64), (8, 4)])
def test_a_row_whose_tree_alone_is_worth_drafting_drafts_no_chain(batch, tree_max_batch):
    """At p[0] = 0.17 a 1-chain's step emits 1.17x a plain step's tokens at 1.1x its time, but the row's chain
    collapsed (p[0] < collapse): the tree keeping its siblings at 0.5 keeps it worth pricing, not worth a chain
    (the H100 study of 2026-12-06 at 1.2 accepted and batch 64 drafted 1-chains in 209 of 229 steps, and the ragged
    tail that the spread of the requests' ends made cost more than they won: 0.986x of plain decoding). With the tree
    dear the batch decodes plainly; above tree_max_batch such a row counts as collapsed. Either way its shadow drafts
    are wanted: they hold its chains at one token until they show it recovered (AdaptivePolicy.chains_collapsed)."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, tree=TREE, prior_acceptance=(0.17,), probe_every=1000,
                                           tree_max_batch=tree_max_batch))
    plans = tree_trace(policy, cheap_chain_dear_tree, 300, alpha=0.17, sibling=0.5, batch=batch)
    late = [plan.label for plan in plans[150:]]
    assert max(set(late), key=late.count) == "plain", Counter(late)
    assert late.count("chain-1") <= 2, Counter(late)
    assert policy.wants_shadows and policy.chains_collapsed


def test_the_tree_is_offered_only_up_to_its_largest_batch():
    """Above tree_max_batch the tree is neither planned, explored nor priced (no CUDA graph of its width is captured
    there: StepGraphs.set_widths); at or below it, where its width is cheap, it is drafted."""
    for batch, label in ((2, "tree-16"), (3, "chain-4")):
        policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, tree=TREE, prior_acceptance=(0.7,), tree_max_batch=2))
        policy.trace = []
        plans = tree_trace(policy, memory_bound, 200, alpha=0.7, sibling=0.5, batch=batch)
        late = [plan.label for plan in plans[100:]]
        assert max(set(late), key=late.count) == label, Counter(late)
        priced = {shape for entry in policy.trace for shape in entry["tokens_per_second"]}
        assert (TREE.budget in priced) == (batch <= 2) and (policy.counts["tree-16"] > 0) == (batch <= 2)
    assert AdaptiveConfig(tree=TREE, tree_max_batch=2).width_max_batch == {TREE.budget + 1: 2}
    assert AdaptiveConfig().width_max_batch == {}, "no tree: every width at every batch"
    with pytest.raises(ValueError, match="tree_max_batch"):
        AdaptiveConfig(tree=TREE, tree_max_batch=0)


def test_rows_above_the_trees_largest_batch_are_priced_without_it(monkeypatch):
    """Above tree_max_batch no plan may choose the tree, so no row's figures price it (at 128-512 rows that was about
    half the policy's host time a step: benchmarks/results/policy_host_time_tree_cap_cpu_2026-12-06.md); at or below,
    they do."""
    priced = Counter()
    original = TreeLayout.expected_pair

    def counted(self, *args):
        priced["tree"] += 1
        return original(self, *args)
    monkeypatch.setattr(TreeLayout, "expected_pair", counted)
    for batch in (3, 2):
        policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, tree=TREE, prior_acceptance=(0.7,), tree_max_batch=2))
        priced.clear()
        tree_trace(policy, memory_bound, 50, alpha=0.7, sibling=0.5, batch=batch)
        assert (priced["tree"] > 0) == (batch <= 2), (batch, priced)


def test_the_sibling_acceptance_is_learnt_from_tree_steps():
    """Trees whose later siblings are never kept yield what their first-ranked chain does: the policy learns a
    sibling acceptance near 0 and, the tree's 17 nodes a row dearer than a 4-chain's 5, drops it; trees whose siblings
    are kept learn that too."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, tree=TREE, prior_acceptance=(0.7,), sibling_prior=0.5))

    def wide_dearer(batch, width):
        return 1e-3 * (1 + 0.04 * (width - 1))

    plans = tree_trace(policy, wide_dearer, 150, alpha=0.7, sibling=0.0)
    assert policy.siblings.value < 0.25  # (from its prior of 0.5, in the few tree steps it took to drop the tree)
    assert sum(plan.tree for plan in plans[20:]) <= 2  # (measured twice first, then a refresh now and then)
    learnt = AdaptivePolicy(AdaptiveConfig(max_steps=4, tree=TREE, prior_acceptance=(0.7,), sibling_prior=0.1))
    tree_trace(learnt, memory_bound, 150, alpha=0.7, sibling=0.6)
    assert learnt.siblings.value == pytest.approx(0.6, abs=0.12)


def test_the_sibling_acceptance_is_priced_hopefully_while_few_siblings_were_tried():
    siblings = SiblingAcceptance(0.3, 2.0, 0.99)
    assert siblings.hoped(0.0, SURE_OF) == siblings.value == pytest.approx(0.3)
    assert siblings.hoped(1.0, SURE_OF) == pytest.approx(0.3 + (0.3 * 0.7 / (2 + 1 + SURE_OF)) ** 0.5)
    siblings.observe(2000, 1000)  # (many siblings tried: the hope meets the estimate)
    assert siblings.value == pytest.approx(0.5, abs=0.01)
    assert siblings.hoped(1.0, SURE_OF) - siblings.value < 0.02
    assert SiblingAcceptance(1.0, 2.0, 0.99).hoped(3.0, SURE_OF) == 1.0


@pytest.mark.parametrize("seed", [2, 4])
def test_a_tree_whose_first_siblings_were_rejected_is_drafted_again(seed):
    """A batch of one whose first three tree steps each had a sibling tried and rejected (q: 0.3 -> 0.12, where its
    drafts keep siblings at 0.5): the tree, 1.07x a 4-chain's step and ~1.25x its tokens, must still be drafted and
    q learnt. Priced at its estimate alone, the tree stayed below the 4-chains in these seeds and was never drafted
    again (the H100 study of 2026-12-06: 4-chains in 91% of the steps, 0.84x the fixed tree)."""
    def batch_of_one(batch, width):
        return 1e-3 * (1 + 0.0065 * (width - 1))

    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, tree=TREE, prior_acceptance=(0.7,)))
    parents = static_tree_parents(TREE)
    for _ in range(3):  # node 3's two children both rejected: a sibling tried, none kept
        policy._planned = PlannedStep(1, 100.0, StepPlan(16, (True,), tree=True), 0)
        policy.observe([0], [16], [2], None, trees=[(parents, [0, 1, 3])])
    assert policy.siblings.value < 0.13
    plans = tree_trace(policy, batch_of_one, 100, alpha=0.7, sibling=0.5, batch=1, seed=seed)
    assert sum(plan.tree for plan in plans[50:]) >= 40
    assert policy.siblings.value > 0.3


def test_a_tree_steps_outcome_needs_its_trees():
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, tree=TREE))
    policy._planned = PlannedStep(1, 100.0, StepPlan(16, (True,), tree=True), 0)
    with pytest.raises(ValueError, match="trees and accepted paths"):
        policy.observe([0], [16], [2], 1e-3)


@pytest.mark.parametrize("tree", [TreeShape(steps=3), TreeShape(steps=5, topk=2),
                                  TreeShape(steps=5, topk=2, dynamic=True)])
def test_the_tree_offered_must_branch_and_fit_the_chains(tree):
    with pytest.raises(ValueError, match="tree offered must branch"):
        AdaptiveConfig(max_steps=4, tree=tree)


def rank_model_yield(nodes: set[tuple[int, ...]], p: list[float], q: float) -> float:
    """The rank model's tokens a step for a tree given as its nodes' rank paths ((1, 0): the root's second child's
    first child), summed straight from its definition."""
    total = 1.0
    for path in nodes:
        chance = 1.0
        for depth, rank in enumerate(path):
            chance *= p[depth] if rank == 0 else (1 - p[depth]) * (1 - q) ** (rank - 1) * q
        total += chance
    return total


@pytest.mark.parametrize("p, q", [([0.75, 0.7, 0.6], 0.3), ([0.4, 0.8, 0.8], 0.6), ([0.9, 0.2, 0.9], 0.1)])
def test_a_dynamic_trees_layout_is_the_tree_the_rank_model_keeps_most_of(p, q):
    """Every tree of 5 drafts, at most 3 deep, at most 3 children a node, taken in rank order (a drafter's likeliest
    child first): none keeps more than likeliest_tree_parents' at those figures."""
    shape = TreeShape(steps=3, topk=3, max_tokens=5, dynamic=True)
    candidates = [path for depth in range(1, 4) for path in itertools.product(range(3), repeat=depth)]
    best = 0.0
    for nodes in map(set, itertools.combinations(candidates, 5)):
        if all(path[:-1] in nodes or len(path) == 1 for path in nodes) and \
                all(path[-1] == 0 or path[:-1] + (path[-1] - 1,) in nodes for path in nodes):
            best = max(best, rank_model_yield(nodes, p, q))
    parents = likeliest_tree_parents(shape, p, q)
    layout = TreeLayout.of(shape, p, q)
    assert len(parents) == 6 and parents[0] == -1 and layout.expected_tokens(p, q) == pytest.approx(best)
    assert layout.depth <= 3 and layout.widest <= 3
    with pytest.raises(ValueError, match="needs the acceptance"):
        TreeLayout.of(shape)


def test_a_dynamic_tree_is_priced_at_its_likeliest_layout_from_the_prior():
    """Offered a dynamic tree (--topk 4, 16 drafts, as the CPU's shapes study ran the shipped MTP), the policy prices
    it at the layout the rank model keeps most of at the drafter's prior figures: a layout of its own for each
    sibling acceptance, each keeping more than the static tree of 16 drafts at those figures."""
    dynamic = TreeShape(steps=4, topk=4, max_tokens=16, dynamic=True)
    layouts = {}
    for q in (0.15, 0.52):  # the shipped EAGLE-3 head's and MTP's fitted sibling acceptance
        config = AdaptiveConfig(max_steps=4, tree=dynamic, sibling_prior=q)
        assert config.widths == (1, 2, 3, 5, 17) and config.is_tree(16)
        p = config.prior_at(4)
        layouts[q] = config.tree_layout
        assert layouts[q].parents == TreeLayout.of(dynamic, p, q).parents and len(layouts[q].parents) == 16
        static = TreeLayout.of(TreeShape(steps=4, topk=2, max_tokens=16))
        assert layouts[q].expected_tokens(p, q) > static.expected_tokens(p, q)
    assert layouts[0.15].parents != layouts[0.52].parents


@pytest.mark.parametrize("tree", [TreeShape(steps=3, topk=2, max_tokens=8),
                                  TreeShape(steps=3, topk=2, max_tokens=8, dynamic=True)], ids=["static", "dynamic"])
def test_adaptive_speculation_with_a_tree_configured_is_greedy_lossless(tree, shipped):  # noqa: F811
    """--speculation adaptive --topk 2 --num-draft-tokens 8 [--dynamic-tree]: chains of up to the tree's depth and the
    tree itself, every output as plain decoding's."""
    prompts, config, plain = shipped
    config = replace(config, speculation="adaptive", shape=tree)
    llm = LLM("qwen3.5", "mtp", device="cpu", config=config)
    assert llm.engine.policy.config.tree == config.shape and llm.engine.policy.config.max_steps == 3
    outputs = llm.generate(prompts, max_new_tokens=NEW_TOKENS)
    assert [out.token_ids for out in outputs] == [out.token_ids for out in plain]
    counts = llm.engine.policy.counts
    assert counts["tree-8"] >= 1, counts  # the tree was drafted (its first measurement at least)
    assert sum(n for out in outputs for n in out.stats.shapes.values()) == sum(out.stats.steps for out in outputs)
