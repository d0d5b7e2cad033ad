"""benchmarks/graph_replay_probe.py: its stand-in steps compute what they say (the Triton one in the interpreter
on the CPU), and each variant captures and replays its hot graph (on a GPU: CUDA graphs)."""

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


def test_the_triton_norm_block_is_the_add_and_norm_of_its_gemv():
    torch.manual_seed(0)
    weights = [torch.randn(WIDTH, WIDTH, dtype=torch.bfloat16) * 0.02 for _ in range(2)]
    x = torch.randn(2, WIDTH, dtype=torch.bfloat16)
    norm_weight = torch.rand(WIDTH) + 0.5
    got = block_step(x, weights, 2, norm_weight)
    residual, h = x, x  # (the reference: s = GEMV + residual rounded to bf16, then s / rms(s) * w)
    for layer in range(2):
        s = ((h @ weights[layer]).float() + residual.float()).to(torch.bfloat16)
        residual = s
        h = (s.float() * torch.rsqrt(s.float().pow(2).mean(-1, keepdim=True) + 1e-6) * norm_weight).to(torch.bfloat16)
    torch.testing.assert_close(got.float(), h.float(), atol=0.05, rtol=0.02)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("triton", [False, True])
def test_each_variant_replays_its_hot_graph(variant, triton, monkeypatch):
    monkeypatch.setenv("PROBE_HELD_BYTES", str(2**20))
    result = run_variant(variant, layers=4, replays=3, repeats=2, triton=triton)
    assert result["variant"] == variant and result["ms"] > 0 and len(result["ms_all"]) == 2
    assert result["kernels"] >= 4 * (2 if triton else 5)  # (a GEMV and the norm's kernels per block)
