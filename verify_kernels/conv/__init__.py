"""Tree-aware short causal conv1d: windows through parent pointers, conv, and commit of the conv history."""

from verify_kernels.conv.naive import causal_conv1d_tree_ref, conv_commit_ref, tree_conv_windows_ref

__all__ = ["causal_conv1d_tree_ref", "conv_commit_ref", "tree_conv_windows_ref"]
