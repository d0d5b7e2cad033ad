"""Which implementation of each op the runtime calls, the kernel backend: the pure-torch references (CPU, and the
oracle) or the Triton kernels (CUDA). Both take the same arguments, so the model code is the same on every device.
The cache picks a layer's ops once, when it builds the layer's pool (specdec/cache/linear_pool.py); the mixers call
what the pool holds. (Whether linear layers keep a KVBuffer or intermediate states is another choice, the linear
state: specdec/cache/linear_state.py.)

`SPECDEC_BACKEND=reference` forces the references on a GPU (debugging); `SPECDEC_BACKEND=triton` forces the
kernels on a CPU, where they run in Triton's interpreter (set TRITON_INTERPRET=1 before importing specdec).
Layers whose head dims the kernels do not take (they need 16, 32, 64 or 128; attention 16 to 256) run on the
references anywhere. MoE experts follow the same choice (specdec/models/moe.py: the fused experts of
verify_kernels/moe on Triton).
Chunked prefill: GDN and Mamba2 layers of bf16 / fp16 models on the Triton backend use fla-core's chunk kernels when
fla is installed (chunk_prefill); fp32 models use the references.
The layer glue (norms with the residual add, gated norms, the mixers' inputs, activations, q / k norm + rotary:
verify_kernels/glue) follows the device the same way, picked per call by the modules (glue_ops_for).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

import verify_kernels.attention as attention
import verify_kernels.conv as conv
import verify_kernels.fla_support as fla_support
import verify_kernels.gdn as gdn
import verify_kernels.glue as glue
import verify_kernels.intermediate as intermediate
import verify_kernels.mamba2 as mamba2
from verify_kernels.kvbuffer import decode_then_commit

BACKENDS = ("reference", "triton")


@dataclass(frozen=True)
class MixerOps:
    """One mixer's ops; signatures as in verify_kernels/<mixer>/naive.py."""

    decode: Callable
    verify: Callable
    commit: Callable
    flush: Callable
    chunk_prefill: Callable
    decode_commit: Callable  # plain decoding: decode, then commit of that token, in one op
    # ... launched for a step in which every row's buffer fills (plain decoding's rows in lockstep), where that
    # launch differs (the GDN kernels: the fold in the flush's pipelined row loop); None: decode_commit serves
    decode_commit_folding: Callable | None = None


@dataclass(frozen=True)
class IntermediateOps:
    """The intermediate-state baseline's ops (verify_kernels/intermediate): a tree walked node by node from the
    committed state with one state per node, and the commit that copies the accepted node's state."""

    tree: Callable
    commit: Callable


@dataclass(frozen=True)
class ConvOps:
    tree: Callable
    commit: Callable
    decode: Callable  # plain decoding: the tree conv of one node and its commit in one op
    # the Gated DeltaNet's conv, then its q / k / v split (glue gdn_qkv), as one op (verify_kernels/conv/conv_qkv.py)
    tree_qkv: Callable
    decode_qkv: Callable
    # whether tree() reads the step's window sources (StepContext.window_sources): the kernel does, the reference
    # walks the parents itself, so a step on the references computes none
    reads_sources: bool = False


@dataclass(frozen=True)
class GlueOps:
    """The layer glue between GEMMs and mixers; signatures as in verify_kernels/glue/naive.py."""

    rms_norm: Callable
    add_rms_norm: Callable
    rms_norm_gated: Callable
    gdn_qkv: Callable
    gdn_gates: Callable
    mamba2_inputs: Callable
    act_mul: Callable
    relu2: Callable
    qk_norm_rotary: Callable


KERNEL_HEAD_DIMS = (16, 32, 64, 128)


def backend_for(device: torch.device, *head_dims: int) -> str:
    """The backend for a layer on `device` whose state is head_dims (GDN: K, V; Mamba2: P, N)."""
    forced = os.environ.get("SPECDEC_BACKEND")
    if forced is not None and forced not in BACKENDS:
        raise ValueError(f"SPECDEC_BACKEND={forced!r} is not one of {BACKENDS}")
    if any(dim not in KERNEL_HEAD_DIMS for dim in head_dims):
        return "reference"
    backend = forced if forced is not None else ("triton" if device.type == "cuda" else "reference")
    if backend == "triton":
        check_triton()
    return backend


@functools.cache
def check_triton() -> None:
    """The Triton kernels need triton (the `gpu` extra): say so once, before any kernel is called."""
    import importlib.util

    try:
        missing = importlib.util.find_spec("triton") is None
    except ImportError:
        missing = True
    if missing:
        raise ValueError("the GPU kernels need triton, which is not installed: pip install 'specdec[gpu]' (or run on "
                         "the CPU, or set SPECDEC_BACKEND=reference)")


@functools.cache
def gdn_ops(backend: str) -> MixerOps:
    if backend == "reference":
        return MixerOps(gdn.gdn_decode_ref, gdn.gdn_verify_ref, gdn.gdn_commit_ref, gdn.gdn_flush_ref,
                        gdn.gdn_chunk_prefill_ref,
                        partial(decode_then_commit, gdn.gdn_decode_ref, gdn.gdn_commit_ref, 1))
    # the cache reads no op's flushed rows (it knows them on the host): not computed, three launches per layer less
    return MixerOps(gdn.gdn_decode, gdn.gdn_verify, partial(gdn.gdn_commit, flushed=False), gdn.gdn_flush,
                    gdn.gdn_chunk_prefill_ref, partial(gdn.gdn_decode_commit, flushed=False),
                    partial(gdn.gdn_decode_commit, flushed=False, every_row_folds=True))


def chunk_prefill(mixer: str, backend: str, dtype: torch.dtype) -> Callable:
    """The chunked prefill for a `mixer` ("gdn" / "mamba2") layer of this dtype: fla-core's chunk kernel on the Triton
    backend for bf16 / fp16 models when fla is installed (its half / TF32 products sit below the model's rounding);
    the reference otherwise, so fp32 models stay exact."""
    with_fla = backend == "triton" and dtype != torch.float32 and fla_support.fla_available()
    if mixer == "gdn":
        return gdn.gdn_chunk_prefill_fla if with_fla else gdn.gdn_chunk_prefill_ref
    return partial(mamba2.mamba2_chunk_prefill_fla, dtype=dtype) if with_fla else mamba2.mamba2_chunk_prefill_ref


@functools.cache
def mamba2_ops(backend: str) -> MixerOps:
    if backend == "reference":
        return MixerOps(mamba2.mamba2_decode_ref, mamba2.mamba2_verify_ref, mamba2.mamba2_commit_ref,
                        mamba2.mamba2_flush_ref, mamba2.mamba2_chunk_prefill_ref,
                        partial(decode_then_commit, mamba2.mamba2_decode_ref, mamba2.mamba2_commit_ref, 3))
    return MixerOps(mamba2.mamba2_decode, mamba2.mamba2_verify, mamba2.mamba2_commit, mamba2.mamba2_flush,
                    mamba2.mamba2_chunk_prefill_ref, mamba2.mamba2_decode_commit)


@functools.cache
def conv_ops(backend: str) -> ConvOps:
    if backend == "reference":
        return ConvOps(conv.causal_conv1d_tree_ref, conv.conv_commit_ref, conv.conv_decode_ref,
                       conv.causal_conv1d_tree_qkv_ref, conv.conv_decode_qkv_ref)
    return ConvOps(conv.causal_conv1d_tree, conv.conv_commit, conv.conv_decode, conv.causal_conv1d_tree_qkv,
                   conv.conv_decode_qkv, reads_sources=True)


@functools.cache
def intermediate_ops(mixer: str, backend: str) -> IntermediateOps:
    """The baseline's ops for a mixer ("gdn" or "mamba2")."""
    if backend == "reference":
        tree = {"gdn": intermediate.gdn_intermediate_ref, "mamba2": intermediate.mamba2_intermediate_ref}[mixer]
        return IntermediateOps(tree, intermediate.commit_node_states_ref)
    tree = {"gdn": intermediate.gdn_intermediate, "mamba2": intermediate.mamba2_intermediate}[mixer]
    return IntermediateOps(tree, intermediate.commit_node_states)


@functools.cache
def glue_ops(backend: str) -> GlueOps:
    if backend == "reference":
        return GlueOps(glue.rms_norm_ref, glue.add_rms_norm_ref, glue.rms_norm_gated_ref, glue.gdn_qkv_ref,
                       glue.gdn_gates_ref, glue.mamba2_inputs_ref, glue.act_mul_ref, glue.relu2_ref,
                       glue.qk_norm_rotary_ref)
    return GlueOps(glue.rms_norm, glue.add_rms_norm, glue.rms_norm_gated, glue.gdn_qkv, glue.gdn_gates,
                   glue.mamba2_inputs, glue.act_mul, glue.relu2, glue.qk_norm_rotary)


def glue_ops_for(device: torch.device) -> GlueOps:
    """The glue for tensors on `device`: the kernels on CUDA (or with SPECDEC_BACKEND=triton), else the references.
    Checked per call (a dict lookup and an environment read), so that a model follows SPECDEC_BACKEND as it changes."""
    return glue_ops(backend_for(device))


ATTENTION_MIN_HEAD_DIM, ATTENTION_MAX_HEAD_DIM = 16, 256  # the kernel's dots need 16; registers cap it at 256


def commit_kv_op(device: torch.device) -> Callable:
    """The commit of the accepted nodes' keys and values (signature of verify_kernels.attention.commit_kv_ref): the
    Triton kernel, one launch per layer, or the reference (about nine torch ops)."""
    return attention.commit_kv if backend_for(device) == "triton" else attention.commit_kv_ref


def attention_op(device: torch.device, head_dim: int) -> Callable:
    """Tree attention over the KV pool (signature of verify_kernels.attention.tree_attention_ref): the Triton kernel,
    which reads the pool in place, or the reference (write, gather, SDPA)."""
    if ATTENTION_MIN_HEAD_DIM <= head_dim <= ATTENTION_MAX_HEAD_DIM and backend_for(device) == "triton":
        return attention.tree_attention
    return attention.tree_attention_ref
