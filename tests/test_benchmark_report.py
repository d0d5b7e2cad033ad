"""The benchmark report: tables generated from a run's JSON, and the BENCHMARKS.md section replaced in place."""

from __future__ import annotations

from benchmarks.report import (
    END,
    START,
    STUDY_END,
    STUDY_START,
    markdown_section,
    memory_table,
    mode_table,
    replace_section,
    roofline_parts_table,
    study_section,
    study_target_lines,
    write_markdown,
)


def sample_result() -> dict:
    decode = {"section": "gdn_decode", "batch": 128, "flush_length": 16, "ours_step_us": 60.0, "ours_flush_us": 130.0,
              "ours_us": 64.4, "fla_us": 180.0, "speedup_vs_fla": 2.8, "state_read_tbps": 3.7}
    verify = {"section": "gdn_verify", "tree": "chain4", "batch": 64, "ours_us": 40.0, "baseline_us": 200.0,
              "speedup_vs_baseline": 5.0, "ours_scratch_bytes_per_request": 4 * 16512,
              "baseline_state_bytes_per_request": 4 * 2**21}
    mamba = {"section": "mamba2_decode", "batch": 128, "flush_length": 16, "ours_step_us": 50.0,
             "ours_flush_us": 100.0, "ours_us": 53.1, "baseline_us": 120.0, "speedup_vs_baseline": 2.26}
    return {"command": "python -m benchmarks.kernels", "date": "2026-11-29", "device": "NVIDIA H200",
            "software": {"torch": "2.11", "triton": "3.6", "fla": "fla-core", "sglang": "sglang.whl"},
            "copy_tbps": 4.27, "checks": {"gdn_decode_commit": 1e-7}, "rows": [decode, verify, mamba]}


def test_markdown_tables_carry_every_row():
    text = markdown_section(sample_result())
    assert "| 128 | 16 | 60.0 | 130.0 | 64.4 | 180.0 | 2.80 |" in text
    assert "| chain4 | 64 | 40.0 | 200.0 | 5.00 | 0 | 64 KiB | 8 MiB |" in text
    assert "| 128 | 16 | 50.0 | 100.0 | 53.1 | 120.0 | 2.26 |" in text
    assert "87%" in text  # 3.7 of 4.27 TB/s


def test_section_is_replaced_not_appended(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(f"# Benchmarks\n\nintro\n\n{START}\nold table\n{END}\n\n## Engine\nkept\n")
    write_markdown(sample_result(), path)
    write_markdown(sample_result(), path)
    text = path.read_text()
    assert text.count(START) == 1 and "old table" not in text
    assert text.startswith("# Benchmarks\n\nintro") and text.rstrip().endswith("## Engine\nkept")


# ---- the end-to-end section (benchmarks/study.py's runs) --------------------------------------------------------

def study_row(backend, mode, batch, speed, ms, roofline, requests=100, out_of_memory=False, ratio=None):
    return {"backend": backend, "mode": mode, "batch_size": batch, "tokens_per_second": speed, "ms_per_step": ms,
            "roofline_ms_per_step": roofline, "x_roofline": ms / roofline, "roofline_speedup_over_recurrent": ratio,
            "roofline_ms_by_part": {"weights": roofline / 2, "linear state": roofline / 2},
            "max_concurrent_requests": requests, "state_mib_per_request": 48.0, "out_of_memory": out_of_memory,
            "largest_batch_in_memory": 600 if not out_of_memory else None}


def study_result(rows) -> dict:
    settings = {"state_memory_gb": 40.0, "prompt_tokens": 128, "max_new_tokens": 64, "flush_length": 16,
                "draft": "synthetic:2.72"}
    return {"model": "qwen3.5-9b", "layers": 32, "target": "random:qwen3.5-9b:32", "date": "2026-12-02",
            "device": "NVIDIA H200", "torch": "2.11", "settings": settings, "transformers": [],
            "peaks": {"copy_bytes_per_second": 4.27e12, "gemm_flops_per_second": 790e12, "source": "measured"},
            "rows": rows}


def test_the_mode_tables_put_each_step_beside_its_roofline():
    result = study_result([study_row("kvbuffer", "plain", 256, 9000.0, 28.0, 9.0, ratio=1.25),
                           study_row("recurrent", "plain", 256, 9500.0, 27.0, 11.25)])
    lines = mode_table(result, "plain")
    assert lines[0].startswith("| batch | KVBuffer tok/s | ms/step | roofline ms/step | x roofline | recurrent tok/s")
    assert lines[2] == "| 256 | 9000 | 28.00 | 9.00 | 3.11x | 9500 | 27.00 | 11.25 | 2.40x | 0.95x | 1.25x |"


def test_what_did_not_fit_shows_in_the_tables():
    rows = [study_row("kvbuffer", "speculative", 512, 450.0, 50.0, 20.0, requests=50, ratio=1.6),
            study_row("recurrent", "speculative", 512, 0.0, 1.0, 1.0, requests=0, out_of_memory=True),
            study_row("recurrent", "speculative", 256, 300.0, 40.0, 30.0, requests=10)]
    result = study_result(rows)
    assert mode_table(result, "speculative")[-1] == ("| 512 | 450 | 50.00 | 20.00 | 2.50x | out of memory |  |  |  | "
                                                     "baseline out of memory | 1.60x |")
    memory = memory_table(result)
    assert memory[0] == ("|  | KVBuffer, plain | recurrent, plain | KVBuffer, speculative | intermediate states, "
                         "speculative |")
    assert memory[3] == "| requests in 40 GiB of state | — | — | 50 | 10 |", "from the engines that loaded"
    assert memory[4] == "| largest batch in GPU memory (from batch) | — | — | 600 (512) | 600 (256) |"


def test_the_targets_are_read_off_the_rows():
    rows = [study_row("kvbuffer", "plain", 256, 9000.0, 11.7, 9.0, ratio=1.25),
            study_row("recurrent", "plain", 256, 8000.0, 14.0, 11.25),
            study_row("kvbuffer", "plain", 64, 100.0, 1.0, 1.0),
            study_row("kvbuffer", "speculative", 64, 150.0, 1.0, 1.0)]
    text = "\n".join(study_target_lines([study_result(rows)]))
    assert "| qwen3.5-9b (32 layers), plain B=256: KVBuffer step <= 1.3x its roofline | 1.30x |" in text
    assert "0.9x the roofline ratio (1.25x) | 1.12x = 0.90 of it |" in text
    assert "speculative >= plain tok/s at every B <= 64 | 1.50x (64) |" in text
    parts = roofline_parts_table(study_result(rows))
    assert parts[-1] == "| measured | 11.70 | 14.00 |" and parts[-2] == "| total | 9.00 | 11.25 |"


def test_the_study_section_is_replaced_and_the_kernels_kept(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    write_markdown(sample_result(), path)
    section = study_section([study_result([study_row("kvbuffer", "plain", 1, 1.0, 1.0, 1.0)])])
    replace_section(path, STUDY_START, STUDY_END, section)
    replace_section(path, STUDY_START, STUDY_END, section)
    text = path.read_text()
    assert text.count(STUDY_START) == 1 and text.count(START) == 1
    assert "copy 4.27 TB/s, GEMM 790 TFLOP/s" in text
