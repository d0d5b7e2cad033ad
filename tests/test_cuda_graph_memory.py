"""The memory of the CUDA graphs of specdec/runner/cuda_graphs.py: the graphs' pool after a capture that failed (on a
GPU), and a width captured only up to a batch (adaptive speculation's tree): its graphs and the shared outputs sized
for it (on the CPU, through the static steps run eagerly)."""

from __future__ import annotations

import gc

import pytest
import torch

from specdec.cache.spec import CacheConfig
from specdec.cache.step import StepBatch
from specdec.models import load_model
from specdec.runner import ModelRunner
from specdec.runner.cuda_graphs import StepGraphs
from tests.test_cuda_graphs import CONFIGS, CUDA, engine_for, generate, save
from tests.tiny_models import save_tiny


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    return save(request.param, tmp_path_factory)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_a_capture_that_fails_before_any_graph_holds_the_pool_leaves_one_to_capture_into(checkpoint, monkeypatch):
    """Out of memory in the first step captured (the widest and largest): torch forgets the pool's last user, and a
    capture into it again stopped on its allocator's internal assert (the H100 study of 2026-12-06, Qwen3.5-9B's
    adaptive engine at batch 512). The next capture, memory freed, builds its steps, which generate the eager
    engine's tokens."""
    eager = engine_for(checkpoint, "ngram", 3, cuda_graphs=False, device="cuda")
    graphed = engine_for(checkpoint, "ngram", 3, cuda_graphs=True, device="cuda")
    graphs, forward = graphed.runner.graphs, StepGraphs._forward

    def out_of_memory_while_capturing(self, step, *args, **kwargs):
        if torch.cuda.is_current_stream_capturing():
            raise torch.OutOfMemoryError("CUDA out of memory (raised by the test)")
        return forward(self, step, *args, **kwargs)

    monkeypatch.setattr(StepGraphs, "_forward", out_of_memory_while_capturing)
    stale = graphs._pool.handle
    with pytest.raises(torch.OutOfMemoryError):
        graphed.runner.capture(3, 8, 64)
    gc.collect()  # (the failed graph freed, as a caller that frees memory before trying again frees it)
    torch.cuda.empty_cache()
    assert not graphs._steps and graphs._pool.handle != stale
    monkeypatch.setattr(StepGraphs, "_forward", forward)
    assert graphed.runner.capture(3, 8, 64) > 0 and graphs._pool.held >= len(graphs._steps) > 0
    assert generate(graphed) == generate(eager)


def test_a_width_capped_in_rows_has_graphs_and_outputs_only_up_to_its_bucket(tmp_path):
    """Adaptive speculation's tree at small batches only (AdaptiveConfig.tree_max_batch): no step of its width is
    built above its bucket, such a step runs eagerly (fits: False), and the shared outputs are sized for the most
    rows x width a graph runs (the tree's 17 at 8 rows against the 4-chains' 5 at 32, not 17 at 32)."""
    save_tiny(CONFIGS["qwen3_5"](), tmp_path, seed=1)
    runner = ModelRunner.create(load_model(tmp_path, device="cpu"), CacheConfig(max_requests=40, max_seq_len=1000))
    graphed = StepGraphs(runner, width=17, max_batch=32, capture=False)
    graphed.set_widths([2, 3, 5], max_rows={17: 6})  # (6 rows: the bucket of 8)
    graphed.capture_buckets(rows=32, shortest=200, longest=200)
    sizes = {width: {size for w, size, _ in graphed._steps if w == width} for width in graphed.widths}
    assert sizes[17] == {1, 2, 4, 8} and sizes[5] == sizes[2] == {1, 2, 4, 8, 16, 24, 32}
    def step_of(rows):  # (17 nodes a row: only the tree's graphs hold it)
        return StepBatch.chains(list(range(rows)), [list(range(17))] * rows, prefill=False)

    assert graphed.fits(step_of(8)) and not graphed.fits(step_of(9))
    graphed._vocab, graphed._feature_shape = 10, (4, torch.float32)  # (what a first forward sets)
    logits, _ = graphed._outputs(8, 17)
    assert graphed._logits.numel() == max(32 * 5, 8 * 17) * 10 and logits.shape == (8, 17, 10)
