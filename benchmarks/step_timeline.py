"""Where a step's GPU idle time goes: a timeline of engine steps under torch.profiler, the engine's phases marked,
and each step's wall time split into GPU busy time, short idle gaps between kernels (launch latency inside a CUDA
graph and between graphs: under SHORT_GAP_US each) and long idle gaps, charged to the host phases running meanwhile
(the innermost one at each moment: the work the GPU waited for). benchmarks.profile_step's "host gap" is wall minus
busy time, both kinds together; this says which kind it is.

    python -m benchmarks.step_timeline --target random:qwen3.5-9b --draft synthetic:2.72 --batch 128 \\
        --out benchmarks/results/profile_h200/qwen3.5-9b_spec_b128_timeline.json.gz
    python -m benchmarks.step_timeline --read benchmarks/results/profile_h200/qwen3.5-9b_spec_b128_timeline.json.gz

The saved trace keeps the kernels, memory copies, CUDA runtime calls and phase ranges only (start and duration in
microseconds), a few MB where the full trace is hundreds.

The profiler's tracing slows graph launches: on the H200 (2026-12-03, Qwen3.5-9B speculative batch 128) the host
spent 1.0-1.4 ms in cudaGraphLaunch of the ~850-kernel verify graph under the profiler, and 0.033 ms without it, so
a long gap charged to a phase that launches a graph (score) is mostly the profiler's. The same run therefore also
times steps untraced (untraced_steps): their wall time per step, and each graph launch's host time; untraced wall
minus the traced GPU busy time is the step's real host gap. A launch's host time costs the GPU nothing while the
GPU is still on the work queued before it: each launch also says whether that work was still running when the
launch returned (an event recorded before it, queried after: the H200 run of 2026-12-03, sixth sitting, timed the
verify graph's launch at 0.51 ms untraced, where a one-off script had 0.033, and could not tell which it was).
Speculative steps: from each host wait on the device (the acceptance's read) to the next graph launch, the host's
time and the GPU's busy and idle time meanwhile (the commit graph runs then), traced; and untraced, the host's time
from the read's return to the next launch (the earlier traces: ~3 ms traced against ~1.2 ms of commit on the GPU).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

PHASE = "phase:"
STEP = PHASE + "step"
# the engine's methods whose time is a phase of a step (Engine.step is the step itself)
PHASES = ("plan", "propose", "score", "commit", "emit", "observe", "decode_step", "finish_decode", "prefill_forward")
SHORT_GAP_US = 10.0  # idle gaps shorter than this are launch latency between kernels, not host work
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# a phase's span on the GPU (its kernels' first start to last end): not host work
GPU_ANNOTATION = "gpu_user_annotation"


@contextmanager
def marked_phases(engine) -> Iterator[None]:
    """The engine's step, its phases and its acceptance inside record_function ranges named PHASE + name (the
    instance's attributes, removed again on exit)."""
    from torch.profiler import record_function

    def marked(name: str, method: Callable) -> Callable:
        def run(*args, **kwargs):
            with record_function(PHASE + name):
                return method(*args, **kwargs)
        return run

    names = [name for name in PHASES if hasattr(engine, name)]
    for name in names:
        setattr(engine, name, marked(name, getattr(engine, name)))
    engine.step = marked("step", engine.step)
    # the acceptance (read after the step, or left on the device for greedy chains, whose commit the runner
    # launches before reading them)
    outside = [(engine.acceptance, "accept", "accept"), (engine.acceptance, "accept_on_device", "accept"),
               (engine.runner, "commit_on_device", "commit")]
    outside = [(owner, name, label) for owner, name, label in outside if hasattr(owner, name)]
    for owner, name, label in outside:
        setattr(owner, name, marked(label, getattr(owner, name)))
    try:
        yield
    finally:
        for name in (*names, "step"):
            delattr(engine, name)
        for owner, name, _ in outside:
            delattr(owner, name)


def reduced_events(trace: dict) -> list[dict]:
    """The events this analysis reads, of a chrome trace exported by torch.profiler."""
    keep = []
    for event in trace["traceEvents"]:
        if event.get("ph") != "X":
            continue
        category, name = event.get("cat", ""), event.get("name", "")
        if category in GPU_CATEGORIES or category == "cuda_runtime" or name.startswith(PHASE):
            keep.append({"name": name, "cat": category, "ts": float(event["ts"]), "dur": float(event["dur"])})
    return keep


def busy_intervals(events: list[dict]) -> list[tuple[float, float]]:
    """The GPU's busy time as disjoint [start, end) intervals, in order."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] in GPU_CATEGORIES)
    merged: list[list[float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def split_steps(events: list[dict]) -> list[dict]:
    """Per engine step (from the start of one to the start of the next; the last one to its own end): wall, busy,
    short-gap and long-gap microseconds, the long gaps by the host phases running meanwhile (running_phases)."""
    busy = busy_intervals(events)
    host = [e for e in events if e["name"].startswith(PHASE) and e["cat"] != GPU_ANNOTATION]
    phases = sorted((e["ts"], e["ts"] + e["dur"], e["name"][len(PHASE):]) for e in host if e["name"] != STEP)
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in host if e["name"] == STEP)
    out = []
    for index, (start, end) in enumerate(steps):
        stop = steps[index + 1][0] if index + 1 < len(steps) else end
        gaps, cursor, busy_us = [], start, 0.0
        for s, e in busy:
            if e <= start or s >= stop:
                continue
            s, e = max(s, start), min(e, stop)
            if s > cursor:
                gaps.append((cursor, s))
            busy_us += e - s
            cursor = max(cursor, e)
        if stop > cursor:
            gaps.append((cursor, stop))
        short = sum(e - s for s, e in gaps if e - s < SHORT_GAP_US)
        by_phase: dict[str, float] = defaultdict(float)
        for s, e in gaps:
            if e - s >= SHORT_GAP_US:
                for name, us in running_phases(phases, steps, s, e):
                    by_phase[name] += us
        out.append({"wall_us": stop - start, "busy_us": busy_us, "short_gaps_us": short,
                    "short_gaps": sum(1 for s, e in gaps if e - s < SHORT_GAP_US),
                    "long_gaps_us": dict(by_phase)})
    return out


def running_phases(phases: list[tuple[float, float, str]], steps: list[tuple[float, float]], start: float,
                   end: float) -> list[tuple[str, float]]:
    """[start, end) cut where a phase begins or ends: (the innermost phase running, else "step, unmarked" inside a
    step and "between steps" outside one; microseconds) per piece."""
    cuts = sorted({start, end} | {t for p in phases for t in p[:2] if start < t < end})
    pieces = []
    for a, b in itertools.pairwise(cuts):
        middle = (a + b) / 2
        running = [p for p in phases if p[0] <= middle < p[1]]
        if running:
            name = min(running, key=lambda p: p[1] - p[0])[2]
        else:
            name = "step, unmarked" if any(s <= middle < e for s, e in steps) else "between steps"
        pieces.append((name, b - a))
    return pieces


def summary(steps: list[dict]) -> list[str]:
    """Mean per step over the steps after the first (whose start the profiler may cut), as markdown lines."""
    kept = steps[1:] or steps
    n = len(kept)
    mean = {key: sum(s[key] for s in kept) / n / 1e3 for key in ("wall_us", "busy_us", "short_gaps_us")}
    long_gaps: dict[str, float] = defaultdict(float)
    for step in kept:
        for phase, us in step["long_gaps_us"].items():
            long_gaps[phase] += us / n / 1e3
    lines = [f"{n} step{'s' * (n != 1)}: {mean['wall_us']:.2f} ms/step wall, {mean['busy_us']:.2f} on the GPU, "
             f"{mean['short_gaps_us']:.2f} in gaps under {SHORT_GAP_US:.0f} us "
             f"({sum(s['short_gaps'] for s in kept) / n:.0f} a step), {sum(long_gaps.values()):.2f} in longer ones",
             "", "| GPU idle while the host runs | ms/step |", "|---|---|"]
    lines += [f"| {phase} | {ms:.3f} |" for phase, ms in sorted(long_gaps.items(), key=lambda item: -item[1])]
    return lines


def kernel_times(events: list[dict]) -> tuple[dict[str, float], float]:
    """-> (ms a step by kernel name, launches a step) over the steps after the first (summary's), each kernel
    counted in the step whose window [its start, the next step's start) holds its start."""
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == STEP and e["cat"] != GPU_ANNOTATION)
    windows = [(start, steps[i + 1][0] if i + 1 < len(steps) else end) for i, (start, end) in enumerate(steps)]
    kept = windows[1:] or windows
    times: dict[str, float] = defaultdict(float)
    launches = 0
    for event in events:
        if event["cat"] == "kernel" and any(a <= event["ts"] < b for a, b in kept):
            times[event["name"]] += event["dur"] / len(kept) / 1e3
            launches += 1
    return dict(times), launches / max(len(kept), 1)


def kernel_lines(events: list[dict], against: list[dict] | None = None, top: int = 12) -> list[str]:
    """The step's largest kernels (names cut to 50 characters), ms a step; with `against`, another trace's beside
    them (--against: the same point before a change)."""
    ours, launches = kernel_times(events)
    theirs, their_launches = kernel_times(against) if against is not None else ({}, 0.0)
    names = sorted(ours, key=lambda name: -ours[name])[:top]
    if against is None:
        rows = [f"| {name[:50]} | {ours[name]:.3f} |" for name in names]
        return ["", f"| kernel (ms a step; {launches:.0f} launches a step) | ms |", "|---|---|", *rows]
    rows = [f"| {name[:50]} | {theirs.get(name, 0.0):.3f} | {ours[name]:.3f} |" for name in names]
    return ["", "| kernel (ms a step) | --against | this trace |", "|---|---|---|",
            f"| all kernels | {sum(theirs.values()):.3f} | {sum(ours.values()):.3f} |",
            f"| launches a step | {their_launches:.0f} | {launches:.0f} |", *rows]


READ = "cudaEventSynchronize"  # the host's wait for a step's acceptance (AcceptedOnDevice.read) or tokens
LAUNCH = "cudaGraphLaunch"


def read_windows(events: list[dict]) -> list[dict]:
    """Per wait of the host for the device (READ) followed by a graph launch: from the wait's end to the launch's
    start, the host's microseconds (the critical path of a speculative step: emit, plan, propose, the next batch),
    the GPU's busy microseconds meanwhile (the commit graph launched before the wait) and its idle ones; and from the
    launch's start to the first GPU work after it, when the GPU had nothing left to run at the launch."""
    busy = busy_intervals(events)
    runtime = sorted((e for e in events if e["cat"] == "cuda_runtime"), key=lambda e: e["ts"])
    starts = [s for s, _ in busy]
    out = []
    for index, wait in enumerate(runtime):
        if wait["name"] != READ:
            continue
        begin = wait["ts"] + wait["dur"]
        launch = next((e for e in runtime[index + 1:] if e["name"] in (LAUNCH, READ)), None)
        if launch is None or launch["name"] != LAUNCH:
            continue
        end = launch["ts"]
        busy_us = sum(min(e, end) - max(s, begin) for s, e in busy if s < end and e > begin)
        was_busy = any(s <= end < e for s, e in busy)
        first = next((s for s in starts if s >= end), None)
        out.append({"host_us": end - begin, "busy_us": busy_us, "idle_us": end - begin - busy_us,
                    "launch_to_work_us": 0.0 if was_busy or first is None else first - end})
    return out


def read_lines(windows: list[dict]) -> list[str]:
    """read_windows' means, as markdown lines (none without windows)."""
    if not windows:
        return []
    mean = {key: sum(w[key] for w in windows) / len(windows) / 1e3 for key in windows[0]}
    return ["", f"from the host's read of a step ({READ}) to its next graph launch, mean of {len(windows)}: "
            f"{mean['host_us']:.3f} ms of host work, the GPU busy {mean['busy_us']:.3f} ms of it (the work queued "
            f"before the read: the commit) and idle {mean['idle_us']:.3f}; from the launch to its first GPU work "
            f"{mean['launch_to_work_us']:.3f} ms"]


def untraced_steps(engine, device: torch.device, steps: int) -> dict:
    """`steps` engine steps without the profiler -> {"wall_ms": per step, "launches": [per CUDA graph replayed:
    launches per step, the median host ms of a launch and the share of its launches that returned while the GPU was
    still on earlier work (None off CUDA)], most expensive first}."""
    import time

    from specdec.eval.bench import synchronize
    from specdec.speculation.acceptance import AcceptedOnDevice

    launches: dict[int, list[float]] = defaultdict(list)
    covered: dict[int, list[bool]] = defaultdict(list)
    after_read: list[float] = []  # ms from an acceptance read's return to the next graph launch
    read_done: list[float] = []   # the last read's return, until a launch takes it
    replay, read = torch.cuda.CUDAGraph.replay, AcceptedOnDevice.read

    def timed_read(accepted):
        results = read(accepted)
        read_done[:] = [time.perf_counter()]
        return results

    def timed(graph) -> None:
        earlier = None
        if device.type == "cuda":  # completes when the work queued before this launch is done
            earlier = torch.cuda.Event()
            earlier.record()
        start = time.perf_counter()
        if read_done:
            after_read.append((start - read_done.pop()) * 1e3)
        replay(graph)
        launches[id(graph)].append((time.perf_counter() - start) * 1e3)
        if earlier is not None:
            covered[id(graph)].append(not earlier.query())

    torch.cuda.CUDAGraph.replay, AcceptedOnDevice.read = timed, timed_read
    try:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        synchronize(device)
        wall_ms = (time.perf_counter() - start) * 1e3 / steps
    finally:
        torch.cuda.CUDAGraph.replay, AcceptedOnDevice.read = replay, read
    per_graph = [{"per_step": len(times) / steps, "host_ms": sorted(times)[len(times) // 2],
                  "covered": sum(covered[key]) / len(covered[key]) if covered[key] else None}
                 for key, times in launches.items()]
    return {"wall_ms": wall_ms, "launches": sorted(per_graph, key=lambda g: -g["host_ms"]),
            "read_to_launch_ms": sorted(after_read)[len(after_read) // 2] if after_read else None}


def untraced_lines(untraced: dict, steps: list[dict]) -> list[str]:
    """The untraced steps' figures beside the traced ones (summary's steps)."""
    kept = steps[1:] or steps
    busy_ms = sum(s["busy_us"] for s in kept) / len(kept) / 1e3
    launches = ", ".join(f"{g['per_step']:g} a step at {g['host_ms']:.3f} ms" + (
        f" ({g['covered']:.0%} returning while the GPU was still on earlier work)" if g.get("covered") is not None
        else "") for g in untraced["launches"])
    read = untraced.get("read_to_launch_ms")
    return ["", f"untraced: {untraced['wall_ms']:.2f} ms/step wall, {untraced['wall_ms'] - busy_ms:.2f} over the "
            f"traced GPU busy time; graph launches (host): {launches or 'none'}"
            + (f"; from an acceptance read's return to the next launch (host): {read:.3f} ms, median"
               if read is not None else "")]


def record(settings, batch: int, mode: str, steps: int) -> tuple[list[dict], dict]:
    """`steps` engine steps of a batch past its prefill and a few untimed steps, profiled, then `steps` more
    untraced -> (the profiled steps' reduced events, untraced_steps' figures)."""
    from torch.profiler import ProfilerActivity, profile

    from specdec.eval.bench import bench_prompts, load_llm, synchronize, warm_up_and_prefill

    llm = load_llm(settings, "kvbuffer", mode)
    warm_up_and_prefill(llm, bench_prompts(llm, settings, batch), batch, settings)
    engine, device = llm.engine, llm.model.device
    for _ in range(4):
        engine.step()
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with marked_phases(engine), profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
        synchronize(device)
    untraced = untraced_steps(engine, device, steps)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        return reduced_events(json.loads(Path(path).read_text())), untraced


def trace_path(out: Path, target: str, mode: str, batch: int) -> Path:
    """Where --out saves the trace: the file named, or in a folder named (an existing one, or a path with no suffix)
    a file named as the committed ones are, MODEL_spec_bBATCH_timeline.json.gz (a device call's step passes its own
    folder: naming the file there was forgotten once, and the trace was lost after its steps had run)."""
    if out.is_dir() or not out.suffix:
        model = target.split(":")[1] if ":" in target else target
        return out / f"{model}_{'spec' if mode == 'speculative' else mode}_b{batch}_timeline.json.gz"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="random:qwen3.5-9b")
    parser.add_argument("--draft", default="synthetic:2.72")
    parser.add_argument("--mode", choices=("speculative", "plain"), default="speculative")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run (no GPU events: all idle)")
    parser.add_argument("--out", type=Path, default=None,
                        help="save the reduced trace (.json.gz) to this file, or in this folder (no suffix)")
    parser.add_argument("--read", type=Path, default=None, help="analyse a saved trace instead")
    parser.add_argument("--against", type=Path, default=None,
                        help="a saved trace of the same point to set beside this one's kernels (before a change)")
    args = parser.parse_args()
    if args.read is not None:
        events, untraced = load_trace(args.read)
    else:
        if args.device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("the timeline needs a CUDA GPU (or --read a saved trace, or --device cpu to smoke-test)")
        from specdec.eval.bench import BenchSettings

        settings = BenchSettings(target=args.target, draft=args.draft, batch_sizes=(args.batch,),
                                 max_new_tokens=96, prompt_tokens=128, device=args.device)
        out = None if args.out is None else trace_path(args.out, args.target, args.mode, args.batch)
        events, untraced = record(settings, args.batch, args.mode, args.steps)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(gzip.compress(json.dumps({"events": events, "untraced": untraced}).encode()))
            print(f"trace saved to {out}")
    steps = split_steps(events)
    against = load_trace(args.against)[0] if args.against is not None else None
    print("\n".join(summary(steps) + read_lines(read_windows(events))
                    + (untraced_lines(untraced, steps) if untraced else []) + kernel_lines(events, against)))


def load_trace(path: Path) -> tuple[list[dict], dict | None]:
    """A saved trace -> (its events, its untraced steps; None in traces saved before they were timed)."""
    saved = json.loads(gzip.decompress(path.read_bytes()))
    return (saved, None) if isinstance(saved, list) else (saved["events"], saved["untraced"])


if __name__ == "__main__":
    main()
