"""Projections of one input run as one GEMM: the Gated DeltaNet's in_proj_z, in_proj_b and in_proj_a, a gated MLP's
gate_proj and up_proj, attention's k_proj and v_proj (and Nemotron-H's q_proj with them). An output the step keeps
until its commit (the GDN's in_proj_qkv, the conv's input) stays apart: a split view would keep the whole merged
output alive.

Checkpoints store them apart, and the loader fills them apart (each under its checkpoint name, each rank's slice
under tensor parallelism: specdec/models/loading.py). After loading, merge_linears concatenates their weights along
the outputs and makes each one's weight a view of its rows of the merged tensor, so the module's parameters keep
their names and the model holds each weight once. A forward then runs one GEMM and splits its output (views with
strided rows, which every consumer reads: the glue kernels, attention). Why: on the H200 (Qwen3.5-9B, plain decoding
at batch 256, 2026-12-02 profile) the GDN's in_proj_b and in_proj_a, 32 output channels each, were 48 split-K GEMMs
and as many reduce kernels a step (~0.45 ms of 15.6), and every separate projection is one more launch; serving
engines fuse them the same way (vLLM's merged column-parallel linears).

A .to() or a weight reassigned after the merge breaks the views: merged_outputs then sees the weights no longer
in place and runs one GEMM each, as the unmerged module would.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def merge_linears(linears: list[nn.Linear]) -> torch.Tensor | None:
    """Concatenate bias-free linears' weights (one input size, dtype and device) along the outputs -> the merged
    weight [sum of out_features, in_features], each linear's weight now a view of its rows; None (nothing changed,
    one GEMM each) where one has a bias or a weight is still on the meta device."""
    weights = [linear.weight for linear in linears]
    if any(w.is_meta for w in weights) or any(linear.bias is not None for linear in linears):
        return None
    if len({(w.shape[1], w.dtype, w.device) for w in weights}) != 1:
        raise ValueError("merge_linears needs one input size, dtype and device, got "
                         f"{[(tuple(w.shape), w.dtype, str(w.device)) for w in weights]}")
    merged = torch.cat([w.detach() for w in weights])
    offset = 0
    for linear, weight in zip(linears, weights, strict=True):
        rows = weight.shape[0]
        linear.weight = nn.Parameter(merged[offset:offset + rows], requires_grad=weight.requires_grad)
        offset += rows
    return merged


def merged_outputs(x: torch.Tensor, merged: torch.Tensor | None, linears: list[nn.Linear]) -> list[torch.Tensor]:
    """[linear(x) for each linear]: one GEMM on the merged weight, split (views), while every linear's weight is
    still its view of it (merge_linears); else one GEMM each, and so where a weight is to be trained (the merged
    tensor is no parameter: gradients would not reach the weights)."""
    trained = torch.is_grad_enabled() and any(linear.weight.requires_grad for linear in linears)
    if merged is not None and not trained and _in_place(merged, linears):
        return list(F.linear(x, merged).split([linear.out_features for linear in linears], dim=-1))
    return [linear(x) for linear in linears]


def _in_place(merged: torch.Tensor, linears: list[nn.Linear]) -> bool:
    row_bytes = merged.stride(0) * merged.element_size()
    offset = 0
    for linear in linears:
        if linear.weight.data_ptr() != merged.data_ptr() + offset * row_bytes:
            return False
        offset += linear.out_features
    return True
