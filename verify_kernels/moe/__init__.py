"""Mixture-of-experts: the per-row-expert linear map as a torch reference (naive.py) and, where triton is
installed, a Triton kernel of the same signature that never synchronises with the host (grouped_linear.py)."""

import importlib.util

from verify_kernels.moe.naive import grouped_linear_ref

__all__ = ["grouped_linear_ref"]

if importlib.util.find_spec("triton") is not None:
    from verify_kernels.moe.grouped_linear import ExpertBlocks, expert_blocks, grouped_linear

    __all__ += ["ExpertBlocks", "expert_blocks", "grouped_linear"]
