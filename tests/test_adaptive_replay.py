"""benchmarks/adaptive_replay.py: the step-time table, the replayed batch, and the policy ranked against plain decoding
and fixed chains on step times that favour one or the other."""

from __future__ import annotations

import gzip
import json

import pytest

from benchmarks.adaptive_replay import TREE, MeasuredSteps, replay, run_batch, text_draws
from specdec.speculation.adaptive import AdaptiveConfig, AdaptivePolicy, TreeLayout


def test_step_times_interpolate_between_batches_and_widths(tmp_path):
    entries = [  # a trace as benchmarks.study writes it: the first step of each shape in a run is a warm-up
        *({"batch_size": 16, "batch": 16, "steps": 0, "timed": True, "measured_ms": ms}
          for ms in (50.0, 2.0, 2.0, 4.0)),
        *({"batch_size": 16, "batch": 16, "steps": 4, "timed": True, "measured_ms": ms} for ms in (90.0, 6.0)),
        {"batch_size": 16, "batch": 9, "steps": 0, "timed": True, "measured_ms": 1.0},  # the tail: left out
        *({"batch_size": 32, "batch": 32, "steps": 0, "timed": False, "measured_ms": ms} for ms in (70.0, 4.0)),
        {"batch_size": 32, "batch": 32, "steps": 1, "timed": True, "measured_ms": None},  # an untimed plain step
    ]
    path = tmp_path / "trace.jsonl.gz"
    with gzip.open(path, "wt") as out:
        out.write("".join(json.dumps(e) + "\n" for e in entries))
    steps = MeasuredSteps.from_traces([path])
    assert steps.table == {16: {1: 2.0, 5: 6.0}, 32: {1: 4.0}}
    assert steps(16, 3) == pytest.approx(4e-3)  # between widths 1 and 5
    assert steps(16, 7) == pytest.approx(8e-3)  # past the last width: the same slope
    assert steps(24, 1) == pytest.approx(3e-3)  # between batches 16 and 32
    assert steps(8, 1) == pytest.approx(2e-3) and steps(64, 1) == pytest.approx(4e-3)  # flat past the ends
    with pytest.raises(ValueError, match="no step times"):
        MeasuredSteps({})


def test_a_plain_batch_takes_one_step_per_token():
    tokens, seconds = run_batch(lambda rows, width: 1e-3 * width, 8, 10, 0.5, text_draws(0))
    assert tokens == 80 and seconds == pytest.approx(10e-3)
    tokens, seconds = run_batch(lambda rows, width: 1e-3, 8, 10, 1.0, text_draws(0), chain=4)
    assert tokens == 80 and seconds == pytest.approx(2e-3)  # 5 tokens a step, then the last 5


def test_rows_fold_their_buffers_every_flush_length_entries(tmp_path):
    """A plain row folds at its 16th and 32nd token; a row of 4-chains all kept commits 5 entries a step and folds
    at its 4th step (from 15 entries it would reach 20) and its 8th. A drafting step's measured median
    holds its spread share of folds, taken out of the table so that the replay adds those it simulates."""
    tokens, seconds = run_batch(lambda rows, width: 1e-3, 8, 32, 0.5, text_draws(0), fold_seconds=1e-4)
    assert tokens == 256 and seconds == pytest.approx(32e-3 + 2 * 8 * 1e-4)
    tokens, seconds = run_batch(lambda rows, width: 1e-3, 2, 40, 1.0, text_draws(0), chain=4, fold_seconds=1e-4)
    assert tokens == 80 and seconds == pytest.approx(8e-3 + 2 * 2 * 1e-4)
    entries = [{"batch_size": 16, "batch": 16, "steps": 4, "timed": True, "measured_ms": 10.0, "accepted": 16}] * 2
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    assert MeasuredSteps.from_traces([path], fold_ms=0.5).table == {16: {5: 10.0 - 0.5 * 32 / 16}}


def test_the_policy_follows_the_cheaper_side():
    cheap = MeasuredSteps({b: {1: 10.0, 2: 10.5, 3: 11.0, 5: 12.0} for b in (1, 64)})  # drafting nearly free
    dear = MeasuredSteps({b: {1: 10.0, 2: 20.0, 3: 30.0, 5: 50.0} for b in (1, 64)})  # every node a full step
    for row in replay(cheap, [1, 64], 3.0):
        assert row["adaptive"] > 1.5 * row["plain"] and row["of_best"] > 0.85
        assert max(row["shapes"], key=row["shapes"].get) == "chain-4"
    for row in replay(dear, [1, 64], 1.5):
        assert row["of_best"] > 0.9 and row["shapes"].get("plain", 0) > 0.8


def test_plain_steps_teach_their_cost_from_the_third_of_a_run():
    told = []  # (drafts per row, seconds told) per step
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=2, collapse=1.01, probe_every=4, refresh_every=0))
    observe = policy.observe

    def recorded(ids, drafted, kept, seconds, planned=None, trees=None):
        told.append(((planned or policy._planned).plan.steps, seconds))
        observe(ids, drafted, kept, seconds, planned, trees)
    policy.observe = recorded
    run_batch(lambda rows, width: 1e-3, 1, 40, 0.0, text_draws(0), policy)
    run = 0
    for steps, seconds in told:
        run = run + 1 if steps == 0 else 0
        assert (seconds is None) == (steps == 0 and run < 3)
    assert sum(steps == 0 for steps, _ in told) > 20


def test_trees_replayed_beside_the_chains_where_their_width_is_cheap():
    """--trees: the fixed tree replayed as its own row and offered to the policy; where its 17 nodes a row cost
    little more than a 4-chain's 5 the policy drafts it, where they cost a full step each it does not."""
    cheap = MeasuredSteps({b: {1: 10.0, 2: 10.2, 3: 10.4, 5: 10.8, 17: 12.0} for b in (1, 16)})
    dear = MeasuredSteps({b: {1: 10.0, 2: 12.0, 3: 14.0, 5: 18.0, 17: 42.0} for b in (1, 16)})
    for row in replay(cheap, [1, 16], 2.72, trees=True, new_tokens=128):
        assert row["tree"] > 1.1 * row["fixed"] and row["of_best"] > 0.9
        assert max(row["shapes"], key=row["shapes"].get) == "tree-16"
    for row in replay(dear, [1, 16], 2.72, trees=True, new_tokens=128):
        assert row["tree"] < row["fixed"] and row["of_best"] > 0.9 and row["shapes"].get("tree-16", 0) < 0.1


def test_a_replayed_tree_keeps_what_the_synthetic_acceptance_keeps():
    """The replay's tree paths are SyntheticAcceptance's: the same draws give the same mean kept length, which the
    rank model prices (TreeLayout)."""
    tokens, seconds = run_batch(lambda rows, width: 1e-3, 1, 3000, 0.7, text_draws(0), tree=TREE, sibling=0.5)
    expected = TreeLayout.of(TREE).expected_tokens([0.7] * 4, 0.5)
    assert tokens / (seconds / 1e-3) == pytest.approx(expected, rel=0.05)  # (~860 steps: within ~1.5%)


def test_study_rows_put_their_step_times_over_the_traces(tmp_path):
    rows = [{"mode": "tree", "batch_size": 1, "full_batch_step_ms": 7.0},
            {"mode": "speculative", "batch_size": 1, "full_batch_step_ms": 5.5},
            {"mode": "adaptive", "batch_size": 1, "full_batch_step_ms": 9.0}]  # (no one width: left out)
    (tmp_path / "study.json").write_text(json.dumps({"model": "qwen3.5-9b", "rows": rows}))
    (tmp_path / "other.json").write_text(json.dumps({"model": "nemotron-3-nano", "rows": rows}))
    steps = MeasuredSteps({1: {1: 5.0, 5: 6.0}}).with_study_rows([tmp_path / "study.json", tmp_path / "other.json"],
                                                                 "qwen3.5-9b")
    assert steps.table == {1: {1: 5.0, 5: 5.5, 17: 7.0}}
