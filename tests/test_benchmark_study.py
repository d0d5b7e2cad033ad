"""benchmarks/study.py on the shipped Qwen3.5 (its --tiny smoke run): the JSON it writes turns into the
BENCHMARKS.md section, one table row per batch size with both backends side by side."""

from __future__ import annotations

from benchmarks.study import END, START, markdown_section, merge, plot, run, table, target_lines


def test_a_smoke_run_makes_the_section(tmp_path):
    result = run("qwen3.5-9b", layers=8, batches=(1, 2), new_tokens=8, device="cpu", tiny=True)
    assert {(r["backend"], r["mode"]) for r in result["rows"]} == {
        ("kvbuffer", "plain"), ("kvbuffer", "speculative"), ("recurrent", "plain"), ("recurrent", "speculative")}
    assert [r["batch_size"] for r in result["transformers"]] == [1]
    lines = table(result)
    assert len(lines) == 2 + 2 and lines[2].startswith("| 1 |") and lines[3].endswith(" |  |")
    figure = plot(result, tmp_path / "study.png")
    assert figure.read_bytes()[:4] == b"\x89PNG"
    section = markdown_section([result], {"qwen3.5-9b": figure})
    assert section.startswith(START) and section.endswith(END) and "synthetic" not in section
    assert f"]({figure.as_posix()})" in section


def test_parts_of_a_model_are_joined():
    part = {"model": "m", "rows": [{"batch_size": 1}], "transformers": [{"batch_size": 1}]}
    other = {"model": "m", "rows": [{"batch_size": 512}], "transformers": []}
    (joined,) = merge([part, other])
    assert [r["batch_size"] for r in joined["rows"]] == [1, 512] and len(joined["transformers"]) == 1
    assert part["rows"] == [{"batch_size": 1}]  # the inputs stay as they were



def test_the_targets_are_read_off_the_rows():
    def row(backend, mode, batch, speed, requests):
        return {"backend": backend, "mode": mode, "batch_size": batch, "tokens_per_second": speed,
                "max_concurrent_requests": requests}

    rows = [row("kvbuffer", "plain", 128, 300.0, 90), row("recurrent", "plain", 128, 200.0, 100),
            row("kvbuffer", "speculative", 128, 450.0, 50), row("recurrent", "speculative", 128, 300.0, 10),
            row("kvbuffer", "plain", 64, 1.0, 90), row("recurrent", "plain", 64, 9.0, 100)]
    lines = target_lines([{"model": "qwen3.5-9b", "rows": rows}])
    assert lines[2].endswith("| 1.50x (128) |"), "plain: batch >= 128 only"
    assert lines[3].endswith("| 1.50x (128) |") and lines[4].endswith("| 5.0x |")


def test_an_engine_that_did_not_fit_shows_in_the_tables():
    def row(backend, mode, speed, requests, out_of_memory=False):
        return {"backend": backend, "mode": mode, "batch_size": 512, "tokens_per_second": speed,
                "max_concurrent_requests": requests, "out_of_memory": out_of_memory}

    rows = [row("kvbuffer", "plain", 300.0, 90), row("recurrent", "plain", 200.0, 100),
            row("kvbuffer", "speculative", 450.0, 50), row("recurrent", "speculative", 0.0, 0, out_of_memory=True)]
    smaller = [dict(r, batch_size=256, tokens_per_second=100.0, out_of_memory=False) for r in rows]
    smaller[3]["max_concurrent_requests"] = 10  # the baseline's speculative engine loaded at batch 256
    result = {"model": "qwen3.5-9b", "rows": rows + smaller, "transformers": [],
              "settings": {"state_memory_gb": 40.0}}
    lines = table(result)
    assert lines[-1] == ("| 512 | 300 | 200 | 1.50x | 450 | out of memory | intermediate states out of memory | "
                         "50 / 10 (5.0x) |  |"), "requests in the budget come from the batch that loaded"
    assert "intermediate states out of memory (512)" in "\n".join(target_lines([result]))
