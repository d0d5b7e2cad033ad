"""Mixture-of-experts ops as torch references (naive.py) and, where triton is installed, Triton kernels of the same
signatures that never synchronise with the host (CUDA graphs): a MoE layer's routed experts (experts.py, on the
block layout of routing.py), and the per-row-expert linear map (grouped_linear.py, the unfused path that
benchmarks/moe.py times them against)."""

import importlib.util

from verify_kernels.moe.naive import ACTIVATIONS, grouped_linear_ref, moe_experts_ref

__all__ = ["ACTIVATIONS", "grouped_linear_ref", "moe_experts_ref"]

if importlib.util.find_spec("triton") is not None:
    from verify_kernels.moe.experts import ExpertsConfig, GemmConfig, experts_config, moe_experts
    from verify_kernels.moe.grouped_linear import ExpertBlocks, expert_blocks, grouped_linear
    from verify_kernels.moe.routing import ExpertLayout, expert_layout

    __all__ += ["ExpertBlocks", "ExpertLayout", "ExpertsConfig", "GemmConfig", "expert_blocks", "expert_layout",
                "experts_config", "grouped_linear", "moe_experts"]
