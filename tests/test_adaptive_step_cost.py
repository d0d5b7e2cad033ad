"""Adaptive speculation's step cost model (specdec/speculation/adaptive/step_cost.py): measured factors over a prior
(warm-up dropped, stalls left out, the mean of a window), steps priced at the rows their graph runs, the roofline
prior on its grid and priced ahead, and the drafter's catch-up cost."""

from __future__ import annotations

import pytest

from specdec.speculation.adaptive import AdaptiveConfig, AdaptivePolicy, StepCost
from specdec.speculation.adaptive.step_cost import CatchUpCost


def test_step_cost_drops_the_warm_up_ignores_stalls_and_borrows_factors():
    cost = StepCost(prior=lambda batch, width, context: 1e-3 * width, window=5, clip=3.0)
    cost.observe(4, 2, 0.0, 1.0)  # warm-up (a graph capture): dropped
    assert cost.seconds(4, 2, 0.0) == pytest.approx(2e-3)
    cost.observe(4, 2, 0.0, 4e-3)  # twice the prior
    assert cost.seconds(4, 2, 0.0) == pytest.approx(4e-3)
    cost.observe(4, 2, 0.0, 1.0)  # a stall (clipped to 12 ms): over twice the lower median, left out of the mean
    assert cost.seconds(4, 2, 0.0) == pytest.approx(4e-3)
    cost.observe(4, 2, 0.0, 5e-3)  # a step that folds buffers, say: 1.25x the others, kept in the mean
    assert cost.seconds(4, 2, 0.0) == pytest.approx(4.5e-3)  # the mean of 4 and 5, the stall left out
    for _ in range(5):
        cost.observe(4, 2, 0.0, 3e-3)  # the cost drifts down: the window of 5 follows it
    assert cost.seconds(4, 2, 0.0) == pytest.approx(3e-3)
    assert cost.factor(8, 2) == cost.factor(4, 2)  # same width, nearest bucket
    assert cost.factor(4, 5) == cost.factor(4, 2)  # same bucket, nearest width
    assert cost.factor(16, 5) == cost.factor(4, 2)
    cost.observe(16, 2, 0.0, 1.0)  # another bucket's warm-up: kept by no count
    assert cost.measured_in(4, 2) == 8 and cost.measured_in(16, 2) == 0
    assert cost.kept_by_width == {2: 8}  # (what the policy reads a plan: the kept measurements over every bucket)
    with pytest.raises(ValueError, match="window"):
        StepCost(window=0)
    with pytest.raises(ValueError, match="stall"):
        StepCost(stall=1.0)


def test_a_cost_that_varies_within_a_flush_cycle_is_priced_at_its_mean():
    """Rows decoding together fold their buffers together: three steps of every 16 cost 1.4x (Qwen3.5-9B, 256 rows on
    the H200: 16.7 against 11.9 ms). What the steps cost in a run is their mean, whichever of them the window holds
    last (the lower median of the last five priced plain decoding at its fold steps, and 1-chains won for good)."""
    cost = StepCost(prior=lambda batch, width, context: 1e-3)
    times = ([12e-3] * 13 + [16.8e-3] * 3) * 3
    for seconds in times:
        cost.observe(256, 1, 0.0, seconds)
    assert cost.seconds(256, 1, 0.0) == pytest.approx(sum(times[-16:]) / 16)  # 12.9 ms, the amortised cost


def test_a_step_is_priced_at_the_rows_its_graph_runs():
    """A shrinking batch's step of 229 requests replays the graph of 256 and costs what 256 rows cost: priced at its
    own rows, the prior (linear in the rows here) would take the step for 12% dearer than its like and teach the
    bucket that factor (the H200 study of 2026-12-04, Qwen3.5-9B at batch 256)."""
    def graph(rows):
        return 256 if rows > 192 else rows

    for rows, factor in ((graph, 1.0), (lambda rows: rows, 256 / 229)):
        cost = StepCost(prior=lambda batch, width, context: 1e-5 * batch, rows=rows)
        for _ in range(3):  # (the first measurement is the warm-up's)
            cost.observe(229, 1, 0.0, 2.56e-3)  # the graph of 256 rows, at its prior
        assert cost.factor(256, 1) == pytest.approx(factor)
        assert cost.seconds(256, 1, 0.0) == pytest.approx(2.56e-3 * factor)  # the full batch's step, after the tail
    policy = AdaptivePolicy(prior=lambda batch, width, context: 1e-5 * batch * width, step_rows=graph)
    plan = policy.plan(list(range(229)), [100] * 229)
    assert policy._bucket(229) == 256 and len(plan.drafting) == 229


def test_roofline_prior_is_interpolated_between_powers_of_two(monkeypatch):
    """The policy prices every batch of a shrinking tail: the roofline is computed on the grid 1, 2, 3, 4, 6, 8, ...
    only, and a batch between its points lies on the chord, within 8% of its own roofline (Qwen3.5-9B and
    Nemotron-3-Nano shapes, 4 layers; the worst: where the GEMMs turn compute-bound)."""
    from specdec.eval import step_cost
    from specdec.eval.roofline import Workload, roofline
    from specdec.models.real_shapes import SHAPES

    real = step_cost.roofline
    for name in ("qwen3.5-9b", "nemotron-3-nano"):
        config = SHAPES[name][0](4)
        calls = []
        monkeypatch.setattr(step_cost, "roofline", lambda *a, calls=calls: calls.append(a[1].batch) or real(*a))
        prior = step_cost.roofline_step_cost(config, step_cost.H200)
        for batch in range(1, 257):
            seconds = prior(batch, 3, 200.0)
            exact = roofline(config, Workload(batch=batch, nodes=3, flush_length=16, context=256.0), step_cost.H200)
            assert seconds == pytest.approx(exact.ms_per_step / 1e3, rel=0.08)
        assert sorted(set(calls)) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]
        assert len(calls) == 16


def test_prepare_prices_every_step_of_the_run_ahead(monkeypatch):
    """After the warm-up's prepare, planning any batch up to its rows at any context of the run computes no
    roofline: those ran on the step's critical path (tail steps of 16-40 ms against ~12 on the H200)."""
    from specdec.eval import step_cost
    from specdec.models.real_shapes import SHAPES

    real = step_cost.roofline
    calls = []
    monkeypatch.setattr(step_cost, "roofline", lambda *a: calls.append(a[1]) or real(*a))
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4),
                            prior=step_cost.roofline_step_cost(SHAPES["nemotron-3-nano"][0](4), step_cost.H200))
    policy.prepare(16, 100, 200)
    prepared = len(calls)
    assert prepared > 0
    for batch in range(1, 17):
        for context in (100, 127, 128, 150, 200):
            policy.plan(list(range(batch)), [context] * batch)
            policy.observe(list(range(batch)), [0] * batch, [0] * batch, None)
    assert len(calls) == prepared
    policy.plan(list(range(40)), [300] * 40)  # beyond the prepared batches and contexts: priced when it comes
    assert len(calls) > prepared


def test_catch_up_cost_is_affine_in_the_backlog():
    cost = CatchUpCost()
    assert cost.seconds(100) == 0.0  # nothing sampled: free
    for tokens in (20, 400, 30, 350):  # 5 ms a read + 0.1 ms a token (a draft forward's overhead, then its tokens)
        cost.observe(tokens, 5e-3 + 1e-4 * tokens)
    assert cost.fit() == pytest.approx((5e-3, 1e-4))
    assert cost.seconds(200) == pytest.approx(25e-3) and cost.seconds(0) == 0.0
    one = CatchUpCost()
    one.observe(50, 10e-3)
    one.observe(50, 14e-3)
    assert one.seconds(100) == pytest.approx(24e-3)  # one token count: proportional to the mean excess
    one.observe(60, -5e-3)  # (a step faster than its shape's cost: no catch-up, not a negative one)
    assert one.samples[-1] == (60, 0.0)


def test_what_a_measured_shape_would_borrow_leaves_its_own_measurements_out():
    cost = StepCost(prior=lambda batch, width, context: 1e-3 * width)
    assert cost.borrowed(4, 2) == 1.0  # nothing measured
    for seconds in (1.0, 4e-3):  # width 2 at batch 4: twice its prior (the first a warm-up)
        cost.observe(4, 2, 0.0, seconds)
    for seconds in (1.0, 3e-3):  # width 1 at batch 4: three times its prior
        cost.observe(4, 1, 0.0, seconds)
    assert cost.factor(4, 2) == pytest.approx(2.0) and cost.borrowed(4, 2) == pytest.approx(3.0)
    assert cost.borrowed(4, 5) == cost.factor(4, 5) == pytest.approx(2.0)  # unmeasured: the same either way
    for width, seconds in ((1, 1.0), (1, 1e-3), (2, 1.0), (2, 4e-3)):  # at batch 16: width 1 at its prior, 2 at twice
        cost.observe(16, width, 0.0, seconds)
    # at batch 4, width 2 as width 1's factor there times the two widths' relation at batch 16 (2 / 1)
    assert cost.borrowed(4, 2) == pytest.approx(6.0)


@pytest.mark.parametrize("stalled", [False, True])
def test_a_shape_measured_once_is_refreshed_as_any_other_unless_its_step_looks_stalled(stalled):
    """A model of the step (a roofline-like prior, here exact: every shape costs its prior) and drafts never kept:
    plain decoding is best, 1-chains reach 0.77 of its rate, 2-chains 0.63, 4-chains 0.53. Once each chain has one
    kept measurement agreeing with what the others make of it, none is within CONTENDER (0.8) of plain decoding and
    no refresh drafts again. A 1-chain whose two first steps stalled at 1.3x (its kept one 1.3x what the others make
    of it) is refreshed, at BORROWED_CONTENDER (0.5), until a second measurement stands beside the first."""
    prior = lambda batch, width, context: 1e-3 * (1 + 0.3 * (width - 1))  # noqa: E731
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=1000, refresh_every=16), prior=prior)
    chain_1_steps = 0

    def cost(batch, width):
        nonlocal chain_1_steps
        chain_1_steps += width == 2
        return prior(batch, width, 0.0) * (1.3 if stalled and width == 2 and chain_1_steps <= 2 else 1.0)

    plans = run_plans(policy, cost, 200)
    drafted = [plan.steps for plan in plans]
    assert sorted(drafted[:8]) == [0, 0, 1, 1, 2, 2, 4, 4]  # every shape explored first (a warm-up and a kept step)
    later = drafted[8:]
    assert later.count(1) == (1 if stalled else 0)  # (once measured twice, a 1-chain is not a contender either)
    assert later.count(2) == later.count(4) == 0


def run_plans(policy: AdaptivePolicy, cost, steps: int, batch: int = 4) -> list:
    """Drive the policy for `steps` steps whose drafts are never kept, each step timed at cost(batch, width)."""
    ids, plans = list(range(batch)), []
    for _ in range(steps):
        plan = policy.plan(ids, [100] * batch)
        drafted = [plan.steps if d else 0 for d in plan.drafting]
        policy.observe(ids, drafted, [0] * batch, cost(batch, plan.steps + 1))
        plans.append(plan)
    return plans


def test_an_engines_prior_is_the_roofline_at_the_peaks_given_or_measured_on_its_gpu(monkeypatch):
    """with_device_prior (`specdec bench` with its run's peaks; `specdec run`, `serve` and `eval` without, once the
    engine is built): the roofline of the target's step at the engine's flush length; without peaks, at those
    measured on its GPU, and the flat prior on the CPU or where that measurement does not fit."""
    import types

    import torch

    from specdec.api import LLM
    from specdec.engine.engine import EngineConfig
    from specdec.eval import step_cost
    from specdec.parallel import SINGLE
    from specdec.speculation.adaptive import flat_prior

    config = EngineConfig.from_flags(max_batch=2, max_seq_len=128, flush_length=8, speculation="adaptive")
    llm = LLM("qwen3.5", "ngram", config=config)
    hf_config, itemsize = llm.model.hf_config, llm.model.dtype.itemsize
    step_cost.with_device_prior(llm)
    assert llm.engine.policy.cost.prior is flat_prior  # (the CPU, no peaks given)

    def roofline_at(peaks):
        return step_cost.roofline_step_cost(hf_config, peaks, 8, itemsize)(64, 3, 500.0)

    given, measured = step_cost.Peaks(20e9, 200e9, "given"), step_cost.Peaks(3e12, 600e12, "measured")
    step_cost.with_device_prior(llm, given)
    assert llm.engine.policy.cost.prior(64, 3, 500.0) == pytest.approx(roofline_at(given))

    asked = []
    monkeypatch.setattr(step_cost, "measure_peaks", lambda device, dtype: asked.append(device) or measured)
    gpu = types.SimpleNamespace(engine=LLM("qwen3.5", "ngram", config=config).engine,
                                model=types.SimpleNamespace(device=torch.device("cuda", 0), dtype=llm.model.dtype,
                                                            hf_config=hf_config, tp=SINGLE))
    step_cost.with_device_prior(gpu)
    assert asked == [torch.device("cuda", 0)]
    assert gpu.engine.policy.cost.prior(64, 3, 500.0) == pytest.approx(roofline_at(measured))
    assert roofline_at(measured) != pytest.approx(roofline_at(given))

    def no_room(device, dtype):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(step_cost, "measure_peaks", no_room)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    gpu.engine = LLM("qwen3.5", "ngram", config=config).engine
    step_cost.with_device_prior(gpu)
    assert gpu.engine.policy.cost.prior is flat_prior
    plain = LLM("qwen3.5", None, config=config)  # (no drafter, no policy: nothing to measure for)
    step_cost.with_device_prior(plain, given)
    assert plain.engine.policy is None


def test_longer_contexts_draft_longer_chains_where_a_wide_step_reads_mostly_keys():
    """A row's nodes read its keys once (tree attention), so at long contexts a wide step costs little more than a
    plain one. Qwen3.5-9B's shapes at batch 256 on the H200 roofline, drafts kept at 0.6 a position: 1-chains pay at
    128 tokens of context and 4-chains at 32768, also once every width's cost is measured at 128 (1.3x its prior:
    the factors scale the prior, which keeps its context)."""
    from specdec.eval import step_cost
    from specdec.models.real_shapes import SHAPES

    prior = step_cost.roofline_step_cost(SHAPES["qwen3.5-9b"][0](), step_cost.H200)
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, prior_acceptance=(0.6,), refresh_every=0, optimism=0.0),
                            prior)
    ids = list(range(256))
    for width in policy.config.widths:  # (two steps of each: a bucket's first is its warm-up)
        for _ in range(2):
            policy.cost.observe(256, width, 128.0, 1.3 * prior(256, width, 128.0))
    assert policy.plan(ids, [128] * 256).steps == 1
    assert policy.plan(ids, [32768] * 256).steps == 4
