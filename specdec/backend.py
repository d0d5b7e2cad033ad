"""Which implementation of each KVBuffer op the runtime calls: the pure-torch references (CPU, and the oracle) or
the Triton kernels (CUDA). Both take the same arguments, so the model code is the same on every device.

`SPECDEC_BACKEND=reference` forces the references on a GPU (debugging); `SPECDEC_BACKEND=triton` forces the
kernels on a CPU, where they run in Triton's interpreter (set TRITON_INTERPRET=1 before importing specdec).
Chunked prefill on CUDA uses fla-core's chunk kernels when fla is installed (the `bench` extra) and the
reference otherwise.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

import verify_kernels.conv as conv
import verify_kernels.gdn as gdn
import verify_kernels.mamba2 as mamba2

BACKENDS = ("reference", "triton")


@dataclass(frozen=True)
class MixerOps:
    """One mixer's ops; signatures as in verify_kernels/<mixer>/naive.py."""

    decode: Callable
    verify: Callable
    commit: Callable
    flush: Callable
    chunk_prefill: Callable


@dataclass(frozen=True)
class ConvOps:
    tree: Callable
    commit: Callable


def backend_for(device: torch.device) -> str:
    forced = os.environ.get("SPECDEC_BACKEND")
    if forced is not None:
        if forced not in BACKENDS:
            raise ValueError(f"SPECDEC_BACKEND={forced!r} is not one of {BACKENDS}")
        return forced
    return "triton" if device.type == "cuda" else "reference"


@functools.cache
def gdn_ops(backend: str) -> MixerOps:
    if backend == "reference":
        return MixerOps(gdn.gdn_decode_ref, gdn.gdn_verify_ref, gdn.gdn_commit_ref, gdn.gdn_flush_ref,
                        gdn.gdn_chunk_prefill_ref)
    return MixerOps(gdn.gdn_decode, gdn.gdn_verify, gdn.gdn_commit, gdn.gdn_flush, _gdn_chunk_prefill_fast())


@functools.cache
def mamba2_ops(backend: str) -> MixerOps:
    if backend == "reference":
        return MixerOps(mamba2.mamba2_decode_ref, mamba2.mamba2_verify_ref, mamba2.mamba2_commit_ref,
                        mamba2.mamba2_flush_ref, mamba2.mamba2_chunk_prefill_ref)
    return MixerOps(mamba2.mamba2_decode, mamba2.mamba2_verify, mamba2.mamba2_commit, mamba2.mamba2_flush,
                    mamba2.mamba2_chunk_prefill_ref)


@functools.cache
def conv_ops(backend: str) -> ConvOps:
    if backend == "reference":
        return ConvOps(conv.causal_conv1d_tree_ref, conv.conv_commit_ref)
    return ConvOps(conv.causal_conv1d_tree, conv.conv_commit)


def _gdn_chunk_prefill_fast() -> Callable:
    """fla's chunked gated delta rule when importable (a GPU-only dependency), else the reference."""
    if not torch.cuda.is_available():
        return gdn.gdn_chunk_prefill_ref
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return gdn.gdn_chunk_prefill_ref

    def chunk_prefill(q, k, v, g, beta, initial_state=None, chunk_size=64):
        """Same contract as gdn_chunk_prefill_ref (q, k normalised, q pre-scaled): fla with scale 1."""
        del chunk_size  # fla picks its own
        o, final_state = chunk_gated_delta_rule(q, k, v.to(q.dtype), g, beta, scale=1.0, initial_state=initial_state,
                                                output_final_state=True)
        return o.float(), final_state.float()

    return chunk_prefill
