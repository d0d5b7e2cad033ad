"""Per full-attention layer KV pool: an ordinary KV cache, one row of max_seq_len positions per request slot."""

from __future__ import annotations

import torch

from specdec.backend import attention_op, commit_kv_op

from .spec import AttentionLayerSpec


class AttentionLayerPool:
    """key, value [R, max_seq_len, kv_heads, head_dim] in the model dtype.

    Positions [0, seq_len) of a row hold its committed tokens. A step writes node j of a row at seq_len + j (the
    attention op does, verify_kernels/attention); commit moves the accepted nodes to seq_len, seq_len + 1, ... (a
    no-op for an accepted chain prefix).
    """

    def __init__(self, spec: AttentionLayerSpec, max_requests: int, max_seq_len: int,
                 device: torch.device, dtype: torch.dtype):
        shape = (max_requests, max_seq_len, spec.num_kv_heads, spec.head_dim)
        self.key = torch.zeros(shape, device=device, dtype=dtype)
        self.value = torch.zeros(shape, device=device, dtype=dtype)
        self._attend = attention_op(torch.device(device), spec.head_dim)  # the kernel backend's, picked once
        self._commit = commit_kv_op(torch.device(device))

    def attend(self, ctx, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
        """query [B, T, Hq, D]; key, value [B, T, Hkv, D] of the step's nodes -> [B, T, Hq, D]: writes the nodes'
        keys and values past each row's committed end and attends every node to the committed prefix, its
        ancestors and itself (verify_kernels/attention: the kernel reads the pool in place, the reference gathers
        ctx.kv_len positions per row)."""
        return self._attend(query, key, value, self.key, self.value, ctx.req_slots, ctx.seq_lens, ctx.ancestors,
                            scale, ctx.kv_len)

    def commit(self, ctx, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """accepted [B, A] node indices (root first, -1 padded): move them to consecutive committed positions
        (verify_kernels.attention.commit_kv_ref)."""
        self._commit(self.key, self.value, ctx.req_slots, ctx.seq_lens, accepted)

    def nbytes(self) -> int:
        return 2 * self.key.numel() * self.key.element_size()
