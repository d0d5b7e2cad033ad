"""benchmarks/cpu_eval.py: the committed CPU eval folders make the table, one row per drafter and batch size, with
the figures of their summary.json."""

from __future__ import annotations

import json

from benchmarks.cpu_eval import BATCHES, DRAFTERS, END, START, folder, section


def test_the_table_comes_from_the_results_folders():
    text = section()
    assert text.startswith(START) and text.endswith(END)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "x |" in line]
    assert len(rows) == len(DRAFTERS) * len(BATCHES)
    runs = {(r["mode"], r["batch_size"]): r for r in json.loads((folder("mtp") / "summary.json").read_text())["runs"]}
    assert f"| MTP (`mtp`) | 1 | {runs['plain', 1]['tokens_per_second']:.1f} | " \
           f"{runs['speculative', 1]['tokens_per_second']:.1f} | {runs['speculative', 1]['speedup']:.2f}x |" in text
    parts = runs["adaptive", 4]["speedup_by_part"]  # (summary.json's, from the parts' segments)
    assert len(parts) == 5 and f"{runs['adaptive', 4]['speedup']:.2f}x | {min(parts):.2f}-{max(parts):.2f} |" in text
