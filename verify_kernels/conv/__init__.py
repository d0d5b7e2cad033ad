"""Tree-aware short causal conv1d: windows through parent pointers, conv, and commit of the conv history, as torch
references (naive.py) and, where triton is installed, Triton kernels of the same signatures (tree_conv.py)."""

import importlib.util

from verify_kernels.conv.naive import causal_conv1d_tree_ref, conv_commit_ref, tree_conv_windows_ref

__all__ = ["causal_conv1d_tree_ref", "conv_commit_ref", "tree_conv_windows_ref"]

# triton is a Linux-only dependency (pyproject.toml); the references work everywhere
if importlib.util.find_spec("triton") is not None:
    from verify_kernels.conv.tree_conv import causal_conv1d_tree, conv_commit, conv_window_sources

    __all__ += ["causal_conv1d_tree", "conv_commit", "conv_window_sources"]
