"""Gated DeltaNet (Qwen3.5): recurrence, chunked prefill and KVBuffer decode / verify / commit / flush, as torch
references (naive.py) and Triton kernels of the same signatures (decode.py, verify.py with its state pass in
verify_state.py, commit.py and fold.py); chunked prefill through fla-core where it is installed (fla_chunk.py)."""

from verify_kernels.gdn.fla_chunk import gdn_chunk_prefill_fla
from verify_kernels.gdn.naive import (
    gdn_chunk_prefill_ref,
    gdn_commit_ref,
    gdn_decode_ref,
    gdn_flush_ref,
    gdn_recurrent_ref,
    gdn_verify_ref,
)
from verify_kernels.lazy import kernels_on_first_use

__all__ = [
    "gdn_chunk_prefill_fla",
    "gdn_chunk_prefill_ref",
    "gdn_commit_ref",
    "gdn_decode_ref",
    "gdn_flush_ref",
    "gdn_recurrent_ref",
    "gdn_verify_ref",
]

_KERNELS = {  # the Triton kernels (imported on first use: they need triton) -> their modules
    "gdn_commit": "verify_kernels.gdn.commit",
    "gdn_decode": "verify_kernels.gdn.decode",
    "gdn_decode_commit": "verify_kernels.gdn.decode",
    "gdn_flush": "verify_kernels.gdn.commit",
    "gdn_verify": "verify_kernels.gdn.verify",
}
__all__ += sorted(_KERNELS)

__getattr__ = kernels_on_first_use(globals(), _KERNELS)
