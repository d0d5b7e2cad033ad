"""Mamba2 (Nemotron-H): recurrence, chunked prefill and KVBuffer decode / verify / commit / flush, as torch references
(naive.py) and, where triton is installed, Triton kernels of the same signatures (decode.py, verify.py, commit.py)."""

import importlib.util

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

# triton is a Linux-only dependency (pyproject.toml); the references work everywhere
if importlib.util.find_spec("triton") is not None:
    from verify_kernels.mamba2.commit import mamba2_commit, mamba2_flush
    from verify_kernels.mamba2.decode import mamba2_decode, mamba2_decode_commit
    from verify_kernels.mamba2.verify import mamba2_verify

    __all__ += ["mamba2_commit", "mamba2_decode", "mamba2_decode_commit", "mamba2_flush", "mamba2_verify"]
