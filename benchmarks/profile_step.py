"""Where a decode / verify step's time goes on the GPU: `specdec bench`'s timed round under torch.profiler, per
backend: the wall time per step, the GPU's busy time per step (the rest, the host gap, is host work and idle time
between kernels), the kernels that take it, and beside them the roofline of the same steps op by op
(specdec/eval/roofline.py, peaks measured at the start). Printed, and with --out written as markdown, e.g.
    python -m benchmarks.profile_step --target random:nemotron-3-nano --draft synthetic:2.58 --batch 128 \\
        --out benchmarks/results/profile_h200/nemotron-3-nano_spec_b128.md
    python -m benchmarks.profile_step --target random:qwen3.5-9b --draft synthetic:2.72 --batch 1 \\
        --backends kvbuffer --mode tree     (then --mode adaptive: the study's fixed tree and adaptive rows' engines)
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import kernel_settings
from benchmarks.study import TREE
from specdec.eval.bench import (
    BenchSettings,
    bench_peaks,
    bench_prompts,
    experts_vs_uniform,
    free_device_memory,
    load_llm,
    step_workloads,
    warm_up_and_prefill,
)
from specdec.eval.peaks import Peaks
from specdec.eval.roofline import roofline
from specdec.eval.step_cost import with_device_prior
from specdec.models.expert_traffic import ExpertTraffic


def profile_backend(settings: BenchSettings, backend: str, mode: str, batch: int, top: int,
                    peaks: Peaks) -> list[str]:
    llm = load_llm(settings, backend, "speculative" if mode == "tree" else mode)  # (a tree: fixed speculation)
    with_device_prior(llm, peaks)  # (adaptive: the policy's prior, as the study's)
    traffic = ExpertTraffic(llm.model)  # before any graph is captured, as the study's: the counts are captured too
    requests = warm_up_and_prefill(llm, bench_prompts(llm, settings, batch), batch, settings)
    traffic.reset()
    graphs = llm.engine.runner.graphs
    captured_before = len(graphs._steps) if graphs is not None else 0
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities, record_shapes=not settings.cuda_graphs) as prof:
        start = time.perf_counter()
        llm.engine.run()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    steps = max(r.stats.steps for r in requests)
    captured = (len(graphs._steps) - captured_before) if graphs is not None else 0
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name][0] += event.device_time / 1e3  # ms
            kernels[event.name][1] += 1
    busy = sum(total for total, _ in kernels.values())
    wall = 1e3 * seconds / steps
    within, between = device_gaps(prof.events(), steps)
    ops, factor = roofline_by_op(llm, requests, settings, backend, settings.prompt_tokens, peaks, steps,
                                 traffic if traffic.any else None)
    experts = f" (MoE expert reads x{factor:.2f}: the experts the steps touched / uniform routing's)" \
        if factor is not None else ""
    lines = [f"## {backend} {mode}, batch {batch}: {wall:.2f} ms/step wall, {busy / steps:.2f} ms/step on the GPU "
             f"(host gap {wall - busy / steps:.2f}), roofline {sum(ops.values()):.2f} ms/step{experts}, {steps} "
             f"steps; CUDA graphs: {llm.engine.runner.graph_note or 'on'}, {captured} captured while timed", "",
             f"The GPU idle between its kernels: {within:.4f} ms/step in gaps of at most {GRAPH_GAP_US} us (inside a "
             f"step's graph), {between:.4f} ms/step in longer ones (between steps, or waiting for the host).", "",
             "| kernel | ms/step | calls/step |", "|---|---|---|"]
    for name, (total, calls) in sorted(kernels.items(), key=lambda item: -item[1][0])[:top]:
        lines.append(f"| {name[:90]} | {total / steps:.3f} | {calls / steps:.1f} |")
    if not settings.cuda_graphs:  # eager steps: which torch op (and input shapes) launched the GPU time
        lines += ["", "GPU time by the op that launched it (eager steps):", "",
                  "| op | input shapes | ms/step | calls/step |", "|---|---|---|---|"]
        by_op = [e for e in prof.key_averages(group_by_input_shape=True) if e.self_device_time_total > 0]
        for event in sorted(by_op, key=lambda e: -e.self_device_time_total)[:top]:
            lines.append(f"| {event.key} | {str(event.input_shapes)[:80]} | "
                         f"{event.self_device_time_total / 1e3 / steps:.3f} | {event.count / steps:.1f} |")
    # the host's side: where the CPU's time per step goes (a launch, a wait for the device, the torch ops' own work;
    # the engine's Python between them does not show: profile it with cProfile)
    lines += ["", "The host's time by CPU op (self time; cudaEventSynchronize & co: the host waiting for the device):",
              "", "| CPU op | ms/step | calls/step |", "|---|---|---|"]
    host = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    for event in sorted(host, key=lambda e: -e.self_cpu_time_total)[:top]:
        ms = event.self_cpu_time_total / 1e3 / steps
        lines.append(f"| {event.key[:90]} | {ms:.3f} | {event.count / steps:.1f} |")
    lines += ["", f"The roofline of the same steps, by op ({peaks}):", "", "| op | ms/step |", "|---|---|"]
    lines += [f"| {name} | {ms:.3f} |" for name, ms in sorted(ops.items(), key=lambda item: -item[1]) if ms >= 0.001]
    return lines


GRAPH_GAP_US = 20.0  # the longest gap counted as one between two kernels of a step (a launch's latency, ~1-4 us)


def device_gaps(events, steps: int) -> tuple[float, float]:
    """-> (ms per step the GPU sat idle between consecutive device events, kernels and copies, in gaps of at most
    GRAPH_GAP_US; ms per step in longer gaps). Whether a step's time above its kernels' is spread between them or
    sits between steps (the adaptive engine's plain steps: 8 us a step above plain decoding's on the H100, with
    kernel times equal to the profile's rounding, 2026-12-07)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    within = between = 0.0
    end = None
    for start, stop in spans:
        if end is not None and start > end:
            gap = start - end  # (us)
            if gap <= GRAPH_GAP_US:
                within += gap
            else:
                between += gap
        end = stop if end is None else max(end, stop)
    return within / 1e3 / steps, between / 1e3 / steps


def roofline_by_op(llm, requests, settings: BenchSettings, backend: str, prompt_tokens: int, peaks: Peaks,
                   steps: int, traffic: ExpertTraffic | None = None) -> tuple[dict[str, float], float | None]:
    """ms per step of each roofline op (all its layers), over the steps the round ran, and for a MoE model the
    factor its expert reads were scaled by: the distinct experts the steps touched / uniform routing's, as the
    study's roofline (specdec/eval/bench.py time_batch; random weights crowd tokens onto fewer experts)."""
    work = step_workloads(requests, llm, settings, backend, prompt_tokens)
    factor = experts_vs_uniform(traffic, llm.model.hf_config, work) if traffic is not None else None
    if factor is not None:
        work = [replace(w, expert_factor=factor) for w in work]
    total: dict[str, float] = defaultdict(float)
    for one in work:
        for name, ms in roofline(llm.model.hf_config, one, peaks).ms_by_op().items():
            total[name] += ms / steps
    return dict(total), factor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", default=None, help="e.g. synthetic:2.6 (default: plain decoding)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--backends", nargs="+", default=["kvbuffer", "recurrent"])
    parser.add_argument("--mode", choices=("plain", "speculative", "tree", "adaptive"), default=None,
                        help="default: speculative with --draft, else plain (plain with --draft: the same prompts); "
                             "tree: fixed static trees, the study's (benchmarks.study TREE), which adaptive "
                             "speculation is offered beside its chains, as in the study")
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--out", type=Path, default=None, help="also write the tables to this markdown file")
    parser.add_argument("--eager", action="store_true",
                        help="run the steps eagerly (no CUDA graphs) and attribute GPU time to the torch ops")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the step profile needs a CUDA GPU")
    mode = args.mode or ("speculative" if args.draft else "plain")
    if mode != "plain" and not args.draft:
        raise SystemExit(f"--mode {mode} needs a drafter: add --draft (e.g. synthetic:2.6)")
    settings = BenchSettings(target=args.target, draft=args.draft, batch_sizes=(args.batch,),
                             max_new_tokens=args.new_tokens, device="cuda", cuda_graphs=not args.eager,
                             speculation=("adaptive",) if mode == "adaptive" else ("fixed",),
                             **(TREE if mode in ("tree", "adaptive") else {}))
    peaks = bench_peaks(settings)
    text = [f"# Step profile: `python -m benchmarks.profile_step --target {args.target}"
            + (f" --draft {args.draft}" if args.draft else "") + (f" --mode {args.mode}" if args.mode else "")
            + f" --batch {args.batch}"
            + (" --eager" if args.eager else "") + "` "
            f"({torch.cuda.get_device_name()}, torch {torch.__version__})."
            + kernel_settings.sentence(kernel_settings.applied()), ""]
    for backend in args.backends:
        lines = profile_backend(settings, backend, mode, args.batch, args.top, peaks)
        free_device_memory()  # the engine's pools and graphs (reference cycles) before the next backend's load
        print("\n".join(lines) + "\n", flush=True)
        text += lines + [""]
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(text))


if __name__ == "__main__":
    main()
