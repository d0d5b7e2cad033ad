"""The benchmark report: tables generated from a run's JSON, and the BENCHMARKS.md section replaced in place."""

from __future__ import annotations

from benchmarks.report import END, START, markdown_section, write_markdown


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
