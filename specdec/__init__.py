"""specdec: KVBuffer speculative decoding for hybrid linear-attention LLMs (Qwen3.5, Nemotron-3)."""

from .cache import CacheConfig, KVBufferCache, StepBatch
from .models import SUPPORTED_MODEL_TYPES, CheckpointError, load_model
from .runner import GenerationResult, ModelRunner

__version__ = "0.1.0"

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "CacheConfig",
    "CheckpointError",
    "GenerationResult",
    "KVBufferCache",
    "ModelRunner",
    "StepBatch",
    "load_model",
]
