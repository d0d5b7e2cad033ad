"""Random, realistic inputs for the kernel benchmarks: slot-indexed pools filled with non-zero data (zeros can
run faster than real data and hide unwritten outputs), normalised keys, decays and gates in their real ranges."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def unit(*shape) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, device="cuda"), dim=-1)


def log_decay(*shape) -> torch.Tensor:
    """Per-token log decays as Qwen3.5 / Nemotron produce them: -A * softplus(.) with A ~ 1."""
    return -F.softplus(torch.randn(*shape, device="cuda"))


@dataclass
class Pools:
    """Slot-indexed KVBuffer pools for `slots` requests: states [slots, *state], buffers [slots, L, ...]."""

    state: torch.Tensor
    buf_key: torch.Tensor
    buf_value: torch.Tensor
    buf_gcum: torch.Tensor
    buf_len: torch.Tensor

    @classmethod
    def make(cls, slots: int, capacity: int, state_shape, key_shape, value_shape, decay_heads: int) -> Pools:
        state = torch.randn(slots, *state_shape, device="cuda") * 0.1
        buf_key = unit(slots, capacity, *key_shape)
        buf_value = torch.randn(slots, capacity, *value_shape, device="cuda") * 0.1
        buf_gcum = log_decay(slots, capacity, decay_heads).cumsum(1)  # cumulative from S0, decreasing
        buf_len = torch.zeros(slots, dtype=torch.long, device="cuda")
        return cls(state, buf_key, buf_value, buf_gcum, buf_len)

    def args(self):
        return self.state, self.buf_key, self.buf_value, self.buf_gcum, self.buf_len


def rotation_slots(rotation: int, batch: int) -> torch.Tensor:
    """The slots of the rotation-th input set: [batch] int64."""
    return torch.arange(rotation * batch, (rotation + 1) * batch, device="cuda")


def tree_parents(name: str) -> list[int]:
    """The draft shapes of the verify benchmark: chains of 4 and 5 nodes (the engine's chain of 4 drafted tokens
    verifies 5: its root and the drafts) and two single-root trees."""
    shapes = {
        "chain4": [-1, 0, 1, 2],
        "chain5": [-1, 0, 1, 2, 3],
        "tree8": [-1, 0, 0, 1, 1, 2, 2, 3],
        "tree16": [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7, 8, 9],
    }
    return shapes[name]
