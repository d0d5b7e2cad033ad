"""Per full-attention layer KV pool: an ordinary KV cache, one row of max_seq_len positions per request slot."""

from __future__ import annotations

import torch

from .spec import AttentionLayerSpec


class AttentionLayerPool:
    """key, value [R, max_seq_len, kv_heads, head_dim] in the model dtype.

    Positions [0, seq_len) of a row hold its committed tokens. A step writes node j of a row at seq_len + j;
    commit moves the accepted nodes to seq_len, seq_len + 1, ... (a no-op for an accepted chain prefix).
    """

    def __init__(self, spec: AttentionLayerSpec, max_requests: int, max_seq_len: int,
                 device: torch.device, dtype: torch.dtype):
        shape = (max_requests, max_seq_len, spec.num_kv_heads, spec.head_dim)
        self.key = torch.zeros(shape, device=device, dtype=dtype)
        self.value = torch.zeros(shape, device=device, dtype=dtype)

    def write_nodes(self, ctx, key: torch.Tensor, value: torch.Tensor) -> None:
        """key, value [B, T, kv_heads, head_dim]: store every node of the step at seq_len + j. Padding nodes land
        past the valid ones, where nothing committed lives (the step's width fits the row: begin_step checks),
        so the write has the same shape every step (no data-dependent indexing, CUDA graphs)."""
        width = key.shape[1]
        slots = ctx.req_slots[:, None].expand(-1, width)
        positions = ctx.seq_lens[:, None] + torch.arange(width, device=key.device)
        self.key[slots, positions] = key.to(self.key.dtype)
        self.value[slots, positions] = value.to(self.value.dtype)

    def gather(self, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """-> key, value [B, kv_len, kv_heads, head_dim] for the rows of the step."""
        return self.key[ctx.req_slots, : ctx.kv_len], self.value[ctx.req_slots, : ctx.kv_len]

    def commit(self, ctx, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """accepted [B, A] node indices (root first, -1 padded): move them to consecutive committed positions.

        Every column moves, with the same shapes every step (CUDA graphs): column i >= num_accepted copies node 0
        to seq_len + i, past the new committed end, where nothing committed lives."""
        width = accepted.shape[1]
        slots = ctx.req_slots[:, None].expand(-1, width)
        source = ctx.seq_lens[:, None] + accepted.clamp(min=0)
        target = ctx.seq_lens[:, None] + torch.arange(width, device=accepted.device)
        moved_key, moved_value = self.key[slots, source], self.value[slots, source]  # gathered before any write
        self.key[slots, target] = moved_key
        self.value[slots, target] = moved_value

    def nbytes(self) -> int:
        return 2 * self.key.numel() * self.key.element_size()
