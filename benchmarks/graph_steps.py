"""Why a step of adaptive speculation's engine costs more than the same step of a fixed engine (the H200 study of
2026-12-02 evening, batch 1: 4-chain steps 7.14 against 6.61 ms, plain steps 4.25 against 3.90, the same kernels
and GPU time; a timeline showed the GPU running the graph with ~0.4 us more between kernels). The engines differ in
the CUDA graphs their runner holds: plain decoding one decode graph per bucket, a fixed engine one verify (+ commit)
graph per bucket, the adaptive engine a verify graph per chain width in one memory pool with its decode graphs.
This times the same steps on engine variants built in turn in one process, batch 1, greedy, synthetic drafts:

    python -m benchmarks.graph_steps --target random:nemotron-3-nano [--max-batch 1] [--only NAME NAME ...]

Variants (`variants`): plain decoding (with 0.2-2 ms of host work added per step before or after its launch, the
host asleep, or waiting for each step); the adaptive engine held to plain steps (default widths; widths 1 and 5
only; its decode graphs in a memory pool of their own; its policy replaced by one that plans plain steps and
learns nothing); fixed 4-chains; the adaptive engine held to 4-chains. Each: ms per step (median of --rounds runs
of --new-tokens), the host's time inside CUDAGraph.replay per step (the launch), the graphs captured, the device
memory left after it, and the GPU's SM clock and temperature while it ran (nvidia-smi, sampled every 100 ms).

H200 runs of 2026-12-02/03 (Qwen3.5-9B, max batch 1): the first runs read as the adaptive engine's cost (plain
5.47-5.56 ms/step, every other variant 5.76-5.91, however much host work was added: 0.2 and 2 ms alike, asleep
alike, after the launch alike), but a variant's place in the process decides it: plain decoding run 2nd and 4th
gave 5.54 and 5.82, host work run 1st and 5th 5.60 and 5.91, and four plain runs in a row 5.56, 5.53, 5.54, 5.82.
Then each variant's engine outlived it (a reference cycle through the requests kept, freed by a later collection:
16.9 GiB of Qwen3.5-9B after each; at Nemotron-3-Nano, max batch 256, 73 GiB, and the next engine ran out of
memory); variants now drop every reference first. So compare variants only in alternation, repeated; the clock
column is there to tell a GPU running slower over a process's life from an engine that is. The host's launch is
0.01-0.05 ms per step in all (the profiler's 0.8-2 ms was its own overhead). At max batch 256, one variant per
process in turn (2026-12-03): "adaptive held to 4-chains" still measured plain steps (its policy explores), so the
variants whose policy always plans 4-chains compare the steps themselves: the adaptive engine offering 4-chains only
ran as fixed 4-chains did, offering chains of 1, 2 and 4 (more graphs held) ~10% slower, and fixed 4-chains holding
the graphs of batches up to 16 too ~5% slower (BENCHMARKS.md). On an H100 (2026-12-05, max batch 16, six calls;
benchmarks/results/profile_h100/graph_steps_nemotron_b1_maxbatch16_2026-12-05.txt): fixed 4-chains 6.63-6.83 ms a
step, the steps of batches up to 16 run eagerly first 6.60-6.85, batch 1's captured first and then the others'
6.88-7.08 (replayed at once, before the others' captures: 6.93-7.01), widths 2 and 3 captured too 6.82-7.10
(CUDA_MODULE_LOADING=EAGER and expandable segments alike), the adaptive engine of chains 1, 2, 4 held to 4-chains
6.79-7.09, each of its graphs replayed once after its capture 6.79-6.95: captures, not the kernels they compile nor
the order of capture or upload, slow the hot step. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import time
from dataclasses import replace

import torch

from specdec.api import LLM
from specdec.engine.engine import EngineConfig
from specdec.eval.bench import (
    BenchSettings,
    bench_prompts,
    free_device_memory,
    synchronize,
    warm_up_and_prefill,
)
from specdec.eval.step_cost import default_peaks, with_device_prior
from specdec.eval.synthetic import synthetic_speculation
from specdec.speculation.adaptive import AdaptiveConfig
from specdec.speculation.adaptive.plan import StepPlan

# the adaptive policy held to one shape: no request counts as drafting-worthy (collapse > 1) or every one does
# (collapse 0, only 4-chains offered), no probes, no refreshes
HELD_PLAIN = AdaptiveConfig(collapse=1.01, probe_every=10**9, refresh_every=0)
HELD_CHAINS = AdaptiveConfig(chains=(4,), collapse=0.0, probe_every=10**9, refresh_every=0)


def variants(max_batch: int) -> dict[str, tuple[EngineConfig, str | None, str | None]]:
    """name -> (engine config, synthetic draft or None, what to change before capture)."""
    fixed = EngineConfig.from_flags(max_batch=max_batch, max_seq_len=512, speculation="fixed")
    adaptive = replace(EngineConfig.from_flags(max_batch=max_batch, max_seq_len=512, speculation="adaptive"),
                       adaptive=HELD_PLAIN)
    return {
        "plain decoding": (fixed, None, None),
        "adaptive held to plain": (adaptive, "synthetic:1.2", None),
        "adaptive held to plain, widths 1 and 5": (replace(adaptive, adaptive=replace(HELD_PLAIN, chains=(4,))),
                                                   "synthetic:1.2", None),
        "adaptive held to plain, decode graphs' own pool": (adaptive, "synthetic:1.2", "own pool"),
        "adaptive, a policy that plans plain steps and learns nothing": (adaptive, "synthetic:1.2", "idle policy"),
        "plain decoding, 0.5 ms more host work a step": (fixed, None, "busy host 0.5"),
        "plain decoding, 1 ms more host work a step": (fixed, None, "busy host 1"),
        "plain decoding, 2 ms more host work a step": (fixed, None, "busy host 2"),
        "plain decoding, 0.2 ms more host work a step": (fixed, None, "busy host 0.2"),
        "plain decoding, the host asleep 0.5 ms a step": (fixed, None, "sleeping host 0.5"),
        "plain decoding, 2 ms more host work a step after its launch": (fixed, None, "busy launch 2"),
        "plain decoding, the host waiting for each step": (fixed, None, "synchronized host"),
        "fixed 4-chains": (fixed, "synthetic:2.72", None),
        "fixed 4-chains, the steps of batches up to 16 captured too": (fixed, "synthetic:2.72", "buckets 16"),
        "fixed 4-chains, the steps of batches up to 16 captured too, a memory pool each": (
            fixed, "synthetic:2.72", "buckets 16, own pools"),
        # whether graphs held, or graphs ever captured, slow the step: the extra ones destroyed before timing
        "fixed 4-chains, the steps of batches up to 16 captured, then all but batch 1's dropped": (
            fixed, "synthetic:2.72", "buckets 16, dropped"),
        # ... or the kernels those captures compiled and loaded: the steps of batches up to 16 run eagerly on their
        # padding rows (every kernel of theirs compiled, loaded and launched), none captured, then batch 1's captured
        "fixed 4-chains, the steps of batches up to 16 run eagerly, never captured": (
            fixed, "synthetic:2.72", "buckets 16, eager"),
        # ... or where batch 1's graph lands: captured first, then the others (capture_buckets takes the largest
        # first, so batch 1's comes last in the variants above and in the study)
        "fixed 4-chains, batch 1's step captured first, then those of batches up to 16": (
            fixed, "synthetic:2.72", "buckets 16, batch 1 first"),
        # ... or the widths an adaptive engine captures beside the 4-chains' (2 and 3: chains of 1 and 2), never
        # replayed: the adaptive engine's 4-chain steps ran 2.5% slower than a fixed engine's at batch 1 on the H100
        # (2026-12-05, benchmarks/results/adaptive_h100_2026-12-05b), the policy choosing 4-chains 95% of its steps
        "fixed 4-chains, widths 2 and 3 captured too": (fixed, "synthetic:2.72", "widths 2 3"),
        "adaptive held to 4-chains": (replace(adaptive, adaptive=HELD_CHAINS), "synthetic:2.72", None),
        "adaptive, a policy that plans 4-chains and learns nothing": (replace(adaptive, adaptive=HELD_CHAINS),
                                                                      "synthetic:2.72", "chains policy"),
        # the study's adaptive engine: chains of 1, 2 and 4 (graphs of widths 1, 2, 3 and 5 beside the decode graphs)
        "adaptive (chains 1, 2, 4), a policy that plans 4-chains and learns nothing": (
            replace(adaptive, adaptive=AdaptiveConfig()), "synthetic:2.72", "chains policy"),
        "adaptive (chains 1, 2, 4) as the study runs it (roofline prior, traced)": (
            replace(adaptive, adaptive=AdaptiveConfig()), "synthetic:2.72", "study policy"),
        # ... or the order in which the graphs first reach the device: a graph is uploaded at its first launch unless
        # uploaded before (cudaGraphUpload), so the hot one's first launch comes after the others' instantiation;
        # here each is replayed once on its padding rows right after its capture, as its eager warm-up ran
        "fixed 4-chains, the steps of batches up to 16 captured too, each replayed right after its capture": (
            fixed, "synthetic:2.72", "buckets 16, uploaded"),
        # ... both: batch 1's captured first and replayed at once (on the device before any other capture exists)
        "fixed 4-chains, batch 1's step captured and replayed first, then those of batches up to 16, each replayed": (
            fixed, "synthetic:2.72", "buckets 16, batch 1 first, uploaded"),
        "adaptive (chains 1, 2, 4), a policy that plans 4-chains, each graph replayed right after its capture": (
            replace(adaptive, adaptive=AdaptiveConfig()), "synthetic:2.72", "chains policy, uploaded"),
    }


def replayed_after_capture(graphs) -> None:
    """Each step `graphs` builds from now on replays its captured graphs once, on its padding rows, right after the
    capture (the forward, the folding forward, the commit: what its eager warm-up ran)."""
    build = graphs._build

    def build_and_replay(*key):
        step = build(*key)
        for graph in (step.forward_graph, step.folding_graph, step.commit_graph):
            if graph is not None:
                graph.replay()
        torch.cuda.synchronize()
        return step
    graphs._build = build_and_replay


def busy_after(step, seconds: float, spin: bool = True):
    """step (any call), then `seconds` of host work (spin: the thread stays busy holding the GIL, as Python
    planning would keep it; else it sleeps, the GIL released)."""
    def busy_step(*args):
        finished = step(*args)
        if not spin:
            time.sleep(seconds)
            return finished
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            pass
        return finished
    return busy_step


def synchronized(step, device):
    """step, then wait for the device to finish all it was given (no step launched ahead)."""
    def waiting_step():
        finished = step()
        synchronize(device)
        return finished
    return waiting_step


class GpuClocks:
    """The GPU's SM clock (MHz) and temperature (C) sampled by `nvidia-smi -lms 100` while installed; empty where
    nvidia-smi is absent. Each `with` adds its samples."""

    def __init__(self):
        self.samples: list[tuple[float, float]] = []

    def __enter__(self):
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        try:
            self._smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,temperature.gpu", "-i", str(index),
                                          "--format=csv,noheader,nounits", "-lms", "100"],
                                         stdout=subprocess.PIPE, text=True)
        except OSError:
            self._smi = None
        return self

    def __exit__(self, *exc):
        if self._smi is None:
            return
        self._smi.terminate()
        out, _ = self._smi.communicate()
        for line in out.splitlines():
            try:
                sm, temperature = (float(v) for v in line.split(","))
            except ValueError:
                continue
            self.samples.append((sm, temperature))

    def summary(self) -> str:
        if not self.samples:
            return "clocks not read"
        sm = statistics.median(s for s, _ in self.samples)
        return f"SM {sm:.0f} MHz (min {min(s for s, _ in self.samples):.0f}), {max(t for _, t in self.samples):.0f} C"


class LaunchClock:
    """Host seconds spent inside torch.cuda.CUDAGraph.replay (the graph launch), while installed."""

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0
        self._replay = torch.cuda.CUDAGraph.replay

    def __enter__(self):
        clock, replay = self, self._replay

        def timed(graph):
            start = time.perf_counter()
            replay(graph)
            clock.seconds += time.perf_counter() - start
            clock.calls += 1

        torch.cuda.CUDAGraph.replay = timed
        return self

    def __exit__(self, *exc):
        torch.cuda.CUDAGraph.replay = self._replay


def time_variant(target: str, config: EngineConfig, draft: str | None, change: str | None, new_tokens: int,
                 rounds: int, device: str = "cuda") -> tuple[float, float, int, str, str]:
    """-> (ms per step, launch ms per step, step buckets captured, the GPU's clock while it ran, the shapes the last
    round's steps ran). device "cpu": the same steps run eagerly (a dry run of this script; no graphs, no
    launches)."""
    acceptance = None
    if draft is not None:
        draft, acceptance = synthetic_speculation(draft, config.shape.depth)
    llm = LLM(target, draft, device=device, config=config, acceptance=acceptance)
    runner = llm.engine.runner
    if change and change.endswith(", uploaded"):  # (then as the variant without it)
        change = change.removesuffix(", uploaded")
        for graphs in {runner.graphs, runner.decode_graphs} - {None}:
            replayed_after_capture(graphs)
    if change == "own pool" and runner.decode_graphs is not None:  # (before any capture: a graph takes the pool)
        runner.decode_graphs._pool = torch.cuda.graph_pool_handle()
    if change in ("idle policy", "chains policy"):  # the adaptive engine's steps without the policy's Python
        # (HELD_CHAINS alone may still choose a plain step to measure its cost)
        held_steps = 0 if change == "idle policy" else max(llm.engine.policy.config.chain_lengths)
        # (the policy's plan(ids, contexts, backlog): whatever follows the ids is ignored)
        llm.engine.policy.plan = lambda ids, *_: StepPlan(held_steps, (held_steps > 0,) * len(ids))
        llm.engine.policy.observe = lambda *args, **kwargs: None
    if change == "study policy":  # as `specdec bench --policy-trace` sets it up
        with_device_prior(llm, default_peaks(torch.device(device)))
        llm.engine.policy.trace = []
    if change == "busy launch 2":  # the same work between the launch and the wait for the step before
        runner.decode_next = busy_after(runner.decode_next, 2e-3)
    elif change and change.split()[0] in ("busy", "sleeping"):  # plain decoding with host work between its steps
        llm.engine.step = busy_after(llm.engine.step, float(change.split()[-1]) * 1e-3, spin=change.startswith("busy"))
    if change == "synchronized host":
        llm.engine.step = synchronized(llm.engine.step, llm.model.device)
    settings = BenchSettings(target=target, batch_sizes=(1,), max_new_tokens=new_tokens, device=device)
    prompts = bench_prompts(llm, settings, 1)
    if change == "buckets 16, own pools":  # (each graph's scratch its own, none reused from another's)
        graphs, build = runner.graphs, runner.graphs._build

        def build_in_own_pool(*key):
            graphs._pool = torch.cuda.graph_pool_handle()
            return build(*key)
        graphs._build = build_in_own_pool
    if change == "buckets 16, eager":  # built without capture, run once on their padding rows, then forgotten
        graphs = runner.graphs
        graphs.capture = False
        llm.engine.prepare_steps(16, len(prompts[0]), new_tokens)
        for step in graphs._steps.values():
            graphs._forward(step)
            graphs._commit(step)
        graphs._steps, graphs.capture = {}, True
        torch.cuda.synchronize()
    elif change and change.startswith("buckets 16"):  # more graphs held, none replayed (a server captures them all)
        if change == "buckets 16, batch 1 first":
            llm.engine.prepare_steps(1, len(prompts[0]), new_tokens)
        llm.engine.prepare_steps(16, len(prompts[0]), new_tokens)
    if change == "widths 2 3":  # (the fixed engine replays width 5 alone; these are captured and left)
        runner.graphs.set_widths((2, 3))
        llm.engine.prepare_steps(1, len(prompts[0]), new_tokens)
    if change == "buckets 16, dropped":  # (key: width, batch bucket, key length; their CUDA graphs freed with them)
        runner.graphs._steps = {key: step for key, step in runner.graphs._steps.items() if key[1] == 1}
        gc.collect()
        torch.cuda.synchronize()
    per_step, launches, gpu = [], [], GpuClocks()
    for _ in range(rounds):
        requests = warm_up_and_prefill(llm, prompts, 1, settings)
        with LaunchClock() as clock, gpu:
            synchronize(llm.model.device)
            start = time.perf_counter()
            llm.engine.run()
            synchronize(llm.model.device)
            seconds = time.perf_counter() - start
        steps = requests[0].stats.steps
        shapes = ", ".join(f"{label} {count}" for label, count in requests[0].stats.shapes.most_common())
        shapes = f"{steps} steps" + (f" ({shapes})" if shapes else "")  # (adaptive engines count theirs by shape)
        per_step.append(1e3 * seconds / steps)
        launches.append(1e3 * clock.seconds / steps)
    held = [runner.graphs] + ([runner.decode_graphs] if runner.decode_graphs is not runner.graphs else [])
    captured = sum(len(graphs._steps) for graphs in held if graphs is not None)
    del llm, runner, requests, acceptance, clock  # all of them: a cycle through any kept the engine (73 GiB at
    free_device_memory()                           # Nemotron-3-Nano, max batch 256) past the next one's build
    return statistics.median(per_step), statistics.median(launches), captured, gpu.summary(), shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="random:nemotron-3-nano")
    parser.add_argument("--max-batch", type=int, default=1, help="the engines' pools and graphs (the study: 256)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+", default=None, help="variant names to run, in this order (default: all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("graph_steps times CUDA graphs: it needs a CUDA GPU")
    known = variants(args.max_batch)
    unknown = [name for name in args.only or [] if name not in known]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(known)}")
    rows = []
    for place, name in enumerate(args.only or known, 1):  # in the order given, repeats allowed: a place counts
        config, draft, change = known[name]
        ms, launch, captured, clocks, shapes = time_variant(args.target, config, draft, change, args.new_tokens,
                                                            args.rounds)
        left = torch.cuda.memory_allocated() / 2**30
        rows.append((place, name, ms, shapes, launch, captured, clocks, left))
        print(f"[graph_steps] {place}. {name}: {ms:.2f} ms/step over {shapes}, launch {launch:.2f} ms/step, "
              f"{captured} graphs, {clocks}; {left:.1f} GiB allocated after it", flush=True)
    print(f"\n{args.target}, batch 1, max batch {args.max_batch} ({torch.cuda.get_device_name()})\n")
    print("| place | engine | ms/step | steps (last round) | graph launch ms/step (host) | step buckets captured | "
          "GPU while it ran | GiB left after it |")
    print("|---|---|---|---|---|---|---|---|")
    for place, name, ms, shapes, launch, captured, clocks, left in rows:
        print(f"| {place} | {name} | {ms:.2f} | {shapes} | {launch:.2f} | {captured} | {clocks} | {left:.1f} |")

if __name__ == "__main__":
    main()
