"""Verify kernels for KVBuffer speculative decoding: per mixer (gdn, mamba2, conv) a pure-torch reference
(`naive.py`, the oracle of every kernel test and the CPU path of the engine), the slot-indexed KVBuffer pools
that gdn and mamba2 share (`kvbuffer.py`), plus token-tree utilities."""

from verify_kernels.conv import causal_conv1d_tree_ref, conv_commit_ref, tree_conv_windows_ref
from verify_kernels.gdn import (
    gdn_chunk_prefill_ref,
    gdn_commit_ref,
    gdn_decode_ref,
    gdn_flush_ref,
    gdn_recurrent_ref,
    gdn_verify_ref,
)
from verify_kernels.mamba2 import (
    mamba2_chunk_prefill_ref,
    mamba2_commit_ref,
    mamba2_decode_ref,
    mamba2_flush_ref,
    mamba2_recurrent_ref,
    mamba2_verify_ref,
)
from verify_kernels.tree import ancestor_mask, chain_parents, check_tree, node_depths, tree_cumsum

__all__ = [
    "ancestor_mask",
    "causal_conv1d_tree_ref",
    "chain_parents",
    "check_tree",
    "conv_commit_ref",
    "gdn_chunk_prefill_ref",
    "gdn_commit_ref",
    "gdn_decode_ref",
    "gdn_flush_ref",
    "gdn_recurrent_ref",
    "gdn_verify_ref",
    "mamba2_chunk_prefill_ref",
    "mamba2_commit_ref",
    "mamba2_decode_ref",
    "mamba2_flush_ref",
    "mamba2_recurrent_ref",
    "mamba2_verify_ref",
    "node_depths",
    "tree_conv_windows_ref",
    "tree_cumsum",
]
