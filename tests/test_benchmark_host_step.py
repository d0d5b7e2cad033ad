"""benchmarks/host_step.py on a small batch: the stubbed static-step engine runs plain, speculative and adaptive
(plain-heavy) steps, its stub's logits make the target's acceptance keep the planned drafts, the phases add up to
the step's host time, and a speculative step's critical path is a part of it."""

from __future__ import annotations

import pytest

from benchmarks.host_step import build, measure


@pytest.mark.parametrize("mode", ["plain", "speculative", "adaptive"])
def test_host_step_measures_every_phase(mode):
    speculative = mode == "speculative"
    engine, stub = build(batch=4, speculative=speculative, acceptance="target", temperature=0.0, steps=4,
                         accepted=2.7, adaptive=mode == "adaptive")
    before = engine.policy.counts.copy() if engine.policy else None
    host_ms, phases, critical = measure(engine, stub, steps=3, repeats=2)
    assert host_ms > 0 and stub.seconds[not speculative] > 0  # the stub ran (the device's work) and was left out
    assert sum(phases.values()) == pytest.approx(host_ms)  # "other" closes the sum
    # the critical path (an acceptance read to the next verify launch): a part of a speculative step's host time
    assert (0 < critical < host_ms) if speculative else critical is None
    named = {name for name, ms in phases.items() if ms > 0}
    assert ({"propose", "score", "accept", "commit", "emit"} if speculative else {"decode_step"}) <= named
    if mode == "adaptive":  # the timed steps (past the policy's first measurements): plain, on the decode path
        assert engine.policy.counts - before == {"plain": 6}
        assert engine.runner.decode_graphs.replays[1] == engine.policy.counts["plain"]
    if speculative:  # the stub agrees with 0..4 drafts per row: rows emit more than one token a step
        emitted = [n for r in engine.scheduler.running for n in r.stats.emitted_per_step[1:]]
        assert max(emitted) > 1 and min(emitted) >= 1


@pytest.mark.parametrize("adaptive", [False, True])
def test_host_step_runs_the_tree_path(adaptive):
    """--tree: the study's static tree (16 drafts) at batch 1, fixed or adaptive held to it: the timed steps verify
    the tree, at its width (17 nodes), with a critical path measured."""
    engine, stub = build(batch=1, speculative=True, acceptance="target", temperature=0.0, steps=4, accepted=1.2,
                         adaptive=adaptive, drafting=adaptive, tree=True)
    assert engine.config.shape.budget == 16
    before = engine.policy.counts.copy() if adaptive else None
    replays = engine.runner.graphs.replays[17]
    host_ms, phases, critical = measure(engine, stub, steps=3, repeats=2)
    assert 0 < critical < host_ms
    assert engine.runner.graphs.replays[17] - replays == 6  # 3 steps x 2 runs, all trees
    if adaptive:  # (a drafting step's outcome is told during the next: the last timed one's is still pending, the
        # warm-up's last told in the first timed step if it drafted, at once if it was a plain step)
        told = engine.policy.counts - before
        assert set(told) == {"tree-16"} and told["tree-16"] in (5, 6), told
