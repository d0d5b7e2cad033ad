"""Sizing the pools from a memory budget: how many committed-state slots fit once the per-request pools are paid.

A committed state is the large item (Qwen3.5-9B: 24 GDN layers x 32 heads x 128 x 128 fp32 = 48 MiB per request);
a request's buffers, conv windows and attention KV are small next to it for short contexts. Because a request takes
a state slot only when it first folds its buffer, the pool can hold many more requests than states.
"""

from __future__ import annotations

import math

import torch

from .spec import CacheConfig, ModelCacheSpec

FP32 = 4


def state_bytes(spec: ModelCacheSpec) -> int:
    """One committed state across all linear layers (fp32)."""
    return sum(math.prod(layer.state_shape) for layer in spec.linear) * FP32


def request_bytes(spec: ModelCacheSpec, max_seq_len: int, flush_length: int, dtype: torch.dtype) -> int:
    """One request slot: buffers (fp32) and conv windows of the linear layers, attention KV (model dtype)."""
    item = torch.tensor([], dtype=dtype).element_size()
    per_entry = sum(math.prod(layer.key_shape) + math.prod(layer.value_shape) + layer.decay_heads
                    for layer in spec.linear) * FP32
    conv = sum(layer.conv_dim * (layer.conv_width - 1) for layer in spec.linear) * item
    kv = sum(2 * max_seq_len * layer.num_kv_heads * layer.head_dim for layer in spec.attention) * item
    return flush_length * per_entry + conv + kv


def cache_for_budget(spec: ModelCacheSpec, budget_bytes: int, max_requests: int, max_seq_len: int,
                     flush_length: int, dtype: torch.dtype, node_states: int = 0) -> CacheConfig:
    """A CacheConfig whose pools fit `budget_bytes`: max_requests request slots, and as many state slots as the
    rest of the budget holds (at most max_requests). node_states > 0 sizes the intermediate-state baseline
    (CacheConfig(linear_state="intermediate")): every request slot also holds that many states for its draft
    nodes."""
    fixed = max_requests * (request_bytes(spec, max_seq_len, flush_length, dtype) + node_states * state_bytes(spec))
    if fixed > budget_bytes:
        raise ValueError(
            f"{max_requests} request slots of {max_seq_len} tokens need {fixed / 2**30:.2f} GiB before any "
            f"committed state, more than the {budget_bytes / 2**30:.2f} GiB budget; lower max_batch or "
            "max_seq_len, or raise the budget"
        )
    per_state = state_bytes(spec)
    states = min(max_requests, (budget_bytes - fixed) // per_state) if per_state else max_requests
    return CacheConfig(max_requests=max_requests, max_seq_len=max_seq_len, flush_length=flush_length,
                       num_state_slots=int(states),
                       linear_state="intermediate" if node_states > 0 else "kvbuffer")
