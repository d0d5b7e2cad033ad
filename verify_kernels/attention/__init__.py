"""Full attention over the slot-indexed KV pool with a token-tree mask: the torch reference (naive.py, the oracle and
the CPU path) and, where triton is installed, the Triton kernel of the same signature (flash_tree.py), which
reads the pool in place."""

import importlib.util

from verify_kernels.attention.naive import (
    masked_attention_ref,
    tree_attention_mask,
    tree_attention_ref,
    write_nodes_ref,
)

__all__ = ["masked_attention_ref", "tree_attention_mask", "tree_attention_ref", "write_nodes_ref"]

# triton is a Linux-only dependency (pyproject.toml); the reference works everywhere
if importlib.util.find_spec("triton") is not None:
    from verify_kernels.attention.flash_tree import tree_attention

    __all__ += ["tree_attention"]
