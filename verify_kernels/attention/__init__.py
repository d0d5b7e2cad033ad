"""Full attention over the slot-indexed KV pool with a token-tree mask: the torch reference (naive.py, the oracle and
the CPU path) and the Triton kernel of the same signature (flash_tree.py), which reads the pool in place; the commit
of the accepted nodes' keys and values, likewise (naive.py, kv_commit.py)."""

from verify_kernels.attention.naive import (
    commit_kv_ref,
    masked_attention_ref,
    tree_attention_mask,
    tree_attention_ref,
    write_nodes_ref,
)
from verify_kernels.lazy import kernels_on_first_use

__all__ = ["commit_kv_ref", "masked_attention_ref", "tree_attention_mask", "tree_attention_ref", "write_nodes_ref"]

_KERNELS = {  # the Triton kernels (imported on first use: they need triton) -> their modules
    "tree_attention": "verify_kernels.attention.flash_tree",
    "commit_kv": "verify_kernels.attention.kv_commit",
}
__all__ += sorted(_KERNELS)

__getattr__ = kernels_on_first_use(globals(), _KERNELS)
