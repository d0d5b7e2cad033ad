"""The table of a folder of repeated adaptive study runs (`REPEATS=N BACKENDS=kvbuffer ACCEPTED=A
benchmarks/study_on_device.sh MODEL S "1,16,64,128,256:plain speculative adaptive"`: files study_*_accA_rN.json, or
study_*_accA.json where REPEATS=1), kept apart from the study's joined rows, whose plain and fixed rows sit beside
their baseline's (BENCHMARKS.md's adaptive tables read such folders per batch: benchmarks.study.adaptive_folders):
per model, acceptance and batch, every run's tokens/s of plain, fixed 4-chains (if run), fixed trees (a column where
the folder has "BATCHES:tree" runs) and adaptive, and adaptive against the best of plain and the fixed shapes as the
study's report takes it (each engine's median run, the lower of an even count: benchmarks.study.median_rows).

    python -m benchmarks.adaptive_runs benchmarks/results/adaptive_h200_2026-12-04k --write   # its README.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.study import median_rows


def table(folder: Path) -> list[str]:
    """Markdown rows of the table, one per (model, accepted length, batch), in file-name order."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for path in sorted(folder.glob("study_*.json")):  # (REPEATS=1 names no run: study_on_device.sh)
        result = json.loads(path.read_text())
        key = (result["model"], result["settings"]["draft"].removeprefix("synthetic:"))
        groups.setdefault(key, []).extend(result["rows"])
    trees = any(row["mode"] == "tree" for rows in groups.values() for row in rows)
    fixed_modes = ("speculative", "tree") if trees else ("speculative",)  # (their columns, in this order)
    tree_column = "fixed tree tok/s | " if trees else ""
    lines = [f"| model | accepted | batch | plain tok/s | fixed 4-chain tok/s | {tree_column}adaptive tok/s | "
             "adaptive / best | adaptive / plain | shapes chosen (median run) |",
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if trees else "")]
    for (model, accepted), rows in groups.items():
        chosen = {(r["mode"], r["batch_size"]): r for r in median_rows(rows)}
        for batch in sorted({b for _, b in chosen}):
            if ("adaptive", batch) not in chosen:
                continue
            # (fixed chains may be left out where they are far behind plain decoding: a collapsed acceptance; plain
            # decoding where it is far behind the fixed shapes, at batch 1 and 16: "best" is then of those run. Three
            # decimals: the target ">= plain" is read at 0.99-1.00x)
            plain, adaptive = chosen.get(("plain", batch)), chosen[("adaptive", batch)]
            fixed = [chosen.get((mode, batch)) for mode in fixed_modes]
            runs = ["out of memory" if row and row.get("out_of_memory") else
                    " / ".join(f"{x:.0f}" for x in row.get("runs", [row["tokens_per_second"]])) if row else "—"
                    for row in (plain, *fixed, adaptive)]
            ran = [row["tokens_per_second"] for row in (plain, *fixed) if row and not row.get("out_of_memory")]
            shapes = ", ".join(f"{label} {count}" for label, count in
                               sorted((adaptive.get("shapes") or {}).items(), key=lambda item: -item[1]))
            mine = adaptive["tokens_per_second"] if not adaptive.get("out_of_memory") else None
            ratios = [f"{mine / theirs:.3f}x" if mine and theirs else "—"
                      for theirs in (max(ran, default=None), plain and plain["tokens_per_second"])]
            lines.append(f"| {model} | {accepted} | {batch} | {' | '.join(runs)} | {ratios[0]} | {ratios[1]} | "
                         f"{shapes} |")
    return lines


HEADER = """# Adaptive speculation against plain and the fixed shapes: repeated runs

Written by `python -m benchmarks.adaptive_runs FOLDER --write` from the study runs in this folder (all layers, random
weights at real shapes, bf16, CUDA graphs captured for every row before the first is timed; the engines in turn, each
in a process of its own; fixed 4-chains, and fixed trees of --topk 2 and 16 drafts where run). tokens/s of every run,
lowest first; "adaptive / best": each engine's median run (the lower of two) against the best of plain and the fixed
shapes. Policy traces: trace_*.jsonl.gz.
"""


def provenance(folder: Path) -> list[str]:
    """Where and when the folder's runs were measured (each file's device and sitting), and the folder's NOTES.md
    (hand-written readings, kept when the README is written again) after it."""
    results = [json.loads(path.read_text()) for path in sorted(folder.glob("study_*.json"))]
    devices = sorted({r.get("device", "?") for r in results})
    sittings = sorted({r.get("sitting", "?") for r in results})
    lines = ["", f"Measured on {', '.join(devices)}; sittings {', '.join(sittings)}."]
    notes = folder / "NOTES.md"
    return lines + (["", notes.read_text().rstrip()] if notes.exists() else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--write", action="store_true", help="write FOLDER/README.md instead of printing")
    args = parser.parse_args()
    text = "\n".join([HEADER, *table(args.folder), *provenance(args.folder)]) + "\n"
    if args.write:
        (args.folder / "README.md").write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
