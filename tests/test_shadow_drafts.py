"""Shadow drafts: where drafting costs nothing (n-gram, synthetic), adaptive speculation's plain steps check each row's
first draft against the token the step emitted, so a collapsed batch is probed only when its shadows say it may have
recovered (AdaptivePolicy.observe_shadows), and explores or refreshes no drafting shape meanwhile. The policy on
synthetic traces (no probe while the shadows stay collapsed, one soon after they recover, probes as before for a
drafter without shadows), the drafters' and acceptances' shadows against their own proposals, and the engine
telling them on the CPU with its greedy output unchanged."""

from __future__ import annotations

import random

from drafters import DraftModelDrafter, NgramDrafter
from drafters.base import DraftRequest
from specdec.engine.engine import Engine, EngineConfig
from specdec.eval.synthetic import synthetic_speculation
from specdec.models import load_model
from specdec.speculation import SamplingParams, TreeShape
from specdec.speculation.acceptance import TargetAcceptance
from specdec.speculation.adaptive import AdaptiveConfig, AdaptivePolicy
from tests.test_adaptive import cheap
from tests.test_adaptive_plain_steps import CACHE, checkpoint, run  # noqa: F401 - checkpoint: a fixture

BATCH = 4


def run_shadowed(policy: AdaptivePolicy, acceptance, steps: int, shadows: bool, seed: int = 0) -> list[int]:
    """Drive the policy as tests.test_adaptive.run_trace does, each plain step's rows also told whether a first draft
    would have been kept (with probability acceptance(step)) when `shadows`. -> the chain length of each step."""
    rng, chosen, ids = random.Random(seed), [], list(range(BATCH))
    plain_run = 0
    for step in range(steps):
        plan = policy.plan(ids, [100] * BATCH)
        drafted = [plan.steps if d else 0 for d in plan.drafting]
        kept = [next((k for k in range(n) if rng.random() >= acceptance(step)), n) for n in drafted]
        plain_run = plain_run + 1 if plan.steps == 0 else 0
        policy.observe(ids, drafted, kept, cheap(BATCH, plan.steps + 1) if plan.steps or plain_run >= 3 else None)
        if shadows and plan.steps == 0:
            policy.observe_shadows(ids, [rng.random() < acceptance(step) for _ in ids])
        chosen.append(plan.steps)
    return chosen


def collapsed_then_recovered(step: int) -> float:
    return 0.05 if step < 200 else 0.8


def test_a_collapsed_batch_watched_by_shadows_is_probed_only_once_they_recover():
    config = AdaptiveConfig(max_steps=4, probe_every=8)
    watched = run_shadowed(AdaptivePolicy(config), collapsed_then_recovered, 260, shadows=True)
    blind = run_shadowed(AdaptivePolicy(config), collapsed_then_recovered, 260, shadows=False)
    # (the first 60 steps: every shape measured, the acceptance learnt to be collapsed)
    assert not any(watched[60:200])  # no probe, exploration or refresh drafts while the shadows say collapsed
    assert sum(s > 0 for s in blind[60:200]) >= 4  # without shadows: probes every 8-32 steps
    recovered = next(step for step in range(200, 260) if watched[step] > 0)
    assert recovered < 230  # the shadows called a probe within a few windows of the recovery
    assert all(s > 0 for s in watched[recovered + 5:])  # and the batch drafts again


def test_shadows_of_a_few_rows_above_the_collapse_by_chance_call_no_probe():
    """The shadows pooled over the batch's collapsed rows: a batch of 64 rows at 0.15 always holds a row whose own
    window reads above the collapse (a test per row called a probe at every chance in the replay at batch 64)."""
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, probe_every=4))
    ids, rng = list(range(64)), random.Random(3)
    plans = []
    for _ in range(240):  # drafting steps keep nothing (the acceptance learnt collapsed), plain steps' shadows 0.15
        plan = policy.plan(ids, [100] * 64)
        policy.observe(ids, [plan.steps] * 64, [0] * 64, cheap(64, plan.steps + 1))
        if plan.steps == 0:
            policy.observe_shadows(ids, [rng.random() < 0.15 for _ in ids])
        plans.append(plan.steps)
    assert not any(plans[60:])


def test_a_finished_request_leaves_its_shadows():
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=2))
    policy.observe_shadows([7, 8], [True, False])
    policy.finish(7)
    assert set(policy.shadows) == {8}


def test_the_ngram_drafter_shadows_its_first_draft_and_the_draft_model_none(checkpoint):  # noqa: F811
    drafter = NgramDrafter(max_ngram=3)
    requests = [DraftRequest(0, [5, 6, 7, 1, 5, 6], SamplingParams(), None),
                DraftRequest(1, [1, 2, 3], SamplingParams(), None)]
    proposed = drafter.propose(requests, TreeShape(steps=3))
    assert drafter.shadow_drafts(requests) == [proposed[0].tokens[1], None] == [7, None]
    draft_model = DraftModelDrafter(load_model(checkpoint / "draft", device="cpu"), CACHE, TreeShape(steps=2),
                                    cuda_graphs=False)
    assert draft_model.shadow_drafts(requests) is None  # a forward a draft: no shadows


def test_the_targets_shadow_keeps_a_draft_that_is_the_emitted_token():
    kept = TargetAcceptance().shadow_kept([[1, 2], [1, 2], [3]], [9, 4, None], [9, 5, 7])
    assert kept == [True, False, False]


def test_the_synthetic_shadow_keeps_what_a_chain_drafted_there_keeps():
    """SyntheticAcceptance.shadow_kept at a text's position decides as forced_path does for a chain proposed from
    the same tokens: the same draw against the same per-draft alpha."""
    drafter, acceptance = synthetic_speculation("synthetic:1.6", depth=4)
    requests = [DraftRequest(i, list(range(i, i + 20 + i)), SamplingParams(), None) for i in range(40)]
    trees = drafter.propose(requests, TreeShape(steps=4))
    first_kept = [len(acceptance.forced_path(tree)) > 1 for tree in trees]
    shadows = acceptance.shadow_kept([r.tokens for r in requests], drafter.shadow_drafts(requests), [0] * 40)
    assert shadows == first_kept and 0 < sum(shadows) < 40


def test_adaptive_plain_steps_tell_the_ngram_drafters_shadows_and_generate_the_plain_tokens(checkpoint):  # noqa: F811
    target = load_model(checkpoint, device="cpu")
    plain, _ = run(Engine(target, None, EngineConfig(cache=CACHE, cuda_graphs=False,
                                                     speculation="fixed")), SamplingParams())
    config = EngineConfig(cache=CACHE, shape=TreeShape(steps=2), cuda_graphs=False, speculation="adaptive",
                          adaptive=AdaptiveConfig(collapse=1.01, probe_every=6))
    engine = Engine(target, NgramDrafter(), config)
    told = []
    observe_shadows = engine.policy.observe_shadows

    def recorded(ids, kept):
        told.append((list(ids), list(kept)))
        observe_shadows(ids, kept)
    engine.policy.observe_shadows = recorded
    adaptive, _ = run(engine, SamplingParams())
    assert [r.output for r in adaptive] == [r.output for r in plain]
    assert told and sum(len(ids) for ids, _ in told) >= engine.policy.counts["plain"]
    assert all(len(ids) == len(kept) and all(isinstance(k, bool) for k in kept) for ids, kept in told)



def good_then_collapsed(step: int) -> float:
    return 0.9 if step < 40 else 0.05


def test_shadows_hold_a_collapsed_rows_chains_while_its_estimate_relaxes_toward_a_better_pool():
    """A row whose drafts collapsed relaxes toward the acceptance pooled over requests while it decodes plainly
    (RunningAcceptance.relax), which after a good start stays high: without more, its chains came back every ~15
    plain steps, and failed (the replay of Nemotron-3-Nano at batch 1 and 1.2 accepted, a text that started well:
    0.95x of plain decoding). Its shadow drafts hold its chains at one token until they show it recovered."""
    config = AdaptiveConfig(max_steps=4, probe_every=8, refresh_every=0)
    policy = AdaptivePolicy(config)
    chosen = run_shadowed(policy, good_then_collapsed, 300, shadows=True)
    assert all(s > 0 for s in chosen[10:40])  # drafting while it paid
    # no drafting step once the shadows have seen the collapse (before they held it: 14 steps of 4-chains in 80-140,
    # until their failures had pulled the pooled acceptance below the collapse too)
    assert not any(chosen[80:])
    assert policy.population.conditional(0) > config.collapse  # the pool still remembers the good start
