"""Gated DeltaNet (Qwen3.5): recurrence, chunked prefill and KVBuffer decode / verify / commit / flush."""

from verify_kernels.gdn.naive import (
    gdn_chunk_prefill_ref,
    gdn_commit_ref,
    gdn_decode_ref,
    gdn_flush_ref,
    gdn_recurrent_ref,
    gdn_verify_ref,
)

__all__ = [
    "gdn_chunk_prefill_ref",
    "gdn_commit_ref",
    "gdn_decode_ref",
    "gdn_flush_ref",
    "gdn_recurrent_ref",
    "gdn_verify_ref",
]
