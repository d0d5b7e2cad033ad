"""benchmarks/study.py on the shipped Qwen3.5 (its --tiny smoke run): the JSON it writes, rooflines and peaks
included, turns into the BENCHMARKS.md section; runs split over processes are joined per model and layer count."""

from __future__ import annotations

from benchmarks.report import STUDY_END, STUDY_START, study_section
from benchmarks.study import merge, plot, run


def test_a_smoke_run_makes_the_section(tmp_path):
    result = run("qwen3.5-9b", layers=8, batches=(1, 2), new_tokens=8, device="cpu", tiny=True)
    assert {(r["backend"], r["mode"]) for r in result["rows"]} == {
        ("kvbuffer", "plain"), ("kvbuffer", "speculative"), ("recurrent", "plain"), ("recurrent", "speculative")}
    assert [r["batch_size"] for r in result["transformers"]] == [1]
    assert result["peaks"]["copy_bytes_per_second"] > 0 and "CPU" in result["peaks"]["source"]
    assert all(r["roofline_ms_per_step"] > 0 and r["x_roofline"] > 0 for r in result["rows"])
    figure = plot(result, tmp_path / "study.png")
    assert figure.read_bytes()[:4] == b"\x89PNG"
    section = study_section([result], [figure])
    assert section.startswith(STUDY_START) and section.endswith(STUDY_END) and "synthetic" not in section
    assert f"]({figure.as_posix()})" in section and "| 2 | " in section
    assert "qwen3.5-9b (8 layers), plain B=256" not in section  # no target point in a smoke run


def test_parts_of_a_model_are_joined_per_layer_count():
    part = {"model": "m", "layers": 40, "rows": [{"batch_size": 1}], "transformers": [{"batch_size": 1}]}
    other = {"model": "m", "layers": 40, "rows": [{"batch_size": 512}], "transformers": []}
    shallow = {"model": "m", "layers": 8, "rows": [{"batch_size": 1}], "transformers": []}
    joined, eight = merge([part, other, shallow])
    assert [r["batch_size"] for r in joined["rows"]] == [1, 512] and len(joined["transformers"]) == 1
    assert eight["layers"] == 8 and len(eight["rows"]) == 1
    assert part["rows"] == [{"batch_size": 1}]  # the inputs stay as they were
