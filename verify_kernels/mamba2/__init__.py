"""Mamba2 (Nemotron-H): recurrence, chunked prefill and KVBuffer decode / verify / commit / flush, as torch references
(naive.py) and Triton kernels of the same signatures (decode.py, verify.py, commit.py); chunked prefill through
fla-core where it is installed (fla_chunk.py)."""

from verify_kernels.lazy import kernels_on_first_use
from verify_kernels.mamba2.fla_chunk import mamba2_chunk_prefill_fla
from verify_kernels.mamba2.naive import (
    mamba2_chunk_prefill_ref,
    mamba2_commit_ref,
    mamba2_decode_ref,
    mamba2_flush_ref,
    mamba2_recurrent_ref,
    mamba2_verify_ref,
)

__all__ = [
    "mamba2_chunk_prefill_fla",
    "mamba2_chunk_prefill_ref",
    "mamba2_commit_ref",
    "mamba2_decode_ref",
    "mamba2_flush_ref",
    "mamba2_recurrent_ref",
    "mamba2_verify_ref",
]

_KERNELS = {  # the Triton kernels (imported on first use: they need triton) -> their modules
    "mamba2_commit": "verify_kernels.mamba2.commit",
    "mamba2_decode": "verify_kernels.mamba2.decode",
    "mamba2_decode_commit": "verify_kernels.mamba2.decode",
    "mamba2_flush": "verify_kernels.mamba2.commit",
    "mamba2_verify": "verify_kernels.mamba2.verify",
}
__all__ += sorted(_KERNELS)

__getattr__ = kernels_on_first_use(globals(), _KERNELS)
