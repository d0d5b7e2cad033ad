"""Tree-aware short causal conv1d: windows through parent pointers, conv, and commit of the conv history, as torch
references (naive.py) and Triton kernels of the same signatures (tree_conv.py; plain decoding's conv and commit in
one: decode_conv.py; the Gated DeltaNet's conv with its q / k / v split fused in: conv_qkv.py)."""

from verify_kernels.conv.naive import (
    GateInputs,
    QKVHeads,
    causal_conv1d_tree_qkv_ref,
    causal_conv1d_tree_ref,
    conv_commit_ref,
    conv_decode_qkv_ref,
    conv_decode_ref,
    tree_conv_windows_ref,
)
from verify_kernels.conv.window_sources import conv_window_sources
from verify_kernels.lazy import kernels_on_first_use

__all__ = ["GateInputs", "QKVHeads", "causal_conv1d_tree_qkv_ref", "causal_conv1d_tree_ref", "conv_commit_ref",
           "conv_decode_qkv_ref", "conv_decode_ref", "conv_window_sources", "tree_conv_windows_ref"]

_KERNELS = {  # the Triton kernels (imported on first use: they need triton) -> their modules
    "causal_conv1d_tree": "verify_kernels.conv.tree_conv",
    "causal_conv1d_tree_qkv": "verify_kernels.conv.conv_qkv",
    "conv_commit": "verify_kernels.conv.tree_conv",
    "conv_decode": "verify_kernels.conv.decode_conv",
    "conv_decode_qkv": "verify_kernels.conv.conv_qkv",
}
__all__ += sorted(_KERNELS)

__getattr__ = kernels_on_first_use(globals(), _KERNELS)
