"""CUDA graphs of a runner's decode and verify steps: the forward (with the LM head) and the commit of the accepted
paths. Only the runner (model_runner.py) uses them.

One pair of graphs per (step width, batch bucket, key-length bucket), captured the first time a step needs it. The
widths are a small fixed set: the engine's step width T alone (1 for plain decoding, draft budget + 1 with a
drafter), or every width adaptive speculation may choose (set_widths: e.g. 1, 2, 3, 5 for no drafting and chains
of 1, 2 and 4 drafts), so that a narrow step runs a narrow graph instead of one padded to T (adaptive speculation's
plain steps replay decode graphs of their own beside those: ModelRunner.enable_graphs(decode_steps)). A step of
B <= bucket requests and width <= T replays the narrowest width and the smallest batch bucket that hold it, at the
smallest key length (a power of two from MIN_KV_LEN, at most max_seq_len) that holds its longest row: the attention
kernel reads each row's own keys in place and sizes its key splits from it (the reference gathers that many
positions per row, masked), and no shape depends on the data. The host packs each row's inputs into one int64 row
(tokens, parents, node count, request slot, state slot, committed length), copies them to the device in one
transfer, and the graph builds the rest of the step context (ancestor masks, positions) itself. Rows past B are
padding rows: a request slot kept for them, no committed state (slot -1: the kernels never read the state pool for
them), one node, nothing accepted. Prefill, and steps wider or larger than the graphs, run eagerly on the same code.

All graphs share one memory pool, as torch allows for graphs that never replay concurrently: a capture reuses the
memory that earlier captures freed (captured widest and largest first, the later ones fit in it), so that the pool
holds about one step's working memory, not one per graph. Nothing a step's graphs write outlives the step: its
context's scratch is read by its own commit only (which replays right after its forward), and its outputs, valid
until the next replay of any of these graphs (no caller outlives that: a step is scored, accepted and committed
before the next one replays), go to two buffers outside the pool that every graph writes its rows into, sized for
the most rows x width a graph runs (the largest bucket at the widest width, but where set_widths caps a width's
batch: adaptive speculation's tree): the logits (rows x width x vocab, in the LM head's dtype
(model.logits_dtype): 0.6 GB in bf16 for 256 rows of 5 nodes at Qwen3.5's 248k vocabulary; the LM head's GEMM
writes there) and the features (rows x width x F, copied there). Kept per graph, the sum over batch buckets, widths
and key lengths would be many times that.

Graphs replay on CUDA; `capture=False` runs the very same static, padded steps eagerly (the CPU tests use it to
check the packing, the padding and the static context against the plain path).
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from specdec.backend import backend_for
from specdec.cache.step import StepBatch, StepContext, positions_for
from specdec.models.base import HybridCausalLM
from specdec.models.moe import StackedExperts
from specdec.speculation.acceptance import Accepted, AcceptedOnDevice
from verify_kernels.tree import ancestor_mask, check_tree

if TYPE_CHECKING:  # the runner owns its graphs; only its type is named here
    from .model_runner import ModelRunner

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)
MIN_KV_LEN = 256  # the smallest key-length bucket


def capture_blocker(model: HybridCausalLM) -> str | None:
    """Why the steps of `model` cannot be captured in CUDA graphs on its device; None when they can."""
    if model.device.type != "cuda":
        return "CUDA graphs need a CUDA device"
    if backend_for(model.device) != "triton" and any(isinstance(m, StackedExperts) for m in model.modules()):
        return "its mixture-of-experts blocks run on torch ops that synchronise with the host (SPECDEC_BACKEND)"
    for spec in model.cache_spec().linear:
        if backend_for(model.device, spec.key_shape[-1], spec.value_shape[-1]) != "triton":
            return (f"its linear layers' head dims ({spec.key_shape[-1]}, {spec.value_shape[-1]}) run on the torch "
                    "references, which synchronise with the host")
    return None


def padded_batch(buckets: list[int], rows: int) -> int:
    """The batch a step of `rows` requests replays: the smallest bucket that holds them (past the largest, the step
    does not fit and runs its own rows)."""
    return next((size for size in buckets if size >= rows), rows)


def batch_buckets(max_batch: int) -> list[int]:
    """The bucket sizes for up to max_batch requests: BATCH_BUCKETS below it, then max_batch itself."""
    return [size for size in BATCH_BUCKETS if size < max_batch] + [max_batch]


class _Layout:
    """One width's packed rows: where each input sits in a row of step inputs ([2T + 4] int64) or commit inputs
    ([T + 2]), and the rows a padding row packs to (one node, the padding slot, no state, nothing committed)."""

    def __init__(self, width: int, padding_slot: int):
        self.width = width
        self.tokens = slice(0, width)
        self.parents = slice(width, 2 * width)
        self.num_nodes, self.req_slot, self.state_slot, self.seq_len = range(2 * width, 2 * width + 4)
        self.step_fields = self.seq_len + 1
        self.accepted = slice(0, width)
        self.num_accepted, self.commit_state_slot = width, width + 1
        self.commit_fields = width + 2
        self.padding_inputs = torch.zeros(self.step_fields, dtype=torch.long)
        self.padding_inputs[self.parents] = -1
        self.padding_inputs[self.num_nodes], self.padding_inputs[self.req_slot] = 1, padding_slot
        self.padding_inputs[self.state_slot] = -1
        self.padding_commit = torch.full((self.commit_fields,), -1, dtype=torch.long)
        self.padding_commit[self.num_accepted] = 0
        # (numpy views: the host packs a step's rows by numpy, ~0.5 us an assignment against ~2.6 us for torch's
        # indexing on a 2-core CPU, on the path between a speculative step's acceptance read and the next launch)
        self.padding_inputs_array, self.padding_commit_array = self.padding_inputs.numpy(), self.padding_commit.numpy()


@contextmanager
def _capturing(graph: torch.cuda.CUDAGraph, pool) -> Iterator[None]:
    """torch.cuda.graph with Python's garbage collector held off until the capture ends: a collection in a capture
    can free another engine's graphs (a runner and its graphs refer to each other: only the collector frees them),
    and a graph freed while a stream captures invalidates the capture (the GPU tests' engines, on an H100,
    2026-12-05: "operation not permitted when stream is capturing (function reset)"). torch collects before a
    capture only when told to (torch.compiler.config.force_cudagraph_gc): a full collection per graph is slow."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            yield
    finally:
        if collecting:
            gc.enable()


class _GraphPool:
    """The memory pool that a runner's graphs share (torch.cuda.graph_pool_handle), and how many built steps' graphs
    hold it. torch frees a pool's bookkeeping for reuse once its last graph is gone, and a later capture into that
    pool stops on an internal assert of its caching allocator ("it->second->use_count > 0"): so a capture that
    fails while no built step holds the pool (out of memory in the first step captured, the widest and largest: the
    H100 study of 2026-12-06, Qwen3.5-9B's adaptive engine at batch 512) leaves a fresh pool for the next."""

    def __init__(self):
        self.handle = torch.cuda.graph_pool_handle()
        self.held = 0  # built steps whose graphs were captured into the pool

    def capture_failed(self) -> None:
        if self.held == 0:
            self.handle = torch.cuda.graph_pool_handle()


@dataclass
class _Bucket:
    """One bucket: packed inputs on the host (pinned on CUDA) and the device, the graphs, and their outputs (the
    step context with the layers' scratch, and the logits), valid until the next replay of any graph of the pool."""

    layout: _Layout  # the step width T and its packed rows
    kv_len: int  # key positions the attention layers read per row
    host_inputs: list[torch.Tensor]  # two [bucket, step_fields] int64, used in turn (the other may still be copying)
    inputs: torch.Tensor
    host_commit: list[torch.Tensor]  # two [bucket, commit_fields] int64, likewise
    commit_inputs: torch.Tensor
    turn: int = 0
    ctx: StepContext | None = None
    logits: torch.Tensor | None = None  # [bucket, T, vocab], model.logits_dtype
    features: torch.Tensor | None = None  # [bucket, T, F]: the runner's feature_layers (None after a decode step)
    forward_graph: torch.cuda.CUDAGraph | None = None
    commit_graph: torch.cuda.CUDAGraph | None = None
    # a decode bucket's forward for the steps in which every row folds (StepContext.every_row_folds), where the
    # cache launches other ops for them (KVBufferCache.decode_folds_apart)
    folding_graph: torch.cuda.CUDAGraph | None = None
    # numpy views of host_inputs and host_commit, which the host packs through (_Layout)
    host_input_arrays: list[np.ndarray] = field(init=False, repr=False)
    host_commit_arrays: list[np.ndarray] = field(init=False, repr=False)

    def __post_init__(self):
        self.host_input_arrays = [host.numpy() for host in self.host_inputs]
        self.host_commit_arrays = [host.numpy() for host in self.host_commit]


@dataclass
class GraphStep:
    """What score_all hands back for commit when a bucket ran the step."""

    bucket: _Bucket
    batch: StepBatch  # the step's real rows, padded to the bucket's width


class StepGraphs:
    """Scores verify steps of one runner through CUDA graphs and commits them through their own graph; or, at width
    1 (plain decoding, `decodes`), runs decode steps that commit in their forward, one graph per bucket (and a
    second for the steps in which every row folds, where their ops differ: KVBufferCache.decode_folds_apart). Takes
    one request slot of the runner's cache for the padding rows, for as long as it lives.

    widths: the step widths it captures, `width` (the widest) and those set_widths adds; replays: forward replays
    per width (what the steps ran, for tests and benchmarks). share: other graphs of the runner whose padding slot
    and memory pool these use too (decode graphs beside verify graphs: their steps never replay at once, and
    padding rows keep nothing)."""

    def __init__(self, runner: ModelRunner, width: int, max_batch: int, capture: bool = True,
                 share: StepGraphs | None = None):
        if capture:
            blocker = capture_blocker(runner.model)
            if blocker is not None:
                raise ValueError(f"cannot capture this model's steps in CUDA graphs: {blocker}")
        self.runner = runner
        self.cache = runner.cache
        self.width = width
        self.decodes = width == 1
        self.capture = capture
        # decode steps in which every row folds run other ops (their own graph per bucket: _Bucket.folding_graph)
        self._decode_folds_apart = self.decodes and self.cache.decode_folds_apart
        self.padding_slot = self.cache.allocate_request() if share is None else share.padding_slot
        self.layouts = {width: _Layout(width, self.padding_slot)}
        self.widths: tuple[int, ...] = (width,)  # the layouts' widths, sorted
        self.replays: Counter[int] = Counter()
        self.buckets = batch_buckets(max_batch)
        # one pool for every width and bucket (and the graphs sharing it)
        self._pool = share._pool if share is not None else _GraphPool() if capture else None
        self._steps: dict[tuple[int, int, int], _Bucket] = {}  # (width, batch bucket, key length) -> its step
        self._top_bucket: dict[int, int] = {}  # width -> its largest batch bucket, where below the largest (set_widths)
        self._logits: torch.Tensor | None = None  # flat, every step's logits at its start (module docstring)
        self._vocab: int | None = None  # the logits' last dimension, from the first forward (a capture's warm-up)
        self._features: torch.Tensor | None = None  # flat, every step's features at its start, likewise
        self._feature_shape: tuple[int, torch.dtype] | None = None  # their last dimension and dtype, likewise

    def set_widths(self, widths: Iterable[int], max_rows: dict[int, int] | None = None) -> None:
        """Capture these step widths too (each from 1 to `width`): a step replays the narrowest that holds it, so a
        step that drafts less than the widest (adaptive speculation) costs what its own width costs. Not for decode
        graphs (width 1 alone: nothing narrower). max_rows: a width's largest batch (AdaptiveConfig.tree_max_batch),
        above which its steps run eagerly: no graph of it is captured there, nor are the shared outputs sized for
        it."""
        widths = set(widths)
        if not all(1 <= w <= self.width for w in widths):
            raise ValueError(f"graph widths must lie in [1, {self.width}] (the widest step), got {sorted(widths)}")
        for width in widths - set(self.layouts):
            self.layouts[width] = _Layout(width, self.padding_slot)
        self.widths = tuple(sorted(self.layouts))
        for width, rows in (max_rows or {}).items():
            self._top_bucket[width] = min(padded_batch(self.buckets, rows), self.buckets[-1])

    def top_bucket(self, width: int) -> int:
        """The largest batch bucket whose steps of this width replay a graph."""
        return self._top_bucket.get(width, self.buckets[-1])

    def padded_rows(self, rows: int) -> int:
        """The batch a step of `rows` requests replays (padded_batch)."""
        return padded_batch(self.buckets, rows)

    def step_width(self, width: int) -> int:
        """The narrowest captured width that holds a step of `width` nodes per row."""
        return next(w for w in self.widths if w >= width)

    def kv_bucket(self, longest: int) -> int:
        """The key length a step reads when its longest row needs `longest` positions."""
        return min(self.cache.config.max_seq_len, max(MIN_KV_LEN, 1 << (longest - 1).bit_length()))

    def capture_buckets(self, rows: int, shortest: int, longest: int, built_one=None) -> int:
        """Build now every step that batches of up to `rows` requests will replay while their longest row needs
        `shortest` to `longest` key positions (committed tokens + the step's nodes), as a warm-up does (`specdec
        bench`'s, and `specdec serve`'s at its start): later steps, batches
        shrinking as requests finish included, then never stop to capture; at every width, the widest and largest
        first (the narrower and smaller captures then fit in the scratch they freed); built_one() after each.
        Returns how many steps were built."""
        top = next((size for size in self.buckets if size >= rows), self.buckets[-1])
        kv_lens, kv_len = [], self.kv_bucket(shortest)
        while True:
            kv_lens.append(kv_len)
            if kv_len >= self.kv_bucket(longest):
                break
            kv_len = min(2 * kv_len, self.cache.config.max_seq_len)
        keys = [(width, size, kv_len) for width in reversed(self.widths)
                for size in reversed([size for size in self.buckets if size <= min(top, self.top_bucket(width))])
                for kv_len in reversed(kv_lens)]
        built = [key for key in keys if key not in self._steps]
        for key in built:
            self._steps[key] = self._build(*key)
            if built_one is not None:
                built_one()
        return len(built)

    def _host_rows(self, row: torch.Tensor, bucket: int) -> torch.Tensor:
        """`bucket` copies of a packed row on the host, pinned under capture (the copies to the device are async)."""
        rows = row.expand(bucket, -1).clone()
        return rows.pin_memory() if self.capture else rows

    def _build(self, width: int, bucket: int, kv_len: int) -> _Bucket:
        lay = self.layouts[width]
        host_inputs = [self._host_rows(lay.padding_inputs, bucket) for _ in range(2)]
        host_commit = [self._host_rows(lay.padding_commit, bucket) for _ in range(2)]
        device = self.cache.device
        step = _Bucket(lay, kv_len, host_inputs, host_inputs[0].to(device), host_commit, host_commit[0].to(device))
        if self.capture:
            try:
                self._capture(step, bucket, width)
            except BaseException:  # (out of memory, mostly: the caller may free some and capture again)
                self._pool.capture_failed()
                raise
            self._pool.held += 1
        return step

    def _capture(self, step: _Bucket, bucket: int, width: int) -> None:
        """Capture a step's graphs: its forward (and, where every row folds apart, the folding forward) and commit."""
        # warm-up on padding rows only (compiles the kernels, settles the allocator), then capture
        self._forward(step)
        if not self.decodes:
            self._commit(step)
        self._outputs(bucket, width)  # (the shared output buffers allocated now, outside the capture)
        if self._decode_folds_apart:
            # first, so that the bucket's context and outputs stay the common step's (the logits: one buffer)
            self._forward(step, every_row_folds=True)
            torch.cuda.synchronize()
            step.folding_graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), _capturing(step.folding_graph, self._pool.handle):
                self._forward(step, shared_outputs=True, every_row_folds=True)
        torch.cuda.synchronize()
        step.forward_graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), _capturing(step.forward_graph, self._pool.handle):
            self._forward(step, shared_outputs=True)
        if not self.decodes:
            step.commit_graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), _capturing(step.commit_graph, self._pool.handle):
                self._commit(step)
        # the context's scratch (what the forward leaves for the commit: the conv inputs, the tree's entries) is
        # read only by this step's commit, which replays right after its forward with no other graph of the
        # pool between them: freed, later captures reuse its memory (kept, every bucket, width and key length
        # would hold its own: 24 GiB of an H100 at Qwen3.5-9B's speculative batch 512, 2026-12-05)
        step.ctx = None

    def _outputs(self, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [rows, width, vocab], features [rows, width, F] or None for decode steps, which hand back none)
        at the start of the shared output buffers: the LM head writes the logits there (in model.logits_dtype, no
        cast), the forward copies the features there. Sized for the most rows x width a graph runs (top_bucket), from an
        earlier forward's outputs; allocated on first use, which _build makes come before its capture: a tensor
        allocated during a capture would sit in the graphs' pool."""
        if self._logits is None:
            size = max(self.top_bucket(width) * width for width in self.widths)
            self._logits = torch.empty(size * self._vocab, dtype=self.runner.model.logits_dtype,
                                       device=self.cache.device)
            dim, dtype = self._feature_shape
            if not self.decodes:
                self._features = torch.empty(size * dim, dtype=dtype, device=self.cache.device)
        logits = self._logits[: rows * width * self._vocab].view(rows, width, self._vocab)
        if self._features is None:
            return logits, None
        dim = self._feature_shape[0]
        return logits, self._features[: rows * width * dim].view(rows, width, dim)

    @torch.inference_mode()
    def _forward(self, step: _Bucket, shared_outputs: bool = False, every_row_folds: bool = False) -> None:
        """The captured forward: unpack the inputs, build the context, run the model and the LM head (and, for
        decode steps, commit their nodes in the layers; every_row_folds: a decode step in which every row folds).
        shared_outputs: the logits and features into the shared buffers (the capture and the static steps run
        eagerly; a warm-up allocates its own, before the buffers' sizes are known)."""
        lay, x = step.layout, step.inputs
        bucket = x.shape[0]
        seq_lens = x[:, lay.seq_len].contiguous()
        parents, num_nodes = x[:, lay.parents].contiguous(), x[:, lay.num_nodes].contiguous()
        # on the device (the host checked the trees: StepGraphs._replay): log2(T) tiny products, no host work
        tree = ancestor_mask(parents, num_nodes, check=False)
        step.ctx = StepContext(
            batch=None,  # the forward reads only tensors
            req_slots=x[:, lay.req_slot].contiguous(), state_slots=x[:, lay.state_slot].contiguous(),
            parents=parents, num_nodes=num_nodes,
            positions=positions_for(seq_lens, tree), seq_lens=seq_lens,
            ancestors=tree, kv_len=step.kv_len,
            chunk_rows=torch.zeros(0, dtype=torch.long, device=x.device),
            tree_rows=torch.arange(bucket, device=x.device), commit_in_forward=self.decodes,
            every_row_folds=every_row_folds,
        )
        # decode steps read each row's newest token on the device (the runner keeps it: the host need not know it)
        tokens = self.runner.tokens[step.ctx.req_slots][:, None] if self.decodes else x[:, lay.tokens].contiguous()
        hidden, features = self.runner.forward_step(tokens, step.ctx)
        if shared_outputs and self._vocab is not None:
            logits_out, features_out = self._outputs(bucket, lay.width)
            step.logits = self.runner.model.compute_logits(hidden, logits_out)
            # (a decode step's features: never read, not copied, not kept)
            step.features = None if features_out is None else features_out.copy_(features)
        else:
            step.logits, step.features = self.runner.model.compute_logits(hidden), features
        self._vocab, self._feature_shape = step.logits.shape[-1], (features.shape[-1], features.dtype)

    @torch.inference_mode()
    def _commit(self, step: _Bucket) -> None:
        """The captured commit: every row keeps its accepted path (padding rows accept nothing)."""
        lay, c = step.layout, step.commit_inputs
        ctx = replace(step.ctx, state_slots=c[:, lay.commit_state_slot].contiguous())  # slots taken by folds
        self.cache.commit_layers(ctx, c[:, lay.accepted].contiguous(), c[:, lay.num_accepted].contiguous())

    def fits(self, batch: StepBatch, decode: bool = False) -> bool:
        """Whether the graphs run this step: a decode step (committed in its forward) or a step to score."""
        return (decode == self.decodes and not batch.prefill and batch.width <= self.width
                and len(batch.req_slots) <= self.top_bucket(self.step_width(batch.width)))

    @torch.inference_mode()
    def score_all(self, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor, GraphStep]:
        """A step that fits -> (logits [B, T, vocab] (model.logits_dtype) and features [B, T, F] of the real rows,
        T >= batch.width the narrowest width captured that holds it; the step to commit)."""
        batch = batch.padded_to(self.step_width(batch.width))
        step = self._replay(batch, self.cache.check_step(batch))
        rows = len(batch.req_slots)
        return step.logits[:rows], step.features[:rows], GraphStep(step, batch)

    @torch.inference_mode()
    def decode(self, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step that fits (its tokens: the runner's, on the device), committed in its forward -> (logits
        [B, vocab] (model.logits_dtype), the rows' request slots on the device), valid until the next replay: the host
        half of the commit first (the state slots of the rows whose buffer fills), the graph, the committed
        lengths. Nothing here waits for the device."""
        num_nodes = self.cache.check_step(batch)  # (width 1: nothing to pad)
        folds = self.cache.prepare_commit(batch.req_slots, num_nodes, [True] * len(batch.req_slots))
        every_row_folds = self._decode_folds_apart and bool(folds) and all(folds)
        step = self._replay(batch, num_nodes, every_row_folds)
        self.cache.finish_decode(batch.req_slots, folds)
        rows = len(batch.req_slots)
        return step.logits[:rows, 0], step.inputs[:rows, step.layout.req_slot]

    def _replay(self, batch: StepBatch, num_nodes: list[int], every_row_folds: bool = False) -> _Bucket:
        """Pack the step's rows (padded to a captured width and checked: num_nodes per row) into its bucket's
        inputs, copy them over and replay the forward (every_row_folds: a decode step's in which every row folds;
        its padding rows, without a state slot, fold nothing)."""
        rows, lay = len(batch.req_slots), self.layouts[batch.width]
        seq_lens, state_slots = self.cache.committed_rows(batch.req_slots)
        key = (lay.width, next(size for size in self.buckets if size >= rows),
               self.kv_bucket(max(seq_lens) + lay.width))
        if key not in self._steps:
            self._steps[key] = self._build(*key)
        step = self._steps[key]
        step.turn ^= 1  # the other buffer may still be on its way to the device (a step launched before this one)
        host = step.host_input_arrays[step.turn]
        host[:rows, lay.tokens] = batch.tokens.numpy()
        host[:rows, lay.parents] = batch.parents.numpy()
        if lay.width > 1 and not batch.checked_trees:  # the graph builds the masks without checking (a one-node
            check_tree(batch.parents, batch.num_nodes)  # tree, and a batch checked on the host, are valid)
        host[:rows, lay.num_nodes] = num_nodes
        host[:rows, lay.req_slot] = batch.req_slots
        host[:rows, lay.state_slot] = state_slots
        host[:rows, lay.seq_len] = seq_lens
        host[rows:] = lay.padding_inputs_array
        step.inputs.copy_(step.host_inputs[step.turn], non_blocking=True)
        self.replays[lay.width] += 1
        graph = step.folding_graph if every_row_folds else step.forward_graph
        if graph is not None:
            graph.replay()
        else:
            self._forward(step, shared_outputs=True, every_row_folds=every_row_folds)
        return step

    @torch.inference_mode()
    def commit_on_device(self, graph_step: GraphStep, accepted: AcceptedOnDevice) -> list[Accepted]:
        """Keep each row's accepted path, launched from its acceptance still on the device, then read the
        acceptance: the host's wait for the device overlaps the commit instead of preceding it (the H200 timeline
        of 2026-12-03: 0.8 ms a step of idle GPU at batch 128 between the verify and the commit). Every row that
        may fold (its buffer plus its whole tree reaching the flush length) takes its state slot first; those
        whose fold did not happen give it back."""
        slots, rows, bucket = graph_step.batch.req_slots, len(graph_step.batch.req_slots), graph_step.bucket
        lay = bucket.layout
        had_state = [self.cache.state_slot[slot] >= 0 for slot in slots]
        self.cache.prepare_commit(slots, graph_step.batch.node_counts, [True] * rows)  # every node kept
        took = [not had and self.cache.state_slot[slot] >= 0 for slot, had in zip(slots, had_state, strict=True)]
        self._send_commit_inputs(bucket, slots)
        inputs = bucket.commit_inputs
        inputs[:rows, lay.accepted] = accepted.columns(lay.width)  # the kept nodes, root first
        inputs[:rows, lay.num_accepted] = accepted.kept + 1
        accepted.start_read()  # (queued before the commit: the read below waits for the acceptance only)
        self._replay_commit(bucket)
        results = accepted.read()  # (the wait: the commit runs meanwhile, and on while the host emits and drafts)
        folds = self.cache.finish_commit(slots, [len(path) for path, _ in results])
        if any(took):  # (rows that took a state slot for a fold that did not happen give it back)
            self.cache.return_states([slot for slot, taken, fold in zip(slots, took, folds, strict=True)
                                      if taken and not fold])
        return results

    @torch.inference_mode()
    def commit(self, graph_step: GraphStep, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Keep the accepted paths (as KVBufferCache.commit: accepted [B, A] root first, -1 padded; num_accepted
        [B]) of a step that score_all ran: the host halves of the cache's commit around the captured device half."""
        slots, rows, bucket = graph_step.batch.req_slots, len(graph_step.batch.req_slots), graph_step.bucket
        lay = bucket.layout
        counts = num_accepted.tolist()
        folds = self.cache.prepare_commit(slots, counts, [True] * rows)
        host = bucket.host_commit_arrays[bucket.turn]
        host[:rows, lay.accepted] = -1
        host[:rows, : accepted.shape[1]] = accepted.numpy()
        host[:rows, lay.num_accepted] = num_accepted.numpy()
        self._send_commit_inputs(bucket, slots)
        self._replay_commit(bucket)
        self.cache.finish_commit(slots, counts, folds)

    def _send_commit_inputs(self, bucket: _Bucket, slots: list[int]) -> None:
        """The real rows' state slots (after prepare_commit) and the padding rows into the bucket's host commit
        inputs, copied to the device in one non-blocking transfer (the accepted columns: the caller's)."""
        rows, lay, host = len(slots), bucket.layout, bucket.host_commit_arrays[bucket.turn]
        host[:rows, lay.commit_state_slot] = self.cache.committed_rows(slots)[1]
        host[rows:] = lay.padding_commit_array
        bucket.commit_inputs.copy_(bucket.host_commit[bucket.turn], non_blocking=True)

    def _replay_commit(self, bucket: _Bucket) -> None:
        if bucket.commit_graph is not None:
            bucket.commit_graph.replay()
        else:
            self._commit(bucket)
