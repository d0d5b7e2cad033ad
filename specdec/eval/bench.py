"""`specdec bench`: a throughput sweep over batch sizes of one target, plain and speculative, on the KVBuffer and
(with --baseline recurrent) on the intermediate-state baseline of the same engine (CacheConfig(linear_state=
"intermediate"): linear layers run as SGLang and vLLM run them), so that every comparison is made in one run on
the same code.

Each row: B requests, each of its own fixed random prompt (identical prompts would send every token of a MoE layer
to the same few experts and understate its weight reads), greedy, max_new_tokens each, all queued at once. First
the warm-up: every CUDA graph the batch will replay is captured, and a round at that batch size folds each buffer once
(compilation); then the batch is prefilled and its decoding timed, from the first step to the last request's end.
Beside the speed: the step's roofline (specdec/eval/roofline.py: the least time the step's bytes and GEMM FLOPs
allow at the copy bandwidth and GEMM throughput measured at the start of the run, specdec/eval/peaks.py) and how far
the measured step is from it, with the roofline ratio between the backends beside the measured one; the
linear-attention state memory one request holds on each backend and how many requests fit a state budget; on a GPU,
the largest batch the engine would fit in its memory (specdec/eval/device_memory.py). With --hf-reference,
transformers' generate() on the same checkpoint and batches as the outside reference.
"""

from __future__ import annotations

import gc
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace

import torch
from tqdm.auto import tqdm

from specdec.cache.budget import state_bytes
from specdec.engine.heap import GcPauses, freeze_heap
from specdec.eval import device_memory
from specdec.eval.acceptance_prior import adaptive_config
from specdec.eval.peaks import Peaks, measure_peaks
from specdec.eval.roofline import Workload, expected_experts, run_roofline
from specdec.eval.step_cost import with_device_prior
from specdec.eval.summary import shape_shares
from specdec.eval.synthetic import PREFIX as SYNTHETIC
from specdec.eval.synthetic import synthetic_speculation
from specdec.models.expert_traffic import ExpertTraffic
from specdec.parallel import is_primary

BACKENDS = ("kvbuffer", "recurrent")
# the linear state each backend's engine runs (specdec/cache/linear_state.py): "recurrent" is the baseline of
# SGLang and vLLM, intermediate states (in place for plain decoding)
LINEAR_STATE = {"kvbuffer": "kvbuffer", "recurrent": "intermediate"}
# the row's mode for each --speculation: every step drafts the shape, or adaptive speculation chooses it per step
SPECULATION_MODES = {"fixed": "speculative", "adaptive": "adaptive"}
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class BenchSettings:
    target: str
    draft: str | None = None
    batch_sizes: tuple[int, ...] = (1, 4, 16)
    baseline: bool = False          # also run the intermediate-state baseline ("recurrent")
    max_new_tokens: int = 128
    prompt_tokens: int = 128
    num_steps: int = 4
    topk: int = 1
    num_draft_tokens: int | None = None
    dynamic_tree: bool = False
    flush_length: int = 16
    state_memory_gb: float = 40.0   # the budget the concurrency column divides
    device: str | None = None
    dtype: str | None = None
    cuda_graphs: bool = True
    hf_reference: bool = False      # also time transformers' generate() on the same checkpoint and batches
    hf_batch_sizes: tuple[int, ...] | None = None  # ... at these batch sizes only (default: all)
    peak_copy_gbs: float | None = None     # the roofline's ceilings as given, instead of measured at the start
    peak_gemm_tflops: float | None = None
    only: tuple[str, str] | None = None    # (backend, mode): that engine alone (the study: one per process)
    speculation: tuple[str, ...] = ("fixed",)  # with a drafter: rows "speculative" (fixed) and / or "adaptive"
    tp: int = 1                     # tensor-parallel ranks (the command runs once per rank; memory figures per rank)
    policy_trace: str | None = None  # a JSONL file for adaptive speculation's step decisions (AdaptivePolicy.trace)
    capture_ahead: bool = True      # every batch's steps captured before the first row is timed (capture_ahead)
    max_prefill_tokens: int = 16384  # padded prompt tokens a prefill forward (engine/prefill.py; before the clock)
    acceptance_prior: tuple[str, ...] = ()  # adaptive rows: the evals their prior is read from (acceptance_prior.py)

    def __post_init__(self):
        if not self.speculation or not set(self.speculation) <= set(SPECULATION_MODES):
            raise ValueError(f"speculation takes {tuple(SPECULATION_MODES)}, got {self.speculation}")
        if self.tp > 1 and self.hf_reference:
            raise ValueError("--hf-reference times transformers on one device: leave it out with --tp")


@dataclass(frozen=True)
class BenchRow:
    backend: str                    # kvbuffer | recurrent | transformers (generate(), the outside reference)
    mode: str                       # plain | speculative (every step drafts the shape) | adaptive
    batch_size: int
    new_tokens: int
    seconds: float
    tokens_per_second: float
    ms_per_step: float              # wall time over the longest request's target steps
    mean_accepted_length: float
    state_mib_per_request: float    # linear-attention state memory one request holds on this backend
    max_concurrent_requests: int    # requests whose state memory fits state_memory_gb
    speedup_over_recurrent: float | None = None
    out_of_memory: bool = False     # the engine or this batch did not fit the device: no speed figures
    roofline_ms_per_step: float | None = None  # the same steps at the roofline (specdec/eval/roofline.py)
    x_roofline: float | None = None            # ms_per_step / roofline_ms_per_step
    roofline_speedup_over_recurrent: float | None = None  # kvbuffer rows: the baseline's roofline / ours, same steps
    roofline_ms_by_part: dict[str, float] | None = None
    largest_batch_in_memory: int | None = None  # GPU: the batch this engine would fill the device with
    shapes: dict[str, int] | None = None  # adaptive rows: the timed steps per shape the policy chose
    experts_vs_uniform: float | None = None  # MoE: distinct experts read per call / uniform routing's (the roofline's)
    gc_pause_ms: float | None = None  # the garbage collector's time within the timed steps (specdec/engine/heap.py)
    full_batch_step_ms: float | None = None  # median time of the timed rounds that ran the whole batch (full_batch_ms)
    # wall ms of each timed round in order (one engine.step(): where a run's time goes, e.g. an adaptive engine's
    # rounds against plain decoding's, which a mean or a median hides)
    step_ms: tuple[float, ...] | None = None


def run_bench(settings: BenchSettings, peaks: Peaks | None = None) -> list[BenchRow]:
    """Every row of the sweep; the rooflines against `peaks` (default: bench_peaks(settings))."""
    if not settings.batch_sizes or min(settings.batch_sizes) < 1:
        raise ValueError(f"--batch-sizes needs values >= 1, got {list(settings.batch_sizes)}")
    peaks = peaks or bench_peaks(settings)
    backends = BACKENDS if settings.baseline else BACKENDS[:1]
    modes = ["plain"] + ([SPECULATION_MODES[s] for s in dict.fromkeys(settings.speculation)]
                         if settings.draft is not None else [])
    if settings.only is not None:
        if settings.only[0] not in backends or settings.only[1] not in modes:
            raise ValueError(f"{settings.only} is not among the runs asked: backends {backends}, modes {modes}")
        backends, modes = [settings.only[0]], [settings.only[1]]
    rows = []
    batch_sizes = sorted(set(settings.batch_sizes))
    prompts, device, dtype = None, None, None  # from the first engine that loads: the reference's too
    for backend in backends:
        for mode in modes:
            try:
                llm = load_llm(settings, backend, mode)
            except RuntimeError as error:  # its pools for the largest batch do not fit: a row says so
                if not out_of_memory(error):
                    raise
                rows += [out_of_memory_row(backend, mode, batch_size) for batch_size in batch_sizes]
                free_device_memory()
                continue
            log_memory(llm, f"{backend} {mode}: built")
            with_device_prior(llm, peaks)
            traffic = ExpertTraffic(llm.model)  # before any graph is captured: the counts are captured with it
            per_request = linear_state_bytes(llm, settings, backend, mode)
            fits = int(settings.state_memory_gb * 2**30 // per_request) if per_request else 0
            prompts = bench_prompts(llm, settings, max(batch_sizes))
            device, dtype = llm.model.device, llm.model.dtype
            memory = device_memory.engine_memory(llm)
            if settings.capture_ahead:
                capture_ahead(llm, max(batch_sizes), settings)
                log_memory(llm, f"{backend} {mode}: graphs captured for up to {max(batch_sizes)} requests")
            for index, batch_size in enumerate(tqdm(batch_sizes, desc=f"{backend} {mode}", unit="batch")):
                try:
                    row = time_batch(llm, prompts, batch_size, settings, backend, mode, per_request, fits, peaks,
                                     traffic if traffic.any else None)
                    if memory is not None:
                        largest = device_memory.largest_batch(memory, device_memory.peak_reserved(device), batch_size)
                        row = BenchRow(**{**asdict(row), "largest_batch_in_memory": largest})
                    rows.append(row)
                except RuntimeError as error:  # this batch and the larger ones (the engine is left mid-step)
                    if not out_of_memory(error):
                        raise
                    log_memory(llm, f"{backend} {mode} batch {batch_size}: out of memory "
                               f"({str(error).splitlines()[0][:200]})")
                    rows += [out_of_memory_row(backend, mode, size, per_request, fits) for size in batch_sizes[index:]]
                    break
            del llm, traffic, memory  # (traffic holds the MoE layers: their experts, most of such a model's bytes)
            free_device_memory()  # the next engine's pools and graphs start from a clean allocator
    if settings.hf_reference and prompts is not None:
        from specdec.eval.hf_reference import time_transformers

        rows += time_transformers(settings, prompts, device, dtype)
    return with_speedups(rows)


def bench_peaks(settings: BenchSettings) -> Peaks:
    """The roofline's ceilings: as given in the settings, else measured now on the run's device and dtype (before
    any model takes the memory)."""
    if settings.peak_copy_gbs is not None and settings.peak_gemm_tflops is not None:
        return Peaks(settings.peak_copy_gbs * 1e9, settings.peak_gemm_tflops * 1e12, "given")
    if (settings.peak_copy_gbs is None) != (settings.peak_gemm_tflops is None):
        raise ValueError("give both --peak-copy-gbs and --peak-gemm-tflops, or neither (both measured)")
    from specdec.models.loading import _parse_dtype, default_dtype

    device = torch.device(settings.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return measure_peaks(device, _parse_dtype(settings.dtype) if settings.dtype else default_dtype(device))


def log_memory(llm, phase: str) -> None:
    """One line on stderr of the GPU's memory after a phase of a run (device_memory.phase_line); nothing off CUDA."""
    line = device_memory.phase_line(llm.model.device)
    if line is not None:
        print(f"[bench memory] {phase}: {line}", file=sys.stderr, flush=True)


def out_of_memory(error: RuntimeError) -> bool:
    """torch's allocator ran out (torch.OutOfMemoryError), or a kernel's launch did: Triton raises a RuntimeError
    "Triton Error [CUDA]: out of memory" (the H200 study of 2026-12-05, Nemotron-3-Nano's prefill at batch 512)."""
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error)


def out_of_memory_row(backend: str, mode: str, batch_size: int, per_request: int = 0, fits: int = 0) -> BenchRow:
    return BenchRow(backend=backend, mode=mode, batch_size=batch_size, new_tokens=0, seconds=0.0,
                    tokens_per_second=0.0, ms_per_step=0.0, mean_accepted_length=0.0,
                    state_mib_per_request=per_request / 2**20, max_concurrent_requests=fits, out_of_memory=True)


def free_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def load_llm(settings: BenchSettings, backend: str, mode: str):
    from specdec.api import LLM

    config = bench_engine_config(settings, backend, mode)
    draft, acceptance = settings.draft if mode != "plain" else None, None
    if draft is not None and draft.startswith(SYNTHETIC):  # random chains accepted at a set mean (benchmarks)
        draft, acceptance = synthetic_speculation(draft, config.shape.depth)
    return LLM(settings.target, draft, device=settings.device, dtype=settings.dtype, config=config,
               acceptance=acceptance, tp=settings.tp)


def bench_engine_config(settings: BenchSettings, backend: str, mode: str):
    """The EngineConfig of the sweep's engine for (backend, mode): pools for its largest batch and longest request."""
    from specdec.engine.engine import EngineConfig

    return EngineConfig.from_flags(
        max_batch=max(settings.batch_sizes), max_seq_len=settings.prompt_tokens + settings.max_new_tokens + 64,
        flush_length=settings.flush_length, linear_state=LINEAR_STATE[backend], num_steps=settings.num_steps,
        topk=settings.topk, num_draft_tokens=settings.num_draft_tokens, dynamic_tree=settings.dynamic_tree,
        cuda_graphs=settings.cuda_graphs, speculation="adaptive" if mode == "adaptive" else "fixed",
        adaptive=adaptive_config(settings.acceptance_prior), max_prefill_tokens=settings.max_prefill_tokens)


def capture_ahead(llm, rows: int, settings: BenchSettings) -> None:
    """Build now every step graph the sweep's batches will replay (up to `rows` requests), as a server that has run
    every batch size holds them, so that each row is timed with the same graphs held. The graphs an engine holds
    change a small batch's step: on the H200 (benchmarks/results/profile_h200/
    graph_steps_nemotron_b1_maxbatch256_2026-12-03b.txt) fixed 4-chains at batch 1 took 6.46-6.83 ms a step holding
    their batch-1 graphs alone and 6.93-7.08 holding those of batches 2-16 too (never replayed), and the adaptive
    engine, which holds a graph per chain width, 6.87-7.45. Built row by row, as before, a sweep's small rows held
    few graphs and an adaptive engine more than a fixed one. Where the largest batch's graphs do not fit, the rows
    build theirs as they come (and the largest row reports the shortage)."""
    try:
        llm.engine.prepare_steps(rows, settings.prompt_tokens, settings.max_new_tokens)
    except RuntimeError as error:
        if not out_of_memory(error):
            raise
        free_device_memory()


def time_batch(llm, prompts: list[list[int]], batch_size: int, settings: BenchSettings, backend: str, mode: str,
               per_request: int, fits: int, peaks: Peaks, traffic: ExpertTraffic | None = None) -> BenchRow:
    """Decode throughput: the batch's prefill runs before the clock starts (its first new token per request is
    not counted), then every step to the last request's end, as the batch shrinks. Its roofline: the same steps,
    with a MoE model's expert reads scaled to the distinct experts the timed steps touched (traffic)."""
    device_memory.start_peak(llm.model.device)
    policy = llm.engine.policy
    if policy is not None and settings.policy_trace and is_primary():  # (under --tp every rank plans alike: rank 0's)
        policy.trace = []
    requests = warm_up_and_prefill(llm, prompts, batch_size, settings)
    log_memory(llm, f"{backend} {mode} batch {batch_size}: warmed up and prefilled")
    if traffic is not None:
        traffic.reset()
    chosen = Counter(policy.counts) if policy is not None else None  # the warm-up's, left out
    warm_up_steps = len(policy.trace) if policy is not None and policy.trace is not None else 0
    with GcPauses() as pauses:
        start = time.perf_counter()
        step_times = run_timing_steps(llm.engine)
        synchronize(llm.model.device)
        seconds = time.perf_counter() - start
    log_memory(llm, f"{backend} {mode} batch {batch_size}: decoded")
    if policy is not None and policy.trace is not None:
        write_policy_trace(settings.policy_trace, policy, backend, batch_size, warm_up_steps)
    shapes = dict(policy.counts - chosen) if policy is not None else None
    new_tokens = sum(len(r.output) - 1 for r in requests)
    emitted = [n for r in requests for n in r.stats.emitted_per_step]
    steps = max(max(r.stats.steps for r in requests), 1)
    ms_per_step = 1e3 * seconds / steps
    work = step_workloads(requests, llm, settings, backend, settings.prompt_tokens)
    factor = None
    if traffic is not None:
        factor = experts_vs_uniform(traffic, llm.model.hf_config, work)
        work = [replace(w, expert_factor=factor) for w in work]
    roofline_ms, by_part = run_roofline(llm.model.hf_config, work, peaks, steps)
    ratio = None
    if backend == "kvbuffer":  # the baseline's roofline over the very same steps
        ratio = run_roofline(llm.model.hf_config, [replace(w, backend="recurrent") for w in work], peaks,
                             steps)[0] / roofline_ms
    return BenchRow(backend=backend, mode=mode, batch_size=batch_size, new_tokens=new_tokens, seconds=seconds,
                    tokens_per_second=new_tokens / seconds, ms_per_step=ms_per_step,
                    mean_accepted_length=sum(emitted) / max(len(emitted), 1),
                    state_mib_per_request=per_request / 2**20, max_concurrent_requests=fits,
                    roofline_ms_per_step=roofline_ms, x_roofline=ms_per_step / roofline_ms,
                    roofline_speedup_over_recurrent=ratio, roofline_ms_by_part=by_part, shapes=shapes,
                    experts_vs_uniform=factor, gc_pause_ms=1e3 * pauses.seconds,
                    full_batch_step_ms=full_batch_ms(step_times, batch_size),
                    step_ms=tuple(round(1e3 * seconds, 4) for _, seconds in step_times))


def run_timing_steps(engine) -> list[tuple[int, float]]:
    """engine.run(), each round timed: (requests running, wall seconds) per round."""
    times = []
    while not engine.scheduler.idle:
        rows, start = len(engine.scheduler.running), time.perf_counter()
        engine.step()
        times.append((rows, time.perf_counter() - start))
    return times


def full_batch_ms(step_times: list[tuple[int, float]], batch_size: int) -> float | None:
    """The median wall time (ms) of the rounds that ran the whole batch, past the first two (a pipelined plain step
    waits for the one before it from the third on): what one step of the batch's shape costs, comparable between a
    fixed and an adaptive engine (whose ms/step averages over different mixes of shapes and of shrinking tails)."""
    full = sorted(seconds for rows, seconds in step_times[2:] if rows == batch_size)
    return 1e3 * full[(len(full) - 1) // 2] if full else None


def write_policy_trace(path: str, policy, backend: str, batch_size: int, warm_up_steps: int) -> None:
    """Append the batch's adaptive decisions to the JSONL file, each tagged with the run and whether it was timed
    (the warm-up's steps come first), and empty the policy's trace."""
    import json

    with open(path, "a") as out:
        for index, entry in enumerate(policy.trace):
            out.write(json.dumps({"backend": backend, "batch_size": batch_size, "timed": index >= warm_up_steps,
                                  **entry}) + "\n")
    policy.trace = None


def experts_vs_uniform(traffic: ExpertTraffic, config, work: list[Workload]) -> float:
    """Distinct experts a MoE layer call read in the timed steps (mean over calls, padding rows of a CUDA graph's
    bucket included: the kernel reads their experts too) / those uniform routing of the steps' tokens touches."""
    distinct, calls = traffic.read()
    num_experts = traffic.experts[0].first.shape[0]
    uniform = sum(expected_experts(num_experts, config.num_experts_per_tok, w.tokens) for w in work) / len(work)
    return (distinct / calls) / uniform if calls and uniform else 1.0


def step_workloads(requests: list, llm, settings: BenchSettings, backend: str, prompt_tokens: int) -> list[Workload]:
    """The timed steps as the roofline sees them: step s runs the requests with more than s steps, each with the
    nodes of a step (1, or the root and its drafts: with adaptive speculation those of the step's widest row),
    keeping what it emitted at s, attending to its prompt, the prefill's token and what it emitted before s."""
    fixed = llm.engine.config.shape.budget + 1 if llm.drafter is not None else 1
    flush_length = 1 if backend == "recurrent" else settings.flush_length
    dtype_bytes = llm.model.dtype.itemsize
    work = []
    for step in range(max(len(r.stats.emitted_per_step) for r in requests)):
        emitted = [r.stats.emitted_per_step for r in requests if len(r.stats.emitted_per_step) > step]
        nodes = fixed if llm.engine.policy is None else \
            1 + max(r.stats.drafted_per_step[step] for r in requests if len(r.stats.drafted_per_step) > step)
        accepted = sum(e[step] for e in emitted) / len(emitted)
        context = prompt_tokens + 1 + sum(sum(e[:step]) for e in emitted) / len(emitted)
        work.append(Workload(batch=len(emitted), nodes=nodes, accepted=min(max(accepted, 1.0), nodes),
                             backend=backend, flush_length=flush_length, context=context, dtype_bytes=dtype_bytes))
    return work


def bench_prompts(llm, settings: BenchSettings, count: int) -> list[list[int]]:
    """`count` fixed random prompts of settings.prompt_tokens tokens, one per request of a batch: the same in every
    run (seeded), different from each other so that a MoE layer routes the batch's tokens as real traffic would."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, llm.model.hf_config.vocab_size, (count, settings.prompt_tokens), generator=generator)
    return tokens.tolist()


def warm_up_and_prefill(llm, prompts: list[list[int]], batch_size: int, settings: BenchSettings) -> list:
    """Everything before the clock starts: capture every CUDA graph the shrinking batch will replay, run a round
    long enough to fold each buffer (compilation), then queue the timed batch (request i: prompts[i], all of one
    length) and prefill it. -> its requests."""
    if len(prompts) < batch_size or len({len(p) for p in prompts}) != 1:
        raise ValueError(f"a batch of {batch_size} needs as many prompts of one length, got {len(prompts)}")
    engine = llm.engine
    engine.scheduler.max_batch = batch_size
    engine.prepare_steps(batch_size, len(prompts[0]), settings.max_new_tokens)
    for prompt in prompts[:batch_size]:
        llm.submit(prompt, settings.flush_length + WARMUP_TOKENS)
    engine.run()
    requests = [llm.submit(prompt, settings.max_new_tokens)[0] for prompt in prompts[:batch_size]]
    engine.admit_and_prefill()
    synchronize(llm.model.device)
    freeze_heap()  # every row from the same heap: what the warm-up left is never walked by a collection on the clock
    return requests


def linear_state_bytes(llm, settings: BenchSettings, backend: str, mode: str) -> int:
    """The linear-attention memory one request holds: its committed state, plus its KVBuffer entries (kvbuffer)
    or one state per node of its widest step (the baseline, which must reserve them for every running request;
    decode steps write in place, so plain decoding needs none)."""
    spec = llm.model.cache_spec()
    if backend == "kvbuffer":
        per_entry = sum(layer_entry_bytes(layer) for layer in spec.linear)
        return state_bytes(spec) + settings.flush_length * per_entry
    nodes = llm.engine.config.shape.budget + 1 if mode != "plain" else 0
    return state_bytes(spec) * (1 + nodes)


def layer_entry_bytes(layer) -> int:
    """One buffered token of a linear layer: key, value and decay, fp32."""
    from math import prod

    return (prod(layer.key_shape) + prod(layer.value_shape) + layer.decay_heads) * 4


def with_speedups(rows: list[BenchRow]) -> list[BenchRow]:
    """Each KVBuffer row with its tokens/s over the baseline's at the same mode and batch size."""
    baseline = {(r.mode, r.batch_size): r.tokens_per_second for r in rows if r.backend == "recurrent"}
    out = []
    for row in rows:
        base = baseline.get((row.mode, row.batch_size))
        ours = row.backend == "kvbuffer" and not row.out_of_memory
        speedup = row.tokens_per_second / base if ours and base else None
        out.append(BenchRow(**{**asdict(row), "speedup_over_recurrent": speedup}))
    return out


def markdown_table(rows: list[BenchRow], budget_gb: float) -> str:
    """The rows as a table ("GC ms": the garbage collector's time within a row's timed steps, specdec/engine/heap.py);
    with adaptive rows, a column gives the shapes chosen (share of the timed steps); with a MoE target, one gives the
    distinct experts read against uniform routing (the roofline's expert reads scale by it)."""
    adaptive = any(r.shapes for r in rows)
    moe = any(r.experts_vs_uniform is not None for r in rows)
    lines = ["| backend | mode | batch | tokens/s | x recurrent | ms/step | full-batch step ms | GC ms | "
             "roofline ms/step | x roofline | roofline x recurrent | mean accepted length | state MiB / request | "
             f"requests in {budget_gb:g} GiB | largest batch in memory |" + (" shapes chosen |" if adaptive else "")
             + (" experts read / uniform routing |" if moe else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if adaptive else "")
             + ("---|" if moe else "")]
    for r in rows:
        extra = (f" {shape_shares(r.shapes) if r.shapes else ''} |" if adaptive else "") + \
            (f" {_fmt(r.experts_vs_uniform, '{:.2f}')} |" if moe else "")
        speedup = _fmt(r.speedup_over_recurrent, "{:.2f}x")
        memory = (f"{r.state_mib_per_request:.2f} | {r.max_concurrent_requests} | "
                  f"{_fmt(r.largest_batch_in_memory, '{}')}" if r.backend != "transformers" else " |  | ")
        if r.out_of_memory:
            lines.append(f"| {r.backend} | {r.mode} | {r.batch_size} | out of memory |" + "  |" * 8
                         + f" {memory} |" + extra)
            continue
        lines.append(f"| {r.backend} | {r.mode} | {r.batch_size} | {r.tokens_per_second:.1f} | {speedup} | "
                     f"{r.ms_per_step:.2f} | {_fmt(r.full_batch_step_ms, '{:.2f}')} | "
                     f"{_fmt(r.gc_pause_ms, '{:.1f}')} | "
                     f"{_fmt(r.roofline_ms_per_step, '{:.2f}')} | "
                     f"{_fmt(r.x_roofline, '{:.2f}x')} | {_fmt(r.roofline_speedup_over_recurrent, '{:.2f}x')} | "
                     f"{r.mean_accepted_length:.2f} | {memory} |" + extra)
    return "\n".join(lines)


def _fmt(value, pattern: str) -> str:
    return "" if value is None else pattern.format(value)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
