"""What a model needs cached per request, and how big the pools are."""

from __future__ import annotations

from dataclasses import dataclass

LINEAR_STATES = ("kvbuffer", "intermediate")  # specdec/cache/linear_state.py


@dataclass(frozen=True)
class LinearLayerSpec:
    """One linear-attention layer's KVBuffer layout.

    A buffer entry is (key, value, gcum): GDN stores (k [H, K], u [HV, V], G [HV]) and its state is
    [HV, K, V]; Mamba2 stores (B [NG, N], dt*x [NH, P], G [NH]) and its state is [NH, P, N].
    """

    mixer: str  # "gdn" | "mamba2": picks the commit / flush math
    key_shape: tuple[int, ...]
    value_shape: tuple[int, ...]
    decay_heads: int
    state_shape: tuple[int, ...]
    conv_dim: int
    conv_width: int

    def __post_init__(self):
        if self.mixer not in ("gdn", "mamba2"):
            raise ValueError(f"unknown linear mixer {self.mixer!r}; expected 'gdn' or 'mamba2'")
        if self.conv_width < 1:
            raise ValueError(f"conv_width must be >= 1, got {self.conv_width}")


@dataclass(frozen=True)
class AttentionLayerSpec:
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class ModelCacheSpec:
    """Per model: its linear layers and its full-attention layers, each in model order."""

    linear: tuple[LinearLayerSpec, ...]
    attention: tuple[AttentionLayerSpec, ...]


@dataclass(frozen=True)
class CacheConfig:
    """Pool sizes.

    max_requests: request slots (buffers, conv windows, attention KV rows).
    max_seq_len: committed tokens per request plus the nodes of one step (full-attention KV capacity).
    flush_length: L, the buffer folds into the committed state once it would hold L entries
        (L = 1 is plain recurrent decoding: every token writes the state).
    num_state_slots: committed states; a request takes one only when it first flushes, so short requests
        hold none. Defaults to max_requests.
    linear_state: how linear layers keep their state across a step (specdec/cache/linear_state.py):
        "kvbuffer", or "intermediate", the way SGLang and vLLM do it, as the baseline to measure against (token by
        token from the state, one state written per draft node, the accepted one copied back); it keeps no
        buffer, so flush_length must be 1.
    """

    max_requests: int = 8
    max_seq_len: int = 4096
    flush_length: int = 16
    num_state_slots: int | None = None
    linear_state: str = "kvbuffer"

    def __post_init__(self):
        for name in ("max_requests", "max_seq_len", "flush_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"CacheConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.linear_state not in LINEAR_STATES:
            raise ValueError(f"CacheConfig.linear_state must be one of {LINEAR_STATES}, got {self.linear_state!r}")
        if self.linear_state == "intermediate" and self.flush_length != 1:
            raise ValueError("intermediate states keep no buffer: CacheConfig.flush_length must be 1, got "
                             f"{self.flush_length}")
        if self.num_state_slots is not None and self.num_state_slots < 0:
            raise ValueError(f"CacheConfig.num_state_slots must be >= 0, got {self.num_state_slots}")

    @property
    def state_slots(self) -> int:
        return self.max_requests if self.num_state_slots is None else self.num_state_slots
