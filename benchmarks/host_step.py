"""The host's work per engine step, by phase: HOST WORK ONLY, never model speed.

On a GPU a speculative step cannot run ahead of the host (the next drafts need this step's accepted tokens), so
every millisecond the host spends between reading the accepted tokens and launching the next verify graph is a
millisecond the GPU idles (issue 14: ~4-5 ms of a 22.7 ms step at batch 128). This benchmark measures that host
work on this machine's CPU, with no GPU and no model cost:

- the target is a tiny random Qwen3.5 (transformers' config class, random weights drawn at load);
- the engine runs its static-step path (the CUDA-graph code: StepGraphs with capture=False), so the packing,
  padding, acceptance, commit bookkeeping and emission are exactly the GPU path's host code;
- the graph's forward and commit are replaced by StubForward (below): the forward returns logits built from the
  step's own inputs, agreeing with each chain's first k drafts (k drawn for a mean accepted length), so that the
  target's acceptance keeps realistic paths; the commit does nothing. The stub's own time is measured and left out.

Printed: host ms per step (CPU time of the best of several runs) and its split by engine phase (plan, propose,
score, accept, commit, emit, hold_outcome and observe_pending (the adaptive policy's outcome, held, then told while
the device verifies the next step), scheduler; plain decoding: decode_step), and with --profile the cProfile of
the timed steps. --adaptive: adaptive speculation whose requests never draft but in probes (collapse above 1), so
nearly every step is plain (Engine.plain_step: the decode steps' host code):

    python -m benchmarks.host_step --batch 128 --speculative [--profile]
    python -m benchmarks.host_step --batch 256
    python -m benchmarks.host_step --batch 256 --adaptive
    python -m benchmarks.host_step --batch 128 --adaptive-drafting   (against --speculative: adaptive's own cost)
    python -m benchmarks.host_step --batch 1 --speculative --tree    (the study's tree: --topk 2, 16 drafts)
    python -m benchmarks.host_step --batch 1 --adaptive-drafting --tree   (adaptive held to that tree)

With --tree the stub's logits still follow node j + 1 from node j, which in a tree is a sibling as often as a child,
so its steps keep fewer drafts than --accepted says: the tree path's host code, not its acceptance.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch
from transformers import Qwen3_5TextConfig

from benchmarks.study import TREE  # --tree's shape: the study's tree rows'
from specdec.engine.engine import Engine, EngineConfig
from specdec.eval.synthetic import SyntheticDrafter, synthetic_speculation
from specdec.models.loading import load_model
from specdec.models.random_checkpoint import random_target
from specdec.speculation import SamplingParams
from specdec.speculation.acceptance import AcceptedOnDevice
from specdec.speculation.adaptive import AdaptiveConfig

VOCAB = 32  # tensor ops run on this CPU: a tiny vocabulary keeps their compute (device work on a GPU) small


def tiny_target(directory: str):
    """A 4-layer Qwen3.5 (3 Gated DeltaNet : 1 attention) at toy widths, random weights, on the CPU."""
    return load_model(tiny_checkpoint(directory), device="cpu")


def tiny_checkpoint(directory: str) -> Path:
    """tiny_target's checkpoint, written to `directory` (its path: a target for LLM)."""
    config = Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=8, intermediate_size=48, max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    return random_target(config, directory)


class StubForward:
    """Stands in for StepGraphs._forward / _commit (the device's work) of the graphs attached: fixed-cost logits from
    the step's inputs.

    Verify steps: node j's argmax is the token of node j + 1 while j < k (k per row, cycling through `kept`, so
    greedy acceptance keeps k drafts), another token after. Decode steps: a fixed token. seconds: its own time, on
    decode steps (True) and verify steps (False)."""

    def __init__(self, kept: list[int]):
        self.seconds = {True: 0.0, False: 0.0}
        self.kept = torch.tensor(kept)
        self.turn = 0
        self.read_at: float | None = None  # when the last acceptance read returned (CriticalPath)
        self.critical: list[float] = []  # per verify step: host seconds from the read before it to its launch

    def attach(self, graphs) -> None:
        graphs._forward = lambda step, shared_outputs=False, every_row_folds=False: self.forward(step, graphs.decodes)
        graphs._commit = self.commit

    def forward(self, step, decodes: bool) -> None:
        start = time.thread_time()
        if not decodes and self.read_at is not None:  # (the device idles from the read to this launch)
            self.critical.append(start - self.read_at)
            self.read_at = None
        lay = step.layout  # the bucket's width (graphs per adaptive width)
        rows, width = step.inputs.shape[0], lay.width
        if decodes:
            target = torch.full((rows, 1), 7, dtype=torch.long)
        else:
            tokens = step.inputs[:, lay.tokens]
            following = torch.roll(tokens, -1, dims=1)
            kept = self.kept.roll(self.turn).repeat(rows // len(self.kept) + 1)[:rows]
            self.turn += 1
            target = torch.where(torch.arange(width)[None] < kept[:, None], following, (following + 1) % VOCAB)
        step.logits = torch.nn.functional.one_hot(target, VOCAB).float()
        step.features = torch.zeros(rows, width, 8)
        step.ctx = None  # nothing reads it: the stub commit ignores it
        self.seconds[decodes] += time.thread_time() - start

    def commit(self, step) -> None:
        pass


@contextlib.contextmanager
def critical_path(stub: StubForward):
    """Time the host's critical path of speculative steps: from each acceptance read's return (AcceptedOnDevice.read,
    the step's wait for the device) to the next verify's launch (the stub forward), the span in which the device has
    only the commit queued (issue 14: the GPU idles once that is done)."""
    read = AcceptedOnDevice.read

    def timed_read(accepted):
        out = read(accepted)
        stub.read_at = time.thread_time()
        return out
    AcceptedOnDevice.read = timed_read
    try:
        yield
    finally:
        AcceptedOnDevice.read = read


PHASES = ("plan", "propose", "score", "commit", "emit", "hold_outcome", "observe_pending", "decode_step",
          "prefill_forward")


def instrument(engine: Engine, totals: dict[str, float]) -> None:
    """Wrap the engine's phases (instance attributes, the class untouched) to add their wall time into totals."""
    running: set[str] = set()  # a phase's own time counted once when one of its methods calls another

    def timed(owner, name, label):
        inner = getattr(owner, name)

        def wrapper(*args, **kwargs):
            if label in running:
                return inner(*args, **kwargs)
            running.add(label)
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                totals[label] += time.thread_time() - start
                running.discard(label)
        setattr(owner, name, wrapper)

    for name in PHASES:
        timed(engine, name, name)
    for owner, name, label in outside_phases(engine):
        timed(owner, name, label)


def outside_phases(engine: Engine) -> list[tuple[object, str, str]]:
    """(owner, method, phase) of the phases outside the engine: the acceptance (read after the step, or left on the
    device for greedy chains, whose commit the runner launches before reading them) and the scheduler."""
    out = [(engine.acceptance, "accept", "accept"), (engine.runner, "commit_on_device", "commit"),
           (engine.scheduler, "admit", "scheduler"), (engine.scheduler, "retire", "scheduler")]
    if hasattr(engine.acceptance, "accept_on_device"):
        out.append((engine.acceptance, "accept_on_device", "accept"))
    return out


def build(batch: int, speculative: bool, acceptance: str, temperature: float, steps: int, accepted: float,
          adaptive: bool = False, drafting: bool = False, tree: bool = False):
    """The engine and its stub forward, past its warm-up steps. adaptive: adaptive speculation held to plain steps;
    with drafting, held to `steps`-chains instead (the chains offered: that one alone), so that its steps run what
    fixed speculation's do and the two compare: the policy's and the adaptive path's own host work. tree: the shape
    is a static tree of `steps` levels (TREE), adaptive drafting held to it instead of the chains."""
    torch.set_num_threads(1)
    directory = tempfile.mkdtemp(prefix="host_step_")
    target = tiny_target(directory)
    speculative = speculative or adaptive
    drafter, chosen = SyntheticDrafter(accepted) if speculative else None, None
    if speculative and acceptance == "synthetic":  # as `specdec bench` and the study pair them (their TextCoins)
        drafter, chosen = synthetic_speculation(f"synthetic:{accepted}", steps)
    # one request slot more than the batch: the graphs attached below take one for their padding rows (as
    # ModelRunner.create adds it on a GPU); without it a batch of 1 never left the queue
    config = EngineConfig.from_flags(max_batch=batch + 1, max_seq_len=2048, num_steps=steps, cuda_graphs=False,
                                     speculation="adaptive" if adaptive else "fixed", **(TREE if tree else {}))
    if adaptive and drafting:  # one chain length offered, no re-measuring of contenders
        config = replace(config, adaptive=AdaptiveConfig(chains=(steps,), refresh_every=0))
    elif adaptive:  # every request collapsed: plain steps, a probe every 64, no re-measuring of contenders
        config = replace(config, adaptive=AdaptiveConfig(collapse=1.01, probe_every=64, refresh_every=0))
    engine = Engine(target, drafter, config, acceptance=chosen)
    if adaptive:  # the stub's steps cost the host's time alone: the shape this mode measures is charged that, the
        observe = engine.policy.observe  # others ten times it, so that the policy keeps to it on any machine

        def held(ids, drafted, kept, seconds, planned=None, trees=None):
            other = any(drafted) != drafting or (tree and any(drafted) and not (planned and planned.plan.tree))
            observe(ids, drafted, kept, None if seconds is None else seconds * (10 if other else 1), planned, trees)
        engine.policy.observe = held
    width = config.shape.budget + 1 if speculative else 1
    # the CUDA-graph path's host code, run on the CPU (as ModelRunner.create and the engine set it up)
    engine.runner.enable_graphs(width, batch, capture=False, decode_steps=engine.plain_decodes)
    if adaptive:
        engine.runner.graphs.set_widths(engine.verify_widths)
    # kept drafts per row: a repeating pattern whose mean is accepted - 1 (0..steps)
    pattern = [min(steps, max(0, round(accepted - 1 + offset))) for offset in (-1.5, -0.5, 0.5, 1.5)]
    stub = StubForward(pattern)
    for graphs in {engine.runner.graphs, engine.runner.decode_graphs} - {None}:
        stub.attach(graphs)
    params = SamplingParams(temperature=temperature, seed=0 if temperature else None)
    generator = torch.Generator().manual_seed(0)
    for _ in range(batch):
        prompt = torch.randint(2, VOCAB, (32,), generator=generator).tolist()
        engine.add_request(prompt, params, max_new_tokens=1500)
    engine.admit_and_prefill()  # (not timed)
    for _ in range(3 + (2 * len(engine.policy.config.shapes) if adaptive else 0)):  # (adaptive: each shape measured)
        engine.step()
    return engine, stub


def measure(engine: Engine, stub: StubForward, steps: int,
            repeats: int) -> tuple[float, dict[str, float], float | None]:
    """-> (host ms per step, the best of `repeats` runs of `steps` steps; ms per step by phase of that run; its
    critical path, ms per verify step from an acceptance read's return to the next launch, None without such steps).
    Thread CPU time, not wall time: other processes on this machine do not count."""
    runs = []
    for _ in range(repeats):
        totals: dict[str, float] = defaultdict(float)
        instrument(engine, totals)
        stub.seconds = {True: 0.0, False: 0.0}
        stub.read_at, stub.critical = None, []
        start = time.thread_time()
        with critical_path(stub):
            for _ in range(steps):
                engine.step()
        wall = time.thread_time() - start - sum(stub.seconds.values())
        critical = 1e3 * sum(stub.critical) / len(stub.critical) if stub.critical else None
        totals["score"] -= stub.seconds[False]
        totals["decode_step"] -= stub.seconds[True]
        for name in PHASES:  # unwrap
            engine.__dict__.pop(name)
        for owner, name, _ in outside_phases(engine):
            owner.__dict__.pop(name)
        runs.append((wall, totals, critical))
    wall, totals, critical = min(runs, key=lambda run: run[0])  # the least disturbed run: this machine is shared
    phases = {name: 1e3 * seconds / steps for name, seconds in totals.items() if seconds > 0}
    phases["other"] = 1e3 * wall / steps - sum(phases.values())
    return 1e3 * wall / steps, phases, critical


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--speculative", action="store_true", help="chains from the synthetic drafter")
    parser.add_argument("--adaptive", action="store_true", help="adaptive speculation, nearly every step plain")
    parser.add_argument("--adaptive-drafting", action="store_true",
                        help="adaptive speculation held to chains of --num-steps (against --speculative: its cost)")
    parser.add_argument("--num-steps", type=int, default=4, help="drafts per chain (with --tree: its levels)")
    parser.add_argument("--tree", action="store_true", help="a static tree of --num-steps levels, 2 children a "
                        "node, 16 drafts (the study's), in place of the chains")
    parser.add_argument("--accepted", type=float, default=2.7, help="mean accepted length (the bonus included)")
    parser.add_argument("--acceptance", choices=("target", "synthetic"), default="target",
                        help="target: the engine's lossless acceptance; synthetic: `specdec bench`'s")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy rows")
    parser.add_argument("--steps", type=int, default=20, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="cProfile the timed steps, by own time")
    args = parser.parse_args()
    engine, stub = build(args.batch, args.speculative, args.acceptance, args.temperature, args.num_steps,
                         args.accepted, args.adaptive or args.adaptive_drafting, args.adaptive_drafting, args.tree)
    drafts = f"a tree of {args.num_steps} levels" if args.tree else f"chains of {args.num_steps}"
    mode = (f"adaptive speculation held to {drafts}" if args.adaptive_drafting else
            "adaptive speculation, plain steps but for probes" if args.adaptive else
            f"speculative {drafts}, {args.acceptance} acceptance" if args.speculative
            else "plain decoding")
    wall, phases, critical = measure(engine, stub, args.steps, args.repeats)
    print(f"host work, B={args.batch}, {mode}, temperature {args.temperature}: {wall:.3f} ms/step "
          f"(stub forward excluded)")
    for name, ms in sorted(phases.items(), key=lambda item: -item[1]):
        print(f"  {name:12} {ms:7.3f} ms")
    if critical is not None:
        print(f"critical path (from an acceptance read's return to the next verify's launch): {critical:.3f} ms/step")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.steps):
            engine.step()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
