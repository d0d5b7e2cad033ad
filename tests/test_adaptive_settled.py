"""Adaptive speculation's settled plain runs (AdaptivePolicy._settle): where plain decoding is the best by
SETTLED_MARGIN even at every drafting shape's hopeful rate, the batch is priced in full every SETTLED_REPLAN steps and
planned plainly in between (on a CPU the policy's Python runs in series with the model); the plans are those of a
policy that prices every step, but for a change of the rates seen up to SETTLED_REPLAN steps late."""

from __future__ import annotations

import pytest

import specdec.speculation.adaptive.policy as policy_module
from specdec.speculation.adaptive import AdaptiveConfig, AdaptivePolicy
from specdec.speculation.adaptive.tuning import SETTLED_REPLAN
from tests.test_adaptive import run_trace


def drafting_dear(batch, width):  # drafting steps 4x a plain step's time a node: plain decoding wins even on hope
    return 1e-3 if width == 1 else 4e-3 * width


def policy() -> AdaptivePolicy:
    return AdaptivePolicy(AdaptiveConfig(max_steps=2, chains=(1, 2), prior_acceptance=(0.5,), refresh_every=0))


def priced_steps(policy: AdaptivePolicy, monkeypatch) -> list[int]:
    """The steps (policy.steps when planned) whose plans priced the batch."""
    priced = []
    batch_tokens = policy._batch_tokens
    monkeypatch.setattr(policy, "_batch_tokens", lambda ids: priced.append(policy.steps) or batch_tokens(ids))
    return priced


def test_a_settled_plain_run_is_priced_every_few_steps_and_plans_as_a_policy_pricing_every_step(monkeypatch):
    settled = policy()
    priced = priced_steps(settled, monkeypatch)
    plans = run_trace(settled, lambda step: 0.5, drafting_dear, 200, plain_timed_from=3)
    monkeypatch.setattr(policy_module, "SETTLED_REPLAN", 1)  # (settled for the step planned only: every step priced)
    every_step = run_trace(policy(), lambda step: 0.5, drafting_dear, 200, plain_timed_from=3)
    assert [p.steps for p in plans] == [p.steps for p in every_step]
    assert all(p.steps == 0 for p in plans[40:])  # (the shapes explored first: plain decoding from then on)
    late = [step for step in priced if step >= 40]
    assert len(late) <= 160 // SETTLED_REPLAN + 1
    assert all(b - a <= SETTLED_REPLAN for a, b in zip(late, late[1:], strict=False))


def test_a_new_request_a_trace_or_a_collapsed_row_ends_a_settled_run(monkeypatch):
    settled = policy()
    run_trace(settled, lambda step: 0.5, drafting_dear, 60, plain_timed_from=3)
    assert settled._settled is not None
    priced = priced_steps(settled, monkeypatch)
    settled.plan([0, 1, 2, 3, 4], [100] * 5)  # a request joins
    assert priced == [settled.steps]
    settled.observe([0, 1, 2, 3, 4], [0] * 5, [0] * 5, None)
    settled.plan([0, 1, 2, 3, 4], [100] * 5)
    settled.observe([0, 1, 2, 3, 4], [0] * 5, [0] * 5, None)
    settled.trace = []  # a trace records every decision priced in full
    settled.plan([0, 1, 2, 3, 4], [100] * 5)
    assert len(settled.trace) == 0 and len(priced) == 3  # (recorded with the step's outcome, when observed)


@pytest.mark.parametrize("jump_at", [100, 103])
def test_a_plain_step_grown_dear_is_seen_within_settled_replan_steps(jump_at, monkeypatch):
    """Plain steps 6x dearer from step `jump_at` on (the machine busy elsewhere): the settled policy drafts again at
    most SETTLED_REPLAN steps after a policy pricing every step does."""
    def first_drafting(replan: int) -> int:
        monkeypatch.setattr(policy_module, "SETTLED_REPLAN", replan)
        traced = policy()

        def cost(batch, width):  # (traced.steps: the steps observed before this one)
            return (6e-3 if traced.steps >= jump_at else 1e-3) if width == 1 else 4e-3 * width
        plans = run_trace(traced, lambda step: 0.5, cost, 200, plain_timed_from=3)
        return next(i for i, p in enumerate(plans) if i >= jump_at and p.steps > 0)

    every_step, settled = first_drafting(1), first_drafting(SETTLED_REPLAN)
    assert every_step <= settled <= every_step + SETTLED_REPLAN
