"""Adaptive speculation tells the policy a speculative step's outcome while the device verifies the next step
(Engine.hold_outcome / observe_pending), not between a step's acceptance and the next launch, where the device idles:
checked on the CPU by the order of the engine's calls, with every step still observed once, in order, and the tokens
those of plain decoding (greedy); the policy told a step late plans as it did told at once; an aborted request's
acceptance leaves the policy."""

from __future__ import annotations

import pytest

from drafters import DraftModelDrafter
from specdec.engine.engine import Engine, EngineConfig
from specdec.models import load_model
from specdec.speculation import SamplingParams, TreeShape
from specdec.speculation.adaptive import AdaptiveConfig, AdaptivePolicy
from tests.test_adaptive_plain_steps import CACHE, checkpoint, clock, run  # noqa: F401 (fixtures)
from tests.test_cuda_graphs import prompts


def test_a_steps_outcome_is_told_after_the_next_verify_is_launched(checkpoint, clock):  # noqa: F811
    shape = TreeShape(steps=2)
    drafter = DraftModelDrafter(load_model(checkpoint / "draft", device="cpu"), CACHE, shape, cuda_graphs=False)
    config = EngineConfig(cache=CACHE, shape=shape, cuda_graphs=False, speculation="adaptive",
                          adaptive=AdaptiveConfig(prior_acceptance=(0.9,), refresh_every=0))
    engine = Engine(load_model(checkpoint, device="cpu"), drafter, config)
    events = []  # "score" (a verify launched), "accept" (its acceptance read), ("observe", drafts, step) in order
    score, accept, observe = engine.score, engine.accept_and_commit, engine.policy.observe

    def scored(*args):
        events.append("score")
        return score(*args)

    def accepted(*args):
        events.append("accept")
        return accept(*args)

    def observed(ids, drafted, kept, seconds, planned=None, trees=None):
        events.append(("observe", max(drafted), engine.policy.steps))
        observe(ids, drafted, kept, seconds, planned, trees)
    engine.score, engine.accept_and_commit, engine.policy.observe = scored, accepted, observed
    adaptive, _ = run(engine, SamplingParams())

    plain, _ = run(Engine(load_model(checkpoint, device="cpu"), None, EngineConfig(cache=CACHE, cuda_graphs=False,
                                                                                   speculation="fixed")),
                   SamplingParams())
    assert [r.output for r in adaptive] == [r.output for r in plain]
    told = [e for e in events if isinstance(e, tuple)]
    assert [step for _, _, step in told] == list(range(len(told)))  # each step once, in order
    assert engine.policy.steps == sum(engine.policy.counts.values()) == len(told) > 0
    assert engine._pending_outcome is None  # (the last one told when its requests finished)
    drafting = [i for i, e in enumerate(events) if isinstance(e, tuple) and e[1] > 0]
    overlapped = [i for i in drafting if events[i - 1] == "score" and events[i + 1] == "accept"]
    # between a launch and its acceptance, but for the steps whose requests finished (told at once) and the last
    assert drafting and len(overlapped) >= len(drafting) - len(adaptive) - 1


def plans(defer: bool, accepted: int, steps: int = 40, config: AdaptiveConfig | None = None,
          warm: bool = False) -> list[int]:
    """Drafts per row of each plan of a policy over a batch of 4 whose shapes cost 10 / 12 / 14 ms (0 / 1 / 2 drafts)
    and whose rows keep `accepted` drafts; defer: drafting steps' outcomes told after the next plan, as the engine
    tells them (take_planned, then observe(..., planned=)); warm: the next plan's rows worked out after each step's
    outcome is told, as the engine does while the device verifies (AdaptivePolicy.warm)."""
    policy = AdaptivePolicy(config or AdaptiveConfig(max_steps=2, refresh_every=16))
    ids, pending, chosen = list(range(4)), None, []
    for _ in range(steps):
        plan = policy.plan(ids, [100] * 4)
        chosen.append(plan.steps)
        outcome = (ids, [plan.steps] * 4, [min(accepted, plan.steps)] * 4, (10 + 2 * plan.steps) * 1e-3)
        if pending is not None:
            policy.observe(*pending[0], planned=pending[1])
            pending = None
        if warm:
            policy.warm(ids)
        if defer and plan.steps > 0:
            pending = (outcome, policy.take_planned())
        else:
            policy.observe(*outcome)
    return chosen


@pytest.mark.parametrize("accepted", [0, 1, 2])
def test_outcomes_told_a_step_late_explore_each_shape_as_often(accepted):
    """A step in flight counts as measured (AdaptivePolicy._kept): the plan made before its outcome is told does not
    measure its shape again; the late figures cost at most a step of the old shape where the best one changes."""
    now, late = plans(False, accepted), plans(True, accepted)
    assert late[:6] == now[:6] == [0, 0, 1, 1, 2, 2]  # each shape twice (a warm-up, then a measurement)
    assert late[-5:] == now[-5:] and len(set(now[-5:])) == 1  # the same shape chosen once settled
    assert sum(a != b for a, b in zip(now, late, strict=True)) <= 4


def test_a_probe_told_a_step_late_is_one_step():
    """Collapsed requests (every draft rejected) decode plainly and probe every 4 plain steps, then twice as far
    apart: a probe's outcome told after the next plan must not make that plan a probe too (the H200 run of
    2026-12-04, Nemotron-3-Nano at 1.2 accepted, probed in pairs: adaptive_h200_2026-12-04h)."""
    config = AdaptiveConfig(max_steps=2, collapse=0.5, probe_every=4, refresh_every=0)
    now, late = plans(False, 0, 60, config), plans(True, 0, 60, config)
    probes = [i for i, steps in enumerate(late) if steps and i > 6]  # (past the first measurements)
    assert probes and all(late[i + 1] == 0 for i in probes if i + 1 < len(late))
    assert sum(map(bool, late)) == sum(map(bool, now))


@pytest.mark.parametrize("defer", [False, True], ids=["told-at-once", "told-a-step-late"])
@pytest.mark.parametrize("accepted", [0, 1, 2])
def test_rows_worked_out_ahead_plan_as_rows_worked_out_at_the_plan(defer, accepted):
    """AdaptivePolicy.warm works out the next plan's rows while the device verifies: every plan the same as without
    it, whether the outcome it may miss is told before the plan (a stale memo would price the rows' old figures) or
    after it."""
    assert plans(defer, accepted, warm=True) == plans(defer, accepted)
    collapsed = AdaptiveConfig(max_steps=2, collapse=0.5, probe_every=4, refresh_every=0)
    assert plans(defer, 0, 60, collapsed, warm=True) == plans(defer, 0, 60, collapsed)


def test_rows_worked_out_ahead_follow_an_outcome_told_since():
    """The figures worked out ahead are the rows' of that moment: an outcome told after warm (every draft rejected,
    rows worth drafting for before) changes what the next plan prices; a request finished since leaves it too."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=2, prior_acceptance=(0.9,), collapse=0.5, refresh_every=0))
    ids = [0, 1]
    policy.warm(ids)
    assert policy._batch_tokens(ids)[2] == [True, True]
    for _ in range(20):
        policy.plan(ids, [100, 100])
        policy.observe(ids, [2, 2], [0, 0], None, policy.take_planned())
    assert policy._batch_tokens(ids)[2] == [False, False]  # collapsed: the memo of warm was not reused
    policy.warm(ids)
    policy.finish(1)
    assert 1 not in policy.acceptance and policy._batch_memo[0][1] != policy._figures_version


def test_an_aborted_request_is_forgotten_by_the_policy(checkpoint):  # noqa: F811
    """A server aborts requests mid-run (a client gone): the policy's running acceptance of one must go with it, its
    last step's outcome told first, so that a long-running server does not keep one per request it ever served."""
    shape = TreeShape(steps=2)
    drafter = DraftModelDrafter(load_model(checkpoint / "draft", device="cpu"), CACHE, shape, cuda_graphs=False)
    config = EngineConfig(cache=CACHE, shape=shape, cuda_graphs=False, speculation="adaptive",
                          adaptive=AdaptiveConfig(prior_acceptance=(0.9,), refresh_every=0))
    engine = Engine(load_model(checkpoint, device="cpu"), drafter, config)
    requests = [engine.add_request(p, SamplingParams(), 24) for p in prompts()[:2]]
    for _ in range(4):
        engine.step()
    assert {r.request_id for r in requests} <= set(engine.policy.acceptance)
    engine.abort(requests[0].request_id)
    assert requests[0].request_id not in engine.policy.acceptance and engine._pending_outcome is None
    while not engine.scheduler.idle:
        engine.step()
    assert not engine.policy.acceptance
