"""Adaptive speculation's running acceptance (specdec/speculation/adaptive/acceptance_stats.py): the prior, then a
request's own observations; the hopeful yield its few observations leave room for; relaxing toward the pooled
figures, lazily; and the rows' figures the policy prices a batch with, new requests' worked out once."""

from __future__ import annotations

import pytest

from specdec.speculation.adaptive import AdaptiveConfig, AdaptivePolicy, PlannedStep, RunningAcceptance, StepPlan
from specdec.speculation.adaptive.acceptance_stats import SURE_OF
from specdec.speculation.tree import TreeShape


def test_running_acceptance_follows_the_prior_then_the_observations():
    stats = RunningAcceptance((0.8, 0.5), weight=2.0, decay=0.9)
    assert stats.expected_emitted(0) == 1.0 and stats.expected_emitted(2) == pytest.approx(1 + 0.8 + 0.4)
    totals, _ = stats.expected(4, collapse=0.2, optimism=0.0)  # the policy's one pass, past the positions known too
    assert totals == pytest.approx([stats.expected_emitted(s) for s in range(4)])
    assert stats.expected(4, collapse=0.9, optimism=0.0) is None  # collapsed: nothing
    for _ in range(50):
        stats.observe(drafted=2, accepted=0)  # the first draft always rejected: the second never reached
    assert stats.conditional(0) < 0.2 and stats.conditional(1) == 0.5


def test_the_hopeful_yield_takes_each_position_a_deviation_higher_capped_at_the_first_positions():
    stats = RunningAcceptance((0.8, 0.5), weight=2.0, decay=0.9)  # two pseudo-observations of each position
    totals, spread = stats.expected(4, collapse=0.2, optimism=1.0)
    first = (0.8 * 0.2 / (2 + 1 + SURE_OF)) ** 0.5  # the second position's own deviation is larger: capped at this
    hoped = [1.0, 1 + 0.8 + first, 1 + (0.8 + first) * (1 + 0.5 + first), 1 + (0.8 + first) * (1 + 0.5 + first)]
    assert totals == pytest.approx([1.0, 1.8, 2.2, 2.2])  # the estimates themselves unchanged
    assert spread == pytest.approx([(h - t) ** 2 for h, t in zip(hoped, totals, strict=True)])
    stats.relax((0.8, 0.5), 0.5)  # relaxing toward the pooled figures leaves the row's own observations as they were
    _, again = stats.expected(4, collapse=0.2, optimism=1.0)
    assert again == pytest.approx(spread)
    stats.observe(drafted=2, accepted=0)  # an observation of its own (the first draft rejected): 0.9 * 2 + 1 of them
    p = stats.conditional(0)
    _, fewer = stats.expected(4, collapse=0.2, optimism=1.0)  # (its figures of before not kept: the counts moved)
    assert fewer[1] == pytest.approx(p * (1 - p) / (0.9 * 2 + 1 + 1 + SURE_OF))


def test_relaxing_lazily_reads_as_relaxing_step_by_step():
    """relax is applied when the counts are read: n steps toward one prior in closed form, a change of prior
    settling the steps before it; the plan's one-pass sum reads the pending steps without applying them."""
    lazy = RunningAcceptance((0.8, 0.5), weight=2.0, decay=0.9)
    reached, accepted = [2.0, 2.0], [1.6, 1.0]  # the same counts, relaxed by hand one step at a time
    for step in range(12):
        if step % 4 == 0:  # a drafting step (settles the relax steps before it)
            lazy.observe(drafted=2, accepted=step % 3)
            for k in range(min(2, step % 3 + 1)):
                reached[k], accepted[k] = 0.9 * reached[k] + 1.0, 0.9 * accepted[k] + float(k < step % 3)
            continue
        toward = (0.3, 0.6) if step < 6 else (0.7, 0.2)
        lazy.relax(toward, 0.1)
        for k in range(2):
            reached[k], accepted[k] = 0.9 * reached[k] + 0.1 * 2.0, 0.9 * accepted[k] + 0.1 * 2.0 * toward[k]
        totals, _ = lazy.expected(3, collapse=0.0, optimism=0.0)
        p0, p1 = accepted[0] / reached[0], accepted[1] / reached[1]
        assert totals == pytest.approx([1.0, 1 + p0, 1 + p0 + p0 * p1], rel=1e-12)
    assert (lazy.conditional(0), lazy.conditional(1)) == pytest.approx((p0, p1), rel=1e-12)


@pytest.mark.parametrize("tree", [None, TreeShape(steps=4, topk=2, max_tokens=16)])
def test_new_requests_are_priced_once_and_as_each_alone(tree):
    config = AdaptiveConfig(max_steps=4, probe_every=1000, refresh_every=0, tree=tree)
    policy = AdaptivePolicy(config)
    chains = PlannedStep(4, 100.0, StepPlan(4, (True,) * 4), 0, None)
    for step in range(12):  # (4-chains kept in part: the pooled figures move off the prior)
        policy.observe(list(range(4)), [4] * 4, [(step + row) % 5 for row in range(4)], 1e-3, planned=chains)
    for rid in (0, 1):
        policy.finish(rid)
    pooled = policy._pooled()
    assert pooled != config.prior_at(4)
    ids = [2, 3, *range(100, 110)]  # two requests with drafts of their own, ten new ones
    emitted, hoped, worth = policy._batch_tokens(ids)
    c = config
    figures = [RunningAcceptance(pooled, c.prior_weight, c.decay) if rid >= 100 else policy.acceptance[rid]
               for rid in ids]  # (the reference: every row priced alone)
    figures = [f.expected(c.max_steps + 1, c.collapse, c.optimism, c.tree_layout, policy.siblings.value,
                          policy.siblings.hoped(c.optimism, SURE_OF)) if tree else
               f.expected(c.max_steps + 1, c.collapse, c.optimism) for f in figures]
    assert all(worth)
    for column, shape in enumerate(policy._columns):
        tokens = sum(f[0][column] for f in figures)
        assert emitted[shape] == pytest.approx(tokens, rel=1e-12)
        assert hoped[shape] == pytest.approx(tokens + sum(f[1][column] for f in figures) ** 0.5, rel=1e-12)
    policy.acceptance[100].observe(drafted=4, accepted=0)  # one new row's drafts: the others' figures unchanged
    assert policy._stats(101).untouched and policy._stats(101).conditional(0) == pytest.approx(pooled[0])
    ids = list(range(100, 110))
    policy.observe(ids, [4] * 10, [4] * 10, 1e-3, planned=PlannedStep(10, 100.0, StepPlan(4, (True,) * 10), 0, None))
    assert policy._stats(200).prior == policy._pooled() != pooled  # a request new after drafts: the new figures
