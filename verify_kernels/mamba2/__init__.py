"""Mamba2 (Nemotron-H): recurrence, chunked prefill and KVBuffer decode / verify / commit / flush."""

from verify_kernels.mamba2.naive import (
    mamba2_chunk_prefill_ref,
    mamba2_commit_ref,
    mamba2_decode_ref,
    mamba2_flush_ref,
    mamba2_recurrent_ref,
    mamba2_verify_ref,
)

__all__ = [
    "mamba2_chunk_prefill_ref",
    "mamba2_commit_ref",
    "mamba2_decode_ref",
    "mamba2_flush_ref",
    "mamba2_recurrent_ref",
    "mamba2_verify_ref",
]
