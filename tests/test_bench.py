"""`specdec bench` on the shipped Qwen3.5 pair (CPU): every backend, mode and batch size gets a row whose figures
agree with each other and with the model's state shapes; transformers' generate() as the outside reference;
synthetic acceptance and the real-shape targets for random-weight benchmarks."""

from __future__ import annotations

import json
import math

import pytest

from specdec.cli import main as cli_main
from specdec.eval.bench import BenchSettings, run_bench
from specdec.models import load_model
from specdec.presets import resolve


def test_rows_are_consistent(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert cli_main(["bench", "--batch-sizes", "1", "2", "--baseline", "recurrent", "--max-new-tokens", "12",
                     "--prompt-tokens", "24", "--state-memory-gb", "1", "--hf-reference", "--output", str(out)]) == 0
    assert "| recurrent | speculative | 2 |" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    reference = [row for row in rows if row["backend"] == "transformers"]
    # decode throughput: the token each request's prefill makes is not counted
    assert [(row["batch_size"], row["new_tokens"]) for row in reference] == [(1, 11), (2, 22)]
    rows = [row for row in rows if row["backend"] != "transformers"]
    assert {(r["backend"], r["mode"], r["batch_size"]) for r in rows} == {
        (backend, mode, batch) for backend in ("kvbuffer", "recurrent") for mode in ("plain", "speculative")
        for batch in (1, 2)}
    by_key = {(r["backend"], r["mode"], r["batch_size"]): r for r in rows}
    spec = load_model(resolve("qwen3.5"), device="cpu").cache_spec()
    state = sum(math.prod(layer.state_shape) for layer in spec.linear) * 4
    entry = sum(math.prod(layer.key_shape) + math.prod(layer.value_shape) + layer.decay_heads
                for layer in spec.linear) * 4
    expected_bytes = {("kvbuffer", "plain"): state + 16 * entry, ("kvbuffer", "speculative"): state + 16 * entry,
                      ("recurrent", "plain"): state, ("recurrent", "speculative"): state * (1 + 4 + 1)}
    for (backend, mode, batch), row in by_key.items():
        assert row["new_tokens"] == 11 * batch
        assert row["tokens_per_second"] == pytest.approx(row["new_tokens"] / row["seconds"])
        assert row["state_mib_per_request"] * 2**20 == pytest.approx(expected_bytes[backend, mode])
        assert row["max_concurrent_requests"] == 2**30 // expected_bytes[backend, mode]
        if backend == "kvbuffer":
            base = by_key["recurrent", mode, batch]["tokens_per_second"]
            assert row["speedup_over_recurrent"] == pytest.approx(row["tokens_per_second"] / base)
        else:
            assert row["speedup_over_recurrent"] is None
        assert (row["mean_accepted_length"] == 1.0) == (mode == "plain")
    # the same greedy decoding either way: the drafts are accepted alike
    for batch in (1, 2):
        assert by_key["kvbuffer", "speculative", batch]["mean_accepted_length"] == pytest.approx(
            by_key["recurrent", "speculative", batch]["mean_accepted_length"])


def test_bad_batch_sizes_are_refused():
    with pytest.raises(ValueError, match="--batch-sizes needs values >= 1"):
        run_bench(BenchSettings(target="qwen3.5", batch_sizes=(0,)))


def test_synthetic_drafts_are_accepted_at_the_mean_asked_for():
    from specdec.eval.synthetic import SyntheticAcceptance, SyntheticDrafter
    from specdec.speculation import DraftTree, TreeShape

    drafter, acceptance = SyntheticDrafter(2.9, seed=3), SyntheticAcceptance(2.9, seed=3)
    drafter.check_shape(TreeShape(steps=4))
    alpha = acceptance.alpha(4)
    assert sum(alpha**i for i in range(1, 5)) == pytest.approx(1.9)
    chain = DraftTree([0, 1, 2, 3, 4], [-1, 0, 1, 2, 3])
    lengths = [len(acceptance.forced_path(chain)) for _ in range(20000)]
    assert sum(lengths) / len(lengths) == pytest.approx(2.9, abs=0.03)
    assert set(lengths) == {1, 2, 3, 4, 5}
    with pytest.raises(ValueError, match="raise --num-steps"):
        drafter.check_shape(TreeShape(steps=1))
    with pytest.raises(ValueError, match="drafts chains"):
        drafter.check_shape(TreeShape(steps=4, topk=2))


def test_the_engine_accepts_what_the_synthetic_acceptance_forces():
    from specdec.api import LLM
    from specdec.engine.engine import EngineConfig
    from specdec.eval.synthetic import synthetic_speculation

    drafter, acceptance = synthetic_speculation("synthetic:3.0")
    llm = LLM("qwen3.5", drafter, device="cpu", config=EngineConfig.from_flags(max_batch=4, max_seq_len=256),
              acceptance=acceptance)
    outputs = llm.generate(["a", "b", "c", "d"], max_new_tokens=100)
    steps = [n for out in outputs for n in out.stats.emitted_per_step]
    assert sum(steps) / len(steps) == pytest.approx(3.0, abs=0.35) and max(steps) == 5
    with pytest.raises(ValueError, match="e.g. synthetic:2.9"):
        synthetic_speculation("synthetic:lots")


def test_real_shapes():
    from specdec.models.real_shapes import nemotron3_nano, qwen35_9b
    from specdec.presets import resolve

    qwen = qwen35_9b()
    assert qwen.num_hidden_layers == 32 and qwen.layer_types.count("full_attention") == 8
    assert (qwen.linear_num_value_heads, qwen.linear_key_head_dim, qwen.hidden_size) == (32, 128, 4096)
    nano = nemotron3_nano()
    assert len(nano.layers_block_type) == 52 and nano.layers_block_type.count("full_attention") == 6
    assert nano.layers_block_type.count("moe") == 23 and nano.layers_block_type.count("linear_attention") == 23
    assert nemotron3_nano(8).layers_block_type[:6] == ["linear_attention", "moe", "linear_attention", "moe",
                                                       "linear_attention", "full_attention"]
    with pytest.raises(ValueError, match="known: qwen3.5-9b, nemotron-3-nano"):
        resolve("random:llama-8b")
    with pytest.raises(ValueError, match="1 to 32 layers"):
        resolve("random:qwen3.5-9b:40")
    with pytest.raises(ValueError, match="layer count"):
        resolve("random:qwen3.5-9b:many")


@pytest.mark.parametrize("backend", ["kvbuffer", "recurrent"])
def test_the_memory_column_is_what_the_pools_hold(backend):
    """State MiB per request (and so requests in the budget) is what the engine's linear-attention pools allocate
    per request slot: committed state + buffer entries, or committed state + the reserved node states."""
    from specdec.eval.bench import linear_state_bytes, load_llm

    settings = BenchSettings(target="qwen3.5", draft="synthetic:2.7", batch_sizes=(3,), max_new_tokens=8,
                             device="cpu")
    llm = load_llm(settings, backend, "speculative")
    cache = llm.engine.runner.cache
    held = sum(pool.linear_state.nbytes() + sum(t.numel() * t.element_size()
                                                for t in (pool.state, pool.buf_key, pool.buf_value, pool.buf_gcum))
               for pool in cache.linear)
    assert held == cache.config.max_requests * linear_state_bytes(llm, settings, backend, "speculative")


def test_what_does_not_fit_the_device_is_a_row_not_a_crash(monkeypatch):
    """An engine whose pools do not fit (here: the baseline's speculative engine), or a batch that runs out of
    memory mid-run (the kvbuffer plain batch of 2), gives rows marked out of memory; the rest is measured."""
    import torch

    from specdec.eval import bench

    load, time_batch = bench.load_llm, bench.time_batch

    def load_or_fail(settings, backend, mode):
        if (backend, mode) == ("recurrent", "speculative"):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return load(settings, backend, mode)

    def time_or_fail(llm, prompt, batch_size, settings, backend, mode, *rest):
        if (backend, mode, batch_size) == ("kvbuffer", "plain", 2):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return time_batch(llm, prompt, batch_size, settings, backend, mode, *rest)

    monkeypatch.setattr(bench, "load_llm", load_or_fail)
    monkeypatch.setattr(bench, "time_batch", time_or_fail)
    rows = run_bench(BenchSettings(target="qwen3.5", draft="synthetic:2.5", batch_sizes=(1, 2, 3), baseline=True,
                                   max_new_tokens=6, prompt_tokens=8, device="cpu"))
    failed = {(r.backend, r.mode, r.batch_size) for r in rows if r.out_of_memory}
    assert failed == {("kvbuffer", "plain", 2), ("kvbuffer", "plain", 3), ("recurrent", "speculative", 1),
                      ("recurrent", "speculative", 2), ("recurrent", "speculative", 3)}
    assert all(r.tokens_per_second > 0 for r in rows if not r.out_of_memory) and len(rows) == 12
    by_key = {(r.backend, r.mode, r.batch_size): r for r in rows}
    assert by_key["kvbuffer", "speculative", 1].speedup_over_recurrent is None  # nothing to compare with
    assert by_key["kvbuffer", "plain", 1].speedup_over_recurrent is not None
    assert "| kvbuffer | plain | 2 | out of memory |" in bench.markdown_table(rows, 40.0)
