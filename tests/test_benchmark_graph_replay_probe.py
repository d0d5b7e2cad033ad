"""benchmarks/graph_replay_probe.py: its stand-in step counts what it launches, and each variant captures and
replays its hot graph (on a GPU: CUDA graphs)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.graph_replay_probe import VARIANTS, WIDTH, block_step, run_variant


def test_the_stand_in_step_keeps_its_rows_and_reads_every_weight():
    weights = [torch.eye(WIDTH, dtype=torch.bfloat16) * (k + 1) for k in range(3)]
    x = torch.ones(2, WIDTH, dtype=torch.bfloat16)
    y = block_step(x, weights, layers=3)
    assert y.shape == x.shape and y.dtype == x.dtype
    # each block: y = x @ (k+1) I, normalised to unit RMS, added to x: ones -> 2, 3, 4 whatever the scale
    assert torch.allclose(y.float(), torch.full((2, WIDTH), 4.0), atol=0.05)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_replays_its_hot_graph(variant, monkeypatch):
    monkeypatch.setenv("PROBE_HELD_BYTES", str(2**20))
    result = run_variant(variant, layers=4, replays=3, repeats=2)
    assert result["variant"] == variant and result["ms"] > 0 and len(result["ms_all"]) == 2
    assert result["kernels"] >= 4 * 5  # (a GEMV and the norm's element-wise kernels per block)
