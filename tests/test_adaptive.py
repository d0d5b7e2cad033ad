"""Adaptive speculation: the policy on synthetic acceptance and cost traces (off when acceptance collapses, back on
through probing, longer chains when drafting is cheap, none when dear, a request alone exploring what its first drafts
undersold), and the engine with it: greedy outputs of the shipped Qwen3.5 pair unchanged, chosen shapes counted in
the stats and the eval summary. The step cost model: tests/test_adaptive_step_cost.py; the running acceptance and
the rows' figures: tests/test_adaptive_acceptance.py."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from transformers import AutoTokenizer

from specdec.api import LLM
from specdec.engine.engine import EngineConfig
from specdec.eval.summary import markdown_table, read_records, summarize
from specdec.presets import SHIPPED_DIR
from specdec.speculation.adaptive import (
    AdaptiveConfig,
    AdaptivePolicy,
    PlannedStep,
    RunningAcceptance,
    StepCost,
)
from specdec.speculation.adaptive.tuning import CONTENDER, PROBE_BACKOFF, REFRESH_CONTENDER
from tests.test_shipped_models import held_out_text

NEW_TOKENS = 20


def run_trace(policy: AdaptivePolicy, acceptance, cost, steps: int, batch: int = 4, seed: int = 0,
              plain_timed_from: int = 1) -> list:
    """Drive the policy for `steps` steps: each drafted chain keeps each draft with probability acceptance(step)
    until the first rejection; a step of width w takes cost(batch, w) seconds, told to the policy but for the plain
    steps before the `plain_timed_from`-th of a run (the engine's: 3). -> the plans."""
    rng, plans, plain_run = random.Random(seed), [], 0
    ids = list(range(batch))
    for step in range(steps):
        plan = policy.plan(ids, [100] * batch)
        drafted = [plan.steps if d else 0 for d in plan.drafting]
        kept = [next((k for k in range(n) if rng.random() >= acceptance(step)), n) for n in drafted]
        plain_run = plain_run + 1 if plan.steps == 0 else 0
        timed = plan.steps > 0 or plain_run >= plain_timed_from
        policy.observe(ids, drafted, kept, cost(batch, plan.steps + 1) if timed else None)
        plans.append(plan)
    return plans


def cheap(batch, width):  # a memory-bound step: width nearly free
    return 1e-3 * (1 + 0.02 * (width - 1))


def dear(batch, width):  # a compute-bound step: cost grows with the nodes
    return 1e-3 * width


def test_off_when_acceptance_collapses_and_back_on_through_probes():
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=8, refresh_every=0))
    phases = (0.8, 0.0, 0.8)  # acceptance per draft in steps [0, 60), [60, 160), [160, 240)
    plans = run_trace(policy, lambda step: phases[min(step // 60, 1) if step < 160 else 2], cheap, 240)
    drafting = [sum(plan.drafting) for plan in plans]
    assert all(plan.steps == 4 for plan in plans[20:60])  # cheap steps, good acceptance: the longest chain
    collapsed = drafting[90:160]  # (the running acceptance forgets the good phase in some 20 steps)
    assert 0 < sum(n > 0 for n in collapsed) <= 70 // 8 + 1  # plain steps but for a probe every probe_every steps
    assert all(n == 4 for n in drafting[200:240])  # a probe saw the drafts accepted again: all rows back on
    assert policy.counts["plain"] > 60 and policy.counts["chain-4"] > 60


def test_every_row_drafts_in_a_drafting_step_and_collapsed_rows_count_one_token():
    """The width is the batch's: a drafting step lets every row draft, a collapsed one included (it may recover);
    a collapsed row adds no expected gain to the rates, so a batch of collapsed rows runs plain steps."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=100, refresh_every=0))
    acceptance = {0: 0.9, 1: 0.0, 2: 0.9, 3: 0.0}  # per row: two good, two collapsed
    rng, ids = random.Random(1), [0, 1, 2, 3]
    for _ in range(60):
        plan = policy.plan(ids, [100] * 4)
        assert plan.drafting == (plan.steps > 0,) * 4
        kept = [next((k for k in range(plan.steps) if rng.random() >= acceptance[i]), plan.steps) for i in ids]
        policy.observe(ids, [plan.steps] * 4, kept, cheap(4, plan.steps + 1))
    assert plan.steps == 4  # two good rows make the cheap chain worth it
    assert policy.acceptance[1].conditional(0) < policy.config.collapse  # row 1 drafted and was seen to fail
    collapsed = AdaptivePolicy(AdaptiveConfig(max_steps=4, collapse=1.01, probe_every=100, refresh_every=0))
    for _ in range(20):
        plan = collapsed.plan(ids, [100] * 4)
        collapsed.observe(ids, [plan.steps] * 4, [plan.steps] * 4, cheap(4, plan.steps + 1))
    assert plan.steps == 0  # every row collapsed (collapse above 1): plain, whatever it accepted


def test_longer_chains_when_steps_are_cheap_shorter_or_none_when_dear():
    def chosen(cost, acceptance):
        policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, refresh_every=0))
        plans = run_trace(policy, lambda step: acceptance, cost, 80)
        return max(set(p.steps for p in plans[40:]), key=[p.steps for p in plans[40:]].count)

    assert chosen(cheap, 0.8) == 4
    assert chosen(dear, 0.8) == 0  # 1 + 0.8 tokens for twice the time: slower than plain
    assert chosen(lambda b, w: 1e-3 * (1 + 0.3 * (w - 1)), 0.7) in (2, 3)  # in between: a medium chain


def test_a_batch_of_one_tries_chains_its_first_drafts_undersold_a_large_batch_barely():
    """A request whose first drafts were unlucky (kept at 0.3, then 0.8 for good): priced at its estimates it decodes
    plainly (not collapsed: no probes; no refreshes). Taken a deviation higher (optimism), a 4-chain still looks
    best, so a trial drafts one (after probe_every such plain steps, twice as long after each trial), and the request
    keeps 4-chains from then on; with no optimism it decodes plainly for good. The rows' shortfalls add in quadrature:
    the same history lifts a batch of one's chains by 10-40%, a batch of 256's by a few percent. A collapsed request
    (0.1) stays plain either way."""
    costs = {1: 1.0, 2: 1.6, 3: 1.8, 5: 2.0}  # ms per step of each width: a 4-chain step costs two plain ones

    def back_on(optimism: float, acceptance) -> list[int]:
        runs = []
        for seed in range(6):
            policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=8, refresh_every=0, optimism=optimism))
            plans = run_trace(policy, acceptance, lambda b, w: 1e-3 * costs[w], 120, batch=1, seed=seed,
                              plain_timed_from=3)
            runs.append(sum(plan.steps == 4 for plan in plans[-20:]))
        return runs

    unlucky = lambda step: 0.3 if step < 12 else 0.8  # noqa: E731
    assert sum(n == 20 for n in back_on(0.0, unlucky)) <= 1  # stuck on plain steps in 5 of 6 runs
    assert sum(n == 20 for n in back_on(1.0, unlucky)) >= 4
    assert max(back_on(1.0, lambda step: 0.1)) <= 1  # collapsed: plain steps, a rare probe

    def hopeful_over_estimate(batch: int) -> dict[int, float]:
        policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=1000, refresh_every=0))
        policy.trace, ids = [], list(range(batch))
        for k in range(3):
            policy.plan(ids, [100] * batch)
            policy.observe(ids, [4] * batch, [k % 2] * batch, 1e-3)
        policy.plan(ids, [100] * batch)
        decision = policy.take_planned().decision
        estimated = decision["estimated_tokens_per_second"]
        return {s: decision["tokens_per_second"][s] / rate for s, rate in estimated.items()}

    one, many = hopeful_over_estimate(1), hopeful_over_estimate(256)
    assert one[0] == many[0] == 1.0  # plain decoding's yield is certain
    assert all(one[s] > 1.1 for s in (1, 2, 4)) and all(1.0 < many[s] < 1.03 for s in (1, 2, 4))


def test_near_the_break_even_a_batch_of_one_decodes_plainly_drafting_only_in_trials():
    """Drafts kept at 0.7 a position where a 2-chain step costs 1.8 plain ones: every drafting shape emits 0.77-0.95x
    plain decoding's tokens a second, but a 2-chain taken a deviation higher (optimism) looks ~10% better than plain
    decoding. Compared on hope (until 2026-12-07) a batch of one drafted in 120 of the last 200 steps of one seed, at
    0.963x of plain decoding over them (on the 2-core CPU, the shipped draft model's adaptive runs drafted in 39-52% of
    their steps at batch 1 and ran at 0.93x); the estimates prefer plain decoding, so the hoped shape is drafted in
    trials only (after probe_every such steps, twice as long after each), within 2% of plain decoding."""
    costs = {1: 1.0, 2: 1.8, 3: 2.3, 5: 3.6}  # ms a step of each width
    tokens = {w: sum(0.7 ** k for k in range(w)) for w in costs}  # expected a step: 1 + p + p^2 + ...
    for seed in range(3):
        policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=16, refresh_every=0))
        plans = run_trace(policy, lambda step: 0.7, lambda b, w: 1e-3 * costs[w], 300, batch=1, seed=seed,
                          plain_timed_from=3)
        late = plans[100:]
        rate = sum(tokens[p.steps + 1] for p in late) / sum(costs[p.steps + 1] for p in late)
        assert rate >= 0.98, (seed, rate)  # (plain decoding: 1.0)
        assert sum(p.steps > 0 for p in late) <= 40


def test_a_shape_unmeasured_in_the_batch_bucket_is_explored_there():
    """A cost borrowed from another bucket can be far off, and only a shape that runs corrects its own: here plain
    steps cost 1.6x the prior at batch 16 (borrowed at batch 128) and 1x at 128, where drafts are never accepted.
    Plain decoding is measured at 128 once that bucket has run EXPLORE_AFTER steps, and wins from then on."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=100, refresh_every=0),
                            prior=lambda batch, width, context: 1e-3 * (1 + 0.25 * (width - 1)))

    def cost(batch, width):
        return 1.6e-3 if batch == 16 and width == 1 else 1e-3 * (1 + 0.25 * (width - 1))

    run_trace(policy, lambda step: 0.9, cost, 30, batch=16)
    plans = run_trace(policy, lambda step: 0.0, cost, 40, batch=128)
    assert policy.cost.measured_in(128, 1) >= 1
    assert all(plan.steps == 0 for plan in plans[-10:])


def test_a_shrinking_batch_explores_nothing_until_it_holds_again():
    """A batch whose requests end together passes through each bucket of its tail in a few steps, where measuring a
    shape (plain decoding: three steps) would serve a step or two: in the H100 study of 2026-12-06 such measurements
    took 2-3% of Nemotron-3-Nano's run at batch 128. Plain decoding (0.6x the 4-chains' rate here, a contender while
    its cost is borrowed) is measured in neither tail bucket, 32 and 16; once a batch holds at 30, it is."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=1000, refresh_every=16),
                            prior=lambda batch, width, context: 1e-3 * (1 + 0.25 * (width - 1)))
    rng, plain_run = random.Random(0), 0

    def run(batches):
        nonlocal plain_run
        plans = []
        for batch in batches:
            ids = list(range(batch))
            for gone in range(batch, batch + 64):  # (the requests that ended)
                policy.finish(gone)
            plan = policy.plan(ids, [100] * batch)
            drafted = [plan.steps] * batch
            kept = [next((k for k in range(n) if rng.random() >= 0.8), n) for n in drafted]
            plain_run = plain_run + 1 if plan.steps == 0 else 0
            timed = plan.steps > 0 or plain_run >= 3
            policy.observe(ids, drafted, kept, 1e-3 * (1 + 0.25 * plan.steps) if timed else None)
            plans.append(plan)
        return plans

    run([64] * 40)
    assert policy.cost.measured_in(64, 1) >= 1, "plain decoding measured where the batch held"
    tail = run([30, 28, 25, 22, 20, 19, 17, 15, 13, 12, 11, 9])
    assert all(plan.steps > 0 for plan in tail), [plan.steps for plan in tail]
    assert policy.cost.measured_in(32, 1) == policy.cost.measured_in(16, 1) == 0
    run([30] * 20)
    assert policy.cost.measured_in(32, 1) >= 1


def test_a_contender_chosen_for_measurement_is_held_until_a_step_of_it_is_timed():
    """Plain steps are timed from the third of a run: a refresh that picks plain decoding (a contender, not the best)
    holds it until then, else plain would be refreshed every refresh_every steps and never measured again. (Shapes
    compared at their estimates: optimism makes the chains contenders too, and they are refreshed in turn.)"""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=1000, refresh_every=16, optimism=0.0))

    def cost(batch, width):  # (at 0.4 accepted plain decoding's rate is 0.89x a 1-chain's: near REFRESH_CONTENDER,
        return 1e-3 * (1 + 0.25 * (width - 1))  # and within it as the estimates of a batch of 4 wander)

    run_trace(policy, lambda step: 0.4, cost, 200, plain_timed_from=3)
    assert policy.last_measured[(4, 0)] > 150  # plain re-measured by the late refreshes (unheld: last at step 62)
    assert max(policy.counts, key=policy.counts.get) == "chain-1"


def test_a_shape_measured_once_at_a_stall_is_refreshed_until_its_cost_rests_on_a_window():
    """Plain steps cost 1 ms, chains 1 ms per node, drafts kept at 0.5: plain decoding is best (1000 tok/s against
    chain-1's 750). Its first two steps (the first a warm-up, dropped) stall at 2.2 ms, so it looks worth 455: not
    within 20% of the best, but priced from one step; a refresh measures it again, and it wins from then on."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=1000, refresh_every=16))
    plain_steps = 0

    def cost(batch, width):
        nonlocal plain_steps
        if width == 1:
            plain_steps += 1
            return 2.2e-3 if plain_steps <= 2 else 1e-3
        return 1e-3 * width

    plans = run_trace(policy, lambda step: 0.5, cost, 120)
    assert all(plan.steps == 0 for plan in plans[-20:])


def test_a_run_of_rejections_does_not_hold_a_request_on_plain_steps():
    """Acceptance 0.6, but the first drafts of steps 20-24 all rejected: drafting looks worse than plain decoding for
    a while. With neither probes nor refreshes, only the relaxation of the idle estimate toward the pooled acceptance
    brings drafting back."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=1000, refresh_every=0))

    def cost(batch, width):
        return 1e-3 * (1 + 0.35 * (width - 1)) if width > 1 else 1e-3

    plans = run_trace(policy, lambda step: 0.0 if 20 <= step < 25 else 0.6, cost, 120, batch=1)
    after = [plan.steps for plan in plans[25:]]
    assert 0 in after  # the dip was seen
    assert sum(s > 0 for s in after[-40:]) >= 35  # and drafting is back


def test_a_new_request_starts_from_the_acceptance_pooled_over_earlier_ones():
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=1000, refresh_every=0, prior_acceptance=(0.75,)))
    run_trace(policy, lambda step: 0.0, cheap, 60, batch=8)  # every draft rejected: plain decoding
    for rid in range(8):
        policy.finish(rid)
    new = list(range(100, 108))
    assert policy.plan(new, [10] * 8).steps == 0  # no 4-chains from the drafter's 0.75 for new requests
    assert policy._stats(100).conditional(0) < 0.1
    stats = RunningAcceptance((0.5,), weight=2.0, decay=0.9)
    for _ in range(30):
        stats.observe(drafted=1, accepted=0)
    for _ in range(60):
        stats.relax((0.5,), 0.1)  # idle: back toward the prior
    assert stats.conditional(0) == pytest.approx(0.5, abs=0.01)


def test_probes_that_change_nothing_come_twice_as_far_apart_up_to_the_backoff():
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=2, collapse=1.01, probe_every=4, refresh_every=0))
    plans = run_trace(policy, lambda step: 0.0, cheap, 120)
    probes = [i for i, plan in enumerate(plans) if plan.steps > 0 and i >= 6]  # (after measuring every shape)
    gaps = [b - a - 1 for a, b in zip(probes, probes[1:], strict=False)]
    assert gaps[:3] == [8, 16, 16] and set(gaps[3:]) == {16}  # plain steps between probes: 4 x 2, then 4 x 4
    assert policy.probe_interval == PROBE_BACKOFF * 4


def test_a_step_that_measures_a_shape_leaves_the_probes_backoff_alone():
    """A collapsed batch's probes back off; a step chosen to measure a shape's cost drafts too, but says nothing of
    whether drafting pays again (before, it reset the backoff: in the replay of the H200 traces at acceptance 1.2,
    Qwen3.5-9B at batch 256 probed every 16-33 steps and ran at 0.93x of plain decoding, 0.97x since)."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=2, collapse=1.01, probe_every=4, refresh_every=0))
    run_trace(policy, lambda step: 0.0, cheap, 40)
    backoff = policy.probe_interval
    assert backoff > 4
    ids = list(range(4))
    policy._measuring, policy._measure_steps = (policy._bucket(4), 1), 1  # the next step measures 1-chains
    plan = policy.plan(ids, [100] * 4)
    assert plan.steps == 1
    policy.observe(ids, [1] * 4, [0] * 4, cheap(4, 2))
    assert policy.plan(ids, [100] * 4).steps == 0 and policy.probe_interval == backoff


def test_an_unmeasured_width_borrows_from_its_own_bucket_first():
    cost = StepCost(prior=lambda batch, width, context: 1e-3)
    for batch, width, seconds in ((1, 1, 3e-3), (1, 1, 3e-3), (16, 5, 1e-3), (16, 5, 1e-3)):
        cost.observe(batch, width, 0.0, seconds)  # plain 3x its prior at batch 1; a chain 1x at 16
    assert cost.seconds(16, 1, 0.0) == pytest.approx(1e-3)  # batch 16's own factor, not batch 1's plain one
    assert cost.seconds(2, 1, 0.0) == pytest.approx(3e-3)  # nothing measured at 2: the same width nearest, at 1


def test_an_unmeasured_width_takes_its_relation_to_a_measured_one_from_another_bucket():
    """Flat prior (the CPU's): at batch 2 plain steps cost 10 ms and 4-chains 30; at batch 4 only 4-chains ran (60
    ms). Plain decoding at 4 costs what the 4-chain costs there, times plain / 4-chain at 2: 20 ms, not the 60 of
    the 4-chain's factor as it stands (which held plain decoding off batch 4 for good)."""
    cost = StepCost(prior=lambda batch, width, context: 1e-3)
    for batch, width, seconds in ((2, 1, 10e-3), (2, 1, 10e-3), (2, 5, 30e-3), (2, 5, 30e-3), (4, 5, 60e-3),
                                  (4, 5, 60e-3)):
        cost.observe(batch, width, 0.0, seconds)
    assert cost.seconds(4, 1, 0.0) == pytest.approx(20e-3)
    assert cost.seconds(4, 3, 0.0) == pytest.approx(60e-3)  # width 3 measured nowhere: the nearest width's factor
    cost.observe(4, 1, 0.0, 15e-3)  # (a first measurement: a warm-up, dropped)
    cost.observe(4, 1, 0.0, 15e-3)
    assert cost.seconds(4, 1, 0.0) == pytest.approx(15e-3)  # measured: its own


def test_a_step_told_without_seconds_teaches_no_cost():
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=2))
    policy.plan([0, 1], [10, 10])
    policy.observe([0, 1], [0, 0], [0, 0], None)
    assert policy.steps == 1 and not policy.cost.samples and not policy.last_measured


def measured_policy(plain_ms: float, chain_ms: float) -> AdaptivePolicy:
    """A policy whose batch of 4 has measured plain steps and 2-chains (acceptance per draft 0.5)."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=2, chains=(2,), prior_acceptance=(0.5,), refresh_every=0))
    ids = list(range(4))
    for steps, ms in ((0, plain_ms),) * 3 + ((2, chain_ms),) * 3:
        policy.plan(ids, [100] * 4)
        policy._planned = PlannedStep(4, 100.0, replace(policy._planned.plan, steps=steps), 0)  # (the shape to measure)
        policy.observe(ids, [steps] * 4, [1 if steps else 0] * 4, ms * 1e-3)
    return policy


def test_a_drafting_step_with_a_backlog_teaches_the_catch_up_and_not_its_shape():
    policy = measured_policy(plain_ms=10, chain_ms=20)
    ids = list(range(4))
    for backlog, extra_ms in ((40, 9), (400, 45)):  # 5 ms + 0.1 ms a token
        policy.plan(ids, [100] * 4, backlog=backlog)
        policy._planned = PlannedStep(4, 100.0, replace(policy._planned.plan, steps=2), backlog)
        policy.observe(ids, [2] * 4, [1] * 4, (20 + extra_ms) * 1e-3)
    assert policy.cost.seconds(4, 3, 100.0) == pytest.approx(20e-3)  # the shape's cost as its own steps measured it
    assert policy.catch_up.seconds(100) == pytest.approx(15e-3)


def test_a_backlog_keeps_plain_steps_where_drafting_wins_by_less_than_its_catch_up():
    policy = measured_policy(plain_ms=10, chain_ms=20)  # 2-chains: 4 x 2.0 tokens in 20 ms, plain 4 in 10: a tie
    policy.catch_up.observe(40, 9e-3)
    policy.catch_up.observe(400, 45e-3)
    policy.cost.ratios[(4, 3)].clear()
    policy.cost.ratios[(4, 3)].append(0.8 * policy.cost.factors[(4, 3)])
    policy.cost.factors[(4, 3)] *= 0.8  # 2-chains now 16 ms: 25% more tokens a second than plain steps
    assert policy.plan(list(range(4)), [100] * 4, backlog=0).steps == 2
    policy.observe(list(range(4)), [2] * 4, [1] * 4, 16e-3)
    # 300 tokens to read first: 35 ms, spread over CATCH_UP_STEPS steps, outweighs the 2-chains' lead
    assert policy.plan(list(range(4)), [100] * 4, backlog=300).steps == 0


def test_adaptive_speculation_refuses_bad_settings():
    with pytest.raises(ValueError, match="speculation must be one of"):
        EngineConfig.from_flags(speculation="sometimes")
    with pytest.raises(ValueError, match="optimism >= 0"):
        AdaptiveConfig(optimism=-1.0)


@pytest.fixture(scope="module")
def shipped():
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_DIR / "qwen3.5-tiny")
    prompts = [tokenizer(held_out_text(name, 300), add_special_tokens=False)["input_ids"][-40:]
               for name in ("wiki_en", "python_stdlib")]
    config = EngineConfig.from_flags(max_batch=2, max_seq_len=128, speculation="fixed")
    return prompts, config, LLM("qwen3.5", device="cpu", config=config).generate(prompts, max_new_tokens=NEW_TOKENS)


@pytest.mark.parametrize("draft, collapse", [("small", 1.01), ("mtp", 1.01), ("mtp", 0.2)],
                         ids=["draft-model-always-off", "mtp-always-off", "mtp-learnt"])
def test_adaptive_greedy_equals_plain_and_counts_shapes(draft, collapse, shipped):
    """always-off: every request counts as collapsed, so steps are plain but for probes every 3 steps: the
    drafters catch up on the roots they skipped (Drafter.skipped) and still draft what the target accepts."""
    prompts, config, plain = shipped
    config = replace(config, speculation="adaptive", adaptive=AdaptiveConfig(collapse=collapse, probe_every=3))
    llm = LLM("qwen3.5", draft, device="cpu", config=config)
    outputs = llm.generate(prompts, max_new_tokens=NEW_TOKENS)
    assert [out.token_ids for out in outputs] == [out.token_ids for out in plain]
    for out in outputs:
        assert sum(out.stats.shapes.values()) == out.stats.steps
    counts = llm.engine.policy.counts
    assert counts["plain"] > 0 and sum(n for name, n in counts.items() if name != "plain") > 0
    drafting_steps = [e for out in outputs for e, d in zip(out.stats.emitted_per_step, out.stats.drafted_per_step,
                                                          strict=True) if d > 0]
    assert sum(drafting_steps) / len(drafting_steps) > 1.5  # what is drafted after skipping is still accepted


def test_summary_sums_the_shapes_of_its_records():
    records = [{"new_tokens": 4, "emitted_per_step": [1, 3], "drafted_per_step": [0, 2],
                "shapes": {"plain": 1, "chain-2": 1}},
               {"new_tokens": 2, "emitted_per_step": [2], "drafted_per_step": [2], "shapes": {"chain-2": 1}}]
    row = summarize("speculative", 2, records, [], depth=2)
    assert row.shapes == {"plain": 1, "chain-2": 2}
    assert "shapes chosen" in markdown_table([row]) and "chain-2 67%, plain 33%" in markdown_table([row])
    fixed = summarize("speculative", 2, [{**r, "shapes": {}} for r in records], [], depth=2)
    assert "shapes chosen" not in markdown_table([fixed])


def test_adaptive_speculation_is_the_default_of_run_serve_and_the_api():
    """Issue 17: adaptive speculation, at or above plain decoding and within 0.95x of the best fixed shape wherever
    measured, is what `specdec run`, `specdec serve` and the Python API (EngineConfig) do unless told
    `--speculation fixed`; `specdec eval` and `specdec bench` measure the drafter at its fixed shape by default."""
    from specdec.cli import build_parser

    parser = build_parser()
    assert EngineConfig().speculation == EngineConfig.from_flags().speculation == "adaptive"
    assert parser.parse_args(["run"]).speculation == parser.parse_args(["serve"]).speculation == "adaptive"
    assert parser.parse_args(["run", "--speculation", "fixed"]).speculation == "fixed"
    assert parser.parse_args(["eval"]).speculation == ["fixed"]


def test_eval_runs_adaptive_beside_fixed_and_counts_its_shapes(tmp_path):
    """`specdec eval --speculation fixed adaptive` takes both; an adaptive run beside plain decoding, lossless, its
    summary row counting the shapes chosen per request-step."""
    from specdec.cli import build_parser
    from specdec.eval.datasets import load_prompts
    from specdec.eval.run import EvalSettings, run_eval

    args = build_parser().parse_args(["eval", "--speculation", "fixed", "adaptive"])
    assert args.speculation == ["fixed", "adaptive"]
    assert build_parser().parse_args(["bench"]).speculation == ["fixed"]  # (eval and bench: a drafter at its shape)
    settings = EvalSettings(target="qwen3.5", draft="ngram", dataset="gsm8k", max_new_tokens=8)
    prompts = load_prompts("gsm8k", 2)
    rows = run_eval(settings, prompts, [1], tmp_path, speculation=("adaptive",))
    assert [row.mode for row in rows] == ["plain", "adaptive"]
    adaptive = rows[1]
    steps = sum(len(record["emitted_per_step"]) for record in read_records(tmp_path / "requests" / "adaptive-b1.jsonl"))
    assert sum(adaptive.shapes.values()) == steps and adaptive.same_as_plain == 1.0 and not rows[0].shapes
    assert "shapes chosen" in (tmp_path / "summary.md").read_text()


def test_a_watched_batch_whose_plain_steps_fell_far_behind_refreshes_nothing():
    """Every row collapsed and watched by its shadow drafts: no drafting shape is refreshed, and plain decoding, the
    one shape left, measured far slower than the chains (a stall, a busy machine) is no contender: nothing to
    refresh, and no failure (it raised on an empty list of contenders, 2026-12-05, the CPU tests run beside CI)."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=2, chains=(2,), prior_acceptance=(0.5,), refresh_every=2))
    ids = list(range(4))
    for steps, ms in ((0, 200),) * 3 + ((2, 10),) * 40:  # plain steps 200 ms, 2-chains 10 ms, no draft kept
        policy.plan(ids, [100] * 4)
        policy._planned = PlannedStep(4, 100.0, replace(policy._planned.plan, steps=steps), 0)
        policy.observe(ids, [steps] * 4, [0] * 4, ms * 1e-3)
    policy.observe_shadows(ids, [False] * 4)
    for _ in range(8):  # refreshes come due
        plan = policy.plan(ids, [100] * 4)
        assert policy._best_at_refresh is None, "no refresh to judge"
        policy._planned = PlannedStep(4, 100.0, replace(plan, steps=0), 0)
        policy.observe(ids, [0] * 4, [0] * 4, 200e-3)
        policy.observe_shadows(ids, [False] * 4)


def test_measured_chains_are_refreshed_within_refresh_contender_and_plain_decoding_within_contender():
    """A shape measured twice in the batch's bucket is refreshed where its expected rate lies within REFRESH_CONTENDER
    of the best (drafting steps priced at 0.80-0.90 of plain decoding were every refresh of the H100 study at 1.2
    accepted and batch 64, ~1% of its time); plain decoding, the shape to fall back to, within CONTENDER."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=1000, refresh_every=16))
    run_trace(policy, lambda step: 0.5, cheap, 200, plain_timed_from=3)
    bucket = policy._bucket(4)
    assert all(policy._kept(steps, bucket) >= 2 for steps in (0, 1, 2, 4))
    assert policy._contender(bucket, 0) == CONTENDER < REFRESH_CONTENDER
    assert all(policy._contender(bucket, steps) == REFRESH_CONTENDER for steps in (1, 2, 4))
