"""specdec: KVBuffer speculative decoding for hybrid linear-attention LLMs (Qwen3.5, Nemotron-3)."""

from .api import LLM, Output, generate
from .cache import CacheConfig, KVBufferCache, StepBatch
from .models import SUPPORTED_MODEL_TYPES, CheckpointError, load_model
from .runner import GenerationResult, ModelRunner

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "SUPPORTED_MODEL_TYPES",
    "Output",
    "generate",
    "CacheConfig",
    "CheckpointError",
    "GenerationResult",
    "KVBufferCache",
    "ModelRunner",
    "StepBatch",
    "load_model",
]
