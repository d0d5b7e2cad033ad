"""The KVBuffer cache: per-request buffers, lazily allocated committed states, conv windows, attention KV."""

from .model_cache import CacheFullError, KVBufferCache
from .spec import AttentionLayerSpec, CacheConfig, LinearLayerSpec, ModelCacheSpec
from .step import StepBatch, StepContext

__all__ = [
    "AttentionLayerSpec",
    "CacheConfig",
    "CacheFullError",
    "KVBufferCache",
    "LinearLayerSpec",
    "ModelCacheSpec",
    "StepBatch",
    "StepContext",
]
