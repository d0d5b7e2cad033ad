"""benchmarks/cpu_eval.py: the committed CPU eval folders make the table, one row per drafter and batch size, with
the figures of their summary.json."""

from __future__ import annotations

import json

from benchmarks.cpu_eval import BATCHES, DRAFTERS, END, START, folder, part_ratios, section
from specdec.eval.summary import Segment


def test_the_table_comes_from_the_results_folders():
    text = section()
    assert text.startswith(START) and text.endswith(END)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "x |" in line]
    assert len(rows) == len(DRAFTERS) * len(BATCHES)
    runs = {(r["mode"], r["batch_size"]): r for r in json.loads((folder("mtp") / "summary.json").read_text())["runs"]}
    assert f"| MTP (`mtp`) | 1 | {runs['plain', 1]['tokens_per_second']:.1f} | " \
           f"{runs['speculative', 1]['tokens_per_second']:.1f} | {runs['speculative', 1]['speedup']:.2f}x |" in text


def test_parts_pair_each_part_of_a_mode_with_plain_decodings_same_part():
    """adaptive / plain per part: tokens/s over tokens/s of the same part; nothing without parts of both."""
    segments = {"plain-b4": [Segment(100, 1.0, 0.0), Segment(200, 4.0, 0.0)],
                "adaptive-b4": [Segment(100, 2.0, 0.0), Segment(200, 2.0, 0.0)]}
    assert part_ratios(segments, "adaptive", 4) == [0.5, 2.0]
    assert part_ratios(segments, "adaptive", 1) == []
    assert part_ratios({"plain-b4": segments["plain-b4"], "adaptive-b4": segments["adaptive-b4"][:1]}, "adaptive",
                       4) == []
