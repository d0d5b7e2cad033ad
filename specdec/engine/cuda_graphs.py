"""CUDA graphs of the target's forward for the engine's decode and verify steps.

One graph per batch bucket, all at the engine's step width T (1 for plain decoding, draft budget + 1 with a
drafter). A step of B <= bucket requests and width <= T replays the smallest bucket that holds it: the real rows
are copied into the graph's static inputs and the other rows are padding rows, which point at a request slot kept
for them, have no committed state (slot -1: the kernels never read the state pool for them), one node and
nothing committed. The attention layers read all max_seq_len positions of a row, masked, so no shape depends on
the data. Prefill, and steps wider or larger than the graphs, run eagerly on the same code.

Graphs replay on CUDA; `capture=False` runs the very same static, padded step eagerly (the CPU tests use it to
check the padding and the static context against the plain path).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specdec.backend import backend_for
from specdec.cache.linear_pool import LinearScratch
from specdec.cache.step import StepBatch, StepContext, build_attention_mask, positions_for
from specdec.models.base import HybridCausalLM
from specdec.models.moe import StackedExperts
from specdec.runner import ModelRunner
from verify_kernels.tree import ancestor_mask

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)

# The context tensors a step's forward reads, all [bucket, ...]: refilled before every replay.
STATIC_FIELDS = ("req_slots", "state_slots", "parents", "num_nodes", "positions", "seq_lens", "attention_mask",
                 "ancestors")


def capture_blocker(model: HybridCausalLM) -> str | None:
    """Why the forward of `model` cannot be captured in a CUDA graph on its device; None when it can."""
    if model.device.type != "cuda":
        return "CUDA graphs need a CUDA device"
    if backend_for(model.device) != "triton" and any(isinstance(m, StackedExperts) for m in model.modules()):
        return "its mixture-of-experts blocks run on torch ops that synchronise with the host (SPECDEC_BACKEND)"
    for spec in model.cache_spec().linear:
        if backend_for(model.device, spec.key_shape[-1], spec.value_shape[-1]) != "triton":
            return (f"its linear layers' head dims ({spec.key_shape[-1]}, {spec.value_shape[-1]}) run on the torch "
                    "references, which synchronise with the host")
    return None


def batch_buckets(max_batch: int) -> list[int]:
    """The bucket sizes for up to max_batch requests: BATCH_BUCKETS below it, then max_batch itself."""
    return [size for size in BATCH_BUCKETS if size < max_batch] + [max_batch]


@dataclass
class _Bucket:
    """One captured step: its static inputs (tokens and the context) and outputs (logits and, in ctx.scratch,
    what commit needs)."""

    tokens: torch.Tensor  # [bucket, T] int64
    ctx: StepContext
    logits: torch.Tensor | None = None  # [bucket, T, vocab] fp32, once run
    graph: torch.cuda.CUDAGraph | None = None


class GraphedForward:
    """Scores decode / verify steps of one runner through CUDA graphs (same interface as ModelRunner.score_logits).

    Takes one request slot of the runner's cache for the padding rows, for as long as it lives.
    """

    def __init__(self, runner: ModelRunner, width: int, max_batch: int, capture: bool = True):
        if capture:
            blocker = capture_blocker(runner.model)
            if blocker is not None:
                raise ValueError(f"cannot capture this model's steps in CUDA graphs: {blocker}")
        self.runner = runner
        self.width = width
        self.capture = capture
        cache = runner.cache
        self.kv_len = cache.config.max_seq_len
        self.padding_slot = cache.allocate_request()
        self.buckets = batch_buckets(max_batch)
        self._padding = self._padding_context(self.buckets[-1])
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._steps: dict[int, _Bucket] = {}
        for bucket in reversed(self.buckets):  # largest first: the smaller graphs reuse its memory pool
            self._steps[bucket] = self._build(bucket)

    def _padding_context(self, rows: int) -> StepContext:
        """A context whose every row is a padding row: the padding slot, no state, one node, nothing committed."""
        device = self.runner.cache.device
        parents = torch.full((rows, self.width), -1, dtype=torch.long, device=device)
        num_nodes = torch.ones(rows, dtype=torch.long, device=device)
        seq_lens = torch.zeros(rows, dtype=torch.long, device=device)
        tree = ancestor_mask(parents, num_nodes)
        return StepContext(
            batch=None,  # the forward reads only tensors; commit gets the real rows' context
            req_slots=torch.full((rows,), self.padding_slot, dtype=torch.long, device=device),
            state_slots=torch.full((rows,), -1, dtype=torch.long, device=device),
            parents=parents, num_nodes=num_nodes, positions=positions_for(seq_lens, tree), seq_lens=seq_lens,
            attention_mask=build_attention_mask(seq_lens, tree, self.kv_len), ancestors=tree, kv_len=self.kv_len,
            chunk_rows=torch.zeros(0, dtype=torch.long, device=device),
            tree_rows=torch.arange(rows, device=device),
        )

    def _build(self, bucket: int) -> _Bucket:
        pad = self._padding
        ctx = replace(pad, scratch={}, tree_rows=pad.tree_rows[:bucket],
                      **{name: getattr(pad, name)[:bucket].clone() for name in STATIC_FIELDS})
        step = _Bucket(torch.zeros(bucket, self.width, dtype=torch.long, device=ctx.req_slots.device), ctx)
        if self.capture:
            self._run(step)  # compiles the kernels and settles the allocator outside the capture
            torch.cuda.synchronize()
            step.graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(step.graph, pool=self._pool):
                self._run(step)
        return step

    @torch.inference_mode()
    def _run(self, step: _Bucket) -> None:
        hidden = self.runner.model(step.tokens, step.ctx, self.runner.cache)
        step.logits = self.runner.model.compute_logits(hidden)

    def fits(self, batch: StepBatch) -> bool:
        return not batch.prefill and batch.width <= self.width and len(batch.req_slots) <= self.buckets[-1]

    @torch.inference_mode()
    def score_logits(self, batch: StepBatch) -> tuple[torch.Tensor, StepContext]:
        """-> (logits [B, T, vocab] fp32 of the real rows, T = self.width >= batch.width; the step's context for
        commit). Steps the graphs do not hold run eagerly."""
        if not self.fits(batch):
            return self.runner.score_logits(batch)
        rows = len(batch.req_slots)
        bucket = next(size for size in self.buckets if size >= rows)
        step = self._steps[bucket]
        padded = batch.padded_to(self.width)
        real = self.runner.cache.begin_step(padded, kv_len=self.kv_len)  # checks the rows, builds their context
        for name in STATIC_FIELDS:
            static, padding = getattr(step.ctx, name), getattr(self._padding, name)
            static[:rows].copy_(getattr(real, name))
            static[rows:].copy_(padding[: bucket - rows])
        step.tokens[:rows].copy_(padded.tokens)
        step.tokens[rows:].zero_()
        if step.graph is not None:
            step.graph.replay()
        else:
            self._run(step)
        real.scratch = {index: _real_rows(scratch, rows) for index, scratch in step.ctx.scratch.items()}
        return step.logits[:rows], real


def _real_rows(scratch: LinearScratch, rows: int) -> LinearScratch:
    """The first `rows` rows of a step's scratch (views: valid until the next replay)."""
    return LinearScratch(**{name: None if value is None else value[:rows] for name, value in vars(scratch).items()})
