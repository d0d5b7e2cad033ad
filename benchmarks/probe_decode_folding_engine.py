"""Probe: plain decoding end to end with and without the GDN decode's folding launch (MixerOps.decode_commit_folding:
the fold step of rows in lockstep in the flush's pipelined row loop, through a decode graph of its own per bucket),
on one machine, in alternating processes. The kernel gains ~190 us a layer's fold step at batch 256 (the kernel
table of 2026-12-04), ~0.29 ms a step of Qwen3.5-9B's 24 GDN layers; the step also holds twice the decode graphs, and
steps have slowed before as an engine captured more graphs (BENCHMARKS.md, 2026-12-03): this tells the net effect.
Each turn runs `benchmarks.study` for the KVBuffer's plain rows in a process with the launch off, then one with it
on; the table gives every run's tokens/s and full-batch step time, and the medians' ratio.

    python -m benchmarks.probe_decode_folding_engine --model qwen3.5-9b --batch 256 --turns 2
    python -m benchmarks.probe_decode_folding_engine --batch 2 --turns 1 --device cpu --tiny --new-tokens 4   (smoke)

Other arguments go to benchmarks.study as they are.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import runpy
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_study(folding: bool, study_args: list[str]) -> None:
    """In this process: the study with the folding launch on, or off (every GDN layer's ops without it)."""
    if not folding:
        import specdec.backend as backend
        import specdec.cache.linear_pool as linear_pool

        linear_pool._MIXER_OPS["gdn"] = lambda name: dataclasses.replace(backend.gdn_ops(name),
                                                                          decode_commit_folding=None)
    sys.argv = ["benchmarks.study", *study_args]
    runpy.run_module("benchmarks.study", run_name="__main__")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3.5-9b")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--turns", type=int, default=2, help="off / on pairs, each run in a process of its own")
    parser.add_argument("--child", choices=("off", "on"), default=None, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.child is not None:
        run_study(args.child == "on", rest)
        return
    runs: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as folder:
        for turn in range(args.turns):
            for mode in ("off", "on"):
                out = Path(folder) / f"{mode}_{turn}.json"
                study = ["--model", args.model, "--batches", str(args.batch), "--only", "kvbuffer", "plain",
                         "--no-hf-reference", "--out", str(out), *rest]
                done = subprocess.run([sys.executable, "-m", "benchmarks.probe_decode_folding_engine", "--child",
                                       mode, *study], capture_output=True, text=True)
                if done.returncode != 0 or not out.exists():
                    print(f"[probe] turn {turn} {mode}: failed (exit {done.returncode}): {done.stderr[-400:]}",
                          flush=True)
                    continue
                row = json.loads(out.read_text())["rows"][0]
                runs[mode].append((row["tokens_per_second"], row["full_batch_step_ms"]))
                print(f"[probe] turn {turn} {mode}: {row['tokens_per_second']:.0f} tok/s, "
                      f"{row['full_batch_step_ms']:.2f} ms a full-batch step", flush=True)
    print(f"\n| folding launch | {args.model} plain batch {args.batch}: tok/s per run | full-batch step ms per run |")
    print("|---|---|---|")
    for mode, label in (("off", "off (decode_commit)"), ("on", "on (decode_commit_folding)")):
        print(f"| {label} | {', '.join(f'{t:.0f}' for t, _ in runs[mode])} | "
              f"{', '.join(f'{s:.2f}' for _, s in runs[mode])} |")
    if runs["off"] and runs["on"]:
        ratio = statistics.median(t for t, _ in runs["on"]) / statistics.median(t for t, _ in runs["off"])
        print(f"\non / off, median tokens/s: {ratio:.3f}")


if __name__ == "__main__":
    main()
