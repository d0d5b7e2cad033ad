"""The MoE blocks' grouped-GEMM experts (specdec/models/moe.py StackedExperts, the path CUDA graphs capture: no
host-side loop over the experts a routing chose) against the per-expert loop, on both MoE families."""

from __future__ import annotations

import pytest
import torch

from specdec.models import load_model
from specdec.models.moe import StackedExperts
from tests.tiny_models import nemotron_h_config, qwen35_text_config, save_tiny

CONFIGS = {"qwen3_5_moe": lambda: qwen35_text_config(moe=True, linear_key_head_dim=16, linear_value_head_dim=16),
           "nemotron_h": lambda: nemotron_h_config(mamba_head_dim=16, ssm_state_size=16)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_grouped_experts_equal_one_expert_at_a_time(family, dtype, tmp_path):
    """The grouped-GEMM experts (capturable) against the per-expert loop, on random routings with idle experts."""
    save_tiny(CONFIGS[family](), tmp_path, seed=4)
    model = load_model(tmp_path, device="cpu", dtype=dtype)
    experts = next(m for m in model.modules() if isinstance(m, StackedExperts))
    assert experts.grouped
    gen = torch.Generator().manual_seed(2)
    num_experts, dim = experts.first.shape[0], experts.second.shape[1]
    x = torch.randn(37, dim, generator=gen).to(dtype)
    top_index = torch.stack([torch.randperm(num_experts - 1, generator=gen)[:2] for _ in range(37)])  # last idle
    top_weight = torch.rand(37, 2, generator=gen).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(experts._grouped(x, top_index, top_weight), experts._looped(x, top_index, top_weight),
                               atol=tol, rtol=tol)
