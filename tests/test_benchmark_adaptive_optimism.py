"""benchmarks/adaptive_optimism.py on the shipped Qwen3.5 (CPU): plain decoding, fixed 4-chains and adaptive
speculation at each optimism asked, in turn round by round, and the table read from their rates."""

from __future__ import annotations

from benchmarks.adaptive_optimism import engines, run, table
from specdec.eval.datasets import load_prompts


def test_each_optimism_is_an_engine_of_its_own_timed_in_turn():
    llms = engines("qwen3.5", "small", 1, [1.0, 0.0])
    assert list(llms) == ["plain decoding", "fixed 4-chains", "adaptive, optimism 1", "adaptive, optimism 0"]
    optimisms = [llm.engine.config.adaptive.optimism for name, llm in llms.items() if name.startswith("adaptive")]
    assert optimisms == [1.0, 0.0]
    assert llms["plain decoding"].engine.policy is None and llms["fixed 4-chains"].engine.policy is None
    prompts = [p.text for p in load_prompts("mt-bench", 2)]
    rates = run(llms, prompts, rounds=2, batch=1, new_tokens=8)
    assert all(len(values) == 2 and min(values) > 0 for values in rates.values())
    lines = table(llms, rates).splitlines()
    assert len(lines) == 2 + len(llms) and "| plain decoding |" in lines[2] and "1.000x" in lines[2]
    assert "plain" in lines[-1] or "chain" in lines[-1]  # (an adaptive row lists the shapes it chose)
