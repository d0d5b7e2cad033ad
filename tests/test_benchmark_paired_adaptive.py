"""benchmarks/paired_adaptive.py on the shipped Qwen3.5 (CPU): two engines over one target, rounds alternated, each
round's ratio the adaptive run's tokens/s over the plain run's, and the summary read from those ratios."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.paired_adaptive import build, run, summary, table
from specdec.eval.bench import BenchSettings

SETTINGS = BenchSettings(target="qwen3.5", draft="synthetic:2.5", batch_sizes=(2,), max_new_tokens=12,
                         prompt_tokens=16, device="cpu", speculation=("adaptive",), topk=2, num_draft_tokens=8)


def test_the_engines_share_one_target():
    llms = build(SETTINGS)
    plain, adaptive = llms["plain"], llms["adaptive"]
    assert adaptive.model is plain.model and adaptive.engine is not plain.engine
    assert plain.engine.policy is None and adaptive.engine.policy is not None
    assert adaptive.engine.runner is not plain.engine.runner  # (pools and graphs of its own)
    assert adaptive.drafter is not None and plain.drafter is None


def test_rounds_alternate_and_give_paired_ratios():
    result = run(SETTINGS, rounds=2)
    runs = result["runs"]
    assert [r["order"] for r in runs] == [["plain", "adaptive"], ["adaptive", "plain"]]
    for r in runs:
        assert r["ratio"] == pytest.approx(r["adaptive"]["tokens_per_second"] / r["plain"]["tokens_per_second"])
        assert r["plain"]["shapes"] is None and sum(r["adaptive"]["shapes"].values()) >= 1
        assert len(r["plain"]["step_ms"]) >= 1
    assert result["all_rounds"]["rounds"] == 2 and result["after_the_first"]["rounds"] == 1
    assert result["after_the_first"]["median"] == runs[1]["ratio"]
    lines = table({"model": "qwen3.5", "batch": 2, "accepted": 2.5, "new_tokens": 12, "device": "CPU", **result})
    assert sum(line.startswith("| ") for line in lines.splitlines()) == 3  # (the header and a row per round)


def test_summary_counts_rounds_at_least_plain():
    figures = summary([{"ratio": 0.99}, {"ratio": 1.0}, {"ratio": 1.02}])
    assert figures["all_rounds"] == {"median": 1.0, "lowest": 0.99, "highest": 1.02, "at_least_plain": 2, "rounds": 3}
    assert figures["after_the_first"]["median"] == pytest.approx(1.01) and summary([])["all_rounds"] == {}


def test_a_fixed_engine_joins_the_rotation_at_the_prompts_length():
    settings = replace(SETTINGS, prompt_tokens=24)
    result = run(settings, rounds=2, fixed=True)
    runs = result["runs"]
    assert [r["order"] for r in runs] == [["plain", "adaptive", "speculative"], ["speculative", "adaptive", "plain"]]
    for r in runs:
        assert r["ratio_to_fixed"] == pytest.approx(r["adaptive"]["tokens_per_second"]
                                                    / r["speculative"]["tokens_per_second"])
        assert r["speculative"]["shapes"] is None  # (fixed speculation: no shapes chosen)
    assert result["to_fixed"]["rounds"] == 2 and "at_least_plain" not in result["to_fixed"]
    lines = table({"model": "qwen3.5", "batch": 2, "accepted": 2.5, "new_tokens": 12, "prompt_tokens": 24,
                   "device": "CPU", **result})
    assert "24 prompt tokens" in lines and "adaptive / fixed 4-chains" in lines
    llms = build(settings, fixed=True)
    fixed = llms["speculative"].engine
    assert fixed.policy is None and fixed.config.shape.topk == 1 and fixed.config.shape.depth == 4  # 4-chains
    assert llms["speculative"].model is llms["plain"].model
    assert fixed.config.cache.max_seq_len >= 24 + 12  # (pools for the longer prompts)


def test_a_second_plain_engine_gives_the_floor_under_adaptive_over_plain():
    llms = build(SETTINGS, control=True)
    control = llms["control"]
    assert control.model is llms["plain"].model and control.engine is not llms["plain"].engine
    assert control.engine.policy is None and control.engine.drafter is None
    assert control.engine.runner is not llms["plain"].engine.runner  # (pools and graphs of its own)
    result = run(SETTINGS, rounds=2, control=True)
    runs = result["runs"]
    assert [r["order"] for r in runs] == [["plain", "adaptive", "control"], ["control", "adaptive", "plain"]]
    for r in runs:
        assert r["control_ratio"] == pytest.approx(r["control"]["tokens_per_second"]
                                                   / r["plain"]["tokens_per_second"])
        assert r["control"]["shapes"] is None and r["control"]["step_ms"]
    assert result["control"]["rounds"] == 2 and "to_fixed" not in result
    lines = table({"model": "qwen3.5", "batch": 2, "accepted": 2.5, "new_tokens": 12, "device": "CPU", **result})
    assert "second plain / plain" in lines and sum(line.startswith("| ") for line in lines.splitlines()) == 3
