"""Gated DeltaNet (Qwen3.5): recurrence, chunked prefill and KVBuffer decode / verify / commit / flush, as torch
references (naive.py) and, where triton is installed, Triton kernels of the same signatures (decode.py, verify.py,
commit.py); chunked prefill through fla-core where it is installed (fla_chunk.py)."""

import importlib.util

from verify_kernels.gdn.fla_chunk import fla_available, gdn_chunk_prefill_fla
from verify_kernels.gdn.naive import (
    gdn_chunk_prefill_ref,
    gdn_commit_ref,
    gdn_decode_ref,
    gdn_flush_ref,
    gdn_recurrent_ref,
    gdn_verify_ref,
)

__all__ = [
    "fla_available",
    "gdn_chunk_prefill_fla",
    "gdn_chunk_prefill_ref",
    "gdn_commit_ref",
    "gdn_decode_ref",
    "gdn_flush_ref",
    "gdn_recurrent_ref",
    "gdn_verify_ref",
]

# triton is a Linux-only dependency (pyproject.toml); the references work everywhere
if importlib.util.find_spec("triton") is not None:
    from verify_kernels.gdn.commit import gdn_commit, gdn_flush
    from verify_kernels.gdn.decode import gdn_decode, gdn_decode_commit
    from verify_kernels.gdn.verify import gdn_verify

    __all__ += ["gdn_commit", "gdn_decode", "gdn_decode_commit", "gdn_flush", "gdn_verify"]
