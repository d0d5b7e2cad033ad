"""The engine benchmark's code path on a tiny model on the CPU (the GPU run uses the same functions)."""

from __future__ import annotations

from benchmarks.engine import END, START, markdown_section, qwen35_9b_shapes, run_row, table
from specdec.models import load_model
from specdec.models.random_checkpoint import save_random_checkpoint


def test_rows_and_table_from_a_tiny_run(tmp_path):
    save_random_checkpoint(qwen35_9b_shapes(4, tiny=True), tmp_path, seed=0)
    model = load_model(tmp_path, device="cpu")
    rows = [run_row(model, 2, drafter, graphs, new_tokens=6) for drafter in ("none", "ngram") for graphs in (0, 1)]
    for row in rows:
        assert row["tokens_per_s"] > 0 and row["ms_per_step"] > 0
        assert 1.0 <= row["mean_accepted_length"] <= 5.0  # 4-token chains plus the bonus at most
    assert rows[0]["mean_accepted_length"] == 1.0, "plain decoding emits one token per step"
    assert "CUDA device" in rows[1]["graph_note"]  # on the CPU the graphs row runs eagerly and says so
    lines = table(rows)
    assert len(lines) == 2 + 2 and lines[2].startswith("| 2 | none |")
    result = {"command": "--tiny", "date": "2026-11-30", "device": "CPU", "torch": "2.13", "layers": 4,
              "dtype": "float32", "new_tokens": 6, "rows": rows}
    section = markdown_section(result)
    assert section.startswith(START) and section.endswith(END) and "were not used: CUDA graphs need" in section
