"""`specdec bench` on the shipped Qwen3.5 pair (CPU): every backend, mode and batch size gets a row whose figures
agree with each other and with the model's state shapes."""

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
                     "--prompt-tokens", "24", "--state-memory-gb", "1", "--output", str(out)]) == 0
    assert "| recurrent | speculative | 2 |" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
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
        assert row["new_tokens"] == 12 * batch
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
