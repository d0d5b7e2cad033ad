"""The benchmark report: tables generated from a run's JSON, the bound columns computed by hand on small cases, and
the BENCHMARKS.md section replaced in place."""

from __future__ import annotations

import pytest

from benchmarks.report import (
    END,
    START,
    bound_us,
    markdown_section,
    of_bound,
    replace_section,
    summary_lines,
    write_markdown,
)
from benchmarks.study_report import (
    STUDY_END,
    STUDY_START,
    adaptive_table,
    memory_table,
    mode_table,
    roofline_parts_table,
    study_section,
    study_target_lines,
)

MB = 10**6


def sample_result() -> dict:
    """A run at a copy bandwidth of 4 TB/s: 4 MB move in 1 us."""
    decode = {"section": "gdn_decode", "batch": 128, "flush_length": 16, "ours_step_us": 60.0, "ours_flush_us": 130.0,
              "ours_us": 64.4, "fla_us": 180.0, "speedup_vs_fla": 2.8, "state_read_tbps": 3.6,
              "bytes_moved": 200 * MB, "baseline_bytes_moved": 576 * MB}
    verify = {"section": "gdn_verify", "tree": "chain4", "batch": 64, "ours_us": 40.0, "baseline_us": 200.0,
              "speedup_vs_baseline": 5.0, "ours_scratch_bytes_per_request": 4 * 16512,
              "baseline_state_bytes_per_request": 4 * 2**21, "bytes_moved": 140 * MB, "baseline_bytes_moved": 680 * MB}
    tree = dict(verify, tree="tree16", ours_us=56.0, baseline_us=800.0, speedup_vs_baseline=14.3)
    batch_one = dict(verify, batch=1, ours_us=9.5, baseline_us=6.0, speedup_vs_baseline=0.63)
    flush = {"section": "gdn_fold", "case": "flush of 16 entries", "batch": 256, "folded_rows": 256, "ours_us": 320.0,
             "bytes_moved": 1024 * MB}
    append = {"section": "gdn_fold", "case": "commit, no row folds", "batch": 256, "folded_rows": 0,
              "ours_us": 12.5, "bytes_moved": 40 * MB, "baseline_us": 300.0, "speedup_vs_baseline": 24.0,
              "baseline_bytes_moved": 1024 * MB}
    mamba = {"section": "mamba2_decode", "batch": 128, "flush_length": 16, "ours_step_us": 50.0,
             "ours_flush_us": 100.0, "ours_us": 53.1, "baseline_us": 120.0, "speedup_vs_baseline": 2.26}
    mamba_verify = {"section": "mamba2_verify", "tree": "chain5", "batch": 256, "ours_us": 150.0,
                    "baseline_us": 700.0, "speedup_vs_baseline": 4.67, "bytes_moved": 540 * MB,
                    "baseline_bytes_moved": 2700 * MB}
    mamba_commit = {"section": "mamba2_commit", "case": "commit, 1 row in 8 folds", "batch": 64, "folded_rows": 8,
                    "ours_us": 40.0, "bytes_moved": 40 * MB, "baseline_us": 50.0, "speedup_vs_baseline": 1.25,
                    "baseline_bytes_moved": 160 * MB}
    return {"command": "python -m benchmarks.kernels", "date": "2026-11-29", "device": "NVIDIA H200",
            "software": {"torch": "2.11", "triton": "3.6", "fla": "fla-core", "sglang": "sglang.whl"},
            "copy_tbps": 4.0, "checks": {"gdn_decode_commit": 1e-7},
            "rows": [decode, verify, tree, batch_one, flush, append, mamba, mamba_verify, mamba_commit]}


def test_bound_is_bytes_at_copy_bandwidth():
    assert bound_us(400 * MB, 4.0) == pytest.approx(100.0)
    row = {"ours_us": 125.0, "bytes_moved": 400 * MB}
    assert of_bound(row, 4.0, "ours_us", "bytes_moved") == pytest.approx(0.8)
    assert of_bound({"ours_us": 1.0}, 4.0, "ours_us", "bytes_moved") is None  # older runs carry no bytes


def test_markdown_tables_carry_every_row_and_its_bound():
    text = markdown_section(sample_result())
    # decode: 200 MB -> 50 us of 64.4 (78%); fla 576 MB -> 144 us of 180 (80%); S0 read 3.6 of 4 TB/s (90%)
    assert "| 128 | 16 | 60.0 | 130.0 | 64.4 | 180.0 | 2.80 | — | 3.60 | 90% | 190.7 MiB | 50.0 | 78% | 80% |" in text
    # verify: 140 MB -> 35 us of 40 (88%); the baseline 680 MB -> 170 us of 200 (85%)
    assert "| chain4 | 64 | 40.0 | 200.0 | 5.00 | 0 | 64 KiB | 8 MiB | 133.5 MiB | 35.0 | 88% | 85% |" in text
    # fold: 1024 MB -> 256 us of 320 (80%), no baseline; an append-only commit of 40 MB -> 10 us of 12.5 (80%),
    # the baseline's commit (a state copied a row) 1024 MB -> 256 us of 300 (85%)
    assert "| flush of 16 entries | 256 | 256 | 320.0 | — | — | 976.6 MiB | 256.0 | 80% | — |" in text
    assert "| commit, no row folds | 256 | 0 | 12.5 | 300.0 | 24.00 | 38.1 MiB | 10.0 | 80% | 85% |" in text
    # Mamba2 decode without bytes: dashes; Mamba2 verify 540 MB -> 135 us of 150 (90%), baseline 675 of 700 (96%)
    assert "| 128 | 16 | 50.0 | 100.0 | 53.1 | 120.0 | 2.26 | — | — | — | — |" in text
    assert "| chain5 | 256 | 150.0 | 700.0 | 4.67 | 515.0 MiB | 135.0 | 90% | 96% |" in text
    # Mamba2 commit 40 MB -> 10 us of 40 (25%); the baseline's copies 160 MB -> 40 us of 50 (80%)
    assert "| commit, 1 row in 8 folds | 64 | 8 | 40.0 | 50.0 | 1.25 | 38.1 MiB | 10.0 | 25% | 80% |" in text


def test_targets_are_read_from_the_rows():
    text = "\n".join(summary_lines(sample_result()))
    assert "| GDN fold: >= 80% of copy bandwidth | 80% (256) |" in text
    assert "| GDN commit that folds no row costs an append, not a fold | 12.5 us (256) |" in text
    assert "| GDN decode amortised L=16, batch >= 128: >= 1.9x fla fused_recurrent | 2.80x (128) |" in text
    assert "| GDN verify 4-chain, batch >= 64: >= 3x SGLang's intermediate-state verify | 5.00x (64) |" in text
    assert "| GDN verify 16-node tree <= 1.5x the 4-chain | 1.40x (64) |" in text  # 56 / 40
    assert "| GDN verify 4-chain, batch 1: <= 10 us | 9.5 us (1) |" in text
    assert "| Mamba2 verify, batch 64-512: <= 1.5x its bound (>= 67% of bound) | 90% (256) |" in text


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


def test_adaptive_ratios_across_sittings_are_marked():
    """The adaptive table marks a ratio whose rows were measured on different days (a point re-run without the
    others) and says which days; rows of one day get no mark."""
    rows = [study_row("kvbuffer", mode, batch, speed, 10.0, 5.0)
            for batch in (64, 256) for mode, speed in (("plain", 100.0), ("speculative", 120.0), ("adaptive", 110.0))]
    for row in rows:
        row["shapes"] = {"chain-4": 3}
        row["date"] = "2026-12-03" if (row["batch_size"], row["mode"]) == (256, "plain") else "2026-12-02"
    lines = adaptive_table(study_result(rows))
    assert lines[2].startswith("| 64 | 100 | 120 | 110 | 0.92x | 1.10x |"), "one day: no mark"
    assert lines[3].startswith("| 256 | 100 | 120 | 110 | 0.92x * | 1.10x * |")
    assert lines[-1] == ("* adaptive measured on 2026-12-02, plain / fixed on 2026-12-02 and 2026-12-03: a ratio "
                         "across sittings, not a same-run comparison.")


def test_adaptive_engines_that_do_not_fit_are_shown_as_such():
    """A batch whose fixed and adaptive engines ran out of memory keeps its row: plain's speed, the others "out of
    memory", no ratio."""
    rows = [study_row("kvbuffer", mode, 512, 100.0, 10.0, 5.0) for mode in ("plain", "speculative", "adaptive")]
    for row in rows[1:]:
        row.update(out_of_memory=True, tokens_per_second=0.0)
    lines = adaptive_table(study_result(rows))
    assert lines[2].startswith("| 512 | 100 | out of memory | out of memory | — | — |")

