"""Mixture-of-experts ops as torch references (naive.py) and Triton kernels of the same signatures that never
synchronise with the host (CUDA graphs): a MoE layer's routed experts (experts.py, on the block layout of routing.py),
the per-row-expert linear map (grouped_linear.py, the unfused path that benchmarks/moe.py times them against) and a
sigmoid router's top-k and a softmax router's (router.py)."""

from verify_kernels.lazy import kernels_on_first_use
from verify_kernels.moe.naive import (
    ACTIVATIONS,
    grouped_linear_ref,
    moe_experts_ref,
    sigmoid_router_ref,
    softmax_router_ref,
)

__all__ = ["ACTIVATIONS", "grouped_linear_ref", "moe_experts_ref", "sigmoid_router_ref", "softmax_router_ref"]

_KERNELS = {  # the Triton kernels (imported on first use: they need triton) -> their modules
    "ExpertBlocks": "verify_kernels.moe.grouped_linear",
    "ExpertLayout": "verify_kernels.moe.routing",
    "ExpertsConfig": "verify_kernels.moe.experts",
    "GemmConfig": "verify_kernels.moe.experts",
    "expert_blocks": "verify_kernels.moe.grouped_linear",
    "expert_layout": "verify_kernels.moe.routing",
    "experts_config": "verify_kernels.moe.experts",
    "grouped_linear": "verify_kernels.moe.grouped_linear",
    "moe_experts": "verify_kernels.moe.experts",
    "sigmoid_router": "verify_kernels.moe.router",
    "softmax_router": "verify_kernels.moe.router",
}
__all__ += sorted(_KERNELS)

__getattr__ = kernels_on_first_use(globals(), _KERNELS)
